import XCTest
@testable import KVSDK

/// Test data of any element type; the values used are exact in f32, f16 and bf16.
protocol TestElement: TensorElement, Equatable {
    static func make(_ x: Float) -> Self
    var testBits: UInt32 { get }
}

extension Float: TestElement {
    static func make(_ x: Float) -> Float { x }
    var testBits: UInt32 { bitPattern }
}

extension Float16Bits: TestElement {
    static func make(_ x: Float) -> Float16Bits { Float16Bits(x) }
    var testBits: UInt32 { UInt32(bitPattern) }
}

extension BFloat16: TestElement {
    static func make(_ x: Float) -> BFloat16 { BFloat16(x) }
    var testBits: UInt32 { UInt32(bitPattern) }
}

#if !((os(macOS) || targetEnvironment(macCatalyst)) && arch(x86_64))
@available(macOS 11.0, iOS 14.0, tvOS 14.0, watchOS 7.0, *)
extension Float16: TestElement {
    static func make(_ x: Float) -> Float16 { Float16(x) }
    var testBits: UInt32 { UInt32(bitPattern) }
}
#endif

/// Dtype rules of the Swift wrapper, for every cache dtype (.f32, .f16, .bf16) x every element
/// type (Float, Float16, Float16Bits, BFloat16) on every call that takes or returns tensors:
/// append, attend (arrays and buffers), read, observe, prefetch, the planner and a SmallKV pair
/// of caches of different dtypes. The matching element type is stored bit-exactly; another one
/// throws .invalidArg naming the expected element type, with the cache unchanged. (Double,
/// integers and UInt16 do not conform to TensorElement: such calls do not compile.)
final class DtypeTests: XCTestCase {
    static let qHeads: UInt32 = 4, kvHeads: UInt32 = 2, dim: UInt32 = 8
    let perToken = Int(DtypeTests.kvHeads * DtypeTests.dim)
    let perQuery = Int(DtypeTests.qHeads * DtypeTests.dim)

    func geometry(_ dtype: Dtype) -> Geometry {
        Geometry(nLayers: 2, nQHeads: DtypeTests.qHeads, nKVHeads: DtypeTests.kvHeads,
                 headDim: DtypeTests.dim, dtype: dtype)
    }

    func expected(_ dtype: Dtype) -> String {
        switch dtype {
        case .f32: return "expected Float elements for an f32 cache"
        case .f16: return "expected Float16 or Float16Bits elements for an f16 cache"
        case .bf16: return "expected BFloat16 elements for a bf16 cache"
        }
    }

    func values<T: TestElement>(_ n: Int, seed: Int, as _: T.Type = T.self) -> [T] {
        (0..<n).map { T.make(Float(($0 * 7 + seed * 5) % 31) / 16 - 15.0 / 16) }
    }

    /// Stats and every head's rows as bits: what a refused call must leave alone.
    func state(_ cache: Cache) throws -> (CacheStats, [[UInt32]]) {
        func rows<T: TestElement>(_: T.Type) throws -> [[UInt32]] {
            var out: [[UInt32]] = []
            for layer in 0..<cache.geometry.nLayers {
                for head in 0..<cache.geometry.nKVHeads {
                    let h = try cache.read(layer: layer, kvHead: head, as: T.self)
                    out.append((h.keys + h.values).map { $0.testBits })
                    out.append(h.positions.map { UInt32(bitPattern: $0) })
                }
            }
            return out
        }
        let bits: [[UInt32]]
        switch cache.geometry.dtype {
        case .f32: bits = try rows(Float.self)
        case .f16: bits = try rows(Float16Bits.self)
        case .bf16: bits = try rows(BFloat16.self)
        }
        return (try cache.stats(), bits)
    }

