#include "policy_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/store_view.h"
#include "journal.h"
#include "util/error.h"
#include "xxhash64.h"

namespace kvsdk::format {

namespace {

[[noreturn]] void bad(const char* what) { fail(KVSDK_E_CORRUPT, "snapshot policy state: ", what); }

template <class T>
std::vector<T> per_layer(const flatbuffers::Vector<T>* v, uint32_t n_layers, const char* what) {
  if (!v) return {};
  if (v->size() != n_layers) bad(what);
  return std::vector<T>(v->begin(), v->end());
}

// The longest run of queries that ends the window `before` and begins `now`: a window slides,
// dropping its oldest queries and appending new ones.
size_t reused_queries(const std::vector<uint64_t>& before, const std::vector<uint64_t>& now) {
  for (size_t r = std::min(before.size(), now.size()); r > 0; --r) {
    if (std::equal(now.begin(), now.begin() + long(r), before.end() - long(r))) return r;
  }
  return 0;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// Row keys for matching scores across a delta: positions, or row indices when the positions do
// not describe the scores (matching only chooses what a difference is taken against).
std::vector<uint64_t> score_keys(const HeadScoreBase& h) {
  std::vector<uint64_t> k(h.scores.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = h.positions.size() == h.scores.size() ? uint64_t(uint32_t(h.positions[i])) : i;
  }
  return k;
}

// A head's scores as differences against the scores of the same rows before (format 3.1).
flatbuffers::Offset<fb::HeadScores> build_score_diffs(flatbuffers::FlatBufferBuilder& fbb,
                                                      const HeadScoreBase* before,
                                                      const HeadScoreBase& now) {
  static const HeadScoreBase kNone;
  if (!before) before = &kNone;
  const std::vector<fb::Segment> segs = match_in_order(score_keys(*before), score_keys(now), nullptr);
  const size_t n = now.scores.size();
  std::vector<uint8_t> planes(4 * n);
  size_t i = 0;
  for (const fb::Segment& sg : segs) {
    for (uint64_t c = 0; c < sg.count(); ++c, ++i) {
      const uint32_t ref = sg.base_begin() == kNewRows ? 0 : bits_of(before->scores[sg.base_begin() + c]);
      const uint32_t d = bits_of(now.scores[i]) - ref;
      for (size_t b = 0; b < 4; ++b) planes[b * n + i] = uint8_t(d >> (8 * b));
    }
  }
  return fb::CreateHeadScores(fbb, 0, fbb.CreateVectorOfStructs(segs), fbb.CreateVector(planes));
}

// Scores a delta gives as differences against `old` (the head's scores before it).
std::vector<float> read_score_diffs(const fb::HeadScores& hs, const std::vector<float>& old,
                                    uint64_t rows) {
  const auto* segs = hs.score_base();
  const auto* diffs = hs.score_diffs();
  if (!segs || !diffs || diffs->size() / 4 != rows || diffs->size() % 4 != 0) {
    bad("score differences of another size than the rows");
  }
  const size_t n = size_t(rows);
  std::vector<float> v(n);
  size_t i = 0;
  for (const fb::Segment* sg : *segs) {
    const uint64_t count = sg->count();
    const uint64_t b = sg->base_begin();
    if (count > n - i || (b != kNewRows && (b > old.size() || count > old.size() - b))) {
      bad("score differences against rows the scores before did not have");
    }
    for (uint64_t c = 0; c < count; ++c, ++i) {
      const uint32_t ref = b == kNewRows ? 0 : bits_of(old[size_t(b + c)]);
      uint32_t d = 0;
      for (size_t p = 0; p < 4; ++p) d |= uint32_t(diffs->Get(uint32_t(p * n + i))) << (8 * p);
      v[i] = float_of(ref + d);
    }
  }
  if (i != n) bad("score differences for fewer rows than the head holds");
  return v;
}

}  // namespace

ScoreBase score_base(const StoreView& cache) {
  const Geometry& g = cache.geometry();
  ScoreBase out(g.n_layers);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const LayerPolicyState& L = cache.layer(l);
    if (L.scores.empty()) continue;
    out[l].resize(L.scores.size());
    for (size_t h = 0; h < L.scores.size(); ++h) {
      HeadScoreBase& b = out[l][h];
      b.scores = L.scores[h];
      // The scores are parallel to the rows of the layer's row store, whatever it keeps them in.
      b.positions = cache.row_positions(l, uint32_t(h));
    }
  }
  return out;
}

std::vector<std::vector<uint64_t>> window_fingerprints(const StoreView& cache) {
  const Geometry& g = cache.geometry();
  const size_t qe = g.q_elems_per_token();
  std::vector<std::vector<uint64_t>> out(g.n_layers);
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const LayerPolicyState& L = cache.layer(l);
    for (size_t i = 0; i < L.window_pos.size(); ++i) {
      const uint64_t seed = xxh64(&L.window_pos[i], sizeof(int32_t), 0x6b7677696e646f77ull);
      out[l].push_back(xxh64(L.window_q.data() + i * qe, qe * sizeof(float), seed));
    }
  }
  return out;
}

