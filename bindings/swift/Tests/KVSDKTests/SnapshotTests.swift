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
        // Caches holding exact rows are written as 6.0 (byte-plane rows; kvsdk.h), the newest.
        XCTAssertEqual(info.formatMajor, 6)
        XCTAssertEqual(info.formatMinor, 0)
        XCTAssertEqual(snapshotFormat.major, 6)
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

    func testATargetedSaveHoldsTheTargetPolicy() throws {
        let context = try Context()
        let cache = try Cache(context: context, geometry: geometry)
        let kv = (0..<(40 * 16)).map { Float($0 % 17) / 8 }
        for layer in UInt32(0)..<2 {
            try cache.append(layer: layer, keys: kv, values: kv,
                             positions: (0..<40).map { Int32($0) })
        }
        let before = try cache.saveToBytes()
        var options = SaveOptions()
        options.targetPolicy = try Policy(parsing: "snapkv")
        options.targetBudgetBytes = try cache.stats().bytes / 2
        let bytes = try cache.saveToBytes(options: options)
        XCTAssertEqual(try cache.saveToBytes(), before)  // the live cache is as it was
        let (loaded, _) = try Cache.load(context: try Context(), bytes: bytes)
        XCTAssertEqual(try loaded.policy().method, .snapKV)
        XCTAssertLessThanOrEqual(try loaded.stats().bytes, options.targetBudgetBytes)
        let path = NSTemporaryDirectory() + "kvsdk-swift-target-\(getpid()).kvsdk"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try cache.save(to: path, options: options)
        XCTAssertEqual(FileManager.default.contents(atPath: path).map { [UInt8]($0) }, bytes)
        XCTAssertThrowsError(try cache.saveDelta(to: path, options: options)) { error in
            XCTAssertEqual((error as? KVSDKError)?.status, .unsupported)
        }
    }

    func testAConversationOnAPrefixReferencesOrEmbedsIt() throws {
        let context = try Context()
        let kv = (0..<(12 * 16)).map { Float($0 % 11) / 8 }
        let prefix = try Cache(context: context, geometry: geometry)
        for layer in UInt32(0)..<2 {
            try prefix.append(layer: layer, keys: kv, values: kv,
                              positions: (0..<12).map { Int32($0) })
        }
        try prefix.freeze()
        let chat = try Cache(prefix: prefix)
        let own = Array(kv[0..<(3 * 16)])
        for layer in UInt32(0)..<2 {
            try chat.append(layer: layer, keys: own, values: own, positions: [12, 13, 14])
        }
        let q = [Float](repeating: 0.25, count: geometry.qElementsPerQuery)
        let expected = try chat.attend(layer: 1, queries: q)
        let path = NSTemporaryDirectory() + "kvsdk-swift-prefix-\(getpid()).kvsdk"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try chat.save(to: path)
        XCTAssertThrowsError(try Cache.load(context: context, path: path)) { error in
            XCTAssertEqual((error as? KVSDKError)?.status, .state)
        }
        let (loaded, info) = try Cache.load(onPrefix: prefix, path: path)
        XCTAssertEqual(info.formatMajor, 6)
        XCTAssertEqual(try loaded.attend(layer: 1, queries: q), expected)
        var embed = SaveOptions()
        embed.embedPrefix = true
        let (alone, _) = try Cache.load(context: try Context(),
                                        bytes: try chat.saveToBytes(options: embed))
        XCTAssertEqual(try alone.attend(layer: 1, queries: q), expected)
    }
}
