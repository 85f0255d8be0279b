//! Allocation planning without a cache: the XKV greedy allocation, allocation profiles and the
//! mini-prefill planner (header section "Compression: observe, compress, plan").
use crate::c_path;
use crate::cache::{check_kv_len, query_count};
use crate::element::{self, Element};
use crate::error::{check, Error, Result};
use crate::geometry::Geometry;
use crate::policy::Policy;
use crate::sys;
use std::ffi::c_void;
use std::path::Path;
use std::ptr::{self, NonNull};

/// What an allocation targets (kvsdk_alloc_mode and its value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AllocTarget {
    /// Place exactly min(N, sum of lengths) tokens.
    TotalTokens(u64),
    /// The smallest total whose average importance retention reaches R_avg in (0, 1].
    TargetRetention(f64),
}

impl AllocTarget {
    fn raw(self) -> (i32, f64) {
        match self {
            AllocTarget::TotalTokens(n) => (sys::KVSDK_ALLOC_TOTAL_TOKENS, n as f64),
            AllocTarget::TargetRetention(r) => (sys::KVSDK_ALLOC_TARGET_RETENTION, r),
        }
    }
}

fn layer_count(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid("too many layers"))
}

/// XKV greedy allocation (kvsdk_plan_allocation): tokens each layer keeps, given one importance
/// vector per layer.
pub fn plan_allocation(importance: &[&[f32]], target: AllocTarget) -> Result<Vec<u64>> {
    let n_layers = layer_count(importance.len())?;
    let pointers: Vec<*const f32> = importance.iter().map(|w| w.as_ptr()).collect();
    let lengths: Vec<usize> = importance.iter().map(|w| w.len()).collect();
    let mut out = vec![0u64; importance.len()];
    let (mode, value) = target.raw();
    // SAFETY: n_layers entries in every array; each pointer holds its length of floats.
    check(unsafe {
        sys::kvsdk_plan_allocation(
            n_layers,
            pointers.as_ptr(),
            lengths.as_ptr(),
            mode,
            value,
            out.as_mut_ptr(),
        )
    })?;
    Ok(out)
}

/// An allocation profile: averaged per-layer shares of sample requests of one task type.
/// `Send` (used by one thread at a time, from any thread), not `Sync`.
#[derive(Debug)]
pub struct Profile {
    raw: NonNull<sys::kvsdk_profile>,
    n_layers: u32,
}

// SAFETY: the header allows a profile to be used by one thread at a time, from any thread.
unsafe impl Send for Profile {}

impl Profile {
    pub fn new(n_layers: u32) -> Result<Profile> {
        let mut out = ptr::null_mut();
        // SAFETY: valid pointer.
        check(unsafe { sys::kvsdk_profile_create(&mut out, n_layers) })?;
        Ok(Profile {
            raw: NonNull::new(out).expect("kvsdk_profile_create returned NULL"),
            n_layers,
        })
    }

    /// Loads a profile saved by [`Profile::save`] for a model of `n_layers` layers (the header
    /// has no query for a profile's layer count; a mismatch is KVSDK_E_INVALID_ARG).
    pub fn load(path: impl AsRef<Path>, n_layers: u32) -> Result<Profile> {
        let path = c_path(path.as_ref())?;
        let mut out = ptr::null_mut();
        // SAFETY: valid pointers.
        check(unsafe { sys::kvsdk_profile_load(&mut out, path.as_ptr()) })?;
        let profile =
            Profile { raw: NonNull::new(out).expect("kvsdk_profile_load returned NULL"), n_layers };
        profile.shares()?; // checks the layer count; drops the profile on error
        Ok(profile)
    }

    pub fn n_layers(&self) -> u32 {
        self.n_layers
    }

    /// Records the allocation list of one sample request (tokens per layer).
    pub fn record(&mut self, tokens: &[u64]) -> Result<()> {
        let n = layer_count(tokens.len())?;
        // SAFETY: live handle; `tokens` holds n entries.
        check(unsafe { sys::kvsdk_profile_record(self.raw.as_ptr(), tokens.as_ptr(), n) })
    }

