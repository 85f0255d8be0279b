// Split-K decode attention: one KV head's rows in token ranges on the context's pool, each range
// into its own softmax state (max, sum, unnormalized values), merged per head in range order by
// the backend's merge_partials. Heads alone give a pool no more tasks than the model has KV heads
// (one, on models with multi-query attention); ranges keep every thread busy on long caches.
#include <algorithm>

#include "core/cache.h"
#include "util/growth.h"

namespace kvsdk {

bool Cache::attend_split(const Representation& s, uint32_t layer, size_t n_rows,
                         const float* q_rows, const int32_t* row_pos, float* out_rows) const {
  const uint32_t n_kv = geometry_.n_kv_heads, dim = geometry_.head_dim;
  if (!s.attend_splits() || n_rows == 0 || n_rows * n_kv > kSplitMaxRows) return false;
  const auto parts_of = [&](size_t tokens) {
    return std::clamp<size_t>(tokens / kSplitTokens, 1, kMaxSplitParts);
  };
  bool any = false;
  for (uint32_t g = 0; g < n_kv && !any; ++g) any = parts_of(s.head_tokens(layer, g)) > 1;
  if (!any) return false;

  // Sized for the most parts at once, so that a growing cache allocates here only when the
  // number of query rows grows (the decode path keeps one shape).
  const size_t state_floats = n_rows * (size_t(dim) + 2);
  SplitScratch& sc = split_;
  at_least(sc.parts, size_t(n_kv) * kMaxSplitParts);
  at_least(sc.states, size_t(n_kv) * kMaxSplitParts);
  float* mem = at_least(sc.state, size_t(n_kv) * kMaxSplitParts * state_floats).data();
  size_t n_parts = 0;
  for (uint32_t g = 0; g < n_kv; ++g) {
    const size_t tokens = s.head_tokens(layer, g), parts = parts_of(tokens);
    const size_t step = ((tokens + parts - 1) / parts + 63) / 64 * 64;
    // A head with no rows still gets one (empty) range: its rows see nothing and get zeros.
    const size_t ranges = tokens == 0 ? 1 : (tokens + step - 1) / step;
    for (size_t r = 0; r < ranges; ++r) {
      float* m = mem + n_parts * state_floats;
      sc.states[n_parts] = {m, m + n_rows, m + 2 * n_rows};
      sc.parts[n_parts++] = {g, r * step, std::min(step, tokens - r * step)};
    }
  }
  const auto range = [&](size_t i) {
    const SplitPart& p = sc.parts[i];
    s.attend_range(layer, p.head, q_rows + size_t(p.head) * n_rows * dim, row_pos, n_rows,
                   p.first, p.count, sc.states[i]);
  };
  if (ctx_->pool().size() > 1) {
    ctx_->pool().run(n_parts, range);
  } else {
    for (size_t i = 0; i < n_parts; ++i) range(i);
  }
  // Parts are in head order; each head's ranges ascending.
  for (size_t i = 0; i < n_parts;) {
    size_t j = i;
    while (j < n_parts && sc.parts[j].head == sc.parts[i].head) ++j;
    s.ops().merge_partials(sc.states.data() + i, j - i, n_rows, dim,
                           out_rows + size_t(sc.parts[i].head) * n_rows * dim);
    i = j;
  }
  return true;
}

}  // namespace kvsdk
