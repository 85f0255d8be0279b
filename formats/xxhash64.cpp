#include "xxhash64.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <new>

namespace kvsdk::format {

namespace {
XXH64_state_t* state(unsigned char* bytes) {
  return std::launder(reinterpret_cast<XXH64_state_t*>(bytes));
}
const XXH64_state_t* state(const unsigned char* bytes) {
  return std::launder(reinterpret_cast<const XXH64_state_t*>(bytes));
}
}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) { return XXH64(data, size, seed); }

Xxh64Stream::Xxh64Stream(uint64_t seed) {
  static_assert(sizeof(XXH64_state_t) <= sizeof(state_) && alignof(XXH64_state_t) <= 8,
                "Xxh64Stream::state_ must hold an XXH64_state_t");
  XXH64_reset(new (state_) XXH64_state_t, seed);
}

void Xxh64Stream::update(const void* data, size_t size) {
  if (size) XXH64_update(state(state_), data, size);
}

uint64_t Xxh64Stream::digest() const { return XXH64_digest(state(state_)); }

}  // namespace kvsdk::format
