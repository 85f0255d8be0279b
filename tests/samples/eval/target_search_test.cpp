// kvsdk-eval --target's search (samples/eval/target_search.h) on synthetic fidelity curves:
// it finds the smallest passing budget within the bisection's resolution where fidelity is
// monotone, never reports a failing or an unmeasured point (also where fidelity is not
// monotone), reports none when nothing passes, and prunes what cannot win. Then one small real
// search on the bundled shakespeare-small through eval::evaluate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "error.h"
#include "fidelity.h"
#include "model.h"
#include "report.h"
#include "target_search.h"
#include "tokenizer.h"

namespace {

using eval::Family;
using eval::Point;
using eval::SearchOptions;
using eval::SearchResult;
using eval::Target;

// A budgeted family whose top-1 is 1 at or above `threshold` % and 0.5 below, snapshot bytes
// proportional to the budget (1000 per %).
Point step_curve(double budget, double threshold) {
  Point p;
  p.ok = true;
  p.snapshot_bytes = uint64_t(std::llround(budget * 1000.0));
  p.top1 = budget >= threshold ? 1.0 : 0.5;
  p.kl = budget >= threshold ? 0.001 : 0.5;
  return p;
}

Target top1(double t) {
  Target x;
  x.min_top1 = t;
  return x;
}

// Checks what every search result must satisfy: the best is one of the trials, measured, and
// passing; no passing trial has a smaller snapshot.
void expect_sound(const SearchResult& r, const Target& t) {
  if (!r.found) {
    for (const eval::Trial& x : r.trials) EXPECT_FALSE(x.passed);
    return;
  }
  EXPECT_TRUE(eval::meets(t, r.best));
  bool measured = false;
  for (const eval::Trial& x : r.trials) {
    EXPECT_EQ(x.passed, eval::meets(t, x.point));
    measured = measured || (x.family == r.family && x.point.budget_pct == r.best.budget_pct &&
                            x.point.snapshot_bytes == r.best.snapshot_bytes && x.passed);
    if (x.passed) EXPECT_GE(x.point.snapshot_bytes, r.best.snapshot_bytes);
  }
  EXPECT_TRUE(measured) << "the reported point was never measured";
}

TEST(TargetSearch, ParsesTargets) {
  Target t = eval::parse_target("top1=0.95");
  EXPECT_EQ(t.min_top1, 0.95);
  EXPECT_LT(t.max_kl, 0);
  t = eval::parse_target("kl=0.01");
  EXPECT_LT(t.min_top1, 0);
  EXPECT_EQ(t.max_kl, 0.01);
  t = eval::parse_target("top1=0.95,kl=0.01");
  EXPECT_EQ(t.min_top1, 0.95);
  EXPECT_EQ(t.max_kl, 0.01);
  EXPECT_EQ(eval::describe(t), "top-1 >= 0.95, KL <= 0.01");
  for (const char* bad : {"", "top1", "top1=", "top1=x", "top1=1.5", "kl=-1", "ppl=3",
                          "top1=0.9,top1=0.8", "top1=0.9;kl=0.1", "kl=nan"}) {
    EXPECT_THROW(eval::parse_target(bad), llama::Error) << bad;
  }
}

TEST(TargetSearch, MeetsNeedsARunAndEveryConstrainedMetric) {
  Point p;
  p.ok = true;
  p.top1 = 0.95;
  p.kl = 0.01;
  EXPECT_TRUE(eval::meets(eval::parse_target("top1=0.95,kl=0.01"), p));
  EXPECT_FALSE(eval::meets(eval::parse_target("top1=0.96"), p));
  EXPECT_FALSE(eval::meets(eval::parse_target("kl=0.009"), p));
  p.ok = false;
  EXPECT_FALSE(eval::meets(eval::parse_target("top1=0"), p));
}

// Monotone curves: the smallest passing budget is found within the bisection's resolution (the
// bracket it bisects, over 2^steps), and it is at or above the true threshold.
TEST(TargetSearch, MonotoneCurveFindsTheSmallestPassingBudgetWithinResolution) {
  const SearchOptions opt;  // ladder 50, 25, 12.5, 6.25, 3.125; 3 steps
  ASSERT_EQ(opt.bisect_steps, 3);
  for (double threshold : {0.5, 3.0, 4.0, 7.3, 9.0, 12.5, 13.0, 20.0, 33.3, 49.0, 50.0, 61.0, 93.0}) {
    int calls = 0;
    const SearchResult r = eval::search({Family{"evict", true, -1}}, top1(0.9), opt,
                                        [&](size_t f, double b) {
                                          EXPECT_EQ(f, 0u);
                                          ++calls;
                                          return step_curve(b, threshold);
                                        });
    SCOPED_TRACE(threshold);
    expect_sound(r, top1(0.9));
    EXPECT_EQ(size_t(calls), r.trials.size());
    ASSERT_TRUE(r.found);
    EXPECT_GE(r.best.budget_pct, threshold);
    // The bracket around the threshold: ladder neighbours, or 100% above the first rung.
    double hi = 100, lo = 0;
    for (double b : opt.ladder) {
      if (b >= threshold) hi = b;               // the ladder descends: the last is the smallest
      if (b < threshold && lo == 0) lo = b;     // the first below the threshold
    }
    if (threshold <= opt.ladder.back()) {
      EXPECT_EQ(r.best.budget_pct, opt.ladder.back());  // passes down to the floor: no bisection
      EXPECT_EQ(r.trials.size(), opt.ladder.size());
    } else {
      EXPECT_LE(r.best.budget_pct - threshold, (hi - lo) / 8.0 + 1e-12);
      EXPECT_LE(r.trials.size(), opt.ladder.size() + 3);  // coarse-to-fine, not a grid
    }
    EXPECT_EQ(r.violations, 0u);
  }
}

// Above the last bisection point below 100% (93.75%) nothing that was measured passes: none,
// although 100% would pass (it is never measured for a budgeted family).
TEST(TargetSearch, AThresholdAboveTheFinestBracketGivesNone) {
  const SearchResult r = eval::search({Family{"evict", true, -1}}, top1(0.9), SearchOptions{},
                                      [](size_t, double b) { return step_curve(b, 99.0); });
  EXPECT_FALSE(r.found);
  expect_sound(r, top1(0.9));
  EXPECT_EQ(r.trials.size(), 5u);  // 50 and 25 (the patience), then 75, 87.5, 93.75
}

TEST(TargetSearch, KlTargetAndOneExactCase) {
  // Threshold 9%: 50, 25, 12.5 pass, 6.25 and 3.125 fail (one failure of patience); bisection
  // 9.375 (pass), 7.8125 (fail), 8.59375 (fail): the smallest passing budget measured is 9.375%.
  const SearchResult r = eval::search({Family{"evict", true, -1}}, eval::parse_target("kl=0.01"),
                                      SearchOptions{},
                                      [](size_t, double b) { return step_curve(b, 9.0); });
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.budget_pct, 9.375);
  EXPECT_EQ(r.best.snapshot_bytes, 9375u);
  std::vector<double> budgets;
  for (const eval::Trial& x : r.trials) budgets.push_back(x.point.budget_pct);
  EXPECT_EQ(budgets, (std::vector<double>{50, 25, 12.5, 6.25, 3.125, 9.375, 7.8125, 8.59375}));

