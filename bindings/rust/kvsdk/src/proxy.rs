//! SmallKV: a smallkv cache linked to the 'full' cache of a smaller model (kvsdk_cache_set_proxy).
use crate::cache::Cache;
use crate::error::{check, Result};
use crate::sys;
use std::ptr;

/// A smallkv cache and its proxy while they are linked. The link borrows both caches, so the
/// proxy outlives its use; reach them through [`ProxyLink::large`] and [`ProxyLink::proxy`] (run
/// the proxy's step first, then the large cache's). Dropping the link detaches the proxy.
#[derive(Debug)]
pub struct ProxyLink<'a> {
    large: &'a mut Cache,
    proxy: &'a mut Cache,
}

impl<'a> ProxyLink<'a> {
    /// Links `proxy` (policy 'full', fed the same tokens at the same positions) to `large`
    /// (policy 'smallkv').
    pub fn new(large: &'a mut Cache, proxy: &'a mut Cache) -> Result<ProxyLink<'a>> {
        // SAFETY: two live, distinct caches (the borrows are exclusive).
        check(unsafe { sys::kvsdk_cache_set_proxy(large.as_ptr(), proxy.as_ptr()) })?;
        Ok(ProxyLink { large, proxy })
    }

    /// The smallkv cache.
    pub fn large(&mut self) -> &mut Cache {
        self.large
    }

    /// The proxy's full cache.
    pub fn proxy(&mut self) -> &mut Cache {
        self.proxy
    }

    /// Both caches at once, e.g. to run the proxy's step on another thread
    /// (`std::thread::scope`) while the large cache runs the same step, after
    /// [`ProxyLink::set_wait`].
    pub fn both(&mut self) -> (&mut Cache, &mut Cache) {
        (self.large, self.proxy)
    }

    /// Lets the proxy run each step on its own thread, in parallel with the large cache
    /// (kvsdk_cache_set_proxy_wait): the large cache's calls wait up to `timeout_ms` for the
    /// proxy's attention of the same positions; 0 turns it off. Results are the same as with the
    /// proxy's step first. The header's rules apply: one step at a time (join the proxy's thread
    /// before the next step), positions passed to both caches.
    pub fn set_wait(&mut self, timeout_ms: u32) -> Result<()> {
        // SAFETY: live cache.
        check(unsafe { sys::kvsdk_cache_set_proxy_wait(self.large.as_ptr(), timeout_ms) })
    }
}

impl Drop for ProxyLink<'_> {
    fn drop(&mut self) {
        // SAFETY: live cache; detaching cannot fail for a smallkv cache.
        unsafe { sys::kvsdk_cache_set_proxy(self.large.as_ptr(), ptr::null_mut()) };
    }
}
