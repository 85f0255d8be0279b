/// Tensor element types.
///
/// The C ABI takes every tensor (keys, values, queries, outputs) in the cache's own dtype and
/// converts nothing, so neither does this package. Each dtype has its element types:
///
///     .f32   Float
///     .f16   Float16 (where the toolchain has it; not on macOS x86_64) or Float16Bits
///     .bf16  BFloat16 (Swift has no bfloat16 type)
///
/// Elements are passed to the library bit-exactly and come back in the same type. A call with
/// another element type throws `KVSDKError` with `.invalidArg` and a message naming the
/// expected type ("keys: expected Float16 or Float16Bits elements for an f16 cache, got
/// Float"), and the cache is unchanged. Double, integers and UInt16 (whose bits could be
/// either half type) do not conform, so passing them does not compile: wrap raw bits
/// explicitly with `Float16Bits(bitPattern:)` or `BFloat16(bitPattern:)`. Hosts that hold Float
/// data convert it with `Float16Bits(_:)` / `BFloat16(_:)`, which round to nearest even exactly
/// like the C library (src/util/half.h), NaN included.
public protocol TensorElement {
    /// The cache dtype whose elements this type holds.
    static var dtype: Dtype { get }
    /// How error messages name this type.
    static var elementName: String { get }
    /// +0 (fills new output buffers).
    static var zeroElement: Self { get }
}

extension TensorElement {
    /// Whether a buffer of this type holds elements of `dtype`.
    public static func holds(_ dtype: Dtype) -> Bool { dtype == Self.dtype }
}

extension Float: TensorElement {
    public static var dtype: Dtype { .f32 }
    public static var elementName: String { "Float" }
    public static var zeroElement: Float { 0 }
}

#if !((os(macOS) || targetEnvironment(macCatalyst)) && arch(x86_64))
@available(macOS 11.0, iOS 14.0, tvOS 14.0, watchOS 7.0, *)
extension Float16: TensorElement {
    public static var dtype: Dtype { .f16 }
    public static var elementName: String { "Float16" }
    public static var zeroElement: Float16 { 0 }
}
#endif

/// One IEEE 754 binary16 element (the `.f16` dtype) as its bit pattern, on every platform
/// (Swift's Float16 is missing on macOS x86_64). Equality compares bit patterns.
public struct Float16Bits: TensorElement, Hashable, CustomStringConvertible {
    public var bitPattern: UInt16

    public init(bitPattern: UInt16) { self.bitPattern = bitPattern }

    /// `value` rounded to nearest even, exactly as the C library converts; a NaN becomes a
    /// quiet NaN of the same sign (0x7e00 / 0xfe00).
    public init(_ value: Float) { bitPattern = f32ToF16Bits(value.bitPattern) }

    /// The exact Float value.
    public var floatValue: Float { f16BitsToF32(bitPattern) }

    public var description: String { "\(floatValue)" }
    public static var dtype: Dtype { .f16 }
    public static var elementName: String { "Float16Bits" }
    public static var zeroElement: Float16Bits { Float16Bits(bitPattern: 0) }
}

/// One bfloat16 element (the `.bf16` dtype) as its bit pattern. Equality compares bit
/// patterns.
public struct BFloat16: TensorElement, Hashable, CustomStringConvertible {
    public var bitPattern: UInt16

    public init(bitPattern: UInt16) { self.bitPattern = bitPattern }

    /// `value` rounded to nearest even, exactly as the C library converts; a NaN becomes a
    /// quiet NaN (its top 16 bits | 0x40).
    public init(_ value: Float) { bitPattern = f32ToBF16Bits(value.bitPattern) }

    /// The exact Float value.
    public var floatValue: Float { Float(bitPattern: UInt32(bitPattern) << 16) }

    public var description: String { "\(floatValue)" }
    public static var dtype: Dtype { .bf16 }
    public static var elementName: String { "BFloat16" }
    public static var zeroElement: BFloat16 { BFloat16(bitPattern: 0) }
}

/// The element types of `dtype`, as error messages name them.
func elementNames(_ dtype: Dtype) -> String {
    switch dtype {
    case .f32: return "Float"
    case .f16: return "Float16 or Float16Bits"
    case .bf16: return "BFloat16"
    }
}

/// "an f32 cache", "an f16 cache", "a bf16 cache".
func cacheName(_ dtype: Dtype) -> String {
    switch dtype {
    case .f32: return "an f32 cache"
    case .f16: return "an f16 cache"
    case .bf16: return "a bf16 cache"
    }
}

