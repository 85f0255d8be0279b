// Entry points of the CUDA backend that the core calls. Without CUDA in the build they are
// implemented by cuda_unavailable.cpp and report KVSDK_E_UNSUPPORTED.
#pragma once

#include <cstdint>

namespace kvsdk::cuda {

// Throws kvsdk::Error unless a CUDA context on `device` can hold kvsdk caches.
void require_backend(int32_t device);

}  // namespace kvsdk::cuda
