// Writes evaluation records as JSON, a Markdown table and a gnuplot PNG (quality vs memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace eval {

struct Record {
  std::string model;
  std::string policy;
  int budget_pct = 0;
  uint64_t budget_bytes = 0;
  bool ok = false;
  std::string status;        // "ok", "skipped" (the cell cannot run on this model: `error`
                             // says why), or the kvsdk status that stopped the run
  std::string error;         // kvsdk_last_error() detail when not ok
  uint64_t cache_bytes = 0;  // peak bytes the cache held (0 when the run failed)
  uint64_t full_cache_bytes = 0;
  uint64_t snapshot_bytes = 0, full_snapshot_bytes = 0;  // kvsdk snapshot at the end of the run
  double ppl = 0, ppl_full = 0, top1_agreement = 0, kl = 0;
  size_t context_tokens = 0, prompt_tokens = 0;
  double fetch_hit_rate = -1;  // SpeCache's fetch hit rate; -1: not applicable
};

// One measurement of kvsdk-eval --target's search (target_search.h).
struct TargetTrial {
  std::string policy;           // the live policy's spec
  std::string save_as;          // the policy the snapshot was written as; empty: as it is
  std::string label;            // the family's name in the search ("h2o>kivi2"; eval::label)
  double budget_pct = 0;
  bool ok = false;              // false: the run failed (`status` and `error` say why)
  std::string status;
  std::string error;
  uint64_t snapshot_bytes = 0;  // meaningful when ok
  double top1_agreement = 0, kl = 0;
  bool passed = false;          // ran and met the target
};

// The outcome of kvsdk-eval --target on one model: the recipe with the smallest measured
// snapshot that met the target, or found = false.
struct TargetRecord {
  std::string model;
  std::string target;            // e.g. "top-1 >= 0.95, KL <= 0.01"
  double min_top1 = -1, max_kl = -1;  // negative: not constrained
  bool found = false;
  std::string policy;            // the recipe's live policy spec
  std::string save_as;           // the policy its snapshot is written as; empty: as it is
  std::string label;             // the recipe's family ("h2o>kivi2"; eval::label)
  double budget_pct = 0;         // its budget in % of the full cache's bytes
  uint64_t budget_bytes = 0;
  uint64_t snapshot_bytes = 0, full_snapshot_bytes = 0;  // resume snapshot, and full's there
  double top1_agreement = 0, kl = 0;
  size_t context_tokens = 0, prompt_tokens = 0;
  size_t families = 0, evaluations = 0, pruned = 0, violations = 0;
  int save_as_residual = 0;      // the KIVI residual window of save-as targets (kSaveAsResidual)
  double seconds = 0;            // wall time of the search (the reference run not included)
  std::vector<double> ladder;    // the search's coarse budgets (%), and its bisection steps
  int bisect_steps = 0;
  std::vector<TargetTrial> trials;  // every measurement, in search order
  std::vector<std::string> skipped;  // policies never measured: a narrower KIVI width of the
                                     // same policy already could not beat the best
};

// Each writer throws llama::Error when the file cannot be written. Without `targets` both write
// exactly what they wrote before --target existed. With them, the JSON becomes an object
// {"records": [...], "models": [{"model": ..., "target": {...}}, ...]} and the Markdown gains a
// section with the recipes and each family's smallest passing point (the budget-grid sections
// follow when there are records). The recipe and every trial carry "save_as" (a spec or null).
void write_json(const std::string& path, const std::vector<Record>& records,
                const std::vector<TargetRecord>& targets = {});
void write_markdown(const std::string& path, const std::vector<Record>& records,
                    const std::vector<TargetRecord>& targets = {});
// Runs gnuplot (must be on PATH) to draw top-1 agreement and KL against cache bytes as a share
// of the full cache, one panel per model, one line per policy.
void write_plot(const std::string& path, const std::vector<Record>& records);
// kvsdk-eval --target --plot: top-1 agreement against the resume snapshot's bytes (share of the
// full cache's snapshot) for every measured point of the search, one panel per model, one line
// per policy (its budgets; `full` and plain `kivi` are the references), the recipe circled and
// the top-1 bound drawn. Save-as families ("h2o>kivi2") are their own series, dashed, so that
// they stand apart from the live policies. Runs gnuplot like write_plot.
void write_target_plot(const std::string& path, const std::vector<TargetRecord>& targets);

}  // namespace eval
