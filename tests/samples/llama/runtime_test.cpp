// The reference runtime on real checkpoints: stories260K reproduces llama2.c's published greedy
// text, and the shakespeare models' logits through kvsdk match a naive forward pass that keeps
// its own K/V (rounded to f16, as kvsdk's exact tier stores them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "error.h"
#include "model.h"
#include "model_paths.h"
#include "ops.h"
#include "sampler.h"
#include "session.h"
#include "test_util.h"
#include "tokenizer.h"
#include "util/half.h"

namespace {

using kvsdk_test::bundled_model;
using kvsdk_test::shared_path;

float f16_round(float x) { return kvsdk::f16_to_f32(kvsdk::f32_to_f16(x)); }

// Textbook single-token forward pass in double precision with its own f16-rounded K/V.
class NaiveLlama {
 public:
  explicit NaiveLlama(const llama::Model& m) : m_(m) {
    const llama::Config& c = m.config();
    k_.resize(size_t(c.n_layers));
    v_.resize(size_t(c.n_layers));
  }

  std::vector<double> step(int token, int pos) {
    const llama::Config& c = m_.config();
    const llama::Weights& w = m_.weights();
    const int D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), hd = c.head_dim();
    std::vector<double> x(w.token_embedding + size_t(token) * D, w.token_embedding + size_t(token + 1) * D);
    for (int l = 0; l < c.n_layers; ++l) {
      std::vector<double> xb = rmsnorm(x, w.rms_att + size_t(l) * D);
      std::vector<double> q = matvec(w.wq + size_t(l) * D * D, xb, D);
      std::vector<double> k = matvec(w.wk + size_t(l) * KV * D, xb, KV);
      std::vector<double> v = matvec(w.wv + size_t(l) * KV * D, xb, KV);
      rope(q, hd, pos);
      rope(k, hd, pos);
      for (int i = 0; i < KV; ++i) {
        k_[size_t(l)].push_back(f16_round(float(k[size_t(i)])));
        v_[size_t(l)].push_back(f16_round(float(v[size_t(i)])));
      }
      const int T = pos + 1, group = c.n_heads / c.n_kv_heads;
      std::vector<double> att(size_t(D), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int g = h / group;
        std::vector<double> s(static_cast<size_t>(T));
        double mx = -1e300;
        for (int t = 0; t < T; ++t) {
          double d = 0;
          for (int i = 0; i < hd; ++i) {
            d += q[size_t(h * hd + i)] * k_[size_t(l)][size_t(t * KV + g * hd + i)];
          }
          s[size_t(t)] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[size_t(t)]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < hd; ++i) {
            att[size_t(h * hd + i)] += s[size_t(t)] / sum * v_[size_t(l)][size_t(t * KV + g * hd + i)];
          }
        }
      }
      std::vector<double> o = matvec(w.wo + size_t(l) * D * D, att, D);
      for (int i = 0; i < D; ++i) x[size_t(i)] += o[size_t(i)];
      xb = rmsnorm(x, w.rms_ffn + size_t(l) * D);
      std::vector<double> h1 = matvec(w.w1 + size_t(l) * H * D, xb, H);
      std::vector<double> h3 = matvec(w.w3 + size_t(l) * H * D, xb, H);
      for (int i = 0; i < H; ++i) {
        const double g = h1[size_t(i)];
        h1[size_t(i)] = g / (1 + std::exp(-g)) * h3[size_t(i)];
      }
      o = matvec(w.w2 + size_t(l) * D * H, h1, D);
      for (int i = 0; i < D; ++i) x[size_t(i)] += o[size_t(i)];
    }
    return matvec(w.wcls, rmsnorm(x, w.rms_final), c.vocab_size);
  }

 private:
  std::vector<double> rmsnorm(const std::vector<double>& x, const float* weight) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double scale = 1.0 / std::sqrt(ss / double(x.size()) + 1e-5);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = weight[i] * x[i] * scale;
    return out;
  }
  static std::vector<double> matvec(const float* w, const std::vector<double>& x, int rows) {
    std::vector<double> out(size_t(rows), 0.0);
    for (size_t r = 0; r < size_t(rows); ++r) {
      for (size_t i = 0; i < x.size(); ++i) out[r] += double(w[r * x.size() + i]) * x[i];
    }
    return out;
  }
  static void rope(std::vector<double>& x, int hd, int pos) {
    for (size_t h = 0; h < x.size() / size_t(hd); ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        const double angle = pos * std::pow(10000.0, -2.0 * i / hd);
        double* p = &x[h * size_t(hd) + size_t(2 * i)];
        const double a = p[0], b = p[1];
        p[0] = a * std::cos(angle) - b * std::sin(angle);
        p[1] = a * std::sin(angle) + b * std::cos(angle);
      }
    }
  }
  const llama::Model& m_;
  std::vector<std::vector<float>> k_, v_;
};

