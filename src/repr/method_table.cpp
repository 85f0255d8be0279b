// The method-traits table (core/method_traits.h): the one place that says what each method does
// and which store holds the layers it compresses. Rows follow kvsdk_method's order.
#include <iterator>
#include <memory>

#include "core/method_traits.h"
#include "repr/device_kivi.h"
#include "repr/device_minicache.h"
#include "repr/device_rows.h"
#include "repr/device_smallkv.h"
#include "repr/device_specache.h"
#include "repr/exact_rows.h"
#include "repr/kivi_repr.h"
#include "repr/minicache_repr.h"
#include "repr/smallkv_repr.h"
#include "repr/specache_repr.h"
#include "repr/spindlekv_repr.h"
#include "util/error.h"

namespace kvsdk {

namespace {

template <class Store>
std::unique_ptr<Representation> make(const Geometry& g, const kvsdk_policy& p) {
  return std::make_unique<Store>(g, p);
}
template <class Store>
std::unique_ptr<Representation> make_device(const Geometry& g, const kvsdk_policy& p,
                                            Context& ctx) {
  return std::make_unique<Store>(g, p, ctx);
}

using S = Selection;
using A = Allocation;
using Q = QuantUse;

// method, name, selection, allocation, quant_bits, default bits, proxy, prefetch, store of the
// compressed layers, runs on device backends (CUDA), store of the compressed layers there
constexpr MethodTraits kTable[] = {
    {KVSDK_METHOD_FULL, "full",
     S::kNone, A::kUniform, Q::kNone, 0, false, false, nullptr, true},
    {KVSDK_METHOD_STREAMING_LLM, "streaming_llm",
     S::kSinksAndRecent, A::kUniform, Q::kOverlay, 0, false, false, nullptr, true},
    {KVSDK_METHOD_H2O, "h2o",
     S::kHeavyHitters, A::kUniform, Q::kOverlay, 0, false, false, nullptr, true},
    {KVSDK_METHOD_SNAPKV, "snapkv",
     S::kObservationWindow, A::kUniform, Q::kOverlay, 0, false, false, nullptr, true},
    {KVSDK_METHOD_PYRAMIDKV, "pyramidkv",
     S::kObservationWindow, A::kPyramid, Q::kOverlay, 0, false, false, nullptr, true},
    {KVSDK_METHOD_XKV, "xkv",
     S::kObservationWindow, A::kXkv, Q::kOverlay, 0, false, false, nullptr, true},
    {KVSDK_METHOD_KIVI, "kivi",
     S::kNone, A::kUniform, Q::kRequired, 2, false, false, make<KiviRepresentation>, true,
     make_device<DeviceKivi>},
    // SpindleKV: codebooks in the shallow layers, observation-window eviction in the deep ones.
    {KVSDK_METHOD_SPINDLEKV, "spindlekv",
     S::kObservationWindow, A::kPyramidUncovered, Q::kNone, 0, false, false, make<SpindleKvRepresentation>},
    {KVSDK_METHOD_MINICACHE, "minicache",
     S::kNone, A::kUniform, Q::kOptional, 0, false, false, make<MiniCacheRepresentation>, true,
     make_device<DeviceMiniCache>},  // (its device store refuses '+kivi4')
    {KVSDK_METHOD_SMALLKV, "smallkv",
     S::kNone, A::kUniform, Q::kNone, 0, true, false, make<SmallKvRepresentation>, true,
     make_device<DeviceSmallKv>},
    {KVSDK_METHOD_SPECACHE, "specache",
     S::kNone, A::kUniform, Q::kShadow, 2, false, true, make<SpeCacheRepresentation>, true,
     make_device<DeviceSpeCache>},
};
static_assert(std::size(kTable) == KVSDK_METHOD_COUNT, "one row per kvsdk_method");
constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kTable); ++i) {
    if (kTable[i].method != int32_t(i)) return false;
  }
  return true;
}
static_assert(rows_in_enum_order(), "row i describes kvsdk_method i");

}  // namespace

bool method_valid(int32_t method) { return method >= 0 && method < KVSDK_METHOD_COUNT; }

const MethodTraits& method_traits(int32_t method) {
  if (!method_valid(method)) fail(KVSDK_E_INTERNAL, "method ", method, " is not a kvsdk_method");
  return kTable[method];
}

const MethodTraits& method_traits(const kvsdk_policy& policy) {
  return method_traits(policy.method);
}

bool kivi_overlay(const kvsdk_policy& policy) {
  return method_traits(policy).quant == QuantUse::kOverlay && policy.quant_bits != 0;
}

std::unique_ptr<Representation> make_row_store(const Geometry& geometry,
                                               const kvsdk_policy& policy) {
  if (kivi_overlay(policy)) return std::make_unique<KiviRepresentation>(geometry, policy);
  return std::make_unique<ExactRows>(geometry, policy);
}

std::unique_ptr<Representation> make_device_row_store(const Geometry& geometry,
                                                      const kvsdk_policy& policy, Context& ctx) {
  if (kivi_overlay(policy) && method_traits(policy).on_device) {
    return std::make_unique<DeviceKivi>(geometry, policy, ctx);
  }
  return std::make_unique<DeviceRows>(geometry, policy, ctx);  // (it refuses what has no path)
}

}  // namespace kvsdk
