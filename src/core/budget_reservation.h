// One change of a cache's bytes under its budget (the cache's own cap and its context's): reserve
// an upper bound of the growth before the change, settle the exact change after it. Whatever is
// still held when the reservation goes out of scope returns to the context, so a failure anywhere
// between the two rolls the budget back. Every path of Cache that changes bytes goes through one.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/context.h"

namespace kvsdk {

class BudgetReservation {
 public:
  // `charged`: the bytes the cache holds charged to `ctx`; `cap`: its own budget (0 = none).
  BudgetReservation(Context& ctx, uint64_t& charged, uint64_t cap)
      : ctx_(ctx), charged_(charged), cap_(cap) {}
  ~BudgetReservation() { ctx_.release(held_); }
  BudgetReservation(const BudgetReservation&) = delete;
  BudgetReservation& operator=(const BudgetReservation&) = delete;

  // Holds `bytes` more if both budgets allow; false (nothing changed) otherwise.
  bool reserve(uint64_t bytes) {
    if (cap_ != 0) {
      const uint64_t after = charged_ + held_;
      if (bytes > cap_ || after > cap_ - bytes) return false;
    }
    if (!ctx_.try_reserve(bytes)) return false;
    held_ += bytes;
    return true;
  }
  // An eviction freed `bytes` of the cache's charge for what follows: they stay charged to the
  // context and are held here instead.
  void take_from_charge(uint64_t bytes) noexcept {
    charged_ -= bytes;
    held_ += bytes;
  }
  // The cache's bytes went from `before` to `after`: the growth is charged out of what is held and
  // the rest (and any shrink) returned to the context. Returns the growth that nothing held
  // covered (0 unless a store outgrew its bound, a bug the caller reports as KVSDK_E_INTERNAL);
  // that part is charged to neither, so the budgets never exceed what was reserved.
  uint64_t settle(uint64_t before, uint64_t after) noexcept {
    uint64_t unbacked = 0;
    if (after >= before) {
      const uint64_t grown = after - before;
      const uint64_t covered = std::min(held_, grown);
      unbacked = grown - covered;
      ctx_.release(held_ - covered);
      charged_ += covered;
    } else {
      ctx_.release(held_ + (before - after));
      charged_ -= before - after;
    }
    held_ = 0;
    return unbacked;
  }
  // Charges everything held to the cache (the caller set its bytes to charged + held()).
  void commit() noexcept {
    charged_ += held_;
    held_ = 0;
  }
  uint64_t held() const { return held_; }

 private:
  Context& ctx_;
  uint64_t& charged_;
  const uint64_t cap_;
  uint64_t held_ = 0;
};

}  // namespace kvsdk
