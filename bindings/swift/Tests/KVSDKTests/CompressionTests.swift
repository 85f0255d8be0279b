import XCTest
@testable import KVSDK

final class CompressionTests: XCTestCase {
    let geometry = Geometry(nLayers: 2, nQHeads: 4, nKVHeads: 2, headDim: 8, dtype: .f32)
    var seed: UInt32 = 5

    func draw(_ n: Int) -> [Float] {
        (0..<n).map { _ in
            seed = seed &* 1664525 &+ 1013904223
            return Float((seed >> 8) & 0xffff) / 32768 - 1
        }
    }

    func windowPolicy() throws -> Policy {
        var p = try Policy(parsing: "snapkv")
        p.obsWindow = 4
        return p
    }

    func filledCache(_ context: Context) throws -> Cache {
        let cache = try Cache(context: context, geometry: geometry, policy: windowPolicy())
        let positions = (0..<32).map { Int32($0) }
        for layer in UInt32(0)..<2 {
            try cache.append(layer: layer, keys: draw(32 * 16), values: draw(32 * 16),
                             positions: positions)
            try cache.observe(layer: layer, queries: draw(4 * 32),
                              queryPositions: Array(positions[28...]))
        }
        return cache
    }

    func testBudgetCompressesAndAllocationRoundTrips() throws {
        let context = try Context()
        let cache = try filledCache(context)
        XCTAssertEqual(try cache.allocation(), [32, 32])
        XCTAssertNil(try cache.tokenCapacity().tokens)
        let before = try cache.stats().bytes
        try cache.setBudget(before / 2)
        try cache.compress()
        XCTAssertLessThanOrEqual(try cache.stats().bytes, before / 2)
        try cache.setAllocation([8, 6])
        XCTAssertEqual(try cache.allocation(), [8, 6])
        XCTAssertThrowsError(try cache.setAllocation([8]))
        try cache.setAllocation(nil)
    }

    func testEvictSlackDefaultsRoundTripsAndIsChecked() throws {
        var p = try Policy(parsing: "h2o")
        XCTAssertEqual(p.evictSlack, 0.0625)
        let context = try Context()
        p.evictSlack = 0
        let cache = try Cache(context: context, geometry: geometry, policy: p)
        XCTAssertEqual(try cache.policy().evictSlack, 0)
        p.evictSlack = 0.75
        XCTAssertThrowsError(try Cache(context: context, geometry: geometry, policy: p))
    }

    func testKiviWeightBitsResolveByQuantBitsAndAreChecked() throws {
        var p = try Policy(parsing: "kivi")
        XCTAssertEqual(p.kiviWeightBits, 0)
        let context = try Context()
        XCTAssertEqual(try Cache(context: context, geometry: geometry, policy: p).policy()
                           .kiviWeightBits, 7)
        p.kiviWeightBits = 8
        XCTAssertThrowsError(try Cache(context: context, geometry: geometry, policy: p))
    }

    func testPlanAllocationAndProfiles() throws {
        XCTAssertEqual(try planAllocation(importance: [[1, 0, 0, 0], [1, 1, 1]],
                                          target: .totalTokens(4)), [1, 3])
        let profile = try Profile(nLayers: 2)
        try profile.record([2, 6])
        try profile.record([1, 3])
        let (shares, samples) = try profile.shares()
        XCTAssertEqual(shares, [0.25, 0.75])
        XCTAssertEqual(samples, 2)
    }

    func testPlannerPlansEveryLayer() throws {
        let planner = try Planner(geometry: geometry, policy: windowPolicy())
        let positions = (0..<32).map { Int32($0) }
        for layer in UInt32(0)..<2 {
            try planner.feedLayer(layer: layer, keys: draw(32 * 16), positions: positions,
                                  queries: draw(4 * 32), queryPositions: Array(positions[28...]))
        }
        let plan = try planner.finish(.totalTokens(20))
        XCTAssertEqual(plan.reduce(0, +), 20)
    }
}
