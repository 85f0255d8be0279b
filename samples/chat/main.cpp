// kvsdk-chat: a turn-by-turn conversation with a real model whose KV cache is a kvsdk cache.
// Each line read from stdin is one user turn, framed like the play the models learned from
// ("ROMEO:\n<line>\n\nJULIET:\n"); the model answers until it ends its speech (a blank line)
// or reaches --reply-tokens. After every turn the cache is saved to the session
// file: the first turn writes a full snapshot, later turns append a journal delta (only what
// changed; once the journal outgrows --journal-percent of the snapshot, the library folds it into
// a fresh full save), so a crash loses at most the current turn. `--resume FILE` picks the conversation up
// again, in this or any later process, and goes on numbering its turns. Works interactively or
// with piped input.
//
// Commands (a line starting with '/'), each journaled like a turn (a delta is saved and the turn
// record rewritten) so that a resume sees it:
//   /undo        drops the last turn (kvsdk_cache_truncate back to where it began);
//   /regenerate  drops the last reply and samples a new one (its attempt number changes the
//                sampling seed);
//   /fork FILE   saves a copy of the conversation (kvsdk_cache_fork) as a session file of its own
//                with its own turn record, to be continued later with --resume FILE.
// A policy that cannot truncate exactly that far back (see kvsdk_cache_truncate) refuses /undo
// and /regenerate with the library's reason and leaves the conversation as it was. Each reply is
// sampled from a seed made of --seed, the position where the reply starts and its attempt
// number, so a resumed conversation samples exactly what an uninterrupted one would.
//
// Turn numbers: the snapshot holds the conversation's K/V rows, not its text, and its journal
// frames are not turns (a delta may span several frames), so the turn count cannot be read back
// from it. Next to the session file, FILE.turns lists each saved turn on a line: the
// conversation's length in tokens after it, then where its reply began, the prompt's last token
// and the reply's attempt number (what /regenerate needs; records of older versions hold only
// the length, and their turns cannot be regenerated); it is rewritten atomically (temporary file, fsync, rename)
// right after every autosave. A resume counts the listed turns that the loaded conversation
// contains, plus one when the snapshot holds a turn the list missed (a crash between the two
// writes); a torn last delta that the load dropped is not counted. Without the record (a session
// file copied alone) numbering restarts at 1, and the resume says so.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
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
  uint32_t journal_percent = 50;  // kvsdk_save_options.max_journal_percent (0: never fold)
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
               "  --journal-percent P   fold the journal into a full save past P%% of the snapshot\n"
               "                        (kvsdk_save_options.max_journal_percent; default 50, 0 never)\n"
               "  --temperature T       0 = greedy (default 0.8)\n"
               "  --seed N              sampling seed (default 1)\n"
               "commands (a line of their own): /undo (drop the last turn), /regenerate (a new\n"
               "  last reply), /fork FILE (save a copy of the conversation to continue with\n"
               "  --resume FILE)\n");
}

// The turn record next to a session file (see the top of this file).
std::string turns_path(const std::string& session_file) { return session_file + ".turns"; }

struct Turn {
  int end = 0;           // conversation length (tokens) after the turn
  int reply_start = -1;  // position of the reply's first token (-1: unknown, an older record)
  int prompt_last = -1;  // the prompt's last token, fed again to regenerate
  int attempt = 0;       // how many times the reply was regenerated
};

// The record's turns; empty when there is no readable record.
std::vector<Turn> read_turns(const std::string& session_file) {
  std::vector<Turn> turns;
  std::ifstream in(turns_path(session_file));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Turn t;
    if (!(fields >> t.end)) break;
    if (!(fields >> t.reply_start >> t.prompt_last >> t.attempt)) t = Turn{t.end};
    turns.push_back(t);
  }
  return turns;
}

// Rewrites the record atomically: a crash leaves the previous record or the new one.
void write_turns(const std::string& session_file, const std::vector<Turn>& turns) {
  const std::string path = turns_path(session_file), tmp = path + ".tmp";
  std::string text;
  for (const Turn& t : turns) {
    text += std::to_string(t.end) + " " + std::to_string(t.reply_start) + " " +
            std::to_string(t.prompt_last) + " " + std::to_string(t.attempt) + "\n";
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  if (ok) ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    std::remove(tmp.c_str());
    throw llama::Error("cannot write the turn record " + path);
  }
}

// Turns a loaded conversation of `position` tokens holds, from the record `turns`.
int turns_held(const std::vector<Turn>& turns, int position) {
  int held = 0, last_end = 0;
  for (const Turn& t : turns) {
    if (t.end > position) break;  // a turn the snapshot does not hold (e.g. a dropped torn delta)
    ++held;
    last_end = t.end;
  }
  // The autosave of the last turn completed but its record did not (a crash in between).
  if (position > last_end) ++held;
  return held;
}

