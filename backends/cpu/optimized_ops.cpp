// The optimized CPU backend: the reference table (reference_ops.cpp) with every entry that has a
// faster kernel replaced. The replacements are Highway SIMD kernels with runtime dispatch
// (fast_attention.h): the best target this CPU runs is picked on the first call, and every
// target gives the same bits, so snapshots continue identically across machines. Entries not
// replaced here run the reference kernel; backend_ops_test checks every entry against the oracle
// with a stated tolerance.
#include "backend_ops.h"
#include "cpu_workspace.h"
#include "fast_attention.h"
#include "util/half_array.h"

namespace kvsdk::backend {
namespace {

cpu::fast::Queries queries(const QueryRows& q) {
  cpu::fast::Queries f;
  f.q = q.q;
  f.positions = q.positions;
  f.n_rows = q.n_rows;
  f.dim = q.dim;
  f.scale = q.scale;
  return f;
}

void f16_to_f32(const uint16_t* src, size_t n, float* dst) { f16_to_f32_array(src, dst, n); }

void attend_f16(const QueryRows& q, const F16Rows& r, Workspace& ws, float* out) {
  cpu::fast::attend_f16(queries(q), r.k, r.v, r.positions, r.n_tokens, ws.fast, out);
}

void attend_kivi(const QueryRows& q, const cpu::KiviHeadStore& s, Workspace& ws, float* out) {
  cpu::fast::attend_kivi(queries(q), s, ws.fast, out);
}

// SIMD window scoring with the reference's bits (attention_scores.h), in reused scratch.
void column_sums(const QueryRows& q, const cpu::KeyChunkLoader& keys, const int32_t* key_pos,
                 size_t n_keys, Workspace& ws, float* col_sums) {
  cpu::attention_column_sums(q.q, q.positions, q.n_rows, q.dim, q.scale, keys, key_pos, n_keys,
                             col_sums, ws.scores);
}

Ops make_optimized() {
  Ops ops = cpu_reference();
  ops.name = "cpu-optimized";
  ops.f16_to_f32 = f16_to_f32;
  ops.attend_f16 = attend_f16;
  ops.attend_kivi = attend_kivi;
  ops.column_sums = column_sums;
  return ops;
}

}  // namespace

const Ops& cpu_optimized() {
  static const Ops ops = make_optimized();
  return ops;
}

}  // namespace kvsdk::backend
