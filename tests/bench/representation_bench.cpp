// Decode-step attention over each compressed representation vs dense f32 attention over the full
// cache, for one Llama-3-8B-like layer (32 query heads, 8 KV heads, head_dim 128, one query) at 4k
// and 32k tokens. Every benchmark reports `bytes` (the representation's stored bytes for the layer)
// so size and speed can both be read as ratios to the dense baselines of the same run.
//
// Data: Gaussian keys/values with a few outlier key channels; SpindleKV gets clustered rows (its
// compression depends on similarity; its attention cost does not), MiniCache a correlated layer
// pair. Stores are built once per (representation, length), outside the timed loop.
#include <benchmark/benchmark.h>

#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention.h"
#include "kivi_attention.h"
#include "kivi_store.h"
#include "minicache_kivi.h"
#include "minicache_merge.h"
#include "rope.h"
#include "smallkv.h"
#include "specache.h"
#include "spindlekv_store.h"
#include "util/half.h"

using namespace kvsdk::cpu;

namespace {

constexpr size_t kQHeads = 32, kKvHeads = 8, kDim = 128, kGroup = kQHeads / kKvHeads;
constexpr float kScale = 0.08838834764831845f;  // 1/sqrt(128)

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (float& f : x) f = d(rng);
  return x;
}

struct HeadData {
  std::vector<float> k, v;  // [n][dim]
};

HeadData make_head(size_t n, uint32_t seed) {
  HeadData h{gaussian(n * kDim, seed), gaussian(n * kDim, seed + 1000)};
  for (size_t t = 0; t < n; ++t) {
    h.k[t * kDim + 3] *= 8.0f;
    h.k[t * kDim + 77] *= 5.0f;
  }
  return h;
}

