#include "snapshot_writer.h"
#include "util/error.h"

#include "xxhash64.h"

#include <algorithm>
#include <vector>

#include "container.h"
#include "core/store_view.h"
#include "frame_writer.h"
#include "journal.h"
#include "kvsdk_generated.h"
#include "policy_state.h"
#include "tier_schema.h"
#include "tier_state.h"
#include "util/options.h"
#include "util/struct_versions.h"
#include "byte_planes.h"
#include "zstd_frame.h"

namespace kvsdk::format {

namespace {

// A run of rows of one head that goes into one frame.
struct RowSpan {
  uint32_t head;
  size_t row_begin;
  size_t rows;
};

// A conversation's shared prefix: its content hash, and its whole snapshot when embedded.
flatbuffers::Offset<fb::PrefixRef> build_prefix(flatbuffers::FlatBufferBuilder& fbb,
                                                const StoreView& cache, const SaveParams& params,
                                                ThreadPool* pool) {
  const StoreView* prefix = cache.prefix_view();
  if (!prefix) return 0;
  const uint64_t hash = content_hash(*prefix);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> embedded = 0;
  if (params.embed_prefix) {
    std::vector<unsigned char> bytes;
    VectorSink sink(bytes);
    write_snapshot(*prefix, params, hash, sink, pool);
    embedded = fbb.CreateVector(bytes.data(), bytes.size());
  }
  return fb::CreatePrefixRef(fbb, hash, embedded);
}

flatbuffers::Offset<fb::Metadata> build_metadata(flatbuffers::FlatBufferBuilder& fbb,
                                                 const StoreView& cache, const SaveParams& params,
                                                 uint16_t major, uint16_t minor,
                                                 ThreadPool* pool) {
  const bool includes_backing = params.include_backing;
  const Geometry& g = cache.geometry();
  const kvsdk_policy& p = cache.policy();
  std::vector<flatbuffers::Offset<fb::LayerInfo>> layers;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const kvsdk_layer_stats s = cache.layer_stats(l);
    std::vector<uint64_t> head_tokens(g.n_kv_heads);
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) head_tokens[h] = cache.head_tokens(l, h);
    std::vector<uint64_t> by_tier(s.bytes_by_tier, s.bytes_by_tier + KVSDK_TIER_SLOTS);
    layers.push_back(fb::CreateLayerInfo(fbb, s.appended_tokens, fbb.CreateVector(head_tokens),
                                         fbb.CreateVector(by_tier), 0));
  }
  const auto geometry =
      fb::CreateGeometry(fbb, g.n_layers, g.n_q_heads, g.n_kv_heads, g.head_dim, g.dtype,
                         g.rope_style, g.rope_theta, g.attn_scale);
  const auto policy = fb::CreatePolicy(fbb, p.method, p.quant_bits, p.quant_group,
                                       p.quant_residual, p.sink_tokens, p.recent_tokens,
                                       p.obs_window, p.pool_kernel, p.pool_kind, p.heavy_ratio,
                                       p.schedule_alpha, p.schedule_beta, p.boundary_layer,
                                       p.merge_t, p.retain_ratio, p.fetch_tokens,
                                       p.match_tokens, p.evict_slack, p.kivi_weight_bits);
  const auto policy_state = build_policy_state(fbb, cache);
  const auto prefix = build_prefix(fbb, cache, params, pool);
  return fb::CreateMetadata(fbb, major, minor,
                            fbb.CreateString(kvsdk_version_string()), geometry, policy,
                            cache.context_budget(), fbb.CreateVector(layers), includes_backing,
                            policy_state, prefix);
}