  // Without patience the walk stops at the first failure.
  SearchOptions impatient;
  impatient.ladder_patience = 0;
  const SearchResult s = eval::search({Family{"evict", true, -1}}, eval::parse_target("kl=0.01"),
                                      impatient,
                                      [](size_t, double b) { return step_curve(b, 9.0); });
  budgets.clear();
  for (const eval::Trial& x : s.trials) budgets.push_back(x.point.budget_pct);
  EXPECT_EQ(budgets, (std::vector<double>{50, 25, 12.5, 6.25, 9.375, 7.8125, 8.59375}));
}

// Non-monotone fidelity. Fidelity that recovers one rung below a failure (passes above 20% and
// in [5, 7]) is followed there (the patience) and bisected below it; fidelity that recovers only
// two failing rungs further down (passes above 30% and in [3, 4]) is missed: the walk stops
// after 25% and 12.5% fail. Either way what it reports passes and was measured.
TEST(TargetSearch, NonMonotoneCurveNeverReportsAFailingOrUnmeasuredPoint) {
  auto curve = [](double b, bool near) {
    Point p;
    p.ok = true;
    p.snapshot_bytes = uint64_t(b * 1000);
    const bool pass = near ? b >= 20.0 || (b >= 5.0 && b <= 7.0) : b >= 30.0 || (b >= 3.0 && b <= 4.0);
    p.top1 = pass ? 0.99 : 0.5;
    return p;
  };
  const SearchResult r = eval::search({Family{"wobbly", true, -1}}, top1(0.95), SearchOptions{},
                                      [&](size_t, double b) { return curve(b, true); });
  expect_sound(r, top1(0.95));
  ASSERT_TRUE(r.found);
  EXPECT_GE(r.best.budget_pct, 5.0);  // 12.5 fails, 6.25 passes, 3.125 fails: bisected in between
  EXPECT_LE(r.best.budget_pct, 6.25);
  const SearchResult far = eval::search({Family{"wobbly", true, -1}}, top1(0.95), SearchOptions{},
                                        [&](size_t, double b) { return curve(b, false); });
  expect_sound(far, top1(0.95));
  ASSERT_TRUE(far.found);
  EXPECT_GE(far.best.budget_pct, 30.0);
  EXPECT_LE(far.best.budget_pct, 50.0);
  for (const eval::Trial& x : far.trials) EXPECT_GT(x.point.budget_pct, 12.4);  // stopped at 12.5

  // Fidelity that alternates pass/fail along every budget the search could try: whatever it
  // measures, the result is a measured pass.
  const SearchResult z = eval::search(
      {Family{"zigzag", true, -1}}, top1(0.95), SearchOptions{}, [](size_t, double b) {
        Point p;
        p.ok = true;
        p.snapshot_bytes = uint64_t(b * 1000);
        p.top1 = (int(std::floor(b * 64.0)) % 2) ? 0.99 : 0.5;
        return p;
      });
  expect_sound(z, top1(0.95));
}

