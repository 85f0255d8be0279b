#include "kivi_attention.h"

#include <algorithm>
#include <vector>

namespace kvsdk::cpu {

void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn, AttentionScratch& scratch) {
  const size_t dim = store.head_dim();
  const size_t chunk = std::min(kKiviAttentionChunk, store.size()) * dim;
  std::vector<float>& k = scratch.k_chunk;
  std::vector<float>& v = scratch.v_chunk;
  if (k.size() < chunk) k.resize(chunk);
  if (v.size() < chunk) v.resize(chunk);
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
