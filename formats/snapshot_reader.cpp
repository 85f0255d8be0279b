#include "snapshot_reader.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <memory>

#include "container.h"
#include "core/store_view.h"
#include "journal.h"
#include "kvsdk_generated.h"
#include "policy_state.h"
#include "tier_schema.h"
#include "tier_state.h"
#include "util/error.h"
#include "util/positions.h"
#include "util/thread_pool.h"
#include "xxhash64.h"
#include "byte_planes.h"
#include "zstd_frame.h"

namespace kvsdk::format {

namespace {

// Verifier limits: our schema nests 5 tables deep; a frame of at most kMaxRawFrameBytes holds
// far fewer tables than this unless it is hostile.
constexpr flatbuffers::uoffset_t kMaxDepth = 16;
constexpr flatbuffers::uoffset_t kMaxTables = 1u << 20;
// Rows one KV head may declare (positions are int32; far beyond any real context).
constexpr uint64_t kMaxRowsPerHead = uint64_t(std::numeric_limits<int32_t>::max());

// A frame located, hash-checked and decompressed.
struct RawFrame {
  FrameHeader header;
  uint64_t offset = 0;
  uint64_t end = 0;
  std::vector<unsigned char> flatbuffer;
};

// A frame of a read batch: located from its header in order (else `why`), then opened on the
// pool (`root`, else `why`, or `error` for what is not a verdict on the bytes).
struct BatchFrame {
  RawFrame f;
  bool located = false;
  const fb::Frame* root = nullptr;
  std::string why;
  std::exception_ptr error;
};

class Reader {
 public:
  // `major`: the file's format major, which picks the record hash (xxhash64.h).
  Reader(const unsigned char* data, size_t size, uint16_t major)
      : data_(data), size_(size), major_(major) {}

  // Locates the frame at `offset` from its header alone; returns false when the header is cut
  // off or damaged, or the payload it declares is.
  bool locate_header(uint64_t offset, uint64_t id, RawFrame* f, std::string* why) const {
    if (offset > size_ || size_ - offset < kFrameHeaderBytes) {
      *why = "truncated (frame header cut off)";
      return false;
    }
    if (!decode_frame_header(data_ + offset, id, &f->header, major_)) {
      *why = "damaged frame header";
      return false;
    }
    const uint64_t payload = offset + kFrameHeaderBytes;
    if (size_ - payload < f->header.payload_bytes) {
      *why = "truncated (frame payload cut off)";
      return false;
    }
    f->offset = offset;
    f->end = payload + f->header.payload_bytes;
    return true;
  }

  // The payload hash of a frame located by locate_header.
  bool check_payload(const RawFrame& f, uint64_t id, std::string* why) const {
    if (record_hash(major_, data_ + f.offset + kFrameHeaderBytes, f.header.payload_bytes, id) !=
        f.header.payload_hash) {
      *why = "frame payload checksum mismatch";
      return false;
    }
    return true;
  }

  // Locates the frame at `offset`; returns false when its bytes do not form a sound frame of
  // this snapshot (truncated, bad header, bad payload hash).
  bool locate(uint64_t offset, uint64_t id, RawFrame* f, std::string* why) const {
    return locate_header(offset, id, f, why) && check_payload(*f, id, why);
  }

  // Decompresses (with `zstd`) and verifies the FlatBuffer of a located frame; returns its root.
  const fb::Frame* open(RawFrame& f, ZstdDecompressor& zstd, std::string* why) const {
    try {
      zstd.decompress(data_ + f.offset + kFrameHeaderBytes, f.header.payload_bytes,
                      f.header.raw_bytes, f.flatbuffer);
    } catch (const Error& e) {
      *why = e.what();
      return nullptr;
    }
    flatbuffers::Verifier v(f.flatbuffer.data(), f.flatbuffer.size(), kMaxDepth, kMaxTables);
    if (!fb::VerifyFrameBuffer(v)) {
      *why = "frame content fails FlatBuffers verification";
      return nullptr;
    }
    const fb::Frame* root = fb::GetFrame(f.flatbuffer.data());
    const uint8_t want = f.header.kind;
    const fb::Payload got = root->payload_type();
    const bool match = (want == uint8_t(FrameKind::kMetadata) && got == fb::Payload::Metadata) ||
                       (want == uint8_t(FrameKind::kTierChunk) && got == fb::Payload::TierChunk) ||
                       (want == uint8_t(FrameKind::kIndex) && got == fb::Payload::Index) ||
                       (want == uint8_t(FrameKind::kJournal) && got == fb::Payload::JournalDelta);
    // A union may name its type yet carry no value: the Verifier accepts that, we do not.
    if (!match || root->payload() == nullptr) {
      *why = "frame content does not match its kind";
      return nullptr;
    }
    return root;
  }