// A snapshot that shrinks as the budget grows (e.g. a larger budget keeps rows that compress
// better): the smallest *measured* passing snapshot wins, not the smallest budget, and the
// inversion is counted.
TEST(TargetSearch, SnapshotInversionKeepsTheSmallestMeasuredSnapshot) {
  const SearchResult r = eval::search(
      {Family{"inverted", true, -1}}, top1(0.9), SearchOptions{}, [](size_t, double b) {
        Point p;
        p.ok = true;
        p.top1 = b >= 10.0 ? 1.0 : 0.0;
        p.snapshot_bytes = b >= 40.0 ? 100 : uint64_t(b * 1000);  // 50%: 100 bytes
        return p;
      });
  expect_sound(r, top1(0.9));
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.budget_pct, 50.0);
  EXPECT_EQ(r.best.snapshot_bytes, 100u);
  EXPECT_GT(r.violations, 0u);
}

TEST(TargetSearch, NothingPassesGivesNone) {
  // One family never meets the target, another cannot even run (budget refusals).
  const SearchResult r = eval::search(
      {Family{"never", true, -1}, Family{"refused", true, -1}, Family{"fixed", false, -1}},
      top1(0.95), SearchOptions{}, [](size_t f, double b) {
        Point p;
        p.ok = f != 1;
        p.snapshot_bytes = uint64_t(b * 1000);
        p.top1 = 0.9;
        return p;
      });
  EXPECT_FALSE(r.found);
  expect_sound(r, top1(0.95));
  // 50% and 25% fail for both budgeted families (the walk goes one failing rung further), then
  // 3 bisection steps between 100% (unmeasured) and 50% each, then the fixed family once at
  // 100%.
  EXPECT_EQ(r.trials.size(), 5u + 5u + 1u);
  for (const eval::Trial& x : r.trials) {
    if (x.family < 2) {
      EXPECT_LT(x.point.budget_pct, 100.0);  // 100% only brackets a budgeted bisection
    } else {
      EXPECT_EQ(x.point.budget_pct, 100.0);
    }
  }
}

