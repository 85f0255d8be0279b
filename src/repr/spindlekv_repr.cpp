#include "repr/spindlekv_repr.h"

#include <algorithm>
#include <string>

#include "attention.h"
#include "repr/head_store.h"
#include "util/error.h"
#include "util/growth.h"

namespace kvsdk {

namespace {

uint32_t boundary_of(const Geometry& g, const kvsdk_policy& p) {
  if (p.boundary_layer < 0) return g.n_layers / 2;
  KVSDK_REQUIRE(uint32_t(p.boundary_layer) <= g.n_layers, "policy.boundary_layer is ",
                p.boundary_layer, " but the geometry has ", g.n_layers, " layers");
  return uint32_t(p.boundary_layer);
}

void codebook_to_record(const cpu::SpindleCodebook& c, const std::string& pre, TierRecord& r) {
  r.add(pre + "entries").u16 = c.entry_data();
  r.add(pre + "index").u32 = c.index();
  r.add(pre + "magnitude").f32 = c.magnitude();
}

cpu::SpindleCodebook codebook_from_record(size_t dim, float theta, const std::string& pre,
                                          const TierRecord& r) {
  return cpu::SpindleCodebook::restore(dim, theta, r.get(pre + "entries").u16,
                                       r.get(pre + "index").u32, r.get(pre + "magnitude").f32);
}

}  // namespace

SpindleKvRepresentation::SpindleKvRepresentation(const Geometry& g, const kvsdk_policy& p)
    : Representation(g, p), boundary_(boundary_of(g, p)), heads_(boundary_) {
  for (auto& layer : heads_) {
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      layer.emplace_back(g.head_dim, g.rope_theta, g.rope_style);
    }
  }
}

void SpindleKvRepresentation::add_bytes(uint32_t layer, uint64_t t[KVSDK_TIER_SLOTS]) const {
  for (const cpu::SpindleHeadStore& s : heads_[layer]) {
    const cpu::SpindleBytes b = s.bytes();
    t[KVSDK_TIER_CODEBOOK] += b.key_codebook + b.value_codebook;
    t[KVSDK_TIER_METADATA] += b.positions;
  }
}

uint64_t SpindleKvRepresentation::append_bound(uint32_t layer, size_t n) const {
  // Every token may open a new entry in both codebooks: per codebook an f16 entry, a uint32
  // index and an f32 magnitude; plus the token's int32 position.
  (void)layer;
  const uint64_t dim = geometry_.head_dim;
  return uint64_t(n) * geometry_.n_kv_heads * (2 * (2 * dim + 4 + 4) + 4);
}

void SpindleKvRepresentation::append(uint32_t layer, size_t n, const float* k, const float* v,
                                     const int32_t* positions) {
  const size_t dim = geometry_.head_dim;
  // One head's rows at a time, in reused scratch.
  std::vector<float>& kf = at_least(append_k_, n * dim);
  std::vector<float>& vf = at_least(append_v_, n * dim);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    head_rows(k, v, n, h, kf.data(), vf.data());
    heads_[layer][h].append(kf.data(), vf.data(), positions, n, append_scratch_);
  }
}

void SpindleKvRepresentation::attend(uint32_t layer, uint32_t kv_head, const float* q_rows,
                                     const int32_t* row_positions, size_t n_rows,
                                     float* out) const {
  // Reconstructed chunk by chunk, by the backend.
  ops().attend_spindle(query_rows(q_rows, row_positions, n_rows), heads_[layer][kv_head],
                       workspace(), out);
}

size_t SpindleKvRepresentation::head_tokens(uint32_t layer, uint32_t kv_head) const {
  return heads_[layer][kv_head].size();
}

void SpindleKvRepresentation::read(uint32_t layer, uint32_t kv_head, float* k, float* v,
                                   int32_t* positions) const {
  read_head_store(heads_[layer][kv_head], geometry_.head_dim, k, v, positions);
}

std::string SpindleKvRepresentation::truncate_refusal(uint32_t layer, int32_t position) const {
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    if (const char* why = heads_[layer][h].removal_refusal(position)) {
      return "layer " + std::to_string(layer) + " (KV head " + std::to_string(h) +
             ") cannot remove its tokens at positions >= " + std::to_string(position) + ": " +
             why;
    }
  }
  return {};
}

void SpindleKvRepresentation::truncate(uint32_t layer, int32_t position) noexcept {
  for (cpu::SpindleHeadStore& s : heads_[layer]) s.remove_from(position);
}

std::vector<TierRecord> SpindleKvRepresentation::save(uint32_t layer) const {
  std::vector<TierRecord> out(geometry_.n_kv_heads);
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const cpu::SpindleHeadStore& s = heads_[layer][h];
    TierRecord& r = out[h];
    r.layer = layer;
    r.kv_head = h;
    r.kind = "spindlekv.head";
    codebook_to_record(s.keys(), "keys.", r);
    codebook_to_record(s.values(), "values.", r);
    r.add("positions").i32 = s.positions();
  }
  return out;
}

void SpindleKvRepresentation::restore(uint32_t layer, const std::vector<TierRecord>& records) {
  if (!covers(layer)) {
    fail(KVSDK_E_CORRUPT, "snapshot has SpindleKV codebook records for layer ", layer,
         ", at or past the boundary layer ", boundary_);
  }
  if (records.size() != geometry_.n_kv_heads) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " has ", records.size(),
         " SpindleKV head records, expected ", geometry_.n_kv_heads);
  }
  const size_t dim = geometry_.head_dim;
  std::vector<cpu::SpindleHeadStore> heads;
  for (uint32_t h = 0; h < geometry_.n_kv_heads; ++h) {
    const TierRecord& r = records[h];
    if (r.kind != "spindlekv.head" || r.kv_head != h) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", layer, " record ", h, " is '", r.kind,
           "' for KV head ", r.kv_head, ", expected 'spindlekv.head' for KV head ", h);
    }
    heads.push_back(cpu::SpindleHeadStore::restore(
        dim, geometry_.rope_theta, geometry_.rope_style,
        codebook_from_record(dim, cpu::kSpindleThetaK, "keys.", r),
        codebook_from_record(dim, cpu::kSpindleThetaV, "values.", r), r.get("positions").i32));
  }
  heads_[layer] = std::move(heads);
}

}  // namespace kvsdk
