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
}

impl Drop for ProxyLink<'_> {
    fn drop(&mut self) {
        // SAFETY: live cache; detaching cannot fail for a smallkv cache.
        unsafe { sys::kvsdk_cache_set_proxy(self.large.as_ptr(), ptr::null_mut()) };
    }
}
