/* The public header must compile as strict C99 with every warning as an error. */
#include "kvsdk.h"

int kvsdk_header_c99_check(void);
int kvsdk_header_c99_check(void) {
  kvsdk_geometry g;
  kvsdk_policy p;
  kvsdk_cache_stats s;
  (void)g; (void)p; (void)s;
  return KVSDK_VERSION_NUMBER + (int)KVSDK_E_INTERNAL + KVSDK_TIER_SLOTS;
}
