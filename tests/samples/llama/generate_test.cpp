// Helpers the tools share: budget parsing, prompt encoding, model resolution, chunked prefill
// and the measured full-cache bytes per token.
#include <gtest/gtest.h>

#include <vector>

#include "error.h"
#include "generate.h"
#include "model_paths.h"
#include "test_util.h"

namespace {

TEST(LlamaGenerate, ParseBudgetAcceptsBytesAndPercent) {
  EXPECT_EQ(llama::parse_budget("1000", 5000), 1000u);
  EXPECT_EQ(llama::parse_budget("50%", 5000), 2500u);
  EXPECT_EQ(llama::parse_budget("100%", 5000), 5000u);
  EXPECT_EQ(llama::parse_budget("0.001%", 5000), 1u);  // never 0, which would mean unlimited
  for (const char* bad : {"", "abc", "-5", "0", "150%", "12kb", "50%%"}) {
    EXPECT_THROW(llama::parse_budget(bad, 5000), llama::Error) << bad;
  }
}

TEST(LlamaGenerate, ResolveModelNamesAndPaths) {
  std::string m, t;
  llama::resolve_model("shakespeare-base", "/b", "/s", &m, &t);
  EXPECT_EQ(m, "/b/shakespeare-base.bin");
  EXPECT_EQ(t, "/b/shakespeare-base.tok.bin");
  llama::resolve_model("stories260K", "/b", "/s", &m, &t);
  EXPECT_EQ(m, "/s/models/stories260K.bin");
  EXPECT_EQ(t, "/s/models/tok512.bin");
  llama::resolve_model("/x/my.bin", "/b", "/s", &m, &t);
  EXPECT_EQ(m, "/x/my.bin");
  EXPECT_EQ(t, "/x/my.tok.bin");
}

TEST(LlamaGenerate, FullBytesPerTokenMatchesTheCacheAndChunkingDoesNotChangeLogits) {
  const llama::Model model = llama::Model::load(kvsdk_test::bundled_model("shakespeare-small.bin"));
  const llama::Tokenizer tok =
      llama::Tokenizer::load(kvsdk_test::bundled_model("shakespeare-small.tok.bin"), 68);
  const std::vector<int> prompt = llama::encode_prompt(tok, "KING:\nSpeak.");
  EXPECT_EQ(prompt.size(), 12u);  // character level: no BOS, no dummy space

  auto ctx = kvsdk_test::make_context();
  std::vector<float> a(68), b(68);
  {
    llama::Session s(model, ctx.get(), nullptr);
    llama::prefill(s, prompt, 5, a.data());  // chunks 5 + 5 + 2
    kvsdk_cache_stats st{};
    st.struct_size = sizeof st;
    ASSERT_EQ(kvsdk_cache_stats_get(s.cache(), &st), KVSDK_OK);
    EXPECT_EQ(st.bytes, llama::full_cache_bytes_per_token(model) * prompt.size());
  }
  llama::Session s(model, ctx.get(), nullptr);
  llama::prefill(s, prompt, 64, b.data());  // one chunk
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4f) << i;
  EXPECT_THROW(llama::prefill(s, prompt, 0, nullptr), llama::Error);
}

}  // namespace
