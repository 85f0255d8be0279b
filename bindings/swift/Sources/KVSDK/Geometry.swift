import CKVSDK

public enum Dtype: Int32 { case f32 = 0, f16 = 1, bf16 = 2 }
public enum RopeStyle: Int32 { case none = 0, interleaved = 1, half = 2 }

// Tensor element types of each dtype (Float, Float16 / Float16Bits, BFloat16): Elements.swift.

/// A model's attention shape; defaults from kvsdk_geometry_init.
public struct Geometry: Equatable {
    public var nLayers: UInt32
    public var nQHeads: UInt32
    public var nKVHeads: UInt32
    public var headDim: UInt32
    public var dtype: Dtype
    public var ropeStyle: RopeStyle
    public var ropeTheta: Float
    /// 0 = 1/sqrt(headDim).
    public var attnScale: Float

    public init(nLayers: UInt32, nQHeads: UInt32, nKVHeads: UInt32, headDim: UInt32,
                dtype: Dtype? = nil) {
        var raw = kvsdk_geometry()
        _ = kvsdk_geometry_init_sized(&raw, MemoryLayout<kvsdk_geometry>.size)
        raw.n_layers = nLayers
        raw.n_q_heads = nQHeads
        raw.n_kv_heads = nKVHeads
        raw.head_dim = headDim
        self.init(raw)
        if let dtype = dtype { self.dtype = dtype }
    }

    init(_ raw: kvsdk_geometry) {
        nLayers = raw.n_layers
        nQHeads = raw.n_q_heads
        nKVHeads = raw.n_kv_heads
        headDim = raw.head_dim
        dtype = Dtype(rawValue: raw.dtype) ?? .f32
        ropeStyle = RopeStyle(rawValue: raw.rope_style) ?? .none
        ropeTheta = raw.rope_theta
        attnScale = raw.attn_scale
    }

    var raw: kvsdk_geometry {
        var r = kvsdk_geometry()
        _ = kvsdk_geometry_init_sized(&r, MemoryLayout<kvsdk_geometry>.size)
        r.n_layers = nLayers
        r.n_q_heads = nQHeads
        r.n_kv_heads = nKVHeads
        r.head_dim = headDim
        r.dtype = dtype.rawValue
        r.rope_style = ropeStyle.rawValue
        r.rope_theta = ropeTheta
        r.attn_scale = attnScale
        return r
    }

    /// Elements per token of keys (or values): nKVHeads * headDim.
    public var kvElementsPerToken: Int { Int(nKVHeads) * Int(headDim) }
    /// Elements per query (or output): nQHeads * headDim.
    public var qElementsPerQuery: Int { Int(nQHeads) * Int(headDim) }
}