  const fb::Frame* open(RawFrame& f, std::string* why) { return open(f, zstd_, why); }

  const unsigned char* data_;
  size_t size_;
  uint16_t major_;
  ZstdDecompressor zstd_;
};

[[noreturn]] void corrupt_at(uint64_t offset, const std::string& why) {
  fail(KVSDK_E_CORRUPT, "snapshot corrupt at byte ", offset, ": ", why);
}

// Every position a snapshot holds lies in 0 .. KVSDK_MAX_POSITION (kvsdk.h), wherever it is.
void check_file_positions(const int32_t* p, size_t n, const std::string& where) {
  check_positions(p, n, where.c_str(), KVSDK_E_CORRUPT);
}

// The position fields of a compressed-store record: those whose name ends in "positions"
// (core/tier_record.h).
void check_record_positions(const TierRecord& r) {
  static const std::string kSuffix = "positions";
  for (const TierField& f : r.fields) {
    const std::string& n = f.name;
    if (n.size() >= kSuffix.size() &&
        n.compare(n.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
      check_file_positions(f.i32.data(), f.i32.size(),
                           "snapshot tier record '" + r.kind + "' (layer " +
                               std::to_string(r.layer) + ", KV head " + std::to_string(r.kv_head) +
                               ") field '" + n + "'");
    }
  }
}

// Observation-window queries: query positions (INT32_MAX for a query observed without one).
void check_window_positions(const std::vector<LayerState>& layers) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::vector<int32_t>& p = layers[l].window_pos;
    check_query_positions(p.data(), p.size(),
                          ("snapshot observation window of layer " + std::to_string(l) +
                           ": positions").c_str(),
                          KVSDK_E_CORRUPT);
  }
}

// Validates the compressed-store records of layer `l` that a journal delta is about to replace,
// as a load validates the records it keeps: restored into a scratch store of the layer
// (StoreLayout::validate) that is dropped at once. They never
// reach Cache::restore, but a file that holds an invalid record is corrupt all the same, whether
// or not a later delta replaces it (and `kvsdk verify` must say so). Each record set is
// replaced, and so checked here, at most once; the final ones are checked by Cache::restore.
// The check is the one of the layer alone: row counts (which the metadata declares only for the
// final state) and consistency across layers (MiniCache's pairs) concern the final stores.
void validate_replaced_records(const Snapshot& s, uint32_t l, uint64_t sequence) {
  if (l >= s.geometry.n_layers || !s.covered[l]) return;  // apply_delta / check_tier_record
  try {
    s.layout->validate(l, s.tiers[l]);
  } catch (const Error& e) {
    fail(KVSDK_E_CORRUPT, "snapshot layer ", l, ": the records that journal delta ", sequence,
         " replaces are invalid: ", e.what());
  }
}

void read_metadata(const fb::Metadata& m, const ReadOptions& opt, Snapshot& s,
                   std::vector<std::vector<uint64_t>>& declared) {
  if (!m.geometry() || !m.policy() || !m.layers()) {
    fail(KVSDK_E_CORRUPT, "snapshot metadata lacks geometry, policy or layers");
  }
  const fb::Geometry& fg = *m.geometry();
  kvsdk_geometry cg;
  kvsdk_geometry_init(&cg);
  cg.n_layers = fg.n_layers();
  cg.n_q_heads = fg.n_q_heads();
  cg.n_kv_heads = fg.n_kv_heads();
  cg.head_dim = fg.head_dim();
  cg.dtype = fg.dtype();
  cg.rope_style = fg.rope_style();
  cg.rope_theta = fg.rope_theta();
  cg.attn_scale = fg.attn_scale();
  try {
    s.geometry = Geometry::from_c(&cg);
  } catch (const Error& e) {
    fail(KVSDK_E_CORRUPT, "snapshot geometry is invalid: ", e.what());
  }
  const fb::Policy& fp = *m.policy();
  kvsdk_policy cp{};
  cp.struct_size = sizeof(cp);
  cp.method = fp.method();
  cp.quant_bits = fp.quant_bits();
  cp.quant_group = fp.quant_group();
  cp.quant_residual = fp.quant_residual();
  cp.sink_tokens = fp.sink_tokens();
  cp.recent_tokens = fp.recent_tokens();
  cp.obs_window = fp.obs_window();
  cp.pool_kernel = fp.pool_kernel();
  cp.pool_kind = fp.pool_kind();
  cp.heavy_ratio = fp.heavy_ratio();
  cp.schedule_alpha = fp.schedule_alpha();
  cp.schedule_beta = fp.schedule_beta();
  cp.boundary_layer = fp.boundary_layer();
  cp.merge_t = fp.merge_t();
  cp.retain_ratio = fp.retain_ratio();
  cp.fetch_tokens = fp.fetch_tokens();
  cp.match_tokens = fp.match_tokens();
  cp.evict_slack = fp.evict_slack();  // 0 in files written before the field (format < 4.1/1.3)
  cp.kivi_weight_bits = fp.kivi_weight_bits();  // 14 in files written before the field
  try {
    s.policy = policy_from_c(&cp);
  } catch (const Error& e) {
    fail(KVSDK_E_CORRUPT, "snapshot policy is invalid: ", e.what());
  }
  if (s.policy.quant_residual == KVSDK_QUANT_RESIDUAL_AUTO) {
    // A cache resolves it when created (kvsdk.h), so no writer stores it; the stores' sizes
    // follow from the resolved window.
    fail(KVSDK_E_CORRUPT, "snapshot policy holds quant_residual KVSDK_QUANT_RESIDUAL_AUTO, "
         "which caches resolve before saving");
  }
  if (opt.expected && *opt.expected != s.geometry) {
    const Geometry& e = *opt.expected;
    const Geometry& g = s.geometry;
    fail(KVSDK_E_GEOMETRY, "snapshot geometry (", g.n_layers, " layers, ", g.n_q_heads, "/",
         g.n_kv_heads, " heads, head_dim ", g.head_dim, ", dtype ", int(g.dtype),
         ") differs from the expected (", e.n_layers, " layers, ", e.n_q_heads, "/", e.n_kv_heads,
         " heads, head_dim ", e.head_dim, ", dtype ", int(e.dtype), ", or RoPE/scale)");
  }
  if (opt.require_implemented) require_policy_implemented(s.policy);
  s.budget_bytes = m.budget_bytes();
  s.includes_backing = m.includes_backing();
  // Format 5: the shared prefix the cache continues; only files that have one carry major 5
  // (format 6 may or may not have one).
  if (s.format_major < 6 && (m.prefix() != nullptr) != (s.format_major >= 5)) {
    fail(KVSDK_E_CORRUPT, "a format ", s.format_major, " snapshot ",
         m.prefix() ? "with" : "without", " a shared prefix reference");
  }
  if (const fb::PrefixRef* pr = m.prefix()) {
    s.has_prefix = true;
    s.prefix_hash = pr->content_hash();
    if (pr->snapshot()) s.prefix_snapshot.assign(pr->snapshot()->begin(), pr->snapshot()->end());
  }
  if (m.writer_version()) s.writer_version = m.writer_version()->str();
  const Geometry& g = s.geometry;
  if (m.layers()->size() != g.n_layers) {
    fail(KVSDK_E_CORRUPT, "snapshot metadata lists ", m.layers()->size(), " layers, geometry has ",
         g.n_layers);
  }
  s.layers.resize(g.n_layers);
  s.tiers.assign(g.n_layers, {});
  declared.assign(g.n_layers, {});
  // Which layers the policy holds in stores other than the exact tier: their rows come as store
  // records, not exact rows.
  try {
    s.layout = std::make_shared<StoreLayout>(g, s.policy);
  } catch (const Error& e) {
    fail(KVSDK_E_CORRUPT, "snapshot policy is invalid: ", e.what());
  }
  s.covered.assign(g.n_layers, false);
  uint64_t declared_bytes = 0;
  const uint64_t bytes_per_row = ExactStore::bytes_per_token(g.head_dim);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const fb::LayerInfo* li = m.layers()->Get(l);
    if (!li->head_tokens() || li->head_tokens()->size() != g.n_kv_heads) {
      fail(KVSDK_E_CORRUPT, "snapshot layer ", l, " lacks per-head token counts");
    }
    s.layers[l].heads.resize(g.n_kv_heads);
    s.layers[l].appended_tokens = li->appended_tokens();
    // Layers with store records: a representation's, or the KIVI stores of a KIVI overlay.
    s.covered[l] = !s.layout->exact_rows(l);
    if (s.covered[l]) {
      // Compressed rows cost what the writer counted (checked exactly when they are charged).
      uint64_t b = 0;
      if (li->bytes_by_tier()) {
        for (uint64_t x : *li->bytes_by_tier()) b = x > UINT64_MAX - b ? UINT64_MAX : b + x;
      }
      declared_bytes = b > UINT64_MAX - declared_bytes ? UINT64_MAX : declared_bytes + b;
    }
    for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
      const uint64_t n = li->head_tokens()->Get(h);
      if (n > kMaxRowsPerHead) fail(KVSDK_E_CORRUPT, "snapshot layer ", l, " head ", h, " declares ", n, " rows");
      declared[l].push_back(n);
      if (s.covered[l]) continue;
      // n * bytes_per_row < 2^31 * 2^13; the sum over up to 2^24 heads saturates instead of
      // wrapping around.
      const uint64_t add = n * bytes_per_row;
      declared_bytes = add > UINT64_MAX - declared_bytes ? UINT64_MAX : declared_bytes + add;
    }
  }
  if (declared_bytes > opt.available_bytes) {
    fail(KVSDK_E_BUDGET, "the snapshot holds ", declared_bytes, " bytes but the context has only ",
         opt.available_bytes, " budget bytes free");
  }
  read_policy_state(m.policy_state(), g, s.policy, declared, s.layers, s.runtime);
  check_window_positions(s.layers);
}