TEST(TargetSearch, PicksTheSmallestSnapshotAcrossFamiliesAndPrunes) {
  // 0: fixed, passes, 20000 bytes. 1: fixed, fails, 30000 bytes. 2: the same method as 1 with
  // more bits (at_least = 1): skipped, its snapshot cannot be below 1's. 3: budgeted, threshold
  // 30%: fails at 25% with 25000 bytes >= best 20000 (and at 12.5%), so its bisection is
  // pruned. 4: budgeted, threshold 9%: wins at 9.375% (9375 bytes).
  std::map<size_t, int> calls;
  const SearchResult r = eval::search(
      {Family{"kivi+kivi1", false, -1}, Family{"m+kivi1", false, -1}, Family{"m+kivi2", false, 1},
       Family{"snapkv", true, -1}, Family{"h2o", true, -1}},
      top1(0.9), SearchOptions{}, [&](size_t f, double b) {
        ++calls[f];
        Point p;
        switch (f) {
          case 0: p = step_curve(20, 0); break;
          case 1: p = step_curve(30, 100); break;
          case 2: p = step_curve(40, 0); break;
          case 3: p = step_curve(b, 30); break;
          default: p = step_curve(b, 9); break;
        }
        return p;
      });
  expect_sound(r, top1(0.9));
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.family, 4u);
  EXPECT_EQ(r.best.budget_pct, 9.375);
  EXPECT_EQ(calls[0], 1);
  EXPECT_EQ(calls[1], 1);
  EXPECT_EQ(calls.count(2), 0u);  // pruned by at_least
  EXPECT_EQ(r.skipped, std::vector<size_t>{2});
  // 50% (pass, 50000 bytes), 25% and 12.5% (fail: the patience); bisection pruned.
  EXPECT_EQ(calls[3], 3);
  EXPECT_EQ(r.pruned, 2u);
}

TEST(TargetSearch, LadderMustDescendWithinRange) {
  SearchOptions bad;
  bad.ladder = {25, 50};
  auto m = [](size_t, double b) { return step_curve(b, 1); };
  EXPECT_THROW(eval::search({Family{"x", true, -1}}, top1(0.9), bad, m), llama::Error);
  bad.ladder = {150};
  EXPECT_THROW(eval::search({Family{"x", true, -1}}, top1(0.9), bad, m), llama::Error);
}

TEST(TargetSearch, ExpandsEveryKiviWidthOfTheSpecsThatQuantize) {
  std::vector<std::string> asked;
  const std::vector<Family> f = eval::expand_families(
      {"full", "h2o", "kivi", "xkv+kivi2", "specache", "xkv+kivi4", "nonsense"},
      [&](const std::string& spec, const kvsdk_policy& p) {
        asked.push_back(spec);
        return !(p.method == KVSDK_METHOD_SPECACHE && p.quant_bits > 2);  // as the library
      });
  // The live families (the save-as variants of full and h2o: ExpandsSaveAsVariants).
  std::vector<std::string> specs;
  for (const Family& x : f) {
    if (x.save_as.empty()) specs.push_back(x.spec);
  }
  EXPECT_EQ(specs, (std::vector<std::string>{"full", "kivi+kivi1", "kivi", "kivi+kivi4",
                                             "kivi+kivi8", "specache+kivi1", "specache", "h2o",
                                             "xkv+kivi1", "xkv+kivi2", "xkv+kivi4", "xkv+kivi8"}));
  // Non-budgeted first; each KIVI width bounded by the next narrower one of its method.
  EXPECT_FALSE(f[0].budgeted);
  EXPECT_EQ(f[0].at_least, -1);
  EXPECT_EQ(f[1].at_least, -1);
  EXPECT_EQ(f[2].at_least, 1);
  EXPECT_EQ(f[3].at_least, 2);
  EXPECT_EQ(f[4].at_least, 3);
  EXPECT_EQ(f[5].at_least, -1);
  EXPECT_EQ(f[6].at_least, 5);
  for (size_t i = 7; i < f.size(); ++i) {
    if (!f[i].save_as.empty()) continue;
    EXPECT_TRUE(f[i].budgeted) << f[i].spec;
    EXPECT_EQ(f[i].at_least, -1);
  }
  // Each spelling parses back to its width.
  for (const Family& x : f) {
    kvsdk_policy p;
    ASSERT_EQ(kvsdk_policy_parse(&p, x.spec.c_str()), KVSDK_OK) << x.spec;
  }
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "kivi+kivi1"), KVSDK_OK);
  EXPECT_EQ(p.quant_bits, 1);
  // xkv+kivi4 duplicates widths already expanded from xkv+kivi2: asked once each.
  size_t xkv4 = 0;
  for (const std::string& s : asked) xkv4 += s == "xkv+kivi4";
  EXPECT_EQ(xkv4, 1u);
}

