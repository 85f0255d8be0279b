// C ABI: snapshots (save to file/buffer, journal deltas, load from file/buffer). Checks the
// arguments, then runs formats/ inside guard() so that errors become statuses.
#include <cstring>
#include <memory>
#include <string>

#include "core/cache.h"
#include "core/geometry.h"
#include "core/policy.h"
#include "journal.h"
#include "save_target.h"
#include "xxhash64.h"
#include "kvsdk.h"
#include "snapshot_file.h"
#include "snapshot_reader.h"
#include "snapshot_writer.h"
#include "util/error.h"
#include "util/options.h"
#include "util/struct_versions.h"

using namespace kvsdk;
using namespace kvsdk::format;

namespace {

kvsdk_cache& handle(kvsdk_cache* cache) {
  KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
  return *cache;
}

std::shared_ptr<JournalBase> make_base(Fingerprints fp, uint64_t id, uint64_t base_end,
                                       uint64_t journal_end, uint64_t next_sequence,
                                       uint16_t format_major, uint16_t format_minor) {
  auto b = std::make_shared<JournalBase>();
  b->snapshot_id = id;
  b->base_end = base_end;
  b->journal_end = journal_end;
  b->next_sequence = next_sequence;
  b->rows = std::move(fp.rows);
  b->tiers = std::move(fp.tiers);
  b->windows = std::move(fp.windows);
  b->scores = std::move(fp.scores);
  b->format_major = format_major;
  b->format_minor = format_minor;
  return b;
}

// A restored cache from a read snapshot: its stores checked against what the metadata declared
// and its policy state applied. Charged to `ctx` (KVSDK_E_BUDGET when it does not fit).
std::shared_ptr<Cache> restore_cache(const std::shared_ptr<Context>& ctx, Snapshot& s) {
  std::shared_ptr<Cache> c = Cache::restore(ctx, s.geometry, s.policy, std::move(s.layers), s.tiers);
  if (s.journal_frames_applied == 0) {
    // Compressed layers: the restored stores must hold what the metadata declared.
    for (uint32_t l = 0; l < s.geometry.n_layers; ++l) {
      if (!s.covered[l]) continue;
      for (uint32_t kh = 0; kh < s.geometry.n_kv_heads; ++kh) {
        if (c->head_tokens(l, kh) != s.declared_rows[l][kh]) {
          fail(KVSDK_E_CORRUPT, "snapshot layer ", l, " head ", kh, " holds ",
               c->head_tokens(l, kh), " rows, its metadata declares ", s.declared_rows[l][kh]);
        }
      }
    }
  }
  c->restore_policy_runtime(std::move(s.runtime));
  return c;
}

// The shared prefix a snapshot's cache continues: the caller's `prefix` (which must be the one
// the snapshot references), or the prefix the snapshot embeds, restored as a private frozen copy.
std::shared_ptr<const Cache> prefix_for(const Snapshot& s, kvsdk_cache* prefix,
                                        const std::shared_ptr<Context>& ctx) {
  if (!s.has_prefix) {
    if (prefix) fail(KVSDK_E_STATE, "the snapshot does not continue a shared prefix");
    return nullptr;
  }
  std::shared_ptr<const Cache> p;
  if (prefix) {
    p = prefix->impl;
    if (!p->frozen()) fail(KVSDK_E_STATE, "the prefix cache is not frozen");
    if (content_hash(*p) != s.prefix_hash) {
      fail(KVSDK_E_STATE, "the snapshot continues another shared prefix (content hash ",
           std::to_string(s.prefix_hash), "; this prefix's is ", std::to_string(content_hash(*p)),
           ")");
    }
  } else if (!s.prefix_snapshot.empty()) {
    ReadOptions opt;
    opt.available_bytes = ctx->available();
    opt.pool = &ctx->pool();
    // The embedded snapshot is part of a file this library read: whatever it claims that this
    // library cannot load (a newer format, a bad header) is damage, not a reason to upgrade.
    Snapshot ps;
    try {
      ps = read_snapshot(s.prefix_snapshot.data(), s.prefix_snapshot.size(), opt);
    } catch (const Error& e) {
      if (e.status() == KVSDK_E_NO_MEMORY || e.status() == KVSDK_E_BUDGET) throw;
      fail(KVSDK_E_CORRUPT, "the snapshot's embedded prefix is damaged: ", e.what());
    }
    if (ps.has_prefix || ps.journal_frames_applied != 0) {
      fail(KVSDK_E_CORRUPT, "the snapshot's embedded prefix is not a plain snapshot");
    }
    std::shared_ptr<Cache> own = restore_cache(ctx, ps);
    if (content_hash(*own) != s.prefix_hash) {
      fail(KVSDK_E_CORRUPT, "the snapshot's embedded prefix does not match its content hash");
    }
    own->freeze();
    p = std::move(own);
  } else {
    fail(KVSDK_E_STATE, "the snapshot continues a shared prefix (content hash ",
         std::to_string(s.prefix_hash), ") that it does not embed: load it with ",
         "kvsdk_cache_load_on_prefix and that prefix");
  }
  if (p->geometry() != s.geometry) {
    fail(KVSDK_E_GEOMETRY, "the snapshot's geometry differs from its shared prefix's");
  }
  return p;
}

// Shared by every load: validate, read, restore, remember the journal position. With `prefix`,
// the snapshot must continue it (kvsdk_cache_load_on_prefix).
void load(kvsdk_cache** out, std::shared_ptr<Context> ctx, const unsigned char* data, size_t size,
          const kvsdk_geometry* expected, kvsdk_load_info* info, kvsdk_cache* prefix = nullptr) {
  KVSDK_REQUIRE(out != nullptr, "out is NULL");
  KVSDK_REQUIRE(info == nullptr || info->struct_size >= kLoadInfoSizeV1, "info->struct_size is ",
                info ? info->struct_size : 0, " (too small; call kvsdk_load_info_init first)");
  Geometry want;
  ReadOptions opt;
  if (expected) {
    want = Geometry::from_c(expected);
    opt.expected = &want;
  }
  opt.available_bytes = ctx->available();
  opt.pool = &ctx->pool();
  Snapshot s = read_snapshot(data, size, opt);
  std::shared_ptr<const Cache> pre = prefix_for(s, prefix, ctx);
  const uint16_t major = s.format_major, minor = s.format_minor;
  auto h = std::make_unique<kvsdk_cache>();
  h->impl = restore_cache(ctx, s);
  if (pre) h->impl->attach_prefix(std::move(pre));
  // Deltas continue the records as the file holds them (a file saved without SpeCache's backing
  // store has none, although the restored cache rebuilt it).
  Fingerprints fp = fingerprint(*h->impl, uses_xxh3(major), &ctx->pool());
  for (uint32_t l = 0; l < s.geometry.n_layers && l < s.tiers.size(); ++l) {
    fp.tiers[l] = sign_layer(s.tiers[l]);
  }
  h->journal = make_base(std::move(fp), s.snapshot_id, s.base_end, s.journal_end,
                         s.next_sequence, major, minor);
  if (info) {
    kvsdk_load_info found{};
    found.format_major = major;
    found.format_minor = minor;
    found.journal_frames_applied = s.journal_frames_applied;
    found.journal_frames_dropped = s.journal_frames_dropped;
    write_versioned(info, found, kLoadInfoSizeV1, "info");  // (its size was checked above)
  }
  *out = h.release();
}

// A full atomic save to `path`, which becomes the base of the cache's later deltas.
void save_full(kvsdk_cache& c, const char* path, const SaveParams& params) {
  // Fingerprint first: once the file is renamed nothing may fail.
  // XXH3 in format 6 files.
  Fingerprints fp = fingerprint(*c.impl, has_exact_rows(*c.impl), &c.impl->context().pool());
  const uint64_t id = snapshot_id_of(*c.impl, fp.rows);
  // The journal continues the records as the file holds them: without the backing store
  // fields when the save leaves them out (a later delta then writes them whole).
  bool any_tier = false;
  for (LayerSignature& layer : fp.tiers) {
    any_tier = any_tier || !layer.empty();
    if (!params.include_backing) drop_backing_fields(layer);
  }
  const uint16_t major = format_major_for(*c.impl, any_tier);
  auto base = make_base(std::move(fp), id, 0, 0, 1, major, format_minor_for(major));
  save_file_atomically(
      path,
      [&](Sink& sink) {
        base->base_end = base->journal_end =
            write_snapshot(*c.impl, params, id, sink, &c.impl->context().pool());
      },
      c.impl->context().pool().size() > 1);
  c.journal = std::move(base);
}

// A targeted save (kvsdk_save_options.target_policy, include/kvsdk.h "Targeted saves"): the
// cache converted by convert_cache, written atomically to `path` (or sized / written into a
// buffer by the caller's `write`). The converted cache is temporary: the file does not become
// the base of the live cache's journal, whose base stays the file of its last plain save/load.
template <class Write>
void save_converted(const kvsdk_cache& c, const SaveTarget& target, Write&& write) {
  const std::unique_ptr<Cache> t = convert_cache(*c.impl, target);
  const uint64_t id =
      snapshot_id_of(*t, fingerprint(*t, has_exact_rows(*t), &t->context().pool()).rows);
  write(*t, id);
}

// Why kvsdk_cache_save_delta cannot continue `path`, when the file there holds a snapshot of
// another policy than the cache's (e.g. one a targeted save wrote); empty otherwise (the caller
// keeps its own message). Only runs on that error path: it reads the whole file.
std::string foreign_policy_note(const Cache& c, const char* path) {
  try {
    MappedFile f(path);
    ReadOptions opt;
    opt.require_implemented = false;
    const Snapshot s = read_snapshot(f.data(), f.size(), opt);
    if (std::memcmp(&s.policy, &c.policy(), sizeof(kvsdk_policy)) == 0) return {};
    return "'" + std::string(path) + "' holds a snapshot of policy '" + policy_spec(s.policy) +
           "' (e.g. from a save with a target_policy), this cache's policy is '" +
           policy_spec(c.policy()) + "': a delta of the live policy cannot continue a file of "
           "another policy (save it in full first)";
  } catch (const std::exception&) {
    return {};
  }
}

// A save's scope: the host copies it staged of a device cache's rows are freed when it ends.
struct HostStaging {
  const Cache& cache;
  ~HostStaging() { cache.release_host_staging(); }
};

}  // namespace

