#include "tier_state.h"

#include "util/error.h"
#include "xxhash64.h"

namespace kvsdk::format {

flatbuffers::Offset<fb::TierState> build_tier_state(flatbuffers::FlatBufferBuilder& fbb,
                                                    const TierRecord& r) {
  std::vector<flatbuffers::Offset<fb::TierField>> fields;
  for (const TierField& f : r.fields) {
    const auto name = fbb.CreateString(f.name);
    const auto u8 = f.u8.empty() ? 0 : fbb.CreateVector(f.u8);
    const auto u16 = f.u16.empty() ? 0 : fbb.CreateVector(f.u16);
    const auto i32 = f.i32.empty() ? 0 : fbb.CreateVector(f.i32);
    const auto u32 = f.u32.empty() ? 0 : fbb.CreateVector(f.u32);
    const auto f32 = f.f32.empty() ? 0 : fbb.CreateVector(f.f32);
    const auto u64 = f.u64.empty() ? 0 : fbb.CreateVector(f.u64);
    fields.push_back(fb::CreateTierField(fbb, name, u8, u16, i32, u32, f32, u64));
  }
  return fb::CreateTierState(fbb, r.layer, r.kv_head, fbb.CreateString(r.kind),
                             fbb.CreateVector(fields));
}

uint64_t tier_record_bytes(const TierRecord& r) {
  uint64_t b = 64 + r.kind.size();
  for (const TierField& f : r.fields) {
    b += 64 + f.name.size() + f.u8.size() + 2 * f.u16.size() + 4 * f.i32.size() +
         4 * f.u32.size() + 4 * f.f32.size() + 8 * f.u64.size();
  }
  return b;
}

TierRecord read_tier_state(const fb::TierState& t) {
  TierRecord r;
  r.layer = t.layer();
  r.kv_head = t.kv_head();
  if (!t.kind() || !t.fields()) fail(KVSDK_E_CORRUPT, "tier record without kind or fields");
  r.kind = t.kind()->str();
  for (const fb::TierField* f : *t.fields()) {
    if (!f->name()) fail(KVSDK_E_CORRUPT, "tier record '", r.kind, "' has an unnamed field");
    TierField& out = r.add(f->name()->str());
    if (f->u8()) out.u8.assign(f->u8()->begin(), f->u8()->end());
    if (f->u16()) out.u16.assign(f->u16()->begin(), f->u16()->end());
    if (f->i32()) out.i32.assign(f->i32()->begin(), f->i32()->end());
    if (f->u32()) out.u32.assign(f->u32()->begin(), f->u32()->end());
    if (f->f32()) out.f32.assign(f->f32()->begin(), f->f32()->end());
    if (f->u64()) out.u64.assign(f->u64()->begin(), f->u64()->end());
  }
  return r;
}

uint64_t tier_records_hash(const std::vector<TierRecord>& records) {
  Xxh64Stream h(0x6b7674696572ull);  // "kvtier"
  const auto add_vec = [&h](const auto& v) {
    const uint64_t n = v.size();
    h.update(&n, sizeof n);
    if (n) h.update(v.data(), n * sizeof(v[0]));
  };
  const uint64_t count = records.size();
  h.update(&count, sizeof count);
  for (const TierRecord& r : records) {
    h.update(&r.layer, sizeof r.layer);
    h.update(&r.kv_head, sizeof r.kv_head);
    add_vec(r.kind);
    for (const TierField& f : r.fields) {
      add_vec(f.name);
      add_vec(f.u8);
      add_vec(f.u16);
      add_vec(f.i32);
      add_vec(f.u32);
      add_vec(f.f32);
      add_vec(f.u64);
    }
  }
  return h.digest();
}

}  // namespace kvsdk::format
