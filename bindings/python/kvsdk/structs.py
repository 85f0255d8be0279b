"""Enumerations and value types of the header: options, geometry, policy, stats.

Each value type converts to and from its ctypes struct (to_c / from_c); defaults come from the
library's *_init functions, never from copies of their numbers.
"""
import ctypes
import dataclasses
import enum
import typing

from . import _capi
from ._capi import lib
from .errors import check, invalid


class Backend(enum.IntEnum):
    CPU = 0
    CUDA = 1
    CPU_REFERENCE = 2


class Dtype(enum.IntEnum):
    F32 = 0
    F16 = 1  # IEEE binary16 bits in uint16
    BF16 = 2  # bfloat16 bits in uint16


class RopeStyle(enum.IntEnum):
    NONE = 0
    INTERLEAVED = 1
    HALF = 2


class Method(enum.IntEnum):
    FULL = 0
    STREAMING_LLM = 1
    H2O = 2
    SNAPKV = 3
    PYRAMIDKV = 4
    XKV = 5
    KIVI = 6
    SPINDLEKV = 7
    MINICACHE = 8
    SMALLKV = 9
    SPECACHE = 10


class PoolKind(enum.IntEnum):
    MAX = 0
    AVG = 1


class Tier(enum.IntEnum):
    EXACT = 0
    QUANTIZED = 1
    CODEBOOK = 2
    MERGED = 3
    VALUE_ONLY = 4
    METADATA = 5


def method_name(method):
    """Canonical lower-case name of a method, or None if `method` is not one."""
    name = lib.kvsdk_method_name(int(method))
    return None if name is None else name.decode()


def _from_c(cls, raw, enums=None):
    """Builds dataclass `cls` from ctypes struct `raw` (fields of the same names)."""
    values = {}
    for f in dataclasses.fields(cls):
        v = getattr(raw, f.name)
        if isinstance(v, ctypes.Array):
            v = tuple(v)
        if enums and f.name in enums:
            try:
                v = enums[f.name](v)
            except ValueError:
                pass  # a value from a newer library stays an int
        values[f.name] = v
    return cls(**values)


def _to_c(value, ctype):
    raw = ctype()
    raw.struct_size = ctypes.sizeof(ctype)
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        setattr(raw, f.name, int(v) if isinstance(v, enum.Enum) else v)
    return raw


def _initialised_sized(ctype, init_sized, *args):
    """A struct filled by a kvsdk_*_init_sized function (or kvsdk_policy_parse_sized), told this
    binding's size of it so that a library with a larger struct never writes past ours (kvsdk.h,
    ABI rules)."""
    raw = ctype()
    check(init_sized(ctypes.byref(raw), ctypes.sizeof(ctype), *args))
    return raw


@dataclasses.dataclass
class ContextOptions:
    """kvsdk_context_options; defaults from kvsdk_context_options_init."""
    backend: Backend = None
    device: int = None
    budget_bytes: int = None
    n_threads: int = None  # threads the kernels run on, the caller's included; 0 = every core

    def __post_init__(self):
        defaults = _initialised_sized(_capi.kvsdk_context_options,
                                      lib.kvsdk_context_options_init_sized)
        for name in ("backend", "device", "budget_bytes", "n_threads"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(defaults, name))
        try:
            self.backend = Backend(self.backend)
        except ValueError:
            pass  # left for the library to reject

    def to_c(self):
        return _to_c(self, _capi.kvsdk_context_options)


_GEOMETRY_ENUMS = {"dtype": Dtype, "rope_style": RopeStyle}


@dataclasses.dataclass
class Geometry:
    """kvsdk_geometry. Geometry(n_layers, n_q_heads, n_kv_heads, head_dim, dtype=...) fills
    the other fields with kvsdk_geometry_init's defaults."""
    n_layers: int = 0
    n_q_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    dtype: Dtype = None
    rope_style: RopeStyle = None
    rope_theta: float = None
    attn_scale: float = None

    def __post_init__(self):
        defaults = _initialised_sized(_capi.kvsdk_geometry, lib.kvsdk_geometry_init_sized)
        for name in ("dtype", "rope_style", "rope_theta", "attn_scale"):
            if getattr(self, name) is None:
                v = getattr(defaults, name)
                setattr(self, name, _GEOMETRY_ENUMS[name](v) if name in _GEOMETRY_ENUMS else v)

    @classmethod
    def from_c(cls, raw):
        return _from_c(cls, raw, _GEOMETRY_ENUMS)

    def to_c(self):
        return _to_c(self, _capi.kvsdk_geometry)

    @property
    def kv_elems_per_token(self):
        return self.n_kv_heads * self.head_dim

    @property
    def q_elems_per_query(self):
        return self.n_q_heads * self.head_dim


@dataclasses.dataclass
class Policy:
    """kvsdk_policy. Build one with Policy.defaults(method) or Policy.parse("xkv+kivi2")."""
    method: Method
    quant_bits: int
    quant_group: int
    quant_residual: int
    sink_tokens: int
    recent_tokens: int
    obs_window: int
    pool_kernel: int
    pool_kind: PoolKind
    heavy_ratio: float
    schedule_alpha: float
    schedule_beta: float
    boundary_layer: int
    merge_t: float
    retain_ratio: float
    fetch_tokens: int
    match_tokens: int
    evict_slack: float  # amortized eviction: share of a layer's cap evicted beyond it, 0..0.5
    # KIVI attention's value weights: 7 or 14 bits; 0 = by quant_bits (7 when <= 2)
    kivi_weight_bits: int

    # quant_residual = Policy.RESIDUAL_AUTO: the KIVI exact window chosen by the length the
    # cache holds (KVSDK_QUANT_RESIDUAL_AUTO; resolved when a cache is created or converted).
    RESIDUAL_AUTO: typing.ClassVar[int] = _capi.KVSDK_QUANT_RESIDUAL_AUTO

    @classmethod
    def defaults(cls, method):
        raw = _initialised_sized(_capi.kvsdk_policy, lib.kvsdk_policy_init_sized, int(method))
        return cls.from_c(raw)

    @classmethod
    def parse(cls, spec):
        if not isinstance(spec, str) or "\0" in spec:
            raise invalid(f"policy spec must be a string without NUL, got {spec!r}")
        return cls.from_c(_initialised_sized(_capi.kvsdk_policy, lib.kvsdk_policy_parse_sized,
                                             spec.encode()))

    @classmethod
    def from_c(cls, raw):
        return _from_c(cls, raw, {"method": Method, "pool_kind": PoolKind})

    def to_c(self):
        return _to_c(self, _capi.kvsdk_policy)


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """kvsdk_cache_stats; bytes_by_tier is indexed by Tier."""
    n_layers: int
    tokens: int
    appended_tokens: int
    bytes: int
    bytes_by_tier: tuple
    full_bytes: int
    backing_bytes: int
    budget_bytes: int
    context_used_bytes: int
    device_arena_bytes: int
    device_reserved_bytes: int

    @classmethod
    def from_c(cls, raw):
        return _from_c(cls, raw)


@dataclasses.dataclass(frozen=True)
class LayerStats:
    """kvsdk_layer_stats; bytes_by_tier is indexed by Tier."""
    layer: int
    tokens: int
    tokens_min_head: int
    tokens_max_head: int
    appended_tokens: int
    bytes: int
    bytes_by_tier: tuple

    @classmethod
    def from_c(cls, raw):
        return _from_c(cls, raw)
