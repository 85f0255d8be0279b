// The demo's second process: kvsdk-demo re-executes itself with --resume-child to continue a
// conversation from its snapshot. It shares nothing with the parent but the snapshot files and
// the few numbers of ChildArgs on its command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy_runner.h"

namespace demo {

struct ChildArgs {
  std::string model_path, proxy_model_path;  // proxy: smallkv only
  std::string snapshot, out;
  uint64_t budget = 0;
  ResumePoint at;
  int pending = 0;    // the token chosen before the suspend but not fed yet
  int remaining = 0;  // tokens to generate
  float temperature = 0;
  uint64_t rng_state = 1;
  int pid = 0;        // set by resume_in_new_process
};

// Parses the child's flags from argv (the parent's own flags are not accepted here). Returns
// false when argv is not a child's command line.
bool parse_child_args(int argc, char** argv, ChildArgs* a);

// In the child: loads the snapshot, generates `remaining` tokens, writes them to `out`.
int run_child(const ChildArgs& a);

// In the parent: runs the child and returns the tokens it generated. Throws llama::Error when
// the child fails.
std::vector<int> resume_in_new_process(ChildArgs& a);

}  // namespace demo
