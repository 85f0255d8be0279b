#include "kivi_attention.h"

#include <algorithm>
#include <vector>

#include "util/growth.h"

namespace kvsdk::cpu {

void kivi_attend_range(const KiviHeadStore& store, size_t first, size_t count,
                       OnlineAttention& attn, AttentionScratch& scratch) {
  const size_t dim = store.head_dim();
  const size_t chunk = std::min(kKiviAttentionChunk, count) * dim;
  std::vector<float>& k = at_least(scratch.k_chunk, chunk);
  std::vector<float>& v = at_least(scratch.v_chunk, chunk);
  for (size_t t = first; t < first + count; t += kKiviAttentionChunk) {
    const size_t n = std::min(kKiviAttentionChunk, first + count - t);
    store.read_rows(t, n, k.data(), v.data());
    attn.add_chunk(k.data(), v.data(), store.positions().data() + t, n);
  }
}

void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn, AttentionScratch& scratch) {
  kivi_attend_range(store, 0, store.size(), attn, scratch);
}

void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn) {
  AttentionScratch chunks;
  kivi_attend(store, attn, chunks);
}

}  // namespace kvsdk::cpu
