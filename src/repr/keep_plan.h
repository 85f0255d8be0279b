// A layer's planned selection as the row stores of the exact tier keep it (ExactRows, DeviceRows:
// Representation::plan_keep): the kept candidate indices per KV head and the incoming rows they
// may come from, held until commit_keep() or drop_keep(). The buffers are reused from one plan
// to the next, so a selection pass of the decode path allocates nothing once they have grown.
#pragma once

#include <cstdint>
#include <vector>

#include "core/representation.h"
#include "util/error.h"

namespace kvsdk {

struct KeepPlan {
  bool active = false;                      // planned and not yet committed or dropped
  std::vector<std::vector<uint32_t>> keep;  // [kv_head]
  Representation::IncomingRows incoming{};
  bool has_incoming = false;

  // Takes a new plan's indices and incoming rows, inactive until the store marks it active
  // (replacing a plan: a throw in between leaves nothing planned). KVSDK_E_INTERNAL for a plan
  // of another number of KV heads.
  void assign(const std::vector<std::vector<uint32_t>>& kept,
              const Representation::IncomingRows* in, uint32_t n_kv_heads) {
    if (kept.size() != n_kv_heads) {
      fail(KVSDK_E_INTERNAL, "plan_keep: ", kept.size(), " heads for ", n_kv_heads);
    }
    active = false;
    keep.resize(n_kv_heads);
    for (uint32_t h = 0; h < n_kv_heads; ++h) {
      keep[h].assign(kept[h].begin(), kept[h].end());  // capacity reused
    }
    has_incoming = in != nullptr;
    incoming = in ? *in : Representation::IncomingRows{};
  }
};

}  // namespace kvsdk
