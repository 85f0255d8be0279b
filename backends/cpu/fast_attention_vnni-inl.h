// The AVX3_DL (AVX-512 VNNI + VBMI) lane kernels of the KIVI attention in fast_attention.cpp:
// query codes of a key block, key dots with one token per lane, value weights as bytes, value
// dots with one group's channels per vector. Every one computes the same integers and floats as
// the generic path of fast_attention.cpp (same bits on every target; see fast_attention.h).
//
// A fragment, not a standalone header: fast_attention.cpp includes it inside its per-target
// namespace, after State, KiviView and Prefetch, once per Highway target (it is empty except on
// AVX3_DL), so it has no include guard and opens no namespace.
#if HWY_TARGET == HWY_AVX3_DL

// PrepareKeyBlock's query codes for the vpdpbusd layout, with the same arithmetic as the generic
// passes below (so the same bits): the products q * key scale are kept from the first pass (qsb),
// floor(x + 0.5) is one conversion in round-down mode, and the high/low bytes are split on 16-bit
// words and packed with vpacksswb, put back in channel order by one vpermd. Only the lower clamp
// is needed: |x| <= max |x| makes x * (kQMax / max) round to at most kQMax + 1 ulp in magnitude,
// so floor(x + 0.5) lies in [-kQMax, kQMax]; a NaN converts to INT_MIN, which max() takes to
// -kQMax as the generic clamp does. vpackssdw then saturates nothing.
template <size_t NV>  // D / 16 vectors per row
HWY_INLINE void QueryCodesVnni(State& st, const float* kf) {
  constexpr size_t D = NV * 16;
  float* dq = st.F(st.lay.dq);
  float* xs = st.F(st.lay.qsb);
  int8_t* qhi = st.At<int8_t>(st.lay.qhi);
  int8_t* qlo = st.At<int8_t>(st.lay.qlo);
  // After the packs, dword 4L + v holds channels 16v + 4L .. + 3 of the four vectors v.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i nlim = _mm512_set1_epi32(-kQMax), low7 = _mm512_set1_epi16(127);
  const __m512 half = _mm512_set1_ps(0.5f);
  // Two passes (every row's max and step, then the codes), so the rows' chains of max, reduction
  // and division overlap instead of queueing.
  float* inv_of = st.F(st.lay.qmx);
  for (size_t r = 0; r < st.R; ++r) {
    const float* qr = st.q->q + r * D;
    __m512 mxv = _mm512_setzero_ps();
    for (size_t v = 0; v < NV; ++v) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(qr + 16 * v), _mm512_load_ps(kf + 16 * v));
      _mm512_store_ps(xs + r * D + 16 * v, x);
      mxv = _mm512_max_ps(mxv, _mm512_abs_ps(x));
    }
    const float m = _mm512_reduce_max_ps(mxv);  // max is exact in any order
    const bool zero = !(m >= kTiny);
    dq[r] = zero ? 0.0f : m * (1.0f / float(kQMax));
    inv_of[r] = zero ? 0.0f : float(kQMax) / m;
  }
  for (size_t r = 0; r < st.R; ++r) {
    const __m512 inv = _mm512_set1_ps(inv_of[r]);
    for (size_t v0 = 0; v0 < NV; v0 += 4) {
      __m512i c[4];
      for (size_t k = 0; k < 4; ++k) {
        c[k] = _mm512_max_epi32(
            _mm512_cvt_roundps_epi32(
                _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(xs + r * D + 16 * (v0 + k)), inv),
                              half),
                _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
            nlim);
      }
      // x = 128 hi + lo with lo in [0, 127] (arithmetic shift): vpdpbusd's signed bytes.
      const __m512i x01 = _mm512_packs_epi32(c[0], c[1]), x23 = _mm512_packs_epi32(c[2], c[3]);
      const __m512i hi = _mm512_packs_epi16(_mm512_srai_epi16(x01, 7), _mm512_srai_epi16(x23, 7));
      const __m512i lo =
          _mm512_packs_epi16(_mm512_and_si512(x01, low7), _mm512_and_si512(x23, low7));
      _mm512_storeu_si512(qhi + r * D + 16 * v0, _mm512_permutexvar_epi32(order, hi));
      _mm512_storeu_si512(qlo + r * D + 16 * v0, _mm512_permutexvar_epi32(order, lo));
    }
  }
}

