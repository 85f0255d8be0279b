// Writes evaluation records as JSON, a Markdown table and a gnuplot PNG (quality vs memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace eval {

struct Record {
  std::string model;
  std::string policy;
  int budget_pct = 0;
  uint64_t budget_bytes = 0;
  bool ok = false;
  std::string status;        // "ok", "skipped" (the cell cannot run on this model: `error`
                             // says why), or the kvsdk status that stopped the run
  std::string error;         // kvsdk_last_error() detail when not ok
  uint64_t cache_bytes = 0;  // peak bytes the cache held (0 when the run failed)
  uint64_t full_cache_bytes = 0;
  uint64_t snapshot_bytes = 0, full_snapshot_bytes = 0;  // kvsdk snapshot at the end of the run
  double ppl = 0, ppl_full = 0, top1_agreement = 0, kl = 0;
  size_t context_tokens = 0, prompt_tokens = 0;
  double fetch_hit_rate = -1;  // SpeCache's fetch hit rate; -1: not applicable
};

// Each writer throws llama::Error when the file cannot be written.
void write_json(const std::string& path, const std::vector<Record>& records);
void write_markdown(const std::string& path, const std::vector<Record>& records);
// Runs gnuplot (must be on PATH) to draw top-1 agreement and KL against cache bytes as a share
// of the full cache, one panel per model, one line per policy.
void write_plot(const std::string& path, const std::vector<Record>& records);

}  // namespace eval
