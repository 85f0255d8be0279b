// kvsdk-chat: a turn-by-turn conversation with a real model whose KV cache is a kvsdk cache.
// Each line read from stdin is one user turn, framed like the play the models learned from
// ("ROMEO:\n<line>\n\nJULIET:\n"); the model answers until it ends its speech (a blank line)
// or reaches --reply-tokens. After every turn the cache is saved to the session
// file: the first turn writes a full snapshot, later turns append a journal delta (only what
// changed), so a crash loses at most the current turn. `--resume FILE` picks the conversation up
// again, in this or any later process. Works interactively or with piped input.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
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
  std::string policy = "full";
  std::string budget;  // empty: unlimited
  std::string session_file = "kvsdk-chat.kvsnap";
  bool resume = false;
  std::string user = "ROMEO";
  std::string bot = "JULIET";
  int reply_tokens = 200;
  float temperature = 0.8f;
  uint64_t seed = 1;
  std::string shared_dir = KVSDK_SHARED_DIR;
  std::string bundled_dir = std::string(KVSDK_SOURCE_DIR) + "/samples/models";
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: kvsdk-chat [options] < turns.txt   (or type turns; Ctrl-D ends)\n"
               "  --model NAME|PATH     shakespeare-base (default), shakespeare-small, stories260K, .bin\n"
               "  --policy SPEC         KV policy (default full)\n"
               "  --budget B            bytes or P%% of the model's full context (default unlimited)\n"
               "  --session FILE        where each turn is saved (default kvsdk-chat.kvsnap)\n"
               "  --resume FILE         continue the conversation saved in FILE (and keep saving there)\n"
               "  --user NAME --bot NAME  speaker names framing each turn (default ROMEO, JULIET)\n"
               "  --reply-tokens N      longest reply (default 200)\n"
               "  --temperature T       0 = greedy (default 0.8)\n"
               "  --seed N              sampling seed (default 1)\n");
}

uint64_t stats_of(const kvsdk_cache* cache, uint64_t* appended) {
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  llama::check(kvsdk_cache_stats_get(cache, &st), "kvsdk_cache_stats_get");
  if (appended) *appended = st.appended_tokens;
  return st.bytes;
}

