import CKVSDK

/// What an allocation targets (kvsdk_alloc_mode and its value).
public enum AllocTarget {
    /// Place exactly min(N, sum of lengths) tokens.
    case totalTokens(UInt64)
    /// The smallest total whose average importance retention reaches R_avg in (0, 1].
    case targetRetention(Double)

    var raw: (mode: Int32, value: Double) {
        switch self {
        case .totalTokens(let n): return (0, Double(n))
        case .targetRetention(let r): return (1, r)
        }
    }
}

/// XKV greedy allocation: tokens each layer keeps, given one importance vector per layer.
public func planAllocation(importance: [[Float]], target: AllocTarget) throws -> [UInt64] {
    var out = [UInt64](repeating: 0, count: importance.count)
    let lengths = importance.map { $0.count }
    // Keep every vector's storage pinned while the library reads it.
    let copies = importance.map { vector -> UnsafeMutableBufferPointer<Float> in
        let copy = UnsafeMutableBufferPointer<Float>.allocate(capacity: max(vector.count, 1))
        _ = copy.initialize(from: vector)
        return copy
    }
    defer { copies.forEach { $0.deallocate() } }
    let pointers: [UnsafePointer<Float>?] = copies.map { UnsafePointer($0.baseAddress) }
    let (mode, value) = target.raw
    try check(kvsdk_plan_allocation(UInt32(importance.count), pointers, lengths, mode, value,
                                    &out))
    return out
}

/// An allocation profile: averaged per-layer shares of sample requests of one task type.
/// Use from one thread at a time.
public final class Profile {
    let handle: OpaquePointer
    public let nLayers: UInt32

    public init(nLayers: UInt32) throws {
        var out: OpaquePointer?
        try check(kvsdk_profile_create(&out, nLayers))
        handle = out!
        self.nLayers = nLayers
    }

    /// Loads a saved profile for a model of `nLayers` layers (a mismatch throws .invalidArg).
    public init(loading path: String, nLayers: UInt32) throws {
        var out: OpaquePointer?
        try check(kvsdk_profile_load(&out, path))
        handle = out!
        self.nLayers = nLayers
        _ = try shares()
    }

    deinit { kvsdk_profile_destroy(handle) }

    /// Records the allocation list (tokens per layer) of one sample request.
    public func record(_ tokens: [UInt64]) throws {
        try check(kvsdk_profile_record(handle, tokens, UInt32(tokens.count)))
    }

    /// Averaged shares per layer (summing to 1) and the number of recorded samples.
    public func shares() throws -> (shares: [Double], samples: UInt32) {
        var shares = [Double](repeating: 0, count: Int(nLayers))
        var samples: UInt32 = 0
        try check(kvsdk_profile_shares(handle, &shares, nLayers, &samples))
        return (shares, samples)
    }

    public func save(to path: String) throws {
        try check(kvsdk_profile_save(handle, path))
    }
}

/// The mini-prefill planner: scores each layer's keys and window queries in a cache-free pass
/// and returns the allocation for the real prefill. Use from one thread at a time.
public final class Planner {
    let handle: OpaquePointer
    public let geometry: Geometry

    public init(geometry: Geometry, policy: Policy) throws {
        var g = geometry.raw
        var p = policy
        var out: OpaquePointer?
        try check(kvsdk_planner_create(&out, &g, &p.raw))
        handle = out!
        self.geometry = geometry
    }

    deinit { kvsdk_planner_destroy(handle) }

    /// Scores one layer: keys at `positions`, window queries at `queryPositions` (nil: all).
    /// Keys and queries are of the geometry's element type (see TensorElement).
    public func feedLayer<T: TensorElement>(layer: UInt32, keys: [T], positions: [Int32],
                                            queries: [T], queryPositions: [Int32]? = nil) throws {
        try requireElementType(T.self, of: geometry.dtype, "keys")
        try checkKVCount(geometry, "keys", keys.count, tokens: positions.count)
        let nQueries = try queryCount(geometry, queries.count, positions: queryPositions?.count)
        let status = keys.withUnsafeBytes { k in
            queries.withUnsafeBytes { q in
                withOptionalBuffer(queryPositions) { qp in
                    kvsdk_planner_feed_layer(handle, layer, positions.count, k.baseAddress,
                                             positions, k.count, nQueries, q.baseAddress, qp,
                                             q.count)
                }
            }
        }
        try check(status)
    }

    /// Rows per KV head for every layer, for Cache.setAllocation.
    public func finish(_ target: AllocTarget) throws -> [UInt64] {
        var out = [UInt64](repeating: 0, count: Int(geometry.nLayers))
        let (mode, value) = target.raw
        try check(kvsdk_planner_finish(handle, mode, value, &out, geometry.nLayers))
        return out
    }
}