// The sampling seed of a reply: the same reply start and attempt sample the same way in any
// process.
uint64_t reply_seed(uint64_t seed, int reply_start, int attempt) {
  return seed + uint64_t(reply_start) * 0x9E3779B97F4A7C15ull + uint64_t(attempt) * 0xBF58476D1CE4E5B9ull;
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
  std::vector<Turn> turns;  // the saved turns (FILE.turns)
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
    const std::vector<Turn> record = read_turns(o.session_file);
    if (record.empty()) {
      std::fprintf(stderr, "[no turn record %s: turn numbers restart at 1]\n",
                   turns_path(o.session_file).c_str());
    } else {
      // Keep the record's turns held; a turn it missed ends at `position`.
      const size_t held = size_t(turns_held(record, position));
      turns.assign(record.begin(), record.begin() + long(std::min(record.size(), held)));
      if (turns.size() < held) turns.push_back(Turn{position});
    }
    std::fprintf(stderr, "[resumed %s: %d tokens, %d turns, %u journal turns applied%s]\n",
                 o.session_file.c_str(), position, int(turns.size()),
                 unsigned(info.journal_frames_applied),
                 info.journal_frames_dropped ? ", a torn last turn was dropped" : "");
  } else {
    kvsdk_policy policy;
    llama::check(kvsdk_policy_parse(&policy, o.policy.c_str()), "kvsdk_policy_parse");
    session.reset(new llama::Session(model, ctx, &policy));
  }

  const int newline = tok.encode("\n", false).empty() ? -1 : tok.encode("\n", false).back();
  std::vector<float> logits(V);
  // Samples, prints and feeds a reply after `prev` (the prompt's last token), whose logits are in
  // `logits`; stops after a blank line (the end of a speech) or the token limit.
  const auto reply = [&](int prev, int attempt) {
    llama::Sampler sampler(o.temperature, reply_seed(o.seed, session->position(), attempt));
    std::printf("%s:\n", o.bot.c_str());
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
  };
  // Autosave (a full snapshot once, then one journal delta per change) and the turn record.
  const auto autosave = [&](const char* what) {
    kvsdk_save_options save;
    kvsdk_save_options_init(&save);
    save.max_journal_percent = o.journal_percent;
    const kvsdk_status st = saved_once ? kvsdk_cache_save_delta(session->cache(), o.session_file.c_str(), &save)
                                       : kvsdk_cache_save(session->cache(), o.session_file.c_str(), &save);
    llama::check(st, saved_once ? "kvsdk_cache_save_delta" : "kvsdk_cache_save");
    saved_once = true;
    write_turns(o.session_file, turns);
    std::fprintf(stderr, "[%s %d saved to %s: %d tokens, %llu cache bytes]\n", what,
                 int(turns.size()), o.session_file.c_str(), session->position(),
                 (unsigned long long)stats_of(session->cache(), nullptr));
  };
  // Rewinds to `position`; false (the library's reason printed, nothing changed) when the
  // policy cannot do it exactly.
  const auto rewind = [&](int position, const char* command) {
    try {
      session->truncate(position);
      return true;
    } catch (const llama::KvsdkError& e) {
      if (e.status() != KVSDK_E_STATE) throw;
      std::fprintf(stderr, "[%s refused, the conversation is unchanged: %s]\n", command, e.what());
      return false;
    }
  };

  std::string line;
  const bool interactive = isatty(0);
  if (interactive) std::printf("%s: ", o.user.c_str());
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    if (line == "/undo") {
      if (turns.empty()) {
        std::fprintf(stderr, "[/undo: no turn to undo]\n");
      } else if (rewind(turns.size() > 1 ? turns[turns.size() - 2].end : 0, "/undo")) {
        turns.pop_back();
        autosave("undo: back to turn");
      }
    } else if (line == "/regenerate") {
      if (turns.empty() || turns.back().reply_start < 1 || turns.back().prompt_last < 0) {
        std::fprintf(stderr, "[/regenerate: no reply this session can regenerate]\n");
      } else if (rewind(turns.back().reply_start - 1, "/regenerate")) {
        // The prompt's last token again gives the logits the reply starts from.
        Turn& t = turns.back();
        std::copy_n(session->step(t.prompt_last), V, logits.data());
        ++t.attempt;
        reply(t.prompt_last, t.attempt);
        t.end = session->position();
        autosave("regenerated turn");
      }
    } else if (line.rfind("/fork ", 0) == 0 && line.size() > 6) {
      const std::string file = line.substr(6);
      kvsdk_cache* copy = nullptr;
      llama::check(kvsdk_cache_fork(&copy, session->cache()), "kvsdk_cache_fork");
      kvsdk_save_options save;
      kvsdk_save_options_init(&save);
      save.max_journal_percent = o.journal_percent;
      const kvsdk_status st = kvsdk_cache_save(copy, file.c_str(), &save);
      kvsdk_cache_destroy(copy);
      llama::check(st, "kvsdk_cache_save");
      write_turns(file, turns);
      std::fprintf(stderr, "[forked turn %d to %s: continue it with --resume %s]\n",
                   int(turns.size()), file.c_str(), file.c_str());
    } else if (line[0] == '/') {
      std::fprintf(stderr, "[unknown command %s: /undo, /regenerate, /fork FILE]\n", line.c_str());
    } else {
      const std::string framed = o.user + ":\n" + line + "\n\n" + o.bot + ":\n";
      std::vector<int> ids = tok.encode(framed, session->position() == 0 && tok.size() > 258);
      if (session->position() == 0 && tok.size() > 258) ids.insert(ids.begin(), llama::Tokenizer::kBos);
      if (session->position() + int(ids.size()) + o.reply_tokens > cfg.seq_len) {
        std::fprintf(stderr, "[the conversation reached the model's context of %d tokens]\n", cfg.seq_len);
        break;
      }
      llama::prefill(*session, ids, 16, logits.data());
      Turn t;
      t.reply_start = session->position();
      t.prompt_last = ids.back();
      reply(ids.back(), 0);
      t.end = session->position();
      turns.push_back(t);
      autosave("turn");
    }
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
      else if (a == "--journal-percent") o.journal_percent = uint32_t(std::strtoul(v.c_str(), nullptr, 10));
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