int run(const Options& o) {
  std::string model_path, tok_path;
  llama::resolve_model(o.model, o.bundled_dir, o.shared_dir, &model_path, &tok_path);
  const llama::Model model = llama::Model::load(model_path);
  const llama::Tokenizer tok = llama::Tokenizer::load(tok_path, model.config().vocab_size);
  const llama::Config& cfg = model.config();
  const size_t V = size_t(cfg.vocab_size);

  kvsdk_context_options co;
  kvsdk_context_options_init(&co);
  if (!o.budget.empty()) {
    co.budget_bytes = llama::parse_budget(o.budget, llama::full_cache_bytes_per_token(model) *
                                                        uint64_t(cfg.seq_len));
  }
  kvsdk_context* ctx = nullptr;
  llama::check(kvsdk_context_create(&ctx, &co), "kvsdk_context_create");
  struct CtxGuard {
    kvsdk_context* c;
    ~CtxGuard() { kvsdk_context_destroy(c); }
  } ctx_guard{ctx};

  std::unique_ptr<llama::Session> session;
  bool saved_once = false;
  if (o.resume) {
    const kvsdk_geometry g = llama::geometry_of(cfg);
    kvsdk_cache* cache = nullptr;
    kvsdk_load_info info;
    info.struct_size = sizeof info;
    llama::check(kvsdk_cache_load(&cache, ctx, o.session_file.c_str(), &g, &info), "kvsdk_cache_load");
    uint64_t appended = 0;
    stats_of(cache, &appended);
    // Every token went through every layer, so the next position is the per-layer count.
    const int position = int(appended / uint64_t(cfg.n_layers));
    session.reset(new llama::Session(model, cache, position));
    saved_once = true;
    std::fprintf(stderr, "[resumed %s: %d tokens, %u journal turns applied%s]\n", o.session_file.c_str(),
                 position, unsigned(info.journal_frames_applied),
                 info.journal_frames_dropped ? ", a torn last turn was dropped" : "");
  } else {
    kvsdk_policy policy;
    llama::check(kvsdk_policy_parse(&policy, o.policy.c_str()), "kvsdk_policy_parse");
    session.reset(new llama::Session(model, ctx, &policy));
  }

  llama::Sampler sampler(o.temperature, o.seed + uint64_t(session->position()));
  const int newline = tok.encode("\n", false).empty() ? -1 : tok.encode("\n", false).back();
  std::string line;
  int turn = 0;
  const bool interactive = isatty(0);
  if (interactive) std::printf("%s: ", o.user.c_str());
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const std::string framed = o.user + ":\n" + line + "\n\n" + o.bot + ":\n";
    std::vector<int> ids = tok.encode(framed, session->position() == 0 && tok.size() > 258);
    if (session->position() == 0 && tok.size() > 258) ids.insert(ids.begin(), llama::Tokenizer::kBos);
    if (session->position() + int(ids.size()) + o.reply_tokens > cfg.seq_len) {
      std::fprintf(stderr, "[the conversation reached the model's context of %d tokens]\n", cfg.seq_len);
      break;
    }
    std::vector<float> logits(V);
    llama::prefill(*session, ids, 16, logits.data());
    std::printf("%s:\n", o.bot.c_str());
    // Reply: sample, print, feed; stop after a blank line (end of a speech) or the token limit.
    int prev = ids.back();
    bool spoke = false;  // a blank line only ends the speech after some text
    for (int i = 0; i < o.reply_tokens; ++i) {
      const int next = sampler.sample(logits.data(), V);
      std::fputs(tok.decode(prev, next).c_str(), stdout);
      std::fflush(stdout);
      const float* l = session->step(next);
      std::copy_n(l, V, logits.data());
      const bool end_of_speech = spoke && next == newline && prev == newline;
      spoke = spoke || next != newline;
      prev = next;
      if (end_of_speech || next == llama::Tokenizer::kEos) break;
    }
    if (prev != newline) std::fputc('\n', stdout);
    // Autosave: a full snapshot once, then one journal delta per turn.
    kvsdk_save_options save;
    kvsdk_save_options_init(&save);
    const kvsdk_status st = saved_once ? kvsdk_cache_save_delta(session->cache(), o.session_file.c_str(), &save)
                                       : kvsdk_cache_save(session->cache(), o.session_file.c_str(), &save);
    llama::check(st, saved_once ? "kvsdk_cache_save_delta" : "kvsdk_cache_save");
    saved_once = true;
    ++turn;
    std::fprintf(stderr, "[turn %d saved to %s: %d tokens, %llu cache bytes]\n", turn,
                 o.session_file.c_str(), session->position(),
                 (unsigned long long)stats_of(session->cache(), nullptr));
    if (interactive) std::printf("%s: ", o.user.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        usage(stdout);
        return 0;
      }
      if (i + 1 >= argc) {
        usage(stderr);
        throw llama::Error("missing value after " + a);
      }
      const std::string v = argv[++i];
      if (a == "--model") o.model = v;
      else if (a == "--policy") o.policy = v;
      else if (a == "--budget") o.budget = v;
      else if (a == "--session") o.session_file = v;
      else if (a == "--resume") o.session_file = v, o.resume = true;
      else if (a == "--user") o.user = v;
      else if (a == "--bot") o.bot = v;
      else if (a == "--reply-tokens") o.reply_tokens = std::atoi(v.c_str());
      else if (a == "--temperature") o.temperature = float(std::atof(v.c_str()));
      else if (a == "--seed") o.seed = std::strtoull(v.c_str(), nullptr, 10);
      else {
        usage(stderr);
        throw llama::Error("unknown option " + a);
      }
    }
    if (o.reply_tokens <= 0) throw llama::Error("--reply-tokens must be positive");
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsdk-chat: %s\n", e.what());
    return 1;
  }
}
