//! Geometry: the shape of one model's attention.
use crate::error::check;
use crate::sys;
use std::mem::size_of;

/// Element type of keys, values, queries and outputs. `Unknown` keeps values from a newer
/// library (it is rejected by `Cache::new`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Unknown(i32),
}

impl Dtype {
    pub fn from_raw(raw: i32) -> Dtype {
        match raw {
            sys::KVSDK_DTYPE_F32 => Dtype::F32,
            sys::KVSDK_DTYPE_F16 => Dtype::F16,
            sys::KVSDK_DTYPE_BF16 => Dtype::Bf16,
            other => Dtype::Unknown(other),
        }
    }
    pub fn raw(self) -> i32 {
        match self {
            Dtype::F32 => sys::KVSDK_DTYPE_F32,
            Dtype::F16 => sys::KVSDK_DTYPE_F16,
            Dtype::Bf16 => sys::KVSDK_DTYPE_BF16,
            Dtype::Unknown(v) => v,
        }
    }
}

/// How the host applies rotary position embeddings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    None,
    Interleaved,
    Half,
    Unknown(i32),
}

impl RopeStyle {
    pub fn from_raw(raw: i32) -> RopeStyle {
        match raw {
            sys::KVSDK_ROPE_NONE => RopeStyle::None,
            sys::KVSDK_ROPE_INTERLEAVED => RopeStyle::Interleaved,
            sys::KVSDK_ROPE_HALF => RopeStyle::Half,
            other => RopeStyle::Unknown(other),
        }
    }
    pub fn raw(self) -> i32 {
        match self {
            RopeStyle::None => sys::KVSDK_ROPE_NONE,
            RopeStyle::Interleaved => sys::KVSDK_ROPE_INTERLEAVED,
            RopeStyle::Half => sys::KVSDK_ROPE_HALF,
            RopeStyle::Unknown(v) => v,
        }
    }
}

/// A model's attention shape (`kvsdk_geometry`). `Default` is the library's defaults
/// (kvsdk_geometry_init: counts 0, F32, interleaved RoPE, theta 10000, scale 1/sqrt(d)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    pub n_layers: u32,
    pub n_q_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub dtype: Dtype,
    pub rope_style: RopeStyle,
    pub rope_theta: f32,
    pub attn_scale: f32,
}

impl Default for Geometry {
    fn default() -> Self {
        let mut raw = sys::kvsdk_geometry::default();
        // SAFETY: valid pointer; cannot fail for a non-NULL argument.
        let size = size_of::<sys::kvsdk_geometry>();
        check(unsafe { sys::kvsdk_geometry_init_sized(&mut raw, size) })
            .expect("kvsdk_geometry_init_sized");
        Geometry::from_raw(&raw)
    }
}

impl Geometry {
    /// Library defaults with the four counts set.
    pub fn new(n_layers: u32, n_q_heads: u32, n_kv_heads: u32, head_dim: u32) -> Geometry {
        Geometry { n_layers, n_q_heads, n_kv_heads, head_dim, ..Default::default() }
    }

    pub fn from_raw(raw: &sys::kvsdk_geometry) -> Geometry {
        Geometry {
            n_layers: raw.n_layers,
            n_q_heads: raw.n_q_heads,
            n_kv_heads: raw.n_kv_heads,
            head_dim: raw.head_dim,
            dtype: Dtype::from_raw(raw.dtype),
            rope_style: RopeStyle::from_raw(raw.rope_style),
            rope_theta: raw.rope_theta,
            attn_scale: raw.attn_scale,
        }
    }

    pub fn to_raw(&self) -> sys::kvsdk_geometry {
        sys::kvsdk_geometry {
            struct_size: std::mem::size_of::<sys::kvsdk_geometry>() as u32,
            n_layers: self.n_layers,
            n_q_heads: self.n_q_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            dtype: self.dtype.raw(),
            rope_style: self.rope_style.raw(),
            rope_theta: self.rope_theta,
            attn_scale: self.attn_scale,
        }
    }

    /// Elements of keys (or values) per token: n_kv_heads * head_dim.
    pub fn kv_elems_per_token(&self) -> usize {
        self.n_kv_heads as usize * self.head_dim as usize
    }

    /// Elements of queries (or outputs) per query: n_q_heads * head_dim.
    pub fn q_elems_per_query(&self) -> usize {
        self.n_q_heads as usize * self.head_dim as usize
    }
}
