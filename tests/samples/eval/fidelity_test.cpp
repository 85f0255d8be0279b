// Smoke test of the fidelity evaluation on a short text with the bundled shakespeare-small:
// the full cache at 100% agrees with itself exactly, a budget the policy cannot meet is
// reported (not crashed), and the metric helpers compute what they claim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "context_handle.h"
#include "error.h"
#include "fidelity.h"
#include "model.h"
#include "report.h"
#include "session.h"
#include "tokenizer.h"

namespace {

std::string bundled(const std::string& f) { return std::string(KVSDK_SOURCE_DIR) + "/samples/models/" + f; }

std::vector<int> short_text(const llama::Tokenizer& tok, size_t n) {
  std::ifstream f(std::string(KVSDK_SOURCE_DIR) + "/tests/samples/eval/short_text.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int> t = tok.encode(ss.str(), false);
  t.resize(n);
  return t;
}

class FidelitySmoke : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new llama::Model(llama::Model::load(bundled("shakespeare-small.bin")));
    const llama::Tokenizer tok = llama::Tokenizer::load(bundled("shakespeare-small.tok.bin"), 68);
    eval::Schedule s;
    s.prompt_tokens = 48;
    s.chunk = 16;
    ref_ = new eval::Reference(eval::build_reference(*model_, short_text(tok, 64), s));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete model_;
  }
  static llama::Model* model_;
  static eval::Reference* ref_;
};
llama::Model* FidelitySmoke::model_ = nullptr;
eval::Reference* FidelitySmoke::ref_ = nullptr;

TEST_F(FidelitySmoke, ReferenceIsConsistent) {
  EXPECT_EQ(ref_->continuation.size(), 64u);
  EXPECT_EQ(ref_->full_logits.size(), 16u * 68u);  // one distribution per generated token
  EXPECT_GT(ref_->ppl_full, 1.0);
  EXPECT_LT(ref_->ppl_full, 68.0);  // a trained model beats the uniform distribution
  EXPECT_GT(ref_->full_cache_bytes, 0u);
}

TEST_F(FidelitySmoke, FullCacheAtFullBudgetAgreesExactly) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "full"), KVSDK_OK);
  const eval::Outcome out = eval::evaluate(*model_, *ref_, p, ref_->full_cache_bytes);
  ASSERT_TRUE(out.ok) << out.error;
  EXPECT_EQ(out.top1_agreement, 1.0);
  EXPECT_EQ(out.kl, 0.0);
  EXPECT_EQ(out.ppl, ref_->ppl_full);
  EXPECT_EQ(out.cache_bytes, ref_->full_cache_bytes);
}

// The scored steps run on a cache saved after every prompt token but the last and loaded back:
// the full cache's resume snapshot is the reference's snapshot at that point, byte for byte in
// size, and the loaded cache still agrees exactly (checked above). SpeCache resumes with its
// backing store and decodes on the loaded cache (its fetch statistics come from there).
TEST_F(FidelitySmoke, ScoredStepsRunOnTheCacheLoadedFromTheResumeSnapshot) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "full"), KVSDK_OK);
  const eval::Outcome full = eval::evaluate(*model_, *ref_, p, 0);
  ASSERT_TRUE(full.ok) << full.error;
  EXPECT_GT(ref_->full_snapshot_bytes, 0u);
  EXPECT_EQ(full.snapshot_bytes, ref_->full_snapshot_bytes);

  ASSERT_EQ(kvsdk_policy_parse(&p, "specache"), KVSDK_OK);
  const eval::Outcome spec = eval::evaluate(*model_, *ref_, p, 0);
  ASSERT_TRUE(spec.ok) << spec.error;
  EXPECT_GT(spec.snapshot_bytes, 0u);
  EXPECT_GE(spec.fetch_hit_rate, 0.0);
  EXPECT_GE(spec.top1_agreement, 0.9);
}

TEST_F(FidelitySmoke, BudgetTheFullPolicyCannotMeetIsRecordedAsFailure) {
  kvsdk_policy p;
  ASSERT_EQ(kvsdk_policy_parse(&p, "full"), KVSDK_OK);
  const eval::Outcome out = eval::evaluate(*model_, *ref_, p, ref_->full_cache_bytes / 2);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.status, KVSDK_E_BUDGET);
  EXPECT_NE(out.error.find("budget"), std::string::npos) << out.error;
  EXPECT_LE(out.cache_bytes, ref_->full_cache_bytes / 2);  // never above the budget
}

