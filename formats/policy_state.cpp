#include "policy_state.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/policy.h"
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

}  // namespace

std::vector<std::vector<uint64_t>> window_fingerprints(const Cache& cache) {
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
    flatbuffers::FlatBufferBuilder& fbb, const Cache& cache,
    const std::vector<std::vector<uint64_t>>* before) {
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
      for (const std::vector<float>& s : L.scores) {
        heads.push_back(fb::CreateHeadScores(fbb, fbb.CreateVector(s)));
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
                       std::vector<LayerState>& layers, PolicyRuntime& runtime) {
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
          if (!hs->values() || hs->values()->size() != rows[l][h]) bad("score count differs from rows");
          std::vector<float> v(hs->values()->begin(), hs->values()->end());
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
