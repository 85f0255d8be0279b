#include "policy_state.h"

#include <cmath>

#include "core/error.h"
#include "core/policy.h"

namespace kvsdk::format {

namespace {

[[noreturn]] void bad(const char* what) { fail(KVSDK_E_CORRUPT, "snapshot policy state: ", what); }

template <class T>
std::vector<T> per_layer(const flatbuffers::Vector<T>* v, uint32_t n_layers, const char* what) {
  if (!v) return {};
  if (v->size() != n_layers) bad(what);
  return std::vector<T>(v->begin(), v->end());
}

}  // namespace

flatbuffers::Offset<fb::PolicyState> build_policy_state(flatbuffers::FlatBufferBuilder& fbb,
                                                        const Cache& cache) {
  const Geometry& g = cache.geometry();
  std::vector<flatbuffers::Offset<fb::LayerPolicyState>> layers;
  for (uint32_t l = 0; l < g.n_layers; ++l) {
    const LayerState& L = cache.layer(l);
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
    if (!L.window_pos.empty()) {
      wq = fbb.CreateVector(L.window_q);
      wp = fbb.CreateVector(L.window_pos);
    }
    layers.push_back(fb::CreateLayerPolicyState(fbb, scores, wq, wp));
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
  const bool h2o = p.method == KVSDK_METHOD_H2O;
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
      if (ls->window_queries() || ls->window_positions()) {
        if (!method_uses_window(p.method) || !ls->window_queries() || !ls->window_positions()) {
          bad("observation window for a policy without one");
        }
        const size_t n = ls->window_positions()->size();
        if (n == 0 || n > size_t(p.obs_window) || ls->window_queries()->size() != n * qe) {
          bad("observation window size");
        }
        wq[l].assign(ls->window_queries()->begin(), ls->window_queries()->end());
        wp[l].assign(ls->window_positions()->begin(), ls->window_positions()->end());
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
