// KIVI quantization kernels against references written here: half-step error bound at 8/4/2
// bits, the exact SpeCache 1-bit levels, bit packing layout and round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kivi_quant.h"
#include "reference_attention.h"
#include "util/half.h"

using namespace kvsdk::cpu;
using kvsdk::f16_to_f32;
using kvsdk::f32_to_f16;
using kvsdk_test::normal_rows;

namespace {

TEST(KiviPack, KnownLayoutIsLsbFirst) {
  const uint8_t codes2[4] = {1, 2, 3, 0};
  uint8_t packed = 0xff;
  kivi_pack(codes2, 4, 2, &packed);
  EXPECT_EQ(packed, 0x39);  // 01 | 10<<2 | 11<<4 | 00<<6
  const uint8_t codes4[3] = {0xa, 0x5, 0xf};
  uint8_t p4[2] = {0xff, 0xff};
  kivi_pack(codes4, 3, 4, p4);
  EXPECT_EQ(p4[0], 0x5a);
  EXPECT_EQ(p4[1], 0x0f);  // padding bits are zero
  const uint8_t codes1[9] = {1, 0, 0, 0, 0, 0, 0, 1, 1};
  uint8_t p1[2];
  kivi_pack(codes1, 9, 1, p1);
  EXPECT_EQ(p1[0], 0x81);
  EXPECT_EQ(p1[1], 0x01);
}

TEST(KiviPack, RoundTripAllWidthsAndOddLengths) {
  std::mt19937 rng(5);
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    for (size_t n : {1u, 3u, 7u, 8u, 31u, 128u, 129u}) {
      std::vector<uint8_t> codes(n), back(n);
      for (uint8_t& c : codes) c = uint8_t(rng() & ((1u << bits) - 1u));
      std::vector<uint8_t> packed(kivi_packed_bytes(n, bits));
      EXPECT_EQ(packed.size(), (n * bits + 7) / 8);
      kivi_pack(codes.data(), n, bits, packed.data());
      kivi_unpack(packed.data(), n, bits, back.data());
      EXPECT_EQ(back, codes) << "bits " << bits << " n " << n;
    }
  }
}

TEST(KiviQuant, GroupCoversRangeAndErrorWithinHalfStep) {
  for (uint32_t bits : {2u, 4u, 8u}) {
    const std::vector<float> x = normal_rows(64, bits, 3.0f);
    const float mn = *std::min_element(x.begin(), x.end());
    const float mx = *std::max_element(x.begin(), x.end());
    const KiviGroupParams p = kivi_group_params(mn, mx, bits);
    const float s = f16_to_f32(p.scale_f16), z = f16_to_f32(p.zero_f16);
    const float levels = float((1u << bits) - 1u);
    EXPECT_LE(z, mn);
    EXPECT_GE(z + levels * s, mx);
    // The stored step is the ideal (max-min)/L up to f16 rounding.
    EXPECT_NEAR(s, (mx - mn) / levels, (mx - mn) / levels * 2e-3 + 1e-4);
    for (float v : x) {
      const uint8_t c = kivi_code(v, s, z, bits);
      EXPECT_LE(c, levels);
      EXPECT_LE(std::fabs(kivi_dequant(c, s, z) - v), 0.5f * s * (1 + 1e-5f)) << v;
    }
  }
}

