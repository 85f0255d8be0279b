//! Header section "Snapshots: suspend and resume".
use crate::{kvsdk_cache, kvsdk_context, kvsdk_geometry, kvsdk_policy, kvsdk_status};
use core::ffi::{c_char, c_void};

pub const KVSDK_SNAPSHOT_FORMAT_MAJOR: u32 = 6;
pub const KVSDK_SNAPSHOT_FORMAT_MINOR: u32 = 0;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvsdk_save_options {
    pub struct_size: u32,
    pub zstd_level: i32,
    pub include_backing: u32,
    pub max_frame_bytes: u64,
    pub max_journal_percent: u32,
    pub embed_prefix: u32,
    pub target_policy: *const kvsdk_policy,
    pub target_budget_bytes: u64,
}

// All zero, as the C struct before kvsdk_save_options_init (a raw pointer has no Default).
impl Default for kvsdk_save_options {
    fn default() -> Self {
        kvsdk_save_options {
            struct_size: 0,
            zstd_level: 0,
            include_backing: 0,
            max_frame_bytes: 0,
            max_journal_percent: 0,
            embed_prefix: 0,
            target_policy: core::ptr::null(),
            target_budget_bytes: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvsdk_load_info {
    pub struct_size: u32,
    pub format_major: u32,
    pub format_minor: u32,
    pub journal_frames_applied: u32,
    pub journal_frames_dropped: u32,
}

extern "C" {
    pub fn kvsdk_save_options_init_sized(
        options: *mut kvsdk_save_options,
        struct_size: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_load_info_init_sized(
        info: *mut kvsdk_load_info,
        struct_size: usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_save(
        cache: *mut kvsdk_cache,
        path: *const c_char,
        options: *const kvsdk_save_options,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_save_to_buffer(
        cache: *mut kvsdk_cache,
        options: *const kvsdk_save_options,
        buf: *mut c_void,
        capacity: usize,
        out_size: *mut usize,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_save_delta(
        cache: *mut kvsdk_cache,
        path: *const c_char,
        options: *const kvsdk_save_options,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_load(
        out: *mut *mut kvsdk_cache,
        ctx: *mut kvsdk_context,
        path: *const c_char,
        expected: *const kvsdk_geometry,
        info: *mut kvsdk_load_info,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_load_on_prefix(
        out: *mut *mut kvsdk_cache,
        prefix: *mut kvsdk_cache,
        path: *const c_char,
        info: *mut kvsdk_load_info,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_load_from_buffer(
        out: *mut *mut kvsdk_cache,
        ctx: *mut kvsdk_context,
        buf: *const c_void,
        size: usize,
        expected: *const kvsdk_geometry,
        info: *mut kvsdk_load_info,
    ) -> kvsdk_status;
    pub fn kvsdk_cache_policy(cache: *const kvsdk_cache, out: *mut kvsdk_policy) -> kvsdk_status;
}
