#include "fidelity.h"

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "context_handle.h"
#include "error.h"
#include "proxy_runner.h"
#include "sampler.h"
#include "session.h"
#include "specache_run.h"

namespace eval {

namespace {

uint64_t cache_bytes(const llama::Session& s) {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  llama::check(kvsdk_cache_stats_get(s.cache(), &st), "kvsdk_cache_stats_get");
  return st.bytes;
}

// Feeds tokens[begin, end) under `schedule` (tokens before schedule.prompt_tokens in prefill
// chunks, never crossing `end`; later ones one per step); `logits` (tokens.size() x vocab, sized
// by the caller) receives those positions' next-token logits when non-null. Tracks the peak cache
// bytes after each append round.
void run_range(llama::Session& s, const std::vector<int>& tokens, size_t begin, size_t end,
               const Schedule& schedule, std::vector<float>* logits, uint64_t* peak,
               uint64_t* prefill_peak = nullptr, llama::ProxyRunner* proxy = nullptr) {
  const size_t V = size_t(s.model().config().vocab_size);
  size_t t = begin;
  while (t < end) {
    const size_t n = t < schedule.prompt_tokens
                         ? std::min({schedule.chunk, schedule.prompt_tokens - t, end - t})
                         : 1;
    if (proxy) proxy->forward(tokens.data() + t, n);  // SmallKV: the proxy's step comes first
    s.forward(tokens.data() + t, n, logits ? logits->data() + t * V : nullptr, logits != nullptr);
    *peak = std::max(*peak, cache_bytes(s));
    if (prefill_peak && t < schedule.prompt_tokens) *prefill_peak = std::max(*prefill_peak, cache_bytes(s));
    t += n;
  }
}

// run_range over every token.
void run(llama::Session& s, const std::vector<int>& tokens, const Schedule& schedule,
         std::vector<float>* logits, uint64_t* peak, uint64_t* prefill_peak = nullptr,
         llama::ProxyRunner* proxy = nullptr) {
  const size_t V = size_t(s.model().config().vocab_size);
  if (logits) logits->assign(tokens.size() * V, 0.0f);
  run_range(s, tokens, 0, tokens.size(), schedule, logits, peak, prefill_peak, proxy);
}

// The conversation after a real resume: the live cache saved to a snapshot (default options)
// and loaded back into the same context, as an app that closed mid-conversation would continue.
// SmallKV's proxy (a separate cache on its own context) is saved and loaded the same way.
// `position`: the tokens the conversation holds (SpeCache's decoder, not the session, counts
// them during its prefill).
struct Resumed {
  std::unique_ptr<llama::Session> session;
  std::unique_ptr<llama::ProxyRunner> proxy;
  uint64_t snapshot_bytes = 0;  // the conversation's snapshot (the proxy's is not counted)
};

// `cache` saved to a buffer with `options` (NULL: defaults).
std::vector<unsigned char> save_to_buffer(kvsdk_cache* cache, const kvsdk_save_options* options) {
  size_t size = 0;
  llama::check(kvsdk_cache_save_to_buffer(cache, options, nullptr, 0, &size),
               "kvsdk_cache_save_to_buffer (size)");
  std::vector<unsigned char> snapshot(size);
  llama::check(kvsdk_cache_save_to_buffer(cache, options, snapshot.data(), size, &size),
               "kvsdk_cache_save_to_buffer");
  snapshot.resize(size);
  return snapshot;
}

// `kvsdk recompress` on a buffer: `snapshot` loaded into a scratch context without a budget and
// saved converted to `target` (target_budget_bytes 0: the loaded cache's own budget; the other
// options the defaults, as every snapshot of the eval). Why not a targeted save straight from
// the live cache: the eval's context budget is full (the live cache fills it), and the converted
// cache is charged to that same context while it is built ("Targeted saves" in kvsdk.h), so an
// eviction target would evict to the few free bytes and a KIVI target would fail; a scratch
// context without a budget converts every row the live cache kept, as recompress does.
std::vector<unsigned char> recompress(const std::vector<unsigned char>& snapshot,
                                      const kvsdk_policy& target) {
  llama::ContextHandle scratch(0);
  kvsdk_cache* loaded = nullptr;
  llama::check(kvsdk_cache_load_from_buffer(&loaded, scratch.ctx, snapshot.data(), snapshot.size(),
                                            nullptr, nullptr),
               "kvsdk_cache_load_from_buffer (save-as source)");
  std::unique_ptr<kvsdk_cache, decltype(&kvsdk_cache_destroy)> owned(loaded, kvsdk_cache_destroy);
  kvsdk_save_options o;
  llama::check(kvsdk_save_options_init(&o), "kvsdk_save_options_init");
  o.target_policy = &target;
  o.target_budget_bytes = 0;
  return save_to_buffer(loaded, &o);
}

Resumed save_and_resume(const llama::Model& model, kvsdk_context* ctx,
                        std::unique_ptr<llama::Session> live,
                        std::unique_ptr<llama::ProxyRunner> live_proxy,
                        const llama::Model* proxy_model, int position,
                        const kvsdk_policy* save_as) {
  std::vector<unsigned char> snapshot = save_to_buffer(live->cache(), nullptr);
  const std::string proxy_file = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                                 "/kvsdk-eval-proxy-" + std::to_string(::getpid()) + ".kvsnap";
  if (live_proxy) live_proxy->save(proxy_file);
  // The live conversation goes first (its bytes leave the budget), as when the app quit.
  live_proxy.reset();
  live.reset();
  if (save_as) {
    try {
      snapshot = recompress(snapshot, *save_as);
    } catch (...) {
      std::remove(proxy_file.c_str());
      throw;
    }
  }
  Resumed r;
  r.snapshot_bytes = snapshot.size();
  kvsdk_cache* cache = nullptr;
  llama::check(kvsdk_cache_load_from_buffer(&cache, ctx, snapshot.data(), snapshot.size(), nullptr,
                                            nullptr),
               "kvsdk_cache_load_from_buffer");
  r.session = std::make_unique<llama::Session>(model, cache, position);  // owns `cache`
  if (proxy_model) {
    try {
      r.proxy = std::make_unique<llama::ProxyRunner>(*proxy_model, r.session->cache(), proxy_file,
                                                     position);
    } catch (...) {
      std::remove(proxy_file.c_str());
      throw;
    }
    std::remove(proxy_file.c_str());
  }
  return r;
}

// XKV mini-prefill: plans the prompt without touching the cache, then fixes the allocation of
// the real prefill. The token total is what the budget holds once the observation windows the
// prefill will observe are charged (the cache caps a window at an eighth of the budget).
void mini_prefill(llama::Session& s, const std::vector<int>& tokens, const Schedule& schedule,
                  const kvsdk_policy& policy, uint64_t budget) {
  const kvsdk_geometry g = llama::geometry_of(s.model().config());
  kvsdk_planner* planner = nullptr;
  llama::check(kvsdk_planner_create(&planner, &g, &policy), "kvsdk_planner_create");
  try {
    s.plan_prefill(tokens.data(), schedule.prompt_tokens, planner, size_t(policy.obs_window));
    uint64_t unit = 0;
    llama::check(kvsdk_cache_token_capacity(s.cache(), nullptr, &unit), "kvsdk_cache_token_capacity");
    const uint64_t row = uint64_t(g.n_q_heads) * g.head_dim * 4 + 4;
    uint64_t w = uint64_t(policy.obs_window);
    if (budget) w = std::max<uint64_t>(1, std::min<uint64_t>(w, budget / 8 / (g.n_layers * row)));
    const uint64_t windows = uint64_t(g.n_layers) * w * row;
    const uint64_t total = budget > windows ? (budget - windows) / unit : 0;
    std::vector<uint64_t> alloc(g.n_layers);
    llama::check(kvsdk_planner_finish(planner, KVSDK_ALLOC_TOTAL_TOKENS, double(total), alloc.data(),
                                      g.n_layers),
                 "kvsdk_planner_finish");
    llama::check(kvsdk_cache_set_allocation(s.cache(), alloc.data(), g.n_layers),
                 "kvsdk_cache_set_allocation");
  } catch (...) {
    kvsdk_planner_destroy(planner);
    throw;
  }
  kvsdk_planner_destroy(planner);
}

std::vector<double> log_softmax(const float* logits, size_t n) {
  double m = logits[0];
  for (size_t i = 1; i < n; ++i) m = std::max(m, double(logits[i]));
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - m);
  const double lse = m + std::log(sum);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = double(logits[i]) - lse;
  return out;
}

}  // namespace

