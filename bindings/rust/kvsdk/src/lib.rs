//! Safe Rust API for kvsdk: owned handles released on `Drop`, `Result<_, Error>` for every
//! fallible call, slices instead of raw pointers. Built on the C ABI only (`kvsdk-sys`).
//!
//! Tensors are slices of the cache's element type, passed bit-exactly: `f32` for `Dtype::F32`,
//! [`F16`] for `Dtype::F16`, [`Bf16`] for `Dtype::Bf16` (see [`Element`]); another element
//! type is an `Err` with `Status::InvalidArg` naming the expected one.
//!
//! Threading follows the header: a [`Context`] is `Send + Sync` (share it with `Arc`); a
//! [`Cache`] is `Send` but not `Sync` (one thread at a time, moved between threads freely).
//!
//! ```
//! use kvsdk::{Cache, Context, Geometry, Policy};
//! let ctx = Context::new(&kvsdk::ContextOptions { budget_bytes: 1 << 20, ..Default::default() })?;
//! let mut geometry = Geometry::new(1, 2, 1, 4);
//! geometry.dtype = kvsdk::Dtype::F32;
//! let mut cache = Cache::new(&ctx, &geometry, &Policy::parse("full")?)?;
//! cache.append(0, &[0.5f32; 4], &[1.0f32; 4], &[0])?;
//! let out = cache.attend(0, &[1.0f32; 8], None)?;
//! assert_eq!(out, vec![1.0f32; 8]); // one token: attention returns its value for every head
//! # Ok::<(), kvsdk::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

mod cache;
mod compression;
mod context;
mod element;
mod error;
mod geometry;
mod planning;
mod policy;
mod proxy;
mod snapshot;
mod specache;
mod stats;

pub use cache::{Cache, HeadData};
pub use context::{Backend, Context, ContextOptions};
pub use element::{Bf16, Element, F16};
pub use error::{Error, Result, Status};
pub use geometry::{Dtype, Geometry, RopeStyle};
pub use planning::{plan_allocation, AllocTarget, Planner, Profile};
pub use policy::{Method, Policy, PoolKind};
pub use proxy::ProxyLink;
pub use snapshot::{LoadInfo, SaveOptions, SNAPSHOT_FORMAT};
pub use stats::{CacheStats, LayerStats, Tier, TIER_SLOTS};

/// Raw C declarations, for what the safe API does not cover.
pub use kvsdk_sys as sys;

use std::ffi::CStr;

/// Run-time version of the linked library (major * 10000 + minor * 100 + patch).
pub fn version() -> u32 {
    // SAFETY: no arguments; never fails.
    unsafe { sys::kvsdk_version() }
}

/// Run-time version as "MAJOR.MINOR.PATCH".
pub fn version_string() -> &'static str {
    // SAFETY: the library returns a static, NUL-terminated ASCII string.
    unsafe { static_str(sys::kvsdk_version_string()) }
}

/// Version of the header this crate mirrors (compile-time `KVSDK_VERSION_NUMBER`).
pub const HEADER_VERSION: u32 = sys::KVSDK_VERSION_NUMBER;

/// # Safety
/// `p` is NULL or a static NUL-terminated string owned by the library.
pub(crate) unsafe fn static_str(p: *const std::ffi::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// A path as the NUL-terminated bytes the C ABI takes.
pub(crate) fn c_path(path: &std::path::Path) -> Result<std::ffi::CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes =
        path.to_str().ok_or_else(|| Error::invalid("path is not UTF-8"))?.as_bytes().to_vec();
    std::ffi::CString::new(bytes).map_err(|_| Error::invalid("path contains NUL"))
}

/// The Rust examples of the README and of bindings/README.md (collected by build.rs), compiled
/// and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!(concat!(env!("OUT_DIR"), "/readme_rust.md"))]
pub struct ReadmeExamples;
