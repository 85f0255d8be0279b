// kvsdk-eval --target's search (samples/eval/target_search.h) on synthetic fidelity curves:
// it finds the smallest passing budget within the bisection's resolution where fidelity is
// monotone, never reports a failing or an unmeasured point (also where fidelity is not
// monotone), reports none when nothing passes, and prunes what cannot win. Then one small real
// search on the bundled shakespeare-small through eval::evaluate.
#include <gtest/gtest.h>

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
  EXPECT_EQ(r.trials.size(), 4u);  // 50, then 75, 87.5, 93.75
}

TEST(TargetSearch, KlTargetAndOneExactCase) {
  // Threshold 9%: 50, 25, 12.5 pass, 6.25 fails; bisection 9.375 (pass), 7.8125 (fail),
  // 8.59375 (fail): the smallest passing budget measured is 9.375%.
  const SearchResult r = eval::search({Family{"evict", true, -1}}, eval::parse_target("kl=0.01"),
                                      SearchOptions{},
                                      [](size_t, double b) { return step_curve(b, 9.0); });
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.budget_pct, 9.375);
  EXPECT_EQ(r.best.snapshot_bytes, 9375u);
  std::vector<double> budgets;
  for (const eval::Trial& x : r.trials) budgets.push_back(x.point.budget_pct);
  EXPECT_EQ(budgets, (std::vector<double>{50, 25, 12.5, 6.25, 9.375, 7.8125, 8.59375}));
}

// Non-monotone fidelity: passes above 20% and again in [3, 5]. The search assumes monotonicity,
// so it stops below the first failure (it may miss [3, 5]), but what it reports passes and was
// measured.
TEST(TargetSearch, NonMonotoneCurveNeverReportsAFailingOrUnmeasuredPoint) {
  auto curve = [](double b) {
    Point p;
    p.ok = true;
    p.snapshot_bytes = uint64_t(b * 1000);
    const bool pass = b >= 20.0 || (b >= 3.0 && b <= 5.0);
    p.top1 = pass ? 0.99 : 0.5;
    return p;
  };
  const SearchResult r = eval::search({Family{"wobbly", true, -1}}, top1(0.95), SearchOptions{},
                                      [&](size_t, double b) { return curve(b); });
  expect_sound(r, top1(0.95));
  ASSERT_TRUE(r.found);
  EXPECT_GE(r.best.budget_pct, 20.0);
  EXPECT_LE(r.best.budget_pct, 25.0);
  for (const eval::Trial& x : r.trials) EXPECT_GT(x.point.budget_pct, 12.4);  // never below a fail

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
  // 50% fails for both budgeted families: 3 bisection steps between 100% (unmeasured) and 50%
  // each, then the fixed family once at 100%.
  EXPECT_EQ(r.trials.size(), 4u + 4u + 1u);
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
  // 30%: fails at 25% with 25000 bytes >= best 20000, so its bisection is pruned. 4: budgeted,
  // threshold 9%: wins at 9.375% (9375 bytes).
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
  EXPECT_EQ(calls[3], 2);         // 50% (pass, 50000 bytes), 25% (fail); bisection pruned
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
  std::vector<std::string> specs;
  for (const Family& x : f) specs.push_back(x.spec);
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

// One small real search: shakespeare-small on a 64-token text (as FidelitySmoke), the full cache
// and xkv. Every reported number is a real measurement: the recipe re-evaluated at its budget
// gives the same snapshot and metrics, and it meets the target.
TEST(TargetSearchReal, SmallSearchOnTheBundledModel) {
  const std::string dir = std::string(KVSDK_SOURCE_DIR) + "/samples/models/";
  const llama::Model model = llama::Model::load(dir + "shakespeare-small.bin");
  const llama::Tokenizer tok = llama::Tokenizer::load(dir + "shakespeare-small.tok.bin", 68);
  std::ifstream in(std::string(KVSDK_SOURCE_DIR) + "/tests/samples/eval/short_text.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int> text = tok.encode(ss.str(), false);
  text.resize(64);
  eval::Schedule s;
  s.prompt_tokens = 48;
  const eval::Reference ref = eval::build_reference(model, text, s);
  const std::vector<Family> families = eval::expand_families(
      {"full", "xkv"}, [](const std::string&, const kvsdk_policy&) { return true; });
  ASSERT_EQ(families.size(), 2u);
  const Target target = eval::parse_target("top1=0.9,kl=0.05");
  auto run = [&](size_t f, double pct) {
    kvsdk_policy p;
    EXPECT_EQ(kvsdk_policy_parse(&p, families[f].spec.c_str()), KVSDK_OK);
    const eval::Outcome out = eval::evaluate(
        model, ref, p, std::max<uint64_t>(1, uint64_t(double(ref.full_cache_bytes) * pct / 100.0)),
        false, nullptr, /*with_ppl=*/false);
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
  eval::TargetRecord none = t;
  none.model = "n";
  none.found = false;
  none.trials[0].passed = false;
  none.skipped = {"kivi+kivi4"};
  const std::string json = testing::TempDir() + "t.json", md = testing::TempDir() + "t.md";
  eval::write_json(json, {}, {t, none});
  eval::write_markdown(md, {}, {t, none});
  std::stringstream j, m;
  j << std::ifstream(json).rdbuf();
  m << std::ifstream(md).rdbuf();
  for (const char* key : {"{\"records\": [", "\"models\": [", "\"model\": \"m\", \"target\": {",
                          "\"goal\": {\"top1\": 0.95, \"kl\": null}", "\"found\": true",
                          "\"recipe\": {\"policy\": \"xkv+kivi2\", \"budget_pct\": 9.375",
                          "\"snapshot_bytes\": 80", "\"ratio\": 0.08", "\"evaluations\": 7",
                          "\"seconds\": 12.5", "\"found\": false, \"recipe\": null"}) {
    EXPECT_NE(j.str().find(key), std::string::npos) << key << " in\n" << j.str();
  }
  EXPECT_NE(m.str().find("| m | top-1 >= 0.95 | xkv+kivi2 | 9.375% | 80 | 0.080 | 0.960 | 0.0040 | 7 |"),
            std::string::npos)
      << m.str();
  EXPECT_NE(m.str().find("| n | top-1 >= 0.95 | none meets it |"), std::string::npos) << m.str();
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
  eval::write_target_plot(png, {t, none});
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
