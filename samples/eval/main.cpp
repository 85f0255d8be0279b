// kvsdk-eval: fidelity of every available policy against the full cache on real models.
//
// For each model (stories260K when KVSDK_SHARED_DIR has it, shakespeare-small, shakespeare-base)
// and each policy the library accepts, at budgets of {100, 50, 25, 10, 5}% of the full cache's
// bytes: perplexity on held-out text, top-1 agreement and KL against the full cache over a greedy
// continuation, and the peak cache bytes. Policies that kvsdk_cache_create rejects with
// KVSDK_E_UNSUPPORTED are skipped with a note, so methods added later appear automatically.
//
// With --target top1=X[,kl=Y], instead of the grid: per model, the smallest resume snapshot
// that meets the target, searched coarse-to-fine over the policies, their KIVI widths, the
// exact-row policies saved as KIVI ("h2o>kivi2": live h2o, file written as h2o+kivi2) and a
// continuous budget (target_search.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "generate.h"
#include "fidelity.h"
#include "model.h"
#include "proxy_runner.h"
#include "report.h"
#include "sampler.h"
#include "session.h"
#include "target_search.h"
#include "tokenizer.h"

namespace {

// The held-out 10% of tinyshakespeare starts here (see ../shared/data/README.md).
constexpr size_t kHeldOutOffset = 1003854;
// Compositions (eviction presets with a KIVI overlay; docs/papers.md) evaluated beyond single
// methods.
const char* const kCompositions[] = {"xkv+kivi2", "snapkv+kivi4", "h2o+kivi4"};

struct Options {
  std::vector<std::string> models = {"stories260K", "shakespeare-small", "shakespeare-base"};
  std::vector<std::string> policies;  // empty: every method name plus kCompositions
  std::vector<int> budgets = {100, 50, 25, 10, 5};
  std::string shared_dir = KVSDK_SHARED_DIR;
  std::string bundled_dir = std::string(KVSDK_SOURCE_DIR) + "/samples/models";
  std::string text_file;  // default: the held-out tail of tinyshakespeare
  size_t context = 0;     // 0: min(model context, 1024)
  size_t chunk = 16;
  double prompt_share = 0.75;
  uint64_t seed = 42;
  std::string json, markdown, plot;
  bool mini_prefill = false;  // also run xkv with the XKV mini-prefill planner
  std::string proxy_model;    // smallkv's proxy; empty: llama::default_proxy_model
  std::vector<double> slacks;  // evict_slack values for the eviction presets; empty: the default
  std::vector<int32_t> weight_bits;  // kivi_weight_bits values for KIVI policies; empty: default
  // --save-as: the grid's resume snapshots written as KIVI of this width (0: as the live cache
  // is), with this exact window (KVSDK_QUANT_RESIDUAL_AUTO by default) and group.
  int save_bits = 0;
  int32_t save_residual = KVSDK_QUANT_RESIDUAL_AUTO;
  int32_t save_group = 32;
  bool has_target = false;     // --target: search instead of the grid
  eval::Target target;
  eval::SearchOptions search;
};

// Whether --slacks sweeps a policy: the presets that evict rows by selection (SmallKV evicts too
// but has no slack rows: its eviction is measured with its proxy at the default slack only).
bool slack_applies(const kvsdk_policy& p) {
  return eval::evicts_to_budget(p) && p.method != KVSDK_METHOD_SMALLKV;
}

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: kvsdk-eval [options]\n"
               "  --models a,b        models (default stories260K,shakespeare-small,shakespeare-base)\n"
               "  --policies a,b      policy specs (default: every method name + %s, %s, %s)\n"
               "  --budgets 100,50    budgets in %% of the full cache bytes (default 100,50,25,10,5)\n"
               "  --context N         tokens per sequence (default min(model context, 1024))\n"
               "  --prompt-share F    share of the sequence used as prompt (default 0.75)\n"
               "  --chunk N           prefill chunk in tokens (default 16)\n"
               "  --text FILE         held-out text for the shakespeare models (default: the held-out\n"
               "                      tail of SHARED/data/tinyshakespeare.txt from char %zu)\n"
               "  --shared-dir DIR    folder with models/ and data/ (default %s)\n"
               "  --seed N            seed of stories260K's self-generated text (default 42)\n"
               "  --mini-prefill      also measure xkv planned by a cache-free mini-prefill pass\n"
               "  --slacks 0,0.0625   run each eviction preset once per evict_slack value (labels\n"
               "                      'snapkv@slack0.0625'; default: once, with the policy default)\n"
               "  --weight-bits 7,14  run each policy with KIVI codes once per kivi_weight_bits value\n"
               "                      (labels 'kivi@w7'; default: once, with the policy default)\n"
               "  --save-as N         write each resume snapshot converted to KIVI N = 1, 2, 4 or 8\n"
               "                      bits (kvsdk_save_options.target_policy, as `kvsdk recompress`):\n"
               "                      h2o as h2o+kiviN, full as kivi+kiviN (labels 'h2o>kiviN')\n"
               "  --save-residual R   --save-as's exact KIVI window: tokens or auto (default auto,\n"
               "                      KVSDK_QUANT_RESIDUAL_AUTO; labels '@R16')\n"
               "  --save-group G      --save-as's KIVI group size (default 32; labels '@G64')\n"
               "  --proxy-model NAME  smallkv's proxy (a smaller model with the same tokenizer; default:\n"
               "                      shakespeare-small for shakespeare-base, none for other models,\n"
               "                      whose smallkv rows are skipped)\n"
               "  --target top1=0.95[,kl=0.01]\n"
               "                      instead of the budget grid: per model, the smallest snapshot\n"
               "                      meeting the target, searched over the policies (and every KIVI\n"
               "                      width of those that quantize, and full and the evicting ones\n"
               "                      saved as KIVI 1/2/4/8, e.g. 'h2o>kivi2') and a continuous\n"
               "                      budget: a ladder of 50..3.125%% (until two rungs in a row\n"
               "                      fail), then bisection; reports only measured points (not\n"
               "                      with --budgets, --slacks, --mini-prefill or --save-*; --plot\n"
               "                      then draws the search)\n"
               "  --bisect-steps N    --target's bisection steps per policy (default 3)\n"
               "  --json FILE  --markdown FILE  --plot FILE.png\n",
               kCompositions[0], kCompositions[1], kCompositions[2], kHeldOutOffset, KVSDK_SHARED_DIR);
}

