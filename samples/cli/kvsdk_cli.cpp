// kvsdk — command-line tool for snapshot files, built on the public C API only.
//
//   kvsdk inspect FILE [--json]      format, geometry, policy, per-layer tokens and bytes by tier,
//                                    logical FP16 size vs file size
//   kvsdk verify FILE [--json]       full validation; exit 0 only if the file is sound
//   kvsdk recompress IN OUT --policy SPEC --budget BYTES [--residual R|auto] [--zstd-level N]
//                    [--json]
//                                    load, save atomically converted to a policy and budget
//                                    (a targeted save: kvsdk_save_options.target_policy;
//                                    BYTES 0 keeps the snapshot's own budget; --residual sets
//                                    the KIVI window, auto = KVSDK_QUANT_RESIDUAL_AUTO)
//
// Exit codes: 0 success (verify: sound); 1 the file is not sound or the operation failed
// (message on stderr, or in the JSON "error" field); 2 usage error. Never a signal: every
// failure is a kvsdk status.
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "report.h"

using kvsdk_cli::Report;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

const char* const kTierNames[] = {"exact", "quantized", "codebook", "merged", "value_only",
                                  "metadata"};
constexpr int kTierCount = 6;

int usage() {
  std::fprintf(stderr,
               "usage: kvsdk inspect FILE [--json]\n"
               "       kvsdk verify FILE [--json]\n"
               "       kvsdk recompress IN OUT --policy SPEC --budget BYTES [--residual R|auto] "
               "[--zstd-level N] [--json]\n"
               "  SPEC: a preset such as full, snapkv, xkv+kivi2\n"
               "  R: the KIVI exact residual window in tokens (default: the preset's, 128); auto\n"
               "     chooses it from the rows converted (KVSDK_QUANT_RESIDUAL_AUTO)\n"
               "  BYTES: an integer, optionally with a K, M or G suffix (powers of 1024); the\n"
               "         output's per-cache budget (0: the input's own)\n");
  return kExitUsage;
}

const char* dtype_name(int32_t d) {
  return d == KVSDK_DTYPE_F32 ? "f32" : d == KVSDK_DTYPE_F16 ? "f16" : d == KVSDK_DTYPE_BF16 ? "bf16" : "?";
}
const char* rope_name(int32_t r) {
  return r == KVSDK_ROPE_NONE ? "none" : r == KVSDK_ROPE_INTERLEAVED ? "interleaved" : r == KVSDK_ROPE_HALF ? "half" : "?";
}

uint64_t file_size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? uint64_t(st.st_size) : 0;
}

bool parse_bytes(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || text[0] == '-') return false;
  uint64_t mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1ull << 10;
  if (*end == 'M' || *end == 'm') mul = 1ull << 20;
  if (*end == 'G' || *end == 'g') mul = 1ull << 30;
  if (mul != 1) ++end;
  if (*end != '\0' || (v != 0 && mul > UINT64_MAX / v)) return false;
  *out = v * mul;
  return true;
}

// --residual: a token count (0..INT32_MAX) or "auto" (KVSDK_QUANT_RESIDUAL_AUTO).
bool parse_residual(const char* text, int32_t* out) {
  if (std::strcmp(text, "auto") == 0) {
    *out = KVSDK_QUANT_RESIDUAL_AUTO;
    return true;
  }
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0 || v > INT32_MAX) return false;
  *out = int32_t(v);
  return true;
}

const char* status_name(kvsdk_status st) {
  static const char* const names[] = {"KVSDK_OK", "KVSDK_E_INVALID_ARG", "KVSDK_E_OUT_OF_RANGE",
                                      "KVSDK_E_BUDGET", "KVSDK_E_NO_MEMORY", "KVSDK_E_UNSUPPORTED",
                                      "KVSDK_E_IO", "KVSDK_E_CORRUPT", "KVSDK_E_VERSION",
                                      "KVSDK_E_GEOMETRY", "KVSDK_E_STATE", "KVSDK_E_BACKEND",
                                      "KVSDK_E_INTERNAL"};
  return st >= 0 && st < int(sizeof names / sizeof names[0]) ? names[st] : "unknown";
}

// Reports a failed kvsdk call; returns the exit code.
int report_failure(Report& r, bool json, const char* what, kvsdk_status st,
                   const char* detail = nullptr) {
  const std::string msg = std::string(what) + ": " + kvsdk_status_str(st) + " (" +
                          (detail ? detail : kvsdk_last_error()) + ")";
  if (json) {
    r.field("ok", false);
    r.field("status", status_name(st));
    r.field("status_text", kvsdk_status_str(st));
    r.field("error", msg);
    r.end();
    r.finish();
  } else {
    std::fprintf(stderr, "kvsdk: %s\n", msg.c_str());
  }
  return kExitFailed;
}

