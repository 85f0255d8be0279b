"""kvsdk for Python: the on-device KV cache SDK over its C ABI (ctypes, no compiled extension).

    import kvsdk
    ctx = kvsdk.Context(budget_bytes=1 << 20)
    geometry = kvsdk.Geometry(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=4)
    with kvsdk.Cache(ctx, geometry, kvsdk.Policy.parse("full")) as cache:
        cache.append(0, [0.5] * 4, [1.0] * 4, [0])
        out = cache.attend(0, [1.0] * 8)        # array('f', [1.0, ...])

Every failure raises kvsdk.KvsdkError with .status (kvsdk.Status) and .message.

Tensors are passed in the cache's dtype, bit-exactly, never converted: an F16 cache takes numpy
float16 arrays (or F16Bits / array.array('H') bit patterns), a BF16 cache BF16Bits (numpy has no
bfloat16); a wrong dtype raises KvsdkError(INVALID_ARG) naming the expected one. See
kvsdk.buffers for the rules and bindings/python/README.md.
"""
from . import buffers
from ._capi import KVSDK_VERSION_NUMBER as HEADER_VERSION
from ._capi import lib as _lib
from .cache import Cache, HeadData
from .context import Context
from .planning import AllocMode, Planner, Profile, plan_allocation
from .errors import KvsdkError, Status, status_str
from .half import BF16Bits, F16Bits
from .snapshot import FORMAT_VERSION as SNAPSHOT_FORMAT
from .snapshot import LoadInfo, SaveOptions
from .structs import (Backend, CacheStats, ContextOptions, Dtype, Geometry, LayerStats, Method,
                    PoolKind, Policy, RopeStyle, Tier, method_name)


def version():
    """Run-time version of the loaded library (major * 10000 + minor * 100 + patch)."""
    return _lib.kvsdk_version()


def version_string():
    return _lib.kvsdk_version_string().decode()


__all__ = ["AllocMode", "BF16Bits", "Backend", "Cache", "CacheStats", "Context",
           "ContextOptions", "Dtype", "F16Bits", "Geometry", "HEADER_VERSION", "HeadData", "KvsdkError", "LayerStats",
           "LoadInfo", "Method", "Planner", "Policy", "PoolKind", "Profile",
           "RopeStyle", "SNAPSHOT_FORMAT", "SaveOptions", "Status", "Tier", "buffers",
           "method_name", "plan_allocation", "status_str", "version", "version_string"]
