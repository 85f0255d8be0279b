//! Raw declarations of the kvsdk C ABI, written by hand to mirror `include/kvsdk.h` section by
//! section (same order, same names). Read the header for every contract; this crate adds none.
//!
//! C enums are `i32` type aliases with constants, never Rust enums: the library may return a
//! value this crate does not know yet, and an unknown discriminant in a Rust enum is undefined
//! behaviour.
//!
//! Adding a function to the header: add its `extern "C"` line in the matching section below
//! (tests/bindings/header_coverage_test.py fails until every `KVSDK_API` function is here).
//! Structs are initialised with the `*_init_sized` functions and this crate's `size_of` of the
//! struct; the legacy `(kvsdk_*_init)` symbols (frozen at the first struct versions, for apps
//! built before) are deliberately not declared.
#![allow(non_camel_case_types)]
#![no_std]

use core::ffi::{c_char, c_void};

// ----- Version -----------------------------------------------------------------------------

pub const KVSDK_VERSION_MAJOR: u32 = 0;
pub const KVSDK_VERSION_MINOR: u32 = 1;
pub const KVSDK_VERSION_PATCH: u32 = 0;
pub const KVSDK_VERSION_NUMBER: u32 =
    KVSDK_VERSION_MAJOR * 10000 + KVSDK_VERSION_MINOR * 100 + KVSDK_VERSION_PATCH;

// ----- Status codes and errors -------------------------------------------------------------

pub type kvsdk_status = i32;
pub const KVSDK_OK: kvsdk_status = 0;
pub const KVSDK_E_INVALID_ARG: kvsdk_status = 1;
pub const KVSDK_E_OUT_OF_RANGE: kvsdk_status = 2;
pub const KVSDK_E_BUDGET: kvsdk_status = 3;
pub const KVSDK_E_NO_MEMORY: kvsdk_status = 4;
pub const KVSDK_E_UNSUPPORTED: kvsdk_status = 5;
pub const KVSDK_E_IO: kvsdk_status = 6;
pub const KVSDK_E_CORRUPT: kvsdk_status = 7;
pub const KVSDK_E_VERSION: kvsdk_status = 8;
pub const KVSDK_E_GEOMETRY: kvsdk_status = 9;
pub const KVSDK_E_STATE: kvsdk_status = 10;
pub const KVSDK_E_BACKEND: kvsdk_status = 11;
pub const KVSDK_E_INTERNAL: kvsdk_status = 12;

// ----- Context -----------------------------------------------------------------------------

pub type kvsdk_backend = i32;
pub const KVSDK_BACKEND_CPU: kvsdk_backend = 0;
pub const KVSDK_BACKEND_CUDA: kvsdk_backend = 1;
pub const KVSDK_BACKEND_CPU_REFERENCE: kvsdk_backend = 2;
pub const KVSDK_MAX_THREADS: i32 = 256;

