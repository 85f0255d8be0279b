import CKVSDK

// Tensors (keys, values, queries, outputs) are of the cache's element type (Elements.swift):
// Float for .f32, Float16 or Float16Bits for .f16, BFloat16 for .bf16, passed bit-exactly and
// returned in the same type. Another element type, or a buffer of the wrong length, throws
// KVSDKError(.invalidArg) naming what was expected, and the cache is unchanged.

/// Dense keys and values (tokens x headDim each) and positions of one KV head.
public struct HeadData<T: TensorElement> {
    public var keys: [T]
    public var values: [T]
    public var positions: [Int32]
}

/// An owned cache, released on deinit. Use it from one thread at a time (the header's
/// contract); it keeps the library-side context alive.
public final class Cache {
    let handle: OpaquePointer
    /// The geometry as the library reports it (attnScale resolved).
    public let geometry: Geometry
    /// SmallKV's proxy while linked (setProxy), kept alive by this reference.
    private var proxy: Cache?
    /// The frozen prefix this conversation continues (init(prefix:policy:)), if any. The library
    /// keeps the prefix alive itself; this reference keeps the Swift object alive too.
    private var sharedPrefix: Cache?

    public convenience init(context: Context, geometry: Geometry, policy: Policy? = nil) throws {
        var g = geometry.raw
        var p = try policy ?? Policy(method: .full)
        var out: OpaquePointer?
        try check(kvsdk_cache_create(&out, context.handle, &g, &p.raw))
        try self.init(adopting: out!)
    }

    /// A new, empty conversation continuing the frozen cache `prefix`
    /// (kvsdk_cache_create_on_prefix): it attends over the prefix's rows and then its own,
    /// without copying the prefix, in the prefix's context and geometry. `policy` (nil: full)
    /// applies to its own rows only. The prefix's bytes are charged once, to the prefix; this
    /// cache's stats count only its own rows. Append its tokens at positions after the prefix's.
    /// Throws KVSDKError(.state) when `prefix` is not frozen (freeze()).
    public convenience init(prefix: Cache, policy: Policy? = nil) throws {
        var p = try policy ?? Policy(method: .full)
        var out: OpaquePointer?
        try check(kvsdk_cache_create_on_prefix(&out, prefix.handle, &p.raw))
        try self.init(adopting: out!)
        sharedPrefix = prefix
    }

    /// Takes ownership of a raw handle the library returned (e.g. a loader).
    init(adopting handle: OpaquePointer) throws {
        self.handle = handle
        do {
            geometry = try Cache.geometry(of: handle)
        } catch {
            kvsdk_cache_destroy(handle)
            throw error
        }
    }

    deinit { kvsdk_cache_destroy(handle) }

    /// An independent copy in the same context (kvsdk_cache_fork): it continues exactly as this
    /// cache would, and is charged to the context's budget. A SmallKV cache's copy needs its own
    /// proxy (setProxy, e.g. with a fork of the original's proxy).
    public func fork() throws -> Cache {
        var out: OpaquePointer?
        try check(kvsdk_cache_fork(&out, handle))
        let copy = try Cache(adopting: out!)
        copy.sharedPrefix = sharedPrefix  // a fork shares the prefix
        return copy
    }

    /// Freezes this cache (kvsdk_cache_freeze), e.g. a system prompt's, so that it can be the
    /// shared prefix of many conversations (init(prefix:policy:)). Final and idempotent:
    /// afterwards attend, read, stats, save and fork work, and append, truncate, observe,
    /// compress and the other calls that change it throw KVSDKError(.state). Throws
    /// .unsupported for policies that cannot be shared (smallkv, specache).
    public func freeze() throws {
        try check(kvsdk_cache_freeze(handle))
    }

    /// Removes every token at `position` or later (kvsdk_cache_truncate), exactly or not at all:
    /// afterwards the cache holds what one that never received them would. Throws
    /// KVSDKError with status .state (the cache unchanged) where the policy cannot be exact that
    /// far back; kvsdk.h lists each policy's reach.
    public func truncate(from position: Int32) throws {
        try check(kvsdk_cache_truncate(handle, position))
    }

    static func geometry(of handle: OpaquePointer) throws -> Geometry {
        var raw = kvsdk_geometry()
        _ = kvsdk_geometry_init_sized(&raw, MemoryLayout<kvsdk_geometry>.size)
        try check(kvsdk_cache_geometry(handle, &raw))
        return Geometry(raw)
    }

    /// Throws `.invalidArg` unless `T` is this cache's element type.
    func requireElement<T: TensorElement>(_ type: T.Type, _ what: String) throws {
        try requireElementType(type, of: geometry.dtype, what)
    }

    /// Appends positions.count tokens to `layer`; keys and values hold
    /// tokens x nKVHeads x headDim elements (token-major, keys already rotated) of the cache's
    /// element type, stored bit-exactly.
    public func append<T: TensorElement>(layer: UInt32, keys: UnsafeBufferPointer<T>,
                                   values: UnsafeBufferPointer<T>,
                                   positions: UnsafeBufferPointer<Int32>) throws {
        try requireElement(T.self, "keys")
        try checkKVCount(geometry, "keys", keys.count, tokens: positions.count)
        try checkKVCount(geometry, "values", values.count, tokens: positions.count)
        try check(kvsdk_cache_append(handle, layer, positions.count,
                                     UnsafeRawPointer(keys.baseAddress),
                                     UnsafeRawPointer(values.baseAddress), positions.baseAddress,
                                     keys.count * MemoryLayout<T>.stride))
    }