TEST(LlamaRuntime, Stories260KGreedyReproducesPublishedText) {
  const std::string model_path = shared_path("models/stories260K.bin");
  if (!kvsdk_test::file_exists(model_path)) {
    GTEST_SKIP() << "stories260K not found at " << model_path
                 << " (it lives in KVSDK_SHARED_DIR, which a fresh clone does not have)";
  }
  const llama::Model model = llama::Model::load(model_path);
  const llama::Tokenizer tok = llama::Tokenizer::load(shared_path("models/tok512.bin"),
                                                      model.config().vocab_size);
  auto ctx = kvsdk_test::make_context();
  llama::Session s(model, ctx.get(), nullptr);
  int token = llama::Tokenizer::kBos, prev = token;
  std::string text;
  for (int i = 0; i < 60; ++i) {
    const float* logits = s.step(token);
    prev = token;
    token = llama::argmax(logits, size_t(model.config().vocab_size));
    text += tok.decode(prev, token);
  }
  const std::string published =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high";
  // 60 tokens cover the published text up to "too high" (the README's sentence).
  EXPECT_EQ(text.substr(0, published.size()), published) << "generated: " << text;
}

// The tiled matmul (several weight rows x tokens per pass) gives dot()'s bits for every output,
// with row and token counts that leave partial tiles and an input length with a tail.
TEST(LlamaRuntime, MatmulGivesDotsBitsForEveryTileShape) {
  for (size_t in : {size_t(3), size_t(192), size_t(203)}) {
    const size_t out_dim = 11;
    std::vector<float> w(out_dim * in), x(7 * in);
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(float(i) * 0.37f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(float(i) * 0.11f);
    for (size_t n = 1; n <= 7; ++n) {
      std::vector<float> out(n * out_dim);
      llama::ops::matmul(out.data(), x.data(), w.data(), n, in, out_dim);
      for (size_t t = 0; t < n; ++t) {
        for (size_t o = 0; o < out_dim; ++o) {
          const float want = llama::ops::dot(w.data() + o * in, x.data() + t * in, in);
          ASSERT_EQ(std::memcmp(&out[t * out_dim + o], &want, sizeof want), 0)
              << "in " << in << " tokens " << n << " row " << o << " token " << t;
        }
      }
    }
  }
}

// `model`'s logits through kvsdk (a prefill chunk of 24 tokens, then steps) against NaiveLlama's
// for `tokens`; returns the largest difference.
double worst_vs_naive(const llama::Model& model, const std::vector<int>& tokens) {
  const size_t V = size_t(model.config().vocab_size);

  // kvsdk path: a 24-token prefill chunk, then single-token steps (both code paths).
  auto ctx = kvsdk_test::make_context();
  llama::Session s(model, ctx.get(), nullptr);
  std::vector<float> logits(tokens.size() * V);
  const size_t prefill = 24;
  s.forward(tokens.data(), prefill, logits.data(), /*all_logits=*/true);
  for (size_t t = prefill; t < tokens.size(); ++t) {
    const float* l = s.step(tokens[t]);
    std::copy_n(l, V, logits.data() + t * V);
  }
  EXPECT_EQ(s.position(), int(tokens.size()));

  NaiveLlama naive(model);
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<double> ref = naive.step(tokens[t], int(t));
    for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(ref[i] - logits[t * V + i]));
  }
  return worst;
}

void expect_matches_naive(const std::string& name) {
  const llama::Model model = llama::Model::load(bundled_model(name + ".bin"));
  const llama::Tokenizer tok = llama::Tokenizer::load(bundled_model(name + ".tok.bin"),
                                                      model.config().vocab_size);
  const std::vector<int> tokens = tok.encode("ROMEO:\nBut soft, what light through yonder window", false);
  ASSERT_GE(tokens.size(), 40u);
  const double worst = worst_vs_naive(model, tokens);
  // Only f32 summation order separates the two (K/V rounding is the same): logits of magnitude
  // ~10 agree to a few 1e-4.
  EXPECT_LT(worst, 2e-3) << name;
  std::printf("%s: max |logit - naive| = %.3g over %zu tokens\n", name.c_str(), worst, tokens.size());
}

TEST(LlamaRuntime, ShakespeareSmallLogitsMatchNaiveForward) { expect_matches_naive("shakespeare-small"); }
TEST(LlamaRuntime, ShakespeareBaseLogitsMatchNaiveForward) { expect_matches_naive("shakespeare-base"); }

