// One KV head held the KIVI way (KIVI's streaming scheme, docs/papers.md): the oldest tokens
// quantized in blocks of G (keys per channel over the block, values per token over G-channel
// groups), the most recent R..R+G-1 tokens kept exact (f16) in a residual window. When the residual
// reaches R + G tokens its oldest G are flushed into one quantized block, so at least R recent
// tokens stay exact. Flushing quantizes the f16-rounded residual rows, so the store's contents do
// not depend on how the tokens were split across append calls.
//
// Eviction on top of KIVI (compositions such as xkv+kivi2): retain() drops tokens without
// re-quantizing anything. Values are quantized per token, so dropping their rows is exact; a key
// block keeps its per-channel scale/zero for the tokens it still holds, so a block may become
// ragged (fewer than G tokens). A store that was ever retained records the token count of every
// block (one uint32 each, counted in bytes()); a store that never was has only full blocks and
// pays nothing for counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::cpu {

struct KiviConfig {
  uint32_t bits = 2;        // 1, 2, 4 or 8 (1 = SpeCache variant)
  uint32_t group = 32;      // G: tokens per key block, channels per value group
  uint32_t residual = 128;  // R: recent tokens kept exact
  // Bits of the integer value weights the fused attention (fast_attention.h) rounds each
  // segment's softmax weights times value scales to: 14 (the first kernels'; a cache restored from
  // a snapshot written before kvsdk_policy.kivi_weight_bits keeps them, so it continues
  // bit-identically) or 7 (one vpdpbusd per value product instead of two). A choice of the
  // attention only: the store's codes are the same either way.
  uint32_t weight_bits = 14;
};

// Every byte the store holds, by kind (logical sizes of its buffers).
struct KiviBytes {
  uint64_t codes = 0;        // packed key and value codes
  uint64_t scales_zeros = 0; // f16 scales and zero points of keys and values, and the uint32
                             // token count of every key block once the store is ragged
  uint64_t residual = 0;     // f16 keys and values of the exact window
  uint64_t positions = 0;    // int32 original position of every token
  uint64_t total() const { return codes + scales_zeros + residual + positions; }
};

// Every buffer of a KiviHeadStore, for snapshots: restore() rebuilds an identical store.
struct KiviHeadBuffers {
  size_t quantized_tokens = 0;
  std::vector<uint32_t> block_tokens;  // tokens of each key block; empty = every block holds G
  std::vector<int32_t> positions;
  std::vector<uint8_t> key_codes, value_codes;
  std::vector<uint16_t> key_scales, key_zeros, value_scales, value_zeros;
  std::vector<uint16_t> residual_keys, residual_values;
};

class KiviHeadStore {
 public:
  // Throws kvsdk::Error (KVSDK_E_INVALID_ARG) for unsupported bits, group 0 or dim 0.
  KiviHeadStore(size_t head_dim, const KiviConfig& config);

  // Appends `n` tokens: f32 rows k/v [n][head_dim] with their positions. After reserve(n) it
  // allocates nothing, so it cannot fail.
  void append(const float* k, const float* v, const int32_t* positions, size_t n);
  // Makes room for appending `n_more` tokens (flushes included; capacity grows by half at a time,
  // so appends stay amortized O(1)): the contents do not change, and an allocation failure
  // leaves the store as it was. A caller appending to several stores reserves in all of them
  // first, so that the appends themselves cannot fail half-way.
  void reserve(size_t n_more);
  // Makes every buffer's capacity at least `other`'s (contents unchanged; may throw
  // std::bad_alloc): a copy that replaces `other` then grows as `other` would have, so
  // double-buffered plans (src/repr/kivi_repr.cpp) allocate no more often than one store.
  void reserve_as(const KiviHeadStore& other);

  size_t size() const { return positions_.size(); }
  size_t quantized_tokens() const { return n_quant_; }
  size_t residual_tokens() const { return size() - n_quant_; }
  size_t head_dim() const { return dim_; }
  const KiviConfig& config() const { return cfg_; }
  const std::vector<int32_t>& positions() const { return positions_; }

  // Writes the rows of tokens [first, first + count) as attention sees them (dequantized codes, or
  // the exact residual) into k/v [count][head_dim]. Token order is append order. A null k or v is
  // skipped.
  void read_rows(size_t first, size_t count, float* k, float* v) const;

