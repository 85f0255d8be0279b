import XCTest
@testable import KVSDK

final class SpeCacheTests: XCTestCase {
    let geometry = Geometry(nLayers: 2, nQHeads: 4, nKVHeads: 2, headDim: 8, dtype: .f32)
    var seed: UInt32 = 3

    func draw(_ n: Int) -> [Float] {
        (0..<n).map { _ in
            seed = seed &* 1664525 &+ 1013904223
            return Float((seed >> 8) & 0xffff) / 32768 - 1
        }
    }

    func specachePolicy() throws -> Policy {
        var p = try Policy(parsing: "specache")
        p.quantGroup = 8
        p.quantResidual = 8
        p.fetchTokens = 6
        return p
    }

    func testPrefetchMeasuresTheHitRate() throws {
        let context = try Context()
        let cache = try Cache(context: context, geometry: geometry, policy: specachePolicy())
        let positions = (0..<40).map { Int32($0) }
        for layer in UInt32(0)..<2 {
            try cache.append(layer: layer, keys: draw(40 * 16), values: draw(40 * 16),
                             positions: positions)
        }
        XCTAssertNil(try cache.fetchStats().hitRate)
        let q = draw(32)
        try cache.prefetch(layer: 0, query: q, queryPosition: 40)
        _ = try cache.attend(layer: 0, queries: q)
        let stats = try cache.fetchStats()
        XCTAssertEqual(stats.samples, 2)
        XCTAssertGreaterThan(stats.hitRate ?? 0, 0)
        XCTAssertGreaterThan(try cache.stats().backingBytes, 0)
    }

    func testOtherPoliciesAreUnsupported() throws {
        let context = try Context()
        let cache = try Cache(context: context, geometry: geometry,
                              policy: try Policy(parsing: "kivi"))
        XCTAssertThrowsError(try cache.prefetch(layer: 0, query: draw(32)))
        XCTAssertThrowsError(try cache.fetchStats())
        XCTAssertThrowsError(try cache.setBackingFile("/tmp/unused"))
    }
}
