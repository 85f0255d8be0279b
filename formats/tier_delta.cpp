#include "tier_delta.h"

#include <algorithm>
#include <unordered_map>

#include "tier_schema.h"
#include "util/error.h"
#include "xxhash64.h"

namespace kvsdk::format {

namespace {

constexpr uint64_t kChunkBytes = 256;
constexpr uint64_t kNewElements = ~0ull;  // Segment.base_begin of "new elements"
constexpr uint64_t kSeed = 0x6b7664656c7461ull;  // "kvdelta"

enum TierFieldType : uint8_t { kNone = 0, kU8, kU16, kI32, kU32, kF32, kU64 };
static_assert(uint8_t(TierElem::kU8) == kU8 && uint8_t(TierElem::kU16) == kU16 &&
                  uint8_t(TierElem::kI32) == kI32 && uint8_t(TierElem::kU32) == kU32 &&
                  uint8_t(TierElem::kF32) == kF32 && uint8_t(TierElem::kU64) == kU64,
              "TierElem numbers elements as TierFieldDelta.type");

// A field's elements as bytes, whichever typed vector holds them (a record field holds one).
struct FieldView {
  uint8_t type = kNone;
  const uint8_t* data = nullptr;
  uint64_t count = 0;
  uint64_t elem = 1;  // bytes per element
};

FieldView view(const TierField& f) {
  FieldView v;
  const auto take = [&v](uint8_t type, const auto& vec) {
    if (vec.empty()) return;
    if (v.type != kNone) {
      fail(KVSDK_E_INTERNAL, "tier field with elements of two types");
    }
    v.type = type;
    v.data = reinterpret_cast<const uint8_t*>(vec.data());
    v.count = vec.size();
    v.elem = sizeof(vec[0]);
  };
  take(kU8, f.u8);
  take(kU16, f.u16);
  take(kI32, f.i32);
  take(kU32, f.u32);
  take(kF32, f.f32);
  take(kU64, f.u64);
  return v;
}

uint64_t chunk_elems(const FieldView& v) { return kChunkBytes / v.elem; }

std::vector<uint64_t> chunk_hashes(const FieldView& v) {
  std::vector<uint64_t> out;
  const uint64_t ce = chunk_elems(v);
  for (uint64_t b = 0; b < v.count; b += ce) {
    const uint64_t n = std::min(ce, v.count - b);
    out.push_back(xxh64(v.data + b * v.elem, n * v.elem, kSeed));
  }
  return out;
}

void add_segment(std::vector<fb::Segment>& segs, uint64_t base_begin, uint64_t count) {
  if (count == 0) return;
  if (!segs.empty()) {
    const fb::Segment& last = segs.back();
    const bool both_new = last.base_begin() == kNewElements && base_begin == kNewElements;
    const bool contiguous = last.base_begin() != kNewElements && base_begin != kNewElements &&
                            last.base_begin() + last.count() == base_begin;
    if (both_new || contiguous) {
      segs.back() = fb::Segment(last.base_begin(), last.count() + count);
      return;
    }
  }
  segs.emplace_back(base_begin, count);
}

// Segments of `now` against the field `before` describes; `fresh` receives the ranges of `now`
// (in elements) that are new.
std::vector<fb::Segment> plan_field(const FieldSignature* before, const FieldView& now,
                                    std::vector<std::pair<uint64_t, uint64_t>>* fresh) {
  std::vector<fb::Segment> segs;
  const auto add_new = [&](uint64_t b, uint64_t n) {
    if (n == 0) return;
    add_segment(segs, kNewElements, n);
    if (!fresh->empty() && fresh->back().second == b) fresh->back().second = b + n;
    else fresh->push_back({b, b + n});
  };
  if (!before || before->type != now.type || before->count == 0 || now.count == 0) {
    add_new(0, now.count);
    return segs;
  }
  // Appended to: the old content is the new content's prefix.
  if (now.count >= before->count &&
      xxh64(now.data, before->count * now.elem, kSeed) == before->hash) {
    add_segment(segs, 0, before->count);
    add_new(before->count, now.count - before->count);
    return segs;
  }
  // Otherwise whole chunks that survive in order are copied (e.g. a window that dropped its
  // oldest rows), the rest is new.
  const uint64_t ce = chunk_elems(now);
  std::unordered_map<uint64_t, std::vector<uint64_t>> where;
  for (uint64_t c = 0; c < before->chunks.size(); ++c) where[before->chunks[c]].push_back(c);
  uint64_t next_old = 0;  // copies move forward through the old field
  for (uint64_t b = 0; b < now.count; b += ce) {
    const uint64_t n = std::min(ce, now.count - b);
    const uint64_t h = xxh64(now.data + b * now.elem, n * now.elem, kSeed);
    uint64_t found = before->chunks.size();
    auto it = where.find(h);
    if (it != where.end()) {
      auto pos = std::lower_bound(it->second.begin(), it->second.end(), next_old);
      if (pos != it->second.end()) found = *pos;
    }
    // A chunk matches only at its own length (the old field's last chunk may be shorter).
    const uint64_t old_n = found < before->chunks.size() ? std::min(ce, before->count - found * ce) : 0;
    if (found < before->chunks.size() && old_n == n) {
      add_segment(segs, found * ce, n);
      next_old = found + 1;
    } else {
      add_new(b, n);
    }
  }
  return segs;
}

flatbuffers::Offset<fb::TierField> build_data(flatbuffers::FlatBufferBuilder& fbb,
                                              const TierField& f,
                                              const std::vector<std::pair<uint64_t, uint64_t>>& fresh) {
  const auto pick = [&](const auto& vec) {
    using T = typename std::decay_t<decltype(vec)>::value_type;
    std::vector<T> out;
    if (vec.empty()) return flatbuffers::Offset<flatbuffers::Vector<T>>(0);  // not this field's type
    for (const auto& [b, e] : fresh) out.insert(out.end(), vec.begin() + long(b), vec.begin() + long(e));
    return out.empty() ? flatbuffers::Offset<flatbuffers::Vector<T>>(0) : fbb.CreateVector(out);
  };
  const auto u8 = pick(f.u8);
  const auto u16 = pick(f.u16);
  const auto i32 = pick(f.i32);
  const auto u32 = pick(f.u32);
  const auto f32 = pick(f.f32);
  const auto u64 = pick(f.u64);
  return fb::CreateTierField(fbb, 0, u8, u16, i32, u32, f32, u64);
}

// Rebuilds a typed vector from segments over `old` and the new elements `fresh`.
template <typename T>
std::vector<T> rebuild(const std::string& kind, const std::string& name, const std::vector<T>& old,
                       const flatbuffers::Vector<const fb::Segment*>& segs,
                       const flatbuffers::Vector<T>* fresh) {
  std::vector<T> out;
  uint64_t taken = 0;
  const uint64_t available = fresh ? fresh->size() : 0;
  for (const fb::Segment* s : segs) {
    const uint64_t n = s->count();
    if (s->base_begin() == kNewElements) {
      if (n > available - taken) {
        fail(KVSDK_E_CORRUPT, "journal: field '", name, "' of '", kind, "' needs more new elements");
      }
      out.insert(out.end(), fresh->begin() + long(taken), fresh->begin() + long(taken + n));
      taken += n;
      continue;
    }
    const uint64_t b = s->base_begin();
    if (b > old.size() || n > old.size() - b) {
      fail(KVSDK_E_CORRUPT, "journal: field '", name, "' of '", kind,
           "' copies elements beyond the record before the delta");
    }
    out.insert(out.end(), old.begin() + long(b), old.begin() + long(b + n));
  }
  if (taken != available) {
    fail(KVSDK_E_CORRUPT, "journal: field '", name, "' of '", kind, "' has new elements left over");
  }
  return out;
}

const TierField* find_field(const TierRecord& r, const std::string& name) {
  for (const TierField& f : r.fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace

LayerSignature sign_layer(const std::vector<TierRecord>& records) {
  LayerSignature out;
  out.reserve(records.size());
  for (const TierRecord& r : records) {
    RecordSignature s;
    s.layer = r.layer;
    s.kv_head = r.kv_head;
    s.kind = r.kind;
    for (const TierField& f : r.fields) {
      const FieldView v = view(f);
      FieldSignature fs;
      fs.name = f.name;
      fs.type = v.type;
      fs.count = v.count;
      fs.hash = xxh64(v.data, v.count * v.elem, kSeed);
      fs.chunks = chunk_hashes(v);
      s.fields.push_back(std::move(fs));
    }
    out.push_back(std::move(s));
  }
  return out;
}

void drop_backing_fields(LayerSignature& layer) {
  for (RecordSignature& r : layer) {
    r.fields.erase(std::remove_if(r.fields.begin(), r.fields.end(),
                                  [](const FieldSignature& f) { return f.name.compare(0, 8, "backing.") == 0; }),
                   r.fields.end());
  }
}

bool can_delta(const LayerSignature& before, const std::vector<TierRecord>& now) {
  if (before.size() != now.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (before[i].kind != now[i].kind || before[i].layer != now[i].layer ||
        before[i].kv_head != now[i].kv_head) {
      return false;
    }
  }
  return true;
}

std::vector<flatbuffers::Offset<fb::TierRecordDelta>> build_layer_delta(
    flatbuffers::FlatBufferBuilder& fbb, const LayerSignature& before,
    const std::vector<TierRecord>& now, bool typed) {
  std::vector<flatbuffers::Offset<fb::TierRecordDelta>> out;
  for (size_t i = 0; i < now.size(); ++i) {
    const TierRecord& r = now[i];
    const TierKindSpec* spec = nullptr;
    if (typed) {
      check_typed_record(r, KVSDK_E_INTERNAL);
      spec = tier_kind(r.kind);
    }
    std::vector<flatbuffers::Offset<fb::TierFieldDelta>> fields;
    for (const TierField& f : r.fields) {
      const FieldSignature* old = nullptr;
      for (const FieldSignature& fs : before[i].fields) {
        if (fs.name == f.name) old = &fs;
      }
      const FieldView v = view(f);
      std::vector<std::pair<uint64_t, uint64_t>> fresh;
      const std::vector<fb::Segment> segs = plan_field(old, v, &fresh);
      const auto name = typed ? 0 : fbb.CreateString(f.name);
      const auto seg_vec = fbb.CreateVectorOfStructs(segs);
      const auto data = build_data(fbb, f, fresh);
      const uint16_t id = typed ? spec->by_name(f.name)->id : 0;
      fields.push_back(fb::CreateTierFieldDelta(fbb, name, v.type, seg_vec, data, id));
    }
    out.push_back(fb::CreateTierRecordDelta(fbb, r.layer, r.kv_head,
                                            typed ? 0 : fbb.CreateString(r.kind),
                                            fbb.CreateVector(fields),
                                            typed ? uint8_t(spec->type) : uint8_t(0)));
  }
  return out;
}

TierRecord apply_record_delta(const fb::TierRecordDelta& d, const TierRecord& before,
                              bool typed) {
  const TierKindSpec* spec = typed ? tier_kind(fb::StoreTier(d.tier_type())) : nullptr;
  if (typed ? spec == nullptr : d.kind() == nullptr) {
    fail(KVSDK_E_CORRUPT, "journal: tier record delta without ",
         typed ? "a known typed table" : "kind");
  }
  if (!d.fields()) fail(KVSDK_E_CORRUPT, "journal: tier record delta without fields");
  const std::string kind = typed ? spec->kind : d.kind()->str();
  if (kind != before.kind || d.layer() != before.layer || d.kv_head() != before.kv_head) {
    fail(KVSDK_E_CORRUPT, "journal: tier record delta for '", kind, "' (layer ",
         d.layer(), ", KV head ", d.kv_head(), ") does not follow '", before.kind, "' (layer ",
         before.layer, ", KV head ", before.kv_head, ")");
  }
  TierRecord r;
  r.layer = before.layer;
  r.kv_head = before.kv_head;
  r.kind = before.kind;
  for (const fb::TierFieldDelta* fd : *d.fields()) {
    if ((!typed && !fd->name()) || !fd->segments()) {
      fail(KVSDK_E_CORRUPT, "journal: field delta of '", r.kind, "' without name or segments");
    }
    std::string name;
    if (typed) {
      const TierFieldSpec* fs = spec->by_id(fd->field_id());
      if (!fs) {
        fail(KVSDK_E_CORRUPT, "journal: field delta of '", r.kind, "' for field id ",
             fd->field_id(), ", which its typed table lacks");
      }
      if (fd->type() != kNone && fd->type() != uint8_t(fs->elem)) {
        fail(KVSDK_E_CORRUPT, "journal: field delta of '", r.kind, "' field '", fs->name,
             "' has element type ", unsigned(fd->type()), ", its typed table ",
             unsigned(fs->elem));
      }
      name = fs->name;
    } else {
      name = fd->name()->str();
    }
    const TierField* old = find_field(before, name);
    static const TierField kEmpty;
    const TierField& o = old ? *old : kEmpty;
    const fb::TierField* data = fd->data();
    TierField& f = r.add(name);
    const auto& segs = *fd->segments();
    switch (fd->type()) {
      case kNone:
        if (segs.size() != 0) fail(KVSDK_E_CORRUPT, "journal: empty field '", name, "' with segments");
        break;
      case kU8: f.u8 = rebuild(r.kind, name, o.u8, segs, data ? data->u8() : nullptr); break;
      case kU16: f.u16 = rebuild(r.kind, name, o.u16, segs, data ? data->u16() : nullptr); break;
      case kI32: f.i32 = rebuild(r.kind, name, o.i32, segs, data ? data->i32() : nullptr); break;
      case kU32: f.u32 = rebuild(r.kind, name, o.u32, segs, data ? data->u32() : nullptr); break;
      case kF32: f.f32 = rebuild(r.kind, name, o.f32, segs, data ? data->f32() : nullptr); break;
      case kU64: f.u64 = rebuild(r.kind, name, o.u64, segs, data ? data->u64() : nullptr); break;
      default:
        fail(KVSDK_E_CORRUPT, "journal: field '", name, "' of '", r.kind, "' has unknown type ",
             unsigned(fd->type()));
    }
  }
  // What a typed table could not hold (a field twice or missing, a scalar of other than one
  // element) is not a record of this format.
  if (typed) check_typed_record(r, KVSDK_E_CORRUPT);
  return r;
}

}  // namespace kvsdk::format
