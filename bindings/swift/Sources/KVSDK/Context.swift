import CKVSDK

/// cpu: the optimized kernels (SIMD chosen at run time); cpuReference: the scalar oracle.
public enum Backend: Int32 { case cpu = 0, cuda = 1, cpuReference = 2 }

/// Context options; defaults from kvsdk_context_options_init (CPU, device 0, no budget, every
/// core). Swift does not import kvsdk.h's function-like `*_init` macros, so every struct here is
/// initialised through `*_init_sized` with its MemoryLayout size (kvsdk.h, ABI rules): the library
/// then writes exactly the bytes of the struct this wrapper was compiled with.
public struct ContextOptions {
    public var backend: Backend
    public var device: Int32
    /// Hard limit on cache storage bytes over every cache of the context; 0 = unlimited.
    public var budgetBytes: UInt64
    /// Threads the kernels run on, the caller's included: 0 = every core, 1 = the caller only.
    public var nThreads: Int32

    public init(budgetBytes: UInt64? = nil) {
        var raw = kvsdk_context_options()
        _ = kvsdk_context_options_init_sized(&raw, MemoryLayout<kvsdk_context_options>.size)
        backend = Backend(rawValue: raw.backend) ?? .cpu
        device = raw.device
        self.budgetBytes = budgetBytes ?? raw.budget_bytes
        nThreads = raw.n_threads
    }

    var raw: kvsdk_context_options {
        var r = kvsdk_context_options()
        _ = kvsdk_context_options_init_sized(&r, MemoryLayout<kvsdk_context_options>.size)
        r.backend = backend.rawValue
        r.device = device
        r.budget_bytes = budgetBytes
        r.n_threads = nThreads
        return r
    }
}

/// An owned context, released on deinit. Thread-safe (the header's contract). Caches keep the
/// library-side context alive, so it may be released before them.
public final class Context: @unchecked Sendable {
    let handle: OpaquePointer

    public init(_ options: ContextOptions = ContextOptions()) throws {
        var raw = options.raw
        var out: OpaquePointer?
        try check(kvsdk_context_create(&out, &raw))
        handle = out!
    }

    public convenience init(budgetBytes: UInt64) throws {
        try self.init(ContextOptions(budgetBytes: budgetBytes))
    }

    deinit { kvsdk_context_destroy(handle) }

    /// Bytes charged against the budget by all caches of the context.
    public func usedBytes() throws -> UInt64 {
        var bytes: UInt64 = 0
        try check(kvsdk_context_used_bytes(handle, &bytes))
        return bytes
    }

    /// The budget in bytes (0 = unlimited).
    public func budgetBytes() throws -> UInt64 {
        var bytes: UInt64 = 0
        try check(kvsdk_context_budget_bytes(handle, &bytes))
        return bytes
    }
}