flatbuffers::Offset<fb::PolicyState> build_policy_state(
    flatbuffers::FlatBufferBuilder& fbb, const StoreView& cache,
    const std::vector<std::vector<uint64_t>>* before, const ScoreBase* scores_before,
    const ScoreBase* scores_now) {
  const Geometry& g = cache.geometry();
  const size_t qe = g.q_elems_per_token();
  const std::vector<std::vector<uint64_t>> now =
      before ? window_fingerprints(cache) : std::vector<std::vector<uint64_t>>{};
  std::vector<flatbuffers::Offset<fb::LayerPolicyState>> layers;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const LayerPolicyState& L = cache.layer(l);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::HeadScores>>> scores = 0;
    if (!L.scores.empty()) {
      std::vector<flatbuffers::Offset<fb::HeadScores>> heads;
      const bool diffs = scores_before && scores_now && l < scores_now->size() &&
                         (*scores_now)[l].size() == L.scores.size();
      for (size_t h = 0; h < L.scores.size(); ++h) {
        if (!diffs) {
          heads.push_back(fb::CreateHeadScores(fbb, fbb.CreateVector(L.scores[h])));
          continue;
        }
        const HeadScoreBase* was = l < scores_before->size() && h < (*scores_before)[l].size()
                                       ? &(*scores_before)[l][h]
                                       : nullptr;
        heads.push_back(build_score_diffs(fbb, was, (*scores_now)[l][h]));
      }
      scores = fbb.CreateVector(heads);
    }
    flatbuffers::Offset<flatbuffers::Vector<float>> wq = 0;
    flatbuffers::Offset<flatbuffers::Vector<int32_t>> wp = 0;
    size_t reused = 0;
    if (!L.window_pos.empty()) {
      if (before && l < before->size()) reused = reused_queries((*before)[l], now[l]);
      wq = fbb.CreateVector(L.window_q.data() + reused * qe, (L.window_pos.size() - reused) * qe);
      wp = fbb.CreateVector(L.window_pos.data() + reused, L.window_pos.size() - reused);
    }
    layers.push_back(fb::CreateLayerPolicyState(fbb, scores, wq, wp, uint32_t(reused)));
  }
  const PolicyRuntime rt = cache.policy_runtime();
  auto opt_u64 = [&](const std::vector<uint64_t>& v) {
    return v.empty() ? flatbuffers::Offset<flatbuffers::Vector<uint64_t>>(0) : fbb.CreateVector(v);
  };
  const auto fixed = opt_u64(rt.fixed_alloc);
  const auto last = opt_u64(rt.last_caps);
  const auto shares = rt.profile_shares.empty()
                          ? flatbuffers::Offset<flatbuffers::Vector<double>>(0)
                          : fbb.CreateVector(rt.profile_shares);
  return fb::CreatePolicyState(fbb, rt.cache_budget, fixed, shares, last,
                               fbb.CreateVector(layers));
}