/// Throws `.invalidArg` unless `T` holds `dtype`; `what` names the buffer ("keys", "queries").
func requireElementType<T: TensorElement>(_: T.Type, of dtype: Dtype, _ what: String) throws {
    guard T.holds(dtype) else {
        throw invalidArgument("\(what): expected \(elementNames(dtype)) elements for "
                              + "\(cacheName(dtype)), got \(T.elementName)")
    }
}

/// `count` keys (or values) must hold `tokens` tokens: tokens x nKVHeads x headDim.
func checkKVCount(_ geometry: Geometry, _ what: String, _ count: Int, tokens: Int) throws {
    let expected = tokens * geometry.kvElementsPerToken
    guard count == expected else {
        throw invalidArgument("\(what): \(count) elements for \(tokens) tokens, expected "
                              + "\(expected) (tokens x nKVHeads x headDim = \(tokens) x "
                              + "\(geometry.nKVHeads) x \(geometry.headDim))")
    }
}

/// Queries in a buffer of `count` elements: one per position when positions are given (then
/// count must be positions x nQHeads x headDim), else count / (nQHeads x headDim), which must
/// divide.
func queryCount(_ geometry: Geometry, _ count: Int, positions: Int?) throws -> Int {
    let perQuery = geometry.qElementsPerQuery
    if let n = positions {
        guard count == n * perQuery else {
            throw invalidArgument("queries: \(count) elements for \(n) query positions, "
                                  + "expected \(n * perQuery) (queries x nQHeads x headDim)")
        }
        return n
    }
    guard perQuery > 0 && count % perQuery == 0 else {
        throw invalidArgument("queries: \(count) elements are not a whole number of queries "
                              + "of \(perQuery) (nQHeads x headDim)")
    }
    return count / perQuery
}

/// `f32_to_f16` of src/util/half.h on a bit pattern.
func f32ToF16Bits(_ x: UInt32) -> UInt16 {
    let sign: UInt32 = (x >> 16) & 0x8000
    let ax: UInt32 = x & 0x7fff_ffff
    if ax >= 0x7f80_0000 {  // Inf or NaN (a NaN stays quiet and non-zero)
        let quiet: UInt32 = ax > 0x7f80_0000 ? 0x200 : 0
        return UInt16(truncatingIfNeeded: sign | 0x7c00 | quiet)
    }
    if ax >= 0x477f_f000 {  // rounds to >= 65520
        return UInt16(truncatingIfNeeded: sign | 0x7c00)
    }
    if ax < 0x3880_0000 {
        // Below the smallest normal half: adding 0.5 makes the Float addition's round to
        // nearest even perform the subnormal rounding (as the C code does).
        let r: Float = Float(bitPattern: ax) + 0.5
        return UInt16(truncatingIfNeeded: sign | (r.bitPattern &- 0x3f00_0000))
    }
    let odd: UInt32 = (ax >> 13) & 1
    let rounded: UInt32 = ax &+ 0xc800_0fff &+ odd  // rebias the exponent and round
    return UInt16(truncatingIfNeeded: sign | (rounded >> 13))
}

/// `f16_to_f32` of src/util/half.h.
func f16BitsToF32(_ h: UInt16) -> Float {
    let bits = UInt32(h)
    let sign: UInt32 = (bits & 0x8000) << 16
    let exp: UInt32 = (bits >> 10) & 0x1f
    let man: UInt32 = bits & 0x3ff
    if exp == 0 {
        if man == 0 { return Float(bitPattern: sign) }
        // Subnormal: man * 2^-24, exact in Float.
        let v = Float(man) * Float(bitPattern: 0x3380_0000)
        return sign != 0 ? -v : v
    }
    if exp == 31 { return Float(bitPattern: sign | 0x7f80_0000 | (man << 13)) }
    return Float(bitPattern: sign | ((exp + 112) << 23) | (man << 13))
}

/// `f32_to_bf16` of src/util/half.h on a bit pattern.
func f32ToBF16Bits(_ x: UInt32) -> UInt16 {
    if (x & 0x7fff_ffff) > 0x7f80_0000 {  // NaN
        return UInt16(truncatingIfNeeded: (x >> 16) | 0x40)
    }
    return UInt16(truncatingIfNeeded: (x &+ 0x7fff &+ ((x >> 16) & 1)) >> 16)
}
