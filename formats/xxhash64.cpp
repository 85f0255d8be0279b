#include "xxhash64.h"

#include <cstring>

namespace kvsdk::format {

namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads (the format is little-endian; kvsdk targets little-endian hosts).
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}

inline uint64_t merge_round(uint64_t acc, uint64_t val) {
  acc ^= round(0, val);
  return acc * kP1 + kP4;
}

// Hashes the tail (< 32 bytes) into h and applies the final avalanche.
uint64_t finish(uint64_t h, const unsigned char* p, size_t len) {
  while (len >= 8) {
    h ^= round(0, load64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
    len -= 8;
  }
  if (len >= 4) {
    h ^= uint64_t(load32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
    len -= 4;
  }
  while (len > 0) {
    h ^= uint64_t(*p) * kP5;
    h = rotl(h, 11) * kP1;
    ++p;
    --len;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

inline void stripes(uint64_t v[4], const unsigned char*& p, const unsigned char* end) {
  while (end - p >= 32) {
    v[0] = round(v[0], load64(p));
    v[1] = round(v[1], load64(p + 8));
    v[2] = round(v[2], load64(p + 16));
    v[3] = round(v[3], load64(p + 24));
    p += 32;
  }
}

inline uint64_t converge(const uint64_t v[4]) {
  uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
  for (int i = 0; i < 4; ++i) h = merge_round(h, v[i]);
  return h;
}

inline void init_lanes(uint64_t v[4], uint64_t seed) {
  v[0] = seed + kP1 + kP2;
  v[1] = seed + kP2;
  v[2] = seed;
  v[3] = seed - kP1;
}

}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* end = p + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v[4];
    init_lanes(v, seed);
    stripes(v, p, end);
    h = converge(v);
  } else {
    h = seed + kP5;
  }
  h += uint64_t(size);
  return finish(h, p, size_t(end - p));
}

Xxh64Stream::Xxh64Stream(uint64_t seed) : seed_(seed) { init_lanes(v_, seed); }

void Xxh64Stream::update(const void* data, size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* end = p + size;
  total_ += size;
  if (buffered_ + size < 32) {
    if (size) std::memcpy(buf_ + buffered_, p, size);
    buffered_ += size;
    return;
  }
  if (buffered_ > 0) {
    const size_t fill = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, fill);
    const unsigned char* b = buf_;
    stripes(v_, b, buf_ + 32);
    p += fill;
    buffered_ = 0;
  }
  stripes(v_, p, end);
  buffered_ = size_t(end - p);
  if (buffered_) std::memcpy(buf_, p, buffered_);
}

uint64_t Xxh64Stream::digest() const {
  uint64_t h = total_ >= 32 ? converge(v_) : seed_ + kP5;
  h += total_;
  return finish(h, buf_, buffered_);
}

}  // namespace kvsdk::format