double perplexity(const std::vector<float>& logits, const std::vector<int>& text, size_t vocab) {
  double nll = 0;
  for (size_t t = 0; t + 1 < text.size(); ++t) {
    nll -= log_softmax(logits.data() + t * vocab, vocab)[size_t(text[t + 1])];
  }
  return text.size() > 1 ? std::exp(nll / double(text.size() - 1)) : 1.0;
}

double kl_divergence(const float* p_logits, const float* q_logits, size_t vocab) {
  const std::vector<double> lp = log_softmax(p_logits, vocab), lq = log_softmax(q_logits, vocab);
  double kl = 0;
  for (size_t i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);  // rounding can give -1e-17 for identical distributions
}

uint64_t snapshot_bytes(const kvsdk_cache* cache) {
  size_t size = 0;
  // The size query writes nothing; a cache that cannot be saved reports 0 (and the row shows it).
  if (kvsdk_cache_save_to_buffer(const_cast<kvsdk_cache*>(cache), nullptr, nullptr, 0, &size) !=
      KVSDK_OK) {
    return 0;
  }
  return size;
}

Reference build_reference(const llama::Model& model, const std::vector<int>& text, Schedule schedule) {
  if (text.size() < 2 || schedule.prompt_tokens == 0 || schedule.prompt_tokens >= text.size()) {
    throw llama::Error("evaluation text needs at least 2 tokens and a prompt shorter than it");
  }
  const size_t V = size_t(model.config().vocab_size);
  Reference ref;
  ref.text = text;
  ref.schedule = schedule;
  llama::ContextHandle ctx(0);
  {
    llama::Session s(model, ctx.ctx, nullptr);
    std::vector<float> logits;
    run(s, text, schedule, &logits, &ref.full_cache_bytes);
    ref.ppl_full = perplexity(logits, text, V);
  }
  // Continuation: prefill the prompt, then generate greedily one token per step.
  llama::Session s(model, ctx.ctx, nullptr);
  ref.continuation.assign(text.begin(), text.begin() + long(schedule.prompt_tokens));
  std::vector<float> prompt_logits(ref.continuation.size() * V);
  uint64_t peak = 0;
  // The resume point of evaluate(): every prompt token but the last.
  const size_t resume = schedule.prompt_tokens - 1;
  run_range(s, ref.continuation, 0, resume, schedule, &prompt_logits, &peak);
  ref.full_snapshot_bytes = snapshot_bytes(s.cache());
  run_range(s, ref.continuation, resume, ref.continuation.size(), schedule, &prompt_logits, &peak);
  std::vector<float> last(prompt_logits.end() - long(V), prompt_logits.end());
  while (ref.continuation.size() < text.size()) {
    ref.full_logits.insert(ref.full_logits.end(), last.begin(), last.end());
    const int next = llama::argmax(last.data(), V);
    ref.continuation.push_back(next);
    const float* l = s.step(next);
    last.assign(l, l + V);
    peak = std::max(peak, cache_bytes(s));
  }
  ref.full_cache_bytes = std::max(ref.full_cache_bytes, peak);
  return ref;
}