  // Keeps only the tokens at the given indices (strictly ascending, each < size()), in order,
  // without re-quantizing: the kept tokens read back bit-identically. Key blocks left empty are
  // dropped. Later appends and flushes continue as before. Throws KVSDK_E_INVALID_ARG (store
  // unchanged) for indices out of range or not ascending. Its only allocation (the block counts,
  // when the store first becomes ragged) happens before anything changes, so the store is
  // unchanged if that throws.
  void retain(const std::vector<uint32_t>& keep);
  void retain(const uint32_t* keep, size_t n_keep);  // the same over an array
  // Truncation (kvsdk_cache_truncate): the store after removing every token at a position >=
  // `position` is exactly a store that never held them only when they are all exact residual
  // rows appended since the last flush. A flush quantizes a block when the residual reaches R + G,
  // so it depended on every token held then; after one, the residual holds R tokens (appends
  // from then on sit at index >= quantized_tokens() + R). Before any flush every token counts.
  // Stores that were retained (ragged) follow the same rule: a retain is an eviction, which the
  // cache checks itself, and a flush after it again leaves R tokens.
  bool can_remove_from(int32_t position) const;
  // Removes them (only after can_remove_from()): no allocation, nothing re-quantized. Returns
  // how many tokens it removed.
  size_t remove_from(int32_t position) noexcept;
  // Whether the store records per-block token counts (a retain() dropped a quantized token).
  bool ragged() const { return !block_tokens_.empty(); }
  // Tokens held by each key block, oldest first.
  std::vector<uint32_t> block_tokens() const;
  // The recorded counts without a copy (kernels on the decode path must not allocate): empty
  // while the store is not ragged, meaning every block holds config().group tokens.
  const std::vector<uint32_t>& block_token_counts() const { return block_tokens_; }

  KiviBytes bytes() const;
  // What bytes() will be after appending `n_more` tokens (flushes included), without appending:
  // lets a caller reserve budget before it changes anything.
  KiviBytes projected_bytes(size_t n_more) const;
  // bytes() of a store of head_dim `dim` holding `n_quant` quantized tokens in `n_blocks` key
  // blocks and `n_residual` exact rows (`ragged`: it records block counts). Stores that keep the
  // same buffers elsewhere (a device's arena: src/repr/device_kivi.h) count with it.
  static KiviBytes bytes_for(size_t dim, const KiviConfig& config, size_t n_quant, size_t n_blocks,
                             size_t n_residual, bool ragged);
  // How many tokens an append of `n_more` tokens to a store holding `n_residual` residual rows
  // quantizes (its flushes, in closed form: append()'s loop flushes G at a time while the
  // residual holds R + G or more).
  static size_t flushed_tokens(const KiviConfig& config, size_t n_residual, size_t n_more);

  // Snapshot support: the buffers, and a store rebuilt from them. restore() checks every size
  // against head_dim and the config (throws kvsdk::Error KVSDK_E_CORRUPT on any mismatch, or
  // KVSDK_E_INVALID_ARG for a bad config), so the result behaves exactly like the saved store,
  // including later appends and flushes.
  KiviHeadBuffers buffers() const;
  static KiviHeadStore restore(size_t head_dim, const KiviConfig& config, KiviHeadBuffers b);
  // Bytes a fully quantized token costs (codes, its share of key scales, its value scales,
  // position), for budget planning. Ragged blocks cost more per token (their key scales and
  // count are shared by fewer tokens).
  static double bytes_per_quantized_token(size_t head_dim, const KiviConfig& config);

  // Raw buffers (snapshots, other backends).
  const std::vector<uint8_t>& key_codes() const { return k_codes_; }
  const std::vector<uint8_t>& value_codes() const { return v_codes_; }
  const std::vector<uint16_t>& key_scales() const { return k_scale_; }
  const std::vector<uint16_t>& key_zeros() const { return k_zero_; }
  const std::vector<uint16_t>& value_scales() const { return v_scale_; }
  const std::vector<uint16_t>& value_zeros() const { return v_zero_; }
  const std::vector<uint16_t>& residual_keys() const { return res_k_; }
  const std::vector<uint16_t>& residual_values() const { return res_v_; }

 private:
  void flush_block();

  size_t dim_;
  KiviConfig cfg_;
  size_t row_bytes_;   // packed bytes per token row
  size_t v_groups_;    // value groups per token
  size_t n_quant_ = 0; // quantized tokens (a multiple of G unless ragged)
  size_t blocks() const { return block_tokens_.empty() ? n_quant_ / cfg_.group : block_tokens_.size(); }
  size_t block_size(size_t b) const { return block_tokens_.empty() ? cfg_.group : block_tokens_[b]; }
  std::vector<uint32_t> block_tokens_;         // [blocks] once ragged, else empty (all G)
  std::vector<int32_t> positions_;             // [size()]
  std::vector<uint8_t> k_codes_, v_codes_;     // [n_quant][row_bytes]
  std::vector<uint16_t> k_scale_, k_zero_;     // [blocks][dim] f16
  std::vector<uint16_t> v_scale_, v_zero_;     // [n_quant][v_groups] f16
  std::vector<uint16_t> res_k_, res_v_;        // [residual_tokens][dim] f16
};

}  // namespace kvsdk::cpu
