//! Cache: one conversation's KV cache for one model geometry.
//!
//! Tensors (keys, values, queries, outputs) are slices of the cache's element type: `f32` for
//! `Dtype::F32`, [`F16`](crate::F16) for `Dtype::F16`, [`Bf16`](crate::Bf16) for `Dtype::Bf16`
//! (see [`Element`]). They are passed to the library bit-exactly and come back in the same
//! type; another element type, or a slice of the wrong length, is an `Err` with
//! `Status::InvalidArg` naming what was expected, and the cache is unchanged.
use crate::context::Context;
use crate::element::{self, Element};
use crate::error::{check, Error, Result};
use crate::geometry::Geometry;
use crate::policy::Policy;
use crate::stats::{CacheStats, LayerStats};
use crate::sys;
use std::ffi::c_void;
use std::mem::size_of;
use std::ptr::{self, NonNull};

/// An owned cache. It keeps its context alive on the library side, so it needs no borrow of
/// the [`Context`] it was created on.
#[derive(Debug)]
pub struct Cache {
    raw: NonNull<sys::kvsdk_cache>,
    pub(crate) geometry: Geometry,
}

// SAFETY: the header allows a cache to be used by one thread at a time, from any thread, so it
// may move between threads (Send). Concurrent use through shared references is not allowed, so
// it is not Sync.
unsafe impl Send for Cache {}

/// What one KV head of one layer holds, dense, in stored order (append order, which eviction
/// preserves); see `Cache::read`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeadData<T> {
    /// tokens x head_dim keys.
    pub keys: Vec<T>,
    /// tokens x head_dim values.
    pub values: Vec<T>,
    pub positions: Vec<i32>,
}

impl Cache {
    /// Creates an empty cache on `ctx` (kvsdk_cache_create).
    pub fn new(ctx: &Context, geometry: &Geometry, policy: &Policy) -> Result<Cache> {
        let raw_geometry = geometry.to_raw();
        let raw_policy = policy.to_raw();
        let mut out = ptr::null_mut();
        // SAFETY: live context, valid pointers.
        check(unsafe {
            sys::kvsdk_cache_create(&mut out, ctx.as_ptr(), &raw_geometry, &raw_policy)
        })?;
        let raw = NonNull::new(out).expect("kvsdk_cache_create returned NULL");
        let mut cache = Cache { raw, geometry: *geometry };
        cache.geometry = cache.geometry()?;
        Ok(cache)
    }

    /// Takes ownership of a raw handle (e.g. one a loader returned).
    ///
    /// # Safety
    /// `raw` is a live cache handle that nothing else releases.
    pub unsafe fn from_raw(raw: NonNull<sys::kvsdk_cache>) -> Result<Cache> {
        let mut cache = Cache { raw, geometry: Geometry::default() };
        cache.geometry = cache.geometry()?;
        Ok(cache)
    }

    /// An independent copy in the same context (kvsdk_cache_fork): it continues exactly as
    /// `self` would, and is charged to the context's budget. A SmallKV cache's copy needs its
    /// own proxy (`set_proxy`, e.g. with a fork of the original's proxy).
    pub fn fork(&self) -> Result<Cache> {
        let mut out = ptr::null_mut();
        // SAFETY: live handle, valid out pointer.
        check(unsafe { sys::kvsdk_cache_fork(&mut out, self.raw.as_ptr()) })?;
        let raw = NonNull::new(out).expect("kvsdk_cache_fork returned NULL");
        Ok(Cache { raw, geometry: self.geometry })
    }

