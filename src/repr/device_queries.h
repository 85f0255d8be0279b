// The device working memory of a device store's attention (src/repr/device_rows.h,
// device_kivi.h): the query rows of one call, their positions and its output, in one buffer of
// the backend's memory outside the arena, grown to the largest call and then reused, so a decode
// step allocates nothing once it has grown.
#pragma once

#include <cstddef>

#include "backend_ops.h"

namespace kvsdk {

class DeviceQueries {
 public:
  explicit DeviceQueries(const backend::Ops& device) : device_(device) {}
  ~DeviceQueries();
  DeviceQueries(const DeviceQueries&) = delete;
  DeviceQueries& operator=(const DeviceQueries&) = delete;

  // Copies `host`'s rows and positions (host pointers) to the device and returns the same
  // QueryRows pointing there. Throws KVSDK_E_NO_MEMORY when the buffer cannot grow (nothing
  // changed), KVSDK_E_BACKEND when the copy fails.
  backend::QueryRows to_device(const backend::QueryRows& host);
  // Where the attention of the rows of the last to_device() writes its output [n_rows][dim],
  // and the copy of that output to `out` on the host.
  float* device_out() const { return out_; }
  void to_host(float* out) const;

 private:
  const backend::Ops& device_;
  void* buffer_ = nullptr;
  size_t bytes_ = 0;
  float* out_ = nullptr;
  size_t out_bytes_ = 0;
};

}  // namespace kvsdk
