#include "kivi_tier.h"

#include "kivi_quant.h"
#include "util/error.h"

namespace kvsdk::cpu {

KiviHeadStore kivi_store_from_tier(const backend::KiviTier& tier, const backend::F16Rows& residual,
                                   size_t dim) {
  const KiviConfig config{tier.bits, tier.group, tier.residual, tier.weight_bits};
  const size_t nq = tier.tokens, nr = residual.n_tokens;
  const size_t row = kivi_packed_bytes(dim, tier.bits);
  const size_t blocks = tier.block_starts ? tier.blocks : tier.group ? nq / tier.group : 0;
  const size_t vg = tier.group ? kivi_value_groups(dim, tier.group) : 0;
  KiviHeadBuffers b;
  b.quantized_tokens = nq;
  if (tier.block_starts) {  // ragged: each block's token count, from the starts
    b.block_tokens.resize(blocks);
    for (size_t i = 0; i < blocks; ++i) {
      const size_t end = i + 1 < blocks ? tier.block_starts[i + 1] : nq;
      b.block_tokens[i] = uint32_t(end - tier.block_starts[i]);
    }
  }
  b.positions.assign(tier.positions, tier.positions + nq);
  b.positions.insert(b.positions.end(), residual.positions, residual.positions + nr);
  b.key_codes.assign(tier.k_codes, tier.k_codes + nq * row);
  b.value_codes.assign(tier.v_codes, tier.v_codes + nq * row);
  b.key_scales.assign(tier.k_scale, tier.k_scale + blocks * dim);
  b.key_zeros.assign(tier.k_zero, tier.k_zero + blocks * dim);
  b.value_scales.assign(tier.v_scale, tier.v_scale + nq * vg);
  b.value_zeros.assign(tier.v_zero, tier.v_zero + nq * vg);
  b.residual_keys.assign(residual.k, residual.k + nr * dim);
  b.residual_values.assign(residual.v, residual.v + nr * dim);
  return KiviHeadStore::restore(dim, config, std::move(b));
}

SpeCacheFetched specache_fetched_from_rows(const backend::F16Rows& fetched,
                                           const uint32_t* fetched_tokens, size_t copy_tokens,
                                           size_t dim) {
  const size_t n = fetched.n_tokens;
  for (size_t i = 0; i < n; ++i) {
    KVSDK_REQUIRE(fetched_tokens[i] < copy_tokens, "fetched token ", fetched_tokens[i],
                  " is beyond the ", copy_tokens, " tokens of the low-bit copy");
    KVSDK_REQUIRE(i == 0 || fetched_tokens[i] > fetched_tokens[i - 1],
                  "fetched tokens must be strictly ascending");
  }
  SpeCacheFetched f;
  f.tokens.assign(fetched_tokens, fetched_tokens + n);
  f.k.assign(fetched.k, fetched.k + n * dim);
  f.v.assign(fetched.v, fetched.v + n * dim);
  return f;
}

}  // namespace kvsdk::cpu