    /// Freezes the cache (kvsdk_cache_freeze), e.g. a system prompt's, so that it can be the
    /// shared prefix of many conversations ([`Cache::on_prefix`]). Final and idempotent:
    /// afterwards attend, read, stats, save and fork work, and append, truncate, observe,
    /// compress and the other calls that change it fail with `Status::State`. Fails with
    /// `Status::Unsupported` for policies that cannot be shared (smallkv, specache).
    pub fn freeze(&mut self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvsdk_cache_freeze(self.raw.as_ptr()) })
    }

    /// A new, empty conversation continuing the frozen cache `prefix`
    /// (kvsdk_cache_create_on_prefix): it attends over the prefix's rows and then its own,
    /// without copying the prefix, in the prefix's context and geometry; `policy` applies to its
    /// own rows only. The prefix's bytes are charged once, to the prefix; the conversation's
    /// stats count only its own rows. Append its tokens at positions after the prefix's. The
    /// library keeps the prefix alive while conversations use it, so `prefix` may be dropped
    /// before them. Fails with `Status::State` if `prefix` is not frozen.
    pub fn on_prefix(prefix: &Cache, policy: &Policy) -> Result<Cache> {
        let raw_policy = policy.to_raw();
        let mut out = ptr::null_mut();
        // SAFETY: live prefix handle (only read by the call), valid pointers.
        check(unsafe {
            sys::kvsdk_cache_create_on_prefix(&mut out, prefix.raw.as_ptr(), &raw_policy)
        })?;
        let raw = NonNull::new(out).expect("kvsdk_cache_create_on_prefix returned NULL");
        Ok(Cache { raw, geometry: prefix.geometry })
    }

    /// Removes every token at `position` or later (kvsdk_cache_truncate), exactly or not at
    /// all: afterwards the cache holds what one that never received them would. Fails with
    /// `Status::State` (the cache unchanged) where the policy cannot be exact that far back;
    /// kvsdk.h lists each policy's reach.
    pub fn truncate(&mut self, position: i32) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvsdk_cache_truncate(self.raw.as_ptr(), position) })
    }

    /// The raw handle, still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::kvsdk_cache {
        self.raw.as_ptr()
    }

    /// The cache's geometry, as the library reports it (kvsdk_cache_geometry).
    pub fn geometry(&self) -> Result<Geometry> {
        let mut raw = Geometry::default().to_raw();
        // SAFETY: live handle, valid pointer with struct_size set.
        check(unsafe { sys::kvsdk_cache_geometry(self.raw.as_ptr(), &mut raw) })?;
        Ok(Geometry::from_raw(&raw))
    }

    /// Queries in a buffer of `q_len` elements: one per position when positions are given
    /// (then q_len must be positions x n_q_heads x head_dim), else q_len / (n_q_heads *
    /// head_dim), which must divide.
    pub(crate) fn query_count(&self, q_len: usize, q_positions: Option<&[i32]>) -> Result<usize> {
        query_count(&self.geometry, q_len, q_positions)
    }

    /// `Err(InvalidArg)` unless `T` is the cache's element type.
    pub(crate) fn require_element<T: Element>(&self, what: &str) -> Result<()> {
        element::require::<T>(self.geometry.dtype, what)
    }

    /// Appends `positions.len()` tokens to `layer`: `k` and `v` hold
    /// tokens x n_kv_heads x head_dim elements each (token-major, keys already rotated) of the
    /// cache's element type, stored bit-exactly. On error the cache is unchanged.
    pub fn append<T: Element>(
        &mut self,
        layer: u32,
        k: &[T],
        v: &[T],
        positions: &[i32],
    ) -> Result<()> {
        self.require_element::<T>("keys")?;
        check_kv_len(&self.geometry, "keys", k.len(), positions.len())?;
        check_kv_len(&self.geometry, "values", v.len(), positions.len())?;
        let kv_bytes = std::mem::size_of_val(k);
        // SAFETY: live handle; the library reads kv_bytes from k and v (it checks the size
        // against positions.len() and the geometry) and positions.len() positions.
        check(unsafe {
            sys::kvsdk_cache_append(
                self.raw.as_ptr(),
                layer,
                positions.len(),
                k.as_ptr().cast::<c_void>(),
                v.as_ptr().cast::<c_void>(),
                positions.as_ptr(),
                kv_bytes,
            )
        })
    }

    /// Attention of the queries in `q` (queries x n_q_heads x head_dim) over `layer`, written to
    /// `out` (same shape). `q_positions`: None (every query sees every token) or one position
    /// per query (causal). `q` and `out` are of the cache's element type (`out` gets the
    /// library's rounding of the f32 result to that type). On error `out` is untouched.
    pub fn attend_into<T: Element>(
        &mut self,
        layer: u32,
        q: &[T],
        q_positions: Option<&[i32]>,
        out: &mut [T],
    ) -> Result<()> {
        self.require_element::<T>("queries")?;
        let n_queries = self.query_count(q.len(), q_positions)?;
        if out.len() != q.len() {
            return Err(Error::invalid(format!(
                "out: {} elements, expected {} (as many as the queries)",
                out.len(),
                q.len()
            )));
        }
        let q_positions_ptr = q_positions.map_or(ptr::null(), |p| p.as_ptr());
        // SAFETY: live handle; the library checks q_bytes and out_bytes against n_queries and
        // the geometry before touching either buffer.
        check(unsafe {
            sys::kvsdk_cache_attend(
                self.raw.as_ptr(),
                layer,
                n_queries,
                q.as_ptr().cast::<c_void>(),
                q_positions_ptr,
                std::mem::size_of_val(q),
                out.as_mut_ptr().cast::<c_void>(),
                std::mem::size_of_val(out),
            )
        })
    }

    /// Like [`Cache::attend_into`], returning a new output buffer.
    pub fn attend<T: Element>(
        &mut self,
        layer: u32,
        q: &[T],
        q_positions: Option<&[i32]>,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); q.len()];
        self.attend_into(layer, q, q_positions, &mut out)?;
        Ok(out)
    }

    /// Number of tokens one KV head of one layer holds (kvsdk_cache_read's size query).
    pub fn token_count(&self, layer: u32, kv_head: u32) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: live handle; all buffers NULL = size query.
        check(unsafe {
            sys::kvsdk_cache_read(
                self.raw.as_ptr(),
                layer,
                kv_head,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
                0,
                &mut n,
            )
        })?;
        Ok(n)
    }

    /// Dense keys, values and positions of one KV head of one layer, in stored order (append
    /// order, which eviction preserves), as the cache's element type `T`.
    pub fn read<T: Element>(&self, layer: u32, kv_head: u32) -> Result<HeadData<T>> {
        self.require_element::<T>("read")?;
        let capacity = self.token_count(layer, kv_head)?;
        let head_dim = self.geometry.head_dim as usize;
        let mut data = HeadData {
            keys: vec![T::default(); capacity * head_dim],
            values: vec![T::default(); capacity * head_dim],
            positions: vec![0i32; capacity],
        };
        let mut n = 0usize;
        // SAFETY: live handle; buffers hold `capacity` tokens as the header requires.
        check(unsafe {
            sys::kvsdk_cache_read(
                self.raw.as_ptr(),
                layer,
                kv_head,
                data.keys.as_mut_ptr().cast::<c_void>(),
                data.values.as_mut_ptr().cast::<c_void>(),
                data.positions.as_mut_ptr(),
                capacity,
                &mut n,
            )
        })?;
        data.keys.truncate(n * head_dim);
        data.values.truncate(n * head_dim);
        data.positions.truncate(n);
        Ok(data)
    }

    /// Whole-cache stats (kvsdk_cache_stats_get).
    pub fn stats(&self) -> Result<CacheStats> {
        let mut raw = sys::kvsdk_cache_stats::default();
        // SAFETY: valid pointer; the init sets struct_size.
        let size = size_of::<sys::kvsdk_cache_stats>();
        check(unsafe { sys::kvsdk_cache_stats_init_sized(&mut raw, size) })?;
        // SAFETY: live handle, valid pointer with struct_size set.
        check(unsafe { sys::kvsdk_cache_stats_get(self.raw.as_ptr(), &mut raw) })?;
        Ok(CacheStats::from_raw(&raw))
    }

    /// One layer's stats (kvsdk_cache_layer_stats_get).
    pub fn layer_stats(&self, layer: u32) -> Result<LayerStats> {
        let mut raw = sys::kvsdk_layer_stats::default();
        // SAFETY: valid pointer; the init sets struct_size.
        let size = size_of::<sys::kvsdk_layer_stats>();
        check(unsafe { sys::kvsdk_layer_stats_init_sized(&mut raw, size) })?;
        // SAFETY: live handle, valid pointer with struct_size set.
        check(unsafe { sys::kvsdk_cache_layer_stats_get(self.raw.as_ptr(), layer, &mut raw) })?;
        Ok(LayerStats::from_raw(&raw))
    }
}

