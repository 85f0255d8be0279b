// Device working memory of the device stores (src/repr/device_rows.h, device_kivi.h), outside
// the arena like the decode kernel's partials: grown to the largest call and then reused, so a
// decode step allocates nothing once it has grown.
#pragma once

#include <cstddef>

#include "backend_ops.h"

namespace kvsdk {

// One buffer of the backend's memory that only grows.
class DeviceScratch {
 public:
  explicit DeviceScratch(const backend::Ops& device) : device_(device) {}
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least `bytes` bytes (the contents are not kept when it grows). Throws
  // KVSDK_E_NO_MEMORY (the buffer unchanged) when the device has no memory for them.
  void* at_least(size_t bytes);

 private:
  const backend::Ops& device_;
  void* buffer_ = nullptr;
  size_t bytes_ = 0;
};

// The query rows of one attention call, their positions and its output.
class DeviceQueries {
 public:
  explicit DeviceQueries(const backend::Ops& device) : device_(device), scratch_(device) {}

  // Copies `host`'s rows and positions (host pointers) to the device and returns the same
  // QueryRows pointing there. Throws KVSDK_E_NO_MEMORY when the buffer cannot grow (nothing
  // changed), KVSDK_E_BACKEND when the copy fails.
  backend::QueryRows to_device(const backend::QueryRows& host);
  // The same for `heads` heads' rows at once: host.q holds [heads][n_rows][dim], positions
  // [n_rows] (shared); returns head 0's QueryRows (head g's rows and output are g * n_rows *
  // dim floats further), and to_host() copies every head's output.
  backend::QueryRows to_device(const backend::QueryRows& host, size_t heads);
  // Where the attention of the rows of the last to_device() writes its output [n_rows][dim],
  // and the copy of that output to `out` on the host.
  float* device_out() const { return out_; }
  void to_host(float* out) const;

  // Attention of heads [first, first + n) of a device store: one upload of `host` (q rows
  // [n][n_rows][dim], positions shared), attend_head(head, its QueryRows with `group`, its device
  // output) enqueued for each head, one download of every output to `out` [n][n_rows][dim].
  template <class AttendHead>
  void attend_heads(const backend::QueryRows& host, uint32_t first, uint32_t n, uint32_t group,
                    float* out, AttendHead&& attend_head) {
    const backend::QueryRows q = to_device(host, n);
    const size_t elems = host.n_rows * host.dim;
    for (uint32_t i = 0; i < n; ++i) {
      backend::QueryRows qh = q;
      qh.q = q.q + i * elems;
      qh.group = group;
      attend_head(first + i, qh, out_ + i * elems);
    }
    to_host(out);
  }

 private:
  const backend::Ops& device_;
  DeviceScratch scratch_;
  float* out_ = nullptr;
  size_t out_bytes_ = 0;
};

}  // namespace kvsdk
