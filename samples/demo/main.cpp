// kvsdk-demo: a real model generates under a KV policy and memory budget, suspends its cache to
// a snapshot mid-generation, resumes it in a NEW PROCESS, continues, and checks that the
// continuation is identical to an uninterrupted run.
//
// The resumed half runs in a child process (this executable re-executed with the hidden
// --resume-child flag): it shares nothing with the parent but the snapshot file and a few
// numbers on its command line (model, budget, next position, pending token).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "error.h"
#include "generate.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

namespace {

struct Options {
  std::string model = "shakespeare-base";
  std::string prompt = "ROMEO:\nWhat light is this that breaks upon the hill?\n\nJULIET:\n";
  std::vector<std::string> policies = {"full"};
  std::string budget = "100%";
  int tokens = 200;
  float temperature = 0.7f;
  uint64_t seed = 42;
  int suspend_at = 0;  // 0: half way
  std::string snapshot;
  std::string shared_dir = KVSDK_SHARED_DIR;
  std::string bundled_dir = std::string(KVSDK_SOURCE_DIR) + "/samples/models";
  bool quiet = false;
};

// What the child needs to continue (passed on its command line).
struct ChildArgs {
  std::string model_path, tokenizer_path, snapshot, out;
  uint64_t budget = 0;
  int position = 0, pending = 0, remaining = 0;
  float temperature = 0;
  uint64_t rng_state = 1;
  int pid = 0;  // set by the parent after fork
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: kvsdk-demo [options]\n"
               "  --model NAME|PATH   shakespeare-base (default), shakespeare-small, stories260K, or a .bin\n"
               "  --prompt TEXT       prompt text\n"
               "  --policy A[,B..]    KV policies, one table row each (default full)\n"
               "  --budget B          bytes, or P%% of the full cache for prompt + tokens (default 100%%)\n"
               "  --tokens N          tokens to generate (default 200)\n"
               "  --temperature T     sampling temperature, 0 = greedy (default 0.7)\n"
               "  --seed N            sampling seed (default 42)\n"
               "  --suspend-at K      suspend after K generated tokens (default N/2)\n"
               "  --snapshot FILE     where to write the snapshot (default a temporary file)\n"
               "  --quiet             print only the table\n");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 0 || n > (1 << 24)) {
    throw llama::Error(flag + " needs a non-negative integer, got '" + v + "'");
  }
  return int(n);
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw llama::Error("cannot stat '" + path + "'");
  return uint64_t(st.st_size);
}

uint64_t cache_bytes(const kvsdk_cache* cache) {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  llama::check(kvsdk_cache_stats_get(cache, &st), "kvsdk_cache_stats_get");
  return st.bytes;
}

struct Context {
  kvsdk_context* ctx = nullptr;
  explicit Context(uint64_t budget) {
    kvsdk_context_options o;
    kvsdk_context_options_init(&o);
    o.budget_bytes = budget;
    llama::check(kvsdk_context_create(&ctx, &o), "kvsdk_context_create");
  }
  ~Context() { kvsdk_context_destroy(ctx); }
};

// Generates `n` tokens, starting by feeding `pending` (a token chosen but not fed yet).
std::vector<int> generate(llama::Session& s, llama::Sampler& sampler, int pending, int n) {
  std::vector<int> out;
  const size_t V = size_t(s.model().config().vocab_size);
  for (int i = 0; i < n; ++i) {
    pending = sampler.sample(s.step(pending), V);
    out.push_back(pending);
  }
  return out;
}

// --- the child: load the snapshot, continue, write the tokens -------------------------------

int run_child(const ChildArgs& a) {
  const llama::Model model = llama::Model::load(a.model_path);
  Context ctx(a.budget);
  const kvsdk_geometry g = llama::geometry_of(model.config());
  kvsdk_cache* cache = nullptr;
  llama::check(kvsdk_cache_load(&cache, ctx.ctx, a.snapshot.c_str(), &g, nullptr), "kvsdk_cache_load");
  llama::Session s(model, cache, a.position);
  llama::Sampler sampler(a.temperature, a.rng_state);
  const std::vector<int> rest = generate(s, sampler, a.pending, a.remaining);
  std::ofstream out(a.out);
  for (int t : rest) out << t << "\n";
  out << "bytes " << cache_bytes(s.cache()) << "\n";
  if (!out) throw llama::Error("cannot write '" + a.out + "'");
  return 0;
}

