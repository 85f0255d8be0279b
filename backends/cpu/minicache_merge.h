// MiniCache cross-layer merging (MiniCache, docs/papers.md; only the paper's abstract was at hand,
// so the formulas below are kvsdk's own reading of it):
// from the middle layer on, the rows of adjacent layers (l-1, l) at the same token are merged into
// one direction by spherical interpolation of their unit vectors,
//   Ω = arccos(clamp(x̂_{l-1} · x̂_l, -1, 1)),
//   e = sin((1-t)Ω)/sin Ω · x̂_{l-1} + sin(tΩ)/sin Ω · x̂_l      (t = 0.6; linear when sin Ω ≈ 0),
// stored once with both magnitudes; each layer's row is restored as ||x|| · e. The tokens whose
// angular distance Ω/π is largest (γ ≈ 5% per head) are too different to share a direction and
// are kept unmerged in both layers.
//
// Storage per merged token: the f16 direction (2·dim bytes), one f32 magnitude per layer; per
// retained token: both layers' rows in f16; per token a uint32 slot saying where its data lives.
// Magnitudes are stored as ||x|| / ||e_f16|| so the restored row has exactly the norm of x (to f32
// rounding) despite the f16 direction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>
#include <algorithm>

#include "util/growth.h"

#include "attention.h"

namespace kvsdk::cpu {

struct MiniCacheConfig {
  float t = 0.6f;       // interpolation parameter (0 = layer l-1, 1 = layer l)
  float gamma = 0.05f;  // fraction of tokens per head retained unmerged
};

// Angular distance Ω/π in [0, 1] of two rows (1 when either row is zero: no shared direction).
float minicache_angular_distance(const float* a, const float* b, size_t dim);

// SLERP of the directions of a and b (any norms, both non-zero) into out [dim].
void minicache_slerp(const float* a, const float* b, size_t dim, float t, float* out);

// Truncation (kvsdk_cache_truncate) of a store whose tokens carry `positions`: how many tokens stay
// when every token at a position >= `position` goes, or SIZE_MAX when those are not the newest
// tokens (a token that stays would follow one that goes).
size_t minicache_kept_tokens(const std::vector<int32_t>& positions, int32_t position);
// Why a cut inside a pair's first merge is refused (its threshold came from all of its tokens).
inline constexpr const char* kMiniCacheFirstMergeRefusal =
    "MiniCache fixed its retention threshold over the first tokens it merged (or every token "
    "restored from a snapshot or fork), and those mix tokens from that position with older ones";

// Tokens restored per attention chunk.
constexpr size_t kMiniCacheAttendChunk = 256;

// Working memory of the pairs' append() and read paths (transient), reused by a caller that
// keeps one (one per cache): the decode path then allocates nothing but the stored rows' growth.
struct MiniCacheScratch {
  std::vector<float> dist, e, ek, ev;
  std::vector<char> keep;
  std::vector<size_t> order;
  std::vector<int32_t> merged_pos;
};

// One tensor (keys or values) of one KV head, merged across a layer pair. Layer 0 of the pair is
// l-1, layer 1 is l.
class MergedLayerPair {
 public:
  // Throws kvsdk::Error (KVSDK_E_INVALID_ARG) for dim 0, t outside [0, 1], gamma outside [0, 1].
  MergedLayerPair(size_t dim, const MiniCacheConfig& config);

  // Appends `n` tokens: rows of layer l-1 and of layer l ([n][dim] each, same tokens). The first
  // non-empty call retains the ceil(γ·n) tokens of largest angular distance and fixes that
  // distance as the threshold; later calls (decode) retain tokens at or above the threshold.
  void append(const float* rows_prev, const float* rows_cur, size_t n);
  void append(const float* rows_prev, const float* rows_cur, size_t n, MiniCacheScratch& scratch);

  // Empties the pair, keeping its buffers' capacity, with the given retention state: what
  // restore() from that state and empty buffers gives (threshold_tokens_ 0). A device store
  // (src/repr/device_minicache.h) appends to such a pair to get exactly the appended tokens'
  // slots (numbered from 0), directions, magnitudes and retained rows, without a host copy of
  // the tokens it holds.
  void reset(bool threshold_set, float threshold) noexcept;

  // Restores rows [first, first + count) of layer 0 or 1 into out [count][dim].
  void reconstruct(int layer, size_t first, size_t count, float* out) const;

  size_t size() const { return slot_.size(); }
  size_t dim() const { return dim_; }
  size_t retained() const { return retained_prev_.size() / dim_; }
  size_t merged() const { return mag_prev_.size(); }
  float threshold() const { return threshold_; }
  bool threshold_set() const { return threshold_set_; }
  bool is_retained(size_t token) const { return (slot_[token] & kRetainedBit) != 0; }
  // The stored f16 direction of a merged token.
  const uint16_t* direction(size_t token) const { return &direction_[(slot_[token]) * dim_]; }
  uint64_t bytes() const;

