import XCTest
import KVSDK

/// The README's Swift example, line for line (tests/bindings/readme_examples_test.py checks that
/// every line of it appears here, in order), plus assertions.
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
}