// Re-executes this program as a child that resumes from the snapshot; returns its tokens.
std::vector<int> resume_in_new_process(ChildArgs& a) {
  std::vector<std::string> args = {"kvsdk-demo", "--resume-child", a.snapshot,
                                   "--child-model", a.model_path,
                                   "--child-budget", std::to_string(a.budget),
                                   "--child-position", std::to_string(a.position),
                                   "--child-pending", std::to_string(a.pending),
                                   "--child-remaining", std::to_string(a.remaining),
                                   "--child-temperature", std::to_string(a.temperature),
                                   "--child-rng", std::to_string(a.rng_state),
                                   "--child-out", a.out};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(&s[0]);
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw llama::Error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "kvsdk-demo: exec failed: %s\n", std::strerror(errno));
    _exit(127);
  }
  a.pid = int(pid);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw llama::Error("the resumed process failed (status " + std::to_string(status) + ")");
  }
  std::ifstream in(a.out);
  std::vector<int> tokens;
  for (std::string line; std::getline(in, line) && line.rfind("bytes", 0) != 0;) {
    tokens.push_back(std::atoi(line.c_str()));
  }
  if (int(tokens.size()) != a.remaining) throw llama::Error("the resumed process returned too few tokens");
  return tokens;
}

// --- the parent ----------------------------------------------------------------------------------

struct Row {
  std::string policy, budget, status;
  uint64_t kv_bytes = 0, snapshot_bytes = 0;
  bool identical = false;
};

std::string text_of(const llama::Tokenizer& tok, const std::vector<int>& ids, int prev) {
  std::string s;
  for (int id : ids) {
    if (id != llama::Tokenizer::kBos) s += tok.decode(prev, id);  // BOS is not text
    prev = id;
  }
  return s;
}

Row run_policy(const Options& o, const std::string& spec, const llama::Model& model,
               const llama::Tokenizer& tok, const std::string& model_path, const std::vector<int>& prompt,
               uint64_t budget, const std::string& snapshot) {
  Row row;
  row.policy = spec;
  kvsdk_policy policy;
  llama::check(kvsdk_policy_parse(&policy, spec.c_str()), "kvsdk_policy_parse");
  const size_t V = size_t(model.config().vocab_size);
  const int suspend_at = o.suspend_at > 0 ? o.suspend_at : o.tokens / 2;
  std::vector<float> logits(V);

  // 1. Uninterrupted run.
  std::vector<int> reference;
  {
    Context ctx(budget);
    llama::Session s(model, ctx.ctx, &policy);
    llama::Sampler sampler(o.temperature, o.seed);
    llama::prefill(s, prompt, 16, logits.data());
    const int first = sampler.sample(logits.data(), V);
    reference.push_back(first);
    const std::vector<int> rest = generate(s, sampler, first, o.tokens - 1);
    reference.insert(reference.end(), rest.begin(), rest.end());
  }
  if (!o.quiet) {
    std::printf("--- %s: uninterrupted generation ---\n%s%s\n", spec.c_str(),
                text_of(tok, prompt, -1).c_str(), text_of(tok, reference, prompt.back()).c_str());
  }

  // 2. The same generation, suspended to a snapshot after `suspend_at` tokens ...
  std::vector<int> resumed;
  ChildArgs child;
  {
    Context ctx(budget);
    llama::Session s(model, ctx.ctx, &policy);
    llama::Sampler sampler(o.temperature, o.seed);
    llama::prefill(s, prompt, 16, logits.data());
    const int first = sampler.sample(logits.data(), V);
    resumed.push_back(first);
    const std::vector<int> part = generate(s, sampler, first, suspend_at - 1);
    resumed.insert(resumed.end(), part.begin(), part.end());
    kvsdk_save_options save;
    kvsdk_save_options_init(&save);
    llama::check(kvsdk_cache_save(s.cache(), snapshot.c_str(), &save), "kvsdk_cache_save");
    row.kv_bytes = cache_bytes(s.cache());
    row.snapshot_bytes = file_size(snapshot);
    child.position = s.position();
    child.rng_state = sampler.state();
  }  // ... and this process forgets the conversation.

  // 3. ... resumed in a new process, which generates the rest.
  child.model_path = model_path;
  child.snapshot = snapshot;
  child.out = snapshot + ".tokens";
  child.budget = budget;
  child.pending = resumed.back();
  child.remaining = o.tokens - suspend_at;
  child.temperature = o.temperature;
  const std::vector<int> rest = resume_in_new_process(child);
  std::remove(child.out.c_str());
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  row.identical = resumed == reference;
  row.status = "ok";
  if (!o.quiet) {
    const std::vector<int> before(resumed.begin(), resumed.begin() + suspend_at);
    const std::vector<int> after(resumed.begin() + suspend_at, resumed.end());
    std::printf("--- %s: suspended after %d tokens (process %d), resumed in process %d at [*] ---\n"
                "%s%s[*]%s\n\n",
                spec.c_str(), suspend_at, int(getpid()), child.pid, text_of(tok, prompt, -1).c_str(),
                text_of(tok, before, prompt.back()).c_str(), text_of(tok, after, before.back()).c_str());
  }
  return row;
}