std::vector<int32_t> positions(size_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// Holds the one fixture alive at a time (32k-token layers are large) and rebuilds it only when the
// benchmark or length changes.
template <class T>
T& fixture(const std::string& key, const std::function<std::unique_ptr<T>()>& build) {
  static std::string current;
  static std::shared_ptr<void> holder;
  if (current != key) {
    holder.reset();
    holder = std::shared_ptr<T>(build().release());
    current = key;
  }
  return *static_cast<T*>(holder.get());
}

struct Query {
  std::vector<float> q = gaussian(kQHeads * kDim, 7, 0.5f);
  std::vector<int32_t> qpos = std::vector<int32_t>(kGroup, INT32_MAX);
  const float* head(size_t h) const { return q.data() + h * kGroup * kDim; }
};

// Runs `feed(head, attn)` for the 8 KV heads of the layer and finishes each.
template <class Feed>
void attend_layer(const Query& q, std::vector<float>& out, Feed&& feed) {
  for (size_t h = 0; h < kKvHeads; ++h) {
    OnlineAttention attn(q.head(h), q.qpos.data(), kGroup, kDim, kScale);
    feed(h, attn);
    attn.finish(out.data() + h * kGroup * kDim);
  }
}

// --- baselines ---------------------------------------------------------------------------------

struct DenseF32 {
  std::vector<HeadData> heads;
  std::vector<int32_t> pos;
};

void BM_DenseF32(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  auto& f = fixture<DenseF32>("dense" + std::to_string(n), [&] {
    auto d = std::make_unique<DenseF32>();
    for (size_t h = 0; h < kKvHeads; ++h) d->heads.push_back(make_head(n, uint32_t(h)));
    d->pos = positions(n);
    return d;
  });
  Query q;
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    attend_layer(q, out, [&](size_t h, OnlineAttention& a) {
      a.add_chunk(f.heads[h].k.data(), f.heads[h].v.data(), f.pos.data(), n);
    });
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes"] = double(kKvHeads * n * kDim * 2 * 4);
}

// The exact tier as the cache holds it: f16 rows converted chunk by chunk.
struct ExactF16 {
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<int32_t> pos;
};

void BM_ExactF16(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  auto& f = fixture<ExactF16>("f16" + std::to_string(n), [&] {
    auto d = std::make_unique<ExactF16>();
    for (size_t h = 0; h < kKvHeads; ++h) {
      const HeadData x = make_head(n, uint32_t(h));
      d->k.emplace_back(n * kDim);
      d->v.emplace_back(n * kDim);
      for (size_t i = 0; i < n * kDim; ++i) {
        d->k[h][i] = kvsdk::f32_to_f16(x.k[i]);
        d->v[h][i] = kvsdk::f32_to_f16(x.v[i]);
      }
    }
    d->pos = positions(n);
    return d;
  });
  Query q;
  std::vector<float> out(kQHeads * kDim), kc(256 * kDim), vc(256 * kDim);
  for (auto _ : state) {
    attend_layer(q, out, [&](size_t h, OnlineAttention& a) {
      for (size_t first = 0; first < n; first += 256) {
        const size_t c = std::min<size_t>(256, n - first);
        for (size_t i = 0; i < c * kDim; ++i) {
          kc[i] = kvsdk::f16_to_f32(f.k[h][first * kDim + i]);
          vc[i] = kvsdk::f16_to_f32(f.v[h][first * kDim + i]);
        }
        a.add_chunk(kc.data(), vc.data(), f.pos.data() + first, c);
      }
    });
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes"] = double(kKvHeads * n * (kDim * 2 * 2 + 4));
}

// --- KIVI --------------------------------------------------------------------------------------

struct KiviLayer {
  std::vector<KiviHeadStore> heads;
};

std::unique_ptr<KiviLayer> build_kivi(size_t n, uint32_t bits) {
  auto d = std::make_unique<KiviLayer>();
  const std::vector<int32_t> pos = positions(n);
  for (size_t h = 0; h < kKvHeads; ++h) {
    const HeadData x = make_head(n, uint32_t(h));
    d->heads.emplace_back(kDim, KiviConfig{bits, 32, 128});
    d->heads.back().append(x.k.data(), x.v.data(), pos.data(), n);
  }
  return d;
}

void BM_Kivi(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  const uint32_t bits = uint32_t(state.range(1));
  auto& f = fixture<KiviLayer>("kivi" + std::to_string(bits) + "_" + std::to_string(n),
                               [&] { return build_kivi(n, bits); });
  Query q;
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    attend_layer(q, out, [&](size_t h, OnlineAttention& a) { kivi_attend(f.heads[h], a); });
    benchmark::DoNotOptimize(out.data());
  }
  uint64_t bytes = 0;
  for (const auto& s : f.heads) bytes += s.bytes().total();
  state.counters["bytes"] = double(bytes);
}

// --- SpindleKV ---------------------------------------------------------------------------------

struct SpindleLayer {
  std::vector<SpindleHeadStore> heads;
};

void BM_SpindleKV(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  auto& f = fixture<SpindleLayer>("spindle" + std::to_string(n), [&] {
    auto d = std::make_unique<SpindleLayer>();
    const std::vector<int32_t> pos = positions(n);
    const Rope rope(kDim, 500000.0f, KVSDK_ROPE_HALF);
    for (size_t h = 0; h < kKvHeads; ++h) {
      // 256 pre-RoPE key directions and 512 value directions with small jitter.
      const std::vector<float> kc = gaussian(256 * kDim, uint32_t(10 + h));
      const std::vector<float> vc = gaussian(512 * kDim, uint32_t(20 + h));
      std::vector<float> k = gaussian(n * kDim, uint32_t(30 + h), 0.02f);
      std::vector<float> v = gaussian(n * kDim, uint32_t(40 + h), 0.03f);
      std::mt19937 rng{uint32_t(h)};
      for (size_t t = 0; t < n; ++t) {
        const size_t a = rng() % 256, b = rng() % 512;
        const float m = 0.5f + float(rng() % 1000) / 1000.0f;
        for (size_t x = 0; x < kDim; ++x) {
          k[t * kDim + x] = m * (kc[a * kDim + x] + k[t * kDim + x]);
          v[t * kDim + x] = m * (vc[b * kDim + x] + v[t * kDim + x]);
        }
        rope.apply(&k[t * kDim], pos[t]);
      }
      d->heads.emplace_back(kDim, 500000.0f, KVSDK_ROPE_HALF);
      for (size_t first = 0; first < n; first += 512) {  // prefill in chunks of 512 tokens
        const size_t c = std::min<size_t>(512, n - first);
        d->heads.back().append(&k[first * kDim], &v[first * kDim], &pos[first], c);
      }
    }
    return d;
  });
  Query q;
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    attend_layer(q, out, [&](size_t h, OnlineAttention& a) { spindlekv_attend(f.heads[h], a); });
    benchmark::DoNotOptimize(out.data());
  }
  uint64_t bytes = 0, entries = 0;
  for (const auto& s : f.heads) {
    bytes += s.bytes().total();
    entries += s.keys().entries() + s.values().entries();
  }
  state.counters["bytes"] = double(bytes);
  state.counters["entries"] = double(entries);
}

