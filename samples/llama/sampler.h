// Next-token choice: greedy argmax, or temperature sampling from a seeded generator so that runs
// are reproducible (the evaluation's self-generated stories260K text relies on it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace llama {

// Index of the largest logit (the first one on ties).
int argmax(const float* logits, size_t n);

class Sampler {
 public:
  // temperature 0 means greedy.
  Sampler(float temperature, uint64_t seed) : temperature_(temperature), state_(seed ? seed : 1) {}
  int sample(const float* logits, size_t n);
  // The generator's state: a Sampler built with it as the seed continues the same sequence
  // (the demo hands it to the process that resumes the conversation).
  uint64_t state() const { return state_; }

 private:
  float next_uniform();  // xorshift64*, in [0, 1)
  float temperature_;
  uint64_t state_;
};

}  // namespace llama
