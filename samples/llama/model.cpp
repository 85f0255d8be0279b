#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "error.h"

namespace llama {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Upper bounds that reject garbage headers before any allocation (far above the sample models).
constexpr int kMaxDim = 1 << 14;
constexpr int kMaxLayers = 1024;
constexpr int kMaxVocab = 1 << 20;
constexpr int kMaxSeqLen = 1 << 20;

void check_header(const Config& c, const std::string& path) {
  auto bad = [&](const std::string& why) {
    throw Error("model '" + path + "': invalid header (" + why + ")");
  };
  if (c.dim <= 0 || c.dim > kMaxDim) bad("dim " + std::to_string(c.dim));
  if (c.hidden_dim <= 0 || c.hidden_dim > 8 * kMaxDim) bad("hidden_dim " + std::to_string(c.hidden_dim));
  if (c.n_layers <= 0 || c.n_layers > kMaxLayers) bad("n_layers " + std::to_string(c.n_layers));
  if (c.n_heads <= 0 || c.dim % c.n_heads != 0) bad("n_heads " + std::to_string(c.n_heads));
  if (c.head_dim() % 2 != 0) bad("odd head_dim " + std::to_string(c.head_dim()));
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    bad("n_kv_heads " + std::to_string(c.n_kv_heads) + " does not divide n_heads");
  }
  if (c.vocab_size <= 0 || c.vocab_size > kMaxVocab) bad("vocab_size " + std::to_string(c.vocab_size));
  if (c.seq_len <= 0 || c.seq_len > kMaxSeqLen) bad("seq_len " + std::to_string(c.seq_len));
}

// Floats of every weight matrix and norm of `c`, in the checkpoint's order (without the RoPE
// tables a checkpoint stores before the classifier).
size_t weight_count(const Config& c) {
  const size_t L = size_t(c.n_layers), D = size_t(c.dim), H = size_t(c.hidden_dim);
  const size_t KV = size_t(c.kv_dim()), V = size_t(c.vocab_size);
  size_t n = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D + D;
  if (!c.shared_classifier) n += V * D;
  return n;
}

}  // namespace

void Model::bind(size_t skipped_before_classifier) {
  const Config& c = config_;
  const size_t L = size_t(c.n_layers), D = size_t(c.dim), H = size_t(c.hidden_dim);
  const size_t KV = size_t(c.kv_dim()), V = size_t(c.vocab_size);
  const float* p = data_.data();
  auto take = [&](size_t n) {
    const float* r = p;
    p += n;
    return r;
  };
  Weights& w = weights_;
  w.token_embedding = take(V * D);
  w.rms_att = take(L * D);
  w.wq = take(L * D * D);
  w.wk = take(L * KV * D);
  w.wv = take(L * KV * D);
  w.wo = take(L * D * D);
  w.rms_ffn = take(L * D);
  w.w1 = take(L * H * D);
  w.w2 = take(L * D * H);
  w.w3 = take(L * H * D);
  w.rms_final = take(D);
  take(skipped_before_classifier);  // a checkpoint's freq_cis tables: RoPE is recomputed instead
  w.wcls = c.shared_classifier ? w.token_embedding : take(V * D);
}

Model Model::synthetic(const Config& config, uint64_t seed) {
  Model m;
  m.path_ = "synthetic";
  m.config_ = config;
  check_header(config, m.path_);
  m.data_.resize(weight_count(config));
  m.bind(0);
  // xorshift64: fast and the same on every platform; the values only need a plausible scale.
  uint64_t x = seed | 1;
  // The weights view data_ as const; this writes them through data_ itself.
  auto at = [&m](const float* p) { return m.data_.data() + (p - m.data_.data()); };
  auto fill = [&x, &at](const float* weights, size_t n, float bound) {
    float* out = at(weights);
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      out[i] = bound * (float(x >> 40) * (2.0f / 16777216.0f) - 1.0f);  // uniform in [-b, b)
    }
  };
  const Config& c = config;
  const size_t L = size_t(c.n_layers), D = size_t(c.dim), H = size_t(c.hidden_dim);
  const size_t KV = size_t(c.kv_dim()), V = size_t(c.vocab_size);
  // Each linear map's weights uniform with variance 1/in (sqrt(3/in) bounds), so activations keep
  // their scale from layer to layer; the norms' gains are 1.
  const Weights& w = m.weights_;
  fill(w.token_embedding, V * D, 1.0f);
  const float in_d = std::sqrt(3.0f / float(D)), in_h = std::sqrt(3.0f / float(H));
  fill(w.wq, L * D * D, in_d);
  fill(w.wk, L * KV * D, in_d);
  fill(w.wv, L * KV * D, in_d);
  fill(w.wo, L * D * D, in_d);
  fill(w.w1, L * H * D, in_d);
  fill(w.w2, L * D * H, in_h);
  fill(w.w3, L * H * D, in_d);
  if (!c.shared_classifier) fill(w.wcls, V * D, in_d);
  for (const float* gains : {w.rms_att, w.rms_ffn}) std::fill_n(at(gains), L * D, 1.0f);
  std::fill_n(at(w.rms_final), D, 1.0f);
  return m;
}

Model Model::load(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error("model '" + path + "': cannot open the file");
  int32_t header[7];
  if (std::fread(header, sizeof(int32_t), 7, f.get()) != 7) {
    throw Error("model '" + path + "': file too short for the 28-byte header");
  }
  Model m;
  m.path_ = path;
  Config& c = m.config_;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  c.shared_classifier = header[5] > 0;
  c.vocab_size = header[5] > 0 ? header[5] : -header[5];
  c.seq_len = header[6];
  check_header(c, path);

  const size_t freq = size_t(c.seq_len) * size_t(c.head_dim() / 2);
  const size_t expected = weight_count(c) + 2 * freq;

  // The file must hold exactly the weights the header announces: a truncated download or a
  // header from another model shows up here instead of as garbage logits.
  if (std::fseek(f.get(), 0, SEEK_END) != 0) throw Error("model '" + path + "': cannot seek");
  const long size = std::ftell(f.get());
  const size_t want = 28 + expected * sizeof(float);
  if (size < 0 || size_t(size) != want) {
    throw Error("model '" + path + "': file has " + std::to_string(size) + " bytes but its header (dim " +
                std::to_string(c.dim) + ", layers " + std::to_string(c.n_layers) + ", vocab " +
                std::to_string(c.vocab_size) + ") needs " + std::to_string(want) +
                " (truncated or corrupt file?)");
  }
  std::fseek(f.get(), 28, SEEK_SET);
  m.data_.resize(expected);
  if (std::fread(m.data_.data(), sizeof(float), expected, f.get()) != expected) {
    throw Error("model '" + path + "': read error");
  }

  m.bind(2 * freq);
  return m;
}

}  // namespace llama
