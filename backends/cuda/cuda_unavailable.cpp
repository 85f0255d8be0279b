// Built when KVSDK_ENABLE_CUDA is off: the CUDA backend reports that it is not compiled in.
#include "kvsdk_cuda.h"
#include "util/error.h"

namespace kvsdk::cuda {

void require_backend(int32_t) {
  fail(KVSDK_E_UNSUPPORTED,
       "this kvsdk was built without CUDA (configure with -DKVSDK_ENABLE_CUDA=ON or the 'cuda' "
       "preset)");
}

}  // namespace kvsdk::cuda
