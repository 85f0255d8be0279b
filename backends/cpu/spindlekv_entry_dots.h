// The dot products of SpindleCodebook::append (spindlekv_codebook.h): one row against every f16
// codebook entry, read in place. Highway SIMD with runtime dispatch (spindlekv_entry_dots.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsdk::cpu {

// For each of n_entries f16 rows c [n_entries][dim]: dot[e] = dot_f32(x, f32(c_e)) and, unless sq
// is null, sq[e] = dot_f32(f32(c_e), f32(c_e)), with dot_f32's bits exactly (attention.h: four
// partial sums over i mod 4 in channel order, the tail channels into the first,
// (s0 + s1) + (s2 + s3)) on every target: the codebook's decisions, and so the snapshot bytes,
// do not depend on the machine. The f16 entries convert exactly, in registers.
void spindle_entry_dots(const float* x, const uint16_t* c, size_t n_entries, size_t dim,
                        float* dot, float* sq);

}  // namespace kvsdk::cpu