// ---- KIVI keys with one token per lane ---------------------------------------------------------
// KeyDotsTile leaves each token's dot product spread over 16 lanes (Tree16 reduces them). Here
// the packed codes of 16 tokens are transposed in registers first (dword j of every row into one
// vector, lane t = token t), so a channel quad's codes of 16 tokens decode into one vector and
// vpdpbusd with the query's 4 bytes of that quad broadcast adds to all 16 tokens' sums at once:
// the same integers (exact in any order), no horizontal reduction. Needs row_bytes % 32 == 0
// (slices of 8 dwords per row).

// acc += vpdpbusd(x, the dword at p broadcast): the broadcast as the instruction's memory operand
// ({1to16}), which GCC does not fold from _mm512_set1_epi32 (it issued a separate vpbroadcastd
// and register copies for every product of the lane kernels).
HWY_INLINE __m512i DpbusdBcst(__m512i acc, __m512i x, const void* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(x), "m"(*static_cast<const int32_t*>(p)));
  return acc;
}

// vpermt2d indices of the 16 x 8 dword transpose in three stages (TransposeSlice). Input I_p
// (p < 8) holds rows 2p and 2p+1 (lane 8h + j = dword j of row 2p + h).
struct TransposeIdx {
  alignas(64) int32_t a[2][16], b[2][16], c[2][16];
  constexpr TransposeIdx() : a(), b(), c() {
    for (int x = 0; x < 2; ++x) {
      for (int L = 0; L < 16; ++L) {
        // A (I_p, I_p+4): lane (g, h, jj) = dword 4x + jj of row 2p + h + 8g.
        a[x][L] = 16 * (L >> 3) + 8 * ((L >> 2) & 1) + 4 * x + (L & 3);
        // B (A_p, A_p+2): lane (k, g, h, jjj) = dword 4x + 2y + jjj of row 2p + h + 8g + 4k.
        b[x][L] = 16 * (L >> 3) + 8 * ((L >> 2) & 1) + 4 * ((L >> 1) & 1) + 2 * x + (L & 1);
        // C (B_0, B_1): lane t = row t, t = 2m + h + 4k + 8g.
        c[x][L] = 16 * ((L >> 1) & 1) + 8 * ((L >> 2) & 1) + 4 * (L >> 3) + 2 * (L & 1) + x;
      }
    }
  }
};

// o[j] lane t = dword j of in[] row t, for the 16 rows held two per vector in in[0..7].
HWY_INLINE void TransposeSlice(const __m512i* in, __m512i* o) {
  static constexpr TransposeIdx kT;
  const __m512i a0 = _mm512_load_si512(kT.a[0]), a1 = _mm512_load_si512(kT.a[1]);
  const __m512i b0 = _mm512_load_si512(kT.b[0]), b1 = _mm512_load_si512(kT.b[1]);
  const __m512i c0 = _mm512_load_si512(kT.c[0]), c1 = _mm512_load_si512(kT.c[1]);
  __m512i A[4][2], Bv[2][2][2];
  for (int p = 0; p < 4; ++p) {
    A[p][0] = _mm512_permutex2var_epi32(in[p], a0, in[p + 4]);
    A[p][1] = _mm512_permutex2var_epi32(in[p], a1, in[p + 4]);
  }
  for (int p = 0; p < 2; ++p) {
    for (int x = 0; x < 2; ++x) {
      Bv[p][x][0] = _mm512_permutex2var_epi32(A[p][x], b0, A[p + 2][x]);
      Bv[p][x][1] = _mm512_permutex2var_epi32(A[p][x], b1, A[p + 2][x]);
    }
  }
  for (int x = 0; x < 2; ++x) {
    for (int y = 0; y < 2; ++y) {
      o[4 * x + 2 * y] = _mm512_permutex2var_epi32(Bv[0][x][y], c0, Bv[1][x][y]);
      o[4 * x + 2 * y + 1] = _mm512_permutex2var_epi32(Bv[0][x][y], c1, Bv[1][x][y]);
    }
  }
}

