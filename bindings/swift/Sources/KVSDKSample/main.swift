// kvsdk Swift sample: a cache inside a budget, prefill, stats, a clean budget error, and
// suspend/resume through a snapshot.
import KVSDK

let geometry = Geometry(nLayers: 2, nQHeads: 4, nKVHeads: 2, headDim: 8, dtype: .f32)
// Exact f16 tier: keys + values (2 bytes each) + a 4-byte position per token and KV head.
let bytesPerToken = UInt64(geometry.nLayers) * UInt64(geometry.nKVHeads) *
    (UInt64(geometry.headDim) * 4 + 4)

do {
    print("kvsdk \(versionString())")
    let context = try Context(budgetBytes: bytesPerToken * 20)
    let cache = try Cache(context: context, geometry: geometry, policy: Policy(parsing: "full"))
    var seed: UInt32 = 7
    func draw(_ n: Int) -> [Float] {
        (0..<n).map { _ in
            seed = seed &* 1664525 &+ 1013904223
            return Float((seed >> 8) & 0xffff) / 32768 - 1
        }
    }
    for layer in 0..<geometry.nLayers {
        let positions = (0..<16).map { Int32($0) }
        try cache.append(layer: layer, keys: draw(16 * geometry.kvElementsPerToken),
                         values: draw(16 * geometry.kvElementsPerToken), positions: positions)
        let out = try cache.attend(layer: layer, queries: draw(16 * geometry.qElementsPerQuery),
                                   queryPositions: positions)
        print("layer \(layer): \(out.count / geometry.qElementsPerQuery) outputs")
    }
    let stats = try cache.stats()
    print("tokens \(stats.tokens), bytes \(stats.bytes) of budget \(stats.budgetBytes)")
    do {
        try cache.append(layer: 0, keys: draw(8 * geometry.kvElementsPerToken),
                         values: draw(8 * geometry.kvElementsPerToken),
                         positions: (16..<24).map { Int32($0) })
        print("unexpected: the append fit the budget")
    } catch let error as KVSDKError where error.status == .budget {
        print("over budget, cache unchanged: \(error.message)")
    }
    let after = try cache.stats()
    precondition(after == stats, "a failed append changed the cache")

    // Suspend to bytes and resume in a fresh context: the next step is bit-identical.
    let snapshot = try cache.saveToBytes()
    let (resumed, info) = try Cache.load(context: try Context(), bytes: snapshot,
                                         expected: geometry)
    print("snapshot \(snapshot.count) bytes, format \(info.formatMajor).\(info.formatMinor)")
    let q = draw(geometry.qElementsPerQuery)
    let fromResumed = try resumed.attend(layer: 1, queries: q)
    let fromOriginal = try cache.attend(layer: 1, queries: q)
    precondition(fromResumed == fromOriginal, "the resumed cache differs")
    print("sample finished: OK")
} catch {
    fatalError("sample failed: \(error)")
}
