// Working memory of the importance signals' column sums (policy/importance.h), reused across
// calls (heads, layers, decode steps): the group's gathered query rows, one call's column sums
// and the scoring kernel's logits. Once it has grown to the largest call, scoring allocates
// nothing (the decode path of h2o and the window methods). Not shared between threads. Apart
// from importance.h, and in namespace kvsdk rather than kvsdk::policy, so that holders such as
// Cache keep one without bringing the policy namespace into their includers.
#pragma once

#include <cstdint>
#include <vector>

#include "backend_ops.h"

namespace kvsdk {

class Representation;

struct ScoreScratch {
  std::vector<float> rows, sums;
  std::vector<int32_t> pos;
  // The kernels scoring runs (the cache's backend; the optimized CPU one by default) and their
  // working memory (created on first use).
  const backend::Ops* ops = &backend::cpu_optimized();
  backend::WorkspaceHandle ws;

  // Set by the cache for one layer's scoring when its rows may live in a device backend's
  // memory: the store's column_sums_here() runs first, ops->column_sums when it declines.
  const Representation* rows_store = nullptr;
  uint32_t rows_layer = 0;

  void set_ops(const backend::Ops& o) {
    ops = &o;
    ws.reset();
  }
  backend::Workspace& workspace() {
    if (!ws) ws = backend::WorkspaceHandle(*ops);
    return ws.get();
  }
};

}  // namespace kvsdk
