#include "tier_schema.h"

#include <algorithm>

#include "util/error.h"

namespace kvsdk::format {

namespace {

using E = TierElem;

struct KindBuilder {
  TierKindSpec spec;
  KindBuilder(std::string kind, fb::StoreTier type) {
    spec.kind = std::move(kind);
    spec.type = type;
  }
  KindBuilder& vec(const std::string& name, uint16_t id, E elem) {
    spec.fields.push_back({name, id, elem, false, false});
    return *this;
  }
  KindBuilder& scalar(const std::string& name, uint16_t id, E elem) {
    spec.fields.push_back({name, id, elem, true, false});
    return *this;
  }
  KindBuilder& optional(const std::string& name, uint16_t id, E elem) {
    spec.fields.push_back({name, id, elem, false, true});
    return *this;
  }
  // A KIVI head store (src/repr/kivi_repr.cpp kivi_store_to_record) under `prefix`, from id `id`:
  // 11 fields.
  KindBuilder& kivi(const std::string& prefix, uint16_t id) {
    scalar(prefix + "quantized_tokens", id, E::kU64);
    vec(prefix + "block_tokens", id + 1, E::kU32);
    vec(prefix + "positions", id + 2, E::kI32);
    vec(prefix + "key_codes", id + 3, E::kU8);
    vec(prefix + "value_codes", id + 4, E::kU8);
    vec(prefix + "key_scales", id + 5, E::kU16);
    vec(prefix + "key_zeros", id + 6, E::kU16);
    vec(prefix + "value_scales", id + 7, E::kU16);
    vec(prefix + "value_zeros", id + 8, E::kU16);
    vec(prefix + "residual_keys", id + 9, E::kU16);
    return vec(prefix + "residual_values", id + 10, E::kU16);
  }
  // A SpindleKV codebook (src/repr/spindlekv_repr.cpp codebook_to_record): 3 fields.
  KindBuilder& codebook(const std::string& prefix, uint16_t id) {
    vec(prefix + "entries", id, E::kU16);
    vec(prefix + "index", id + 1, E::kU32);
    return vec(prefix + "magnitude", id + 2, E::kF32);
  }
  // A MiniCache merged layer pair (src/repr/minicache_repr.cpp merged_to_record): 8 fields.
  KindBuilder& merged(const std::string& prefix, uint16_t id) {
    scalar(prefix + "threshold_set", id, E::kU64);
    scalar(prefix + "threshold", id + 1, E::kF32);
    vec(prefix + "slots", id + 2, E::kU32);
    vec(prefix + "directions", id + 3, E::kU16);
    vec(prefix + "magnitudes_prev", id + 4, E::kF32);
    vec(prefix + "magnitudes_cur", id + 5, E::kF32);
    vec(prefix + "retained_prev", id + 6, E::kU16);
    return vec(prefix + "retained_cur", id + 7, E::kU16);
  }
  // MiniCache's waiting rows: 3 fields.
  KindBuilder& pending(uint16_t id) {
    vec("pending.keys", id, E::kU16);
    vec("pending.values", id + 1, E::kU16);
    return vec("pending.positions", id + 2, E::kI32);
  }
};

std::vector<TierKindSpec> make_schema() {
  using T = fb::StoreTier;
  std::vector<TierKindSpec> out;
  out.push_back(KindBuilder("kivi.head", T::KiviHeadTier).kivi("", 0).spec);
  out.push_back(KindBuilder("spindlekv.head", T::SpindleKvHeadTier)
                    .codebook("keys.", 0)
                    .codebook("values.", 3)
                    .vec("positions", 6, E::kI32)
                    .spec);
  out.push_back(KindBuilder("minicache.pending", T::MiniCachePendingTier).pending(0).spec);
  out.push_back(KindBuilder("minicache.pair", T::MiniCachePairTier)
                    .merged("keys.", 0)
                    .merged("values.", 8)
                    .vec("positions", 16, E::kI32)
                    .pending(17)
                    .spec);
  out.push_back(KindBuilder("minicache_kivi.pair", T::MiniCacheKiviPairTier)
                    .scalar("threshold_set", 0, E::kU64)
                    .scalar("threshold", 1, E::kF32)
                    .vec("slots", 2, E::kU32)
                    .vec("positions", 3, E::kI32)
                    .vec("norm_k_prev", 4, E::kF32)
                    .vec("norm_k_cur", 5, E::kF32)
                    .vec("norm_v_prev", 6, E::kF32)
                    .vec("norm_v_cur", 7, E::kF32)
                    .vec("retained_k_prev", 8, E::kU16)
                    .vec("retained_k_cur", 9, E::kU16)
                    .vec("retained_v_prev", 10, E::kU16)
                    .vec("retained_v_cur", 11, E::kU16)
                    .kivi("directions.", 12)
                    .pending(23)
                    .spec);
  out.push_back(KindBuilder("smallkv.layer", T::SmallKvLayerTier)
                    .scalar("started", 0, E::kU64)
                    .vec("mapping", 1, E::kU32)
                    .vec("match_stats", 2, E::kF32)
                    .spec);
  out.push_back(KindBuilder("smallkv.head", T::SmallKvHeadTier)
                    .vec("full_positions", 0, E::kI32)
                    .vec("full_keys", 1, E::kU16)
                    .vec("full_values", 2, E::kU16)
                    .vec("full_scores", 3, E::kF32)
                    .vec("marginal_positions", 4, E::kI32)
                    .vec("marginal_values", 5, E::kU16)
                    .vec("marginal_scores", 6, E::kF32)
                    .scalar("stats_done", 7, E::kU64)
                    .scalar("matched", 8, E::kU64)
                    .scalar("scores_from", 9, E::kU64)
                    .spec);
  out.push_back(KindBuilder("specache.head", T::SpeCacheHeadTier)
                    .kivi("lowbit.", 0)
                    .optional("backing.keys", 11, E::kU16)
                    .optional("backing.values", 12, E::kU16)
                    .vec("fetched_tokens", 13, E::kU32)
                    .vec("fetched_keys", 14, E::kU16)
                    .vec("fetched_values", 15, E::kU16)
                    .spec);
  return out;
}

// Elements of `f` in vectors other than `elem`'s, and the count in `elem`'s.
size_t count_of(const TierField& f, E elem, bool* other) {
  size_t n = 0;
  const auto take = [&](E e, size_t size) {
    if (e == elem) n = size;
    else if (size != 0) *other = true;
  };
  take(E::kU8, f.u8.size());
  take(E::kU16, f.u16.size());
  take(E::kI32, f.i32.size());
  take(E::kU32, f.u32.size());
  take(E::kF32, f.f32.size());
  take(E::kU64, f.u64.size());
  return n;
}

template <typename T>
flatbuffers::uoffset_t add_vector(flatbuffers::FlatBufferBuilder& fbb, const std::vector<T>& v) {
  return fbb.CreateVector(v).o;
}

template <typename T>
void read_vector(const flatbuffers::Table& t, flatbuffers::voffset_t at, std::vector<T>& out) {
  const auto* v = t.GetPointer<const flatbuffers::Vector<T>*>(at);
  out.assign(v->begin(), v->end());
}

}  // namespace

const TierFieldSpec* TierKindSpec::by_name(const std::string& name) const {
  for (const TierFieldSpec& f : fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const TierFieldSpec* TierKindSpec::by_id(uint16_t id) const {
  for (const TierFieldSpec& f : fields) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

const std::vector<TierKindSpec>& tier_schema() {
  static const std::vector<TierKindSpec> schema = make_schema();
  return schema;
}

const TierKindSpec* tier_kind(const std::string& kind) {
  for (const TierKindSpec& k : tier_schema()) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

const TierKindSpec* tier_kind(fb::StoreTier type) {
  for (const TierKindSpec& k : tier_schema()) {
    if (k.type == type) return &k;
  }
  return nullptr;
}

void check_typed_record(const TierRecord& r, kvsdk_status status) {
  const TierKindSpec* spec = tier_kind(r.kind);
  if (!spec) fail(status, "tier record kind '", r.kind, "' has no typed table (formats/tier_schema)");
  std::vector<bool> seen(spec->fields.size(), false);
  for (const TierField& f : r.fields) {
    const TierFieldSpec* fs = spec->by_name(f.name);
    if (!fs) {
      fail(status, "tier record '", r.kind, "' field '", f.name,
           "' is not in its typed table (formats/tier_schema)");
    }
    const size_t i = size_t(fs - spec->fields.data());
    if (seen[i]) fail(status, "tier record '", r.kind, "' has field '", f.name, "' twice");
    seen[i] = true;
    bool other = false;
    const size_t n = count_of(f, fs->elem, &other);
    if (other) {
      fail(status, "tier record '", r.kind, "' field '", f.name,
           "' holds elements of another type than its typed table's");
    }
    if (fs->scalar && n != 1) {
      fail(status, "tier record '", r.kind, "' field '", f.name, "' is a scalar but holds ", n,
           " elements");
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i] && !spec->fields[i].optional) {
      fail(status, "tier record '", r.kind, "' (layer ", r.layer, ", KV head ", r.kv_head,
           ") lacks field '", spec->fields[i].name, "'");
    }
  }
}

flatbuffers::Offset<fb::TypedTierState> build_typed_tier(flatbuffers::FlatBufferBuilder& fbb,
                                                         const TierRecord& r) {
  check_typed_record(r, KVSDK_E_INTERNAL);
  const TierKindSpec& spec = *tier_kind(r.kind);
  // Vectors first (FlatBuffers builds children before their table), by the field's spec index,
  // last id first: the builder grows towards the front, so the buffer holds them in id order.
  // (That order also lets zstd find SpeCache's residual and fetched rows in its backing rows,
  // written before them: 14% smaller SpeCache snapshots than the reverse order.)
  std::vector<const TierField*> field(spec.fields.size(), nullptr);
  for (const TierField& f : r.fields) field[size_t(spec.by_name(f.name) - spec.fields.data())] = &f;
  std::vector<flatbuffers::uoffset_t> vec(spec.fields.size(), 0);
  for (size_t i = spec.fields.size(); i-- > 0;) {
    const TierFieldSpec& fs = spec.fields[i];
    const TierField* f = field[i];
    if (!f || fs.scalar) continue;
    switch (fs.elem) {
      case E::kU8: vec[i] = add_vector(fbb, f->u8); break;
      case E::kU16: vec[i] = add_vector(fbb, f->u16); break;
      case E::kI32: vec[i] = add_vector(fbb, f->i32); break;
      case E::kU32: vec[i] = add_vector(fbb, f->u32); break;
      case E::kF32: vec[i] = add_vector(fbb, f->f32); break;
      case E::kU64: vec[i] = add_vector(fbb, f->u64); break;
    }
  }
  const flatbuffers::uoffset_t start = fbb.StartTable();
  for (size_t i = 0; i < spec.fields.size(); ++i) {
    const TierFieldSpec& fs = spec.fields[i];
    const TierField* f = field[i];
    if (!f) continue;
    const flatbuffers::voffset_t at = tier_field_offset(fs.id);
    if (!fs.scalar) {
      fbb.AddOffset(at, flatbuffers::Offset<void>(vec[i]));
    } else if (fs.elem == E::kU64) {
      fbb.AddElement<uint64_t>(at, f->u64[0]);  // no default: always written
    } else if (fs.elem == E::kF32) {
      fbb.AddElement<float>(at, f->f32[0]);
    } else {
      fail(KVSDK_E_INTERNAL, "tier schema: scalar field '", fs.name, "' of unsupported type");
    }
  }
  const flatbuffers::Offset<void> table(fbb.EndTable(start));
  return fb::CreateTypedTierState(fbb, r.layer, r.kv_head, spec.type, table);
}

TierRecord read_typed_tier(const fb::TypedTierState& state) {
  const TierKindSpec* spec = tier_kind(state.tier_type());
  if (!spec || state.tier() == nullptr) {
    fail(KVSDK_E_CORRUPT, "typed tier record (layer ", state.layer(), ", KV head ",
         state.kv_head(), ") has unknown or no table (StoreTier ", unsigned(state.tier_type()),
         ")");
  }
  const auto& t = *static_cast<const flatbuffers::Table*>(state.tier());
  TierRecord r;
  r.layer = state.layer();
  r.kv_head = state.kv_head();
  r.kind = spec->kind;
  for (const TierFieldSpec& fs : spec->fields) {
    const flatbuffers::voffset_t at = tier_field_offset(fs.id);
    // Present means set in the vtable; for a vector also a non-null offset (the Verifier checked
    // that the offset leads to a vector of the schema's type).
    const bool present = fs.scalar ? t.CheckField(at) : t.GetPointer<const void*>(at) != nullptr;
    if (!present) {
      if (fs.optional) continue;
      fail(KVSDK_E_CORRUPT, "typed tier record '", spec->kind, "' (layer ", r.layer, ", KV head ",
           r.kv_head, ") lacks field '", fs.name, "' (id ", fs.id, ")");
    }
    TierField& f = r.add(fs.name);
    if (fs.scalar) {
      if (fs.elem == E::kU64) f.u64 = {t.GetField<uint64_t>(at, 0)};
      else f.f32 = {t.GetField<float>(at, 0.0f)};
      continue;
    }
    switch (fs.elem) {
      case E::kU8: read_vector(t, at, f.u8); break;
      case E::kU16: read_vector(t, at, f.u16); break;
      case E::kI32: read_vector(t, at, f.i32); break;
      case E::kU32: read_vector(t, at, f.u32); break;
      case E::kF32: read_vector(t, at, f.f32); break;
      case E::kU64: read_vector(t, at, f.u64); break;
    }
  }
  return r;
}

}  // namespace kvsdk::format