struct Loaded {
  kvsdk_context* ctx = nullptr;
  kvsdk_cache* cache = nullptr;
  kvsdk_load_info info{};
  ~Loaded() {
    kvsdk_cache_destroy(cache);
    kvsdk_context_destroy(ctx);
  }
};

// Loads `path` into a context with `budget` (0 = unlimited).
kvsdk_status load(const char* path, uint64_t budget, Loaded* l) {
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.budget_bytes = budget;
  kvsdk_status st = kvsdk_context_create(&l->ctx, &o);
  if (st != KVSDK_OK) return st;
  l->info.struct_size = sizeof l->info;
  return kvsdk_cache_load(&l->cache, l->ctx, path, nullptr, &l->info);
}

void report_cache(Report& r, const char* path, const Loaded& l) {
  kvsdk_geometry g;
  kvsdk_geometry_init(&g);
  kvsdk_cache_geometry(l.cache, &g);
  kvsdk_policy p;
  kvsdk_policy_init(&p, KVSDK_METHOD_FULL);
  kvsdk_cache_policy(l.cache, &p);
  kvsdk_cache_stats s{};
  s.struct_size = sizeof s;
  kvsdk_cache_stats_get(l.cache, &s);
  const uint64_t fsize = file_size(path);
  // What the held tokens would take as plain f16 keys and values.
  const uint64_t logical = s.tokens * uint64_t(g.head_dim) * 4;

  r.field("file", path);
  r.field("file_bytes", fsize);
  r.field("format", std::to_string(l.info.format_major) + "." + std::to_string(l.info.format_minor));
  r.field("journal_frames_applied", l.info.journal_frames_applied);
  r.field("journal_frames_dropped", l.info.journal_frames_dropped);
  r.begin("geometry");
  r.field("n_layers", g.n_layers);
  r.field("n_q_heads", g.n_q_heads);
  r.field("n_kv_heads", g.n_kv_heads);
  r.field("head_dim", g.head_dim);
  r.field("dtype", dtype_name(g.dtype));
  r.field("rope_style", rope_name(g.rope_style));
  r.field("rope_theta", double(g.rope_theta));
  r.field("attn_scale", double(g.attn_scale));
  r.end();
  r.begin("policy");
  const char* method = kvsdk_method_name(kvsdk_method(p.method));
  r.field("method", method ? method : "?");
  r.field("quant_bits", p.quant_bits);
  r.field("quant_group", p.quant_group);
  r.field("quant_residual", p.quant_residual);
  r.field("sink_tokens", p.sink_tokens);
  r.field("recent_tokens", p.recent_tokens);
  r.field("obs_window", p.obs_window);
  r.field("pool_kernel", p.pool_kernel);
  r.field("pool_kind", p.pool_kind == KVSDK_POOL_MAX ? "max" : "avg");
  r.field("heavy_ratio", double(p.heavy_ratio));
  r.field("schedule_alpha", double(p.schedule_alpha));
  r.field("schedule_beta", double(p.schedule_beta));
  r.field("boundary_layer", p.boundary_layer);
  r.field("merge_t", double(p.merge_t));
  r.field("retain_ratio", double(p.retain_ratio));
  r.field("fetch_tokens", p.fetch_tokens);
  r.field("match_tokens", p.match_tokens);
  r.end();
  r.begin("totals");
  r.field("tokens", s.tokens);
  r.field("appended_tokens", s.appended_tokens);
  r.field("bytes", s.bytes);
  for (int t = 0; t < kTierCount; ++t) r.field((std::string("bytes_") + kTierNames[t]).c_str(), s.bytes_by_tier[t]);
  r.field("logical_fp16_bytes", logical);
  r.field("file_to_fp16_ratio", logical ? double(fsize) / double(logical) : 0.0);
  r.end();
  r.begin_list("layers");
  for (uint32_t layer = 0; layer < g.n_layers; ++layer) {
    kvsdk_layer_stats ls{};
    ls.struct_size = sizeof ls;
    kvsdk_cache_layer_stats_get(l.cache, layer, &ls);
    r.begin(nullptr);
    r.field("layer", layer);
    r.field("tokens", ls.tokens);
    r.field("tokens_min_head", ls.tokens_min_head);
    r.field("tokens_max_head", ls.tokens_max_head);
    r.field("appended_tokens", ls.appended_tokens);
    r.field("bytes", ls.bytes);
    for (int t = 0; t < kTierCount; ++t) {
      r.field((std::string("bytes_") + kTierNames[t]).c_str(), ls.bytes_by_tier[t]);
    }
    r.end();
  }
  r.end_list();
}

