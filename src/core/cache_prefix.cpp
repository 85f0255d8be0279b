// Shared prefixes (kvsdk_cache_freeze, kvsdk_cache_create_on_prefix): one frozen cache, e.g. a
// system prompt, continued by many conversations in its context. Its bytes are charged once (it
// is one cache, kept alive by its dependents); each conversation holds and charges only its own
// rows, and its policy (eviction, compression) applies to them alone. Attention runs over both
// without copying: the softmax over prefix + own rows is the two parts' attentions weighted by
// their normalizers, out = (Z_p out_p + Z_o out_o) / (Z_p + Z_o), with each Z as a log-sum-exp
// (Representation::attention_lse) so that nothing overflows.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "core/cache.h"
#include "core/policy.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

void Cache::check_mutable(const char* what) const {
  if (frozen_) {
    fail(KVSDK_E_STATE, what, ": the cache is frozen (a shared prefix) and changes no more");
  }
}

void Cache::freeze() {
  if (frozen_) return;
  // A prefix's attention runs for many conversations at once; policies that update state when
  // they attend (SmallKV's importance statistics, SpeCache's fetched rows) would let one
  // conversation change what another one sees.
  if (traits_.needs_proxy || traits_.prefetches) {
    fail(KVSDK_E_UNSUPPORTED, "policy '", policy_spec(policy_), "' cannot be a shared prefix: ",
         "its attention updates its own state");
  }
  if (prefix_) {
    // Attention merges one prefix with the own rows; a chain would need one merge per link.
    fail(KVSDK_E_UNSUPPORTED, "a conversation on a shared prefix cannot itself be frozen as one");
  }
  if (attention_tap_) {
    fail(KVSDK_E_STATE, "the cache is a SmallKV proxy; detach it before freezing it");
  }
  frozen_ = true;
}

std::unique_ptr<Cache> Cache::on_prefix(std::shared_ptr<const Cache> prefix,
                                        const kvsdk_policy& policy) {
  if (!prefix->frozen()) {
    fail(KVSDK_E_STATE, "the prefix cache is not frozen (kvsdk_cache_freeze it first)");
  }
  auto c = std::make_unique<Cache>(prefix->ctx_, prefix->geometry_, policy);
  c->prefix_ = std::move(prefix);
  return c;
}

void Cache::merge_prefix(uint32_t layer, const float* q_rows, const int32_t* row_pos,
                         size_t n_rows, float* out_rows) const {
  const Cache& p = *prefix_;
  const Representation& own = store(layer);
  const Representation& pre = p.store(layer);
  const size_t dim = geometry_.head_dim, head_elems = n_rows * dim;
  PrefixScratch& s = prefix_scratch_;
  float* pout = at_least(s.out, head_elems).data();
  float* lo = at_least(s.lse_own, n_rows).data();
  float* lp = at_least(s.lse_prefix, n_rows).data();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  for (uint32_t g = 0; g < geometry_.n_kv_heads; ++g) {
    const float* q = q_rows + g * head_elems;
    float* o = out_rows + g * head_elems;
    if (own.head_tokens(layer, g) > 0) {
      own.attention_lse(layer, g, q, row_pos, n_rows, lo, s.lse);
    } else {
      std::fill(lo, lo + n_rows, kNone);
    }
    {
      // The prefix's stores work in their own scratch: one dependent at a time.
      const std::lock_guard<std::mutex> hold(p.prefix_lock_);
      if (pre.head_tokens(layer, g) == 0) continue;
      pre.attend(layer, g, q, row_pos, n_rows, pout);
      pre.attention_lse(layer, g, q, row_pos, n_rows, lp, s.lse);
    }
    for (size_t r = 0; r < n_rows; ++r) {
      if (lp[r] == kNone) continue;  // the row sees no prefix token: its own part stands
      float* x = o + r * dim;
      const float* y = pout + r * dim;
      if (lo[r] == kNone) {
        std::copy_n(y, dim, x);
        continue;
      }
      // Weights relative to the larger normalizer: one of them is exactly 1.
      const double m = std::max(lo[r], lp[r]);
      const double wo = std::exp(double(lo[r]) - m), wp = std::exp(double(lp[r]) - m);
      const double inv = 1.0 / (wo + wp);
      for (size_t c = 0; c < dim; ++c) x[c] = float((wo * x[c] + wp * y[c]) * inv);
    }
  }
}

}  // namespace kvsdk
