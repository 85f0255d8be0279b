// libFuzzer target: kvsdk_cache_load_from_buffer on arbitrary bytes must return a status, never
// crash, hang or leak. On success the cache must be usable (read every head, save it again).
//
// Build and run (clang from Debian; see README "Fuzzing"):
//   CC=clang CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
//     -DKVSDK_BUILD_FUZZERS=ON -DKVSDK_BUILD_BENCHMARKS=OFF
//   cmake --build build/fuzz --target kvsdk-fuzz-load
//   mkdir -p /tmp/kvsdk-corpus && ./build/fuzz/tests/fuzz/kvsdk-fuzz-load /tmp/kvsdk-corpus \
//     tests/fuzz/corpus -max_total_time=120 -max_len=16384
// Add any crasher (crash-*) to tests/fuzz/corpus/ once fixed: kvsdk-fuzz-replay runs the corpus
// under ctest in every build, without libFuzzer.
//
// Two input modes, so the fuzzer gets past the checksums (which reject almost every mutation):
//   - raw: the bytes are a snapshot file;
//   - structured (first byte 0xFB): the rest is a list of [kind u8][length u32 LE][FlatBuffer
//     bytes] records that are compressed and sealed into a valid container (journal records go
//     after the trailer), which exercises the FlatBuffers Verifier and every content check.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "container.h"
#include "frame_writer.h"
#include "kvsdk.h"
#include "sink.h"

namespace {

constexpr uint8_t kStructured = 0xFB;

std::vector<uint8_t> seal(const uint8_t* data, size_t size) {
  namespace fmt = kvsdk::format;
  std::vector<uint8_t> out;
  fmt::VectorSink sink(out);
  fmt::FrameWriter w(sink, 0x5eed, 1);
  std::vector<std::pair<fmt::FrameKind, std::vector<uint8_t>>> journal;
  w.write_file_header();
  while (size >= 5) {
    const auto kind = fmt::FrameKind(data[0] % 4 + 1);
    uint32_t len;
    std::memcpy(&len, data + 1, 4);
    data += 5;
    size -= 5;
    len = uint32_t(std::min<size_t>(len, size));
    if (len > 0) {
      if (kind == fmt::FrameKind::kJournal) {
        journal.emplace_back(kind, std::vector<uint8_t>(data, data + len));
      } else {
        w.write_frame(kind, data, len);
      }
    }
    data += len;
    size -= len;
  }
  w.write_index_and_trailer();
  for (const auto& [kind, bytes] : journal) w.write_frame(kind, bytes.data(), bytes.size());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> sealed;
  if (size > 0 && data[0] == kStructured) {
    sealed = seal(data + 1, size - 1);
    data = sealed.data();
    size = sealed.size();
  }
  kvsdk_context_options o;
  kvsdk_context_options_init(&o);
  o.budget_bytes = 64u << 20;  // declared sizes beyond this fail early with KVSDK_E_BUDGET
  kvsdk_context* ctx = nullptr;
  if (kvsdk_context_create(&ctx, &o) != KVSDK_OK) return 0;
  kvsdk_cache* cache = nullptr;
  kvsdk_load_info info{};
  info.struct_size = sizeof info;
  static const uint8_t empty = 0;
  if (kvsdk_cache_load_from_buffer(&cache, ctx, size ? data : &empty, size, nullptr, &info) ==
      KVSDK_OK) {
    kvsdk_geometry g;
    kvsdk_geometry_init(&g);
    kvsdk_cache_geometry(cache, &g);
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
        size_t n = 0;
        kvsdk_cache_read(cache, l, h, nullptr, nullptr, nullptr, 0, &n);
        std::vector<int32_t> pos(n);
        kvsdk_cache_read(cache, l, h, nullptr, nullptr, pos.data(), n, &n);
      }
    }
    size_t bytes = 0;
    if (kvsdk_cache_save_to_buffer(cache, nullptr, nullptr, 0, &bytes) == KVSDK_OK) {
      std::vector<uint8_t> again(bytes);
      kvsdk_cache_save_to_buffer(cache, nullptr, again.data(), again.size(), &bytes);
    }
    kvsdk_cache_destroy(cache);
  }
  kvsdk_context_destroy(ctx);
  return 0;
}
