import XCTest
import KVSDK

/// The Swift examples of README.md and bindings/README.md, line for line
/// (tests/bindings/readme_examples_test.py checks that every line of each appears here, in
/// order), plus assertions.
final class ReadmeExampleTests: XCTestCase {
    func testReadmeExample() throws {
        let context = try Context(budgetBytes: 64 << 20)
        let geometry = Geometry(nLayers: 2, nQHeads: 4, nKVHeads: 2, headDim: 8, dtype: .f32)
        let policy = try Policy(parsing: "full")
        let cache = try Cache(context: context, geometry: geometry, policy: policy)
        let kv = [Float](repeating: 0.25, count: 3 * geometry.kvElementsPerToken)
        try cache.append(layer: 0, keys: kv, values: kv, positions: [0, 1, 2])
        let queries = [Float](repeating: 1, count: geometry.qElementsPerQuery)
        let out = try cache.attend(layer: 0, queries: queries)
        do {
            try cache.append(layer: 5, keys: kv, values: kv, positions: [3, 4, 5])  // no layer 5
        } catch let error as KVSDKError {
            print(error.status, error.message)
            XCTAssertEqual(error.status, .outOfRange)
        }
        let snapshot = try cache.saveToBytes()  // suspend (or cache.save(to: path))
        let (resumed, _) = try Cache.load(context: context, bytes: snapshot, expected: geometry)
        let again = try resumed.attend(layer: 0, queries: queries)  // equals `out`, bit for bit
        XCTAssertEqual(out[0], 0.25)
        XCTAssertEqual(again, out)
    }

    /// bindings/README.md: tensors and dtypes.
    func testBindingsReadmeDtypeExample() throws {
        let context = try Context()
        let g16 = Geometry(nLayers: 1, nQHeads: 2, nKVHeads: 1, headDim: 4, dtype: .f16)
        let cache16 = try Cache(context: context, geometry: g16)
        let k = [Float(0.3457), 0.822, 0.3303, -1.303].map { Float16Bits($0) }
        try cache16.append(layer: 0, keys: k, values: k, positions: [0])
        let head = try cache16.read(layer: 0, kvHead: 0, as: Float16Bits.self)  // keys == k, bit for bit
        XCTAssertEqual(head.keys, k)
        var refused = false
        do {
            let wrong = [Float](repeating: 0.5, count: 4)
            try cache16.append(layer: 0, keys: wrong, values: wrong, positions: [1])
        } catch let error as KVSDKError {
            print(error.message)  // keys: expected Float16 or Float16Bits elements for an f16 cache, got Float
            XCTAssertEqual(error.status, .invalidArg)
            XCTAssertTrue(error.message.contains("expected Float16 or Float16Bits elements"))
            refused = true
        }
        XCTAssertTrue(refused)
        XCTAssertEqual(try cache16.tokenCount(layer: 0, kvHead: 0), 1)
        let gbf = Geometry(nLayers: 1, nQHeads: 2, nKVHeads: 1, headDim: 4, dtype: .bf16)
        let cacheBF = try Cache(context: context, geometry: gbf)
        let kb = [Float](repeating: 0.1, count: 4).map { BFloat16($0) }  // rounds like the library
        try cacheBF.append(layer: 0, keys: kb, values: kb, positions: [0])
        let out = try cacheBF.attend(layer: 0, queries: [BFloat16](repeating: BFloat16(1), count: 8))
        XCTAssertEqual(kb[0].bitPattern, 0x3dcd)
        XCTAssertEqual(out, [BFloat16](repeating: kb[0], count: 8))
    }
}
