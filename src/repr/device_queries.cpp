#include "repr/device_queries.h"

#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

void check_device_head_dim(const backend::Ops& device, uint32_t head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    fail(KVSDK_E_UNSUPPORTED, "a ", device.name, " cache needs head_dim 64, 128 or 256 (the ",
         "device attention kernel's), not ", head_dim);
  }
}

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

DeviceScoring::Buffers DeviceScoring::upload(const backend::QueryRows& q,
                                             const cpu::KeyChunkLoader& keys,
                                             const int32_t* key_pos, size_t held, size_t n_keys) {
  KVSDK_REQUIRE(n_keys >= held, "column sums over ", n_keys, " keys of a head holding ", held);
  const size_t n_tail = n_keys - held, dim = q.dim;
  reserve_for_growth(tail_, n_tail * dim);
  tail_.resize(n_tail * dim);
  if (n_tail) keys(held, n_tail, tail_.data());
  // Device layout: queries, tail keys, columns (floats), then query and tail positions.
  const size_t q_floats = q.n_rows * dim, floats = q_floats + n_tail * dim + n_keys;
  char* at = static_cast<char*>(
      scratch_.at_least(floats * sizeof(float) + (q.n_rows + n_tail) * sizeof(int32_t)));
  Buffers b;
  float* dq = reinterpret_cast<float*>(at);
  b.tail = dq + q_floats;
  b.cols = b.tail + n_tail * dim;
  int32_t* dqpos = reinterpret_cast<int32_t*>(at + floats * sizeof(float));
  b.tail_pos = dqpos + q.n_rows;
  const backend::HostCopy in[] = {
      {dq, q.q, q_floats * sizeof(float)},
      {dqpos, q.positions, q.n_rows * sizeof(int32_t)},
      {b.tail, tail_.data(), n_tail * dim * sizeof(float)},
      {b.tail_pos, key_pos + held, n_tail * sizeof(int32_t)},
  };
  backend::to_backend_all(device_, in, n_tail ? 4 : 2);
  b.q = q;
  b.q.q = dq;
  b.q.positions = dqpos;
  return b;
}

}  // namespace kvsdk
