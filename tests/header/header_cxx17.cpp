// The public header must compile as strict C++17 with every warning as an error.
#include "kvsdk.h"

int kvsdk_header_cxx17_check();
int kvsdk_header_cxx17_check() {
  kvsdk_geometry g{};
  kvsdk_policy p{};
  static_assert(sizeof(kvsdk_status) == sizeof(int), "status is an int-sized enum");
  return int(g.n_layers) + p.method + KVSDK_VERSION_MAJOR;
}
