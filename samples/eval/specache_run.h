// kvsdk-eval's run for policy 'specache': the prompt's prefill, then SpeCache's own decoding
// (llama::SpeCacheDecoder: a pre-decoding step, then output + speculative token per step) for
// every later token, teacher-forced, with the fetch hit rate the cache measured.
#pragma once

#include <cstdint>
#include <vector>

#include "fidelity.h"
#include "session.h"

namespace eval {

// Feeds `tokens` to `s` (a fresh session on a 'specache' cache): tokens before the prompt's last
// one as a chunked prefill (Session::forward), then from the prompt's last token on one decoding
// step per token, each with the speculative token the previous step guessed. `logits`
// (tokens.size() x vocab) receives every position's next-token logits when non-null. Tracks the
// peak cache bytes like the other runs and returns the cache's fetch hit rate (-1 if none).
// The session must not be used for further forward passes afterwards.
double run_specache(llama::Session& s, const std::vector<int>& tokens, const Schedule& schedule,
                    std::vector<float>* logits, uint64_t* peak, uint64_t* prefill_peak);

// run_specache in two parts, so that the cache can be saved and loaded between them:
// specache_prefill feeds tokens[0, n) (the session's cache must be empty; `logits` sized by the
// caller), specache_decode continues a cache holding tokens[0, from) (e.g. loaded from a
// snapshot) with one decoding step per token from `from` on and returns the fetch hit rate.
void specache_prefill(llama::Session& s, const std::vector<int>& tokens, size_t n,
                      std::vector<float>* logits, uint64_t* peak, uint64_t* prefill_peak);
double specache_decode(llama::Session& s, const std::vector<int>& tokens, size_t from,
                       const Schedule& schedule, std::vector<float>* logits, uint64_t* peak,
                       uint64_t* prefill_peak);

}  // namespace eval