// Save-as variants: full and each exact-row evicting spec, saved as KIVI at every width the
// library accepts, labelled "method>kiviN"; none for specs that already quantize live or whose
// method takes no KIVI overlay; a refused target drops only its variant.
TEST(TargetSearch, ExpandsSaveAsVariants) {
  std::vector<std::pair<std::string, kvsdk_policy>> asked;
  const std::vector<Family> f = eval::expand_families(
      {"full", "streaming_llm", "h2o", "snapkv+kivi4", "spindlekv", "smallkv", "kivi", "h2o"},
      [&](const std::string& spec, const kvsdk_policy& p) {
        asked.emplace_back(spec, p);
        // As the library: no KIVI overlay on full, spindlekv, smallkv; one target refused.
        const bool no_overlay = p.method == KVSDK_METHOD_FULL || p.method == KVSDK_METHOD_SPINDLEKV ||
                                p.method == KVSDK_METHOD_SMALLKV;
        return !(p.quant_bits != 0 && no_overlay) && spec != "h2o+kivi8";
      });
  std::vector<std::string> labels;
  for (const Family& x : f) labels.push_back(eval::label(x));
  EXPECT_EQ(labels,
            (std::vector<std::string>{
                "full", "kivi+kivi1", "kivi", "kivi+kivi4", "kivi+kivi8",  // non-budgeted live
                "full>kivi1", "full>kivi2", "full>kivi4", "full>kivi8",    // full saved as KIVI
                "streaming_llm>kivi2", "h2o>kivi2", "streaming_llm>kivi4", "h2o>kivi4",
                "streaming_llm>kivi1", "h2o>kivi1", "streaming_llm>kivi8",  // h2o>kivi8 refused
                "streaming_llm", "h2o", "snapkv+kivi1", "snapkv+kivi2", "snapkv+kivi4",
                "snapkv+kivi8", "spindlekv", "smallkv"}));
  std::map<std::string, const Family*> by_label;
  for (const Family& x : f) by_label[eval::label(x)] = &x;
  // Save targets: the method with its overlay; full's is plain KIVI. Live spec unchanged.
  EXPECT_EQ(by_label["h2o>kivi2"]->spec, "h2o");
  EXPECT_EQ(by_label["h2o>kivi2"]->save_as, "h2o+kivi2");
  EXPECT_EQ(by_label["full>kivi2"]->spec, "full");
  EXPECT_EQ(by_label["full>kivi2"]->save_as, "kivi+kivi2");
  EXPECT_EQ(by_label["streaming_llm>kivi1"]->save_as, "streaming_llm+kivi1");
  // full saved as KIVI is measured once (not budgeted) and unbounded (the automatic window
  // grows as the width shrinks, so fewer bits can make a larger file); the evicting ones are
  // budgeted and unbounded (fewer bits may need a higher budget).
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string l = labels[i];
    if (l.rfind("full>", 0) == 0) {
      EXPECT_FALSE(f[i].budgeted) << l;
      EXPECT_EQ(f[i].at_least, -1) << l;
    } else if (!f[i].save_as.empty()) {
      EXPECT_TRUE(f[i].budgeted) << l;
      EXPECT_EQ(f[i].at_least, -1) << l;
    }
  }
  // accept saw each save target with the search's residual window, and the policy built for a
  // measurement is that one.
  bool asked_h2o2 = false;
  for (const auto& [spec, p] : asked) {
    if (spec == "h2o+kivi2" && p.quant_residual == eval::kSaveAsResidual) asked_h2o2 = true;
  }
  EXPECT_TRUE(asked_h2o2);
  const kvsdk_policy t = eval::save_as_policy(*by_label["h2o>kivi2"]);
  EXPECT_EQ(t.method, KVSDK_METHOD_H2O);
  EXPECT_EQ(t.quant_bits, 2);
  EXPECT_EQ(t.quant_residual, eval::kSaveAsResidual);
  EXPECT_EQ(eval::save_as_policy(*by_label["full>kivi8"]).method, KVSDK_METHOD_KIVI);
  EXPECT_THROW(eval::save_as_policy(*by_label["h2o"]), llama::Error);  // saved as it is
  EXPECT_EQ(eval::label(Family{"x", true, -1, ""}), "x");
}

