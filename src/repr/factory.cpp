// Which representation each policy uses. Methods without one keep every layer exact (full and the
// eviction presets, whose selection lives in src/policy).
#include "core/representation.h"
#include "repr/kivi_repr.h"
#include "repr/minicache_repr.h"
#include "repr/spindlekv_repr.h"
#include "repr/smallkv_repr.h"
#include "repr/specache_repr.h"

namespace kvsdk {

std::unique_ptr<Representation> make_representation(const Geometry& geometry,
                                                    const kvsdk_policy& policy) {
  switch (policy.method) {
    case KVSDK_METHOD_KIVI:
      return std::make_unique<KiviRepresentation>(geometry, policy);
    case KVSDK_METHOD_MINICACHE:  // also 'minicache+kivi4' (quant_bits != 0)
      return std::make_unique<MiniCacheRepresentation>(geometry, policy);
    case KVSDK_METHOD_SPINDLEKV:  // codebook layers; deep layers evict in the exact tier
      return std::make_unique<SpindleKvRepresentation>(geometry, policy);
    case KVSDK_METHOD_SMALLKV:
      return std::make_unique<SmallKvRepresentation>(geometry, policy);
    case KVSDK_METHOD_SPECACHE:
      return std::make_unique<SpeCacheRepresentation>(geometry, policy);
    default:
      return nullptr;
  }
}

}  // namespace kvsdk
