import XCTest
@testable import KVSDK

final class CacheTests: XCTestCase {
    let geometry = Geometry(nLayers: 2, nQHeads: 4, nKVHeads: 2, headDim: 8, dtype: .f32)

    /// Token t, KV head h, channel c: a value exactly representable in f16.
    func kv(_ tokens: Range<Int>, scale: Float) -> [Float] {
        var out: [Float] = []
        for t in tokens {
            for h in 0..<Int(geometry.nKVHeads) {
                for c in 0..<Int(geometry.headDim) {
                    out.append(scale * Float((t * 7 + h * 3 + c) % 16) / 8)
                }
            }
        }
        return out
    }

    func testVersionMatchesHeader() {
        XCTAssertEqual(version() / 10000, headerVersionMajor)
        XCTAssertEqual(versionString().split(separator: ".").count, 3)
    }

    func testAppendReadAttendAndStats() throws {
        let context = try Context()
        let cache = try Cache(context: context, geometry: geometry)
        let k = kv(0..<5, scale: 1), v = kv(0..<5, scale: -0.5)
        try cache.append(layer: 1, keys: k, values: v, positions: [0, 1, 2, 3, 4])

        let head = try cache.read(layer: 1, kvHead: 1, as: Float.self)
        XCTAssertEqual(head.positions, [0, 1, 2, 3, 4])
        let d = Int(geometry.headDim)
        for t in 0..<5 {
            let src = (t * 2 + 1) * d
            XCTAssertEqual(Array(head.keys[t * d..<(t + 1) * d]), Array(k[src..<src + d]))
            XCTAssertEqual(Array(head.values[t * d..<(t + 1) * d]), Array(v[src..<src + d]))
        }
        XCTAssertEqual(try cache.tokenCount(layer: 0, kvHead: 0), 0)

        let zero = [Float](repeating: 0, count: geometry.qElementsPerQuery)
        let out = try cache.attend(layer: 1, queries: zero)
        for qh in 0..<4 {
            for c in 0..<d {
                let mean = (0..<5).map { v[($0 * 2 + qh / 2) * d + c] }.reduce(0, +) / 5
                XCTAssertEqual(out[qh * d + c], mean, accuracy: 1e-6)
            }
        }
        let causal = try cache.attend(layer: 1, queries: zero, queryPositions: [0])
        XCTAssertEqual(Array(causal[0..<d]), Array(v[0..<d]))

        let stats = try cache.stats()
        XCTAssertEqual(stats.tokens, 10)
        XCTAssertEqual(stats.appendedTokens, 5)
        XCTAssertEqual(stats.bytes, stats.bytesByTier.reduce(0, +))
        XCTAssertEqual(stats.contextUsedBytes, try context.usedBytes())
        let layer = try cache.layerStats(layer: 1)
        XCTAssertEqual(layer.tokensMinHead, 5)
        XCTAssertEqual(cache.geometry.attnScale, 1 / Float(d).squareRoot(), accuracy: 1e-7)
    }

    func testErrorsCarryStatusAndChangeNothing() throws {
        let perToken = UInt64(geometry.nKVHeads) * (UInt64(geometry.headDim) * 4 + 4)
        let context = try Context(budgetBytes: perToken * 3)
        XCTAssertEqual(try context.budgetBytes(), perToken * 3)
        let cache = try Cache(context: context, geometry: geometry, policy: Policy(method: .full))
        try cache.append(layer: 0, keys: kv(0..<2, scale: 1), values: kv(0..<2, scale: 1),
                         positions: [0, 1])
        let before = try cache.stats()

        func status(_ body: () throws -> Void) -> Status? {
            do { try body() } catch let e as KVSDKError {
                XCTAssertFalse(e.message.isEmpty)
                return e.status
            } catch { return nil }
            return nil
        }
        XCTAssertEqual(status { try cache.append(layer: 0, keys: self.kv(2..<4, scale: 1),
                                                 values: self.kv(2..<4, scale: 1),
                                                 positions: [2, 3]) }, .budget)
        XCTAssertEqual(status { try cache.append(layer: 9, keys: self.kv(2..<3, scale: 1),
                                                 values: self.kv(2..<3, scale: 1),
                                                 positions: [2]) }, .outOfRange)
        let halves = [Float16Bits](repeating: Float16Bits(bitPattern: 0), count: 16)
        XCTAssertEqual(status { try cache.append(layer: 0, keys: halves, values: halves,
                                                 positions: [2]) }, .invalidArg)
        let threeElements = [Float](repeating: 0, count: 3)
        XCTAssertEqual(status { _ = try cache.attend(layer: 0, queries: threeElements) },
                       .invalidArg)
        XCTAssertEqual(status { _ = try cache.read(layer: 0, kvHead: 7, as: Float.self) },
                       .outOfRange)
        XCTAssertEqual(try cache.stats(), before)
        XCTAssertEqual(status { _ = try Policy(parsing: "no-such-method") }, .invalidArg)
    }

