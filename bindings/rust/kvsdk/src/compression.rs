//! Compression on a cache: observe queries, compress to the budget, per-cache budgets and
//! allocations (header section "Compression: observe, compress, plan").
use crate::cache::Cache;
use crate::element::Element;
use crate::error::{check, Error, Result};
use crate::planning::Profile;
use crate::sys;
use std::ffi::c_void;
use std::ptr;

impl Cache {
    /// Feeds the queries in `q` (queries x n_q_heads x head_dim) of `layer` to the policy's
    /// importance signal (kvsdk_cache_observe). `q_positions`: None (queries see every key) or
    /// one position per query (causal). `q` is of the cache's element type. On error the
    /// cache is unchanged.
    pub fn observe<T: Element>(
        &mut self,
        layer: u32,
        q: &[T],
        q_positions: Option<&[i32]>,
    ) -> Result<()> {
        self.require_element::<T>("queries")?;
        let n_queries = self.query_count(q.len(), q_positions)?;
        // SAFETY: live handle; the library checks q_bytes against n_queries and the geometry.
        check(unsafe {
            sys::kvsdk_cache_observe(
                self.as_ptr(),
                layer,
                n_queries,
                q.as_ptr().cast::<c_void>(),
                q_positions.map_or(ptr::null(), |p| p.as_ptr()),
                std::mem::size_of_val(q),
            )
        })
    }

    /// Enforces the budget (and an applied allocation or profile) now (kvsdk_cache_compress).
    pub fn compress(&mut self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvsdk_cache_compress(self.as_ptr()) })
    }

    /// Sets a byte budget for this cache alone (0 removes it); compresses now if needed.
    pub fn set_budget(&mut self, budget_bytes: u64) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvsdk_cache_set_budget(self.as_ptr(), budget_bytes) })
    }

    /// Layer-tokens the budget can hold besides fixed metadata (None: no budget applies), and
    /// the bytes of one layer-token.
    pub fn token_capacity(&self) -> Result<(Option<u64>, u64)> {
        let (mut tokens, mut token_bytes) = (0u64, 0u64);
        // SAFETY: live handle, valid pointers.
        check(unsafe {
            sys::kvsdk_cache_token_capacity(self.as_ptr(), &mut tokens, &mut token_bytes)
        })?;
        Ok(((tokens != u64::MAX).then_some(tokens), token_bytes))
    }

    /// Rows per KV head that each layer holds now (one entry per layer).
    pub fn allocation(&self) -> Result<Vec<u64>> {
        let n_layers = self.geometry.n_layers;
        let mut tokens = vec![0u64; n_layers as usize];
        // SAFETY: live handle; `tokens` holds n_layers entries.
        check(unsafe {
            sys::kvsdk_cache_allocation(self.as_ptr(), tokens.as_mut_ptr(), n_layers)
        })?;
        Ok(tokens)
    }

    /// Fixes the rows per KV head of every layer (`Some`, one entry per layer) or returns to the
    /// policy's own allocation (`None`); compresses now.
    pub fn set_allocation(&mut self, tokens: Option<&[u64]>) -> Result<()> {
        let (ptr, n) = match tokens {
            Some(t) => {
                (t.as_ptr(), u32::try_from(t.len()).map_err(|_| Error::invalid("too many layers"))?)
            }
            None => (ptr::null(), 0),
        };
        // SAFETY: live handle; `ptr` holds `n` entries or is NULL with n 0.
        check(unsafe { sys::kvsdk_cache_set_allocation(self.as_ptr(), ptr, n) })
    }

    /// Applies an allocation profile (`None`: back to the policy's own allocation). The cache
    /// copies the shares, so the profile may be dropped afterwards.
    pub fn apply_profile(&mut self, profile: Option<&Profile>) -> Result<()> {
        let raw = profile.map_or(ptr::null(), |p| p.as_ptr() as *const sys::kvsdk_profile);
        // SAFETY: live handles (or NULL).
        check(unsafe { sys::kvsdk_cache_apply_profile(self.as_ptr(), raw) })
    }
}