// A search over expanded families with save-as variants on synthetic curves: the save-as winner
// is found at a measured passing point, and every full>kivi width is measured (no bound between
// widths: the automatic window grows as the width shrinks).
TEST(TargetSearch, SearchWithSaveAsFamiliesReturnsMeasuredPassingPoints) {
  const std::vector<Family> families = eval::expand_families(
      {"full", "h2o"}, [](const std::string&, const kvsdk_policy&) { return true; });
  ASSERT_EQ(families.size(), 10u);  // full, full>kivi1..8, h2o>kivi2,4,1,8, h2o
  // Per label: bytes per % of budget (budgeted) or at 100% (fixed), and the passing threshold.
  const std::map<std::string, std::pair<double, double>> curves = {
      {"full", {100000, 0}},          {"full>kivi1", {13000, 101}}, {"full>kivi2", {25000, 0}},
      {"full>kivi4", {50000, 0}},     {"full>kivi8", {100000, 0}},  {"h2o>kivi2", {250, 14}},
      {"h2o>kivi4", {500, 11}},       {"h2o>kivi1", {130, 40}},     {"h2o>kivi8", {1000, 10}},
      {"h2o", {1000, 10}}};
  std::vector<std::string> measured;
  const SearchResult r = eval::search(families, top1(0.9), SearchOptions{}, [&](size_t f, double b) {
    const std::string l = eval::label(families[f]);
    measured.push_back(l);
    const auto& [bytes, threshold] = curves.at(l);
    Point p = families[f].budgeted ? step_curve(b, threshold) : step_curve(100, threshold);
    p.snapshot_bytes = uint64_t(std::llround(families[f].budgeted ? b * bytes : bytes));
    return p;
  });
  expect_sound(r, top1(0.9));
  ASSERT_TRUE(r.found);
  EXPECT_EQ(eval::label(families[r.family]), "h2o>kivi2");
  // Threshold 14: 50, 25 pass, 12.5 fails; bisection 18.75, 15.625, 14.0625 all pass.
  EXPECT_EQ(r.best.budget_pct, 14.0625);
  EXPECT_EQ(r.best.snapshot_bytes, uint64_t(std::llround(14.0625 * 250)));
  EXPECT_TRUE(r.skipped.empty());
  for (const char* l : {"full>kivi1", "full>kivi2", "full>kivi4", "full>kivi8"}) {
    EXPECT_EQ(std::count(measured.begin(), measured.end(), std::string(l)), 1) << l;
  }
}

