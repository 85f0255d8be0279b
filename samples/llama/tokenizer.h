// llama2.c tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 length, bytes.
// Encoding is SentencePiece-style BPE: start from single characters (UTF-8 code points, falling
// back to <0xXX> byte tokens when the vocabulary has them), then repeatedly merge the adjacent
// pair whose concatenation is a token with the highest score.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace llama {

class Tokenizer {
 public:
  static constexpr int kUnk = 0;
  static constexpr int kBos = 1;
  static constexpr int kEos = 2;

  // Loads `path` for a model with `vocab_size` tokens. Throws llama::Error when the file is
  // missing, truncated, or its token count differs from the model's.
  static Tokenizer load(const std::string& path, int vocab_size);

  // Token ids of `text`. `dummy_prefix` prepends a space as SentencePiece models (stories260K)
  // expect; character-level models (shakespeare) use none. Characters the vocabulary cannot
  // express become <unk> (id 0).
  std::vector<int> encode(const std::string& text, bool dummy_prefix) const;

  // Text of `token`; `prev` is the token before it (a space right after BOS is dropped, as
  // llama2.c does). Byte tokens <0xXX> decode to their byte.
  std::string decode(int prev, int token) const;

  int size() const { return int(pieces_.size()); }
  const std::string& piece(int token) const { return pieces_.at(size_t(token)); }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
  bool byte_fallback_ = false;  // the vocabulary has <0x00>..<0xFF> at ids 3..258
};

}  // namespace llama
