import CKVSDK

/// SpeCache on a cache: speculative prefetch, the fetch hit rate and a file-backed backing store
/// (header section "SpeCache: speculative prefetch and the off-budget backing store"). Every
/// call throws `.unsupported` for policies other than 'specache'.
extension Cache {
    /// Keeps the full-precision backing store in the file `path` (created or truncated,
    /// mmap'ed; POSIX only). Only before the first append.
    public func setBackingFile(_ path: String) throws {
        try check(kvsdk_cache_set_backing_file(handle, path))
    }

    /// Fetches, per KV head of `layer`, the fetchTokens rows that the speculative token's
    /// `query` (one query: nQHeads x headDim) attends most, for the next attend.
    /// queryPosition: nil (sees every token) or the speculative token's position. `query` is
    /// of the cache's element type.
    public func prefetch<T: TensorElement>(layer: UInt32, query: [T],
                                           queryPosition: Int32? = nil) throws {
        try requireElement(T.self, "queries")
        let perQuery = geometry.qElementsPerQuery
        guard query.count == perQuery else {
            throw invalidArgument("queries: \(query.count) elements, expected one query of "
                                  + "\(perQuery) (nQHeads x headDim)")
        }
        let status = query.withUnsafeBytes { q in
            withOptionalBuffer(queryPosition.map { [$0] }) { p in
                kvsdk_cache_prefetch(handle, layer, 1, q.baseAddress, p, q.count)
            }
        }
        try check(status)
    }

    /// The fetch hit rate (nil before the first measurement) and the number of measurements.
    public func fetchStats() throws -> (hitRate: Double?, samples: UInt64) {
        var hit: Double = 0
        var samples: UInt64 = 0
        try check(kvsdk_cache_fetch_stats(handle, &hit, &samples))
        return (hit < 0 ? nil : hit, samples)
    }
}
