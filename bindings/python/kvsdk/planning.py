"""Allocation planning without a cache: the XKV greedy allocation, allocation profiles and the
mini-prefill planner (header section "Compression: observe, compress, plan")."""
import ctypes
import enum
import os

from . import buffers
from ._capi import lib
from .compression import _uint64_array
from .errors import check, invalid
from .owned import OwnedHandle


class AllocMode(enum.IntEnum):
    TOTAL_TOKENS = 0  # value = N: place exactly min(N, sum of lengths)
    TARGET_RETENTION = 1  # value = R_avg in (0, 1]: the smallest total reaching it


def _path(path):
    return os.fsencode(path)


def plan_allocation(importance, mode, value):
    """XKV greedy allocation: tokens each layer keeps, given one importance vector per layer
    (numpy float32 arrays, array.array('f') or sequences of numbers, each rounded to float32;
    other numpy dtypes are refused)."""
    vectors = [buffers.floats(w, f"importance[{i}]") for i, w in enumerate(importance)]
    n = len(vectors)
    pointers = (ctypes.POINTER(ctypes.c_float) * n)(
        *[ctypes.cast(v.ptr, ctypes.POINTER(ctypes.c_float)) for v in vectors])
    lengths = (ctypes.c_size_t * n)(*[v.count for v in vectors])
    out = (ctypes.c_uint64 * n)()
    check(lib.kvsdk_plan_allocation(n, pointers, lengths, int(mode), float(value), out))
    return list(out)


class Profile(OwnedHandle):
    """An allocation profile (averaged per-layer shares of sample requests of one task type).
    One thread at a time. Released by close(), `with`, or garbage collection."""

    @staticmethod
    def _destroy(handle):
        lib.kvsdk_profile_destroy(handle)

    def __init__(self, n_layers):
        handle = ctypes.c_void_p()
        check(lib.kvsdk_profile_create(ctypes.byref(handle), n_layers))
        self._handle, self.n_layers = handle, n_layers

    @classmethod
    def load(cls, path, n_layers):
        """Loads a saved profile for a model of `n_layers` layers (the header has no query for
        a profile's layer count; a mismatch raises INVALID_ARG)."""
        handle = ctypes.c_void_p()
        check(lib.kvsdk_profile_load(ctypes.byref(handle), _path(path)))
        profile = cls.__new__(cls)
        profile._handle, profile.n_layers = handle, n_layers
        try:
            profile.shares()
        except Exception:
            profile.close()
            raise
        return profile

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("kvsdk.Profile is closed")
        return self._handle

    def record(self, tokens):
        """Records the allocation list (tokens per layer) of one sample request."""
        array, n = _uint64_array(tokens)
        check(lib.kvsdk_profile_record(self.handle, array, n))

    def shares(self):
        """(averaged shares per layer, summing to 1; number of recorded samples)."""
        shares = (ctypes.c_double * self.n_layers)()
        samples = ctypes.c_uint32()
        check(lib.kvsdk_profile_shares(self.handle, shares, self.n_layers, ctypes.byref(samples)))
        return list(shares), samples.value

    def save(self, path):
        check(lib.kvsdk_profile_save(self.handle, _path(path)))



class Planner(OwnedHandle):
    """The mini-prefill planner: scores each layer's keys and window queries in a cache-free pass
    and returns the allocation for the real prefill. One thread at a time."""

    @staticmethod
    def _destroy(handle):
        lib.kvsdk_planner_destroy(handle)

    def __init__(self, geometry, policy):
        raw_geometry, raw_policy = geometry.to_c(), policy.to_c()
        handle = ctypes.c_void_p()
        check(lib.kvsdk_planner_create(ctypes.byref(handle), ctypes.byref(raw_geometry),
                                       ctypes.byref(raw_policy)))
        self._handle, self._geometry = handle, geometry
        self._dtype = buffers.dtype_of(geometry.dtype)

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("kvsdk.Planner is closed")
        return self._handle

    def feed_layer(self, layer, k, positions, q, q_positions=None):
        """Scores one layer: keys `k` at `positions`, window queries `q` at `q_positions`.
        `k` and `q` follow the dtype rules of kvsdk.Cache.append for the planner's geometry
        dtype (bit-exact, nothing converted)."""
        g = self._geometry
        kb = buffers.tensor(k, self._dtype, "keys", g.n_kv_heads, g.head_dim)
        pb = buffers.positions(positions)
        qb = buffers.tensor(q, self._dtype, "queries", g.n_q_heads, g.head_dim)
        if kb.count != pb.count * g.kv_elems_per_token:
            raise invalid(f"keys: {kb.count} elements for {pb.count} tokens, expected "
                          f"{pb.count * g.kv_elems_per_token} (tokens x n_kv_heads x head_dim)")
        per_query = g.q_elems_per_query
        if q_positions is not None:
            qpb = buffers.positions(q_positions, "q_positions")
            if qb.count != qpb.count * per_query:
                raise invalid(f"queries: {qb.count} elements for {qpb.count} q_positions, "
                              f"expected {qpb.count * per_query}")
            n_queries, qpos_ptr = qpb.count, qpb.as_int32_ptr()
        elif per_query and qb.count % per_query == 0:
            n_queries, qpos_ptr = qb.count // per_query, None
        else:
            raise invalid("query elements are not a whole number of queries")
        check(lib.kvsdk_planner_feed_layer(self.handle, layer, pb.count, kb.ptr,
                                           pb.as_int32_ptr(), kb.nbytes, n_queries, qb.ptr,
                                           qpos_ptr, qb.nbytes))

    def finish(self, mode, value):
        """Rows per KV head for every layer, for Cache.set_allocation."""
        n = self._geometry.n_layers
        out = (ctypes.c_uint64 * n)()
        check(lib.kvsdk_planner_finish(self.handle, int(mode), float(value), out, n))
        return list(out)
