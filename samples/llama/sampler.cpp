#include "sampler.h"

#include <cmath>
#include <vector>

#include "ops.h"

namespace llama {

int argmax(const float* logits, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return int(best);
}

float Sampler::next_uniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return float((state_ * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

int Sampler::sample(const float* logits, size_t n) {
  if (temperature_ <= 0.0f) return argmax(logits, n);
  std::vector<float> p(logits, logits + n);
  for (float& x : p) x /= temperature_;
  ops::softmax(p.data(), n);
  const float r = next_uniform();
  float cdf = 0;
  for (size_t i = 0; i < n; ++i) {
    cdf += p[i];
    if (r < cdf) return int(i);
  }
  return int(n - 1);  // rounding left r above the last partial sum
}

}  // namespace llama
