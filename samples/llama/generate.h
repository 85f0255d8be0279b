// Helpers shared by the demo, chat and eval tools: prompt encoding, chunked prefill, and the
// bytes a full cache needs per token (measured through kvsdk, not assumed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "model.h"
#include "session.h"
#include "tokenizer.h"

namespace llama {

// Token ids of a prompt: SentencePiece vocabularies (stories260K) get BOS and the dummy space
// prefix they were trained with; character-level vocabularies (shakespeare) get neither.
std::vector<int> encode_prompt(const Tokenizer& tok, const std::string& text);

// Feeds `tokens` in chunks of `chunk` tokens; `last_logits` (vocab floats) receives the logits
// after the last token when non-null.
void prefill(Session& s, const std::vector<int>& tokens, size_t chunk, float* last_logits);

// Budgeted bytes one token occupies in an exact (`full`) cache of `model`, over all layers:
// measured by appending one token to a scratch cache and reading its stats.
uint64_t full_cache_bytes_per_token(const Model& model);

// Parses a budget: "N" bytes, or "P%" of `full_bytes`. Throws llama::Error on bad input.
uint64_t parse_budget(const std::string& spec, uint64_t full_bytes);

// The non-empty items of a comma-separated command-line list ("a,b,,c" -> a, b, c).
std::vector<std::string> split_list(const std::string& s);

// Resolves a model argument: a bundled name ("shakespeare-base"), "stories260K" (from
// `shared_dir`/models), or a path to a .bin file; fills the tokenizer path beside it.
void resolve_model(const std::string& arg, const std::string& bundled_dir, const std::string& shared_dir,
                   std::string* model_path, std::string* tokenizer_path);

}  // namespace llama
