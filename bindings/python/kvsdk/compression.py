"""Compression on a cache: observe queries, compress to the budget, per-cache budgets and
allocations (header section "Compression: observe, compress, plan"). Mixed into kvsdk.Cache."""
import ctypes

from ._capi import lib
from .errors import check

UINT64_MAX = 2 ** 64 - 1


def _uint64_array(values):
    values = list(values)
    return (ctypes.c_uint64 * len(values))(*values), len(values)


class CompressionMixin:
    def observe(self, layer, q, q_positions=None):
        """Feeds queries `q` (queries x n_q_heads x head_dim) of `layer` to the policy's
        importance signal. q_positions: None (queries see every key) or one per query.
        `q` follows the dtype rules of kvsdk.Cache.append (the cache's dtype, bit-exact)."""
        qb = self._queries(q)
        n_queries, pb = self._query_count(qb, q_positions)
        check(lib.kvsdk_cache_observe(self.handle, layer, n_queries, qb.ptr,
                                      pb and pb.as_int32_ptr(), qb.nbytes))

    def compress(self):
        """Enforces the budget (and an applied allocation or profile) now."""
        check(lib.kvsdk_cache_compress(self.handle))

    def set_budget(self, budget_bytes):
        """A byte budget for this cache alone (0 removes it); compresses now if needed."""
        check(lib.kvsdk_cache_set_budget(self.handle, budget_bytes))

    def token_capacity(self):
        """(layer-tokens the budget holds besides fixed metadata, or None without a budget;
        bytes of one layer-token)."""
        tokens, token_bytes = ctypes.c_uint64(), ctypes.c_uint64()
        check(lib.kvsdk_cache_token_capacity(self.handle, ctypes.byref(tokens),
                                             ctypes.byref(token_bytes)))
        return (None if tokens.value == UINT64_MAX else tokens.value), token_bytes.value

    def allocation(self):
        """Rows per KV head that each layer holds now."""
        n = self._geometry.n_layers
        out = (ctypes.c_uint64 * n)()
        check(lib.kvsdk_cache_allocation(self.handle, out, n))
        return list(out)

    def set_allocation(self, tokens):
        """Fixes the rows per KV head of every layer (one entry per layer), or returns to the
        policy's own allocation (None); compresses now."""
        if tokens is None:
            check(lib.kvsdk_cache_set_allocation(self.handle, None, 0))
            return
        array, n = _uint64_array(tokens)
        check(lib.kvsdk_cache_set_allocation(self.handle, array, n))

    def apply_profile(self, profile):
        """Applies an allocation profile (None: back to the policy's own allocation)."""
        check(lib.kvsdk_cache_apply_profile(self.handle,
                                            None if profile is None else profile.handle))

