// A store's planned change (an eviction, a selection of kept rows) that is dropped when the scope
// ends before it was committed: a call that fails between planning and committing leaves the
// store as it was.
#pragma once

#include "core/representation.h"

namespace kvsdk {

template <void (Representation::*Commit)() noexcept, void (Representation::*Drop)() noexcept>
class PendingPlan {
 public:
  explicit PendingPlan(Representation& store) : store_(store) {}
  ~PendingPlan() {
    if (pending_) (store_.*Drop)();
  }
  PendingPlan(const PendingPlan&) = delete;
  PendingPlan& operator=(const PendingPlan&) = delete;
  void commit() noexcept {
    (store_.*Commit)();
    pending_ = false;
  }

 private:
  Representation& store_;
  bool pending_ = true;
};

using PlannedEviction =
    PendingPlan<&Representation::commit_eviction, &Representation::drop_eviction>;
using PlannedKeep = PendingPlan<&Representation::commit_keep, &Representation::drop_keep>;

}  // namespace kvsdk
