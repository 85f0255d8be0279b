// PyramidKV / SpindleKV layer schedule (SpindleKV paper §3.3, Eq. (5) and (6)).
#include <algorithm>
#include <cmath>

#include "policy/allocation.h"

namespace kvsdk::policy {

std::vector<uint64_t> allocate_pyramid(const std::vector<uint64_t>& lengths,
                                       const std::vector<uint64_t>& protected_tokens,
                                       uint64_t capacity, double alpha, double beta) {
  const size_t m = lengths.size();
  uint64_t total = 0, prot = 0, context = 0;
  std::vector<uint64_t> p(m), c(m);
  for (size_t i = 0; i < m; ++i) {
    p[i] = std::min(protected_tokens[i], lengths[i]);
    c[i] = lengths[i] - p[i];
    total += lengths[i];
    prot += p[i];
    context += c[i];
  }
  if (capacity >= total) return lengths;
  if (capacity <= prot || context == 0) return allocate_uniform(p, capacity);
  // r_c: the ratio of the context (beyond the observation windows) that fits.
  const double rc = double(capacity - prot) / double(context);
  double r0, rlast;
  if (rc <= beta) {
    r0 = rlast = rc;  // below the minimal ratio the schedule is flat
  } else if (rc <= alpha) {
    r0 = 2 * rc - beta;  // Eq. (5), first case
    rlast = beta;
  } else {
    r0 = 1.0;  // Eq. (5), second case: layer 0 keeps everything
    rlast = 2 * rc - 1.0;
  }
  std::vector<uint64_t> out(m);
  uint64_t used = 0;
  for (size_t i = 0; i < m; ++i) {
    const double r = m == 1 ? rc : r0 + (rlast - r0) * double(i) / double(m - 1);  // Eq. (6)
    const double keep = std::clamp(r, 0.0, 1.0) * double(c[i]);
    out[i] = p[i] + std::min<uint64_t>(c[i], uint64_t(std::floor(keep)));
    used += out[i];
  }
  // Rounding: hand leftover tokens to the shallowest layers with room (the schedule favours
  // them), take excess from the deepest.
  for (size_t i = 0; used < capacity && i < m; ++i) {
    const uint64_t add = std::min(capacity - used, lengths[i] - out[i]);
    out[i] += add;
    used += add;
  }
  for (size_t i = m; used > capacity && i-- > 0;) {
    const uint64_t sub = std::min(used - capacity, out[i]);
    out[i] -= sub;
    used -= sub;
  }
  return out;
}

}  // namespace kvsdk::policy
