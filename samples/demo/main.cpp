// kvsdk-demo: a real model writes a scene under several KV policies side by side. Each row
// generates under its policy and memory budget, suspends its cache to a snapshot half way,
// resumes it in a NEW PROCESS, finishes, and checks that the continuation is identical to an
// uninterrupted run; it also measures the row's bytes, speed, and agreement with the full cache.
//
// The resumed half runs in a child process (this executable re-executed with --resume-child,
// resume_child.h): it shares nothing with the parent but the snapshot files and a few numbers
// on its command line.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "generate.h"
#include "model.h"
#include "proxy_runner.h"
#include "resume_child.h"
#include "row.h"
#include "tokenizer.h"

namespace {

// The default table: what kvsdk is for, on one screen. Eviction and its KIVI composition run at
// 25% of the full cache's bytes, where the budget forces them to drop or squeeze rows.
const char* const kDefaultRows =
    "full@100%,kivi@50%,snapkv@25%,snapkv+kivi2@25%,specache@100%,smallkv@25%,spindlekv@50%";

struct Options {
  std::string model = "shakespeare-base";
  std::string proxy_model;  // empty: llama::default_proxy_model(model)
  std::string prompt = "ROMEO:\nWhat light is this that breaks upon the hill?\n\nJULIET:\n";
  std::string rows = kDefaultRows;
  std::string budget = "100%";  // for rows without '@'
  int tokens = 400;
  float temperature = 0.7f;
  uint64_t seed = 42;
  int suspend_at = 0;  // 0: half way
  int kivi_residual = 32;
  std::string snapshot;
  std::string shared_dir = KVSDK_SHARED_DIR;
  std::string bundled_dir = std::string(KVSDK_SOURCE_DIR) + "/samples/models";
  bool quiet = false, verbose = false;
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: kvsdk-demo [options]\n"
               "  --model NAME|PATH    shakespeare-base (default), shakespeare-small, stories260K, or a .bin\n"
               "  --proxy-model NAME   smallkv's proxy model (default: shakespeare-small for shakespeare-base)\n"
               "  --prompt TEXT        prompt text\n"
               "  --policy R[,R..]     table rows, each POLICY[@BUDGET] (default\n"
               "                       %s)\n"
               "  --budget B           budget of rows without @: bytes, or P%% of the full cache for\n"
               "                       prompt + tokens (default 100%%)\n"
               "  --tokens N           tokens to generate (default 400)\n"
               "  --temperature T      sampling temperature, 0 = greedy (default 0.7)\n"
               "  --seed N             sampling seed (default 42)\n"
               "  --suspend-at K       suspend after K generated tokens (default N/2)\n"
               "  --kivi-residual R    exact residual window of KIVI tiers in tokens (default 32; the\n"
               "                       library's default 128 is sized for long contexts)\n"
               "  --snapshot FILE      where to write the snapshots (default a temporary file)\n"
               "  --quiet              print only the table\n"
               "  --verbose            also print every row's text\n",
               kDefaultRows);
}

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 0 || n > (1 << 24)) {
    throw llama::Error(flag + " needs a non-negative integer, got '" + v + "'");
  }
  return int(n);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (a == "--quiet" || a == "--verbose") {
      (a == "--quiet" ? o.quiet : o.verbose) = true;
      continue;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      throw llama::Error("missing value after " + a);
    }
    const std::string v = argv[++i];
    if (a == "--model") o.model = v;
    else if (a == "--proxy-model") o.proxy_model = v;
    else if (a == "--prompt") o.prompt = v;
    else if (a == "--policy") o.rows = v;
    else if (a == "--budget") o.budget = v;
    else if (a == "--tokens") o.tokens = to_int(a, v);
    else if (a == "--temperature") o.temperature = float(std::atof(v.c_str()));
    else if (a == "--seed") o.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--suspend-at") o.suspend_at = to_int(a, v);
    else if (a == "--kivi-residual") o.kivi_residual = to_int(a, v);
    else if (a == "--snapshot") o.snapshot = v;
    else {
      usage(stderr);
      throw llama::Error("unknown option " + a);
    }
  }
  return o;
}

std::string text_of(const llama::Tokenizer& tok, const std::vector<int>& ids, int prev) {
  std::string s;
  for (int id : ids) {
    if (id != llama::Tokenizer::kBos) s += tok.decode(prev, id);  // BOS is not text
    prev = id;
  }
  return s;
}

