// C ABI: contexts.
#include <cstddef>
#include <memory>

#include "core/context.h"
#include "kvsdk.h"
#include "backend_ops.h"
#include "util/error.h"
#include "util/options.h"
#include "util/struct_versions.h"

using namespace kvsdk;

namespace {


kvsdk_context_options context_defaults() {
  kvsdk_context_options o{};
  o.struct_size = sizeof(o);
  o.backend = KVSDK_BACKEND_CPU;
  o.device = 0;
  o.budget_bytes = 0;
  o.n_threads = 0;
  return o;
}

}  // namespace

extern "C" {

KVSDK_API kvsdk_status kvsdk_context_options_init_sized(kvsdk_context_options* options,
                                                        size_t struct_size) {
  return guard("kvsdk_context_options_init_sized", [&] {
    init_versioned(options, struct_size, context_defaults(), kContextOptionsSizeV1, "options");
  });
}

// Frozen at the first version's size: an app built before *_init_sized may have that struct.
KVSDK_API kvsdk_status(kvsdk_context_options_init)(kvsdk_context_options* options) {
  return guard("kvsdk_context_options_init", [&] {
    init_versioned(options, kContextOptionsSizeV1, context_defaults(), kContextOptionsSizeV1,
                   "options");
  });
}

KVSDK_API kvsdk_status kvsdk_context_create(kvsdk_context** out,
                                            const kvsdk_context_options* options) {
  return guard("kvsdk_context_create", [&] {
    KVSDK_REQUIRE(out != nullptr, "out is NULL");
    const kvsdk_context_options defaults = context_defaults();
    const kvsdk_context_options o =
        options ? read_versioned(options, defaults, kContextOptionsSizeV1, "options")
                : defaults;
    KVSDK_REQUIRE(o.backend == KVSDK_BACKEND_CPU || o.backend == KVSDK_BACKEND_CUDA ||
                      o.backend == KVSDK_BACKEND_CPU_REFERENCE,
                  "options.backend is ", o.backend, " (not a kvsdk_backend)");
    KVSDK_REQUIRE(o.n_threads >= 0 && o.n_threads <= KVSDK_MAX_THREADS, "options.n_threads is ",
                  o.n_threads, " (0 = every core, or 1 .. ", KVSDK_MAX_THREADS, ")");
    if (o.backend == KVSDK_BACKEND_CUDA) {
      const backend::DeviceBackend* cuda = backend::cuda_backend();
      if (!cuda) {
        fail(KVSDK_E_UNSUPPORTED, "this kvsdk was built without CUDA (configure with ",
             "-DKVSDK_ENABLE_CUDA=ON or the 'cuda' preset)");
      }
      KVSDK_REQUIRE(o.budget_bytes > 0, "a CUDA context needs options.budget_bytes > 0: its ",
                    "caches live in one device allocation of exactly the budget");
      cuda->require_device(o.device);
    }
    auto handle = std::make_unique<kvsdk_context>();
    handle->impl = std::make_shared<Context>(kvsdk_backend(o.backend), o.device, o.budget_bytes,
                                             size_t(o.n_threads));
    *out = handle.release();
  });
}

KVSDK_API void kvsdk_context_destroy(kvsdk_context* ctx) { delete ctx; }

KVSDK_API kvsdk_status kvsdk_context_used_bytes(const kvsdk_context* ctx, uint64_t* out_bytes) {
  return guard("kvsdk_context_used_bytes", [&] {
    KVSDK_REQUIRE(ctx != nullptr, "ctx is NULL");
    KVSDK_REQUIRE(out_bytes != nullptr, "out_bytes is NULL");
    *out_bytes = ctx->impl->used();
  });
}

KVSDK_API kvsdk_status kvsdk_context_budget_bytes(const kvsdk_context* ctx, uint64_t* out_bytes) {
  return guard("kvsdk_context_budget_bytes", [&] {
    KVSDK_REQUIRE(ctx != nullptr, "ctx is NULL");
    KVSDK_REQUIRE(out_bytes != nullptr, "out_bytes is NULL");
    *out_bytes = ctx->impl->budget();
  });
}

}  // extern "C"
