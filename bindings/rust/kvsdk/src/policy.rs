//! Policy: how a cache stays inside its budget.
use crate::error::{check, Error, Result};
use crate::sys;
use std::ffi::CString;
use std::mem::size_of;

/// Compression methods (`kvsdk_method`); numbers match the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Full,
    StreamingLlm,
    H2o,
    SnapKv,
    PyramidKv,
    Xkv,
    Kivi,
    SpindleKv,
    MiniCache,
    SmallKv,
    SpeCache,
    Unknown(i32),
}

impl Method {
    pub const ALL: [Method; sys::KVSDK_METHOD_COUNT as usize] = [
        Method::Full,
        Method::StreamingLlm,
        Method::H2o,
        Method::SnapKv,
        Method::PyramidKv,
        Method::Xkv,
        Method::Kivi,
        Method::SpindleKv,
        Method::MiniCache,
        Method::SmallKv,
        Method::SpeCache,
    ];

    pub fn from_raw(raw: i32) -> Method {
        if (0..sys::KVSDK_METHOD_COUNT).contains(&raw) {
            Method::ALL[raw as usize]
        } else {
            Method::Unknown(raw)
        }
    }

    pub fn raw(self) -> i32 {
        match self {
            Method::Unknown(v) => v,
            known => Method::ALL.iter().position(|m| *m == known).unwrap() as i32,
        }
    }

    /// Canonical lower-case name ("full", "streaming_llm", ...), None for an unknown value.
    pub fn name(self) -> Option<&'static str> {
        // SAFETY: any int32 is accepted; the result is NULL or static.
        let p = unsafe { sys::kvsdk_method_name(self.raw()) };
        if p.is_null() {
            None
        } else {
            // SAFETY: non-NULL static string.
            Some(unsafe { crate::static_str(p) })
        }
    }
}

/// Score pooling for observation-window methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Max,
    Avg,
    Unknown(i32),
}

impl PoolKind {
    pub fn from_raw(raw: i32) -> PoolKind {
        match raw {
            sys::KVSDK_POOL_MAX => PoolKind::Max,
            sys::KVSDK_POOL_AVG => PoolKind::Avg,
            other => PoolKind::Unknown(other),
        }
    }
    pub fn raw(self) -> i32 {
        match self {
            PoolKind::Max => sys::KVSDK_POOL_MAX,
            PoolKind::Avg => sys::KVSDK_POOL_AVG,
            PoolKind::Unknown(v) => v,
        }
    }
}

/// Policy parameters (`kvsdk_policy`); see the header for each field's meaning and default.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub method: Method,
    pub quant_bits: i32,
    pub quant_group: i32,
    pub quant_residual: i32,
    pub sink_tokens: i32,
    pub recent_tokens: i32,
    pub obs_window: i32,
    pub pool_kernel: i32,
    pub pool_kind: PoolKind,
    pub heavy_ratio: f32,
    pub schedule_alpha: f32,
    pub schedule_beta: f32,
    pub boundary_layer: i32,
    pub merge_t: f32,
    pub retain_ratio: f32,
    pub fetch_tokens: i32,
    pub match_tokens: i32,
    /// Amortized eviction: a layer that must evict goes down to its cap minus this share of it
    /// (0..=0.5; 0 = exact eviction on every token). Default 0.0625.
    pub evict_slack: f32,
    /// KIVI attention's integer value weights: 7 or 14 bits; 0 = by quant_bits (7 when <= 2,
    /// resolved when a cache is created).
    pub kivi_weight_bits: i32,
}

impl Policy {
    /// `quant_residual = Policy::RESIDUAL_AUTO`: the KIVI exact window chosen by the length the
    /// cache holds (`KVSDK_QUANT_RESIDUAL_AUTO`; resolved when a cache is created or converted).
    pub const RESIDUAL_AUTO: i32 = sys::KVSDK_QUANT_RESIDUAL_AUTO;

    /// The defaults of `method` (kvsdk_policy_init).
    pub fn new(method: Method) -> Result<Policy> {
        let mut raw = sys::kvsdk_policy::default();
        // SAFETY: valid pointer.
        let size = size_of::<sys::kvsdk_policy>();
        check(unsafe { sys::kvsdk_policy_init_sized(&mut raw, size, method.raw()) })?;
        Ok(Policy::from_raw(&raw))
    }

    /// Parses a preset name such as "full", "snapkv" or "xkv+kivi2" (kvsdk_policy_parse_sized).
    pub fn parse(spec: &str) -> Result<Policy> {
        let spec = CString::new(spec).map_err(|_| Error::invalid("policy spec contains NUL"))?;
        let mut raw = sys::kvsdk_policy::default();
        let size = size_of::<sys::kvsdk_policy>();
        // SAFETY: valid pointers; `size` is raw's size; spec is NUL-terminated.
        check(unsafe { sys::kvsdk_policy_parse_sized(&mut raw, size, spec.as_ptr()) })?;
        Ok(Policy::from_raw(&raw))
    }

    pub fn from_raw(raw: &sys::kvsdk_policy) -> Policy {
        Policy {
            method: Method::from_raw(raw.method),
            quant_bits: raw.quant_bits,
            quant_group: raw.quant_group,
            quant_residual: raw.quant_residual,
            sink_tokens: raw.sink_tokens,
            recent_tokens: raw.recent_tokens,
            obs_window: raw.obs_window,
            pool_kernel: raw.pool_kernel,
            pool_kind: PoolKind::from_raw(raw.pool_kind),
            heavy_ratio: raw.heavy_ratio,
            schedule_alpha: raw.schedule_alpha,
            schedule_beta: raw.schedule_beta,
            boundary_layer: raw.boundary_layer,
            merge_t: raw.merge_t,
            retain_ratio: raw.retain_ratio,
            fetch_tokens: raw.fetch_tokens,
            match_tokens: raw.match_tokens,
            evict_slack: raw.evict_slack,
            kivi_weight_bits: raw.kivi_weight_bits,
        }
    }

    pub fn to_raw(&self) -> sys::kvsdk_policy {
        sys::kvsdk_policy {
            struct_size: std::mem::size_of::<sys::kvsdk_policy>() as u32,
            method: self.method.raw(),
            quant_bits: self.quant_bits,
            quant_group: self.quant_group,
            quant_residual: self.quant_residual,
            sink_tokens: self.sink_tokens,
            recent_tokens: self.recent_tokens,
            obs_window: self.obs_window,
            pool_kernel: self.pool_kernel,
            pool_kind: self.pool_kind.raw(),
            heavy_ratio: self.heavy_ratio,
            schedule_alpha: self.schedule_alpha,
            schedule_beta: self.schedule_beta,
            boundary_layer: self.boundary_layer,
            merge_t: self.merge_t,
            retain_ratio: self.retain_ratio,
            fetch_tokens: self.fetch_tokens,
            match_tokens: self.match_tokens,
            evict_slack: self.evict_slack,
            kivi_weight_bits: self.kivi_weight_bits,
        }
    }
}
