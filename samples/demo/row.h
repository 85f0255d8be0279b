// One row of the demo's table: a policy at a budget, measured on one conversation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvsdk.h"
#include "model.h"

namespace demo {

// "POLICY[@BUDGET]" from --policy (e.g. "snapkv+kivi2@25%"); BUDGET is bytes or P% of the full
// cache for prompt + generated tokens.
struct RowSpec {
  std::string policy, budget;
};

// What every row shares: the models, the prompt, the generation settings, and the full cache's
// run on the same prompt (the reference for top-1 agreement and the snapshot ratio).
struct Setup {
  const llama::Model* model = nullptr;
  const llama::Model* proxy = nullptr;  // smallkv's proxy model, or null
  std::string model_path, proxy_path, proxy_name;
  std::vector<int> prompt;
  int tokens = 0, suspend_at = 0;
  float temperature = 0;
  uint64_t seed = 0;
  int kivi_residual = -1;      // KIVI's exact residual window R for every row; -1: the library's
  uint64_t full_bytes = 0;     // a full cache of prompt + tokens
  std::string snapshot;        // where the rows write their snapshots

  // Filled by run_reference():
  std::vector<int> full_tokens;  // the full cache's generated tokens
  std::vector<int> full_argmax;  // argmax of its logits before each generated token
  uint64_t full_snapshot_bytes = 0;  // its snapshot at the suspend point
};

struct Row {
  RowSpec spec;
  uint64_t budget_bytes = 0;
  bool ran = false;            // false: refused (see status and why)
  kvsdk_status status = KVSDK_OK;
  std::string why;             // refusal or failure, from the library's message
  uint64_t peak_bytes = 0;     // most budgeted KV bytes over the uninterrupted run
  uint64_t suspend_bytes = 0;  // KV bytes when the snapshot was taken
  double kept_share = 0;       // tokens held at the suspend point / tokens seen (mean over heads)
  uint64_t snapshot_bytes = 0; // the snapshot file (SpeCache: with its backing store)
  uint64_t proxy_bytes = 0;    // smallkv: the proxy's own full cache, outside the budget
  uint64_t backing_bytes = 0;  // specache: the off-budget backing store at the suspend point
  double hit_rate = -1;        // specache: fetch hit rate of the uninterrupted run
  double tokens_per_s = 0;     // decode speed of the uninterrupted run (generated tokens)
  double top1 = 0;             // share of steps whose argmax equals full's (teacher-forced)
  bool identical = false;      // the resumed continuation equals the uninterrupted one
  std::vector<int> generated;  // the uninterrupted run's tokens
  int child_pid = 0;
};

// Parses "POLICY[@BUDGET]"; `default_budget` when there is no '@'.
RowSpec parse_row_spec(const std::string& item, const std::string& default_budget);

// Runs the full cache (unlimited budget) on the setup's prompt: fills full_tokens, full_argmax
// and full_snapshot_bytes.
void run_reference(Setup* s);

// Measures one row: the uninterrupted run (peak bytes, speed), the same run suspended to a
// snapshot and resumed in a new process (identical?), and a run teacher-forced on the full
// cache's tokens (top-1 agreement). A row whose policy cannot meet its budget (KVSDK_E_BUDGET)
// comes back with ran = false; other failures throw.
Row run_row(const Setup& s, const RowSpec& spec);

}  // namespace demo