TEST(LlamaRuntime, KvsdkCacheHoldsEveryTokenOfEveryLayer) {
  const llama::Model model = llama::Model::load(bundled_model("shakespeare-small.bin"));
  auto ctx = kvsdk_test::make_context();
  llama::Session s(model, ctx.get(), nullptr);
  const std::vector<int> tokens(10, 5);
  s.forward(tokens.data(), tokens.size(), nullptr);
  kvsdk_cache_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(kvsdk_cache_stats_get(s.cache(), &st), KVSDK_OK);
  EXPECT_EQ(st.appended_tokens, 10u * uint64_t(model.config().n_layers));
  EXPECT_GT(st.bytes, 0u);
}

// A pass without logits stops the last layer after its attention (run_layers' early stop, which
// SmallKV's proxy always takes): every layer's cache rows and the logits of a later step must be
// those of a session that computed logits at every token.
TEST(LlamaRuntime, ForwardWithoutLogitsLeavesTheSameCacheAndLaterLogits) {
  const llama::Model model = llama::Model::load(bundled_model("shakespeare-base.bin"));
  const llama::Config& c = model.config();
  auto ctx = kvsdk_test::make_context();
  llama::Session with(model, ctx.get(), nullptr), without(model, ctx.get(), nullptr);
  const std::vector<int> prompt = {20, 45, 50, 50, 53, 1, 61, 53, 56, 50, 42};
  // A chunk of several rows, then single tokens, the same way in both sessions.
  std::vector<float> chunk_logits(size_t(c.vocab_size));
  with.forward(prompt.data(), 5, chunk_logits.data());
  without.forward(prompt.data(), 5, nullptr);
  for (size_t t = 5; t < prompt.size(); ++t) {
    with.step(prompt[t]);
    without.forward(&prompt[t], 1, nullptr);
  }
  for (uint32_t l = 0; l < uint32_t(c.n_layers); ++l) {
    for (uint32_t h = 0; h < uint32_t(c.n_kv_heads); ++h) {
      const size_t cap = prompt.size(), n = cap * size_t(c.head_dim());
      std::vector<float> k1(n), v1(n), k2(n), v2(n);
      std::vector<int32_t> p1(cap), p2(cap);
      size_t n1 = 0, n2 = 0;
      ASSERT_EQ(kvsdk_cache_read(with.cache(), l, h, k1.data(), v1.data(), p1.data(), cap, &n1),
                KVSDK_OK);
      ASSERT_EQ(kvsdk_cache_read(without.cache(), l, h, k2.data(), v2.data(), p2.data(), cap, &n2),
                KVSDK_OK);
      ASSERT_EQ(n1, prompt.size());
      ASSERT_EQ(n2, n1);
      EXPECT_EQ(p1, p2);
      EXPECT_EQ(0, std::memcmp(k1.data(), k2.data(), n * sizeof(float))) << "layer " << l;
      EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * sizeof(float))) << "layer " << l;
    }
  }
  const float* a = with.step(47);
  const std::vector<float> la(a, a + c.vocab_size);
  const float* b = without.step(47);
  EXPECT_EQ(0, std::memcmp(la.data(), b, la.size() * sizeof(float)));
}