extern "C" {

KVSDK_API kvsdk_status kvsdk_save_options_init_sized(kvsdk_save_options* options,
                                                     size_t struct_size) {
  return guard("kvsdk_save_options_init_sized", [&] {
    init_versioned(options, struct_size, save_options_defaults(), kSaveOptionsSizeV1, "options");
  });
}

// The legacy *_init symbols are frozen at the first version's size (include/kvsdk.h, ABI rules).
KVSDK_API kvsdk_status(kvsdk_save_options_init)(kvsdk_save_options* options) {
  return guard("kvsdk_save_options_init", [&] {
    init_versioned(options, kSaveOptionsSizeV1, save_options_defaults(), kSaveOptionsSizeV1,
                   "options");
  });
}

KVSDK_API kvsdk_status kvsdk_load_info_init_sized(kvsdk_load_info* info, size_t struct_size) {
  return guard("kvsdk_load_info_init_sized", [&] {
    init_versioned(info, struct_size, kvsdk_load_info{}, kLoadInfoSizeV1, "info");
  });
}

KVSDK_API kvsdk_status(kvsdk_load_info_init)(kvsdk_load_info* info) {
  return guard("kvsdk_load_info_init", [&] {
    init_versioned(info, kLoadInfoSizeV1, kvsdk_load_info{}, kLoadInfoSizeV1, "info");
  });
}

KVSDK_API kvsdk_status kvsdk_cache_save(kvsdk_cache* cache, const char* path,
                                        const kvsdk_save_options* options) {
  return guard("kvsdk_cache_save", [&] {
    kvsdk_cache& c = handle(cache);
    const HostStaging staging{*c.impl};
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    const SaveParams params = save_params_from_c(options);
    const SaveTarget target = save_target_from_c(options);
    if (!target.set) {
      save_full(c, path, params);
      return;
    }
    save_converted(c, target, [&](const Cache& t, uint64_t id) {
      save_file_atomically(
          path, [&](Sink& sink) { write_snapshot(t, params, id, sink, &t.context().pool()); },
          t.context().pool().size() > 1);
    });
  });
}

KVSDK_API kvsdk_status kvsdk_cache_save_to_buffer(kvsdk_cache* cache,
                                                  const kvsdk_save_options* options, void* buf,
                                                  size_t capacity, size_t* out_size) {
  return guard("kvsdk_cache_save_to_buffer", [&] {
    const kvsdk_cache& c = handle(cache);
    const HostStaging staging{*c.impl};
    KVSDK_REQUIRE(out_size != nullptr, "out_size is NULL");
    const SaveParams params = save_params_from_c(options);
    const SaveTarget target = save_target_from_c(options);
    // Writes `cache` (this one, or its conversion) with the id a file save writes (save_full,
    // save_converted), so that both give the same bytes.
    auto write = [&](const Cache& saved, uint64_t id) {
      if (buf == nullptr) {
        CountingSink sink;
        *out_size = size_t(write_snapshot(saved, params, id, sink, &saved.context().pool()));
        return;
      }
      // A buffer is not a file: the journal keeps continuing the last file saved or loaded.
      BufferSink sink(buf, capacity);
      write_snapshot(saved, params, id, sink, &saved.context().pool());
      *out_size = size_t(sink.written());
    };
    if (target.set) {
      save_converted(c, target, write);
      return;
    }
    write(*c.impl, snapshot_id_of(*c.impl, fingerprint(*c.impl, has_exact_rows(*c.impl),
                                                       &c.impl->context().pool()).rows));
  });
}

KVSDK_API kvsdk_status kvsdk_cache_save_delta(kvsdk_cache* cache, const char* path,
                                              const kvsdk_save_options* options) {
  return guard("kvsdk_cache_save_delta", [&] {
    kvsdk_cache& c = handle(cache);
    const HostStaging staging{*c.impl};
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    const SaveParams params = save_params_from_c(options);
    if (save_target_from_c(options).set) {
      fail(KVSDK_E_UNSUPPORTED, "a delta records the cache's own changes under its own policy: "
           "options.target_policy applies to kvsdk_cache_save and kvsdk_cache_save_to_buffer "
           "only");
    }
    if (!c.journal) {
      const std::string note = foreign_policy_note(*c.impl, path);
      fail(KVSDK_E_STATE, "the cache was never saved or loaded: save it in full first",
           note.empty() ? "" : "; ", note);
    }
    DeltaFrames d = build_delta(*c.impl, *c.journal, params.max_frame_bytes,
                                &c.impl->context().pool());
    uint64_t end = 0;
    try {
      end = append_journal(path, *c.journal, d.parts, params.zstd_level,
                           &c.impl->context().pool());
    } catch (const Error& e) {
      if (e.status() != KVSDK_E_STATE) throw;
      const std::string note = foreign_policy_note(*c.impl, path);
      if (note.empty()) throw;
      fail(KVSDK_E_STATE, e.what(), "; ", note);
    }
    c.journal->journal_end = end;
    c.journal->next_sequence += 1;
    c.journal->rows = std::move(d.now.rows);
    c.journal->tiers = std::move(d.now.tiers);
    c.journal->windows = std::move(d.now.windows);
    c.journal->scores = std::move(d.now.scores);
    // Compaction: a journal past its share of the base is folded into a fresh full save.
    const JournalBase& b = *c.journal;
    if (params.max_journal_percent != 0 &&
        (b.journal_end - b.base_end) * 100 > uint64_t(params.max_journal_percent) * b.base_end) {
      save_full(c, path, params);
    }
  });
}

KVSDK_API kvsdk_status kvsdk_cache_load(kvsdk_cache** out, kvsdk_context* ctx, const char* path,
                                        const kvsdk_geometry* expected, kvsdk_load_info* info) {
  return guard("kvsdk_cache_load", [&] {
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    KVSDK_REQUIRE(out != nullptr && ctx != nullptr, "out or ctx is NULL");
    MappedFile f(path);
    load(out, ctx->impl, f.data(), f.size(), expected, info);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_load_on_prefix(kvsdk_cache** out, kvsdk_cache* prefix,
                                                  const char* path, kvsdk_load_info* info) {
  return guard("kvsdk_cache_load_on_prefix", [&] {
    KVSDK_REQUIRE(path != nullptr, "path is NULL");
    KVSDK_REQUIRE(out != nullptr && prefix != nullptr && prefix->impl, "out or prefix is NULL");
    MappedFile f(path);
    const kvsdk_geometry g = prefix->impl->geometry().to_c();
    load(out, prefix->impl->context_ptr(), f.data(), f.size(), &g, info, prefix);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_load_from_buffer(kvsdk_cache** out, kvsdk_context* ctx,
                                                    const void* buf, size_t size,
                                                    const kvsdk_geometry* expected,
                                                    kvsdk_load_info* info) {
  return guard("kvsdk_cache_load_from_buffer", [&] {
    KVSDK_REQUIRE(buf != nullptr, "buf is NULL");
    KVSDK_REQUIRE(ctx != nullptr, "ctx is NULL");
    load(out, ctx->impl, static_cast<const unsigned char*>(buf), size, expected, info);
  });
}

KVSDK_API kvsdk_status kvsdk_cache_policy(const kvsdk_cache* cache, kvsdk_policy* out) {
  return guard("kvsdk_cache_policy", [&] {
    KVSDK_REQUIRE(cache != nullptr && cache->impl, "cache is NULL");
    // Any version of the struct (kPolicySizeV1 and later): the fields it has are written.
    write_versioned(out, cache->impl->policy(), kPolicySizeV1, "out");
  });
}

}  // extern "C"
