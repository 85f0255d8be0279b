#include <stdio.h>

#include "kvsdk.h"

int main(void) {
  kvsdk_context *ctx = NULL;
  if (kvsdk_version() != KVSDK_VERSION_NUMBER) return 1;
  if (kvsdk_context_create(&ctx, NULL) != KVSDK_OK) return 2;
  kvsdk_context_destroy(ctx);
  printf("consumer linked kvsdk %s\n", kvsdk_version_string());
  return 0;
}
