/* The module's only header: the public header, unchanged. Inside this repository it is the
 * checkout's include/kvsdk.h; a package checked out elsewhere uses the installed one (found
 * through pkg-config's -I flags). The Swift wrapper covers the experimental calls too (SpeCache,
 * SmallKV's proxy, planner and profiles), so they are declared. */
#define KVSDK_EXPERIMENTAL 1
#if __has_include("../../../../include/kvsdk.h")
#include "../../../../include/kvsdk.h"
#else
#include <kvsdk.h>
#endif