    func testSmallKVProxyRunsOnAnotherThread() throws {
        let context = try Context()
        var policy = try Policy(parsing: "smallkv")
        policy.matchTokens = 2  // heads matched on the first step: later attends read the proxy
        let large = try Cache(context: context, geometry: geometry, policy: policy)
        let proxy = try Cache(context: context,
                              geometry: Geometry(nLayers: 1, nQHeads: 2, nKVHeads: 1, headDim: 8,
                                                 dtype: .f32),
                              policy: Policy(parsing: "full"))
        try large.setProxy(proxy)
        try large.setProxyWait(timeoutMs: 10_000)
        let done = DispatchSemaphore(value: 0)
        var proxyError: Error?
        let worker = Thread {
            do {
                try proxy.append(layer: 0, keys: [Float](repeating: 0.25, count: 16),
                                 values: [Float](repeating: 0.5, count: 16), positions: [0, 1])
                _ = try proxy.attend(layer: 0, queries: [Float](repeating: 0.5, count: 32),
                                     queryPositions: [0, 1])
            } catch { proxyError = error }
            done.signal()
        }
        worker.start()
        try large.append(layer: 0, keys: kv(0..<2, scale: 1), values: kv(0..<2, scale: -0.5),
                         positions: [0, 1])
        let q = (0..<64).map { Float($0 % 5) / 4 }
        let out = try large.attend(layer: 0, queries: q, queryPositions: [0, 1])
        done.wait()
        XCTAssertNil(proxyError)
        XCTAssertEqual(out.count, q.count)
        // A proxy that does not come: .state after the timeout, nothing changed.
        try large.setProxyWait(timeoutMs: 20)
        try large.append(layer: 0, keys: kv(2..<3, scale: 1), values: kv(2..<3, scale: -0.5),
                         positions: [2])
        let before = try large.stats()
        XCTAssertThrowsError(try large.attend(layer: 0, queries: Array(q[0..<32]),
                                              queryPositions: [2])) { e in
            XCTAssertEqual((e as? KVSDKError)?.status, .state)
        }
        XCTAssertEqual(try large.stats(), before)
        try large.setProxyWait(timeoutMs: 0)
    }

    func testTruncateRewindsExactlyOrRefuses() throws {
        let context = try Context()
        let a = try Cache(context: context, geometry: geometry)
        let b = try Cache(context: context, geometry: geometry)
        try a.append(layer: 0, keys: kv(0..<6, scale: 1), values: kv(0..<6, scale: -0.5),
                     positions: [0, 1, 2, 3, 4, 5])
        try b.append(layer: 0, keys: kv(0..<4, scale: 1), values: kv(0..<4, scale: -0.5),
                     positions: [0, 1, 2, 3])
        try a.truncate(from: 4)
        XCTAssertEqual(try a.stats().tokens, 8)
        XCTAssertEqual(try a.stats().bytes, try b.stats().bytes)
        let q = (0..<geometry.qElementsPerQuery).map { Float($0 % 5) / 4 }
        XCTAssertEqual(try a.attend(layer: 0, queries: q, queryPositions: [9]),
                       try b.attend(layer: 0, queries: q, queryPositions: [9]))
        XCTAssertThrowsError(try a.truncate(from: -1)) { e in
            XCTAssertEqual((e as? KVSDKError)?.status, .invalidArg)
        }
        // kivi (blocks of 32 after a residual of 128) has quantized the first tokens of 200.
        let k = try Cache(context: context, geometry: geometry, policy: Policy(parsing: "kivi"))
        try k.append(layer: 0, keys: kv(0..<200, scale: 1), values: kv(0..<200, scale: -0.5),
                     positions: (0..<200).map { Int32($0) })
        let before = try k.stats()
        XCTAssertThrowsError(try k.truncate(from: 10)) { e in
            XCTAssertEqual((e as? KVSDKError)?.status, .state)
        }
        XCTAssertEqual(try k.stats(), before)
    }

