//! Snapshots: save a cache to a file or a buffer, append journal deltas, load it back
//! (header section "Snapshots: suspend and resume").
use crate::c_path;
use crate::cache::Cache;
use crate::context::Context;
use crate::error::{check, Result};
use crate::geometry::Geometry;
use crate::policy::Policy;
use crate::sys;
use std::ffi::c_void;
use std::mem::size_of;
use std::path::Path;
use std::ptr::{self, NonNull};

/// Newest snapshot format this library reads and writes (KVSDK_SNAPSHOT_FORMAT_MAJOR / _MINOR);
/// caches of exact rows only are written as 1.2.
pub const SNAPSHOT_FORMAT: (u32, u32) =
    (sys::KVSDK_SNAPSHOT_FORMAT_MAJOR, sys::KVSDK_SNAPSHOT_FORMAT_MINOR);

/// Save options (`kvsdk_save_options`); `Default` is kvsdk_save_options_init's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SaveOptions {
    /// zstd level 1..19 (or negative fast levels down to -7); 0 = the default.
    pub zstd_level: i32,
    /// Also write the off-budget full-precision backing store of tiered policies.
    pub include_backing: bool,
    /// Largest uncompressed rows payload per frame; 0 = the default.
    pub max_frame_bytes: u64,
    /// save_delta: journal share of the base snapshot (percent) past which the file is rewritten
    /// as one full snapshot; 0 = the default (50).
    pub max_journal_percent: u32,
    /// A conversation on a shared prefix: embed the prefix's snapshot (loads alone) instead of
    /// referencing it by content hash (loads with [`Cache::load_on_prefix`]).
    pub embed_prefix: bool,
    /// Save-time compression (kvsdk.h "Targeted saves"): the file holds the cache converted to
    /// this policy and compressed to `target_budget_bytes`; the live cache is not changed.
    /// None (the default): the cache as it is. save_delta refuses it (Status::Unsupported).
    pub target_policy: Option<Policy>,
    /// With `target_policy`: the converted cache's budget; 0 = the cache's own budget.
    pub target_budget_bytes: u64,
}

impl Default for SaveOptions {
    fn default() -> Self {
        let mut raw = sys::kvsdk_save_options::default();
        // SAFETY: valid pointer; cannot fail for a non-NULL argument.
        let size = size_of::<sys::kvsdk_save_options>();
        check(unsafe { sys::kvsdk_save_options_init_sized(&mut raw, size) })
            .expect("kvsdk_save_options_init_sized");
        SaveOptions {
            zstd_level: raw.zstd_level,
            include_backing: raw.include_backing != 0,
            max_frame_bytes: raw.max_frame_bytes,
            max_journal_percent: raw.max_journal_percent,
            embed_prefix: raw.embed_prefix != 0,
            target_policy: None,
            target_budget_bytes: raw.target_budget_bytes,
        }
    }
}

impl SaveOptions {
    /// The C struct. A target policy is written to `policy`, which the struct then points to:
    /// keep `policy` alive (and in place) while the struct is used.
    pub fn to_raw(&self, policy: &mut sys::kvsdk_policy) -> sys::kvsdk_save_options {
        let target_policy = match &self.target_policy {
            Some(p) => {
                *policy = p.to_raw();
                policy as *const sys::kvsdk_policy
            }
            None => ptr::null(),
        };
        sys::kvsdk_save_options {
            struct_size: std::mem::size_of::<sys::kvsdk_save_options>() as u32,
            zstd_level: self.zstd_level,
            include_backing: self.include_backing as u32,
            max_frame_bytes: self.max_frame_bytes,
            max_journal_percent: self.max_journal_percent,
            embed_prefix: self.embed_prefix as u32,
            target_policy,
            target_budget_bytes: self.target_budget_bytes,
        }
    }
}

/// What a load found (`kvsdk_load_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadInfo {
    pub format_major: u32,
    pub format_minor: u32,
    pub journal_frames_applied: u32,
    pub journal_frames_dropped: u32,
}

impl LoadInfo {
    fn from_raw(raw: &sys::kvsdk_load_info) -> LoadInfo {
        LoadInfo {
            format_major: raw.format_major,
            format_minor: raw.format_minor,
            journal_frames_applied: raw.journal_frames_applied,
            journal_frames_dropped: raw.journal_frames_dropped,
        }
    }
}

fn empty_load_info() -> Result<sys::kvsdk_load_info> {
    let mut info = sys::kvsdk_load_info::default();
    // SAFETY: valid pointer; the init sets struct_size.
    let size = size_of::<sys::kvsdk_load_info>();
    check(unsafe { sys::kvsdk_load_info_init_sized(&mut info, size) })?;
    Ok(info)
}

impl Cache {
    /// Saves the whole cache to `path` atomically (kvsdk_cache_save).
    pub fn save(&mut self, path: impl AsRef<Path>, options: &SaveOptions) -> Result<()> {
        let path = c_path(path.as_ref())?;
        let mut policy = sys::kvsdk_policy::default();
        let raw = options.to_raw(&mut policy);
        // SAFETY: live handle, NUL-terminated path, valid options.
        check(unsafe { sys::kvsdk_cache_save(self.as_ptr(), path.as_ptr(), &raw) })
    }