    /// Averaged shares (one per layer, summing to 1) and the number of recorded samples.
    pub fn shares(&self) -> Result<(Vec<f64>, u32)> {
        let mut shares = vec![0f64; self.n_layers as usize];
        let mut samples = 0u32;
        // SAFETY: live handle; `shares` holds n_layers entries.
        check(unsafe {
            sys::kvsdk_profile_shares(
                self.raw.as_ptr(),
                shares.as_mut_ptr(),
                self.n_layers,
                &mut samples,
            )
        })?;
        Ok((shares, samples))
    }

    /// Saves atomically to `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path(path.as_ref())?;
        // SAFETY: live handle, NUL-terminated path.
        check(unsafe { sys::kvsdk_profile_save(self.raw.as_ptr(), path.as_ptr()) })
    }

    pub fn as_ptr(&self) -> *mut sys::kvsdk_profile {
        self.raw.as_ptr()
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        // SAFETY: owned handle, released once.
        unsafe { sys::kvsdk_profile_destroy(self.raw.as_ptr()) }
    }
}

/// The mini-prefill planner: scores each layer's keys and window queries in a cache-free pass
/// and returns the allocation for the real prefill. `Send`, not `Sync`.
#[derive(Debug)]
pub struct Planner {
    raw: NonNull<sys::kvsdk_planner>,
    geometry: Geometry,
}

// SAFETY: the header allows a planner to be used by one thread at a time, from any thread.
unsafe impl Send for Planner {}

impl Planner {
    pub fn new(geometry: &Geometry, policy: &Policy) -> Result<Planner> {
        let (g, p) = (geometry.to_raw(), policy.to_raw());
        let mut out = ptr::null_mut();
        // SAFETY: valid pointers.
        check(unsafe { sys::kvsdk_planner_create(&mut out, &g, &p) })?;
        Ok(Planner {
            raw: NonNull::new(out).expect("kvsdk_planner_create returned NULL"),
            geometry: *geometry,
        })
    }

    /// Scores one layer: keys `k` (tokens x n_kv_heads x head_dim) at `positions`, and window
    /// queries `q` (queries x n_q_heads x head_dim) at `q_positions` (None: see all keys).
    /// `k` and `q` are of the geometry's element type (see [`Element`]).
    pub fn feed_layer<T: Element>(
        &mut self,
        layer: u32,
        k: &[T],
        positions: &[i32],
        q: &[T],
        q_positions: Option<&[i32]>,
    ) -> Result<()> {
        element::require::<T>(self.geometry.dtype, "keys")?;
        check_kv_len(&self.geometry, "keys", k.len(), positions.len())?;
        let n_queries = query_count(&self.geometry, q.len(), q_positions)?;
        // SAFETY: live handle; the library checks both byte sizes against the counts.
        check(unsafe {
            sys::kvsdk_planner_feed_layer(
                self.raw.as_ptr(),
                layer,
                positions.len(),
                k.as_ptr().cast::<c_void>(),
                positions.as_ptr(),
                std::mem::size_of_val(k),
                n_queries,
                q.as_ptr().cast::<c_void>(),
                q_positions.map_or(ptr::null(), |p| p.as_ptr()),
                std::mem::size_of_val(q),
            )
        })
    }

    /// Rows per KV head for every layer, for `Cache::set_allocation`.
    pub fn finish(&mut self, target: AllocTarget) -> Result<Vec<u64>> {
        let n_layers = self.geometry.n_layers;
        let mut out = vec![0u64; n_layers as usize];
        let (mode, value) = target.raw();
        // SAFETY: live handle; `out` holds n_layers entries.
        check(unsafe {
            sys::kvsdk_planner_finish(self.raw.as_ptr(), mode, value, out.as_mut_ptr(), n_layers)
        })?;
        Ok(out)
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        // SAFETY: owned handle, released once.
        unsafe { sys::kvsdk_planner_destroy(self.raw.as_ptr()) }
    }
}