/// See [`Cache::query_count`]; shared with the planner.
pub(crate) fn query_count(
    g: &Geometry,
    q_len: usize,
    q_positions: Option<&[i32]>,
) -> Result<usize> {
    let per_query = g.q_elems_per_query();
    match q_positions {
        Some(p) if q_len == p.len() * per_query => Ok(p.len()),
        Some(p) => Err(Error::invalid(format!(
            "queries: {q_len} elements for {} query positions, expected {} (queries x \
             n_q_heads x head_dim)",
            p.len(),
            p.len() * per_query
        ))),
        None if per_query > 0 && q_len % per_query == 0 => Ok(q_len / per_query),
        None => Err(Error::invalid(format!(
            "queries: {q_len} elements are not a whole number of queries of {per_query} \
             (n_q_heads x head_dim)"
        ))),
    }
}

/// `len` keys (or values) must hold `tokens` tokens: tokens x n_kv_heads x head_dim.
pub(crate) fn check_kv_len(g: &Geometry, what: &str, len: usize, tokens: usize) -> Result<()> {
    let expected = tokens * g.kv_elems_per_token();
    if len == expected {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{what}: {len} elements for {tokens} tokens, expected {expected} (tokens x n_kv_heads x \
         head_dim = {tokens} x {} x {})",
        g.n_kv_heads, g.head_dim
    )))
}

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: owned handle, released once.
        unsafe { sys::kvsdk_cache_destroy(self.raw.as_ptr()) }
    }
}