// --- MiniCache ---------------------------------------------------------------------------------

struct MiniLayer {
  std::vector<MiniCacheHeadPair> heads;
};

void BM_MiniCache(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  auto& f = fixture<MiniLayer>("mini" + std::to_string(n), [&] {
    auto d = std::make_unique<MiniLayer>();
    const std::vector<int32_t> pos = positions(n);
    for (size_t h = 0; h < kKvHeads; ++h) {
      HeadData a = make_head(n, uint32_t(h)), b = make_head(n, uint32_t(h + 100));
      for (size_t i = 0; i < n * kDim; ++i) {  // layer l correlated with layer l-1
        b.k[i] = 1.5f * a.k[i] + 0.5f * b.k[i];
        b.v[i] = 1.2f * a.v[i] + 0.5f * b.v[i];
      }
      d->heads.emplace_back(kDim, MiniCacheConfig{});
      d->heads.back().append(a.k.data(), a.v.data(), b.k.data(), b.v.data(), pos.data(), n);
    }
    return d;
  });
  Query q;
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    attend_layer(q, out, [&](size_t h, OnlineAttention& a) { minicache_attend(f.heads[h], 1, a); });
    benchmark::DoNotOptimize(out.data());
  }
  // A pair serves two layers: report the bytes per layer.
  uint64_t bytes = 0;
  for (const auto& s : f.heads) bytes += s.bytes();
  state.counters["bytes"] = double(bytes) / 2;
}

// MiniCache + KIVI 4-bit ("minicache+kivi4"): the merged directions held in a KIVI store.
struct MiniKiviLayer {
  std::vector<MiniCacheKiviPair> heads;
};

void BM_MiniCacheKivi4(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  auto& f = fixture<MiniKiviLayer>("minikivi" + std::to_string(n), [&] {
    auto d = std::make_unique<MiniKiviLayer>();
    const std::vector<int32_t> pos = positions(n);
    for (size_t h = 0; h < kKvHeads; ++h) {
      HeadData a = make_head(n, uint32_t(h)), b = make_head(n, uint32_t(h + 100));
      for (size_t i = 0; i < n * kDim; ++i) {
        b.k[i] = 1.5f * a.k[i] + 0.5f * b.k[i];
        b.v[i] = 1.2f * a.v[i] + 0.5f * b.v[i];
      }
      d->heads.emplace_back(kDim, MiniCacheConfig{}, KiviConfig{4, 32, 128});
      d->heads.back().append(a.k.data(), a.v.data(), b.k.data(), b.v.data(), pos.data(), n);
    }
    return d;
  });
  Query q;
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    attend_layer(q, out, [&](size_t h, OnlineAttention& a) { minicache_kivi_attend(f.heads[h], 1, a); });
    benchmark::DoNotOptimize(out.data());
  }
  uint64_t bytes = 0;
  for (const auto& s : f.heads) bytes += s.bytes().total();
  state.counters["bytes"] = double(bytes) / 2;
}

// --- SmallKV -----------------------------------------------------------------------------------

struct SmallLayer {
  struct Head {
    std::vector<float> kf, vf, vm, w;
    std::vector<int32_t> pf, pm;
  };
  std::vector<Head> heads;
};