Outcome evaluate(const llama::Model& model, const Reference& ref, const kvsdk_policy& policy,
                 uint64_t budget_bytes, bool with_mini_prefill, const llama::Model* proxy_model,
                 bool with_ppl, const kvsdk_policy* save_as) {
  const size_t V = size_t(model.config().vocab_size);
  Outcome out;
  try {
    llama::ContextHandle ctx(budget_bytes);
    if (with_ppl) {
      llama::Session s(model, ctx.ctx, &policy);
      std::unique_ptr<llama::ProxyRunner> proxy;
      if (proxy_model) proxy = std::make_unique<llama::ProxyRunner>(*proxy_model, s.cache());
      std::vector<float> logits;
      if (with_mini_prefill) mini_prefill(s, ref.text, ref.schedule, policy, budget_bytes);
      if (policy.method == KVSDK_METHOD_SPECACHE) {  // SpeCache decodes with its own step
        run_specache(s, ref.text, ref.schedule, &logits, &out.cache_bytes, &out.prefill_bytes);
      } else {
        run(s, ref.text, ref.schedule, &logits, &out.cache_bytes, &out.prefill_bytes, proxy.get());
      }
      if (proxy) out.proxy_bytes = proxy->cache_bytes();
      out.ppl = perplexity(logits, ref.text, V);
    }
    // Teacher-forced on the full model's continuation: the logits at position t predict t+1.
    // Every prompt token but the last runs on the live cache, which is then saved and loaded
    // back; the scored steps (from the prompt's last token on) all run on the loaded cache, so
    // what the snapshot kept, and nothing else, decides them.
    const std::vector<int>& tokens = ref.continuation;
    const size_t resume = ref.schedule.prompt_tokens - 1;
    auto live = std::make_unique<llama::Session>(model, ctx.ctx, &policy);
    std::unique_ptr<llama::ProxyRunner> live_proxy;
    if (proxy_model) live_proxy = std::make_unique<llama::ProxyRunner>(*proxy_model, live->cache());
    std::vector<float> logits(tokens.size() * V, 0.0f);
    if (with_mini_prefill) mini_prefill(*live, tokens, ref.schedule, policy, budget_bytes);
    const bool specache = policy.method == KVSDK_METHOD_SPECACHE;
    if (specache) {
      specache_prefill(*live, tokens, resume, &logits, &out.cache_bytes, &out.prefill_bytes);
    } else {
      run_range(*live, tokens, 0, resume, ref.schedule, &logits, &out.cache_bytes,
                &out.prefill_bytes, live_proxy.get());
    }
    Resumed r = save_and_resume(model, ctx.ctx, std::move(live), std::move(live_proxy), proxy_model,
                                int(resume), save_as);
    out.snapshot_bytes = r.snapshot_bytes;
    if (specache) {
      out.fetch_hit_rate = specache_decode(*r.session, tokens, resume, ref.schedule, &logits,
                                           &out.cache_bytes, &out.prefill_bytes);
    } else {
      run_range(*r.session, tokens, resume, tokens.size(), ref.schedule, &logits, &out.cache_bytes,
                &out.prefill_bytes, r.proxy.get());
    }
    const size_t steps = ref.full_logits.size() / V;
    const size_t first = ref.schedule.prompt_tokens - 1;
    size_t agree = 0;
    double kl = 0;
    for (size_t i = 0; i < steps; ++i) {
      const float* full = ref.full_logits.data() + i * V;
      const float* mine = logits.data() + (first + i) * V;
      agree += llama::argmax(full, V) == llama::argmax(mine, V);
      kl += kl_divergence(full, mine, V);
    }
    out.top1_agreement = steps ? double(agree) / double(steps) : 1.0;
    out.kl = steps ? kl / double(steps) : 0.0;
    out.ok = true;
  } catch (const llama::KvsdkError& e) {
    out.status = e.status();
    out.error = e.what();
  }
  return out;
}

}  // namespace eval
