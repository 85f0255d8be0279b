// Which kernel table a context's backend kind runs (backends/backend_ops.h).
#include <atomic>

#include "backend_ops.h"
#ifdef KVSDK_HAVE_CUDA
#include "cuda_ops.h"
#endif

namespace kvsdk::backend {
namespace {
std::atomic<const DeviceBackend*> g_installed_cuda{nullptr};
}  // namespace

const DeviceBackend* cuda_backend() {
  if (const DeviceBackend* b = g_installed_cuda.load()) return b;
#ifdef KVSDK_HAVE_CUDA
  return &cuda::device_backend();
#else
  return nullptr;
#endif
}

void install_cuda_backend(const DeviceBackend* backend) { g_installed_cuda.store(backend); }

const Ops* ops_for(kvsdk_backend kind) {
  switch (kind) {
    case KVSDK_BACKEND_CPU: return &cpu_optimized();
    case KVSDK_BACKEND_CPU_REFERENCE: return &cpu_reference();
    case KVSDK_BACKEND_CUDA: {
      const DeviceBackend* b = cuda_backend();
      return b ? b->ops : nullptr;
    }
    default: return nullptr;
  }
}

}  // namespace kvsdk::backend
