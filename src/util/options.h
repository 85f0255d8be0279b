// Versioned option structs (the struct_size rule of include/kvsdk.h's ABI rules): copy a caller's
// struct of any size into the version this library knows. Older (smaller, but at least the first
// version) structs keep defaults for the fields they lack; newer (larger) structs are accepted when
// their unknown tail is zero. Output structs go the other way (write_versioned): a caller's
// struct of any size from the first version up receives the fields it has room for; the
// *_init_sized entry points fill a struct of the caller's size with defaults (init_versioned).
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

// Writes `value` into the caller's output struct `out`: the first min(out->struct_size,
// sizeof(T)) bytes, so that an app built against an older (smaller) or newer (larger) kvsdk.h
// gets every field its struct has, and bytes past sizeof(T) are left as the app set them. Sets
// out->struct_size to the bytes written. Refuses (and writes nothing) a struct_size below the
// first version's.
template <class T>
void write_versioned(T* out, const T& value, size_t first_version_size, const char* what) {
  KVSDK_REQUIRE(out != nullptr, what, " is NULL");
  const uint32_t size = out->struct_size;
  KVSDK_REQUIRE(size >= first_version_size, what, "->struct_size is ", size,
                " (too small; call the *_init function first)");
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  T copy = value;
  copy.struct_size = static_cast<uint32_t>(n);
  std::memcpy(out, &copy, n);
}

// The size check of init_versioned, for entry points that must refuse a too-small struct before
// doing other work (e.g. kvsdk_policy_parse_sized, before parsing).
inline void require_init_size(size_t size, size_t first_version_size, const char* what) {
  KVSDK_REQUIRE(size >= first_version_size, "struct_size ", size, " is below the ",
                first_version_size, " bytes of the first version of ", what,
                "'s struct (pass sizeof of the struct)");
}

// The *_init_sized entry points (include/kvsdk.h, "Initialising a struct"): `size` is the size
// of the app's struct, which may be older (smaller) or newer (larger) than T. Writes the first
// min(size, sizeof(T)) bytes of `defaults` to `out`, struct_size set to that count, so that no
// byte past the app's struct is ever touched. Refuses (and writes nothing) a NULL `out` or a size
// below the first version's.
template <class T>
void init_versioned(T* out, size_t size, const T& defaults, size_t first_version_size,
                    const char* what) {
  KVSDK_REQUIRE(out != nullptr, what, " is NULL");
  require_init_size(size, first_version_size, what);
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  T copy = defaults;
  copy.struct_size = static_cast<uint32_t>(n);
  std::memcpy(out, &copy, n);
}

}  // namespace kvsdk