// Checks a tier record's place: inside the geometry, in a layer the policy holds compressed.
void check_tier_record(const TierRecord& r, const Geometry& g, const Snapshot& s) {
  if (r.layer >= g.n_layers || r.kv_head >= g.n_kv_heads) {
    fail(KVSDK_E_CORRUPT, "tier record for (", r.layer, ", ", r.kv_head, ") outside the geometry");
  }
  if (!s.covered[r.layer]) {
    fail(KVSDK_E_CORRUPT, "tier record for layer ", r.layer, ", which policy '",
         policy_spec(s.policy), "' keeps exact");
  }
}

// `shuffled`: the frame's keys and values are byte planes (container.h, format 6).
void read_tier_chunk(const fb::TierChunk& c, const Geometry& g, Snapshot& s,
                     const std::vector<std::vector<uint64_t>>& declared, uint64_t reserve_limit,
                     bool shuffled) {
  const bool has_heads = c.heads() && c.heads()->size() != 0;
  const bool has_tiers = c.tiers() && c.tiers()->size() != 0;
  const bool has_typed = c.typed_tiers() && c.typed_tiers()->size() != 0;
  if (!has_heads && !has_tiers && !has_typed) fail(KVSDK_E_CORRUPT, "empty tier chunk");
  // Compressed-store records: generic TierStates in formats 2 and 3, typed tables from 4.
  if ((has_tiers && (s.format_major < 2 || s.format_major >= 4)) ||
      (has_typed && s.format_major < 4)) {
    fail(KVSDK_E_CORRUPT, has_typed ? "typed" : "untyped",
         " compressed-tier records in a format ", s.format_major, " file");
  }
  const auto take = [&](TierRecord r) {
    check_tier_record(r, g, s);
    check_record_positions(r);
    s.tiers[r.layer].push_back(std::move(r));
  };
  if (has_tiers) {
    for (const fb::TierState* t : *c.tiers()) take(read_tier_state(*t));
  }
  if (has_typed) {
    for (const fb::TypedTierState* t : *c.typed_tiers()) take(read_typed_tier(*t));
  }
  if (!has_heads) return;
  const size_t dim = g.head_dim;
  for (const fb::HeadRows* hr : *c.heads()) {
    const uint32_t l = hr->layer(), h = hr->kv_head();
    if (l >= g.n_layers || h >= g.n_kv_heads) {
      fail(KVSDK_E_CORRUPT, "rows for head (", l, ", ", h, ") outside the geometry");
    }
    ExactStore& e = s.layers[l].heads[h];
    if (hr->row_begin() != e.size()) {
      fail(KVSDK_E_CORRUPT, "rows of layer ", l, " head ", h, " out of order (run starts at ",
           hr->row_begin(), ", expected ", e.size(), ")");
    }
    const fb::ExactRows* r = hr->exact();
    if (!r || !r->positions() || !r->keys() || !r->values()) {
      fail(KVSDK_E_CORRUPT, "rows of layer ", l, " head ", h, " lack the exact tier");
    }
    const size_t n = r->positions()->size();
    if (n == 0 || r->keys()->size() != n * dim || r->values()->size() != n * dim) {
      fail(KVSDK_E_CORRUPT, "rows of layer ", l, " head ", h, " have mismatched array sizes");
    }
    if (n > declared[l][h] - e.size()) {
      fail(KVSDK_E_CORRUPT, "layer ", l, " head ", h, " has more rows than its metadata declares");
    }
    const int32_t* pos = r->positions()->data();
    check_file_positions(pos, n, "snapshot rows of layer " + std::to_string(l) + " head " +
                                     std::to_string(h) + " from row " +
                                     std::to_string(hr->row_begin()) + ": positions");
    // Reserve the declared size once it is plausible for this file (never trust a count alone).
    if (e.size() == 0 && declared[l][h] * ExactStore::bytes_per_token(g.head_dim) <= reserve_limit) {
      e.positions.reserve(declared[l][h]);
      e.k.reserve(declared[l][h] * dim);
      e.v.reserve(declared[l][h] * dim);
    }
    e.positions.insert(e.positions.end(), pos, pos + n);
    if (shuffled) {
      // Unshuffled while copied into the store (the bytes of a ushort vector are planes here).
      const unsigned char* k = r->keys()->Data();
      const unsigned char* v = r->values()->Data();
      append_unshuffled(k, k + n * dim, n * dim, e.k);
      append_unshuffled(v, v + n * dim, n * dim, e.v);
    } else {
      e.k.insert(e.k.end(), r->keys()->data(), r->keys()->data() + n * dim);
      e.v.insert(e.v.end(), r->values()->data(), r->values()->data() + n * dim);
    }
  }
}

