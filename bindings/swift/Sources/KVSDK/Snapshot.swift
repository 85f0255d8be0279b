import CKVSDK

/// Snapshot format this library writes.
public let snapshotFormat = (major: UInt32(KVSDK_SNAPSHOT_FORMAT_MAJOR),
                             minor: UInt32(KVSDK_SNAPSHOT_FORMAT_MINOR))

/// Save options; defaults from kvsdk_save_options_init.
public struct SaveOptions {
    public var zstdLevel: Int32
    public var includeBacking: Bool
    public var maxFrameBytes: UInt64
    /// saveDelta: journal share of the base snapshot (percent) past which the file is
    /// rewritten as one full snapshot; 0 = the default (50).
    public var maxJournalPercent: UInt32
    /// A conversation on a shared prefix: embed the prefix's snapshot (loads alone) instead of
    /// referencing it by content hash (loads with Cache.load(onPrefix:path:)).
    public var embedPrefix: Bool
    /// Save-time compression (kvsdk.h "Targeted saves"): the file holds the cache converted to
    /// this policy and compressed to targetBudgetBytes; the live cache is not changed. nil (the
    /// default): the cache as it is. saveDelta refuses it (.unsupported).
    public var targetPolicy: Policy?
    /// With targetPolicy: the converted cache's budget; 0 = the cache's own budget.
    public var targetBudgetBytes: UInt64

    public init() {
        var raw = kvsdk_save_options()
        _ = kvsdk_save_options_init_sized(&raw, MemoryLayout<kvsdk_save_options>.size)
        zstdLevel = raw.zstd_level
        includeBacking = raw.include_backing != 0
        maxFrameBytes = raw.max_frame_bytes
        maxJournalPercent = raw.max_journal_percent
        embedPrefix = raw.embed_prefix != 0
        targetPolicy = nil
        targetBudgetBytes = raw.target_budget_bytes
    }

    var raw: kvsdk_save_options {
        var r = kvsdk_save_options()
        _ = kvsdk_save_options_init_sized(&r, MemoryLayout<kvsdk_save_options>.size)
        r.zstd_level = zstdLevel
        r.include_backing = includeBacking ? 1 : 0
        r.max_frame_bytes = maxFrameBytes
        r.max_journal_percent = maxJournalPercent
        r.embed_prefix = embedPrefix ? 1 : 0
        r.target_budget_bytes = targetBudgetBytes
        return r
    }

    /// Calls `body` with the C struct; its target_policy points at a copy of targetPolicy that
    /// lives until `body` returns.
    func withRaw<T>(_ body: (UnsafePointer<kvsdk_save_options>) throws -> T) rethrows -> T {
        var r = raw
        guard var policy = targetPolicy?.raw else {
            return try withUnsafePointer(to: &r) { try body($0) }
        }
        return try withUnsafePointer(to: &policy) { p in
            r.target_policy = p
            return try withUnsafePointer(to: &r) { try body($0) }
        }
    }
}

/// What a load found.
public struct LoadInfo: Equatable {
    public let formatMajor, formatMinor, journalFramesApplied, journalFramesDropped: UInt32
}

extension Cache {
    /// Saves the whole cache to `path` atomically.
    public func save(to path: String, options: SaveOptions = SaveOptions()) throws {
        try options.withRaw { o in try check(kvsdk_cache_save(handle, path, o)) }
    }

    /// Saves the whole cache into a new byte array (size query, then the save).
    public func saveToBytes(options: SaveOptions = SaveOptions()) throws -> [UInt8] {
        return try options.withRaw { (o) -> [UInt8] in
            var size = 0
            try check(kvsdk_cache_save_to_buffer(handle, o, nil, 0, &size))
            var bytes = [UInt8](repeating: 0, count: size)
            let status = bytes.withUnsafeMutableBytes { b in
                kvsdk_cache_save_to_buffer(handle, o, b.baseAddress, b.count, &size)
            }
            try check(status)
            return Array(bytes[0..<size])
        }
    }

    /// Appends what changed since the last save, delta or load of `path` as journal frames.
    public func saveDelta(to path: String, options: SaveOptions = SaveOptions()) throws {
        try options.withRaw { o in try check(kvsdk_cache_save_delta(handle, path, o)) }
    }

    /// Loads a snapshot file into a new cache on `context`. `expected`: nil accepts the file's
    /// geometry, else it must match (.geometry).
    public static func load(context: Context, path: String,
                            expected: Geometry? = nil) throws -> (Cache, LoadInfo) {
        var info = emptyLoadInfo()
        var out: OpaquePointer?
        let status = withOptionalGeometry(expected) { g in
            kvsdk_cache_load(&out, context.handle, path, g, &info)
        }
        try check(status)
        return (try Cache(adopting: out!), LoadInfo(info))
    }

    /// Loads the snapshot of a conversation that references its shared prefix by content hash
    /// (kvsdk_cache_load_on_prefix); `prefix`: the frozen cache it continued.
    public static func load(onPrefix prefix: Cache, path: String) throws -> (Cache, LoadInfo) {
        var info = emptyLoadInfo()
        var out: OpaquePointer?
        try check(kvsdk_cache_load_on_prefix(&out, prefix.handle, path, &info))
        return (try Cache(adopting: out!), LoadInfo(info))
    }

    /// As load, from the bytes of a snapshot.
    public static func load(context: Context, bytes: [UInt8],
                            expected: Geometry? = nil) throws -> (Cache, LoadInfo) {
        var info = emptyLoadInfo()
        var out: OpaquePointer?
        let status = bytes.withUnsafeBytes { b in
            withOptionalGeometry(expected) { g in
                kvsdk_cache_load_from_buffer(&out, context.handle, b.baseAddress, b.count, g,
                                             &info)
            }
        }
        try check(status)
        return (try Cache(adopting: out!), LoadInfo(info))
    }

    /// The cache's policy (e.g. the one a loaded snapshot carries).
    public func policy() throws -> Policy {
        var p = try Policy(method: .full)
        try check(kvsdk_cache_policy(handle, &p.raw))
        return p
    }
}

extension LoadInfo {
    init(_ r: kvsdk_load_info) {
        formatMajor = r.format_major
        formatMinor = r.format_minor
        journalFramesApplied = r.journal_frames_applied
        journalFramesDropped = r.journal_frames_dropped
    }
}

func emptyLoadInfo() -> kvsdk_load_info {
    var info = kvsdk_load_info()
    // (cannot fail: the pointer is valid and the size is the struct's)
    _ = kvsdk_load_info_init_sized(&info, MemoryLayout<kvsdk_load_info>.size)
    return info
}

func withOptionalGeometry<R>(_ geometry: Geometry?,
                             _ body: (UnsafePointer<kvsdk_geometry>?) -> R) -> R {
    guard let geometry = geometry else { return body(nil) }
    var raw = geometry.raw
    return withUnsafePointer(to: &raw) { body($0) }
}