int run_parent(const Options& o) {
  std::string model_path, tok_path;
  llama::resolve_model(o.model, o.bundled_dir, o.shared_dir, &model_path, &tok_path);
  const llama::Model model = llama::Model::load(model_path);
  const llama::Tokenizer tok = llama::Tokenizer::load(tok_path, model.config().vocab_size);
  const std::vector<int> prompt = llama::encode_prompt(tok, o.prompt);
  if (prompt.empty()) throw llama::Error("the prompt is empty");
  if (o.tokens < 2) throw llama::Error("--tokens must be at least 2");
  const int suspend_at = o.suspend_at > 0 ? o.suspend_at : o.tokens / 2;
  if (suspend_at >= o.tokens) throw llama::Error("--suspend-at must be below --tokens");
  if (int(prompt.size()) + o.tokens > model.config().seq_len) {
    throw llama::Error("prompt + tokens exceed the model's context of " +
                       std::to_string(model.config().seq_len));
  }
  const uint64_t full = llama::full_cache_bytes_per_token(model) * uint64_t(prompt.size() + size_t(o.tokens));
  const uint64_t budget = llama::parse_budget(o.budget, full);
  const std::string snapshot =
      o.snapshot.empty() ? "/tmp/kvsdk-demo-" + std::to_string(getpid()) + ".kvsnap" : o.snapshot;
  std::printf("model %s (%d layers, %d/%d heads), prompt %zu tokens, %d generated, suspend after %d\n"
              "budget %llu bytes (full cache for the sequence: %llu bytes)\n\n",
              model_path.c_str(), model.config().n_layers, model.config().n_heads,
              model.config().n_kv_heads, prompt.size(), o.tokens, suspend_at,
              (unsigned long long)budget, (unsigned long long)full);

  std::vector<Row> rows;
  for (const std::string& spec : o.policies) {
    try {
      rows.push_back(run_policy(o, spec, model, tok, model_path, prompt, budget, snapshot));
    } catch (const llama::KvsdkError& e) {
      Row r;
      r.policy = spec;
      r.status = kvsdk_status_str(e.status());
      std::fprintf(stderr, "%s: %s\n", spec.c_str(), e.what());
      rows.push_back(r);
    }
  }
  if (o.snapshot.empty()) std::remove(snapshot.c_str());

  bool all_identical = true;
  std::printf("%-14s %-22s %18s %15s  %s\n", "policy", "budget", "KV bytes in memory", "snapshot bytes",
              "identical");
  for (const Row& r : rows) {
    const std::string b = o.budget + " (" + std::to_string(budget) + " B)";
    if (r.status == "ok") {
      std::printf("%-14s %-22s %18llu %15llu  %s\n", r.policy.c_str(), b.c_str(),
                  (unsigned long long)r.kv_bytes, (unsigned long long)r.snapshot_bytes,
                  r.identical ? "yes" : "NO");
      all_identical = all_identical && r.identical;
    } else {
      std::printf("%-14s %-22s %18s %15s  %s\n", r.policy.c_str(), b.c_str(), "-", "-", r.status.c_str());
      all_identical = false;
    }
  }
  std::printf(all_identical ? "\nresumed continuation identical to the uninterrupted run: yes\n"
                            : "\nresumed continuation identical to the uninterrupted run: NO\n");
  return all_identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    ChildArgs child;
    bool is_child = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        usage(stdout);
        return 0;
      }
      if (a == "--quiet") {
        o.quiet = true;
        continue;
      }
      if (i + 1 >= argc) {
        usage(stderr);
        throw llama::Error("missing value after " + a);
      }
      const std::string v = argv[++i];
      if (a == "--model") o.model = v;
      else if (a == "--prompt") o.prompt = v;
      else if (a == "--policy") o.policies = split(v);
      else if (a == "--budget") o.budget = v;
      else if (a == "--tokens") o.tokens = to_int(a, v);
      else if (a == "--temperature") o.temperature = float(std::atof(v.c_str()));
      else if (a == "--seed") o.seed = std::strtoull(v.c_str(), nullptr, 10);
      else if (a == "--suspend-at") o.suspend_at = to_int(a, v);
      else if (a == "--snapshot") o.snapshot = v;
      else if (a == "--resume-child") is_child = true, child.snapshot = v;  // hidden
      else if (a == "--child-model") child.model_path = v;
      else if (a == "--child-budget") child.budget = std::strtoull(v.c_str(), nullptr, 10);
      else if (a == "--child-position") child.position = to_int(a, v);
      else if (a == "--child-pending") child.pending = to_int(a, v);
      else if (a == "--child-remaining") child.remaining = to_int(a, v);
      else if (a == "--child-temperature") child.temperature = float(std::atof(v.c_str()));
      else if (a == "--child-rng") child.rng_state = std::strtoull(v.c_str(), nullptr, 10);
      else if (a == "--child-out") child.out = v;
      else {
        usage(stderr);
        throw llama::Error("unknown option " + a);
      }
    }
    return is_child ? run_child(child) : run_parent(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsdk-demo: %s\n", e.what());
    return 2;
  }
}
