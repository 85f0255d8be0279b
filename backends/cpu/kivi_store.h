// One KV head held the KIVI way (Liu et al. 2024, §3.3 "streaming"): the oldest tokens quantized in
// blocks of G (keys per channel over the block, values per token over G-channel groups), the most
// recent R..R+G-1 tokens kept exact (f16) in a residual window. When the residual reaches R + G
// tokens its oldest G are flushed into one quantized block, so at least R recent tokens stay exact.
// Flushing quantizes the f16-rounded residual rows, so the store's contents do not depend on how
// the tokens were split across append calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsdk::cpu {

struct KiviConfig {
  uint32_t bits = 2;        // 1, 2, 4 or 8 (1 = SpeCache variant)
  uint32_t group = 32;      // G: tokens per key block, channels per value group
  uint32_t residual = 128;  // R: recent tokens kept exact
};

// Every byte the store holds, by kind (logical sizes of its buffers).
struct KiviBytes {
  uint64_t codes = 0;        // packed key and value codes
  uint64_t scales_zeros = 0; // f16 scales and zero points of keys and values
  uint64_t residual = 0;     // f16 keys and values of the exact window
  uint64_t positions = 0;    // int32 original position of every token
  uint64_t total() const { return codes + scales_zeros + residual + positions; }
};

class KiviHeadStore {
 public:
  // Throws kvsdk::Error (KVSDK_E_INVALID_ARG) for unsupported bits, group 0 or dim 0.
  KiviHeadStore(size_t head_dim, const KiviConfig& config);

  // Appends `n` tokens: f32 rows k/v [n][head_dim] with their positions.
  void append(const float* k, const float* v, const int32_t* positions, size_t n);

  size_t size() const { return positions_.size(); }
  size_t quantized_tokens() const { return n_quant_; }
  size_t residual_tokens() const { return size() - n_quant_; }
  size_t head_dim() const { return dim_; }
  const KiviConfig& config() const { return cfg_; }
  const std::vector<int32_t>& positions() const { return positions_; }

  // Writes the rows of tokens [first, first + count) as attention sees them (dequantized codes, or
  // the exact residual) into k/v [count][head_dim]. Token order is append order.
  void read_rows(size_t first, size_t count, float* k, float* v) const;

  KiviBytes bytes() const;
  // Bytes a fully quantized token costs (codes, its share of key scales, its value scales,
  // position), for budget planning.
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
  size_t n_quant_ = 0; // quantized tokens (a multiple of G)
  std::vector<int32_t> positions_;             // [size()]
  std::vector<uint8_t> k_codes_, v_codes_;     // [n_quant][row_bytes]
  std::vector<uint16_t> k_scale_, k_zero_;     // [n_quant / G][dim] f16
  std::vector<uint16_t> v_scale_, v_zero_;     // [n_quant][v_groups] f16
  std::vector<uint16_t> res_k_, res_v_;        // [residual_tokens][dim] f16
};

}  // namespace kvsdk::cpu