TEST(LlamaRuntime, BudgetFailureIsReportedAndPoisonsTheSession) {
  const llama::Model model = llama::Model::load(bundled_model("shakespeare-small.bin"));
  auto ctx = kvsdk_test::make_context(/*budget=*/1000);  // less than one token of all layers
  llama::Session s(model, ctx.get(), nullptr);
  const std::vector<int> tokens(8, 5);
  try {
    s.forward(tokens.data(), tokens.size(), nullptr);
    FAIL() << "expected KVSDK_E_BUDGET";
  } catch (const llama::KvsdkError& e) {
    EXPECT_EQ(e.status(), KVSDK_E_BUDGET);
  }
  EXPECT_THROW(s.step(5), llama::Error);
}

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The synthetic model of runtime_bench (Llama-3-8B-like layers, pseudo-random weights) at a small
// size: the same weights for the same seed, every linear map at its stated bound, unit norm
// gains, and a model the runtime runs like a checkpoint (kvsdk's logits match the naive pass).
TEST(LlamaRuntime, SyntheticModelIsSeededBoundedAndRunsLikeACheckpoint) {
  llama::Config c;
  c.dim = 64;
  c.hidden_dim = 160;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 50;
  c.seq_len = 256;
  const llama::Model a = llama::Model::synthetic(c, 7), b = llama::Model::synthetic(c, 7);
  const llama::Model other = llama::Model::synthetic(c, 8);
  EXPECT_EQ(a.config().dim, 64);
  EXPECT_EQ(a.path(), "synthetic");
  const size_t n1 = size_t(c.n_layers) * size_t(c.hidden_dim) * size_t(c.dim);
  EXPECT_EQ(0, std::memcmp(a.weights().w1, b.weights().w1, n1 * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.weights().w1, other.weights().w1, n1 * sizeof(float)));
  EXPECT_EQ(a.weights().wcls, a.weights().token_embedding);  // shared classifier
  const float bound_d = std::sqrt(3.0f / float(c.dim)), bound_h = std::sqrt(3.0f / float(c.hidden_dim));
  float max_w1 = 0, max_w2 = 0;
  for (size_t i = 0; i < n1; ++i) {
    max_w1 = std::max(max_w1, std::fabs(a.weights().w1[i]));
    max_w2 = std::max(max_w2, std::fabs(a.weights().w2[i]));
  }
  EXPECT_LE(max_w1, bound_d);
  EXPECT_GT(max_w1, 0.9f * bound_d);  // spread over the range, not a constant
  EXPECT_LE(max_w2, bound_h);
  EXPECT_GT(max_w2, 0.9f * bound_h);
  for (int i = 0; i < c.n_layers * c.dim; ++i) ASSERT_EQ(a.weights().rms_ffn[i], 1.0f);
  std::vector<int> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int(i * 7 % size_t(c.vocab_size));
  EXPECT_LT(worst_vs_naive(a, tokens), 2e-3);

  c.n_kv_heads = 3;  // does not divide the query heads: refused as a checkpoint header would be
  try {
    llama::Model::synthetic(c, 7);
    ADD_FAILURE() << "a synthetic model with 3 KV heads for 4 query heads should be refused";
  } catch (const llama::Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_heads"), std::string::npos) << e.what();
  }
}

TEST(LlamaRuntime, MissingAndCorruptModelFilesGiveClearErrors) {
  auto expect_error = [](const std::string& path, const std::string& needle) {
    try {
      llama::Model::load(path);
      ADD_FAILURE() << "loading " << path << " should fail";
    } catch (const llama::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("/nonexistent/model.bin", "cannot open");
  const std::string good = read_file(bundled_model("shakespeare-small.bin"));
  expect_error(temp_file("short.bin", good.substr(0, 10)), "too short");
  expect_error(temp_file("truncated.bin", good.substr(0, good.size() - 4)), "truncated or corrupt");
  expect_error(temp_file("long.bin", good + "xxxx"), "truncated or corrupt");
  std::string bad_header = good;
  const int32_t zero_heads = 0;
  bad_header.replace(12, 4, reinterpret_cast<const char*>(&zero_heads), 4);
  expect_error(temp_file("header.bin", bad_header), "invalid header");
}

TEST(LlamaRuntime, TokenizerErrorsAndCharacterLevelRoundTrip) {
  const std::string tok_path = bundled_model("shakespeare-small.tok.bin");
  EXPECT_THROW(llama::Tokenizer::load("/nonexistent/tok.bin", 68), llama::Error);
  EXPECT_THROW(llama::Tokenizer::load(tok_path, 512), llama::Error);  // another model's size
  EXPECT_THROW(llama::Tokenizer::load(tok_path, 10), llama::Error);
  const std::string good = read_file(tok_path);
  EXPECT_THROW(llama::Tokenizer::load(temp_file("tok_short.bin", good.substr(0, good.size() - 1)), 68),
               llama::Error);

  const llama::Tokenizer tok = llama::Tokenizer::load(tok_path, 68);
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.";
  const std::vector<int> ids = tok.encode(text, false);
  ASSERT_EQ(ids.size(), text.size());  // one token per character
  EXPECT_EQ(ids[0], 3 + 2 + 11 + 5);  // 'F': after \n, space, 11 marks (!$&',-.3:;?), A..E
  std::string back;
  for (size_t i = 0; i < ids.size(); ++i) back += tok.decode(i ? ids[i - 1] : -1, ids[i]);
  EXPECT_EQ(back, text);
  EXPECT_EQ(tok.encode("7", false), std::vector<int>{llama::Tokenizer::kUnk});  // not in corpus
}

TEST(LlamaRuntime, Stories260KTokenizerMergesByScore) {
  const std::string path = shared_path("models/tok512.bin");
  if (!kvsdk_test::file_exists(path)) GTEST_SKIP() << "tok512.bin not found at " << path;
  const llama::Tokenizer tok = llama::Tokenizer::load(path, 512);
  const std::vector<int> ids = tok.encode("Once upon a time", true);
  std::string back;
  for (int id : ids) back += tok.piece(id);
  EXPECT_EQ(back, " Once upon a time");
  EXPECT_LT(ids.size(), 10u);  // merged well below one token per character
}

}  // namespace
