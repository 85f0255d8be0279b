// SpeCache's fetch hit rate (kvsdk_cache_fetch_stats; SpeCache (docs/papers.md) §4 reports it):
// the share of a real query's low-bit attention that falls on the rows the previous speculative
// token fetched, measured on the first attend of each (layer, KV head) after its prefetch and
// averaged over every measurement. A measurement, not state: never saved, never affects results.
// One instance per SpeCache store (host: specache_repr.h, device: device_specache.h).
//
// Inside an attend transaction (Representation::begin_attend .. commit_attend) a head's
// measurement is staged in that head's own slot (heads may attend on different threads) and
// applied in head order by commit(), or dropped by abort(), so a failed attend changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk {

class SpeCacheHitRate {
 public:
  SpeCacheHitRate(uint32_t layers, uint32_t kv_heads)
      : heads_(kv_heads), pending_(size_t(layers) * kv_heads, 0), staged_(kv_heads) {}

  // A prefetch of the head: its next attend measures.
  void prefetched(uint32_t layer, uint32_t head) { pending_[at(layer, head)] = 1; }
  bool pending(uint32_t layer, uint32_t head) const { return pending_[at(layer, head)] != 0; }
  // No measurement until the head's next prefetch (a truncation or restore dropped the fetch).
  void forget(uint32_t layer, uint32_t head) { pending_[at(layer, head)] = 0; }

  // The head's measured share (staged inside a transaction, else applied at once).
  void measured(uint32_t layer, uint32_t head, double share) const {
    if (staging_) {
      staged_[head] = Staged{true, layer, share};
    } else {
      apply(layer, head, share);
    }
  }
  void begin() const noexcept {
    abort();
    staging_ = true;
  }
  void commit() const noexcept {
    for (uint32_t h = 0; h < staged_.size(); ++h) {
      if (staged_[h].measured) apply(staged_[h].layer, h, staged_[h].share);
    }
    abort();
  }
  void abort() const noexcept {
    for (Staged& s : staged_) s.measured = false;
    staging_ = false;
  }

  double rate() const { return count_ ? sum_ / double(count_) : -1.0; }  // -1: none yet
  uint64_t samples() const { return count_; }

 private:
  size_t at(uint32_t layer, uint32_t head) const { return size_t(layer) * heads_ + head; }
  void apply(uint32_t layer, uint32_t head, double share) const noexcept {
    sum_ += share;
    ++count_;
    pending_[at(layer, head)] = 0;
  }
  struct Staged {
    bool measured = false;
    uint32_t layer = 0;
    double share = 0;
  };
  uint32_t heads_;
  mutable std::vector<char> pending_;  // [layer * heads + head]: prefetched since its attend
  mutable double sum_ = 0;
  mutable uint64_t count_ = 0;
  mutable bool staging_ = false;
  mutable std::vector<Staged> staged_;  // [kv_head]
};

}  // namespace kvsdk
