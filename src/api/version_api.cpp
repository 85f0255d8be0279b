// C ABI: version, status strings and the thread-local last error.
#include "kvsdk.h"

namespace kvsdk {
const char* last_error();
}

extern "C" {

KVSDK_API uint32_t kvsdk_version(void) { return KVSDK_VERSION_NUMBER; }

#define KVSDK_STR2(x) #x
#define KVSDK_STR(x) KVSDK_STR2(x)
KVSDK_API const char* kvsdk_version_string(void) {
  return KVSDK_STR(KVSDK_VERSION_MAJOR) "." KVSDK_STR(KVSDK_VERSION_MINOR) "." KVSDK_STR(
      KVSDK_VERSION_PATCH);
}

KVSDK_API const char* kvsdk_status_str(int32_t status) {
  switch (status) {
    case KVSDK_OK: return "ok";
    case KVSDK_E_INVALID_ARG: return "invalid argument";
    case KVSDK_E_OUT_OF_RANGE: return "index out of range";
    case KVSDK_E_BUDGET: return "memory budget exceeded";
    case KVSDK_E_NO_MEMORY: return "out of memory";
    case KVSDK_E_UNSUPPORTED: return "not supported";
    case KVSDK_E_IO: return "input/output error";
    case KVSDK_E_CORRUPT: return "corrupt data";
    case KVSDK_E_VERSION: return "unsupported format version";
    case KVSDK_E_GEOMETRY: return "geometry mismatch";
    case KVSDK_E_STATE: return "invalid state for this call";
    case KVSDK_E_BACKEND: return "backend error";
    case KVSDK_E_INTERNAL: return "internal error";
  }
  return "unknown status";
}

KVSDK_API const char* kvsdk_last_error(void) { return kvsdk::last_error(); }

}  // extern "C"
