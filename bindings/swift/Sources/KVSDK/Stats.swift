import CKVSDK

public enum Tier: Int { case exact = 0, quantized, codebook, merged, valueOnly, metadata }

/// Copies a C fixed-size uint64 array (imported as a tuple) into an Array.
func uint64Array<T>(_ tuple: T) -> [UInt64] {
    withUnsafeBytes(of: tuple) { Array($0.bindMemory(to: UInt64.self)) }
}

/// Whole-cache stats (kvsdk_cache_stats); bytesByTier is indexed by Tier.rawValue.
public struct CacheStats: Equatable {
    public let nLayers: UInt32
    public let tokens, appendedTokens, bytes: UInt64
    public let bytesByTier: [UInt64]
    public let fullBytes, backingBytes, budgetBytes, contextUsedBytes: UInt64
    public let deviceArenaBytes, deviceReservedBytes: UInt64

    init(_ r: kvsdk_cache_stats) {
        nLayers = r.n_layers
        tokens = r.tokens
        appendedTokens = r.appended_tokens
        bytes = r.bytes
        bytesByTier = uint64Array(r.bytes_by_tier)
        fullBytes = r.full_bytes
        backingBytes = r.backing_bytes
        budgetBytes = r.budget_bytes
        contextUsedBytes = r.context_used_bytes
        deviceArenaBytes = r.device_arena_bytes
        deviceReservedBytes = r.device_reserved_bytes
    }
}

/// One layer's stats (kvsdk_layer_stats).
public struct LayerStats: Equatable {
    public let layer: UInt32
    public let tokens, tokensMinHead, tokensMaxHead, appendedTokens, bytes: UInt64
    public let bytesByTier: [UInt64]

    init(_ r: kvsdk_layer_stats) {
        layer = r.layer
        tokens = r.tokens
        tokensMinHead = r.tokens_min_head
        tokensMaxHead = r.tokens_max_head
        appendedTokens = r.appended_tokens
        bytes = r.bytes
        bytesByTier = uint64Array(r.bytes_by_tier)
    }
}
