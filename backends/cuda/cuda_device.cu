// CUDA backend entry: device discovery. Cache storage and kernels on the device are not
// implemented yet (issue: CUDA backend), so a CUDA context reports KVSDK_E_UNSUPPORTED after
// checking that the device exists.
#include <cuda_runtime.h>

#include "kvsdk_cuda.h"
#include "util/error.h"

namespace kvsdk::cuda {

void require_backend(int32_t device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    fail(KVSDK_E_BACKEND, "no CUDA device is available (",
         err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0", ")");
  }
  if (device < 0 || device >= count) {
    fail(KVSDK_E_INVALID_ARG, "options.device is ", device, " but ", count,
         " CUDA device(s) are present");
  }
  fail(KVSDK_E_UNSUPPORTED, "the CUDA cache backend is not implemented in this version of kvsdk");
}

}  // namespace kvsdk::cuda
