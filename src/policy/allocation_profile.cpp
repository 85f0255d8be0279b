#include "policy/allocation_profile.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "allocation_profile_generated.h"
#include "util/error.h"

namespace kvsdk::policy {

namespace {

constexpr uint32_t kFormatMajor = 1;
constexpr uint32_t kFormatMinor = 0;
constexpr uint32_t kMaxLayers = 4096;

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t checksum(uint32_t major, uint32_t minor, uint32_t layers, uint32_t samples,
                  const double* sums, size_t n) {
  uint64_t h = 14695981039346656037ull;
  const uint32_t head[4] = {major, minor, layers, samples};
  h = fnv1a(h, head, sizeof(head));
  return fnv1a(h, sums, n * sizeof(double));
}

}  // namespace

void AllocationProfile::record(const std::vector<uint64_t>& tokens) {
  KVSDK_REQUIRE(tokens.size() == sums_.size(), "the allocation has ", tokens.size(),
                " layers but the profile has ", sums_.size());
  double total = 0;
  for (uint64_t t : tokens) total += double(t);
  KVSDK_REQUIRE(total > 0, "the allocation list is all zero");
  for (size_t i = 0; i < tokens.size(); ++i) sums_[i] += double(tokens[i]) / total;
  ++samples_;
}

std::vector<double> AllocationProfile::shares() const {
  if (samples_ == 0) fail(KVSDK_E_STATE, "the profile has no recorded allocation");
  std::vector<double> s(sums_.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = sums_[i] / samples_;
  return s;
}

std::vector<uint8_t> AllocationProfile::serialize() const {
  if (samples_ == 0) fail(KVSDK_E_STATE, "the profile has no recorded allocation");
  flatbuffers::FlatBufferBuilder b(256 + sums_.size() * 8);
  const auto sums = b.CreateVector(sums_);
  const uint64_t sum = checksum(kFormatMajor, kFormatMinor, n_layers(), samples_, sums_.data(),
                                sums_.size());
  b.Finish(fb::CreateAllocationProfile(b, kFormatMajor, kFormatMinor, n_layers(), samples_, sums,
                                       sum),
           fb::AllocationProfileIdentifier());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

AllocationProfile AllocationProfile::deserialize(const uint8_t* data, size_t size) {
  if (size < 8 || !fb::AllocationProfileBufferHasIdentifier(data)) {
    fail(KVSDK_E_CORRUPT, "not an allocation profile (identifier KVAP missing)");
  }
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 8;
  opts.max_tables = 16;
  flatbuffers::Verifier v(data, size, opts);
  if (!fb::VerifyAllocationProfileBuffer(v)) fail(KVSDK_E_CORRUPT, "allocation profile fails verification");
  const fb::AllocationProfile* p = fb::GetAllocationProfile(data);
  if (p->format_major() > kFormatMajor) {
    fail(KVSDK_E_VERSION, "allocation profile format ", p->format_major(), " is newer than ",
         kFormatMajor);
  }
  const auto* sums = p->share_sums();
  if (!sums || p->n_layers() == 0 || p->n_layers() > kMaxLayers || sums->size() != p->n_layers() ||
      p->samples() == 0) {
    fail(KVSDK_E_CORRUPT, "allocation profile fields are inconsistent");
  }
  std::vector<double> s(sums->begin(), sums->end());
  if (checksum(p->format_major(), p->format_minor(), p->n_layers(), p->samples(), s.data(),
               s.size()) != p->checksum()) {
    fail(KVSDK_E_CORRUPT, "allocation profile checksum mismatch");
  }
  for (double x : s) {
    if (!(x >= 0 && x <= double(p->samples()))) fail(KVSDK_E_CORRUPT, "allocation share out of range");
  }
  AllocationProfile out(p->n_layers());
  out.sums_ = std::move(s);
  out.samples_ = p->samples();
  return out;
}

void AllocationProfile::save(const std::string& path) const {
  const std::vector<uint8_t> bytes = serialize();
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(KVSDK_E_IO, "cannot create ", tmp, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(KVSDK_E_IO, "cannot write ", tmp);
    }
    done += size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(KVSDK_E_IO, "cannot sync ", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail(KVSDK_E_IO, "cannot rename ", tmp, " to ", path);
  }
}

AllocationProfile AllocationProfile::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(KVSDK_E_IO, "cannot open ", path);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size < 0 || size > (1 << 24)) fail(KVSDK_E_CORRUPT, path, " has an implausible size");
  f.seekg(0);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (!f.read(reinterpret_cast<char*>(bytes.data()), size)) fail(KVSDK_E_IO, "cannot read ", path);
  return deserialize(bytes.data(), bytes.size());
}

}  // namespace kvsdk::policy
