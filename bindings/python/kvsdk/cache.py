"""Cache: one conversation's KV cache for one model geometry.

Threading (the header's contract): one thread at a time per cache; distinct caches may be used
concurrently.

Tensors (see kvsdk.buffers for the full rules): keys, values and queries must already be in the
cache's dtype -- F32: numpy float32, array.array('f') or Python numbers; F16: numpy float16,
array.array('H') / ints / kvsdk.F16Bits of bit patterns; BF16: kvsdk.BF16Bits, array.array('H')
or ints (bit patterns). They are passed to the library bit-exactly; nothing is converted, and
anything else (float64, float32 on a half cache, integer arrays, wrong sizes or shapes,
non-contiguous arrays) raises KvsdkError(INVALID_ARG) naming the expected dtype, with the cache
unchanged. Outputs come back in the cache's dtype: numpy float32 / float16 / uint16 (bf16 bits)
arrays for numpy input, else array.array('f') / array.array('H').
"""
import ctypes

from . import _capi, buffers
from .compression import CompressionMixin
from .snapshot import SnapshotMixin
from .specache import SpeCacheMixin
from ._capi import lib
from .errors import check, invalid
from .owned import OwnedHandle
from .structs import CacheStats, Geometry, LayerStats, Policy, _initialised_sized


class HeadData:
    """Dense keys and values (tokens x head_dim each) and positions of one KV head."""

    def __init__(self, keys, values, positions):
        self.keys, self.values, self.positions = keys, values, positions