// Queues one frame of exact rows; it is built on whichever pool thread compresses it (`cache`
// is not modified while write_snapshot runs, and `spans` travels with the frame). With
// `may_shuffle` (format 6), keys and values go in as byte planes (container.h) when the frame's
// rows fill a zstd block (kMinShuffledFrameBytes) and a sample of its first span says that
// compresses smaller at `level`: shuffled while copied into the frame, so it costs no pass of
// its own.
void write_tier_frame(FrameWriter& out, const StoreView& cache, uint32_t layer,
                      std::vector<RowSpan> spans, uint64_t row_bytes, int level, bool may_shuffle) {
  // The rows, plus (generously) each HeadRows table with its vectors' lengths and padding, and
  // the frame's root and vtables.
  uint64_t hint = 1024, rows_bytes = 0;
  for (const RowSpan& s : spans) {
    hint += s.rows * row_bytes + 256;
    rows_bytes += s.rows * row_bytes;
  }
  may_shuffle = may_shuffle && rows_bytes >= kMinShuffledFrameBytes;
  out.write_frame(FrameKind::kTierChunk, [&cache, layer, level, may_shuffle,
                                          spans = std::move(spans)](
                                             flatbuffers::FlatBufferBuilder& fbb) -> uint8_t {
    const size_t dim = cache.geometry().head_dim;
    bool shuffle = false;
    if (may_shuffle && !spans.empty()) {
      const RowSpan& s = spans.front();
      const ExactStore& e = cache.exact_rows(layer, s.head);
      shuffle = shuffle_pays(e.k.data() + s.row_begin * dim, e.v.data() + s.row_begin * dim,
                             s.rows * dim, level);
    }
    const auto rows_vector = [&fbb, shuffle](const uint16_t* src, size_t n) {
      if (!shuffle) return fbb.CreateVector(src, n);
      uint16_t* dst = nullptr;
      const auto vec = fbb.CreateUninitializedVector(n, &dst);
      shuffle_f16(src, n, reinterpret_cast<unsigned char*>(dst));
      return vec;
    };
    std::vector<flatbuffers::Offset<fb::HeadRows>> heads;
    for (const RowSpan& s : spans) {
      const ExactStore& e = cache.exact_rows(layer, s.head);
      const auto positions = fbb.CreateVector(e.positions.data() + s.row_begin, s.rows);
      const auto keys = rows_vector(e.k.data() + s.row_begin * dim, s.rows * dim);
      const auto values = rows_vector(e.v.data() + s.row_begin * dim, s.rows * dim);
      const auto rows = fb::CreateExactRows(fbb, positions, keys, values);
      heads.push_back(fb::CreateHeadRows(fbb, layer, s.head, s.row_begin, rows));
    }
    const auto chunk = fb::CreateTierChunk(fbb, fbb.CreateVector(heads));
    fbb.Finish(fb::CreateFrame(fbb, fb::Payload::TierChunk, chunk.Union()),
               fb::FrameIdentifier());
    return shuffle ? kFrameShuffled : uint8_t(0);
  }, size_t(hint));
}

// The compressed stores of one layer, packed into frames of at most max_frame_bytes (at least one
// record per frame): typed tables (TierChunk.typed_tiers) from format major 4, generic TierStates
// before. Each frame is built on a pool thread from `records`, which outlives the writer's
// flushes.
void write_tier_states(FrameWriter& out, const std::vector<TierRecord>& records, uint64_t cap,
                       bool typed) {
  size_t i = 0;
  while (i < records.size()) {
    const size_t begin = i;
    uint64_t bytes = 0;
    while (i < records.size() && (i == begin || bytes + tier_record_bytes(records[i]) <= cap)) {
      bytes += tier_record_bytes(records[i++]);
    }
    out.write_frame(FrameKind::kTierChunk, [&records, begin, end = i, typed](
                                                flatbuffers::FlatBufferBuilder& fbb) -> uint8_t {
      std::vector<flatbuffers::Offset<fb::TierState>> states;
      std::vector<flatbuffers::Offset<fb::TypedTierState>> typed_states;
      for (size_t r = begin; r < end; ++r) {
        if (typed) typed_states.push_back(build_typed_tier(fbb, records[r]));
        else states.push_back(build_tier_state(fbb, records[r]));
      }
      const auto chunk =
          typed ? fb::CreateTierChunk(fbb, 0, 0, fbb.CreateVector(typed_states))
                : fb::CreateTierChunk(fbb, 0, fbb.CreateVector(states));
      fbb.Finish(fb::CreateFrame(fbb, fb::Payload::TierChunk, chunk.Union()),
                 fb::FrameIdentifier());
      return 0;  // compressed-store records are never shuffled
    });
  }
}

}  // namespace