void check_index(const fb::Index& idx, const std::vector<FrameRecord>& frames) {
  if (!idx.frames() || idx.frames()->size() != frames.size()) {
    fail(KVSDK_E_CORRUPT, "footer index does not list every frame");
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    const fb::FrameRef* r = idx.frames()->Get(uint32_t(i));
    if (r->offset() != frames[i].offset || r->payload_bytes() != frames[i].payload_bytes ||
        r->kind() != frames[i].kind) {
      fail(KVSDK_E_CORRUPT, "footer index entry ", i, " does not match the frames");
    }
  }
}

// Reads journal deltas after the trailer; a delta whose frames are not all sound is a torn tail.
void read_journal(Reader& rd, Snapshot& s) {
  uint64_t pos = s.base_end;
  std::vector<RawFrame> pending;
  std::vector<const fb::JournalDelta*> parts;
  s.journal_end = pos;
  while (pos < rd.size_) {
    RawFrame f;
    std::string why;
    if (!rd.locate(pos, s.snapshot_id, &f, &why) || f.header.kind != uint8_t(FrameKind::kJournal)) {
      s.journal_frames_dropped += uint32_t(pending.size()) + 1;
      return;
    }
    const fb::Frame* root = rd.open(f, &why);
    if (!root) {
      s.journal_frames_dropped += uint32_t(pending.size()) + 1;
      return;
    }
    const fb::JournalDelta* d = root->payload_as_JournalDelta();
    if (d->sequence() != s.next_sequence || d->part() != pending.size() || d->parts() == 0 ||
        d->part() >= d->parts()) {
      // Checksummed frames of this snapshot out of order: not a crash artefact.
      corrupt_at(pos, "journal frame out of sequence");
    }
    pending.push_back(std::move(f));
    pos = pending.back().end;
    if (d->part() + 1 == d->parts()) {
      parts.clear();
      for (RawFrame& p : pending) {
        parts.push_back(fb::GetFrame(p.flatbuffer.data())->payload_as_JournalDelta());
      }
      // The layers whose records this delta replaces: validate the records they hold now
      // first, which nothing else would (see validate_replaced_records).
      std::vector<uint32_t> replaced;
      if (parts.back()->tier_layers()) {
        replaced.assign(parts.back()->tier_layers()->begin(), parts.back()->tier_layers()->end());
      }
      for (uint32_t l : replaced) {
        if (l >= s.geometry.n_layers) continue;  // apply_delta refuses the list
        validate_replaced_records(s, l, s.next_sequence);
      }
      apply_delta(s.geometry, parts, s.format_major, s.layers, s.tiers);
      for (const auto& layer_records : s.tiers) {
        for (const TierRecord& r : layer_records) check_tier_record(r, s.geometry, s);
      }
      for (uint32_t l : replaced) {
        for (const TierRecord& r : s.tiers[l]) check_record_positions(r);
      }
      std::vector<std::vector<uint64_t>> rows(s.geometry.n_layers);
      for (uint32_t l = 0; l < s.geometry.n_layers; ++l) {
        for (uint32_t h = 0; h < s.geometry.n_kv_heads; ++h) {
          uint64_t n = s.layers[l].heads[h].size();
          // Compressed layers: the rows a head's record holds (per-row policy state, e.g. H2O
          // scores of an h2o+kiviN overlay, is checked against them).
          for (const TierRecord& r : s.tiers[l]) {
            if (r.kv_head != h) continue;
            for (const TierField& field : r.fields) {
              if (field.name == "positions") n = field.i32.size();
            }
          }
          rows[l].push_back(n);
        }
      }
      const bool score_diffs = s.format_major > 3 || (s.format_major == 3 && s.format_minor >= 1);
      read_policy_state(parts.back()->policy_state(), s.geometry, s.policy, rows, s.layers,
                        s.runtime, score_diffs);
      check_window_positions(s.layers);
      for (const RawFrame& p : pending) {
        s.journal_frames.push_back({p.offset, p.header.payload_bytes, p.header.kind});
      }
      s.journal_frames_applied += uint32_t(pending.size());
      pending.clear();
      ++s.next_sequence;
      s.journal_end = pos;
    }
  }
  s.journal_frames_dropped += uint32_t(pending.size());
}

}  // namespace