class Cache(OwnedHandle, CompressionMixin, SnapshotMixin, SpeCacheMixin):
    """An owned kvsdk_cache, released by close(), by `with`, or when garbage-collected."""

    @staticmethod
    def _destroy(handle):
        lib.kvsdk_cache_destroy(handle)

    def __init__(self, context, geometry, policy=None):
        if policy is None:
            policy = Policy.parse("full")
        raw_geometry, raw_policy = geometry.to_c(), policy.to_c()
        handle = ctypes.c_void_p()
        check(lib.kvsdk_cache_create(ctypes.byref(handle), context.handle,
                                     ctypes.byref(raw_geometry), ctypes.byref(raw_policy)))
        self._adopt(handle)

    def fork(self):
        """An independent copy in the same context (kvsdk_cache_fork): it continues exactly as
        this cache would, and is charged to the context's budget. A SmallKV cache's copy needs
        its own proxy (set_proxy, e.g. with a fork of the original's proxy)."""
        handle = ctypes.c_void_p()
        check(lib.kvsdk_cache_fork(ctypes.byref(handle), self.handle))
        copy = type(self)._from_handle(handle)
        copy._prefix = getattr(self, "_prefix", None)  # a fork shares the shared prefix
        return copy

    def freeze(self):
        """Freezes this cache (kvsdk_cache_freeze), e.g. a system prompt's, so that it can be the
        shared prefix of many conversations (Cache.on_prefix). Final and idempotent; afterwards
        attend, read, stats, save and fork work, and append, truncate, observe, compress and the
        other calls that change it raise KvsdkError(STATE). Raises KvsdkError(UNSUPPORTED) for
        policies that cannot be shared (smallkv, specache)."""
        check(lib.kvsdk_cache_freeze(self.handle))

    @classmethod
    def on_prefix(cls, prefix, policy=None):
        """A new, empty conversation continuing the frozen cache `prefix`
        (kvsdk_cache_create_on_prefix): it attends over the prefix's rows and then its own,
        without copying the prefix, in the prefix's context and geometry. `policy` (None: full)
        applies to its own rows only. The prefix's bytes are charged once, to the prefix; the
        conversation's stats count only its own rows. Append its tokens at positions after the
        prefix's. Raises KvsdkError(STATE) if `prefix` is not frozen. The library keeps the
        prefix alive while conversations use it; the new Cache also keeps the `prefix` object."""
        if not isinstance(prefix, Cache):
            raise invalid(f"prefix must be a kvsdk.Cache, got {type(prefix).__name__}")
        raw_policy = None if policy is None else policy.to_c()
        handle = ctypes.c_void_p()
        check(lib.kvsdk_cache_create_on_prefix(
            ctypes.byref(handle), prefix.handle,
            None if raw_policy is None else ctypes.byref(raw_policy)))
        cache = cls._from_handle(handle)
        cache._prefix = prefix
        return cache

    def truncate(self, position):
        """Removes every token at `position` or later (kvsdk_cache_truncate), exactly or not at
        all: afterwards the cache holds what one that never received them would. Raises
        KvsdkError with status STATE (the cache unchanged) where the policy cannot be exact
        that far back; kvsdk.h lists each policy's reach."""
        position = int(position)
        if not -2**31 <= position < 2**31:
            raise ValueError(f"position {position} does not fit an int32")
        check(lib.kvsdk_cache_truncate(self.handle, position))

    @classmethod
    def _from_handle(cls, handle):
        """Takes ownership of a raw handle returned by the library (e.g. a loader)."""
        cache = cls.__new__(cls)
        cache._adopt(handle)
        return cache

    def _adopt(self, handle):
        self._handle = handle
        self._geometry = self.geometry
        self._dtype = buffers.dtype_of(self._geometry.dtype)

    def _tensor(self, data, what, heads):
        return buffers.tensor(data, self._dtype, what, heads, self._geometry.head_dim)

    def _kv(self, data, what):
        return self._tensor(data, what, self._geometry.n_kv_heads)

    def _queries(self, data, what="queries"):
        return self._tensor(data, what, self._geometry.n_q_heads)

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("kvsdk.Cache is closed")
        return self._handle

    @property
    def geometry(self):
        raw = _capi.kvsdk_geometry()
        raw.struct_size = ctypes.sizeof(raw)
        check(lib.kvsdk_cache_geometry(self.handle, ctypes.byref(raw)))
        return Geometry.from_c(raw)

    def _query_count(self, qb, q_positions):
        """(number of queries, positions Buffer or None): one query per position when
        positions are given (the library checks the byte size), else whole queries in `qb`.
        The caller keeps the Buffer alive while the library uses its pointer."""
        per_query = self._geometry.q_elems_per_query
        if q_positions is not None:
            pb = buffers.positions(q_positions, "q_positions")
            if qb.count != pb.count * per_query:
                raise invalid(f"queries: {qb.count} elements for {pb.count} q_positions, "
                              f"expected {pb.count * per_query} (queries x n_q_heads x "
                              f"head_dim)")
            return pb.count, pb
        if per_query and qb.count % per_query == 0:
            return qb.count // per_query, None
        raise invalid(f"queries: {qb.count} elements are not a whole number of queries of "
                      f"{per_query} (n_q_heads x head_dim)")

    def append(self, layer, k, v, positions):
        """Appends len(positions) tokens to `layer`; k and v hold
        tokens x n_kv_heads x head_dim elements (token-major, keys already rotated) of the
        cache's dtype (see the module docstring), stored bit-exactly."""
        kb, vb = self._kv(k, "keys"), self._kv(v, "values")
        pb = buffers.positions(positions)
        g = self._geometry
        expected = pb.count * g.kv_elems_per_token
        for what, b in (("keys", kb), ("values", vb)):
            if b.count != expected:
                raise invalid(f"{what}: {b.count} elements for {pb.count} tokens, expected "
                              f"{expected} (tokens x n_kv_heads x head_dim = {pb.count} x "
                              f"{g.n_kv_heads} x {g.head_dim})")
        check(lib.kvsdk_cache_append(self.handle, layer, pb.count, kb.ptr, vb.ptr,
                                     pb.as_int32_ptr(), kb.nbytes))

    def attend(self, layer, q, q_positions=None, out=None):
        """Attention of queries `q` (queries x n_q_heads x head_dim) over `layer`.
        q_positions: None (every query sees every token) or one position per query (causal).
        Returns `out`: when None, a new buffer in the cache's dtype (numpy float32 / float16 /
        uint16 bf16 bits if `q` is numpy, else array.array('f') / array.array('H')); else the
        given writable buffer of that type, filled."""
        qb = self._queries(q)
        n_queries, pb = self._query_count(qb, q_positions)
        if out is None:
            ob = buffers.output(self._dtype, qb.count, qb.numpy)
        else:
            ob = buffers.out_buffer(out, self._dtype, "out", self._geometry.n_q_heads,
                                    self._geometry.head_dim)
            if ob.count != qb.count:
                raise invalid(f"out: {ob.count} elements, expected {qb.count} (as many as the "
                              f"queries)")
        check(lib.kvsdk_cache_attend(self.handle, layer, n_queries, qb.ptr,
                                     pb and pb.as_int32_ptr(), qb.nbytes, ob.ptr, ob.nbytes))
        return ob.obj

    def token_count(self, layer, kv_head):
        """Tokens one KV head of one layer holds."""
        n = ctypes.c_size_t()
        check(lib.kvsdk_cache_read(self.handle, layer, kv_head, None, None, None, 0,
                                   ctypes.byref(n)))
        return n.value

    def read(self, layer, kv_head, numpy=False):
        """Dense keys, values and positions of one KV head, in stored order (append order,
        which eviction preserves). Keys and values (tokens x head_dim, flat) come back in the
        cache's dtype: with numpy=True numpy float32 / float16 / uint16 (bf16 bits) arrays and
        int32 positions, else array.array('f') / array.array('H') and array.array('i')."""
        capacity = self.token_count(layer, kv_head)
        d = self._geometry.head_dim
        kb = buffers.output(self._dtype, capacity * d, numpy)
        vb = buffers.output(self._dtype, capacity * d, numpy)
        pb = buffers.int32_output(capacity, numpy)
        if capacity:
            n = ctypes.c_size_t()
            check(lib.kvsdk_cache_read(self.handle, layer, kv_head, kb.ptr, vb.ptr,
                                       pb.as_int32_ptr(), capacity, ctypes.byref(n)))
            assert n.value == capacity
        return HeadData(kb.obj, vb.obj, pb.obj)

    def stats(self):
        raw = _initialised_sized(_capi.kvsdk_cache_stats, lib.kvsdk_cache_stats_init_sized)
        check(lib.kvsdk_cache_stats_get(self.handle, ctypes.byref(raw)))
        return CacheStats.from_c(raw)

    def layer_stats(self, layer):
        raw = _initialised_sized(_capi.kvsdk_layer_stats, lib.kvsdk_layer_stats_init_sized)
        check(lib.kvsdk_cache_layer_stats_get(self.handle, layer, ctypes.byref(raw)))
        return LayerStats.from_c(raw)

    def set_proxy(self, proxy):
        """SmallKV: links `proxy` (a 'full' cache of a smaller model fed the same tokens, run just
        before this one) or detaches it (None). This cache keeps a reference to the proxy object
        while linked, so the proxy outlives its use; closing either cache detaches the link."""
        check(lib.kvsdk_cache_set_proxy(self.handle, proxy.handle if proxy is not None else None))
        self._proxy = proxy

    def set_proxy_wait(self, timeout_ms):
        """SmallKV: lets the proxy run each step on another thread, in parallel with this cache
        (kvsdk_cache_set_proxy_wait): this cache's calls wait up to `timeout_ms` milliseconds for
        the proxy's attention of the same positions (0: never, the proxy runs first). Outputs are
        the same as with the proxy's step first. One step at a time: join the proxy's thread
        before this cache's next step; pass positions to both caches."""
        timeout_ms = int(timeout_ms)
        if not 0 <= timeout_ms < 2**32:
            raise ValueError(f"timeout_ms {timeout_ms} does not fit a uint32")
        check(lib.kvsdk_cache_set_proxy_wait(self.handle, timeout_ms))
