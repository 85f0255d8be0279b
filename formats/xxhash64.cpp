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

uint64_t xxh3_64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

uint64_t record_hash(uint16_t major, const void* data, size_t size, uint64_t seed) {
  return uses_xxh3(major) ? XXH3_64bits_withSeed(data, size, seed) : XXH64(data, size, seed);
}

RecordHashStream::RecordHashStream(uint16_t major, uint64_t seed) { reset(major, seed); }

RecordHashStream::~RecordHashStream() {
  if (x3_) XXH3_freeState(static_cast<XXH3_state_t*>(x3_));
}

void RecordHashStream::reset(uint16_t major, uint64_t seed) {
  if (uses_xxh3(major)) {
    if (!x3_) {
      x3_ = XXH3_createState();
      if (!x3_) throw std::bad_alloc();
    }
    XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(x3_), seed);
  } else {
    if (x3_) XXH3_freeState(static_cast<XXH3_state_t*>(x3_));
    x3_ = nullptr;
    x64_ = Xxh64Stream(seed);
  }
}

void RecordHashStream::update(const void* data, size_t size) {
  if (!size) return;
  if (x3_) XXH3_64bits_update(static_cast<XXH3_state_t*>(x3_), data, size);
  else x64_.update(data, size);
}

uint64_t RecordHashStream::digest() const {
  return x3_ ? XXH3_64bits_digest(static_cast<const XXH3_state_t*>(x3_)) : x64_.digest();
}

}  // namespace kvsdk::format