    func assertRefused(_ phrase: String, _ what: String, file: StaticString = #filePath,
                       line: UInt = #line, _ body: () throws -> Void) {
        do {
            try body()
            XCTFail("\(what): no error", file: file, line: line)
        } catch let e as KVSDKError {
            XCTAssertEqual(e.status, .invalidArg, "\(what): \(e)", file: file, line: line)
            XCTAssertTrue(e.message.contains(phrase), "\(what): \(e.message) lacks \(phrase)",
                          file: file, line: line)
        } catch {
            XCTFail("\(what): \(error)", file: file, line: line)
        }
    }

    func specachePolicy() throws -> Policy {
        var p = try Policy(parsing: "specache")
        p.quantGroup = 8
        p.quantResidual = 8
        p.fetchTokens = 4
        return p
    }

    /// Every call with element type T on caches whose own element type is U.
    func checkElement<T: TestElement, U: TestElement>(_: T.Type, cacheOf _: U.Type) throws {
        let dtype = U.dtype
        let accepted = T.holds(dtype)
        let what = "\(T.elementName) on a \(dtype) cache"
        let context = try Context()
        let own: [U] = values(2 * perToken, seed: 1)
        let kv: [T] = values(perToken, seed: 2)
        let q: [T] = values(perQuery, seed: 3)
        let d = Int(DtypeTests.dim)

        let cache = try Cache(context: context, geometry: geometry(dtype))
        try cache.append(layer: 0, keys: own, values: own, positions: [0, 1])
        let before = try state(cache)
        var out = [T](repeating: T.zeroElement, count: perQuery)
        if accepted {
            try cache.append(layer: 0, keys: kv, values: kv, positions: [2])
            let head = try cache.read(layer: 0, kvHead: 1, as: T.self)
            XCTAssertEqual(head.positions, [0, 1, 2])
            XCTAssertEqual(Array(head.keys[(2 * d)...]), Array(kv[d..<perToken]), what)
            XCTAssertEqual(try cache.attend(layer: 0, queries: q).count, perQuery)
            try q.withUnsafeBufferPointer { qb in
                try out.withUnsafeMutableBufferPointer { ob in
                    try cache.attend(layer: 0, queries: qb, queryPositions: nil, output: ob)
                }
            }
            XCTAssertNotEqual(out, [T](repeating: T.zeroElement, count: perQuery))
        } else {
            let phrase = expected(dtype)
            assertRefused(phrase, "append \(what)") {
                try cache.append(layer: 0, keys: kv, values: kv, positions: [2])
            }
            assertRefused(phrase, "read \(what)") {
                _ = try cache.read(layer: 0, kvHead: 1, as: T.self)
            }
            assertRefused(phrase, "attend \(what)") {
                _ = try cache.attend(layer: 0, queries: q, queryPositions: [2])
            }
            assertRefused(phrase, "attend into \(what)") {
                try q.withUnsafeBufferPointer { qb in
                    try out.withUnsafeMutableBufferPointer { ob in
                        try cache.attend(layer: 0, queries: qb, queryPositions: nil, output: ob)
                    }
                }
            }
            XCTAssertEqual(out, [T](repeating: T.zeroElement, count: perQuery), "untouched")
            let after = try state(cache)
            XCTAssertEqual(after.0, before.0, what)
            XCTAssertEqual(after.1, before.1, what)
        }

        let snap = try Cache(context: context, geometry: geometry(dtype),
                             policy: Policy(parsing: "snapkv"))
        try snap.append(layer: 0, keys: own, values: own, positions: [0, 1])
        let snapBefore = try snap.stats()
        if accepted {
            try snap.observe(layer: 0, queries: q, queryPositions: [1])
        } else {
            assertRefused(expected(dtype), "observe \(what)") {
                try snap.observe(layer: 0, queries: q, queryPositions: [1])
            }
            XCTAssertEqual(try snap.stats(), snapBefore)
        }

        let spec = try Cache(context: context, geometry: geometry(dtype), policy: specachePolicy())
        let many: [U] = values(24 * perToken, seed: 4)
        try spec.append(layer: 0, keys: many, values: many, positions: (0..<24).map { Int32($0) })
        let specBefore = try spec.stats()
        if accepted {
            try spec.prefetch(layer: 0, query: q, queryPosition: 24)
        } else {
            assertRefused(expected(dtype), "prefetch \(what)") {
                try spec.prefetch(layer: 0, query: q, queryPosition: 24)
            }
            XCTAssertEqual(try spec.stats(), specBefore)
        }

        let planner = try Planner(geometry: geometry(dtype), policy: Policy(parsing: "snapkv"))
        let keys: [T] = values(2 * perToken, seed: 5)
        if accepted {
            try planner.feedLayer(layer: 0, keys: keys, positions: [0, 1], queries: q,
                                  queryPositions: [1])
        } else {
            assertRefused(expected(dtype), "feedLayer \(what)") {
                try planner.feedLayer(layer: 0, keys: keys, positions: [0, 1], queries: q,
                                      queryPositions: [1])
            }
        }
    }