// vpmultishiftqb controls that turn transposed packed dwords (lane t = 32 / B channels of token
// t) into one byte per channel for channel quad b of the dword (lane t = its 4 codes).
template <uint32_t B>
struct QuadCtl {
  static constexpr uint32_t kQuads = 8 / B;  // channel quads per packed dword
  alignas(64) uint8_t ctl[kQuads][64];
  constexpr QuadCtl() : ctl() {
    for (uint32_t b = 0; b < kQuads; ++b) {
      for (uint32_t i = 0; i < 64; ++i) {
        ctl[b][i] = uint8_t(32 * ((i >> 2) & 1) + 4 * B * b + B * (i & 3));
      }
    }
  }
};

// (NB = head_dim / 16: every loop bound and query offset a constant.)
template <uint32_t B, size_t RT, size_t NB>
HWY_INLINE void KeyDotsLanesTile(State& st, const uint8_t* packed, size_t off, size_t n,
                                 size_t r0, const uint8_t* end) {
  constexpr uint32_t kQuads = 8 / B;
  static constexpr QuadCtl<B> kC;
  constexpr size_t D = 16 * NB, row_bytes = 2 * NB * B, slices = row_bytes / 32;
  static_assert(slices * 32 == row_bytes, "whole 32-byte slices per row");
  const uint8_t* qhi = st.At<uint8_t>(st.lay.qhi) + r0 * D;
  const uint8_t* qlo = st.At<uint8_t>(st.lay.qlo) + r0 * D;
  const __m512i mask = _mm512_set1_epi8(char(B == 8 ? 0xFF : (1u << B) - 1u));
  // A run shorter than 16 tokens is copied to a zero-padded buffer (its pad lanes are dropped).
  alignas(64) uint8_t pad[16 * 256];
  for (size_t i0 = 0; i0 < n; i0 += 16) {
    const size_t cnt = std::min<size_t>(16, n - i0);
    const uint8_t* rows = packed + i0 * row_bytes;
    // The rows one segment ahead (see ValueDotsLanes).
    if (r0 == 0) Prefetch(rows + kSeg * row_bytes, 16 * row_bytes, end);
    if (cnt < 16) {
      std::memcpy(pad, rows, cnt * row_bytes);
      std::memset(pad + cnt * row_bytes, 0, (16 - cnt) * row_bytes);
      rows = pad;
    }
    __m512i h[RT], l[RT];
    for (size_t r = 0; r < RT; ++r) h[r] = l[r] = _mm512_setzero_si512();
    for (size_t s = 0; s < slices; ++s) {
      __m512i in[8], o[8];
      for (size_t p = 0; p < 8; ++p) {
        const uint8_t* r2 = rows + 2 * p * row_bytes + 32 * s;
        in[p] = row_bytes == 32
                    ? _mm512_loadu_si512(r2)
                    : _mm512_inserti64x4(
                          _mm512_castsi256_si512(
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r2))),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r2 + row_bytes)),
                          1);
      }
      TransposeSlice(in, o);
      for (size_t j = 0; j < 8; ++j) {
        for (uint32_t b = 0; b < kQuads; ++b) {
          const __m512i x =
              B == 8 ? o[j]
                     : _mm512_and_si512(
                           _mm512_multishift_epi64_epi8(_mm512_load_si512(kC.ctl[b]), o[j]),
                           mask);
          const size_t c = 4 * ((s * 8 + j) * kQuads + b);  // first channel of the quad
          for (size_t r = 0; r < RT; ++r) {
            h[r] = DpbusdBcst(h[r], x, qhi + r * D + c);
            l[r] = DpbusdBcst(l[r], x, qlo + r * D + c);
          }
        }
      }
    }
    const __mmask16 keep = __mmask16((1u << cnt) - 1u);
    for (size_t r = 0; r < RT; ++r) {
      const __m512i a = _mm512_add_epi32(_mm512_slli_epi32(h[r], 7), l[r]);
      _mm512_mask_storeu_ps(st.sc + (r0 + r) * kSeg + off + i0, keep, _mm512_cvtepi32_ps(a));
    }
  }
}