void read_policy_state(const fb::PolicyState* st, const Geometry& g, const kvsdk_policy& p,
                       const std::vector<std::vector<uint64_t>>& rows,
                       std::vector<LayerState>& layers, PolicyRuntime& runtime,
                       bool score_diffs) {
  const bool h2o = method_traits(p).scores_rows();
  const size_t qe = g.q_elems_per_token();
  PolicyRuntime rt;
  std::vector<std::vector<std::vector<float>>> scores(g.n_layers);
  std::vector<std::vector<float>> wq(g.n_layers);
  std::vector<std::vector<int32_t>> wp(g.n_layers);
  if (st) {
    rt.cache_budget = st->cache_budget();
    rt.fixed_alloc = per_layer(st->fixed_allocation(), g.n_layers, "fixed allocation size");
    rt.profile_shares = per_layer(st->profile_shares(), g.n_layers, "profile shares size");
    rt.last_caps = per_layer(st->last_allocation(), g.n_layers, "last allocation size");
    for (double s : rt.profile_shares) {
      if (!(std::isfinite(s) && s >= 0)) bad("profile share out of range");
    }
    if (!st->layers() || st->layers()->size() != g.n_layers) bad("layer count");
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      const fb::LayerPolicyState* ls = st->layers()->Get(l);
      if (ls->head_scores()) {
        if (!h2o || ls->head_scores()->size() != g.n_kv_heads) bad("scores for a policy without them");
        for (uint32_t h = 0; h < g.n_kv_heads; ++h) {
          const fb::HeadScores* hs = ls->head_scores()->Get(h);
          std::vector<float> v;
          if (hs->score_base() || hs->score_diffs()) {
            if (!score_diffs || hs->values()) {
              bad("score differences outside a journal delta of format 3.1 or later, or with "
                  "whole scores");
            }
            static const std::vector<float> kNone;
            const std::vector<float>& old = h < layers[l].scores.size() ? layers[l].scores[h] : kNone;
            v = read_score_diffs(*hs, old, rows[l][h]);
          } else {
            if (!hs->values() || hs->values()->size() != rows[l][h]) bad("score count differs from rows");
            v.assign(hs->values()->begin(), hs->values()->end());
          }
          for (float x : v) {
            if (!(std::isfinite(x) && x >= 0)) bad("score out of range");
          }
          scores[l].push_back(std::move(v));
        }
      }
      if (ls->window_queries() || ls->window_positions() || ls->window_reused()) {
        if (!method_traits(p).uses_window() || !ls->window_queries() || !ls->window_positions()) {
          bad("observation window for a policy without one");
        }
        const size_t fresh = ls->window_positions()->size();
        const size_t reused = ls->window_reused();
        const LayerState& prev = layers[l];
        if (reused > prev.window_pos.size() || prev.window_q.size() != prev.window_pos.size() * qe) {
          bad("observation window reuses more queries than it had");
        }
        const size_t n = reused + fresh;
        if (n == 0 || n > size_t(p.obs_window) || ls->window_queries()->size() != fresh * qe) {
          bad("observation window size");
        }
        const size_t from = prev.window_pos.size() - reused;
        wq[l].assign(prev.window_q.begin() + long(from * qe), prev.window_q.end());
        wp[l].assign(prev.window_pos.begin() + long(from), prev.window_pos.end());
        wq[l].insert(wq[l].end(), ls->window_queries()->begin(), ls->window_queries()->end());
        wp[l].insert(wp[l].end(), ls->window_positions()->begin(), ls->window_positions()->end());
        for (float x : wq[l]) {
          if (!std::isfinite(x)) bad("non-finite window query");
        }
      }
    }
  }
  // Commit: H2O always has one score per row (zero when the file had none).
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    LayerState& L = layers[l];
    if (h2o) {
      if (scores[l].empty()) {
        for (uint32_t h = 0; h < g.n_kv_heads; ++h) scores[l].emplace_back(rows[l][h], 0.0f);
      }
      L.scores = std::move(scores[l]);
    } else {
      L.scores.clear();
    }
    L.window_q = std::move(wq[l]);
    L.window_pos = std::move(wp[l]);
  }
  runtime = std::move(rt);
}

}  // namespace kvsdk::format
