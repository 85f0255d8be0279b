"""SpeCache on a cache: speculative prefetch, the fetch hit rate and a file-backed backing store
(header section "SpeCache: speculative prefetch and the off-budget backing store"). Mixed into
kvsdk.Cache; every call raises KvsdkError(UNSUPPORTED) for policies other than 'specache'."""
import ctypes

from . import buffers
from ._capi import lib
from .errors import check, invalid


class SpeCacheMixin:
    def set_backing_file(self, path):
        """Keeps the full-precision backing store in the file `path` (created or truncated,
        mmap'ed; POSIX only). Only before the first append."""
        check(lib.kvsdk_cache_set_backing_file(self.handle, str(path).encode()))

    def prefetch(self, layer, q, q_position=None):
        """Fetches, per KV head of `layer`, the fetch_tokens rows the speculative token's
        queries `q` (one query: n_q_heads x head_dim) attend most, for the next attend.
        q_position: None (sees every token) or the speculative token's position. `q` follows
        the dtype rules of kvsdk.Cache.append (the cache's dtype, bit-exact)."""
        qb = self._queries(q)
        per_query = self._geometry.q_elems_per_query
        if qb.count != per_query:
            raise invalid(f"queries: {qb.count} elements, expected one query of {per_query} "
                          f"(n_q_heads x head_dim)")
        pb = None if q_position is None else buffers.positions([q_position], "q_position")
        check(lib.kvsdk_cache_prefetch(self.handle, layer, 1, qb.ptr, pb and pb.as_int32_ptr(),
                                       qb.nbytes))

    def fetch_stats(self):
        """(hit rate in [0, 1] or None before the first measurement, measurements)."""
        hit, samples = ctypes.c_double(), ctypes.c_uint64()
        check(lib.kvsdk_cache_fetch_stats(self.handle, ctypes.byref(hit), ctypes.byref(samples)))
        return (None if hit.value < 0 else hit.value), samples.value
