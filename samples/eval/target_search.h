// kvsdk-eval --target: the smallest snapshot that meets a fidelity target (top-1 agreement and/or
// KL against the full cache), searched coarse-to-fine over policy families and budgets.
//
// The search is a pure function of a measurement callback (family, budget -> measured point), so
// that its logic is tested on synthetic fidelity curves (tests/samples/eval/target_search_test.cpp)
// and the tool plugs in eval::evaluate (fidelity.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvsdk.h"

namespace eval {

// What a snapshot must keep: top-1 agreement >= min_top1 and mean KL <= max_kl (nats). A negative
// value leaves that metric free.
struct Target {
  double min_top1 = -1;
  double max_kl = -1;
};

// Parses "top1=0.95", "kl=0.01" or "top1=0.95,kl=0.01". Throws llama::Error on anything else
// (unknown key, a value out of range, a key given twice, no key at all).
Target parse_target(const std::string& text);
// "top-1 >= 0.95, KL <= 0.01" (the metrics the target constrains).
std::string describe(const Target& t);

// One measurement: a family's policy run at a budget, saved, resumed and scored (eval::evaluate).
struct Point {
  double budget_pct = 0;        // share of the full cache's bytes (continuous)
  bool ok = false;              // false: the run failed (e.g. could not stay within the budget)
  uint64_t snapshot_bytes = 0;  // the resume snapshot's bytes (meaningful when ok)
  double top1 = 0, kl = 0;
};

// Whether `p` ran and meets `t`.
bool meets(const Target& t, const Point& p);

// A candidate: one policy spec. `budgeted` families evict to their budget, so their snapshot
// shrinks with it and the search looks for their smallest passing budget; the others (full,
// kivi, minicache, specache: they never evict) keep the same rows at every budget that they fit,
// so one measurement at 100% is all there is to know. `at_least` is the index (in the family
// list) of a family whose snapshot is never larger than this one's (the same non-evicting
// method with fewer KIVI bits: same rows, fewer code bits, same scales and residual window), or
// -1: when that family's measured snapshot already cannot beat the best, this one is skipped.
//
// `save_as`: empty, the snapshot is the live cache saved as it is; otherwise a kvsdk_policy_parse
// spec ("h2o+kivi2", "kivi+kivi2"): the live cache runs as `spec` and its snapshot is written
// converted to that policy (kvsdk_save_options.target_policy, as `kvsdk recompress`), with the
// KIVI residual window kSaveAsResidual (save_as_policy()).
struct Family {
  std::string spec;
  bool budgeted = true;
  int at_least = -1;
  std::string save_as;
};

// The exact KIVI residual window R of every save-as target: the library's choice for the head_dim
// and width (KVSDK_QUANT_RESIDUAL_AUTO in kvsdk.h). Saved KIVI keeps its newest R rows exact;
// the default (128) would keep most rows of a budgeted cache of a few hundred rows exact, while
// the measured choice (16 rows at head_dim 64 and 2 bits) is what makes the saved file small.
constexpr int32_t kSaveAsResidual = KVSDK_QUANT_RESIDUAL_AUTO;

// "h2o" for a plain family, "h2o>kivi2" for h2o saved as h2o+kivi2, "full>kivi2" for full saved
// as kivi+kivi2: the live method, then the width the file is written at.
std::string label(const Family& f);

// The policy `f.save_as` names, with the residual window kSaveAsResidual. Throws llama::Error
// when `f` has no save-as target or it does not parse.
kvsdk_policy save_as_policy(const Family& f);

// Whether `spec` evicts rows to its budget (its snapshot shrinks with the budget).
bool evicts_to_budget(const kvsdk_policy& policy);

// The candidate families of `specs` (kvsdk_policy_parse specs, e.g. every method name and the
// eval's compositions): each spec that stores KIVI codes (quant_bits != 0: kivi, specache,
// "xkv+kivi2", ...) is tried at every bit width the parser takes (1, 2, 4, 8), spelled as the
// parser reads it ("kivi+kivi1", "xkv+kivi8"; the method's default width keeps its plain name),
// each (method, bits) once. `accept` says whether the library runs a spec (it is asked about
// every variant; refused ones are left out).
//
// Save-as variants: every accepted spec that keeps exact rows and evicts to its budget
// (streaming_llm, h2o, ...; a spec with a KIVI overlay already quantizes live and gets none),
// and `full`, are also tried live as they are and saved as KIVI at widths 1, 2, 4, 8: the target
// is the method with '+kiviN' ("h2o+kivi2"; full's is "kivi+kiviN"), with kSaveAsResidual, and
// `accept` is asked about it (spec and save_as_policy) like any variant: the methods that take
// no KIVI overlay (spindlekv, smallkv) are refused there and get none. Each (method, bits) once.
//
// Order (cheap, likely small first: the sooner a small best is known, the more is pruned):
// non-budgeted families first, each method's widths ascending with `at_least` pointing at the
// next narrower width, full's save-as variants after them (not chained: their automatic residual
// window grows as the width shrinks, so fewer bits can make a larger file); then the budgeted
// save-as variants, by width 2, 4, 1, 8 (2-bit is the usual
// winner, 1-bit needs a higher budget to pass, 8-bit is rarely small), each width's methods in
// the order of `specs`; then the budgeted live families in the order of `specs`. A budgeted
// save-as variant has no `at_least`: with fewer bits it may pass only at a higher budget, so
// its snapshot is not bounded by a wider one's.
std::vector<Family> expand_families(const std::vector<std::string>& specs,
                                    const std::function<bool(const std::string& spec,
                                                             const kvsdk_policy& policy)>& accept);

struct SearchOptions {
  // Coarse ladder for budgeted families, descending, in % of the full cache's bytes.
  std::vector<double> ladder = {50, 25, 12.5, 6.25, 3.125};
  // Bisection steps between the smallest passing ladder budget and the failing one below it: the
  // smallest passing budget is found within (gap / 2^steps) where fidelity is monotone.
  int bisect_steps = 3;
  // Failing ladder rungs in a row that the coarse walk goes past before it stops: fidelity is
  // not monotone in the budget where a live policy is saved converted (kvsdk-eval measured
  // h2o saved as h2o+kivi2 on shakespeare-base failing at 25% and passing at 15%), so one
  // failure does not end the walk. 0: stop at the first failure.
  int ladder_patience = 1;
};

struct Trial {
  size_t family = 0;  // index into the family list
  Point point;
  bool passed = false;
};

struct SearchResult {
  bool found = false;
  size_t family = 0;       // the recipe: families[family].spec at best.budget_pct
  Point best;              // always a measured, passing point
  std::vector<Trial> trials;  // every measurement, in order
  size_t pruned = 0;          // families or bisections skipped because they could not win
  std::vector<size_t> skipped;  // the families skipped unmeasured (through `at_least`)
  size_t violations = 0;      // pairs of one family's measured points whose snapshots shrink
                              // as the budget grows (see search())
};

// Measures `families[family]` at `budget_pct`.
using Measure = std::function<Point(size_t family, double budget_pct)>;

// The smallest snapshot meeting `target` among `families`.
//
// Budgeted families: the ladder is walked downwards until more than `ladder_patience` budgets
// in a row fail; the budget is then bisected `bisect_steps` times between the smallest passing
// ladder budget and the failing one right below it (between 100% and the first ladder budget
// when no rung passes: 100% itself is never measured, it only brackets the bisection). Within
// a bracket this ASSUMES that fidelity is monotone in the budget (more budget, more kept rows,
// no worse fidelity) and that the snapshot grows with the budget; the patience follows
// fidelity that recovers a rung below a failure, not further. So a violation of monotonicity
// can make it miss a smaller recipe, never report a failing one. Of the passing points it keeps the one with the
// smallest *measured* snapshot (not the smallest budget: where the snapshot does not grow with
// the budget, a higher budget can be the smaller recipe; such inversions are counted in
// `violations`), and it never reports an unmeasured budget.
//
// Pruning: a bisection stops when its failing bracket's measured snapshot is already no smaller
// than the best passing snapshot found (every budget above it would give a larger snapshot); a
// family is skipped when its `at_least` family's measured snapshot is no smaller than the best.
//
// Non-budgeted families are measured once at 100%. Families run in the given order (put cheap,
// likely-small ones first: the sooner a small best is known, the more is pruned).
SearchResult search(const std::vector<Family>& families, const Target& target,
                    const SearchOptions& options, const Measure& measure);

}  // namespace eval
