// Working memory of the importance signals' column sums (policy/importance.h), reused across
// calls: once it has grown to the largest call, scoring allocates nothing (the decode path of h2o
// and the window methods). In namespace kvsdk, not kvsdk::policy, so that holders such as Cache
// can include it without bringing the policy namespace into their includers.
#pragma once

#include <cstdint>
#include <vector>

namespace kvsdk {

struct ColumnSumsScratch {
  std::vector<float> rows, sums, logits, keys;
  std::vector<int32_t> pos;
};

}  // namespace kvsdk
