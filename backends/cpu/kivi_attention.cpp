#include "kivi_attention.h"

#include <algorithm>
#include <vector>

namespace kvsdk::cpu {

void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn) {
  const size_t dim = store.head_dim();
  std::vector<float> k(kKiviAttentionChunk * dim), v(kKiviAttentionChunk * dim);
  for (size_t first = 0; first < store.size(); first += kKiviAttentionChunk) {
    const size_t n = std::min(kKiviAttentionChunk, store.size() - first);
    store.read_rows(first, n, k.data(), v.data());
    attn.add_chunk(k.data(), v.data(), store.positions().data() + first, n);
  }
}

}  // namespace kvsdk::cpu