// The row's scene: prompt, the text before the suspend, [*], the text the new process wrote.
void print_scene(const demo::Setup& s, const llama::Tokenizer& tok, const demo::Row& r) {
  const std::vector<int> before(r.generated.begin(), r.generated.begin() + s.suspend_at);
  const std::vector<int> after(r.generated.begin() + s.suspend_at, r.generated.end());
  std::printf("--- %s at %s: suspended after %d tokens (process %d), resumed in process %d at [*] ---\n"
              "%s%s[*]%s\n\n",
              r.spec.policy.c_str(), r.spec.budget.c_str(), s.suspend_at, int(getpid()), r.child_pid,
              text_of(tok, s.prompt, -1).c_str(), text_of(tok, before, s.prompt.back()).c_str(),
              text_of(tok, after, before.back()).c_str());
}

// Prints the table and its notes; returns the process's exit status.
int print_table(const demo::Setup& s, const std::vector<demo::Row>& rows) {
  std::printf("%-16s %-16s %10s %10s %6s %10s %6s %9s %7s  %s\n", "policy", "budget", "peak KV", "KV at",
              "tokens", "snapshot", "snap/", "tokens/s", "top-1", "resumed");
  std::printf("%-16s %-16s %10s %10s %6s %10s %6s %9s %7s  %s\n", "", "", "bytes", "suspend", "kept",
              "bytes", "full", "", "vs full", "identical");
  int ran = 0, identical = 0;
  std::vector<std::string> notes;
  for (const demo::Row& r : rows) {
    const std::string budget = r.spec.budget + " (" + std::to_string(r.budget_bytes) + ")";
    if (!r.ran) {
      std::printf("%-16s %-16s %10s %10s %6s %10s %6s %9s %7s  refused [%zu]\n", r.spec.policy.c_str(),
                  budget.c_str(), "-", "-", "-", "-", "-", "-", "-", notes.size() + 1);
      notes.push_back(r.spec.policy + " at " + r.spec.budget + " did not run: " + r.why);
      continue;
    }
    ++ran;
    identical += r.identical;
    std::string mark;
    if (r.proxy_bytes) {
      notes.push_back(r.spec.policy + ": the proxy model " + s.proxy_name + " runs every token on its own thread, in parallel, with its own full cache of " +
                      std::to_string(r.proxy_bytes) + " bytes, outside the budget; its snapshot is saved beside the row's.");
      mark = " [" + std::to_string(notes.size()) + "]";
    }
    if (r.hit_rate >= 0) {
      char hit[32];
      std::snprintf(hit, sizeof hit, "%.2f", r.hit_rate);
      notes.push_back(r.spec.policy + ": the budget holds the low-bit copy and the fetched rows; the full-precision backing store (" +
                      std::to_string(r.backing_bytes) + " bytes at the suspend point) lives off-budget in host memory and is " +
                      "inside the snapshot, so that the resumed process continues exactly. Fetch hit rate " + hit + ". " +
                      "Each step runs the model on two tokens, the output and a speculative next one whose queries " +
                      "prefetch the rows (SpeCache's decoding): on a model this small the second token's compute " +
                      "shows in tokens/s; on models whose decode is memory-bound it is nearly free (docs/benchmarks.md).");
      mark = " [" + std::to_string(notes.size()) + "]";
    }
    std::printf("%-16s %-16s %10llu %10llu %5.0f%% %10llu %6.3f %9.0f %7.3f  %s%s\n", r.spec.policy.c_str(),
                budget.c_str(), (unsigned long long)r.peak_bytes, (unsigned long long)r.suspend_bytes,
                100.0 * r.kept_share, (unsigned long long)r.snapshot_bytes,
                double(r.snapshot_bytes) / double(s.full_snapshot_bytes), r.tokens_per_s, r.top1,
                r.identical ? "yes" : "NO", mark.c_str());
  }
  std::printf("\nbudget: bytes the context allows (P%% of a full cache of prompt + tokens = %llu bytes); "
              "snap/full: against the full cache's snapshot at the same point (%llu bytes);\n"
              "tokens kept: share of the tokens seen that the cache still holds at the suspend point (mean over KV heads);\n"
              "tokens/s: decode speed of the uninterrupted run; top-1 vs full: share of %d steps "
              "where the policy's most likely next token is full's, teacher-forced on full's text.\n",
              (unsigned long long)s.full_bytes, (unsigned long long)s.full_snapshot_bytes, s.tokens);
  for (size_t i = 0; i < notes.size(); ++i) std::printf("[%zu] %s\n", i + 1, notes[i].c_str());
  if (ran == 0) {
    std::printf("\nno row ran: every row was refused (see the notes)\n");
    return 1;
  }
  std::printf("\nresumed continuation identical to the uninterrupted run: %s (%d of %d rows that ran",
              identical == ran ? "yes" : "NO", identical, ran);
  if (ran < int(rows.size())) std::printf("; %d refused", int(rows.size()) - ran);
  std::printf(")\n");
  return identical == ran ? 0 : 1;
}

