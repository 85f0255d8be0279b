// Straightforward references shared by the representation kernel tests: double-precision softmax
// attention over dense rows, random data, f16 rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "util/half.h"

namespace kvsdk_test {

// out[r][d] = Σ_t softmax_t(q_r·k_t·scale)·v_t over tokens with position <= qpos[r].
inline std::vector<double> reference_attention(const std::vector<float>& q,
                                               const std::vector<int32_t>& qpos,
                                               const std::vector<float>& k,
                                               const std::vector<float>& v,
                                               const std::vector<int32_t>& pos, size_t dim,
                                               double scale) {
  const size_t rows = qpos.size(), n = pos.size();
  std::vector<double> out(rows * dim, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    std::vector<double> s(n, -std::numeric_limits<double>::infinity());
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t t = 0; t < n; ++t) {
      if (pos[t] > qpos[r]) continue;
      double d = 0;
      for (size_t x = 0; x < dim; ++x) d += double(q[r * dim + x]) * double(k[t * dim + x]);
      s[t] = d * scale;
      mx = std::max(mx, s[t]);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (size_t t = 0; t < n; ++t) {
      for (size_t x = 0; x < dim; ++x) out[r * dim + x] += s[t] / z * v[t * dim + x];
    }
  }
  return out;
}

inline double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    w += want[i] * want[i];
  }
  return std::sqrt(e / w);
}

inline std::vector<float> normal_rows(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(n);
  for (float& f : x) f = dist(rng);
  return x;
}

// Values as an f16 store holds them.
inline std::vector<float> f16_rounded(std::vector<float> x) {
  for (float& f : x) f = kvsdk::f16_to_f32(kvsdk::f32_to_f16(f));
  return x;
}

}  // namespace kvsdk_test
