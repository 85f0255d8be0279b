//! SpeCache on a cache: speculative prefetch, the fetch hit rate and a file-backed backing store
//! (header section "SpeCache: speculative prefetch and the off-budget backing store"). Every
//! call fails with Status::Unsupported for policies other than 'specache'.
use crate::cache::Cache;
use crate::element::Element;
use crate::error::{check, Error, Result};
use crate::sys;
use std::ffi::c_void;
use std::path::Path;

impl Cache {
    /// Keeps the full-precision backing store in the file `path` (created or truncated,
    /// mmap'ed; POSIX only) instead of host memory. Only before the first append.
    pub fn set_backing_file(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = crate::c_path(path.as_ref())?;
        // SAFETY: live handle, NUL-terminated path.
        check(unsafe { sys::kvsdk_cache_set_backing_file(self.as_ptr(), path.as_ptr()) })
    }

    /// Fetches, per KV head of `layer`, the fetch_tokens rows that the speculative token's
    /// queries `q` (one query: n_q_heads x head_dim) attend most, for the next attend.
    /// `q_position`: None (sees every token) or the speculative token's position. `q` is of
    /// the cache's element type.
    pub fn prefetch<T: Element>(
        &mut self,
        layer: u32,
        q: &[T],
        q_position: Option<i32>,
    ) -> Result<()> {
        self.require_element::<T>("queries")?;
        let per_query = self.geometry.q_elems_per_query();
        if q.len() != per_query {
            return Err(Error::invalid(format!(
                "queries: {} elements, expected one query of {per_query} (n_q_heads x head_dim)",
                q.len()
            )));
        }
        let pos = q_position.unwrap_or(0);
        // SAFETY: live handle; the library checks q_bytes against one query of the geometry.
        check(unsafe {
            sys::kvsdk_cache_prefetch(
                self.as_ptr(),
                layer,
                1,
                q.as_ptr().cast::<c_void>(),
                if q_position.is_some() { &pos } else { std::ptr::null() },
                std::mem::size_of_val(q),
            )
        })
    }

    /// The fetch hit rate (None before the first measurement) and the number of measurements.
    pub fn fetch_stats(&self) -> Result<(Option<f64>, u64)> {
        let (mut hit, mut samples) = (0f64, 0u64);
        // SAFETY: live handle, valid pointers.
        check(unsafe { sys::kvsdk_cache_fetch_stats(self.as_ptr(), &mut hit, &mut samples) })?;
        Ok(((hit >= 0.0).then_some(hit), samples))
    }
}
