#include "core/policy.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/method_traits.h"
#include "util/error.h"
#include "util/options.h"

namespace kvsdk {

kvsdk_policy policy_defaults(kvsdk_method method) {
  kvsdk_policy p{};
  p.struct_size = sizeof(kvsdk_policy);
  p.method = method;
  p.quant_bits = 0;
  p.quant_group = 32;      // KIVI: G = 32
  p.quant_residual = 128;  // KIVI: R = 128
  p.sink_tokens = 4;       // StreamingLLM: 4 attention sinks
  p.recent_tokens = 32;
  p.obs_window = 32;       // SnapKV: observation window of 32 queries
  p.pool_kernel = 7;       // SnapKV: pooling kernel 7
  p.pool_kind = KVSDK_POOL_MAX;
  p.heavy_ratio = 0.5f;    // H2O: half heavy hitters, half recent
  p.schedule_alpha = 0.525f;  // SpindleKV §3.3
  p.schedule_beta = 0.05f;
  p.boundary_layer = -1;      // SpindleKV / MiniCache: half of the layers
  p.merge_t = 0.6f;           // MiniCache: SLERP t = 0.6
  p.retain_ratio = 0.05f;     // MiniCache: ~5% of tokens per head stay unmerged
  p.fetch_tokens = 64;        // SpeCache: top-k fetched rows per KV head
  p.match_tokens = 128;       // SmallKV: 100-200 prompt tokens for head matching
  p.evict_slack = kDefaultEvictSlack;
  p.kivi_weight_bits = 0;     // by quant_bits (resolve_auto_weight_bits)
  p.quant_bits = method_traits(method).default_quant_bits;
  return p;
}

kvsdk_policy policy_from_c(const kvsdk_policy* caller) {
  KVSDK_REQUIRE(caller != nullptr, "policy is NULL");
  KVSDK_REQUIRE(caller->struct_size >= sizeof(uint32_t) * 2, "policy.struct_size is ",
                caller->struct_size, " (too small; call kvsdk_policy_init first)");
  KVSDK_REQUIRE(method_valid(caller->method), "policy.method is ", caller->method,
                " (not a kvsdk_method)");
  kvsdk_policy defaults = policy_defaults(kvsdk_method(caller->method));
  // A struct from before evict_slack existed keeps evicting as it did then: exactly.
  if (caller->struct_size < kPolicySizeV2) defaults.evict_slack = 0.0f;
  // One from before kivi_weight_bits keeps the first kernels' arithmetic.
  if (caller->struct_size < kPolicySizeV3) defaults.kivi_weight_bits = kLegacyKiviWeightBits;
  const kvsdk_policy p = read_versioned(caller, defaults, kPolicySizeV1, "policy");
  KVSDK_REQUIRE(p.quant_bits == 0 || p.quant_bits == 1 || p.quant_bits == 2 ||
                    p.quant_bits == 4 || p.quant_bits == 8,
                "policy.quant_bits is ", p.quant_bits, " (must be 0, 1, 2, 4 or 8)");
  KVSDK_REQUIRE(p.quant_group >= 1 && p.quant_group <= 4096, "policy.quant_group is ",
                p.quant_group, " (must be 1..4096)");
  KVSDK_REQUIRE(p.quant_residual >= 0 || p.quant_residual == KVSDK_QUANT_RESIDUAL_AUTO,
                "policy.quant_residual is ", p.quant_residual,
                " (must be >= 0, or KVSDK_QUANT_RESIDUAL_AUTO = -1)");
  KVSDK_REQUIRE(p.sink_tokens >= 0, "policy.sink_tokens is negative");
  KVSDK_REQUIRE(p.recent_tokens >= 0, "policy.recent_tokens is negative");
  KVSDK_REQUIRE(p.obs_window >= 1, "policy.obs_window is ", p.obs_window, " (must be >= 1)");
  KVSDK_REQUIRE(p.pool_kernel >= 1 && p.pool_kernel % 2 == 1, "policy.pool_kernel is ",
                p.pool_kernel, " (must be odd and >= 1)");
  KVSDK_REQUIRE(p.pool_kind == KVSDK_POOL_MAX || p.pool_kind == KVSDK_POOL_AVG,
                "policy.pool_kind is ", p.pool_kind, " (not a kvsdk_pool_kind)");
  KVSDK_REQUIRE(std::isfinite(p.heavy_ratio) && p.heavy_ratio >= 0.0f && p.heavy_ratio <= 1.0f,
                "policy.heavy_ratio must be in [0, 1]");
  KVSDK_REQUIRE(std::isfinite(p.schedule_alpha) && std::isfinite(p.schedule_beta),
                "policy schedule parameters must be finite");
  KVSDK_REQUIRE(p.boundary_layer >= -1, "policy.boundary_layer is ", p.boundary_layer,
                " (must be -1 or a layer index)");
  KVSDK_REQUIRE(std::isfinite(p.merge_t) && p.merge_t >= 0.0f && p.merge_t <= 1.0f,
                "policy.merge_t must be in [0, 1]");
  KVSDK_REQUIRE(std::isfinite(p.retain_ratio) && p.retain_ratio >= 0.0f && p.retain_ratio <= 1.0f,
                "policy.retain_ratio must be in [0, 1]");
  KVSDK_REQUIRE(p.fetch_tokens >= 0, "policy.fetch_tokens is negative");
  KVSDK_REQUIRE(p.match_tokens >= 1, "policy.match_tokens is ", p.match_tokens,
                " (must be >= 1)");
  KVSDK_REQUIRE(std::isfinite(p.evict_slack) && p.evict_slack >= 0.0f &&
                    p.evict_slack <= kMaxEvictSlack,
                "policy.evict_slack is ", p.evict_slack, " (must be in [0, ", kMaxEvictSlack,
                "]: a share of a layer's cap)");
  KVSDK_REQUIRE(p.kivi_weight_bits == 0 || p.kivi_weight_bits == 7 || p.kivi_weight_bits == 14,
                "policy.kivi_weight_bits is ", p.kivi_weight_bits, " (must be 0, 7 or 14)");
  return p;
}

kvsdk_policy resolve_auto_weight_bits(const kvsdk_policy& policy) {
  // A policy without KIVI codes keeps 0 (nothing reads it).
  if (policy.kivi_weight_bits != 0 || policy.quant_bits == 0) return policy;
  // One byte per weight where KIVI's own error dwarfs the rounding (include/kvsdk.h).
  kvsdk_policy p = policy;
  p.kivi_weight_bits = policy.quant_bits <= 2 ? 7 : 14;
  return p;
}

kvsdk_policy resolve_auto_residual(const kvsdk_policy& policy, uint32_t head_dim) {
  if (policy.quant_residual != KVSDK_QUANT_RESIDUAL_AUTO) return policy;
  // kvsdk.h gives the rule and the measurements behind it: 768 / head_dim x 4^(2 - bits) rows,
  // at least 16 (no window at all cost fidelity at every width), at most KIVI's own 128. As a
  // fraction num / den in integers: 4^(2 - bits) is 4 (1 bit), 1 (2 bits), 1/16 (4 bits) or
  // 1/4096 (8 bits); a method without KIVI codes (bits 0) counts as 8 bits.
  constexpr uint64_t kMin = 16, kMax = 128, kRows = 768;
  const uint32_t bits = policy.quant_bits == 0 ? 8u : uint32_t(policy.quant_bits);
  const uint64_t num = kRows * (bits == 1 ? 4u : 1u);
  const uint64_t den = uint64_t(std::max<uint32_t>(head_dim, 1)) *
                       (bits <= 2 ? 1u : uint64_t(1) << (2 * (bits - 2)));
  kvsdk_policy p = policy;
  p.quant_residual = int32_t(std::min(kMax, std::max(kMin, (num + den / 2) / den)));
  return p;
}

void require_policy_implemented(const kvsdk_policy& p) {
  // Every method of the table is implemented; what remains is whether it takes quant_bits.
  const MethodTraits& t = method_traits(p);
  const int32_t b = p.quant_bits;
  switch (t.quant) {
    case QuantUse::kNone:
      if (b != 0) {
        fail(KVSDK_E_UNSUPPORTED, "KIVI quantization (quant_bits = ", b, ") on policy '", t.name,
             "' is not implemented (full: use method 'kivi')");
      }
      return;
    case QuantUse::kRequired:
      KVSDK_REQUIRE(b != 0, "method '", t.name, "' needs quant_bits 1, 2, 4 or 8 (got 0)");
      return;
    case QuantUse::kShadow:
      KVSDK_REQUIRE(b == 1 || b == 2, "method '", t.name, "' keeps a 1- or 2-bit copy (got "
                    "quant_bits ", b, ")");
      return;
    case QuantUse::kOverlay:   // 0, or a KIVI overlay (core/method_traits.h)
    case QuantUse::kOptional:  // 0, or directions in KIVI
      return;
  }
}

kvsdk_policy parse_policy_spec(const std::string& s) {
  const size_t plus = s.find('+');
  const std::string head = s.substr(0, plus);
  int method = -1;
  for (int m = 0; m < KVSDK_METHOD_COUNT; ++m) {
    if (head == method_traits(m).name) method = m;
  }
  KVSDK_REQUIRE(method >= 0, "unknown method '", head, "' in policy '", s, "'");
  kvsdk_policy p = policy_defaults(kvsdk_method(method));
  if (plus != std::string::npos) {
    const std::string overlay = s.substr(plus + 1);
    const std::string prefix = "kivi";
    KVSDK_REQUIRE(overlay.size() > prefix.size() && overlay.compare(0, 4, prefix) == 0,
                  "unknown overlay '", overlay, "' in policy '", s, "' (expected kiviN)");
    const std::string bits = overlay.substr(prefix.size());
    KVSDK_REQUIRE(bits == "1" || bits == "2" || bits == "4" || bits == "8", "overlay '", overlay,
                  "' in policy '", s, "': bits must be 1, 2, 4 or 8");
    p.quant_bits = std::stoi(bits);
  }
  return p;
}

std::string policy_spec(const kvsdk_policy& p) {
  std::string s = method_traits(p).name;
  const bool quant_is_default = policy_defaults(kvsdk_method(p.method)).quant_bits == p.quant_bits;
  if (!quant_is_default && p.quant_bits != 0) s += "+kivi" + std::to_string(p.quant_bits);
  return s;
}

}  // namespace kvsdk

using namespace kvsdk;

extern "C" {

KVSDK_API const char* kvsdk_method_name(int32_t method) {
  return method_valid(method) ? method_traits(method).name : nullptr;
}

}  // extern "C"
