// MiniCache composed with KIVI (the "minicache+kivi4" composition: MiniCache's abstract presents it
// as complementary to quantization; docs/papers.md): a layer pair merged as in minicache_merge.h,
// with the shared directions of keys and values held in a KIVI store (key directions quantized per
// channel over blocks of G tokens, value directions per token, the most recent R merged tokens
// exact) instead of f16.
//
// Differences from MergedLayerPair, both because K and V directions share one KIVI row:
//  - one retention decision per token: a token stays unmerged when the larger of its key and value
//    angular distances ranks in the top γ at prefill (or reaches the prefill threshold later);
//  - magnitudes are the rows' true norms, and rows are restored as ||x|| · ê / ||ê|| with ê the
//    dequantized direction, so norms are exact whatever the quantization (and across residual
//    flushes, which change ê).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention.h"
#include "kivi_store.h"
#include "minicache_merge.h"

namespace kvsdk::cpu {

struct MiniCacheKiviBytes {
  uint64_t quantized = 0;  // the KIVI store of directions (codes, scales, zeros, residual)
  uint64_t merged = 0;     // f32 magnitudes: K and V of both layers per merged token
  uint64_t retained = 0;   // f16 K and V of both layers per retained token
  uint64_t metadata = 0;   // per-token slot, positions, the retention threshold
  uint64_t total() const { return quantized + merged + retained + metadata; }
};

class MiniCacheKiviPair {
 public:
  MiniCacheKiviPair(size_t dim, const MiniCacheConfig& merge, const KiviConfig& quant);

  // Appends n tokens of both layers ([n][dim] each) with their positions.
  void append(const float* k_prev, const float* v_prev, const float* k_cur, const float* v_cur,
              const int32_t* positions, size_t n);
  void append(const float* k_prev, const float* v_prev, const float* k_cur, const float* v_cur,
              const int32_t* positions, size_t n, MiniCacheScratch& scratch);

  // Restored rows [first, first + count) of layer 0 (l-1) or 1 (l).
  void read_rows(int layer, size_t first, size_t count, float* k, float* v) const;
  // The same through caller-owned scratch (its ek / ev: dequantized directions).
  void read_rows(int layer, size_t first, size_t count, float* k, float* v,
                 MiniCacheScratch& scratch) const;

  size_t size() const { return slot_.size(); }
  size_t dim() const { return dim_; }
  size_t retained() const { return retained_k_prev_.size() / dim_; }
  bool is_retained(size_t token) const { return (slot_[token] & kRetainedBit) != 0; }
  const std::vector<int32_t>& positions() const { return positions_; }
  const KiviHeadStore& directions() const { return directions_; }
  MiniCacheKiviBytes bytes() const;
  bool threshold_set() const { return threshold_set_; }
  float threshold() const { return threshold_; }

  // Truncation: removing every token at a position >= `position`. MergedLayerPair's rule (the
  // newest tokens, none of those that fixed the retention threshold unless all of them go; a
  // restored pair counts every restored token as one of those), and the KIVI store of the
  // directions must be able to drop the merged ones (KiviHeadStore::can_remove_from: only
  // directions appended since its last flush). Dropping every token gives the fresh pair back,
  // quantized blocks included. Null when exact (or nothing goes), else why not.
  const char* removal_refusal(int32_t position) const;
  void remove_from(int32_t position) noexcept;  // only after removal_refusal() returned null

  // Snapshot support: every buffer, and a pair rebuilt from them. restore() throws kvsdk::Error
  // KVSDK_E_CORRUPT when sizes, slots or the KIVI store are inconsistent.
  struct Buffers {
    bool threshold_set = false;
    float threshold = 2.0f;
    std::vector<uint32_t> slots;
    std::vector<int32_t> positions;
    KiviHeadBuffers directions;
    std::vector<float> norm_k_prev, norm_k_cur, norm_v_prev, norm_v_cur;
    std::vector<uint16_t> retained_k_prev, retained_k_cur, retained_v_prev, retained_v_cur;
  };
  Buffers buffers() const;
  static MiniCacheKiviPair restore(size_t dim, const MiniCacheConfig& merge,
                                   const KiviConfig& quant, Buffers b);

 private:
  static constexpr uint32_t kRetainedBit = 0x80000000u;
  size_t dim_;
  MiniCacheConfig cfg_;
  bool threshold_set_ = false;
  float threshold_ = 2.0f;
  size_t threshold_tokens_ = 0;  // tokens that fixed it (all restored ones after restore())
  std::vector<uint32_t> slot_;
  std::vector<int32_t> positions_;
  KiviHeadStore directions_;  // merged tokens' SLERP directions of K ("keys") and V ("values")
  std::vector<float> norm_k_prev_, norm_k_cur_, norm_v_prev_, norm_v_cur_;  // [merged]
  std::vector<uint16_t> retained_k_prev_, retained_k_cur_, retained_v_prev_, retained_v_cur_;
};

// Adds every token of layer `layer` of the pair to `attn` in bounded chunks.
void minicache_kivi_attend(const MiniCacheKiviPair& pair, int layer, OnlineAttention& attn);

// The same into any sink with add_chunk(k, v, positions, n), through caller-owned chunk buffers
// and scratch (grown once, then reused).
template <class Sink>
void minicache_kivi_attend(const MiniCacheKiviPair& pair, int layer, Sink& attn,
                           std::vector<float>& k, std::vector<float>& v,
                           MiniCacheScratch& scratch) {
  const size_t dim = pair.dim();
  at_least(k, std::min(kMiniCacheAttendChunk, pair.size()) * dim);
  at_least(v, std::min(kMiniCacheAttendChunk, pair.size()) * dim);
  for (size_t first = 0; first < pair.size(); first += kMiniCacheAttendChunk) {
    const size_t n = std::min(kMiniCacheAttendChunk, pair.size() - first);
    pair.read_rows(layer, first, n, k.data(), v.data(), scratch);
    attn.add_chunk(k.data(), v.data(), pair.positions().data() + first, n);
  }
}

}  // namespace kvsdk::cpu
