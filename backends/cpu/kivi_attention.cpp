#include "kivi_attention.h"

#include <algorithm>
#include <vector>

#include "util/growth.h"

namespace kvsdk::cpu {

void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn, AttentionScratch& scratch) {
  const size_t dim = store.head_dim();
  const size_t chunk = std::min(kKiviAttentionChunk, store.size()) * dim;
  std::vector<float>& k = at_least(scratch.k_chunk, chunk);
  std::vector<float>& v = at_least(scratch.v_chunk, chunk);
  for (size_t first = 0; first < store.size(); first += kKiviAttentionChunk) {
    const size_t n = std::min(kKiviAttentionChunk, store.size() - first);
    store.read_rows(first, n, k.data(), v.data());
    attn.add_chunk(k.data(), v.data(), store.positions().data() + first, n);
  }
}

void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn) {
  AttentionScratch chunks;
  kivi_attend(store, attn, chunks);
}

}  // namespace kvsdk::cpu