Snapshot read_snapshot(const unsigned char* data, size_t size, const ReadOptions& opt) {
  if (size < kFileHeaderBytes) {
    if (size >= 8 && std::equal(data, data + 8, kFileMagic)) {
      fail(KVSDK_E_CORRUPT, "snapshot truncated (", size, " bytes)");
    }
    fail(KVSDK_E_CORRUPT, "not a kvsdk snapshot (", size, " bytes, too short)");
  }
  Snapshot s;
  const FileHeader fh = decode_file_header(data);
  s.format_major = fh.major;
  s.format_minor = fh.minor;
  s.snapshot_id = fh.snapshot_id;

  Reader rd(data, size, s.format_major);
  std::vector<std::vector<uint64_t>> declared;
  bool have_meta = false;
  // Vectors may reserve what the metadata declares only up to this much (zstd ratios on real
  // caches stay far below 64; larger claims just grow as rows arrive).
  const uint64_t reserve_limit = uint64_t(size) * 64;
  // Frames are checked in batches of up to 2 per pool thread (1 without a pool): located in order
  // from their headers, then hash-checked, decompressed and verified in parallel (each on its
  // thread slot's zstd context), then read in file order. A frame's failure is only reported when
  // the in-order pass reaches it, after every earlier frame was read, so each error (status,
  // message, byte offset) is the one a frame-by-frame reader reports.
  // Memory beyond the cache's own: the decompressed frames of one batch hold at most
  // kBatchBytesPerThread per thread (2 default frames and their FlatBuffer overhead), or a single
  // larger frame alone. Each batch entry keeps its buffer for the next batch; entries past the
  // first give back buffers larger than one default frame. So a load holds at most the largest
  // frame plus 48 MiB per thread; with default frames (8 MiB of rows), 2 frames per thread.
  constexpr uint64_t kKeptFrameBytes = kDefaultFrameBytes + (4ull << 20);
  constexpr uint64_t kBatchBytesPerThread = 2 * kKeptFrameBytes;
  const size_t threads = opt.pool ? opt.pool->size() : 1;
  const uint64_t batch_bytes = kBatchBytesPerThread * threads;
  std::vector<BatchFrame> batch(threads > 1 ? 2 * threads : 1);
  std::vector<std::unique_ptr<ZstdDecompressor>> zstd(threads);
  const auto open_one = [&](size_t i) {
    BatchFrame& b = batch[i];
    if (!b.located) return;
    try {
      if (!rd.check_payload(b.f, s.snapshot_id, &b.why)) return;
      const size_t slot = ThreadPool::current_slot();
      if (slot >= zstd.size()) {
        fail(KVSDK_E_INTERNAL, "frame read on thread slot ", slot, " of a reader set up for ",
             zstd.size());
      }
      if (!zstd[slot]) zstd[slot] = std::make_unique<ZstdDecompressor>();
      b.root = rd.open(b.f, *zstd[slot], &b.why);
    } catch (...) {
      b.error = std::current_exception();  // (out of memory) raised when its turn comes
    }
  };
  uint64_t pos = kFileHeaderBytes;
  bool index_read = false;
  while (!index_read) {
    size_t n = 0;
    uint64_t raw = 0;
    for (uint64_t at = pos; n < batch.size();) {
      BatchFrame& b = batch[n];
      b.root = nullptr;
      b.why.clear();
      b.error = nullptr;
      b.located = rd.locate_header(at, s.snapshot_id, &b.f, &b.why);
      if (b.located) {
        raw += b.f.header.raw_bytes;
        if (n > 0 && raw > batch_bytes) break;  // it starts the next batch
      }
      ++n;
      // Nothing past a frame without a sound header can be located; nothing but the trailer
      // follows the index.
      if (!b.located || b.f.header.kind == uint8_t(FrameKind::kIndex)) break;
      at = b.f.end;
    }
    if (opt.pool && n > 1) {
      opt.pool->run(n, open_one);
    } else {
      for (size_t i = 0; i < n; ++i) open_one(i);
    }
    for (size_t i = 0; i < n; ++i) {
      BatchFrame& b = batch[i];
      if (b.error) std::rethrow_exception(b.error);
      if (!b.root) corrupt_at(pos, b.why);
      const RawFrame& f = b.f;
      const fb::Frame* root = b.root;
      const uint8_t kind = f.header.kind;
      if (!have_meta && kind != uint8_t(FrameKind::kMetadata)) {
        corrupt_at(pos, "the first frame is not the metadata");
      }
      if (kind == uint8_t(FrameKind::kMetadata)) {
        if (have_meta) corrupt_at(pos, "second metadata frame");
        read_metadata(*root->payload_as_Metadata(), opt, s, declared);
        have_meta = true;
      } else if (kind == uint8_t(FrameKind::kTierChunk)) {
        read_tier_chunk(*root->payload_as_TierChunk(), s.geometry, s, declared, reserve_limit,
                        (f.header.flags & kFrameShuffled) != 0);
      } else if (kind == uint8_t(FrameKind::kIndex)) {
        check_index(*root->payload_as_Index(), s.frames);
        s.frames.push_back({pos, f.header.payload_bytes, kind});
        pos = f.end;
        index_read = true;
        break;
      } else {
        corrupt_at(pos, "journal frame before the footer index");
      }
      s.frames.push_back({pos, f.header.payload_bytes, kind});
      pos = f.end;
    }
    for (size_t i = 1; i < n; ++i) {
      std::vector<unsigned char>& buf = batch[i].f.flatbuffer;
      if (buf.capacity() > kKeptFrameBytes) std::vector<unsigned char>().swap(buf);
    }
  }
  if (size - pos < kTrailerBytes) corrupt_at(pos, "truncated (trailer cut off)");
  const Trailer t = decode_trailer(data + pos, s.snapshot_id, s.format_major);
  if (t.index_offset != s.frames.back().offset) corrupt_at(pos, "trailer points to another index");
  RecordHashStream records(s.format_major, 0);
  records.update(data, kFileHeaderBytes);
  for (const FrameRecord& fr : s.frames) records.update(data + fr.offset, kFrameHeaderBytes);
  if (t.records_hash != records.digest()) corrupt_at(pos, "snapshot checksum mismatch");
  s.base_end = pos + kTrailerBytes;

  for (uint32_t l = 0; l < s.geometry.n_layers; ++l) {
    for (uint32_t h = 0; h < s.geometry.n_kv_heads; ++h) {
      if (s.covered[l]) {
        if (s.layers[l].heads[h].size() != 0) {
          fail(KVSDK_E_CORRUPT, "layer ", l, " is compressed but has exact rows");
        }
        continue;  // checked against the restored representation (Cache::restore's caller)
      }
      if (s.layers[l].heads[h].size() != declared[l][h]) {
        fail(KVSDK_E_CORRUPT, "layer ", l, " head ", h, " has ", s.layers[l].heads[h].size(),
             " rows, its metadata declares ", declared[l][h]);
      }
    }
  }
  s.declared_rows = declared;
  read_journal(rd, s);
  return s;
}

}  // namespace kvsdk::format