template <uint32_t B, size_t NB>
HWY_INLINE void KeyDotsLanesT(State& st, const uint8_t* packed, size_t off, size_t n,
                              const uint8_t* end) {
  size_t r0 = 0;
  for (; r0 + 4 <= st.R; r0 += 4) KeyDotsLanesTile<B, 4, NB>(st, packed, off, n, r0, end);
  switch (st.R - r0) {  // one tile of the rows left (each tile decodes the codes again)
    case 3: return KeyDotsLanesTile<B, 3, NB>(st, packed, off, n, r0, end);
    case 2: return KeyDotsLanesTile<B, 2, NB>(st, packed, off, n, r0, end);
    case 1: return KeyDotsLanesTile<B, 1, NB>(st, packed, off, n, r0, end);
    default: return;
  }
}

// Rows of a multiple of 32 bytes at head_dim 64, 128 or 256 (KeyDotsVnni checks both).
template <uint32_t B>
HWY_INLINE void KeyDotsLanes(State& st, const uint8_t* packed, size_t off, size_t n,
                             const uint8_t* end) {
  switch (st.D) {
    case 64:
      if constexpr (B >= 4) KeyDotsLanesT<B, 4>(st, packed, off, n, end);
      break;
    case 128:
      if constexpr (B >= 2) KeyDotsLanesT<B, 8>(st, packed, off, n, end);
      break;
    default: KeyDotsLanesT<B, 16>(st, packed, off, n, end); break;
  }
}

