// Versioned option structs (the struct_size rule of include/kvsdk.h's ABI rules): copy a caller's
// struct of any size into the version this library knows. Older (smaller, but at least the first
// version) structs keep defaults for the fields they lack; newer (larger) structs are accepted when
// their unknown tail is zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "util/error.h"

namespace kvsdk {

template <class T>
T read_versioned(const T* caller, const T& defaults, size_t first_version_size, const char* what) {
  KVSDK_REQUIRE(caller != nullptr, what, " is NULL");
  const uint32_t size = caller->struct_size;
  KVSDK_REQUIRE(size >= first_version_size, what, ".struct_size is ", size,
                " (too small; call the *_init function first)");
  T out = defaults;
  const size_t known = sizeof(T);
  std::memcpy(&out, caller, size < known ? size : known);
  if (size > known) {
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(caller) + known;
    for (size_t i = 0; i < size - known; ++i) {
      KVSDK_REQUIRE(tail[i] == 0, what, ".struct_size is ", size,
                    ": fields unknown to this kvsdk version are set");
    }
  }
  out.struct_size = static_cast<uint32_t>(known);
  return out;
}

}  // namespace kvsdk