kvsdk_save_options save_options_defaults() {
  kvsdk_save_options o{};
  o.struct_size = sizeof(o);
  o.zstd_level = kDefaultZstdLevel;
  // A saved conversation must continue exactly unless the caller asks for a smaller file:
  // SpeCache's backing store is in by default (include_backing = 0 trades that for size).
  o.include_backing = 1;
  o.max_frame_bytes = kDefaultFrameBytes;
  o.max_journal_percent = 0;
  return o;
}

SaveParams save_params_from_c(const kvsdk_save_options* options) {
  const kvsdk_save_options d = save_options_defaults();
  const kvsdk_save_options o =
      options ? read_versioned(options, d, kSaveOptionsSizeV1, "options") : d;
  KVSDK_REQUIRE(o.zstd_level >= kMinZstdLevel && o.zstd_level <= kMaxZstdLevel,
                "options.zstd_level is ", o.zstd_level, " (must be ", kMinZstdLevel, "..",
                kMaxZstdLevel, ")");
  KVSDK_REQUIRE(o.include_backing <= 1, "options.include_backing is ", o.include_backing,
                " (must be 0 or 1)");
  KVSDK_REQUIRE(o.max_frame_bytes <= kMaxFrameBytesOption, "options.max_frame_bytes is ",
                o.max_frame_bytes, " (at most ", kMaxFrameBytesOption, ")");
  KVSDK_REQUIRE(o.max_journal_percent <= kMaxJournalPercent, "options.max_journal_percent is ",
                o.max_journal_percent, " (at most ", kMaxJournalPercent, ")");
  SaveParams p;
  p.zstd_level = o.zstd_level == 0 ? kDefaultZstdLevel : o.zstd_level;
  p.include_backing = o.include_backing != 0;
  p.max_frame_bytes = o.max_frame_bytes == 0 ? kDefaultFrameBytes : o.max_frame_bytes;
  KVSDK_REQUIRE(o.embed_prefix <= 1, "options.embed_prefix is ", o.embed_prefix, " (0 or 1)");
  p.embed_prefix = o.embed_prefix != 0;
  p.max_journal_percent = o.max_journal_percent;
  return p;
}

bool has_exact_rows(const StoreView& cache) {
  const Geometry& g = cache.geometry();
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      if (cache.exact_rows(l, h).size() != 0) return true;
    }
  }
  return false;
}

uint16_t format_major_for(const StoreView& cache, bool any_tier) {
  // Exact rows may go into shuffled frames, which only format 6 has (container.h).
  if (has_exact_rows(cache)) return kFormatMajor;
  if (cache.prefix_view()) return kFormatMajorPrefix;
  return any_tier || method_traits(cache.policy()).uses_window() ? kFormatMajorTyped
                                                                 : kFormatMajorV1;
}

uint16_t format_minor_for(uint16_t major) {
  if (major == kFormatMajor) return kFormatMinor;
  if (major == kFormatMajorPrefix) return kFormatMinorPrefix;
  return major == kFormatMajorTyped ? kFormatMinorTyped : kFormatMinorV1;
}

uint64_t snapshot_id_of(const StoreView& cache, const std::vector<std::vector<uint64_t>>& rows) {
  Xxh64Stream h(0x6b7673646b736e70ull);  // "kvsdksnp"
  const auto add_vec = [&h](const auto& v) {
    const uint64_t n = v.size();
    h.update(&n, sizeof n);
    if (n) h.update(v.data(), n * sizeof(v[0]));
  };
  const kvsdk_geometry g = cache.geometry().to_c();  // 4-byte fields only: no padding bytes
  h.update(&g, sizeof g);
  // The policy's fields up to evict_slack, the struct as it was when content hashes were defined
  // (journal.h: they must not change). Fields added since say how a cache computes, not what it
  // holds: kivi_weight_bits is left out, so a prefix matches whatever its attention's width.
  // struct_size (the first field) as it was then too.
  kvsdk_policy p = cache.policy();
  static_assert(kPolicySizeV2 == offsetof(kvsdk_policy, kivi_weight_bits), "hashed fields");
  p.struct_size = uint32_t(kPolicySizeV2);
  h.update(&p, kPolicySizeV2);
  const PolicyRuntime rt = cache.policy_runtime();
  h.update(&rt.cache_budget, sizeof rt.cache_budget);
  add_vec(rt.fixed_alloc);
  add_vec(rt.profile_shares);
  add_vec(rt.last_caps);
  for (uint32_t l = 0; l < cache.geometry().n_layers; ++l) {
    const LayerPolicyState& L = cache.layer(l);
    h.update(&L.appended_tokens, sizeof L.appended_tokens);
    for (const auto& s : L.scores) add_vec(s);
    add_vec(L.window_q);
    add_vec(L.window_pos);
  }
  for (const auto& head : rows) add_vec(head);
  if (const StoreView* prefix = cache.prefix_view()) {
    const uint64_t ph = content_hash(*prefix);  // the same rows on another prefix differ
    h.update(&ph, sizeof ph);
  }
  const uint64_t id = h.digest();
  return id != 0 ? id : 1;
}