// After vpackssdw + vpacksswb of four vectors, dword 4L + v holds elements 16v + 4L .. + 3: this
// vpermd index puts them back in order.
HWY_INLINE __m512i PackOrder() {
  return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

// One row and group's weight codes W = round(w / dv) in [0, wmax] (the generic rounding and
// clamp), as their high (W >> 7) and low 7-bit bytes (wmax 127: W itself, in wlo), 4 tokens per
// dword: what ValueDotsVnni and ValueDotsLanes broadcast. Tokens past n16 get 0. The clamp is the
// packs' unsigned saturation: w >= 0 and w * (wmax / max w) rounds to at most wmax + 1 ulp, so
// floor(x + 0.5) <= wmax,
// and what is below 0 (NaN converts to INT_MIN) saturates to 0, as the generic max(., 0) gives.
// The split into bytes runs on 16-bit words (half the vectors of the 32-bit codes).
HWY_INLINE void WeightBytesVnni(State& st, const __m512* w, size_t nv, __m512 inv, size_t at,
                                bool wide) {
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512i low7 = _mm512_set1_epi16(127);
  __m512i c[kSeg / 16];
  for (size_t k = 0; k < kSeg / 16; ++k) {
    c[k] = k < nv ? _mm512_cvt_roundps_epi32(_mm512_add_ps(_mm512_mul_ps(w[k], inv), half),
                                             _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
                  : _mm512_setzero_si512();
  }
  static_assert(kSeg == 64, "one vector of bytes per row and group");
  // The packs interleave their operands by 128-bit blocks; PackOrder puts the dwords back in
  // token order (the same element order as packing the 32-bit bytes, so the same dwords).
  const __m512i x01 = _mm512_packus_epi32(c[0], c[1]), x23 = _mm512_packus_epi32(c[2], c[3]);
  if (!wide) {  // W <= 127: the byte itself
    _mm512_storeu_si512(st.At<uint32_t>(st.lay.wlo) + at,
                        _mm512_permutexvar_epi32(PackOrder(), _mm512_packus_epi16(x01, x23)));
    return;
  }
  const __m512i hi = _mm512_packus_epi16(_mm512_srli_epi16(x01, 7), _mm512_srli_epi16(x23, 7));
  const __m512i lo =
      _mm512_packus_epi16(_mm512_and_si512(x01, low7), _mm512_and_si512(x23, low7));
  _mm512_storeu_si512(st.At<uint32_t>(st.lay.whi) + at, _mm512_permutexvar_epi32(PackOrder(), hi));
  _mm512_storeu_si512(st.At<uint32_t>(st.lay.wlo) + at, _mm512_permutexvar_epi32(PackOrder(), lo));
}

// ValueWeights' per row and group work for the vpdpbusd layout with everything in registers:
// the same products, the same max, the zero-point sums in the same order (lane i % 16, tokens
// in order) and the same rounding, so the same bits.
HWY_INLINE void WeightsVnni(State& st, const float* vs, const float* vz, size_t n16, bool wide) {
  const size_t ng = st.ng, nv = n16 / 16;
  const int32_t wmax = WeightMax(wide);
  float* dv = st.F(st.lay.dv);
  // Two passes (every row and group's max and step, then the codes, the products formed again:
  // the same bits), so the chains of max, reduction and division overlap instead of queueing.
  float* inv_buf = st.F(st.lay.winv);
  for (size_t r = 0; r < st.R; ++r) {
    __m512 p[kSeg / 16];
    for (size_t k = 0; k < nv; ++k) p[k] = _mm512_loadu_ps(st.sc + r * kSeg + 16 * k);
    for (size_t g = 0; g < ng; ++g) {
      __m512 mx = _mm512_setzero_ps();
      float* zl = st.zv + (r * ng + g) * 16;
      __m512 z = _mm512_loadu_ps(zl);
      for (size_t k = 0; k < nv; ++k) {
        mx = _mm512_max_ps(mx, _mm512_mul_ps(p[k], _mm512_loadu_ps(vs + g * kSeg + 16 * k)));
        z = _mm512_add_ps(z, _mm512_mul_ps(p[k], _mm512_loadu_ps(vz + g * kSeg + 16 * k)));
      }
      _mm512_storeu_ps(zl, z);
      const float m = _mm512_reduce_max_ps(mx);
      const bool zero = !(m >= kTiny);
      dv[r * ng + g] = zero ? 0.0f : m * (1.0f / float(wmax));
      inv_buf[r * ng + g] = zero ? 0.0f : float(wmax) / m;
    }
  }
  for (size_t r = 0; r < st.R; ++r) {
    __m512 p[kSeg / 16];
    for (size_t k = 0; k < nv; ++k) p[k] = _mm512_loadu_ps(st.sc + r * kSeg + 16 * k);
    for (size_t g = 0; g < ng; ++g) {
      __m512 w[kSeg / 16];
      for (size_t k = 0; k < nv; ++k) {
        w[k] = _mm512_mul_ps(p[k], _mm512_loadu_ps(vs + g * kSeg + 16 * k));
      }
      WeightBytesVnni(st, w, nv, _mm512_set1_ps(inv_buf[r * ng + g]),
                      (r * ng + g) * (kSeg / 4), wide);
    }
  }
}

// ---- KIVI values, one group's 16 channels per vector -------------------------------------------
// ValueDotsVnni's byte interleave leaves two groups' channels in each vector, so its weights are
// assembled per lane. Here 4 tokens' packed rows are interleaved by 16-bit words first (qword w =
// word w of tokens 0..3, i.e. 16 / B channels of all 4 tokens), so that one vpmultishiftqb per 16
// channels decodes them to lane c = channel c, byte t = token t: a vector holds one group's
// channels (G % 16 == 0) and its weight dword is a plain broadcast. Same integers as ValueDotsVnni.
template <uint32_t B>
struct ValueCtl {
  alignas(64) uint16_t il[32];   // vpermw: word 4w + t <- word 8t + w (16-byte slices of 4 rows)
  alignas(64) uint8_t ctl[64];   // out qword s, dword d (channel 2s + d), byte t (token t)
  alignas(64) uint64_t src[8][8];  // [block % (8 / B)][s]: the qword holding channels 2s, 2s + 1
  constexpr ValueCtl() : il(), ctl(), src() {
    for (uint32_t w = 0; w < 8; ++w)
      for (uint32_t t = 0; t < 4; ++t) il[4 * w + t] = uint16_t(8 * t + w);
    for (uint32_t i = 0; i < 64; ++i) {
      const uint32_t s = i / 8, d = (i / 4) % 2, t = i % 4;
      ctl[i] = uint8_t(16 * t + ((2 * s + d) % (16 / B)) * B);
    }
    for (uint32_t c = 0; c < 8; ++c)
      for (uint32_t s = 0; s < 8; ++s) src[c][s] = (c * B) % 8 + (2 * s * B) / 16;
  }
};

// RT rows of the integer sums of channel blocks cb and cb + 1 (one group g) over nq quads,
// added to acc.
template <bool Wide, size_t RT>
HWY_INLINE void ValueLanesTile(State& st, const __m512i* xs, size_t nb, size_t nq, size_t cb,
                               size_t g, size_t r0) {
  const size_t ng = st.ng;
  const uint32_t* whi = st.At<uint32_t>(st.lay.whi);
  const uint32_t* wlo = st.At<uint32_t>(st.lay.wlo);
  __m512i h[RT][2], l[RT][2];
  for (size_t r = 0; r < RT; ++r) h[r][0] = h[r][1] = l[r][0] = l[r][1] = _mm512_setzero_si512();
  for (size_t qd = 0; qd < nq; ++qd) {
    const __m512i x0 = _mm512_load_si512(xs + qd * nb + cb);
    const __m512i x1 = _mm512_load_si512(xs + qd * nb + cb + 1);
    for (size_t r = 0; r < RT; ++r) {
      const size_t at = ((r0 + r) * ng + g) * (kSeg / 4) + qd;
      if constexpr (Wide) {
        h[r][0] = DpbusdBcst(h[r][0], x0, whi + at);
        h[r][1] = DpbusdBcst(h[r][1], x1, whi + at);
      }
      l[r][0] = DpbusdBcst(l[r][0], x0, wlo + at);
      l[r][1] = DpbusdBcst(l[r][1], x1, wlo + at);
    }
  }
  // AddValueSums' acc += dv * float(II) for these channels (elementwise: the same bits), with
  // its skip of a group without weight.
  const float* dv = st.F(st.lay.dv);
  for (size_t r = 0; r < RT; ++r) {
    const float s = dv[(r0 + r) * ng + g];
    if (s == 0.0f) continue;
    const __m512 sv = _mm512_set1_ps(s);
    for (size_t e = 0; e < 2; ++e) {
      float* a = st.acc + (r0 + r) * st.D + 16 * (cb + e);
      const __m512i ii =
          Wide ? _mm512_add_epi32(_mm512_slli_epi32(h[r][e], 7), l[r][e]) : l[r][e];
      _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a),
                                        _mm512_mul_ps(sv, _mm512_cvtepi32_ps(ii))));
    }
  }
}

