// Helpers of the CUDA backend tests: skipping without a device, and RAII device buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kvsdk::cuda::test {

// Empty when a device is usable, else why not.
inline std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "cudaGetDeviceCount returned 0";
  return {};
}

// Without a device a test skips, saying why; built against the host execution shim (which
// always has its device) it fails instead, so that no kernel test can pass in CI without having
// run its kernel.
#ifdef KVSDK_CUDA_HOST_SHIM
#define KVSDK_NO_CUDA_DEVICE(why) FAIL() << "no CUDA device under the host shim: " << (why)
#else
#define KVSDK_NO_CUDA_DEVICE(why) GTEST_SKIP() << "no CUDA device: " << (why)
#endif

// First statement of every test that touches the device.
#define KVSDK_REQUIRE_CUDA_DEVICE()                                                 \
  do {                                                                              \
    const std::string why_ = ::kvsdk::cuda::test::cuda_unavailable_reason();        \
    if (!why_.empty()) KVSDK_NO_CUDA_DEVICE(why_);                                  \
  } while (0)

#define KVSDK_CUDA_OK(expr) ASSERT_EQ(cudaSuccess, (expr)) << #expr

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaSuccess, cudaMemcpy(p_, host.data(), host.size() * sizeof(T),
                                      cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  size_t n_;
  void* p_ = nullptr;
};

// `v`, or one element when it is empty: a device buffer of none has no pointer to pass.
template <class T>
std::vector<T> some(std::vector<T> v) {
  if (v.empty()) v.resize(1);
  return v;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace kvsdk::cuda::test