uint64_t content_hash(const StoreView& cache) {
  return snapshot_id_of(cache, fingerprint(cache).rows);
}

uint64_t write_snapshot(const StoreView& cache, const SaveParams& params, uint64_t snapshot_id,
                        Sink& sink, ThreadPool* pool) {
  const Geometry& g = cache.geometry();
  std::vector<std::vector<TierRecord>> tiers(g.n_layers);
  bool any_tier = false;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    tiers[l] = cache.tier_records(l);
    if (!params.include_backing) {
      // Off-budget backing stores (SpeCache) are fields named "backing.*": left out unless asked.
      for (TierRecord& r : tiers[l]) {
        r.fields.erase(std::remove_if(r.fields.begin(), r.fields.end(),
                                      [](const TierField& f) {
                                        return f.name.compare(0, 8, "backing.") == 0;
                                      }),
                       r.fields.end());
      }
    }
    any_tier = any_tier || !tiers[l].empty();
  }
  const uint16_t major = format_major_for(cache, any_tier);
  const uint16_t minor = format_minor_for(major);
  FrameWriter out(sink, snapshot_id, params.zstd_level, 0, pool);
  out.write_file_header(major, minor);

  {
    // Built here, not on the pool: an embedded prefix is a whole snapshot written on the pool.
    flatbuffers::FlatBufferBuilder fbb(1024);
    const auto meta = build_metadata(fbb, cache, params, major, minor, pool);
    fbb.Finish(fb::CreateFrame(fbb, fb::Payload::Metadata, meta.Union()), fb::FrameIdentifier());
    out.write_frame(FrameKind::kMetadata, fbb.GetBufferPointer(), fbb.GetSize());
  }

  // Rows of each layer, packed into frames of at most max_frame_bytes of row data (at least one
  // row per frame); a frame never mixes layers.
  const uint64_t row_bytes = sizeof(int32_t) + uint64_t(g.head_dim) * 2 * sizeof(uint16_t);
  const uint64_t cap = params.max_frame_bytes;
  const bool shuffle = major >= 6;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    std::vector<RowSpan> spans;
    uint64_t frame_bytes = 0;
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      const size_t n = cache.exact_rows(l, h).size();
      size_t r = 0;
      while (r < n) {
        uint64_t fit = (cap - std::min(cap, frame_bytes)) / row_bytes;
        if (fit == 0 && !spans.empty()) {
          write_tier_frame(out, cache, l, std::move(spans), row_bytes, params.zstd_level, shuffle);
          spans.clear();
          frame_bytes = 0;
          fit = cap / row_bytes;
        }
        const size_t take = size_t(std::min<uint64_t>(std::max<uint64_t>(fit, 1), n - r));
        spans.push_back({h, r, take});
        frame_bytes += take * row_bytes;
        r += take;
      }
    }
    if (!spans.empty()) {
      write_tier_frame(out, cache, l, std::move(spans), row_bytes, params.zstd_level, shuffle);
    }
    write_tier_states(out, tiers[l], cap, major >= 4);
  }
  out.write_index_and_trailer();
  return out.offset();
}

}  // namespace kvsdk::format
