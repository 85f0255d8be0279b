#include "tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <memory>

#include "error.h"

namespace llama {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Length of the UTF-8 sequence that starts with byte `c` (1 for invalid lead bytes).
size_t utf8_length(unsigned char c) {
  if (c >= 0xF0 && c < 0xF8) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path, int vocab_size) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error("tokenizer '" + path + "': cannot open the file");
  auto corrupt = [&](const std::string& why) {
    throw Error("tokenizer '" + path + "': " + why);
  };
  int32_t max_len = 0;
  if (std::fread(&max_len, 4, 1, f.get()) != 1) corrupt("file too short for its header");
  if (max_len <= 0 || max_len > 4096) corrupt("implausible max_token_length " + std::to_string(max_len));
  Tokenizer t;
  for (int i = 0; i < vocab_size; ++i) {
    float score = 0;
    int32_t len = 0;
    if (std::fread(&score, 4, 1, f.get()) != 1 || std::fread(&len, 4, 1, f.get()) != 1) {
      corrupt("truncated at token " + std::to_string(i) + " of " + std::to_string(vocab_size) +
              " (tokenizer of another model?)");
    }
    if (len < 0 || len > max_len) corrupt("token " + std::to_string(i) + " has length " + std::to_string(len));
    std::string piece(size_t(len), '\0');
    if (len > 0 && std::fread(&piece[0], 1, size_t(len), f.get()) != size_t(len)) {
      corrupt("truncated inside token " + std::to_string(i));
    }
    t.ids_.emplace(piece, i);  // first occurrence wins for duplicate pieces
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  if (std::fgetc(f.get()) != EOF) {
    corrupt("has more than the model's " + std::to_string(vocab_size) +
            " tokens (tokenizer of another model?)");
  }
  t.byte_fallback_ = vocab_size > 258 && t.pieces_[3] == "<0x00>" && t.pieces_[258] == "<0xFF>";
  return t;
}

std::vector<int> Tokenizer::encode(const std::string& text, bool dummy_prefix) const {
  std::vector<int> tokens;
  const std::string s = (dummy_prefix && !text.empty()) ? " " + text : text;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(s[i])), s.size() - i);
    auto it = ids_.find(s.substr(i, n));
    if (it != ids_.end()) {
      tokens.push_back(it->second);
    } else if (byte_fallback_) {
      for (size_t j = 0; j < n; ++j) tokens.push_back(3 + static_cast<unsigned char>(s[i + j]));
    } else {
      tokens.push_back(kUnk);
    }
    i += n;
  }
  // Greedy BPE: merge the best-scoring adjacent pair until no pair forms a known token.
  for (;;) {
    float best_score = -1e30f;
    int best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      auto it = ids_.find(pieces_[size_t(tokens[i])] + pieces_[size_t(tokens[i + 1])]);
      if (it != ids_.end() && scores_[size_t(it->second)] > best_score) {
        best_score = scores_[size_t(it->second)];
        best_id = it->second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_at] = best_id;
    tokens.erase(tokens.begin() + long(best_at) + 1);
  }
  return tokens;
}

std::string Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= size()) throw Error("token id " + std::to_string(token) + " out of range");
  const std::string& p = pieces_[size_t(token)];
  if (byte_fallback_ && token >= 3 && token <= 258) return std::string(1, char(token - 3));
  if (prev == kBos && !p.empty() && p[0] == ' ') return p.substr(1);
  return p;
}

}  // namespace llama
