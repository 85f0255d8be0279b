// Byte-plane shuffling of f16 rows for snapshot format 6 (container.h): the Blosc "shuffle" filter
// with element size 2, and the per-frame choice whether it pays.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kvsdk::format {

// Byte planes of f16 values (format 6's shuffled frames, container.h): `shuffle_f16` writes the
// low bytes of src[0..n) to dst[0..n) and their high bytes to dst[n..2n); `append_unshuffled`
// appends to `dst` the n values whose low bytes are lo[0..n) and high bytes hi[0..n). Each is one
// pass that replaces the plain copy of the rows into or out of a frame.
void shuffle_f16(const uint16_t* src, size_t n, unsigned char* dst);

// `Vec`: a vector of uint16_t (any allocator), e.g. an ExactStore's rows.
template <class Vec>
void append_unshuffled(const unsigned char* lo, const unsigned char* hi, size_t n, Vec& dst) {
  // Through a small buffer that stays in L1: resizing `dst` first would zero it, a second pass.
  constexpr size_t kChunk = 4096;
  uint16_t buf[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    for (size_t j = 0; j < m; ++j) buf[j] = uint16_t(lo[i + j] | (unsigned(hi[i + j]) << 8));
    dst.insert(dst.end(), buf, buf + m);
  }
}

// Whether byte planes of these f16 rows compress smaller than the rows as they are, at zstd
// `level`: compresses a sample (the first kShuffleSampleValues values of `k` and of `v`: 32 KiB)
// both ways, each plane alone, on a compression context of the calling thread: 64 KiB of input
// per frame, 0.8% of a default 8 MiB frame, against 100% for compressing the whole frame both
// ways. The rows of one frame come from one layer (frames never mix layers), whose values have
// one distribution, so the sample predicts the frame.
constexpr size_t kShuffleSampleValues = 8192;
// Frames whose rows hold fewer bytes than this are never shuffled, and not probed. Each plane
// needs zstd blocks (128 KiB) of its own to gain from its own literal statistics, and the probe
// (6 compressions of up to 32 KiB) costs more than a small frame's own compression. Measured on
// shakespeare-base's real rows (snapshot_sweep_bench, docs/benchmarks.md): shuffling frames of
// 128 KiB to 256 KiB made files 0.1-0.2% smaller, frames of 512 KiB 8% smaller; the probe was
// 3/4 of a 64-token save (8 frames of 16 KiB: 8.3 -> 2.6 us a token without it) and
// 0.8 us of the 1.9 us a token of a 512-token one.
constexpr size_t kMinShuffledFrameBytes = size_t(512) << 10;
bool shuffle_pays(const uint16_t* k, const uint16_t* v, size_t n, int level);

}  // namespace kvsdk::format