// With a save target, the scored cache is the one loaded from the converted snapshot: full saved
// as KIVI-2 (residual 16 rows) gives exactly the bytes of a targeted save of the same cache with
// room (what `kvsdk recompress` writes), and the continuation no longer agrees exactly (the
// quantized rows are what it attends to). (At 47 rows the KIVI file is not smaller than the f16
// one: too few rows to amortize its scales.)
TEST_F(FidelitySmoke, SaveAsScoresTheConvertedSnapshot) {
  kvsdk_policy full, kivi;
  ASSERT_EQ(kvsdk_policy_parse(&full, "full"), KVSDK_OK);
  ASSERT_EQ(kvsdk_policy_parse(&kivi, "kivi+kivi2"), KVSDK_OK);
  kivi.quant_residual = 16;
  const eval::Outcome out = eval::evaluate(*model_, *ref_, full, ref_->full_cache_bytes, false,
                                           nullptr, /*with_ppl=*/false, &kivi);
  ASSERT_TRUE(out.ok) << out.error;
  EXPECT_NE(out.snapshot_bytes, ref_->full_snapshot_bytes);
  EXPECT_GT(out.kl, 0.0);

  // The same prefix (every prompt token but the last, in the schedule's chunks) on an unlimited
  // full cache, saved with the same target.
  llama::ContextHandle ctx(0);
  llama::Session s(*model_, ctx.ctx, &full);
  const size_t resume = ref_->schedule.prompt_tokens - 1;
  for (size_t t = 0; t < resume;) {
    const size_t n = std::min(ref_->schedule.chunk, resume - t);
    s.forward(ref_->continuation.data() + t, n, nullptr);
    t += n;
  }
  kvsdk_save_options o;
  ASSERT_EQ(kvsdk_save_options_init(&o), KVSDK_OK);
  o.target_policy = &kivi;
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(s.cache(), &o, nullptr, 0, &size), KVSDK_OK)
      << kvsdk_last_error();
  EXPECT_EQ(out.snapshot_bytes, size);
}

// A target the library refuses is a failed outcome with its status and reason, not a crash:
// smallkv cannot be a save target (it needs its proxy cache).
TEST_F(FidelitySmoke, RefusedSaveTargetIsRecordedAsFailure) {
  kvsdk_policy full, smallkv;
  ASSERT_EQ(kvsdk_policy_parse(&full, "full"), KVSDK_OK);
  ASSERT_EQ(kvsdk_policy_parse(&smallkv, "smallkv"), KVSDK_OK);
  const eval::Outcome out =
      eval::evaluate(*model_, *ref_, full, 0, false, nullptr, /*with_ppl=*/false, &smallkv);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.status, KVSDK_E_UNSUPPORTED);
  EXPECT_NE(out.error.find("kvsdk_cache_save_to_buffer"), std::string::npos) << out.error;
}

TEST(FidelityMetrics, PerplexityAndKl) {
  // Uniform logits over 4 tokens: perplexity 4 whatever the text.
  const std::vector<float> uniform(3 * 4, 0.5f);
  EXPECT_NEAR(eval::perplexity(uniform, {0, 1, 2}, 4), 4.0, 1e-9);
  const float p[2] = {0.0f, 0.0f};         // (1/2, 1/2)
  const float q[2] = {std::log(3.0f), 0};  // (3/4, 1/4)
  const double expected = 0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25);
  EXPECT_NEAR(eval::kl_divergence(p, q, 2), expected, 1e-6);
  EXPECT_EQ(eval::kl_divergence(p, p, 2), 0.0);
}

TEST(FidelityReport, JsonAndMarkdownHoldTheRecords) {
  eval::Record ok;
  ok.model = "m";
  ok.policy = "full";
  ok.budget_pct = 100;
  ok.ok = true;
  ok.status = "ok";
  ok.cache_bytes = ok.full_cache_bytes = 1000;
  ok.ppl = ok.ppl_full = 3.5;
  ok.top1_agreement = 1.0;
  eval::Record failed = ok;
  failed.budget_pct = 5;
  failed.ok = false;
  failed.status = "memory budget exceeded";
  failed.error = "a \"quoted\" detail";
  const std::string json = testing::TempDir() + "r.json", md = testing::TempDir() + "r.md";
  eval::write_json(json, {ok, failed});
  eval::write_markdown(md, {ok, failed});
  std::stringstream j, m;
  j << std::ifstream(json).rdbuf();
  m << std::ifstream(md).rdbuf();
  for (const char* key : {"\"model\": \"m\"", "\"policy\": \"full\"", "\"budget_pct\": 100",
                          "\"cache_bytes\": 1000", "\"full_cache_bytes\": 1000", "\"ppl\": 3.5",
                          "\"ppl_full\": 3.5", "\"top1_agreement\": 1", "\"kl\": 0",
                          "\"cache_bytes\": null", "\\\"quoted\\\""}) {
    EXPECT_NE(j.str().find(key), std::string::npos) << key << " in\n" << j.str();
  }
  EXPECT_NE(m.str().find("| full | 100% |"), std::string::npos) << m.str();
  EXPECT_NE(m.str().find("failed (memory budget exceeded)"), std::string::npos) << m.str();
  EXPECT_THROW(eval::write_json("/nonexistent/dir/r.json", {ok}), llama::Error);
}

}  // namespace
