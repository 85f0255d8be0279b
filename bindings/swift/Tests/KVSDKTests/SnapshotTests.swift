import XCTest
@testable import KVSDK

final class SnapshotTests: XCTestCase {
    let geometry = Geometry(nLayers: 2, nQHeads: 4, nKVHeads: 2, headDim: 8, dtype: .f32)

    func testSaveLoadRoundTripIsBitIdentical() throws {
        let context = try Context()
        let cache = try Cache(context: context, geometry: geometry)
        let kv = (0..<(10 * 16)).map { Float($0 % 13) / 8 }
        for layer in UInt32(0)..<2 {
            try cache.append(layer: layer, keys: kv, values: kv,
                             positions: (0..<10).map { Int32($0) })
        }
        let bytes = try cache.saveToBytes()
        let (loaded, info) = try Cache.load(context: context, bytes: bytes, expected: geometry)
        // Caches of exact rows only are written as 1.2 (kvsdk.h); the newest format is 4.0.
        XCTAssertEqual(info.formatMajor, 1)
        XCTAssertEqual(info.formatMinor, 2)
        XCTAssertEqual(snapshotFormat.major, 5)
        XCTAssertEqual(snapshotFormat.minor, 0)
        let q = [Float](repeating: 0.5, count: geometry.qElementsPerQuery)
        XCTAssertEqual(try loaded.attend(layer: 1, queries: q),
                       try cache.attend(layer: 1, queries: q))
        XCTAssertEqual(try loaded.policy().method, .full)

        var corrupt = bytes
        corrupt[corrupt.count / 2] ^= 0x40
        XCTAssertThrowsError(try Cache.load(context: context, bytes: corrupt)) { error in
            XCTAssertEqual((error as? KVSDKError)?.status, .corrupt)
        }
    }
}
