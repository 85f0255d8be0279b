import CKVSDK

/// Compression on a cache (header section "Compression: observe, compress, plan").
extension Cache {
    /// Feeds `queries` (queries x nQHeads x headDim) of `layer` to the policy's importance
    /// signal. queryPositions: nil (queries see every key) or one per query (causal). `queries`
    /// are of the cache's element type.
    public func observe<T: TensorElement>(layer: UInt32, queries: [T],
                                          queryPositions: [Int32]? = nil) throws {
        try requireElement(T.self, "queries")
        let nQueries = try queryCount(geometry, queries.count, positions: queryPositions?.count)
        let status = queries.withUnsafeBytes { q in
            withOptionalBuffer(queryPositions) { p in
                kvsdk_cache_observe(handle, layer, nQueries, q.baseAddress, p, q.count)
            }
        }
        try check(status)
    }

    /// Enforces the budget (and an applied allocation or profile) now.
    public func compress() throws {
        try check(kvsdk_cache_compress(handle))
    }

    /// A byte budget for this cache alone (0 removes it); compresses now if needed.
    public func setBudget(_ budgetBytes: UInt64) throws {
        try check(kvsdk_cache_set_budget(handle, budgetBytes))
    }

    /// Layer-tokens the budget holds besides fixed metadata (nil: no budget applies) and the
    /// bytes of one layer-token.
    public func tokenCapacity() throws -> (tokens: UInt64?, tokenBytes: UInt64) {
        var tokens: UInt64 = 0
        var tokenBytes: UInt64 = 0
        try check(kvsdk_cache_token_capacity(handle, &tokens, &tokenBytes))
        return (tokens == UInt64.max ? nil : tokens, tokenBytes)
    }

    /// Rows per KV head that each layer holds now.
    public func allocation() throws -> [UInt64] {
        var tokens = [UInt64](repeating: 0, count: Int(geometry.nLayers))
        try check(kvsdk_cache_allocation(handle, &tokens, geometry.nLayers))
        return tokens
    }

    /// Fixes the rows per KV head of every layer, or returns to the policy's own allocation
    /// (nil); compresses now.
    public func setAllocation(_ tokens: [UInt64]?) throws {
        if let tokens = tokens {
            try check(kvsdk_cache_set_allocation(handle, tokens, UInt32(tokens.count)))
        } else {
            try check(kvsdk_cache_set_allocation(handle, nil, 0))
        }
    }

    /// Applies an allocation profile (nil: back to the policy's own allocation). The cache
    /// copies the shares.
    public func applyProfile(_ profile: Profile?) throws {
        try check(kvsdk_cache_apply_profile(handle, profile?.handle))
    }
}

/// Calls `body` with the base address of `values`, or with nil when `values` is nil.
func withOptionalBuffer<R>(_ values: [Int32]?, _ body: (UnsafePointer<Int32>?) -> R) -> R {
    guard let values = values else { return body(nil) }
    return values.withUnsafeBufferPointer { body($0.baseAddress) }
}
