// llama2.c legacy checkpoint: a 7 x int32 header, then f32 weights (see ../shared/models/README).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llama {

struct Config {
  int dim = 0;         // residual stream width
  int hidden_dim = 0;  // SwiGLU inner width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA when fewer than n_heads)
  int vocab_size = 0;  // always positive here; the sign in the file only says "separate classifier"
  int seq_len = 0;     // context the model was trained for
  bool shared_classifier = true;

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_dim(); }
};

// Weights as row-major [out][in] matrices pointing into one owned f32 buffer.
struct Weights {
  const float* token_embedding = nullptr;  // [vocab][dim]
  const float* rms_att = nullptr;          // [layers][dim]
  const float* wq = nullptr;               // [layers][dim][dim]
  const float* wk = nullptr;               // [layers][kv_dim][dim]
  const float* wv = nullptr;               // [layers][kv_dim][dim]
  const float* wo = nullptr;               // [layers][dim][dim]
  const float* rms_ffn = nullptr;          // [layers][dim]
  const float* w1 = nullptr;               // [layers][hidden][dim]
  const float* w2 = nullptr;               // [layers][dim][hidden]
  const float* w3 = nullptr;               // [layers][hidden][dim]
  const float* rms_final = nullptr;        // [dim]
  const float* wcls = nullptr;             // [vocab][dim]
};

class Model {
 public:
  // Loads a checkpoint. Throws llama::Error naming the file and the problem when it is missing,
  // truncated, too long, or its header is implausible.
  static Model load(const std::string& path);
  // A model of `config`'s shape with pseudo-random weights from `seed`, for benchmarks: decode
  // speed does not depend on the weights' values, so a model of a real LLM's shape can be timed
  // without its checkpoint (its text is noise). path() is "synthetic". Throws llama::Error for a
  // shape a checkpoint header could not have.
  static Model synthetic(const Config& config, uint64_t seed);

  const Config& config() const { return config_; }
  const Weights& weights() const { return weights_; }
  const std::string& path() const { return path_; }

 private:
  // Points weights_ into data_ in the checkpoint's order, skipping `skipped_before_classifier`
  // floats (a checkpoint's RoPE tables) before a separate classifier.
  void bind(size_t skipped_before_classifier);

  Config config_;
  Weights weights_;
  std::vector<float> data_;
  std::string path_;
};

}  // namespace llama