    func testConversationsShareAFrozenPrefix() throws {
        let context = try Context()
        var prefix: Cache? = try Cache(context: context, geometry: geometry)
        let prefixPositions: [Int32] = Array(0..<8)
        for layer in 0..<geometry.nLayers {
            try prefix!.append(layer: layer, keys: kv(0..<8, scale: 1),
                               values: kv(0..<8, scale: -0.5), positions: prefixPositions)
        }
        // Only a frozen cache can be a prefix.
        XCTAssertThrowsError(try Cache(prefix: prefix!)) { e in
            XCTAssertEqual((e as? KVSDKError)?.status, .state)
        }
        try prefix!.freeze()
        try prefix!.freeze()  // idempotent
        let prefixBytes = try prefix!.stats().bytes
        XCTAssertEqual(try context.usedBytes(), prefixBytes)

        let a = try Cache(prefix: prefix!)
        let b = try Cache(prefix: prefix!, policy: Policy(parsing: "snapkv"))
        let aPositions: [Int32] = Array(8..<11), bPositions: [Int32] = Array(8..<13)
        for layer in 0..<geometry.nLayers {
            try a.append(layer: layer, keys: kv(8..<11, scale: 0.5),
                         values: kv(8..<11, scale: 0.75), positions: aPositions)
            try b.append(layer: layer, keys: kv(8..<13, scale: -0.25),
                         values: kv(8..<13, scale: 1.5), positions: bPositions)
        }
        let sa = try a.stats(), sb = try b.stats()
        XCTAssertEqual(sa.tokens, UInt64(geometry.nLayers * geometry.nKVHeads) * 3)
        XCTAssertEqual(sb.tokens, UInt64(geometry.nLayers * geometry.nKVHeads) * 5)
        XCTAssertEqual(try a.tokenCount(layer: 0, kvHead: 0), 3)
        // The prefix is charged once: the context holds it and each conversation's own rows.
        XCTAssertGreaterThan(sa.bytes, 0)
        let used = prefixBytes + sa.bytes + sb.bytes
        XCTAssertEqual(try context.usedBytes(), used)
        XCTAssertEqual(sa.contextUsedBytes, used)
        XCTAssertEqual(sb.contextUsedBytes, used)

        // Full over full attends like one cache holding the prefix and then the conversation.
        let q = (0..<geometry.qElementsPerQuery).map { Float($0 % 5) / 4 - 0.3 }
        let reference = try Cache(context: Context(), geometry: geometry)
        try reference.append(layer: 1, keys: kv(0..<8, scale: 1), values: kv(0..<8, scale: -0.5),
                             positions: prefixPositions)
        try reference.append(layer: 1, keys: kv(8..<11, scale: 0.5),
                             values: kv(8..<11, scale: 0.75), positions: aPositions)
        let expected = try reference.attend(layer: 1, queries: q, queryPositions: [20])
        let got = try a.attend(layer: 1, queries: q, queryPositions: [20])
        for (x, y) in zip(got, expected) {
            XCTAssertEqual(x, y, accuracy: 1e-5 * max(1, abs(y)))
        }
        XCTAssertNotEqual(got, try b.attend(layer: 1, queries: q, queryPositions: [20]))
        // A query at a prefix position sees only the prefix tokens up to it.
        XCTAssertEqual(try a.attend(layer: 1, queries: q, queryPositions: [3]),
                       try b.attend(layer: 1, queries: q, queryPositions: [3]))

        // The frozen prefix is read-only; a refused append changes nothing.
        XCTAssertThrowsError(try prefix!.append(layer: 0, keys: kv(8..<9, scale: 1),
                                                values: kv(8..<9, scale: 1), positions: [8])) {
            e in XCTAssertEqual((e as? KVSDKError)?.status, .state)
        }
        XCTAssertEqual(try prefix!.stats().bytes, prefixBytes)
        XCTAssertEqual(try context.usedBytes(), used)

        // Dropping this reference: the prefix stays alive (and charged) for its conversations.
        prefix = nil
        XCTAssertEqual(try a.attend(layer: 1, queries: q, queryPositions: [20]), got)
        XCTAssertEqual(try context.usedBytes(), used)
    }

    func testMethodsRoundTripThroughNames() throws {
        for m in Method.allCases {
            XCTAssertEqual(try Policy(parsing: m.name).method, m)
        }
        XCTAssertNil(Method.name(rawValue: 99))
        let p = try Policy(parsing: "xkv+kivi2")
        XCTAssertEqual(p.method, .xkv)
        XCTAssertEqual(p.quantBits, 2)
        XCTAssertEqual(Status(raw: Status.budget.raw), .budget)
    }
}
