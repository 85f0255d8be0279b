// The positions contract of kvsdk.h (KVSDK_MAX_POSITION): every key position the API takes and
// a snapshot holds lies in 0 .. KVSDK_MAX_POSITION = INT32_MAX - 1, and p + 1 of one never
// overflows. A query position lies in the same range or is INT32_MAX, "a query without a
// position", which sees every key (what q_positions NULL means, and how windows save such
// queries). Order and repeats are not restricted (kvsdk.h says why).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvsdk.h"
#include "util/error.h"

namespace kvsdk {

static_assert(KVSDK_MAX_POSITION == INT32_MAX - 1, "kvsdk.h documents INT32_MAX - 1");

constexpr bool valid_position(int32_t p) { return p >= 0 && p <= KVSDK_MAX_POSITION; }
constexpr int32_t kUnpositionedQuery = INT32_MAX;
constexpr bool valid_query_position(int32_t p) {
  return valid_position(p) || p == kUnpositionedQuery;
}

// Fail with `status` naming the first of `n` positions outside the range, as
// "<name>[<index>] is <value> ...". KVSDK_E_INVALID_ARG for arguments, KVSDK_E_CORRUPT for files.
inline void check_positions(const int32_t* positions, size_t n, const char* name,
                            kvsdk_status status = KVSDK_E_INVALID_ARG) {
  for (size_t i = 0; i < n; ++i) {
    if (!valid_position(positions[i])) {
      fail(status, name, "[", i, "] is ", positions[i],
           " (positions lie in 0 .. KVSDK_MAX_POSITION = ", KVSDK_MAX_POSITION, ")");
    }
  }
}
inline void check_query_positions(const int32_t* positions, size_t n, const char* name,
                                  kvsdk_status status = KVSDK_E_INVALID_ARG) {
  for (size_t i = 0; i < n; ++i) {
    if (!valid_query_position(positions[i])) {
      fail(status, name, "[", i, "] is ", positions[i],
           " (query positions lie in 0 .. KVSDK_MAX_POSITION = ", KVSDK_MAX_POSITION,
           ", or are INT32_MAX: no position, every key seen)");
    }
  }
}

}  // namespace kvsdk