// ValueDotsLanes for head_dim 16 NB: every loop bound a constant, so the decoding unrolls (its
// index arithmetic was a fifth of the function's samples with D and row_bytes at run time).
template <uint32_t B, bool Wide, size_t NB>
HWY_INLINE void ValueDotsLanesT(State& st, const uint8_t* packed, size_t n, const uint8_t* end) {
  static constexpr ValueCtl<B> kC;
  constexpr size_t kPer = 8 / B;            // channel blocks per 16-byte slice of a row
  constexpr size_t kRowBytes = 2 * NB * B;  // head_dim * B / 8
  constexpr size_t kSlices = NB / kPer;
  static_assert(kSlices * kPer == NB, "whole 16-byte slices per row");
  const size_t G = st.vgroup, nq = (n + 3) / 4;
  const __m512i il = _mm512_load_si512(kC.il), ctl = _mm512_load_si512(kC.ctl);
  const __m512i mask = _mm512_set1_epi8(char(B == 8 ? 0xFF : (1u << B) - 1u));
  __m512i src[kPer];
  for (size_t j = 0; j < kPer; ++j) src[j] = _mm512_load_si512(kC.src[j]);
  __m512i* xs = st.At<__m512i>(st.lay.vb);  // decoded codes [quad][block]: n * D bytes
  for (size_t qd = 0; qd < nq; ++qd) {
    const uint8_t* rows[4];
    for (size_t t = 0; t < 4; ++t) {  // pad tokens repeat the last row (their weights are 0)
      rows[t] = packed + std::min(4 * qd + t, n - 1) * kRowBytes;
    }
    // The next segment's rows, a quad at a time: waiting on the code streams was a quarter of
    // this function's time at 32k tokens (perf), spread prefetches keep few lines in flight.
    Prefetch(packed + (4 * qd + kSeg) * kRowBytes, 4 * kRowBytes, end);
    for (size_t k = 0; k < kSlices; ++k) {
      const auto slice = [&](size_t t) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[t] + 16 * k));
      };
      __m512i z = _mm512_castsi128_si512(slice(0));
      z = _mm512_inserti32x4(z, slice(1), 1);
      z = _mm512_inserti32x4(z, slice(2), 2);
      z = _mm512_inserti32x4(z, slice(3), 3);
      const __m512i w = _mm512_permutexvar_epi16(il, z);
      for (size_t j = 0; j < kPer; ++j) {  // channel block k kPer + j
        __m512i x = _mm512_multishift_epi64_epi8(ctl, _mm512_permutexvar_epi64(src[j], w));
        if constexpr (B != 8) x = _mm512_and_si512(x, mask);
        _mm512_store_si512(xs + qd * NB + k * kPer + j, x);
      }
    }
  }
  for (size_t cb = 0; cb < NB; cb += 2) {
    const size_t g = 16 * cb / G;
    size_t r = 0;
    for (; r + 4 <= st.R; r += 4) ValueLanesTile<Wide, 4>(st, xs, NB, nq, cb, g, r);
    for (; r < st.R; ++r) ValueLanesTile<Wide, 1>(st, xs, NB, nq, cb, g, r);
  }
}

// Needs row_bytes % 16 == 0 (whole 16-byte slices per row), G % 32 == 0 and a head_dim of 64,
// 128 or 256 (kv.vnni).
template <uint32_t B, bool Wide>
HWY_NOINLINE void ValueDotsLanes(State& st, const uint8_t* packed, size_t n, const uint8_t* end) {
  switch (st.D) {
    case 64:
      if constexpr (B >= 2) ValueDotsLanesT<B, Wide, 4>(st, packed, n, end);
      break;  // (B = 1 at head_dim 64: 8-byte rows, never here)
    case 128: ValueDotsLanesT<B, Wide, 8>(st, packed, n, end); break;
    default: ValueDotsLanesT<B, Wide, 16>(st, packed, n, end); break;
  }
}

#endif  // HWY_TARGET == HWY_AVX3_DL
