// Device working memory of the device stores (src/repr/device_rows.h, device_kivi.h), outside
// the arena like the decode kernel's partials: grown to the largest call and then reused, so a
// decode step allocates nothing once it has grown.
#pragma once

#include <cstddef>
#include <vector>

#include "backend_ops.h"

namespace kvsdk {

// Every device store's first check: throws KVSDK_E_UNSUPPORTED (naming the backend) for a
// head_dim the device attention kernel lacks (it has 64, 128 and 256).
void check_device_head_dim(const backend::Ops& device, uint32_t head_dim);

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

// The transfers of a device store's column_sums_here() (core/representation.h): the host query
// rows and the incoming rows' keys (f32, from the loader: keys [held, n_keys)) with their
// positions go in, n_keys column sums come out; the held rows' keys stay where they are.
class DeviceScoring {
 public:
  explicit DeviceScoring(const backend::Ops& device) : device_(device), scratch_(device) {}

  // Uploads, then run(q on the device, tail keys, tail positions, n_tail, device columns) enqueues
  // the backend's column_sums_rows, then downloads the columns to col_sums [n_keys]. Throws
  // KVSDK_E_NO_MEMORY / KVSDK_E_BACKEND (nothing kept).
  template <class Run>
  void score(const backend::QueryRows& q, const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
             size_t held, size_t n_keys, float* col_sums, Run&& run) {
    const Buffers b = upload(q, keys, key_pos, held, n_keys);
    run(b.q, b.tail, b.tail_pos, n_keys - held, b.cols);
    device_.to_host(col_sums, b.cols, n_keys * sizeof(float));
  }

 private:
  struct Buffers {
    backend::QueryRows q;
    float* tail;
    int32_t* tail_pos;
    float* cols;
  };
  Buffers upload(const backend::QueryRows& q, const cpu::KeyChunkLoader& keys,
                 const int32_t* key_pos, size_t held, size_t n_keys);

  const backend::Ops& device_;
  DeviceScratch scratch_;
  std::vector<float> tail_;  // the incoming keys on the host (reused)
};

}  // namespace kvsdk
