/* Uses an experimental declaration (include/kvsdk.h, "Experimental API"): compiles only when the
 * includer defines KVSDK_EXPERIMENTAL (tests/CMakeLists.txt builds it both ways). */
#include "kvsdk.h"

int kvsdk_experimental_use(kvsdk_cache *cache);
int kvsdk_experimental_use(kvsdk_cache *cache) {
  double hit = 0;
  uint64_t samples = 0;
  return (int)kvsdk_cache_fetch_stats(cache, &hit, &samples);
}
