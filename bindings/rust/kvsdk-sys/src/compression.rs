//! Header section "Compression: observe, compress, plan".
use crate::{kvsdk_cache, kvsdk_geometry, kvsdk_policy, kvsdk_status};
use core::ffi::{c_char, c_void};

pub type kvsdk_alloc_mode = i32;
pub const KVSDK_ALLOC_TOTAL_TOKENS: kvsdk_alloc_mode = 0;
pub const KVSDK_ALLOC_TARGET_RETENTION: kvsdk_alloc_mode = 1;

/// Opaque allocation profile handle.
#[repr(C)]
pub struct kvsdk_profile {
    _private: [u8; 0],
}

/// Opaque mini-prefill planner handle.
#[repr(C)]
pub struct kvsdk_planner {
    _private: [u8; 0],
}

extern "C" {
    pub fn kvsdk_cache_observe(
        cache: *mut kvsdk_cache,
        layer: u32,
        n_queries: usize,
        q: *const c_void,
        q_positions: *const i32,
        q_bytes: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_compress(cache: *mut kvsdk_cache) -> kvsdk_status;
    pub fn kvsdk_cache_set_budget(cache: *mut kvsdk_cache, budget_bytes: u64) -> kvsdk_status;
    pub fn kvsdk_cache_token_capacity(
        cache: *const kvsdk_cache,
        out_tokens: *mut u64,
        out_token_bytes: *mut u64,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_allocation(
        cache: *const kvsdk_cache,
        tokens: *mut u64,
        n_layers: u32,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_set_allocation(
        cache: *mut kvsdk_cache,
        tokens: *const u64,
        n_layers: u32,
    ) -> kvsdk_status;
    pub fn kvsdk_plan_allocation(
        n_layers: u32,
        importance: *const *const f32,
        lengths: *const usize,
        mode: i32,
        value: f64,
        out_tokens: *mut u64,
    ) -> kvsdk_status;

    // Allocation profiles
    pub fn kvsdk_profile_create(out: *mut *mut kvsdk_profile, n_layers: u32) -> kvsdk_status;
    pub fn kvsdk_profile_destroy(profile: *mut kvsdk_profile);
    pub fn kvsdk_profile_record(
        profile: *mut kvsdk_profile,
        tokens: *const u64,
        n_layers: u32,
    ) -> kvsdk_status;
    pub fn kvsdk_profile_shares(
        profile: *const kvsdk_profile,
        shares: *mut f64,
        n_layers: u32,
        out_samples: *mut u32,
    ) -> kvsdk_status;
    pub fn kvsdk_profile_save(profile: *const kvsdk_profile, path: *const c_char) -> kvsdk_status;
    pub fn kvsdk_profile_load(out: *mut *mut kvsdk_profile, path: *const c_char) -> kvsdk_status;
    pub fn kvsdk_cache_apply_profile(
        cache: *mut kvsdk_cache,
        profile: *const kvsdk_profile,
    ) -> kvsdk_status;

    // Mini-prefill planner
    pub fn kvsdk_planner_create(
        out: *mut *mut kvsdk_planner,
        geometry: *const kvsdk_geometry,
        policy: *const kvsdk_policy,
    ) -> kvsdk_status;
    pub fn kvsdk_planner_destroy(planner: *mut kvsdk_planner);
    pub fn kvsdk_planner_feed_layer(
        planner: *mut kvsdk_planner,
        layer: u32,
        n_tokens: usize,
        k: *const c_void,
        positions: *const i32,
        k_bytes: usize,
        n_queries: usize,
        q: *const c_void,
        q_positions: *const i32,
        q_bytes: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_planner_finish(
        planner: *mut kvsdk_planner,
        mode: i32,
        value: f64,
        out_tokens: *mut u64,
        n_layers: u32,
    ) -> kvsdk_status;
}