int run_parent(const Options& o) {
  std::string model_path, tok_path;
  llama::resolve_model(o.model, o.bundled_dir, o.shared_dir, &model_path, &tok_path);
  const llama::Model model = llama::Model::load(model_path);
  const llama::Tokenizer tok = llama::Tokenizer::load(tok_path, model.config().vocab_size);

  std::vector<demo::RowSpec> specs;
  for (const std::string& item : llama::split_list(o.rows)) specs.push_back(demo::parse_row_spec(item, o.budget));
  if (specs.empty()) throw llama::Error("--policy names no row");

  demo::Setup s;
  s.model = &model;
  s.model_path = model_path;
  s.prompt = llama::encode_prompt(tok, o.prompt);
  s.tokens = o.tokens;
  s.suspend_at = o.suspend_at > 0 ? o.suspend_at : o.tokens / 2;
  s.temperature = o.temperature;
  s.seed = o.seed;
  s.kivi_residual = o.kivi_residual;
  if (s.prompt.empty()) throw llama::Error("the prompt is empty");
  if (o.tokens < 2) throw llama::Error("--tokens must be at least 2");
  if (s.suspend_at >= o.tokens) throw llama::Error("--suspend-at must be below --tokens");
  if (int(s.prompt.size()) + o.tokens > model.config().seq_len) {
    throw llama::Error("prompt + tokens exceed the model's context of " + std::to_string(model.config().seq_len));
  }
  s.full_bytes = llama::full_cache_bytes_per_token(model) * uint64_t(s.prompt.size() + size_t(o.tokens));
  s.snapshot = o.snapshot.empty() ? "/tmp/kvsdk-demo-" + std::to_string(getpid()) + ".kvsnap" : o.snapshot;

  // SmallKV's proxy is loaded only when a row needs it.
  std::unique_ptr<llama::Model> proxy;
  bool wants_proxy = false;
  for (const demo::RowSpec& r : specs) wants_proxy = wants_proxy || r.policy.rfind("smallkv", 0) == 0;
  const std::string proxy_name = o.proxy_model.empty() ? llama::default_proxy_model(o.model) : o.proxy_model;
  if (wants_proxy && !proxy_name.empty()) {
    std::string proxy_tok;
    llama::resolve_model(proxy_name, o.bundled_dir, o.shared_dir, &s.proxy_path, &proxy_tok);
    s.proxy_name = proxy_name;
    proxy = std::make_unique<llama::Model>(llama::Model::load(s.proxy_path));
    s.proxy = proxy.get();
  }

  const llama::Config& c = model.config();
  std::printf("kvsdk demo: %s (%d layers, %d query / %d KV heads of %d) writes %d tokens after a "
              "%zu-token prompt under each policy,\nsuspends the conversation to a snapshot after %d "
              "tokens, and resumes it in a new process. KIVI tiers keep the newest %d tokens exact.\n\n",
              o.model.c_str(), c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), o.tokens, s.prompt.size(),
              s.suspend_at, o.kivi_residual);
  std::fflush(stdout);
  demo::run_reference(&s);

  std::vector<demo::Row> rows;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!o.quiet) std::fprintf(stderr, "[%zu/%zu] %s at %s\n", i + 1, specs.size(), specs[i].policy.c_str(),
                               specs[i].budget.c_str());
    rows.push_back(demo::run_row(s, specs[i]));
    const demo::Row& r = rows.back();
    if (!o.quiet && r.ran && (o.verbose || i == 0)) print_scene(s, tok, r);
    std::fflush(stdout);
  }
  if (!o.quiet) std::printf("\n");
  return print_table(s, rows);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    demo::ChildArgs child;
    if (demo::parse_child_args(argc, argv, &child)) return demo::run_child(child);
    return run_parent(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsdk-demo: %s\n", e.what());
    return 2;
  }
}