// Budget 20% of the tokens: 10% critical + 5% recent with K and V, 10% marginal with V only.
void BM_SmallKV(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  auto& f = fixture<SmallLayer>("small" + std::to_string(n), [&] {
    auto d = std::make_unique<SmallLayer>();
    const SmallKvSplit split = smallkv_split_budget(n / 5, n);
    for (size_t h = 0; h < kKvHeads; ++h) {
      const HeadData x = make_head(n, uint32_t(h));
      const std::vector<float> proxy = gaussian(n, uint32_t(50 + h));
      const SmallKvSelection sel = smallkv_select(proxy.data(), n, split);
      SmallLayer::Head hd;
      for (uint32_t t : sel.full) {
        hd.kf.insert(hd.kf.end(), &x.k[t * kDim], &x.k[(t + 1) * kDim]);
        hd.vf.insert(hd.vf.end(), &x.v[t * kDim], &x.v[(t + 1) * kDim]);
        hd.pf.push_back(int32_t(t));
      }
      for (uint32_t t : sel.marginal) {
        hd.vm.insert(hd.vm.end(), &x.v[t * kDim], &x.v[(t + 1) * kDim]);
        hd.pm.push_back(int32_t(t));
      }
      hd.w.assign(kGroup * sel.marginal.size(), 0.3f / float(n));
      d->heads.push_back(std::move(hd));
    }
    return d;
  });
  Query q;
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    for (size_t h = 0; h < kKvHeads; ++h) {
      const auto& hd = f.heads[h];
      smallkv_attend(q.head(h), q.qpos.data(), kGroup, kDim, kScale, hd.kf.data(), hd.vf.data(),
                     hd.pf.data(), hd.pf.size(), hd.vm.data(), hd.pm.data(), hd.pm.size(),
                     hd.w.data(), out.data() + h * kGroup * kDim);
    }
    benchmark::DoNotOptimize(out.data());
  }
  // Stored as f16 in the cache: K+V+position for kept tokens, V+position for marginal ones.
  uint64_t bytes = 0;
  for (const auto& hd : f.heads) bytes += hd.pf.size() * (kDim * 4 + 4) + hd.pm.size() * (kDim * 2 + 4);
  state.counters["bytes"] = double(bytes);
}

// --- SpeCache ----------------------------------------------------------------------------------

struct SpeLayer {
  std::vector<KiviHeadStore> lowbit;
  std::vector<SpeCacheBackingStore> backing;
  std::vector<SpeCacheFetched> fetched;
};

// 2-bit low-bit copy; the speculative query fetches the top 1% of tokens per KV head.
// range(2) = 0: attention with substitution; 1: the selection pass for the next step.
void BM_SpeCache(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  const uint32_t bits = uint32_t(state.range(1));
  const bool select = state.range(2) != 0;
  const size_t topk = n / 100;
  Query q;
  auto& f = fixture<SpeLayer>("spe" + std::to_string(bits) + "_" + std::to_string(n), [&] {
    auto d = std::make_unique<SpeLayer>();
    const std::vector<int32_t> pos = positions(n);
    for (size_t h = 0; h < kKvHeads; ++h) {
      const HeadData x = make_head(n, uint32_t(h));
      d->lowbit.emplace_back(kDim, KiviConfig{bits, 32, 128});
      d->lowbit.back().append(x.k.data(), x.v.data(), pos.data(), n);
      d->backing.emplace_back(kDim);
      d->backing.back().append(x.k.data(), x.v.data(), n);
      const auto top = specache_select(d->lowbit.back(), q.head(h), kGroup, INT32_MAX, kScale, topk);
      d->fetched.push_back(specache_fetch(d->backing.back(), top));
    }
    return d;
  });
  std::vector<float> out(kQHeads * kDim);
  for (auto _ : state) {
    if (select) {
      for (size_t h = 0; h < kKvHeads; ++h) {
        auto top = specache_select(f.lowbit[h], q.head(h), kGroup, INT32_MAX, kScale, topk);
        benchmark::DoNotOptimize(top.data());
      }
    } else {
      attend_layer(q, out, [&](size_t h, OnlineAttention& a) {
        specache_attend(f.lowbit[h], f.fetched[h], a);
      });
      benchmark::DoNotOptimize(out.data());
    }
  }
  uint64_t budgeted = 0, backing = 0;
  for (size_t h = 0; h < kKvHeads; ++h) {
    budgeted += f.lowbit[h].bytes().total() + f.fetched[h].bytes();
    backing += f.backing[h].bytes();
  }
  state.counters["bytes"] = double(budgeted);
  state.counters["backing_bytes"] = double(backing);
}

void Lengths(benchmark::internal::Benchmark* b) { b->Arg(4096)->Arg(32768); }

}  // namespace

BENCHMARK(BM_DenseF32)->Apply(Lengths)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExactF16)->Apply(Lengths)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Kivi)
    ->ArgsProduct({{4096, 32768}, {8, 4, 2, 1}})
    ->ArgNames({"tokens", "bits"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SpindleKV)->Apply(Lengths)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MiniCache)->Apply(Lengths)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MiniCacheKivi4)->Apply(Lengths)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SmallKV)->Apply(Lengths)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SpeCache)
    ->ArgsProduct({{4096, 32768}, {2, 1}, {0, 1}})
    ->ArgNames({"tokens", "bits", "select"})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
