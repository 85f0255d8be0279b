#include "row.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>

#include "context_handle.h"
#include "error.h"
#include "generate.h"
#include "policy_runner.h"
#include "resume_child.h"
#include "sampler.h"

namespace demo {

namespace {

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw llama::Error("cannot stat '" + path + "'");
  return uint64_t(st.st_size);
}

kvsdk_policy policy_of(const Setup& s, const std::string& spec) {
  kvsdk_policy p;
  llama::check(kvsdk_policy_parse(&p, spec.c_str()), "kvsdk_policy_parse");
  if (s.kivi_residual >= 0) p.quant_residual = s.kivi_residual;
  return p;
}

size_t vocab(const Setup& s) { return size_t(s.model->config().vocab_size); }

// Generates s.tokens tokens from the prompt with the setup's sampler. With `suspend_to`, saves
// the conversation after s.suspend_at tokens and stops there, filling `child` with what a new
// process needs to continue. `peak`, `seconds`: the most cache bytes seen and the decode time.
std::vector<int> generate(const Setup& s, PolicyRunner& r, const std::string* suspend_to,
                          ChildArgs* child, uint64_t* peak, double* seconds) {
  std::vector<float> logits(vocab(s));
  llama::Sampler sampler(s.temperature, s.seed);
  r.prefill(s.prompt, logits.data());
  if (peak) *peak = r.cache_bytes();
  std::vector<int> out;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < s.tokens; ++i) {
    const int token = sampler.sample(logits.data(), logits.size());
    out.push_back(token);
    if (suspend_to && i + 1 == s.suspend_at) {
      child->at = r.save(*suspend_to);
      child->pending = token;
      child->rng_state = sampler.state();
      child->remaining = s.tokens - s.suspend_at;
      return out;
    }
    if (i + 1 < s.tokens) {
      r.feed(token, logits.data());
      if (peak) *peak = std::max(*peak, r.cache_bytes());
    }
  }
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

RowSpec parse_row_spec(const std::string& item, const std::string& default_budget) {
  const size_t at = item.find('@');
  if (at == std::string::npos) return RowSpec{item, default_budget};
  if (at == 0 || at + 1 == item.size()) throw llama::Error("bad row '" + item + "' (want POLICY[@BUDGET])");
  return RowSpec{item.substr(0, at), item.substr(at + 1)};
}

void run_reference(Setup* s) {
  llama::ContextHandle ctx(s->full_bytes);  // the full row's budget, so that its snapshot is this one
  const kvsdk_policy full = policy_of(*s, "full");
  PolicyRunner r(*s->model, nullptr, ctx.ctx, full);
  std::vector<float> logits(vocab(*s));
  llama::Sampler sampler(s->temperature, s->seed);
  r.prefill(s->prompt, logits.data());
  s->full_tokens.clear();
  s->full_argmax.clear();
  for (int i = 0; i < s->tokens; ++i) {
    s->full_argmax.push_back(llama::argmax(logits.data(), logits.size()));
    s->full_tokens.push_back(sampler.sample(logits.data(), logits.size()));
    if (i + 1 == s->suspend_at) {
      r.save(s->snapshot);
      s->full_snapshot_bytes = file_size(s->snapshot);
    }
    if (i + 1 < s->tokens) r.feed(s->full_tokens.back(), logits.data());
  }
  std::remove(s->snapshot.c_str());
}

Row run_row(const Setup& s, const RowSpec& spec) {
  Row row;
  row.spec = spec;
  row.budget_bytes = llama::parse_budget(spec.budget, s.full_bytes);
  const kvsdk_policy policy = policy_of(s, spec.policy);
  if (policy.method == KVSDK_METHOD_SMALLKV && !s.proxy) {
    row.status = KVSDK_E_INVALID_ARG;
    row.why = "smallkv needs a smaller proxy model of the same family; none is paired with this model "
              "(pass --proxy-model NAME)";
    return row;
  }
  try {
    // 1. The uninterrupted run: the policy's own text, its peak bytes and its decode speed.
    double seconds = 0;
    {
      llama::ContextHandle ctx(row.budget_bytes);
      PolicyRunner r(*s.model, s.proxy, ctx.ctx, policy);
      row.generated = generate(s, r, nullptr, nullptr, &row.peak_bytes, &seconds);
      row.proxy_bytes = r.proxy_bytes();
      row.hit_rate = r.fetch_hit_rate();
    }
    row.tokens_per_s = seconds > 0 ? double(s.tokens - 1) / seconds : 0;

    // 2. The same run suspended to a snapshot; this process then forgets the conversation ...
    ChildArgs child;
    std::vector<int> resumed;
    {
      llama::ContextHandle ctx(row.budget_bytes);
      PolicyRunner r(*s.model, s.proxy, ctx.ctx, policy);
      resumed = generate(s, r, &s.snapshot, &child, nullptr, nullptr);
      const kvsdk_cache_stats st = r.stats();
      row.suspend_bytes = st.bytes;
      row.backing_bytes = st.backing_bytes;
      const uint64_t heads = uint64_t(s.model->config().n_kv_heads);
      row.kept_share = st.appended_tokens ? double(st.tokens) / double(st.appended_tokens * heads) : 0;
      row.snapshot_bytes = file_size(s.snapshot);
    }
    // ... and a new process continues from the snapshot.
    child.model_path = s.model_path;
    if (policy.method == KVSDK_METHOD_SMALLKV) child.proxy_model_path = s.proxy_path;
    child.snapshot = s.snapshot;
    child.out = s.snapshot + ".tokens";
    child.budget = row.budget_bytes;
    child.temperature = s.temperature;
    const std::vector<int> rest = resume_in_new_process(child);
    std::remove(s.snapshot.c_str());
    std::remove(PolicyRunner::proxy_snapshot(s.snapshot).c_str());
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    row.identical = resumed == row.generated;
    row.child_pid = child.pid;

    // 3. Teacher-forced on the full cache's tokens: does the policy predict what full predicts?
    {
      llama::ContextHandle ctx(row.budget_bytes);
      PolicyRunner r(*s.model, s.proxy, ctx.ctx, policy);
      std::vector<float> logits(vocab(s));
      r.prefill(s.prompt, logits.data());
      int agree = 0;
      for (int i = 0; i < s.tokens; ++i) {
        agree += llama::argmax(logits.data(), logits.size()) == s.full_argmax[size_t(i)];
        if (i + 1 < s.tokens) r.feed(s.full_tokens[size_t(i)], logits.data());
      }
      row.top1 = double(agree) / double(s.tokens);
    }
    row.ran = true;
  } catch (const llama::KvsdkError& e) {
    std::remove(s.snapshot.c_str());
    std::remove(PolicyRunner::proxy_snapshot(s.snapshot).c_str());
    // The library refused this configuration (a budget the policy cannot meet, or a
    // combination it does not implement): the row says why and does not count as a run.
    if (e.status() != KVSDK_E_BUDGET && e.status() != KVSDK_E_UNSUPPORTED) throw;
    row.status = e.status();
    row.why = e.what();
  }
  return row;
}

}  // namespace demo
