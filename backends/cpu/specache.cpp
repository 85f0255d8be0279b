#include "specache.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "smallkv.h"

namespace kvsdk::cpu {

namespace {
constexpr size_t kChunk = 256;
}

void SpeCacheBackingStore::append(const float* k_rows, const float* v_rows, size_t n) {
  const size_t old = k.size();
  k.resize(old + n * dim);
  v.resize(old + n * dim);
  for (size_t i = 0; i < n * dim; ++i) {
    k[old + i] = f32_to_f16(k_rows[i]);
    v[old + i] = f32_to_f16(v_rows[i]);
  }
}

std::vector<uint32_t> specache_select(const KiviHeadStore& lowbit, const float* q, size_t group,
                                      int32_t q_position, float scale, size_t k,
                                      std::vector<float>* avg_probs) {
  const size_t n = lowbit.size(), dim = lowbit.head_dim();
  std::vector<float> scores(group * n);
  std::vector<float> kr(kChunk * dim), vr(kChunk * dim);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t first = 0; first < n; first += kChunk) {
    const size_t c = std::min(kChunk, n - first);
    lowbit.read_rows(first, c, kr.data(), vr.data());
    for (size_t t = 0; t < c; ++t) {
      const bool visible = lowbit.positions()[first + t] <= q_position;
      for (size_t h = 0; h < group; ++h) {
        scores[h * n + first + t] = visible ? dot_f32(q + h * dim, &kr[t * dim], dim) * scale : neg_inf;
      }
    }
  }
  std::vector<float> avg(n, 0.0f);
  for (size_t h = 0; h < group; ++h) {
    float* s = &scores[h * n];
    const float mx = n ? *std::max_element(s, s + n) : neg_inf;
    if (mx == neg_inf) continue;  // nothing visible to this head
    double z = 0;
    for (size_t t = 0; t < n; ++t) z += (s[t] = std::exp(s[t] - mx));
    for (size_t t = 0; t < n; ++t) avg[t] += float(s[t] / z / double(group));
  }
  std::vector<uint32_t> top = smallkv_topk(avg.data(), n, k);
  if (avg_probs) *avg_probs = std::move(avg);
  return top;
}

SpeCacheFetched specache_fetch(const SpeCacheBackingStore& backing,
                               const std::vector<uint32_t>& tokens) {
  SpeCacheFetched f;
  const size_t dim = backing.dim;
  f.tokens = tokens;
  f.k.resize(tokens.size() * dim);
  f.v.resize(tokens.size() * dim);
  for (size_t i = 0; i < tokens.size(); ++i) {
    KVSDK_REQUIRE(tokens[i] < backing.size(), "fetched token ", tokens[i], " is beyond the ",
                  backing.size(), " tokens of the backing store");
    KVSDK_REQUIRE(i == 0 || tokens[i] > tokens[i - 1], "fetched tokens must be ascending");
    std::copy_n(&backing.k[size_t(tokens[i]) * dim], dim, &f.k[i * dim]);
    std::copy_n(&backing.v[size_t(tokens[i]) * dim], dim, &f.v[i * dim]);
  }
  return f;
}

void specache_attend(const KiviHeadStore& lowbit, const SpeCacheFetched& fetched,
                     OnlineAttention& attn) {
  const size_t n = lowbit.size(), dim = lowbit.head_dim();
  std::vector<float> k(kChunk * dim), v(kChunk * dim);
  size_t next = 0;  // first fetched entry not yet substituted (both lists ascend)
  for (size_t first = 0; first < n; first += kChunk) {
    const size_t c = std::min(kChunk, n - first);
    lowbit.read_rows(first, c, k.data(), v.data());
    while (next < fetched.tokens.size() && fetched.tokens[next] < first + c) {
      const size_t t = fetched.tokens[next] - first;
      for (size_t d = 0; d < dim; ++d) {
        k[t * dim + d] = f16_to_f32(fetched.k[next * dim + d]);
        v[t * dim + d] = f16_to_f32(fetched.v[next * dim + d]);
      }
      ++next;
    }
    attn.add_chunk(k.data(), v.data(), lowbit.positions().data() + first, c);
  }
}

double specache_hit_rate(const std::vector<float>& probs, const std::vector<uint32_t>& tokens) {
  double total = 0, hit = 0;
  for (float p : probs) total += p;
  for (uint32_t t : tokens) {
    if (t < probs.size()) hit += probs[t];
  }
  return total > 0 ? hit / total : 0.0;
}

}  // namespace kvsdk::cpu
