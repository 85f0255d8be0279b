// "Mutated snapshots with valid checksums": decodes every frame of a snapshot (base and journal),
// lets a test change the decompressed FlatBuffers (in place, or rebuilt with changed
// compressed-store records), appends hand-built journal deltas, and writes the file again with the
// same snapshot id, every frame header, the footer index and the trailer re-sealed. What such a
// file contains is then only caught by the reader's validation, never by a checksum.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "container.h"
#include "core/tier_record.h"
#include "frame_writer.h"
#include "kvsdk_generated.h"
#include "sink.h"
#include "tier_schema.h"
#include "tier_state.h"
#include "zstd_frame.h"

namespace kvsdk_test {

// One decoded frame: its kind, whether it follows the trailer (a journal delta), its number
// among the frames of the same part (base or journal), and its FlatBuffer, which a mutation may
// change in place (see mutable_data()) or replace.
struct MutableFrame {
  kvsdk::format::FrameKind kind;
  bool journal = false;
  size_t index = 0;
  std::vector<uint8_t> flatbuffer;
  uint8_t flags = 0;  // the frame header's (kFrameShuffled: keys and values are byte planes)
  const kvsdk::fb::Frame* root() const { return kvsdk::fb::GetFrame(flatbuffer.data()); }
};

// Rewrites `file` frame by frame through `mutate` (frames it returns false for are dropped, e.g.
// every journal frame: the base alone), then appends `extra_journal` frames (finished FlatBuffers
// of JournalDelta frames). The index and trailer are rebuilt.
inline std::vector<unsigned char> rewrite_snapshot(
    const std::vector<unsigned char>& file, const std::function<bool(MutableFrame&)>& mutate,
    const std::vector<std::vector<uint8_t>>& extra_journal = {}) {
  namespace fmt = kvsdk::format;
  std::vector<unsigned char> out;
  if (file.size() < fmt::kFileHeaderBytes) {
    ADD_FAILURE() << "not a snapshot";
    return out;
  }
  const fmt::FileHeader fh = fmt::decode_file_header(file.data());
  fmt::VectorSink sink(out);
  fmt::FrameWriter w(sink, fh.snapshot_id, 3);
  w.write_file_header(fh.major, fh.minor);
  fmt::ZstdDecompressor zstd;
  uint64_t pos = fmt::kFileHeaderBytes;
  bool journal = false;
  size_t counts[2] = {0, 0};
  std::vector<unsigned char> raw;
  while (pos < file.size()) {
    fmt::FrameHeader h;
    if (file.size() - pos < fmt::kFrameHeaderBytes ||
        !fmt::decode_frame_header(&file[pos], fh.snapshot_id, &h, fh.major)) {
      ADD_FAILURE() << "unsound frame header at byte " << pos;
      return {};
    }
    const uint64_t payload = pos + fmt::kFrameHeaderBytes;
    zstd.decompress(&file[payload], h.payload_bytes, h.raw_bytes, raw);
    pos = payload + h.payload_bytes;
    if (h.kind == uint8_t(fmt::FrameKind::kIndex)) {
      w.write_index_and_trailer();  // lists the frames written so far, as the writer does
      pos += fmt::kTrailerBytes;
      journal = true;
      continue;
    }
    MutableFrame f{fmt::FrameKind(h.kind), journal, counts[journal]++,
                   std::vector<uint8_t>(raw.begin(), raw.end()), h.flags};
    if (mutate(f)) w.write_frame(f.kind, f.flatbuffer.data(), f.flatbuffer.size(), f.flags);
  }
  for (const std::vector<uint8_t>& j : extra_journal) {
    w.write_frame(fmt::FrameKind::kJournal, j.data(), j.size());
  }
  return out;
}

inline std::function<bool(MutableFrame&)> keep_all() {
  return [](MutableFrame&) { return true; };
}
inline std::function<bool(MutableFrame&)> base_only() {
  return [](MutableFrame& f) { return !f.journal; };
}

// Writable elements of a vector inside a MutableFrame's buffer (the buffer is ours; FlatBuffers
// only hands out const views). Little-endian hosts, as every kvsdk target.
template <class T>
T* mutable_data(const flatbuffers::Vector<T>* v) {
  return const_cast<T*>(v->data());
}

template <class T>
std::vector<uint8_t> finish_frame(flatbuffers::FlatBufferBuilder& b, kvsdk::fb::Payload type,
                                  flatbuffers::Offset<T> payload) {
  b.Finish(kvsdk::fb::CreateFrame(b, type, payload.Union()), kvsdk::fb::FrameIdentifier());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

// Rebuilds a base TierChunk frame with every compressed-store record passed through `change`
// (which returns whether it changed the record); exact rows are copied unchanged. Records stay
// as they were written: named TierStates (formats 2 and 3) or typed tables (format 4). Returns
// how many records `change` changed (0 for other frames, which stay as they are).
inline size_t change_records(MutableFrame& f,
                             const std::function<bool(kvsdk::TierRecord&)>& change) {
  namespace fb = kvsdk::fb;
  const fb::TierChunk* c = f.journal ? nullptr : f.root()->payload_as_TierChunk();
  if (!c || (!c->tiers() && !c->typed_tiers())) return 0;
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::HeadRows>> heads;
  if (c->heads()) {
    for (const fb::HeadRows* hr : *c->heads()) {
      const fb::ExactRows* r = hr->exact();
      const std::vector<int32_t> pos(r->positions()->begin(), r->positions()->end());
      const std::vector<uint16_t> k(r->keys()->begin(), r->keys()->end());
      const std::vector<uint16_t> v(r->values()->begin(), r->values()->end());
      heads.push_back(fb::CreateHeadRows(
          b, hr->layer(), hr->kv_head(), hr->row_begin(),
          fb::CreateExactRows(b, b.CreateVector(pos), b.CreateVector(k), b.CreateVector(v))));
    }
  }
  size_t changed = 0;
  std::vector<flatbuffers::Offset<fb::TierState>> states;
  std::vector<flatbuffers::Offset<fb::TypedTierState>> typed;
  if (c->tiers()) {
    for (const fb::TierState* t : *c->tiers()) {
      kvsdk::TierRecord r = kvsdk::format::read_tier_state(*t);
      if (change(r)) ++changed;
      states.push_back(kvsdk::format::build_tier_state(b, r));
    }
  }
  if (c->typed_tiers()) {
    for (const fb::TypedTierState* t : *c->typed_tiers()) {
      kvsdk::TierRecord r = kvsdk::format::read_typed_tier(*t);
      if (change(r)) ++changed;
      typed.push_back(kvsdk::format::build_typed_tier(b, r));
    }
  }
  const auto chunk = fb::CreateTierChunk(b, heads.empty() ? 0 : b.CreateVector(heads),
                                         c->tiers() ? b.CreateVector(states) : 0,
                                         c->typed_tiers() ? b.CreateVector(typed) : 0);
  f.flatbuffer = finish_frame(b, fb::Payload::TierChunk, chunk);
  return changed;
}

// The compressed-store records of `layer` in a snapshot's base, in file order, the per-layer
// appended-token counts of its metadata, and whether the file holds typed records (format 4).
struct BaseLayer {
  std::vector<kvsdk::TierRecord> records;
  std::vector<uint64_t> appended;
  bool typed = false;
};
inline BaseLayer base_layer(const std::vector<unsigned char>& file, uint32_t layer) {
  BaseLayer out;
  out.typed = file.size() >= kvsdk::format::kFileHeaderBytes &&
              kvsdk::format::decode_file_header(file.data()).major >= 4;
  rewrite_snapshot(file, [&](MutableFrame& f) {
    if (f.journal) return false;
    if (const kvsdk::fb::Metadata* m = f.root()->payload_as_Metadata()) {
      for (const kvsdk::fb::LayerInfo* li : *m->layers()) out.appended.push_back(li->appended_tokens());
    }
    if (const kvsdk::fb::TierChunk* c = f.root()->payload_as_TierChunk()) {
      if (c->tiers()) {
        for (const kvsdk::fb::TierState* t : *c->tiers()) {
          if (t->layer() == layer) out.records.push_back(kvsdk::format::read_tier_state(*t));
        }
      }
      if (c->typed_tiers()) {
        for (const kvsdk::fb::TypedTierState* t : *c->typed_tiers()) {
          if (t->layer() == layer) out.records.push_back(kvsdk::format::read_typed_tier(*t));
        }
      }
    }
    return true;
  });
  return out;
}

// A one-part journal delta number `sequence` that replaces the records of `layer` whole with
// `records` (every writer may write a layer so) and changes nothing else: as typed tables
// (`typed`, a format 4 file) or named TierStates.
inline std::vector<uint8_t> whole_layer_delta(uint64_t sequence, uint32_t layer,
                                              const std::vector<kvsdk::TierRecord>& records,
                                              const std::vector<uint64_t>& appended, bool typed) {
  namespace fb = kvsdk::fb;
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::TierState>> states;
  std::vector<flatbuffers::Offset<fb::TypedTierState>> typed_states;
  for (const kvsdk::TierRecord& r : records) {
    if (typed) typed_states.push_back(kvsdk::format::build_typed_tier(b, r));
    else states.push_back(kvsdk::format::build_tier_state(b, r));
  }
  const std::vector<uint32_t> layers = {layer};
  const auto d = fb::CreateJournalDelta(b, sequence, 0, 1, 0, b.CreateVector(appended), 0,
                                        b.CreateVector(layers), typed ? 0 : b.CreateVector(states),
                                        0, typed ? b.CreateVector(typed_states) : 0);
  return finish_frame(b, fb::Payload::JournalDelta, d);
}

}  // namespace kvsdk_test
