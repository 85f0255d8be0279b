// The CUDA backend as the core sees it (backends/backend_ops.h): a kernel table whose memory is
// device memory, and the check that a context's device can run it. Built by nvcc into a library
// configured with CUDA, and against the host execution shim (backends/cuda/host) for the tests of
// builds without CUDA, where backend::install_cuda_backend() makes it the CUDA backend.
//
// Entries of the table that have no device kernel yet throw KVSDK_E_UNSUPPORTED; the cache
// refuses the policies that would need them before anything runs (docs/gpu.md).
#pragma once

#include "backend_ops.h"

namespace kvsdk::cuda {

const backend::DeviceBackend& device_backend();

}  // namespace kvsdk::cuda
