// What each method does, in one table (src/repr/method_table.cpp): the only place that lists
// methods. The cache, the policy validation, the snapshot code and the C API read these traits and
// never test for a method themselves, so adding a method means one store file and one row there.
#pragma once

#include <cstdint>
#include <memory>

#include "kvsdk.h"

namespace kvsdk {

struct Geometry;
class Context;
class Representation;

// How the selection stage picks the rows an evicting layer keeps (src/policy/selection.h).
enum class Selection : uint8_t {
  kNone,               // never evicts rows (full, and the paper stores that do not select rows)
  kSinksAndRecent,     // StreamingLLM: attention sinks + the most recent rows
  kHeavyHitters,       // H2O: accumulated attention (scores kept per row) + recent rows
  kObservationWindow,  // SnapKV and its family: pooled attention of an observed query window
};

// How the allocation stage splits the budget's rows across layers (src/policy/allocation.h).
enum class Allocation : uint8_t {
  kUniform,            // the same cap for every layer
  kPyramid,            // PyramidKV's arithmetic schedule
  kPyramidUncovered,   // SpindleKV: the pyramid over the layers its codebooks do not cover
  kXkv,                // XKV: importance vectors solved for the whole cache
};

// What quant_bits means for the method, and which values it takes.
enum class QuantUse : uint8_t {
  kNone,      // must be 0
  kOverlay,   // 0, or a KIVI overlay on every kept row (e.g. "xkv+kivi2")
  kRequired,  // the method is quantization: 1, 2, 4 or 8
  kShadow,    // SpeCache's low-bit shadow: 1 or 2
  kOptional,  // MiniCache: 0, or its merged directions in KIVI ("minicache+kivi4")
};

struct MethodTraits {
  int32_t method;          // the kvsdk_method this row describes
  const char* name;        // as kvsdk_method_name and policy specs spell it
  Selection selection;     // kNone: the exact tier never evicts
  Allocation allocation;
  QuantUse quant;
  int32_t default_quant_bits;
  bool needs_proxy;        // SmallKV: a proxy cache must be attached before compression
  bool prefetches;         // SpeCache: kvsdk_cache_prefetch applies
  // The store of the layers the method compresses (null: every layer keeps its rows in the row
  // store of the exact tier). Throws kvsdk::Error for invalid parameters.
  std::unique_ptr<Representation> (*make_store)(const Geometry&, const kvsdk_policy&);
  // Whether its caches run on device backends (CUDA; src/repr/device_rows.h) in this version.
  bool on_device = false;
  // The device store of the layers it compresses (src/repr/device_kivi.h; null: the device's
  // row store holds every layer, as make_store null does on the host).
  std::unique_ptr<Representation> (*make_device_store)(const Geometry&, const kvsdk_policy&,
                                                       Context&) = nullptr;

  bool evicts() const { return selection != Selection::kNone; }
  bool uses_window() const { return selection == Selection::kObservationWindow; }
  bool scores_rows() const { return selection == Selection::kHeavyHitters; }
};

bool method_valid(int32_t method);
// The row of a valid method (callers check method_valid first; an invalid one is a bug and
// throws KVSDK_E_INTERNAL).
const MethodTraits& method_traits(int32_t method);
const MethodTraits& method_traits(const kvsdk_policy& policy);
// Whether the rows an evicting policy keeps are KIVI-quantized (an eviction preset with
// quant_bits != 0, e.g. "xkv+kivi2").
bool kivi_overlay(const kvsdk_policy& policy);

}  // namespace kvsdk