TEST(KiviQuant, KeysPerChannelValuesPerTokenWithinHalfStep) {
  const size_t G = 32, dim = 64;
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    std::vector<float> k = normal_rows(G * dim, 10 + bits), v = normal_rows(G * dim, 20 + bits);
    for (size_t t = 0; t < G; ++t) k[t * dim + 3] *= 20.0f;  // an outlier channel
    const size_t rb = kivi_packed_bytes(dim, bits);
    std::vector<uint8_t> kc(G * rb), vc(G * rb);
    std::vector<uint16_t> ks(dim), kz(dim), vs(G * 2), vz(G * 2);
    kivi_quantize_keys(k.data(), G, dim, bits, kc.data(), ks.data(), kz.data());
    kivi_quantize_values(v.data(), G, dim, G, bits, vc.data(), vs.data(), vz.data());
    std::vector<float> kd(G * dim), vd(G * dim);
    kivi_dequantize_keys(kc.data(), ks.data(), kz.data(), 0, G, dim, bits, kd.data());
    kivi_dequantize_values(vc.data(), vs.data(), vz.data(), G, dim, G, bits, vd.data());
    for (size_t t = 0; t < G; ++t) {
      for (size_t c = 0; c < dim; ++c) {
        // Reference step of the key group (channel c over the block) and the value group.
        float kmn = k[c], kmx = k[c];
        for (size_t u = 0; u < G; ++u) {
          kmn = std::min(kmn, k[u * dim + c]);
          kmx = std::max(kmx, k[u * dim + c]);
        }
        const size_t g0 = (c / G) * G;
        const float vmn = *std::min_element(&v[t * dim + g0], &v[t * dim + g0 + G]);
        const float vmx = *std::max_element(&v[t * dim + g0], &v[t * dim + g0 + G]);
        const float div = bits == 1 ? 2.0f : float((1u << bits) - 1u);
        // Half a step, the step being the stored scale (the ideal step up to f16 rounding).
        const float khalf = 0.5f * f16_to_f32(ks[c]), vhalf = 0.5f * f16_to_f32(vs[t * 2 + c / G]);
        EXPECT_NEAR(2 * khalf, (kmx - kmn) / div, (kmx - kmn) / div * 2e-3 + 1e-4);
        EXPECT_NEAR(2 * vhalf, (vmx - vmn) / div, (vmx - vmn) / div * 2e-3 + 1e-4);
        // 1-bit: f16 rounding of zero/scale may shift the quarter points by an f16 ulp.
        const float slack = bits == 1 ? 1e-3f * (std::fabs(kmn) + std::fabs(kmx)) : 1e-6f;
        const float vslack = bits == 1 ? 1e-3f * (std::fabs(vmn) + std::fabs(vmx)) : 1e-6f;
        EXPECT_LE(std::fabs(kd[t * dim + c] - k[t * dim + c]), khalf * (1 + 1e-5f) + slack)
            << "bits " << bits << " key t " << t << " c " << c;
        EXPECT_LE(std::fabs(vd[t * dim + c] - v[t * dim + c]), vhalf * (1 + 1e-5f) + vslack)
            << "bits " << bits << " value t " << t << " c " << c;
      }
    }
  }
}

TEST(KiviQuant, OneBitLevelsAreTheQuarterPoints) {
  const size_t dim = 16, G = 16;
  const std::vector<float> v = normal_rows(3 * dim, 41);
  std::vector<uint8_t> codes(3 * kivi_packed_bytes(dim, 1));
  std::vector<uint16_t> s(3), z(3);
  kivi_quantize_values(v.data(), 3, dim, G, 1, codes.data(), s.data(), z.data());
  std::vector<float> d(3 * dim);
  kivi_dequantize_values(codes.data(), s.data(), z.data(), 3, dim, G, 1, d.data());
  for (size_t t = 0; t < 3; ++t) {
    const float mn = *std::min_element(&v[t * dim], &v[t * dim + dim]);
    const float mx = *std::max_element(&v[t * dim], &v[t * dim + dim]);
    // SpeCache: zero = (3 min + max) / 4, scale = (max - min) / 2, stored as f16.
    EXPECT_EQ(z[t], f32_to_f16((3 * mn + mx) / 4));
    EXPECT_EQ(s[t], f32_to_f16((mx - mn) / 2));
    const float lo = f16_to_f32(z[t]), hi = f16_to_f32(z[t]) + f16_to_f32(s[t]);
    size_t n_lo = 0, n_hi = 0;
    for (size_t c = 0; c < dim; ++c) {
      const float x = d[t * dim + c];
      EXPECT_TRUE(x == lo || x == hi) << x << " is not one of " << lo << ", " << hi;
      // The nearer level is chosen.
      const float want = std::fabs(v[t * dim + c] - lo) <= std::fabs(v[t * dim + c] - hi) ? lo : hi;
      EXPECT_EQ(x, want);
      n_lo += x == lo;
      n_hi += x == hi;
    }
    EXPECT_GT(n_lo, 0u);
    EXPECT_GT(n_hi, 0u);
  }
}

TEST(KiviQuant, ConstantGroupIsExact) {
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    const float x = 0.3125f;  // exact in f16
    const KiviGroupParams p = kivi_group_params(x, x, bits);
    const float s = f16_to_f32(p.scale_f16), z = f16_to_f32(p.zero_f16);
    EXPECT_EQ(kivi_dequant(kivi_code(x, s, z, bits), s, z), x) << bits;
  }
}

TEST(KiviQuant, SupportedWidths) {
  for (uint32_t b = 0; b < 10; ++b) {
    EXPECT_EQ(kivi_bits_supported(b), b == 1 || b == 2 || b == 4 || b == 8) << b;
  }
}

}  // namespace

namespace {

TEST(KiviQuant, NonFiniteInputsGiveValidCodes) {
  const float nan = std::nanf("");
  for (uint32_t bits : {1u, 2u, 4u, 8u}) {
    EXPECT_EQ(kivi_code(nan, 0.5f, 0.0f, bits), 0u);
    EXPECT_EQ(kivi_code(1e30f, 0.5f, 0.0f, bits), bits == 1 ? 1u : (1u << bits) - 1u);
    EXPECT_EQ(kivi_code(-1e30f, 0.5f, 0.0f, bits), 0u);
  }
}

}  // namespace
