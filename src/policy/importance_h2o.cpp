// H2O heavy-hitter signal (Zhang et al. 2023; docs/papers.md): the accumulated column sums of
// attention probabilities. Each observed query (decode step or prompt query) adds its probabilities
// to the persistent per-token score of the tokens it sees; evicted tokens take their score with
// them and kept tokens keep theirs, so the ranking survives compression and suspend/resume.
#include "policy/importance.h"

namespace kvsdk::policy {

void h2o_accumulate(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                    const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                    float* scores) {
  group_column_sums(queries, g, kv_head, keys, key_pos, n_keys, scores);
}

void h2o_accumulate(const QueryBlock& queries, const Geometry& g, uint32_t kv_head,
                    const cpu::KeyChunkLoader& keys, const int32_t* key_pos, size_t n_keys,
                    float* scores, ScoreScratch& scratch) {
  group_column_sums(queries, g, kv_head, keys, key_pos, n_keys, scores, scratch);
}

}  // namespace kvsdk::policy
