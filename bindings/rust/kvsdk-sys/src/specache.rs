//! Header section "SpeCache: speculative prefetch and the off-budget backing store".
use crate::{kvsdk_cache, kvsdk_status};
use core::ffi::{c_char, c_void};

extern "C" {
    pub fn kvsdk_cache_set_backing_file(
        cache: *mut kvsdk_cache,
        path: *const c_char,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_prefetch(
        cache: *mut kvsdk_cache,
        layer: u32,
        n_queries: usize,
        q: *const c_void,
        q_positions: *const i32,
        q_bytes: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_fetch_stats(
        cache: *const kvsdk_cache,
        hit_rate: *mut f64,
        samples: *mut u64,
    ) -> kvsdk_status;
}
