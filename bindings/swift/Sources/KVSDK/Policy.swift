import CKVSDK

/// Compression methods (numbers match the header).
public enum Method: Int32, CaseIterable {
    case full = 0, streamingLLM, h2o, snapKV, pyramidKV, xkv, kivi, spindleKV, miniCache,
         smallKV, speCache

    /// Canonical lower-case name ("full", "streaming_llm", ...).
    public var name: String { Method.name(rawValue: rawValue)! }

    /// The name of any raw method value, nil when it is not a method.
    public static func name(rawValue: Int32) -> String? {
        guard let p = kvsdk_method_name(rawValue) else { return nil }
        return String(cString: p)
    }
}

public enum PoolKind: Int32 { case max = 0, avg = 1 }

/// Policy parameters (see the header for each field). Build with `Policy(method:)` or
/// `Policy(parsing: "xkv+kivi2")`.
public struct Policy {
    var raw: kvsdk_policy

    /// The defaults of `method` (kvsdk_policy_init).
    public init(method: Method) throws {
        raw = kvsdk_policy()
        try check(kvsdk_policy_init_sized(&raw, MemoryLayout<kvsdk_policy>.size,
                                          method.rawValue))
    }

    /// Parses a preset name such as "full", "snapkv" or "xkv+kivi2" (kvsdk_policy_parse_sized;
    /// Swift does not see the kvsdk_policy_parse macro, and the symbol of that name is the
    /// legacy one, frozen at the first struct version, so the size is passed here).
    public init(parsing spec: String) throws {
        raw = kvsdk_policy()
        try check(kvsdk_policy_parse_sized(&raw, MemoryLayout<kvsdk_policy>.size, spec))
    }

    public var method: Method? { Method(rawValue: raw.method) }
    public var quantBits: Int32 { get { raw.quant_bits } set { raw.quant_bits = newValue } }
    public var quantGroup: Int32 { get { raw.quant_group } set { raw.quant_group = newValue } }
    public var quantResidual: Int32 {
        get { raw.quant_residual } set { raw.quant_residual = newValue }
    }
    /// `quantResidual = Policy.residualAuto`: the KIVI exact window chosen by the length the
    /// cache holds (KVSDK_QUANT_RESIDUAL_AUTO; resolved when a cache is created or converted).
    public static let residualAuto: Int32 = -1
    public var sinkTokens: Int32 { get { raw.sink_tokens } set { raw.sink_tokens = newValue } }
    public var recentTokens: Int32 {
        get { raw.recent_tokens } set { raw.recent_tokens = newValue }
    }
    public var obsWindow: Int32 { get { raw.obs_window } set { raw.obs_window = newValue } }
    public var poolKernel: Int32 { get { raw.pool_kernel } set { raw.pool_kernel = newValue } }
    public var poolKind: PoolKind {
        get { PoolKind(rawValue: raw.pool_kind) ?? .max }
        set { raw.pool_kind = newValue.rawValue }
    }
    public var heavyRatio: Float { get { raw.heavy_ratio } set { raw.heavy_ratio = newValue } }
    public var scheduleAlpha: Float {
        get { raw.schedule_alpha } set { raw.schedule_alpha = newValue }
    }
    public var scheduleBeta: Float {
        get { raw.schedule_beta } set { raw.schedule_beta = newValue }
    }
    public var boundaryLayer: Int32 {
        get { raw.boundary_layer } set { raw.boundary_layer = newValue }
    }
    public var mergeT: Float { get { raw.merge_t } set { raw.merge_t = newValue } }
    public var retainRatio: Float {
        get { raw.retain_ratio } set { raw.retain_ratio = newValue }
    }
    public var fetchTokens: Int32 { get { raw.fetch_tokens } set { raw.fetch_tokens = newValue } }
    public var matchTokens: Int32 { get { raw.match_tokens } set { raw.match_tokens = newValue } }
    /// Amortized eviction: a layer that must evict goes down to its cap minus this share of it
    /// (0...0.5; 0 = exact eviction on every token). Default 0.0625.
    public var evictSlack: Float { get { raw.evict_slack } set { raw.evict_slack = newValue } }
    /// KIVI attention's integer value weights: 7 or 14 bits; 0 = by quantBits (7 when <= 2,
    /// resolved when a cache is created).
    public var kiviWeightBits: Int32 {
        get { raw.kivi_weight_bits } set { raw.kivi_weight_bits = newValue }
    }
}
