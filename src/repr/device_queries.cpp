#include "repr/device_queries.h"

#include "util/error.h"

namespace kvsdk {

DeviceScratch::~DeviceScratch() {
  if (buffer_) device_.free(buffer_);
}

void* DeviceScratch::at_least(size_t bytes) {
  if (bytes > bytes_) {
    void* more = device_.alloc(bytes);
    if (!more) fail(KVSDK_E_NO_MEMORY, device_.name, ": no device memory for working buffers");
    if (buffer_) device_.free(buffer_);
    buffer_ = more;
    bytes_ = bytes;
  }
  return buffer_;
}

backend::QueryRows DeviceQueries::to_device(const backend::QueryRows& host) {
  return to_device(host, 1);
}

backend::QueryRows DeviceQueries::to_device(const backend::QueryRows& host, size_t heads) {
  const size_t q_bytes = heads * host.n_rows * host.dim * sizeof(float);
  const size_t pos_bytes = host.n_rows * sizeof(int32_t);
  // Queries, outputs, positions (16-byte aligned).
  char* at = static_cast<char*>(scratch_.at_least(2 * q_bytes + pos_bytes));
  float* q = reinterpret_cast<float*>(at);
  int32_t* pos = reinterpret_cast<int32_t*>(at + 2 * q_bytes);
  out_ = reinterpret_cast<float*>(at + q_bytes);
  out_bytes_ = q_bytes;
  device_.to_backend(q, host.q, q_bytes);
  device_.to_backend(pos, host.positions, pos_bytes);
  backend::QueryRows rows = host;
  rows.q = q;
  rows.positions = pos;
  return rows;
}

void DeviceQueries::to_host(float* out) const { device_.to_host(out, out_, out_bytes_); }

}  // namespace kvsdk