  // The stored layout, for kernels that read it in place (fast_minicache.h): token t's slot is
  // slots()[t]; a merged slot s is the direction directions() + s * dim() restored as
  // magnitudes(layer)[s] * direction, a retained slot kRetainedBit | j is the exact row
  // retained_rows(layer) + j * dim() of the layer.
  static constexpr uint32_t kRetainedBit = 0x80000000u;
  const uint32_t* slots() const { return slot_.data(); }
  const uint16_t* directions() const { return direction_.data(); }
  const float* magnitudes(int layer) const { return (layer == 0 ? mag_prev_ : mag_cur_).data(); }
  const uint16_t* retained_rows(int layer) const {
    return (layer == 0 ? retained_prev_ : retained_cur_).data();
  }

  // Truncation: keeping tokens [0, tokens) only. After the first non-empty append every token is
  // merged or retained by itself against the fixed threshold, so dropping the newest tokens
  // (slots, directions, magnitudes, retained rows) leaves exactly the pair of a history without
  // them. The first append fixed the threshold over all of its tokens together (the retention of
  // the γ most distant tokens, MiniCache (docs/papers.md)), so a cut inside it is not exact;
  // dropping every token gives the fresh pair back (threshold unset), whatever the history. A
  // restored pair does not know how many of its tokens the first append held: all of them count.
  bool can_truncate(size_t tokens) const {
    return tokens >= size() || tokens == 0 || tokens >= threshold_tokens_;
  }
  // Only after can_truncate(tokens). No allocation, no throw.
  void truncate(size_t tokens) noexcept;

  // Snapshot support: every buffer, and a pair rebuilt from them (throws kvsdk::Error
  // KVSDK_E_CORRUPT when sizes or slots are inconsistent).
  struct Buffers {
    bool threshold_set = false;
    float threshold = 2.0f;
    std::vector<uint32_t> slots;
    std::vector<uint16_t> directions;
    std::vector<float> magnitudes_prev, magnitudes_cur;
    std::vector<uint16_t> retained_prev, retained_cur;
  };
  Buffers buffers() const;
  static MergedLayerPair restore(size_t dim, const MiniCacheConfig& config, Buffers b);

 private:
  void push_retained(const float* a, const float* b);
  void push_merged(const float* a, const float* b, std::vector<float>& e);

  size_t dim_;
  MiniCacheConfig cfg_;
  bool threshold_set_ = false;
  float threshold_ = 2.0f;            // Ω/π at or above which a token is retained
  size_t threshold_tokens_ = 0;       // tokens that fixed it (all restored ones after restore())
  std::vector<uint32_t> slot_;        // per token: merged index, or kRetainedBit | retained index
  std::vector<uint16_t> direction_;   // [merged][dim] f16
  std::vector<float> mag_prev_, mag_cur_;                  // [merged]
  std::vector<uint16_t> retained_prev_, retained_cur_;     // [retained][dim] f16
};

// Keys and values of one KV head over a layer pair, with the tokens' positions (shared: both
// layers hold the same tokens).
struct MiniCacheHeadPair {
  MiniCacheHeadPair(size_t dim, const MiniCacheConfig& config) : keys(dim, config), values(dim, config) {}
  void append(const float* k_prev, const float* v_prev, const float* k_cur, const float* v_cur,
              const int32_t* pos, size_t n) {
    MiniCacheScratch scratch;
    append(k_prev, v_prev, k_cur, v_cur, pos, n, scratch);
  }
  void append(const float* k_prev, const float* v_prev, const float* k_cur, const float* v_cur,
              const int32_t* pos, size_t n, MiniCacheScratch& scratch) {
    keys.append(k_prev, k_cur, n, scratch);
    values.append(v_prev, v_cur, n, scratch);
    reserve_for_growth(positions, positions.size() + n);
    positions.insert(positions.end(), pos, pos + n);
  }
  uint64_t bytes() const { return keys.bytes() + values.bytes() + 4 * uint64_t(positions.size()); }

  // Truncation: removing every token at a position >= `position` (MergedLayerPair::can_truncate
  // for keys and values). Null when exact (or nothing goes), else why not.
  const char* removal_refusal(int32_t position) const;
  void remove_from(int32_t position) noexcept;  // only after removal_refusal() returned null

  MergedLayerPair keys, values;
  std::vector<int32_t> positions;
};

// Adds every token of layer `layer` (0 = l-1, 1 = l) of the pair to `attn` in bounded chunks.
void minicache_attend(const MiniCacheHeadPair& pair, int layer, OnlineAttention& attn);

// The same into any sink with add_chunk(k, v, positions, n), through caller-owned chunk buffers
// (grown once, then reused).
template <class Sink>
void minicache_attend(const MiniCacheHeadPair& pair, int layer, Sink& attn, std::vector<float>& k,
                      std::vector<float>& v) {
  const size_t dim = pair.keys.dim(), n_tok = pair.keys.size();
  at_least(k, std::min(kMiniCacheAttendChunk, n_tok) * dim);
  at_least(v, std::min(kMiniCacheAttendChunk, n_tok) * dim);
  for (size_t first = 0; first < n_tok; first += kMiniCacheAttendChunk) {
    const size_t n = std::min(kMiniCacheAttendChunk, n_tok - first);
    pair.keys.reconstruct(layer, first, n, k.data());
    pair.values.reconstruct(layer, first, n, v.data());
    attn.add_chunk(k.data(), v.data(), pair.positions.data() + first, n);
  }
}

}  // namespace kvsdk::cpu