    public func append<T: TensorElement>(layer: UInt32, keys: [T], values: [T],
                                   positions: [Int32]) throws {
        try keys.withUnsafeBufferPointer { k in
            try values.withUnsafeBufferPointer { v in
                try positions.withUnsafeBufferPointer { p in
                    try append(layer: layer, keys: k, values: v, positions: p)
                }
            }
        }
    }

    /// Attention of `queries` (queries x nQHeads x headDim) over `layer` into `output` (same
    /// shape). queryPositions: nil (every query sees every token) or one per query (causal).
    /// Queries and output are of the cache's element type (the output is the library's
    /// rounding of the f32 result to it). On error `output` is untouched.
    public func attend<T: TensorElement>(layer: UInt32, queries: UnsafeBufferPointer<T>,
                                   queryPositions: UnsafeBufferPointer<Int32>?,
                                   output: UnsafeMutableBufferPointer<T>) throws {
        try requireElement(T.self, "queries")
        let nQueries = try queryCount(geometry, queries.count, positions: queryPositions?.count)
        guard output.count == queries.count else {
            throw invalidArgument("output: \(output.count) elements, expected "
                                  + "\(queries.count) (as many as the queries)")
        }
        try check(kvsdk_cache_attend(handle, layer, nQueries, UnsafeRawPointer(queries.baseAddress),
                                     queryPositions?.baseAddress,
                                     queries.count * MemoryLayout<T>.stride,
                                     UnsafeMutableRawPointer(output.baseAddress),
                                     output.count * MemoryLayout<T>.stride))
    }

    /// Like the buffer version, returning a new array.
    public func attend<T: TensorElement>(layer: UInt32, queries: [T],
                                   queryPositions: [Int32]? = nil) throws -> [T] {
        var output = [T](repeating: T.zeroElement, count: queries.count)
        try queries.withUnsafeBufferPointer { q in
            try output.withUnsafeMutableBufferPointer { o in
                if let positions = queryPositions {
                    try positions.withUnsafeBufferPointer { p in
                        try attend(layer: layer, queries: q, queryPositions: p, output: o)
                    }
                } else {
                    try attend(layer: layer, queries: q, queryPositions: nil, output: o)
                }
            }
        }
        return output
    }

    /// Tokens one KV head of one layer holds.
    public func tokenCount(layer: UInt32, kvHead: UInt32) throws -> Int {
        var n = 0
        try check(kvsdk_cache_read(handle, layer, kvHead, nil, nil, nil, 0, &n))
        return n
    }

    /// Dense keys, values and positions of one KV head, in stored order (append order, which
    /// eviction preserves), as the cache's element type `T`.
    public func read<T: TensorElement>(layer: UInt32, kvHead: UInt32,
                                 as _: T.Type = T.self) throws -> HeadData<T> {
        try requireElement(T.self, "read")
        let capacity = try tokenCount(layer: layer, kvHead: kvHead)
        let d = Int(geometry.headDim)
        var keys = [T](repeating: T.zeroElement, count: capacity * d)
        var values = [T](repeating: T.zeroElement, count: capacity * d)
        var positions = [Int32](repeating: 0, count: capacity)
        if capacity > 0 {
            var n = 0
            let status = keys.withUnsafeMutableBytes { k in
                values.withUnsafeMutableBytes { v in
                    positions.withUnsafeMutableBufferPointer { p in
                        kvsdk_cache_read(handle, layer, kvHead, k.baseAddress, v.baseAddress,
                                         p.baseAddress, capacity, &n)
                    }
                }
            }
            try check(status)
        }
        return HeadData(keys: keys, values: values, positions: positions)
    }

    public func stats() throws -> CacheStats {
        var raw = kvsdk_cache_stats()
        try check(kvsdk_cache_stats_init_sized(&raw, MemoryLayout<kvsdk_cache_stats>.size))
        try check(kvsdk_cache_stats_get(handle, &raw))
        return CacheStats(raw)
    }

    public func layerStats(layer: UInt32) throws -> LayerStats {
        var raw = kvsdk_layer_stats()
        try check(kvsdk_layer_stats_init_sized(&raw, MemoryLayout<kvsdk_layer_stats>.size))
        try check(kvsdk_cache_layer_stats_get(handle, layer, &raw))
        return LayerStats(raw)
    }

    /// SmallKV: links `proxy` (a 'full' cache of a smaller model fed the same tokens, run just
    /// before this one) or detaches it (nil). This cache holds a strong reference to the proxy
    /// while linked, so the proxy outlives its use.
    public func setProxy(_ proxy: Cache?) throws {
        try check(kvsdk_cache_set_proxy(handle, proxy?.handle))
        self.proxy = proxy
    }

    /// SmallKV: lets the proxy run each step on another thread, in parallel with this cache
    /// (kvsdk_cache_set_proxy_wait): this cache's calls wait up to `timeoutMs` milliseconds for
    /// the proxy's attention of the same positions (0: never; the proxy runs first). Outputs are
    /// the same as with the proxy's step first. One step at a time: wait for the proxy's thread
    /// before this cache's next step, and pass positions to both caches.
    public func setProxyWait(timeoutMs: UInt32) throws {
        try check(kvsdk_cache_set_proxy_wait(handle, timeoutMs))
    }
}
