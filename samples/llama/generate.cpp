#include "generate.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "error.h"

namespace llama {

std::vector<int> encode_prompt(const Tokenizer& tok, const std::string& text) {
  const bool sentencepiece = tok.size() > 258;  // has <0xXX> byte tokens and merges
  std::vector<int> ids;
  if (sentencepiece) ids.push_back(Tokenizer::kBos);
  const std::vector<int> body = tok.encode(text, sentencepiece);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

void prefill(Session& s, const std::vector<int>& tokens, size_t chunk, float* last_logits) {
  if (chunk == 0) throw Error("prefill chunk must be positive");
  for (size_t t = 0; t < tokens.size(); t += chunk) {
    const size_t n = std::min(chunk, tokens.size() - t);
    const bool last = t + n == tokens.size();
    s.forward(tokens.data() + t, n, last ? last_logits : nullptr);
  }
}

uint64_t full_cache_bytes_per_token(const Model& model) {
  kvsdk_context* ctx = nullptr;
  check(kvsdk_context_create(&ctx, nullptr), "kvsdk_context_create");
  const kvsdk_geometry g = geometry_of(model.config());
  kvsdk_cache* cache = nullptr;
  kvsdk_status st = kvsdk_cache_create(&cache, ctx, &g, nullptr);
  const std::vector<float> kv(size_t(model.config().kv_dim()), 0.0f);
  const int32_t pos = 0;
  for (uint32_t l = 0; st == KVSDK_OK && l < g.n_layers; ++l) {
    st = kvsdk_cache_append(cache, l, 1, kv.data(), kv.data(), &pos, kv.size() * sizeof(float));
  }
  kvsdk_cache_stats stats{};
  stats.struct_size = sizeof stats;
  if (st == KVSDK_OK) st = kvsdk_cache_stats_get(cache, &stats);
  kvsdk_cache_destroy(cache);
  kvsdk_context_destroy(ctx);
  check(st, "measuring the full cache's bytes per token");
  return stats.bytes;
}

uint64_t parse_budget(const std::string& spec, uint64_t full_bytes) {
  char* end = nullptr;
  const double v = std::strtod(spec.c_str(), &end);
  const std::string rest = end ? std::string(end) : std::string();
  if (end == spec.c_str() || !(v > 0)) throw Error("budget '" + spec + "' must be a positive number");
  if (rest == "%") {
    if (v > 100) throw Error("budget '" + spec + "' exceeds 100%");
    return std::max<uint64_t>(1, uint64_t(double(full_bytes) * v / 100.0));
  }
  if (!rest.empty()) throw Error("budget '" + spec + "': use bytes (e.g. 200000) or a percentage (50%)");
  return uint64_t(v);
}

void resolve_model(const std::string& arg, const std::string& bundled_dir, const std::string& shared_dir,
                   std::string* model_path, std::string* tokenizer_path) {
  if (arg == "stories260K") {
    *model_path = shared_dir + "/models/stories260K.bin";
    *tokenizer_path = shared_dir + "/models/tok512.bin";
    return;
  }
  const bool is_path = arg.find('/') != std::string::npos ||
                       (arg.size() > 4 && arg.compare(arg.size() - 4, 4, ".bin") == 0);
  *model_path = is_path ? arg : bundled_dir + "/" + arg + ".bin";
  const std::string stem = model_path->substr(0, model_path->size() - 4);
  *tokenizer_path = stem + ".tok.bin";
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace llama