    /// Saves the whole cache into a new buffer (kvsdk_cache_save_to_buffer: a size query, then
    /// the save).
    pub fn save_to_vec(&mut self, options: &SaveOptions) -> Result<Vec<u8>> {
        let mut policy = sys::kvsdk_policy::default();
        let raw = options.to_raw(&mut policy);
        let mut size = 0usize;
        // SAFETY: live handle; NULL buffer = size query.
        check(unsafe {
            sys::kvsdk_cache_save_to_buffer(self.as_ptr(), &raw, ptr::null_mut(), 0, &mut size)
        })?;
        let mut buf = vec![0u8; size];
        // SAFETY: live handle; `buf` holds `size` bytes.
        check(unsafe {
            sys::kvsdk_cache_save_to_buffer(
                self.as_ptr(),
                &raw,
                buf.as_mut_ptr().cast::<c_void>(),
                buf.len(),
                &mut size,
            )
        })?;
        buf.truncate(size);
        Ok(buf)
    }

    /// Appends what changed since the last save, delta or load of `path` as journal frames.
    pub fn save_delta(&mut self, path: impl AsRef<Path>, options: &SaveOptions) -> Result<()> {
        let path = c_path(path.as_ref())?;
        let mut policy = sys::kvsdk_policy::default();
        let raw = options.to_raw(&mut policy);
        // SAFETY: live handle, NUL-terminated path, valid options.
        check(unsafe { sys::kvsdk_cache_save_delta(self.as_ptr(), path.as_ptr(), &raw) })
    }

    /// Loads a snapshot file into a new cache on `ctx`. `expected`: None accepts the file's
    /// geometry, otherwise it must match (KVSDK_E_GEOMETRY).
    pub fn load(
        ctx: &Context,
        path: impl AsRef<Path>,
        expected: Option<&Geometry>,
    ) -> Result<(Cache, LoadInfo)> {
        let path = c_path(path.as_ref())?;
        let expected = expected.map(Geometry::to_raw);
        let mut info = empty_load_info()?;
        let mut out = ptr::null_mut();
        // SAFETY: live context, valid pointers.
        check(unsafe {
            sys::kvsdk_cache_load(
                &mut out,
                ctx.as_ptr(),
                path.as_ptr(),
                expected.as_ref().map_or(ptr::null(), |g| g as *const _),
                &mut info,
            )
        })?;
        // SAFETY: a new handle that only this Cache releases.
        let cache = unsafe { Cache::from_raw(NonNull::new(out).expect("load returned NULL"))? };
        Ok((cache, LoadInfo::from_raw(&info)))
    }

    /// Loads the snapshot of a conversation that references its shared prefix by content hash
    /// (kvsdk_cache_load_on_prefix): `prefix` must be the frozen cache it continued (or one with
    /// the same content); the new cache continues it, in its context.
    pub fn load_on_prefix(prefix: &Cache, path: impl AsRef<Path>) -> Result<(Cache, LoadInfo)> {
        let path = c_path(path.as_ref())?;
        let mut info = empty_load_info()?;
        let mut out = ptr::null_mut();
        // SAFETY: live prefix handle (only read), NUL-terminated path, valid pointers.
        check(unsafe {
            sys::kvsdk_cache_load_on_prefix(&mut out, prefix.as_ptr(), path.as_ptr(), &mut info)
        })?;
        // SAFETY: a new handle that only this Cache releases.
        let cache = unsafe { Cache::from_raw(NonNull::new(out).expect("load returned NULL"))? };
        Ok((cache, LoadInfo::from_raw(&info)))
    }

    /// As [`Cache::load`], from the bytes of a snapshot.
    pub fn load_from_buffer(
        ctx: &Context,
        bytes: &[u8],
        expected: Option<&Geometry>,
    ) -> Result<(Cache, LoadInfo)> {
        let expected = expected.map(Geometry::to_raw);
        let mut info = empty_load_info()?;
        let mut out = ptr::null_mut();
        // SAFETY: live context; `bytes` is read during the call only.
        check(unsafe {
            sys::kvsdk_cache_load_from_buffer(
                &mut out,
                ctx.as_ptr(),
                bytes.as_ptr().cast::<c_void>(),
                bytes.len(),
                expected.as_ref().map_or(ptr::null(), |g| g as *const _),
                &mut info,
            )
        })?;
        // SAFETY: a new handle that only this Cache releases.
        let cache = unsafe { Cache::from_raw(NonNull::new(out).expect("load returned NULL"))? };
        Ok((cache, LoadInfo::from_raw(&info)))
    }

    /// The cache's policy (e.g. the one a loaded snapshot carries).
    pub fn policy(&self) -> Result<Policy> {
        let mut raw = sys::kvsdk_policy {
            struct_size: std::mem::size_of::<sys::kvsdk_policy>() as u32,
            ..Default::default()
        };
        // SAFETY: live handle, valid pointer with struct_size set.
        check(unsafe { sys::kvsdk_cache_policy(self.as_ptr(), &mut raw) })?;
        Ok(Policy::from_raw(&raw))
    }
}