// One small real search: shakespeare-small on a 128-token text, the full cache and xkv, with
// their save-as variants. Every reported number is a real measurement: the recipe
// re-evaluated at its budget gives the same snapshot and metrics, and it meets the target.
TEST(TargetSearchReal, SmallSearchOnTheBundledModel) {
  const std::string dir = std::string(KVSDK_SOURCE_DIR) + "/samples/models/";
  const llama::Model model = llama::Model::load(dir + "shakespeare-small.bin");
  const llama::Tokenizer tok = llama::Tokenizer::load(dir + "shakespeare-small.tok.bin", 68);
  std::ifstream in(std::string(KVSDK_SOURCE_DIR) + "/tests/samples/eval/short_text.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int> text = tok.encode(ss.str(), false);
  // 95 rows at the resume: more than KIVI-2's automatic window and a group (16 + 32 at head_dim
  // 64), so a 2-bit conversion quantizes some of them.
  text.resize(128);
  eval::Schedule s;
  s.prompt_tokens = 96;
  const eval::Reference ref = eval::build_reference(model, text, s);
  const std::vector<Family> families = eval::expand_families(
      {"full", "xkv"}, [](const std::string&, const kvsdk_policy&) { return true; });
  ASSERT_EQ(families.size(), 10u);  // full, full>kivi1..8, xkv>kivi2,4,1,8, xkv
  const Target target = eval::parse_target("top1=0.9,kl=0.05");
  std::vector<eval::Outcome> outcomes;
  auto run = [&](size_t f, double pct) {
    kvsdk_policy p, save_as;
    EXPECT_EQ(kvsdk_policy_parse(&p, families[f].spec.c_str()), KVSDK_OK);
    if (!families[f].save_as.empty()) save_as = eval::save_as_policy(families[f]);
    const eval::Outcome out = eval::evaluate(
        model, ref, p, std::max<uint64_t>(1, uint64_t(double(ref.full_cache_bytes) * pct / 100.0)),
        false, nullptr, /*with_ppl=*/false, families[f].save_as.empty() ? nullptr : &save_as);
    outcomes.push_back(out);
    EXPECT_EQ(out.ppl, 0.0);  // the perplexity pass is skipped
    Point pt;
    pt.ok = out.ok;
    pt.snapshot_bytes = out.snapshot_bytes;
    pt.top1 = out.top1_agreement;
    pt.kl = out.kl;
    return pt;
  };
  SearchOptions opt;
  opt.bisect_steps = 2;
  const SearchResult r = eval::search(families, target, opt, run);
  expect_sound(r, target);
  ASSERT_TRUE(r.found);  // full at 100% always meets it
  ASSERT_EQ(r.trials.front().family, 0u);  // full, measured first, once, at 100%
  EXPECT_EQ(r.trials.front().point.budget_pct, 100.0);
  EXPECT_TRUE(r.trials.front().passed);
  EXPECT_EQ(r.trials.front().point.top1, 1.0);
  EXPECT_EQ(r.trials.front().point.kl, 0.0);
  EXPECT_LE(r.best.snapshot_bytes, r.trials.front().point.snapshot_bytes);
  // Skipping the perplexity pass changes nothing of the resume: unlimited, full's resume
  // snapshot is the reference's byte for byte in size (as with the pass, fidelity_test.cpp).
  kvsdk_policy full;
  ASSERT_EQ(kvsdk_policy_parse(&full, "full"), KVSDK_OK);
  const eval::Outcome unlimited = eval::evaluate(model, ref, full, 0, false, nullptr, false);
  ASSERT_TRUE(unlimited.ok) << unlimited.error;
  EXPECT_EQ(unlimited.snapshot_bytes, ref.full_snapshot_bytes);
  const Point again = run(r.family, r.best.budget_pct);
  EXPECT_EQ(again.snapshot_bytes, r.best.snapshot_bytes);
  EXPECT_EQ(again.top1, r.best.top1);
  EXPECT_EQ(again.kl, r.best.kl);
  // full saved as KIVI-2 was measured once, at 100%, on the converted cache (its quantized rows
  // move the distribution); a failed save-as measurement (a pair the library refuses) carries
  // its status and reason.
  size_t full_kivi2 = 0;
  for (size_t k = 0; k < r.trials.size(); ++k) {
    const eval::Trial& x = r.trials[k];
    if (eval::label(families[x.family]) == "full>kivi2") {
      ASSERT_TRUE(x.point.ok) << outcomes[k].error;
      EXPECT_EQ(x.point.budget_pct, 100.0);
      EXPECT_GT(x.point.kl, 0.0);
      ++full_kivi2;
    }
    if (!x.point.ok) {
      EXPECT_NE(outcomes[k].status, KVSDK_OK);
      EXPECT_FALSE(outcomes[k].error.empty());
    }
  }
  EXPECT_EQ(full_kivi2, 1u);
}

TEST(TargetReport, JsonAndMarkdownHoldTheRecipe) {
  eval::TargetRecord t;
  t.model = "m";
  t.target = "top-1 >= 0.95";
  t.min_top1 = 0.95;
  t.found = true;
  t.policy = "xkv+kivi2";
  t.budget_pct = 9.375;
  t.budget_bytes = 937;
  t.snapshot_bytes = 80;
  t.full_snapshot_bytes = 1000;
  t.top1_agreement = 0.96;
  t.kl = 0.004;
  t.evaluations = 7;
  t.seconds = 12.5;
  t.ladder = {50, 25};
  t.bisect_steps = 3;
  eval::TargetTrial x;
  x.policy = "xkv+kivi2";
  x.budget_pct = 9.375;
  x.ok = x.passed = true;
  x.status = "ok";
  x.snapshot_bytes = 80;
  x.top1_agreement = 0.96;
  x.kl = 0.004;
  t.trials = {x};
  eval::TargetRecord saved = t;  // a recipe whose file is converted
  saved.model = "s";
  saved.policy = "h2o";
  saved.save_as = "h2o+kivi2";
  saved.label = "h2o>kivi2";
  saved.save_as_residual = 16;
  saved.trials[0].policy = "h2o";
  saved.trials[0].save_as = "h2o+kivi2";
  saved.trials[0].label = "h2o>kivi2";
  eval::TargetTrial refused = saved.trials[0];
  refused.ok = refused.passed = false;
  refused.status = "unsupported";
  refused.error = "a layer evicted per KV head";
  saved.trials.push_back(refused);
  saved.trials.push_back(x);  // a live trial beside it: its own family
  eval::TargetRecord none = t;
  none.model = "n";
  none.found = false;
  none.trials[0].passed = false;
  none.skipped = {"kivi+kivi4"};
  none.save_as_residual = KVSDK_QUANT_RESIDUAL_AUTO;
  const std::string json = testing::TempDir() + "t.json", md = testing::TempDir() + "t.md";
  eval::write_json(json, {}, {t, saved, none});
  eval::write_markdown(md, {}, {t, saved, none});
  std::stringstream j, m;
  j << std::ifstream(json).rdbuf();
  m << std::ifstream(md).rdbuf();
  for (const char* key : {"{\"records\": [", "\"models\": [", "\"model\": \"m\", \"target\": {",
                          "\"goal\": {\"top1\": 0.95, \"kl\": null}", "\"found\": true",
                          "\"recipe\": {\"policy\": \"xkv+kivi2\", \"save_as\": null, "
                          "\"label\": \"xkv+kivi2\", \"budget_pct\": 9.375",
                          "\"recipe\": {\"policy\": \"h2o\", \"save_as\": \"h2o+kivi2\", "
                          "\"label\": \"h2o>kivi2\", \"budget_pct\": 9.375",
                          "{\"policy\": \"h2o\", \"save_as\": \"h2o+kivi2\", \"label\": \"h2o>kivi2\", "
                          "\"budget_pct\": 9.375, \"status\": \"ok\"",
                          "\"status\": \"unsupported\"", "\"error\": \"a layer evicted per KV head\"",
                          "{\"policy\": \"xkv+kivi2\", \"save_as\": null, \"label\": \"xkv+kivi2\"",
                          "\"save_as_residual\": 16", "\"save_as_residual\": \"auto\"",
                          "\"snapshot_bytes\": 80", "\"ratio\": 0.08", "\"evaluations\": 7",
                          "\"seconds\": 12.5", "\"found\": false, \"recipe\": null"}) {
    EXPECT_NE(j.str().find(key), std::string::npos) << key << " in\n" << j.str();
  }
  EXPECT_NE(m.str().find("| m | top-1 >= 0.95 | xkv+kivi2 | 9.375% | 80 | 0.080 | 0.960 | 0.0040 | 7 |"),
            std::string::npos)
      << m.str();
  EXPECT_NE(m.str().find("| n | top-1 >= 0.95 | none meets it |"), std::string::npos) << m.str();
  EXPECT_NE(m.str().find("| s | top-1 >= 0.95 | h2o saved as h2o+kivi2 | 9.375% | 80 |"),
            std::string::npos)
      << m.str();
  // Per family: the converted one (2 trials, 1 passed) apart from the live one.
  EXPECT_NE(m.str().find("| h2o saved as h2o+kivi2 | 2 | 9.375% | 0.080 |"), std::string::npos)
      << m.str();
  EXPECT_NE(m.str().find("| xkv+kivi2 | 1 | 9.375% |"), std::string::npos) << m.str();
  // A family whose runs only failed says how (n: its one trial ran and missed the target).
  eval::TargetRecord only_refused = saved;
  only_refused.trials = {refused};
  eval::write_markdown(md, {}, {only_refused});
  std::stringstream m2;
  m2 << std::ifstream(md).rdbuf();
  EXPECT_NE(m2.str().find("| h2o saved as h2o+kivi2 | 1 | none passed (1 failed: unsupported) |"),
            std::string::npos)
      << m2.str();
  EXPECT_NE(m.str().find("keeps the live cache in policy P and writes its file converted"),
            std::string::npos)
      << m.str();
  EXPECT_NE(m.str().find("could not beat the best): kivi+kivi4."), std::string::npos) << m.str();
  EXPECT_NE(j.str().find("\"skipped\": [\"kivi+kivi4\"]"), std::string::npos) << j.str();
  EXPECT_NE(m.str().find("ladder (50, 25% of"), std::string::npos) << m.str();
  EXPECT_EQ(m.str().find("## Smallest snapshot at top-1 agreement >= 0.95"), std::string::npos);
  // The search's plot: a PNG (gnuplot from scripts/bootstrap.sh), its data and script removed;
  // an unwritable path is an error.
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "gnuplot not installed (scripts/bootstrap.sh installs gnuplot-nox)";
  }
  const std::string png = testing::TempDir() + "t.png";
  std::remove(png.c_str());
  eval::write_target_plot(png, {t, saved, none});
  std::ifstream f(png, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  EXPECT_FALSE(std::ifstream(png + ".dat").good());
  EXPECT_FALSE(std::ifstream(png + ".gp").good());
  EXPECT_THROW(eval::write_target_plot("/nonexistent/dir/t.png", {t}), llama::Error);
  std::remove(png.c_str());
}

}  // namespace