Options parse(int argc, char** argv) {
  Options o;
  bool grid_option = false;  // an option that only the budget grid uses
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (a == "--mini-prefill") {
      o.mini_prefill = true;
      grid_option = true;
      continue;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      throw llama::Error("missing value after " + a);
    }
    const std::string v = argv[++i];
    if (a == "--models") o.models = llama::split_list(v);
    else if (a == "--policies") o.policies = llama::split_list(v);
    else if (a == "--budgets") {
      grid_option = true;
      o.budgets.clear();
      for (const std::string& b : llama::split_list(v)) {
        const int pct = std::atoi(b.c_str());
        if (pct <= 0 || pct > 100) throw llama::Error("budget '" + b + "' is not in 1..100");
        o.budgets.push_back(pct);
      }
    } else if (a == "--context") o.context = size_t(std::strtoul(v.c_str(), nullptr, 10));
    else if (a == "--prompt-share") o.prompt_share = std::atof(v.c_str());
    else if (a == "--chunk") o.chunk = size_t(std::strtoul(v.c_str(), nullptr, 10));
    else if (a == "--text") o.text_file = v;
    else if (a == "--shared-dir") o.shared_dir = v;
    else if (a == "--seed") o.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--json") o.json = v;
    else if (a == "--markdown") o.markdown = v;
    else if (a == "--plot") {
      o.plot = v;
    } else if (a == "--target") {
      o.target = eval::parse_target(v);
      o.has_target = true;
    } else if (a == "--bisect-steps") {
      o.search.bisect_steps = std::atoi(v.c_str());
      if (o.search.bisect_steps < 0 || o.search.bisect_steps > 20) {
        throw llama::Error("--bisect-steps must be in 0..20");
      }
    }
    else if (a == "--proxy-model") o.proxy_model = v;
    else if (a == "--save-as") {
      grid_option = true;
      o.save_bits = std::atoi(v.c_str());
      if (o.save_bits != 1 && o.save_bits != 2 && o.save_bits != 4 && o.save_bits != 8) {
        throw llama::Error("--save-as takes a KIVI width: 1, 2, 4 or 8");
      }
    } else if (a == "--save-residual") {
      grid_option = true;
      const long r = v == "auto" ? long(KVSDK_QUANT_RESIDUAL_AUTO) : std::strtol(v.c_str(), nullptr, 10);
      if (v != "auto" && (r < 0 || r > 1 << 20 || v.find_first_not_of("0123456789") != std::string::npos)) {
        throw llama::Error("--save-residual takes a token count or 'auto'");
      }
      o.save_residual = int32_t(r);
    } else if (a == "--save-group") {
      grid_option = true;
      o.save_group = std::atoi(v.c_str());
      if (o.save_group < 1 || o.save_group > 4096) throw llama::Error("--save-group must be in 1..4096");
    }
    else if (a == "--weight-bits") {
      grid_option = true;
      for (const std::string& s : llama::split_list(v)) {
        o.weight_bits.push_back(std::atoi(s.c_str()));
        if (o.weight_bits.back() != 7 && o.weight_bits.back() != 14) {
          throw llama::Error("--weight-bits values must be 7 or 14");
        }
      }
    }
    else if (a == "--slacks") {
      grid_option = true;
      for (const std::string& s : llama::split_list(v)) {
        o.slacks.push_back(std::atof(s.c_str()));
        if (!(o.slacks.back() >= 0.0 && o.slacks.back() <= 0.5)) {
          throw llama::Error("--slacks values must be in [0, 0.5]");
        }
      }
    }
    else {
      usage(stderr);
      throw llama::Error("unknown option " + a);
    }
  }
  if (o.chunk == 0) throw llama::Error("--chunk must be positive");
  if (o.has_target && grid_option) {
    throw llama::Error("--target searches its own budgets and save-as widths: --budgets, --slacks, "
                       "--weight-bits, --mini-prefill and --save-* belong to the budget grid");
  }
  if (!(o.prompt_share > 0.0 && o.prompt_share < 1.0)) throw llama::Error("--prompt-share must be in (0, 1)");
  if (o.policies.empty()) {
    for (int m = 0; m < KVSDK_METHOD_COUNT; ++m) o.policies.push_back(kvsdk_method_name(kvsdk_method(m)));
    for (const char* c : kCompositions) o.policies.push_back(c);
  }
  return o;
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw llama::Error("cannot read '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The evaluation text of one model, `n` tokens; empty (with a note) when its data is missing.
std::vector<int> evaluation_text(const Options& o, const std::string& name, const llama::Model& model,
                                 const llama::Tokenizer& tok, size_t n) {
  if (name == "stories260K") {
    // Text the model generated itself from BOS with a fixed seed (full cache, temperature 1).
    kvsdk_context* ctx = nullptr;
    llama::check(kvsdk_context_create(&ctx, nullptr), "kvsdk_context_create");
    std::vector<int> text{llama::Tokenizer::kBos};
    {
      llama::Session s(model, ctx, nullptr);
      llama::Sampler sampler(1.0f, o.seed);
      while (text.size() < n) {
        text.push_back(sampler.sample(s.step(text.back()), size_t(model.config().vocab_size)));
      }
    }
    kvsdk_context_destroy(ctx);
    return text;
  }
  std::string source;
  if (!o.text_file.empty()) {
    source = read_all(o.text_file);
  } else {
    const std::string corpus = o.shared_dir + "/data/tinyshakespeare.txt";
    if (!exists(corpus)) {
      std::fprintf(stderr, "note: %s skipped: held-out text %s not found (pass --text FILE)\n",
                   name.c_str(), corpus.c_str());
      return {};
    }
    source = read_all(corpus);
    if (source.size() <= kHeldOutOffset) throw llama::Error(corpus + " is shorter than expected");
    source = source.substr(kHeldOutOffset);
  }
  std::vector<int> tokens = tok.encode(source.substr(0, 4 * n + 16), /*dummy_prefix=*/false);
  if (tokens.size() < n) {
    throw llama::Error("evaluation text has " + std::to_string(tokens.size()) + " tokens, need " +
                       std::to_string(n) + " (lower --context)");
  }
  tokens.resize(n);
  return tokens;
}

// What kvsdk_cache_create says of `policy` on `model`'s geometry (an unlimited context).
kvsdk_status creates(const llama::Model& model, const kvsdk_policy& policy) {
  kvsdk_context* ctx = nullptr;
  llama::check(kvsdk_context_create(&ctx, nullptr), "kvsdk_context_create");
  const kvsdk_geometry g = llama::geometry_of(model.config());
  kvsdk_cache* cache = nullptr;
  const kvsdk_status st = kvsdk_cache_create(&cache, ctx, &g, &policy);
  kvsdk_cache_destroy(cache);
  kvsdk_context_destroy(ctx);
  return st;
}

// False (with a note) when `spec` does not parse or kvsdk does not implement it yet.
bool policy_available(const std::string& spec, const llama::Model& model, kvsdk_policy* policy) {
  if (kvsdk_policy_parse(policy, spec.c_str()) != KVSDK_OK) {
    std::fprintf(stderr, "note: policy '%s' skipped: %s\n", spec.c_str(), kvsdk_last_error());
    return false;
  }
  const kvsdk_status st = creates(model, *policy);
  // Only "not implemented" skips a policy: any other refusal is measured (and recorded as a
  // failure) so that it shows in the results instead of disappearing.
  if (st != KVSDK_E_UNSUPPORTED) return true;
  std::fprintf(stderr, "note: policy '%s' skipped: %s (%s)\n", spec.c_str(), kvsdk_status_str(st),
               kvsdk_last_error());
  return false;
}

// SmallKV's proxy model for `name` (--proxy-model, else llama::default_proxy_model), or null with
// a note (and `*why`) when there is none or it does not share the model's vocabulary.
std::unique_ptr<llama::Model> load_proxy(const Options& o, const std::string& name,
                                         const llama::Model& model, std::string* why) {
  const std::string proxy = o.proxy_model.empty() ? llama::default_proxy_model(name) : o.proxy_model;
  const bool shared = proxy == "stories260K";
  const std::string path = (shared ? o.shared_dir + "/models" : o.bundled_dir) + "/" + proxy + ".bin";
  std::unique_ptr<llama::Model> m;
  if (proxy.empty()) {
    *why = "no smaller proxy model of the same family (pass --proxy-model NAME)";
  } else if (!exists(path)) {
    *why = "proxy " + path + " not found";
  } else {
    m = std::make_unique<llama::Model>(llama::Model::load(path));
    if (m->config().vocab_size != model.config().vocab_size) {
      *why = "proxy " + proxy + " has another vocabulary";
      m.reset();
    }
  }
  if (!m) {
    std::fprintf(stderr, "note: smallkv on %s skipped: %s\n", name.c_str(), why->c_str());
    return nullptr;
  }
  std::fprintf(stderr, "[%s] smallkv proxy: %s\n", name.c_str(), proxy.c_str());
  return m;
}

// kvsdk-eval --target on one model: the smallest resume snapshot meeting o.target.
eval::TargetRecord search_target(const Options& o, const std::string& name, const llama::Model& model,
                                 const eval::Reference& ref) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<llama::Model> proxy;
  std::string no_proxy;
  bool proxy_tried = false;
  // The listed specs go through policy_available (a note when skipped); the KIVI widths the
  // search adds are kept only where the library creates them (specache takes 1 or 2 bits).
  auto accept = [&](const std::string& spec, const kvsdk_policy& policy) {
    bool listed = false;
    for (const std::string& p : o.policies) listed = listed || p == spec;
    kvsdk_policy parsed;
    if (listed ? !policy_available(spec, model, &parsed) : creates(model, policy) != KVSDK_OK) {
      return false;
    }
    if (policy.method != KVSDK_METHOD_SMALLKV) return true;
    if (!proxy_tried) proxy = load_proxy(o, name, model, &no_proxy);
    proxy_tried = true;
    return proxy != nullptr;
  };
  for (const std::string& spec : o.policies) {
    kvsdk_policy parsed;
    if (kvsdk_policy_parse(&parsed, spec.c_str()) != KVSDK_OK) {
      std::fprintf(stderr, "note: policy '%s' skipped: %s\n", spec.c_str(), kvsdk_last_error());
    }
  }
  const std::vector<eval::Family> families = eval::expand_families(o.policies, accept);
  // Each measurement's status and error, in the order of the trials.
  std::vector<std::string> statuses, errors;
  auto measure = [&](size_t f, double pct) {
    kvsdk_policy policy;
    llama::check(kvsdk_policy_parse(&policy, families[f].spec.c_str()), "kvsdk_policy_parse");
    const uint64_t budget =
        std::max<uint64_t>(1, uint64_t(double(ref.full_cache_bytes) * pct / 100.0));
    // A save-as family runs live as its spec and is scored on its snapshot converted to the
    // target, as `kvsdk recompress` writes it (eval::evaluate's save_as).
    kvsdk_policy target;
    const bool save_as = !families[f].save_as.empty();
    if (save_as) target = eval::save_as_policy(families[f]);
    const eval::Outcome out =
        eval::evaluate(model, ref, policy, budget, false,
                       policy.method == KVSDK_METHOD_SMALLKV ? proxy.get() : nullptr,
                       /*with_ppl=*/false, save_as ? &target : nullptr);
    statuses.push_back(out.ok ? "ok" : kvsdk_status_str(out.status));
    errors.push_back(out.error);
    const std::string label = eval::label(families[f]);
    eval::Point p;
    p.ok = out.ok;
    p.snapshot_bytes = out.snapshot_bytes;
    p.top1 = out.top1_agreement;
    p.kl = out.kl;
    if (out.ok) {
      std::fprintf(stderr, "[%s] target %-16s %8.4f%%: snapshot %8llu (%.3f x full)  top-1 %.4f  KL %.5f\n",
                   name.c_str(), label.c_str(), pct, (unsigned long long)out.snapshot_bytes,
                   double(out.snapshot_bytes) / double(ref.full_snapshot_bytes), out.top1_agreement,
                   out.kl);
    } else {
      std::fprintf(stderr, "[%s] target %-16s %8.4f%%: failed: %s\n", name.c_str(), label.c_str(),
                   pct, out.error.c_str());
    }
    return p;
  };
  const eval::SearchResult res = eval::search(families, o.target, o.search, measure);
  eval::TargetRecord t;
  t.model = name;
  t.target = eval::describe(o.target);
  t.min_top1 = o.target.min_top1;
  t.max_kl = o.target.max_kl;
  t.found = res.found;
  t.full_snapshot_bytes = ref.full_snapshot_bytes;
  if (res.found) {
    t.policy = families[res.family].spec;
    t.save_as = families[res.family].save_as;
    t.label = eval::label(families[res.family]);
    t.budget_pct = res.best.budget_pct;
    t.budget_bytes =
        std::max<uint64_t>(1, uint64_t(double(ref.full_cache_bytes) * res.best.budget_pct / 100.0));
    t.snapshot_bytes = res.best.snapshot_bytes;
    t.top1_agreement = res.best.top1;
    t.kl = res.best.kl;
  }
  t.context_tokens = ref.text.size();
  t.prompt_tokens = ref.schedule.prompt_tokens;
  t.families = families.size();
  t.evaluations = res.trials.size();
  t.pruned = res.pruned;
  t.violations = res.violations;
  t.save_as_residual = eval::kSaveAsResidual;
  t.ladder = o.search.ladder;
  t.bisect_steps = o.search.bisect_steps;
  for (size_t k = 0; k < res.trials.size(); ++k) {
    const eval::Trial& x = res.trials[k];
    eval::TargetTrial tt;
    tt.policy = families[x.family].spec;
    tt.save_as = families[x.family].save_as;
    tt.label = eval::label(families[x.family]);
    tt.error = errors[k];
    tt.budget_pct = x.point.budget_pct;
    tt.ok = x.point.ok;
    tt.status = statuses[k];
    tt.snapshot_bytes = x.point.snapshot_bytes;
    tt.top1_agreement = x.point.top1;
    tt.kl = x.point.kl;
    tt.passed = x.passed;
    t.trials.push_back(tt);
  }
  for (size_t f : res.skipped) t.skipped.push_back(eval::label(families[f]));
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

void evaluate_model(const Options& o, const std::string& name, std::vector<eval::Record>& records,
                    std::vector<eval::TargetRecord>& targets) {
  const bool shared = name == "stories260K";
  const std::string dir = shared ? o.shared_dir + "/models" : o.bundled_dir;
  const std::string model_path = dir + "/" + name + ".bin";
  const std::string tok_path = shared ? dir + "/tok512.bin" : dir + "/" + name + ".tok.bin";
  if (!exists(model_path)) {
    std::fprintf(stderr, "note: model %s skipped: %s not found\n", name.c_str(), model_path.c_str());
    return;
  }
  const llama::Model model = llama::Model::load(model_path);
  const llama::Tokenizer tok = llama::Tokenizer::load(tok_path, model.config().vocab_size);
  const size_t n = o.context ? o.context : std::min<size_t>(size_t(model.config().seq_len), 1024);
  if (n > size_t(model.config().seq_len)) {
    throw llama::Error("--context " + std::to_string(n) + " exceeds " + name + "'s context " +
                       std::to_string(model.config().seq_len));
  }
  const std::vector<int> text = evaluation_text(o, name, model, tok, n);
  if (text.empty()) return;
  eval::Schedule schedule;
  schedule.prompt_tokens = std::max<size_t>(1, size_t(o.prompt_share * double(n)));
  schedule.chunk = o.chunk;
  std::fprintf(stderr, "[%s] reference run (full cache, %zu tokens, prompt %zu)...\n", name.c_str(), n,
               schedule.prompt_tokens);
  const eval::Reference ref = eval::build_reference(model, text, schedule);
  std::fprintf(stderr, "[%s] full cache %llu bytes, ppl %.4f\n", name.c_str(),
               (unsigned long long)ref.full_cache_bytes, ref.ppl_full);
  if (o.has_target) {
    targets.push_back(search_target(o, name, model, ref));
    return;
  }
  for (const std::string& spec : o.policies) {
    kvsdk_policy policy;
    if (!policy_available(spec, model, &policy)) continue;
    std::unique_ptr<llama::Model> proxy;
    std::string no_proxy;
    if (policy.method == KVSDK_METHOD_SMALLKV) proxy = load_proxy(o, name, model, &no_proxy);
    const bool xkv = policy.method == KVSDK_METHOD_XKV && policy.quant_bits == 0;
    const kvsdk_policy preset = policy;
    const size_t n_slacks = slack_applies(preset) && !o.slacks.empty() ? o.slacks.size() : 1;
    const bool sweep_weights = preset.quant_bits != 0 && !o.weight_bits.empty();
    const size_t n_weights = sweep_weights ? o.weight_bits.size() : 1;
    for (size_t wi = 0; wi < n_weights; ++wi)
    for (size_t si = 0; si < n_slacks; ++si)
    for (int variant = 0; variant < (o.mini_prefill && xkv ? 2 : 1); ++variant)
    for (int pct : o.budgets) {
      const bool planned = variant == 1;
      std::string label = planned ? spec + "+mini-prefill" : spec;
      policy = preset;
      if (n_slacks > 1 || (slack_applies(preset) && !o.slacks.empty())) {
        policy.evict_slack = float(o.slacks[si]);  // the slack's effect: one row per value
        char tag[32];
        std::snprintf(tag, sizeof tag, "@slack%g", o.slacks[si]);
        label += tag;
      }
      if (sweep_weights) {  // the width's effect: one row per value
        policy.kivi_weight_bits = o.weight_bits[wi];
        label += "@w" + std::to_string(o.weight_bits[wi]);
      }
      // --save-as: the file is written as KIVI (the live method's '+kiviN' overlay; full's rows
      // as plain KIVI). A pair the library refuses fails that cell with its reason.
      kvsdk_policy save_as{};
      if (o.save_bits) {
        const std::string target =
            std::string(policy.method == KVSDK_METHOD_FULL ? "kivi"
                                                           : kvsdk_method_name(kvsdk_method(policy.method))) +
            "+kivi" + std::to_string(o.save_bits);
        llama::check(kvsdk_policy_parse(&save_as, target.c_str()), "kvsdk_policy_parse (--save-as)");
        save_as.quant_residual = o.save_residual;
        save_as.quant_group = o.save_group;
        label += ">kivi" + std::to_string(o.save_bits);
        if (o.save_residual != KVSDK_QUANT_RESIDUAL_AUTO) label += "@R" + std::to_string(o.save_residual);
        if (o.save_group != 32) label += "@G" + std::to_string(o.save_group);
      }
      eval::Record r;
      r.model = name;
      r.policy = label;
      r.budget_pct = pct;
      r.budget_bytes = std::max<uint64_t>(1, ref.full_cache_bytes * uint64_t(pct) / 100);
      r.full_cache_bytes = ref.full_cache_bytes;
      r.full_snapshot_bytes = ref.full_snapshot_bytes;
      r.ppl_full = ref.ppl_full;
      r.context_tokens = n;
      r.prompt_tokens = schedule.prompt_tokens;
      if (!no_proxy.empty()) {  // every cell is recorded, those that cannot run with the reason
        r.status = "skipped";
        r.error = no_proxy;
        records.push_back(r);
        continue;
      }
      const eval::Outcome out = eval::evaluate(model, ref, policy, r.budget_bytes, planned, proxy.get(),
                                               true, o.save_bits ? &save_as : nullptr);
      r.ok = out.ok;
      r.status = out.ok ? "ok" : kvsdk_status_str(out.status);
      r.error = out.error;
      r.cache_bytes = out.cache_bytes;
      r.snapshot_bytes = out.snapshot_bytes;
      r.ppl = out.ppl;
      r.top1_agreement = out.top1_agreement;
      r.kl = out.kl;
      r.fetch_hit_rate = out.fetch_hit_rate;
      if (out.ok) {
        std::fprintf(stderr,
                     "[%s] %-14s %3d%%: %8llu bytes (prefill peak %llu)  ppl %.4f  top-1 %.4f  KL %.5f\n",
                     name.c_str(), label.c_str(), pct, (unsigned long long)out.cache_bytes,
                     (unsigned long long)out.prefill_bytes, out.ppl, out.top1_agreement, out.kl);
        if (proxy) {
          std::fprintf(stderr, "[%s] %-14s %3d%%: proxy's full cache %llu bytes (own context)\n",
                       name.c_str(), label.c_str(), pct, (unsigned long long)out.proxy_bytes);
        }
        if (out.fetch_hit_rate >= 0) {
          std::fprintf(stderr, "[%s] %-14s %3d%%: fetch hit rate %.4f\n", name.c_str(), label.c_str(),
                       pct, out.fetch_hit_rate);
        }
      } else {
        std::fprintf(stderr, "[%s] %-14s %3d%%: failed: %s\n", name.c_str(), label.c_str(), pct,
                     out.error.c_str());
      }
      records.push_back(r);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    std::vector<eval::Record> records;
    std::vector<eval::TargetRecord> targets;
    for (const std::string& name : o.models) evaluate_model(o, name, records, targets);
    if (records.empty() && targets.empty()) {
      throw llama::Error("nothing was evaluated (see the notes above)");
    }
    if (!o.json.empty()) eval::write_json(o.json, records, targets);
    if (!o.markdown.empty()) eval::write_markdown(o.markdown, records, targets);
    if (!o.plot.empty()) {
      if (o.has_target) {
        eval::write_target_plot(o.plot, targets);
      } else {
        eval::write_plot(o.plot, records);
      }
    }
    if (o.has_target) {
      std::printf("target: %s\n", eval::describe(o.target).c_str());
      // The recipe's live policy, then its numbers; saved_as (last, "-" when the file is the
      // cache as it is) is the policy the file is written as.
      std::printf("%-18s %-16s %9s %11s %7s %7s %9s %6s %8s  %s\n", "model", "recipe", "budget",
                  "snapshot_B", "x_full", "top1", "KL", "evals", "seconds", "saved_as");
      for (const eval::TargetRecord& t : targets) {
        if (t.found) {
          std::printf("%-18s %-16s %8.4f%% %11llu %7.3f %7.4f %9.5f %6zu %8.1f  %s\n",
                      t.model.c_str(), t.policy.c_str(), t.budget_pct, (unsigned long long)t.snapshot_bytes,
                      double(t.snapshot_bytes) / double(t.full_snapshot_bytes), t.top1_agreement,
                      t.kl, t.evaluations, t.seconds, t.save_as.empty() ? "-" : t.save_as.c_str());
        } else {
          std::printf("%-18s %-16s %9s %11s %7s %7s %9s %6zu %8.1f  %s\n", t.model.c_str(), "none",
                      "-", "-", "-", "-", "-", t.evaluations, t.seconds, "-");
        }
      }
      return 0;
    }
    std::printf("%-18s %-14s %6s %10s %9s %9s %7s %9s\n", "model", "policy", "budget", "cache_B",
                "ppl", "ppl_full", "top1", "KL");
    for (const eval::Record& r : records) {
      if (r.ok) {
        std::printf("%-18s %-14s %5d%% %10llu %9.4f %9.4f %7.4f %9.5f\n", r.model.c_str(),
                    r.policy.c_str(), r.budget_pct, (unsigned long long)r.cache_bytes, r.ppl,
                    r.ppl_full, r.top1_agreement, r.kl);
      } else {
        std::printf("%-18s %-14s %5d%% %10s  %s: %s\n", r.model.c_str(), r.policy.c_str(),
                    r.budget_pct, "-", r.status == "skipped" ? "skipped" : "failed",
                    r.status == "skipped" ? r.error.c_str() : r.status.c_str());
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsdk-eval: %s\n", e.what());
    return 1;
  }
}