/// Opaque context handle.
#[repr(C)]
pub struct kvsdk_context {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvsdk_context_options {
    pub struct_size: u32,
    pub backend: i32,
    pub device: i32,
    pub budget_bytes: u64,
    pub n_threads: i32,
}

// ----- Geometry ----------------------------------------------------------------------------

pub type kvsdk_dtype = i32;
pub const KVSDK_DTYPE_F32: kvsdk_dtype = 0;
pub const KVSDK_DTYPE_F16: kvsdk_dtype = 1;
pub const KVSDK_DTYPE_BF16: kvsdk_dtype = 2;

pub type kvsdk_rope_style = i32;
pub const KVSDK_ROPE_NONE: kvsdk_rope_style = 0;
pub const KVSDK_ROPE_INTERLEAVED: kvsdk_rope_style = 1;
pub const KVSDK_ROPE_HALF: kvsdk_rope_style = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvsdk_geometry {
    pub struct_size: u32,
    pub n_layers: u32,
    pub n_q_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub dtype: i32,
    pub rope_style: i32,
    pub rope_theta: f32,
    pub attn_scale: f32,
}

// ----- Policy ------------------------------------------------------------------------------

pub type kvsdk_method = i32;
pub const KVSDK_METHOD_FULL: kvsdk_method = 0;
pub const KVSDK_METHOD_STREAMING_LLM: kvsdk_method = 1;
pub const KVSDK_METHOD_H2O: kvsdk_method = 2;
pub const KVSDK_METHOD_SNAPKV: kvsdk_method = 3;
pub const KVSDK_METHOD_PYRAMIDKV: kvsdk_method = 4;
pub const KVSDK_METHOD_XKV: kvsdk_method = 5;
pub const KVSDK_METHOD_KIVI: kvsdk_method = 6;
pub const KVSDK_METHOD_SPINDLEKV: kvsdk_method = 7;
pub const KVSDK_METHOD_MINICACHE: kvsdk_method = 8;
pub const KVSDK_METHOD_SMALLKV: kvsdk_method = 9;
pub const KVSDK_METHOD_SPECACHE: kvsdk_method = 10;
pub const KVSDK_METHOD_COUNT: i32 = 11;
/// `kvsdk_policy.quant_residual`: the KIVI window chosen by length (kvsdk.h).
pub const KVSDK_QUANT_RESIDUAL_AUTO: i32 = -1;

pub type kvsdk_pool_kind = i32;
pub const KVSDK_POOL_MAX: kvsdk_pool_kind = 0;
pub const KVSDK_POOL_AVG: kvsdk_pool_kind = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvsdk_policy {
    pub struct_size: u32,
    pub method: i32,
    pub quant_bits: i32,
    pub quant_group: i32,
    pub quant_residual: i32,
    pub sink_tokens: i32,
    pub recent_tokens: i32,
    pub obs_window: i32,
    pub pool_kernel: i32,
    pub pool_kind: i32,
    pub heavy_ratio: f32,
    pub schedule_alpha: f32,
    pub schedule_beta: f32,
    pub boundary_layer: i32,
    pub merge_t: f32,
    pub retain_ratio: f32,
    pub fetch_tokens: i32,
    pub match_tokens: i32,
    pub evict_slack: f32,
    pub kivi_weight_bits: i32,
}

// ----- Cache -------------------------------------------------------------------------------

/// Opaque cache handle.
#[repr(C)]
pub struct kvsdk_cache {
    _private: [u8; 0],
}

/// The largest token position (INT32_MAX - 1): every position lies in 0..=KVSDK_MAX_POSITION.
pub const KVSDK_MAX_POSITION: i32 = 2147483646;

// ----- Compression: observe, compress, plan (declared in compression.rs) -------------------

mod compression;
pub use compression::*;

// ----- SpeCache: speculative prefetch and the backing store (declared in specache.rs) ------

mod specache;
pub use specache::*;

// ----- Stats -------------------------------------------------------------------------------

pub type kvsdk_tier = i32;
pub const KVSDK_TIER_EXACT: kvsdk_tier = 0;
pub const KVSDK_TIER_QUANTIZED: kvsdk_tier = 1;
pub const KVSDK_TIER_CODEBOOK: kvsdk_tier = 2;
pub const KVSDK_TIER_MERGED: kvsdk_tier = 3;
pub const KVSDK_TIER_VALUE_ONLY: kvsdk_tier = 4;
pub const KVSDK_TIER_METADATA: kvsdk_tier = 5;
pub const KVSDK_TIER_SLOTS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvsdk_cache_stats {
    pub struct_size: u32,
    pub n_layers: u32,
    pub tokens: u64,
    pub appended_tokens: u64,
    pub bytes: u64,
    pub bytes_by_tier: [u64; KVSDK_TIER_SLOTS],
    pub full_bytes: u64,
    pub backing_bytes: u64,
    pub budget_bytes: u64,
    pub context_used_bytes: u64,
    pub device_arena_bytes: u64,
    pub device_reserved_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvsdk_layer_stats {
    pub struct_size: u32,
    pub layer: u32,
    pub tokens: u64,
    pub tokens_min_head: u64,
    pub tokens_max_head: u64,
    pub appended_tokens: u64,
    pub bytes: u64,
    pub bytes_by_tier: [u64; KVSDK_TIER_SLOTS],
}

// ----- Functions, in header order ----------------------------------------------------------

extern "C" {
    // Version
    pub fn kvsdk_version() -> u32;
    pub fn kvsdk_version_string() -> *const c_char;

    // Status codes and errors
    pub fn kvsdk_status_str(status: i32) -> *const c_char;
    pub fn kvsdk_last_error() -> *const c_char;

    // Context
    pub fn kvsdk_context_options_init_sized(
        options: *mut kvsdk_context_options,
        struct_size: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_context_create(
        out: *mut *mut kvsdk_context,
        options: *const kvsdk_context_options,
    ) -> kvsdk_status;
    pub fn kvsdk_context_destroy(ctx: *mut kvsdk_context);
    pub fn kvsdk_context_used_bytes(ctx: *const kvsdk_context, out_bytes: *mut u64)
        -> kvsdk_status;
    pub fn kvsdk_context_budget_bytes(
        ctx: *const kvsdk_context,
        out_bytes: *mut u64,
    ) -> kvsdk_status;

    // Geometry
    pub fn kvsdk_geometry_init_sized(
        geometry: *mut kvsdk_geometry,
        struct_size: usize,
    ) -> kvsdk_status;

    // Policy
    pub fn kvsdk_policy_init_sized(
        policy: *mut kvsdk_policy,
        struct_size: usize,
        method: i32,
    ) -> kvsdk_status;
    pub fn kvsdk_policy_parse_sized(
        policy: *mut kvsdk_policy,
        struct_size: usize,
        spec: *const c_char,
    ) -> kvsdk_status;
    pub fn kvsdk_method_name(method: i32) -> *const c_char;

    // Cache
    pub fn kvsdk_cache_create(
        out: *mut *mut kvsdk_cache,
        ctx: *mut kvsdk_context,
        geometry: *const kvsdk_geometry,
        policy: *const kvsdk_policy,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_destroy(cache: *mut kvsdk_cache);
    pub fn kvsdk_cache_fork(out: *mut *mut kvsdk_cache, cache: *const kvsdk_cache) -> kvsdk_status;
    pub fn kvsdk_cache_truncate(cache: *mut kvsdk_cache, position: i32) -> kvsdk_status;
    pub fn kvsdk_cache_freeze(cache: *mut kvsdk_cache) -> kvsdk_status;
    pub fn kvsdk_cache_create_on_prefix(
        out: *mut *mut kvsdk_cache,
        prefix: *mut kvsdk_cache,
        policy: *const kvsdk_policy,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_geometry(
        cache: *const kvsdk_cache,
        out: *mut kvsdk_geometry,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_append(
        cache: *mut kvsdk_cache,
        layer: u32,
        n_tokens: usize,
        k: *const c_void,
        v: *const c_void,
        positions: *const i32,
        kv_bytes: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_attend(
        cache: *mut kvsdk_cache,
        layer: u32,
        n_queries: usize,
        q: *const c_void,
        q_positions: *const i32,
        q_bytes: usize,
        out: *mut c_void,
        out_bytes: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_read(
        cache: *const kvsdk_cache,
        layer: u32,
        kv_head: u32,
        k: *mut c_void,
        v: *mut c_void,
        positions: *mut i32,
        capacity_tokens: usize,
        n_tokens: *mut usize,
    ) -> kvsdk_status;

    // Stats
    pub fn kvsdk_cache_stats_init_sized(
        stats: *mut kvsdk_cache_stats,
        struct_size: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_layer_stats_init_sized(
        stats: *mut kvsdk_layer_stats,
        struct_size: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_stats_get(
        cache: *const kvsdk_cache,
        out: *mut kvsdk_cache_stats,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_layer_stats_get(
        cache: *const kvsdk_cache,
        layer: u32,
        out: *mut kvsdk_layer_stats,
    ) -> kvsdk_status;

    // SmallKV: the proxy cache of a smaller model
    pub fn kvsdk_cache_set_proxy(cache: *mut kvsdk_cache, proxy: *mut kvsdk_cache) -> kvsdk_status;
    pub fn kvsdk_cache_set_proxy_wait(cache: *mut kvsdk_cache, timeout_ms: u32) -> kvsdk_status;
}

// ----- Snapshots: suspend and resume (declared in snapshot.rs) -----------------------------

mod snapshot;
pub use snapshot::*;

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::mem::size_of;

    // The library checks struct_size; a layout that differs from the header's shows up as a
    // rejected struct or a wrong field. The init functions fill sizes the library agrees with.
    #[test]
    fn option_structs_match_the_library() {
        unsafe {
            let mut g = kvsdk_geometry::default();
            assert_eq!(kvsdk_geometry_init_sized(&mut g, size_of::<kvsdk_geometry>()), KVSDK_OK);
            assert_eq!(g.struct_size as usize, core::mem::size_of::<kvsdk_geometry>());
            assert_eq!(g.rope_theta, 10000.0);
            assert_eq!(g.rope_style, KVSDK_ROPE_INTERLEAVED);
            let mut p = kvsdk_policy::default();
            let size = size_of::<kvsdk_policy>();
            assert_eq!(kvsdk_policy_init_sized(&mut p, size, KVSDK_METHOD_KIVI), KVSDK_OK);
            assert_eq!(p.struct_size as usize, core::mem::size_of::<kvsdk_policy>());
            assert_eq!(p.method, KVSDK_METHOD_KIVI);
            assert_eq!(p.quant_group, 32);
            assert_eq!(p.quant_residual, 128);
            let mut o = kvsdk_context_options::default();
            let size = size_of::<kvsdk_context_options>();
            assert_eq!(kvsdk_context_options_init_sized(&mut o, size), KVSDK_OK);
            assert_eq!(o.struct_size as usize, core::mem::size_of::<kvsdk_context_options>());
            assert_eq!(kvsdk_version() / 10000, KVSDK_VERSION_MAJOR);
        }
    }
}
