/* The module's only header: the repository's public header, unchanged. */
#include "../../../../include/kvsdk.h"