int cmd_inspect(const char* path, bool json) {
  Report r(json);
  r.begin(nullptr);
  Loaded l;
  const kvsdk_status st = load(path, 0, &l);
  if (st != KVSDK_OK) return report_failure(r, json, "cannot load snapshot", st);
  r.field("ok", true);
  report_cache(r, path, l);
  r.end();
  r.finish();
  return kExitOk;
}

int cmd_verify(const char* path, bool json) {
  Report r(json);
  r.begin(nullptr);
  Loaded l;
  const kvsdk_status st = load(path, 0, &l);
  if (st != KVSDK_OK) return report_failure(r, json, "snapshot is not sound", st);
  // A torn journal tail loads (the last delta is lost), but the file is not sound as written.
  const bool sound = l.info.journal_frames_dropped == 0;
  r.field("ok", sound);
  r.field("file", path);
  r.field("format", std::to_string(l.info.format_major) + "." + std::to_string(l.info.format_minor));
  r.field("journal_frames_applied", l.info.journal_frames_applied);
  r.field("journal_frames_dropped", l.info.journal_frames_dropped);
  r.field("verdict", sound ? "sound" : "torn journal tail (the last delta is ignored on load)");
  r.end();
  r.finish();
  return sound ? kExitOk : kExitFailed;
}

int cmd_recompress(const char* in, const char* out, const char* spec, uint64_t budget,
                   const int32_t* residual, int zstd_level, bool json) {
  Report r(json);
  r.begin(nullptr);
  kvsdk_policy policy;
  kvsdk_status st = kvsdk_policy_parse(&policy, spec);
  if (st != KVSDK_OK) return report_failure(r, json, "bad --policy", st);
  if (residual) policy.quant_residual = *residual;  // validated by the save, as any policy
  // The snapshot as it is (any budget), then a targeted save: the library converts it to the
  // policy and budget (include/kvsdk.h, "Targeted saves"), exactly as an app's
  // kvsdk_cache_save with these options would, so both write the same bytes.
  Loaded src;
  st = load(in, 0, &src);
  if (st != KVSDK_OK) return report_failure(r, json, "cannot load input snapshot", st);
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.zstd_level = zstd_level;
  o.target_policy = &policy;
  o.target_budget_bytes = budget;
  st = kvsdk_cache_save(src.cache, out, &o);
  if (st != KVSDK_OK) return report_failure(r, json, "cannot apply --policy and --budget", st);
  r.field("ok", true);
  r.field("input", in);
  r.field("output", out);
  r.field("policy", spec);
  r.field("budget_bytes", budget);
  r.field("input_bytes", file_size(in));
  r.field("output_bytes", file_size(out));
  r.end();
  r.finish();
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  bool json = false;
  const char* policy = nullptr;
  const char* budget_text = nullptr;
  const char* residual_text = nullptr;
  int zstd_level = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--policy" && i + 1 < argc) {
      policy = argv[++i];
    } else if (a == "--budget" && i + 1 < argc) {
      budget_text = argv[++i];
    } else if (a == "--residual" && i + 1 < argc) {
      residual_text = argv[++i];
    } else if (a == "--zstd-level" && i + 1 < argc) {
      zstd_level = std::atoi(argv[++i]);
    } else if (a == "-h" || a == "--help") {
      usage();
      return kExitOk;
    } else if (a.size() > 1 && a[0] == '-') {
      std::fprintf(stderr, "kvsdk: unknown option '%s'\n", a.c_str());
      return usage();
    } else {
      pos.push_back(a);
    }
  }
  if (pos.empty()) return usage();
  const std::string& cmd = pos[0];
  if (cmd == "inspect" && pos.size() == 2) return cmd_inspect(pos[1].c_str(), json);
  if (cmd == "verify" && pos.size() == 2) return cmd_verify(pos[1].c_str(), json);
  if (cmd == "recompress" && pos.size() == 3) {
    uint64_t budget = 0;
    if (!policy || !budget_text || !parse_bytes(budget_text, &budget)) {
      std::fprintf(stderr, "kvsdk: recompress needs --policy SPEC and --budget BYTES\n");
      return usage();
    }
    int32_t residual = 0;
    if (residual_text && !parse_residual(residual_text, &residual)) {
      std::fprintf(stderr, "kvsdk: --residual takes a token count or 'auto', not '%s'\n",
                   residual_text);
      return usage();
    }
    return cmd_recompress(pos[1].c_str(), pos[2].c_str(), policy, budget,
                          residual_text ? &residual : nullptr, zstd_level, json);
  }
  return usage();
}
