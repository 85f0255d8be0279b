// Allocation profiles (XKV paper §IV-C, "sampling"): the per-layer allocation lists of sample
// requests of one task type, normalised to shares of their total and averaged, saved as
// FlatBuffers (formats/allocation_profile.fbs) and applied to caches of that task type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvsdk::policy {

class AllocationProfile {
 public:
  explicit AllocationProfile(uint32_t n_layers) : sums_(n_layers, 0.0) {}

  uint32_t n_layers() const { return uint32_t(sums_.size()); }
  uint32_t samples() const { return samples_; }
  void record(const std::vector<uint64_t>& tokens);  // throws on a mismatched or all-zero list
  std::vector<double> shares() const;                  // sums / samples

  std::vector<uint8_t> serialize() const;
  static AllocationProfile deserialize(const uint8_t* data, size_t size);  // KVSDK_E_CORRUPT/VERSION
  void save(const std::string& path) const;                                // atomic
  static AllocationProfile load(const std::string& path);

 private:
  std::vector<double> sums_;
  uint32_t samples_ = 0;
};

}  // namespace kvsdk::policy