    func testEveryCacheDtypeTakesOnlyItsElementTypes() throws {
        try checkElement(Float.self, cacheOf: Float.self)
        try checkElement(Float16Bits.self, cacheOf: Float.self)
        try checkElement(BFloat16.self, cacheOf: Float.self)
        try checkElement(Float.self, cacheOf: Float16Bits.self)
        try checkElement(Float16Bits.self, cacheOf: Float16Bits.self)
        try checkElement(BFloat16.self, cacheOf: Float16Bits.self)
        try checkElement(Float.self, cacheOf: BFloat16.self)
        try checkElement(Float16Bits.self, cacheOf: BFloat16.self)
        try checkElement(BFloat16.self, cacheOf: BFloat16.self)
        #if !((os(macOS) || targetEnvironment(macCatalyst)) && arch(x86_64))
        if #available(macOS 11.0, iOS 14.0, tvOS 14.0, watchOS 7.0, *) {
            try checkElement(Float16.self, cacheOf: Float.self)
            try checkElement(Float16.self, cacheOf: Float16Bits.self)
            try checkElement(Float16.self, cacheOf: BFloat16.self)
            try checkElement(Float.self, cacheOf: Float16.self)
            try checkElement(BFloat16.self, cacheOf: Float16.self)
        }
        #endif
    }

    func checkWrongLengths<T: TestElement>(_: T.Type) throws {
        let dtype = T.dtype
        let context = try Context()
        let cache = try Cache(context: context, geometry: geometry(dtype),
                              policy: Policy(parsing: "snapkv"))
        let two: [T] = values(2 * perToken, seed: 1)
        try cache.append(layer: 0, keys: two, values: two, positions: [0, 1])
        let before = try state(cache)
        let short = Array(two.dropLast())
        assertRefused("keys: 31 elements for 2 tokens, expected 32", "short keys") {
            try cache.append(layer: 0, keys: short, values: two, positions: [2, 3])
        }
        assertRefused("values: 31 elements for 2 tokens, expected 32", "short values") {
            try cache.append(layer: 0, keys: two, values: short, positions: [2, 3])
        }
        assertRefused("expected 16", "one position") {
            try cache.append(layer: 0, keys: two, values: two, positions: [2])
        }
        let q: [T] = values(perQuery + 1, seed: 2)
        assertRefused("not a whole number of queries", "q") {
            _ = try cache.attend(layer: 0, queries: q)
        }
        let q2: [T] = values(2 * perQuery, seed: 2)
        assertRefused("64 elements for 1 query positions, expected 32", "q vs positions") {
            _ = try cache.attend(layer: 0, queries: q2, queryPositions: [1])
        }
        assertRefused("expected 32", "observe") {
            try cache.observe(layer: 0, queries: q2, queryPositions: [1])
        }
        var out = [T](repeating: T.zeroElement, count: perQuery - 1)
        assertRefused("output: 31 elements, expected 32", "output") {
            try q2.withUnsafeBufferPointer { qb in
                let one = UnsafeBufferPointer(rebasing: qb[..<perQuery])
                try out.withUnsafeMutableBufferPointer { ob in
                    try cache.attend(layer: 0, queries: one, queryPositions: nil, output: ob)
                }
            }
        }
        let after = try state(cache)
        XCTAssertEqual(after.0, before.0)
        XCTAssertEqual(after.1, before.1)

        let spec = try Cache(context: context, geometry: geometry(dtype), policy: specachePolicy())
        assertRefused("expected one query of 32", "prefetch") {
            try spec.prefetch(layer: 0, query: q2)
        }
        let planner = try Planner(geometry: geometry(dtype), policy: Policy(parsing: "snapkv"))
        assertRefused("keys: 31 elements for 2 tokens", "planner keys") {
            try planner.feedLayer(layer: 0, keys: short, positions: [0, 1], queries: q2)
        }
        assertRefused("not a whole number of queries", "planner queries") {
            try planner.feedLayer(layer: 0, keys: two, positions: [0, 1], queries: q)
        }
    }

    func testWrongLengthsAreRefusedForEveryDtype() throws {
        try checkWrongLengths(Float.self)
        try checkWrongLengths(Float16Bits.self)
        try checkWrongLengths(BFloat16.self)
    }

    func testF16ElementsReadBackBitIdentically() throws {
        XCTAssertEqual(MemoryLayout<Float16Bits>.stride, 2)
        XCTAssertEqual(MemoryLayout<BFloat16>.stride, 2)
        let context = try Context()
        let small = try Cache(context: context,
                              geometry: Geometry(nLayers: 1, nQHeads: 1, nKVHeads: 1, headDim: 4,
                                                 dtype: .f16))
        let k = [Float(0.3457), 0.822, 0.3303, -1.303].map { Float16Bits($0) }
        let v = k.map { Float16Bits(bitPattern: $0.bitPattern ^ 0x8000) }
        try small.append(layer: 0, keys: k, values: v, positions: [0])
        let head = try small.read(layer: 0, kvHead: 0, as: Float16Bits.self)
        XCTAssertEqual(head.keys, k)
        XCTAssertEqual(head.values, v)

        // Every bit pattern, NaNs and infinities included.
        let g = Geometry(nLayers: 1, nQHeads: 1, nKVHeads: 1, headDim: 1024, dtype: .f16)
        let cache = try Cache(context: context, geometry: g)
        let every = (0...UInt16.max).map { Float16Bits(bitPattern: $0) }
        let reversed = Array(every.reversed())
        try cache.append(layer: 0, keys: every, values: reversed,
                         positions: (0..<64).map { Int32($0) })
        let all = try cache.read(layer: 0, kvHead: 0, as: Float16Bits.self)
        XCTAssertEqual(all.keys, every)
        XCTAssertEqual(all.values, reversed)

        #if !((os(macOS) || targetEnvironment(macCatalyst)) && arch(x86_64))
        if #available(macOS 11.0, iOS 14.0, tvOS 14.0, watchOS 7.0, *) {
            let native = try cache.read(layer: 0, kvHead: 0, as: Float16.self)
            XCTAssertEqual(native.keys.map { $0.bitPattern }, every.map { $0.bitPattern })
            let halves = [Float(0.3457), 0.822, 0.3303, -1.303].map { Float16($0) }
            let c2 = try Cache(context: context,
                               geometry: Geometry(nLayers: 1, nQHeads: 1, nKVHeads: 1,
                                                  headDim: 4, dtype: .f16))
            try c2.append(layer: 0, keys: halves, values: halves, positions: [0])
            let back = try c2.read(layer: 0, kvHead: 0, as: Float16.self)
            XCTAssertEqual(back.keys.map { $0.bitPattern }, halves.map { $0.bitPattern })
            XCTAssertEqual(halves.map { $0.bitPattern }, k.map { $0.bitPattern })
        }
        #endif
    }

    func testBF16AndF32StorageMatchTheWrapperConversions() throws {
        // BF16 and F32 caches store f16 rows: reading back applies the library's f32 -> f16
        // and f32 -> bf16 rounding, which Float16Bits(_:) / BFloat16(_:) must reproduce.
        let context = try Context()
        let positions = (0..<64).map { Int32($0) }
        let gb = Geometry(nLayers: 1, nQHeads: 1, nKVHeads: 1, headDim: 1024, dtype: .bf16)
        let bcache = try Cache(context: context, geometry: gb)
        let every = (0...UInt16.max).map { BFloat16(bitPattern: $0) }
        try bcache.append(layer: 0, keys: every, values: every, positions: positions)
        let got = try bcache.read(layer: 0, kvHead: 0, as: BFloat16.self).keys
        var unchanged = 0
        for (i, b) in every.enumerated() {
            let viaF16 = Float16Bits(b.floatValue).floatValue
            XCTAssertEqual(got[i], BFloat16(viaF16), "bf16 \(b.bitPattern)")
            if got[i] == b { unchanged += 1 }
        }
        XCTAssertGreaterThan(unchanged, 8000)

        let gf = Geometry(nLayers: 1, nQHeads: 1, nKVHeads: 1, headDim: 1024, dtype: .f32)
        let fcache = try Cache(context: context, geometry: gf)
        var seed: UInt32 = 12345
        var x: [Float] = (0..<65536).map { _ in
            seed = seed &* 1664525 &+ 1013904223
            return Float(bitPattern: seed)
        }
        let specials: [UInt32] = [0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x477f_f000,
                                  0x477f_efff, 0x3300_0000, 0x3300_0001, 0x387f_c000,
                                  0x387f_e000, 0x7fc0_0001, 0xffff_ffff]
        for (i, s) in specials.enumerated() { x[i] = Float(bitPattern: s) }
        try fcache.append(layer: 0, keys: x, values: x, positions: positions)
        let back = try fcache.read(layer: 0, kvHead: 0, as: Float.self).keys
        for i in 0..<x.count {
            XCTAssertEqual(back[i].bitPattern, Float16Bits(x[i]).floatValue.bitPattern,
                           "f32 \(x[i].bitPattern)")
        }
    }

    func testKnownConversions() {
        let cases: [(Float, UInt16, UInt16)] = [
            (0, 0x0000, 0x0000), (-0.0, 0x8000, 0x8000), (1, 0x3c00, 0x3f80),
            (-2.5, 0xc100, 0xc020), (0.1, 0x2e66, 0x3dcd), (1.0 / 3, 0x3555, 0x3eab),
            (65504, 0x7bff, 0x4780), (65520, 0x7c00, 0x4780), (6.0e-8, 0x0001, 0x3381),
            (Float(bitPattern: 0x3880_0000), 0x0400, 0x3880), (.infinity, 0x7c00, 0x7f80),
            (-.infinity, 0xfc00, 0xff80),
        ]
        for (x, f16, bf16) in cases {
            XCTAssertEqual(Float16Bits(x).bitPattern, f16, "f16 of \(x)")
            XCTAssertEqual(BFloat16(x).bitPattern, bf16, "bf16 of \(x)")
        }
        XCTAssertEqual(Float16Bits(Float.nan).bitPattern, 0x7e00)
        XCTAssertEqual(BFloat16(Float.nan).bitPattern, 0x7fc0)
        XCTAssertEqual(Float16Bits(bitPattern: 0x0001).floatValue, Float(bitPattern: 0x3380_0000))
        XCTAssertEqual(Float16Bits(bitPattern: 0xc100).floatValue, -2.5)
        XCTAssertEqual(BFloat16(bitPattern: 0x3f80).floatValue, 1)
        for bits in UInt16.min...UInt16.max {
            let h = Float16Bits(bitPattern: bits)
            if !h.floatValue.isNaN { XCTAssertEqual(Float16Bits(h.floatValue), h) }
            let b = BFloat16(bitPattern: bits)
            if !b.floatValue.isNaN { XCTAssertEqual(BFloat16(b.floatValue), b) }
        }
    }

    func testAttendOutputsRoundLikeTheLibrary() throws {
        let context = try Context()
        let kv: [Float] = values(5 * perToken, seed: 2)
        let q: [Float] = values(3 * perQuery, seed: 3, as: Float.self).map {
            Float16Bits(BFloat16($0 * 1.7).floatValue).floatValue
        }
        let qpos: [Int32] = [2, 3, 4]
        let positions: [Int32] = [0, 1, 2, 3, 4]
        let ref = try Cache(context: context, geometry: geometry(.f32))
        try ref.append(layer: 0, keys: kv, values: kv, positions: positions)
        let reference = try ref.attend(layer: 0, queries: q, queryPositions: qpos)

        let h = try Cache(context: context, geometry: geometry(.f16))
        try h.append(layer: 0, keys: kv.map { Float16Bits($0) }, values: kv.map { Float16Bits($0) },
                     positions: positions)
        XCTAssertEqual(try h.attend(layer: 0, queries: q.map { Float16Bits($0) },
                                    queryPositions: qpos),
                       reference.map { Float16Bits($0) })
        let b = try Cache(context: context, geometry: geometry(.bf16))
        try b.append(layer: 0, keys: kv.map { BFloat16($0) }, values: kv.map { BFloat16($0) },
                     positions: positions)
        let out = try b.attend(layer: 0, queries: q.map { BFloat16($0) }, queryPositions: qpos)
        XCTAssertEqual(out, reference.map { BFloat16($0) })
        XCTAssertTrue(out.contains { $0.bitPattern != 0 })
    }

    func checkProxyPair<L: TestElement, P: TestElement>(_: L.Type, proxy _: P.Type) throws {
        let context = try Context()
        let large = try Cache(context: context, geometry: geometry(L.dtype),
                              policy: Policy(parsing: "smallkv"))
        let proxy = try Cache(context: context,
                              geometry: Geometry(nLayers: 1, nQHeads: 2, nKVHeads: 1,
                                                 headDim: DtypeTests.dim, dtype: P.dtype),
                              policy: Policy(parsing: "full"))
        try large.setProxy(proxy)
        let d = Int(DtypeTests.dim)
        for t in 0..<3 {
            let pkv: [P] = values(d, seed: t)
            try proxy.append(layer: 0, keys: pkv, values: pkv, positions: [Int32(t)])
            _ = try proxy.attend(layer: 0, queries: values(2 * d, seed: t, as: P.self))
            for layer in 0..<UInt32(2) {
                let kv: [L] = values(perToken, seed: t)
                try large.append(layer: layer, keys: kv, values: kv, positions: [Int32(t)])
                _ = try large.attend(layer: layer, queries: values(perQuery, seed: t, as: L.self))
            }
        }
        let before = try state(large)
        let wrong: [P] = values(perToken, seed: 9)
        assertRefused(expected(L.dtype), "large") {
            try large.append(layer: 0, keys: wrong, values: wrong, positions: [3])
        }
        let after = try state(large)
        XCTAssertEqual(after.0, before.0)
        XCTAssertEqual(after.1, before.1)
        let wrongProxy: [L] = values(d, seed: 9)
        assertRefused(expected(P.dtype), "proxy") {
            try proxy.append(layer: 0, keys: wrongProxy, values: wrongProxy, positions: [3])
        }
        try large.setProxy(nil)
    }

    func testProxyOfAnotherDtype() throws {
        try checkProxyPair(Float16Bits.self, proxy: Float.self)
        try checkProxyPair(BFloat16.self, proxy: Float16Bits.self)
        try checkProxyPair(Float.self, proxy: BFloat16.self)
    }
}
