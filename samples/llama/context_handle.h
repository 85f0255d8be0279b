// A kvsdk context that lives as long as a scope: the tools create one per run, with the run's
// budget (0 = unlimited), and must release it however the run ends.
#pragma once

#include <cstdint>

#include "error.h"
#include "kvsdk.h"

namespace llama {

struct ContextHandle {
  kvsdk_context* ctx = nullptr;
  explicit ContextHandle(uint64_t budget) {
    kvsdk_context_options o;
    kvsdk_context_options_init(&o);
    o.budget_bytes = budget;
    check(kvsdk_context_create(&ctx, &o), "kvsdk_context_create");
  }
  ~ContextHandle() { kvsdk_context_destroy(ctx); }
  ContextHandle(const ContextHandle&) = delete;
  ContextHandle& operator=(const ContextHandle&) = delete;
};

}  // namespace llama
