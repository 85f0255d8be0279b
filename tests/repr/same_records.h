// Store tests: two stores hold the same snapshot records for a layer, field for field (what a
// snapshot of the layer holds), e.g. a truncated store and one that never held the removed rows.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/representation.h"
#include "core/tier_record.h"

namespace kvsdk_test {

inline void expect_same_records(const kvsdk::Representation& a, const kvsdk::Representation& b,
                                uint32_t layer) {
  const std::vector<kvsdk::TierRecord> ra = a.save(layer), rb = b.save(layer);
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t h = 0; h < ra.size(); ++h) {
    ASSERT_EQ(ra[h].fields.size(), rb[h].fields.size());
    for (size_t f = 0; f < ra[h].fields.size(); ++f) {
      const kvsdk::TierField &x = ra[h].fields[f], &y = rb[h].fields[f];
      EXPECT_EQ(x.name, y.name);
      EXPECT_TRUE(x.u8 == y.u8 && x.u16 == y.u16 && x.i32 == y.i32 && x.u32 == y.u32 &&
                  x.f32 == y.f32 && x.u64 == y.u64)
          << "layer " << layer << " head " << h << " field " << x.name;
    }
  }
  EXPECT_EQ(a.layer_bytes(layer), b.layer_bytes(layer));
}

}  // namespace kvsdk_test
