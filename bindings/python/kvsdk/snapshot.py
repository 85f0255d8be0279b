"""Snapshots: save a cache to a file or bytes, append journal deltas, load it back (header
section "Snapshots: suspend and resume"). Mixed into kvsdk.Cache."""
import ctypes
import dataclasses
import os

from . import _capi
from ._capi import lib
from .errors import check
from .structs import Policy, _from_c, _initialised_sized, _to_c

FORMAT_VERSION = (_capi.KVSDK_SNAPSHOT_FORMAT_MAJOR, _capi.KVSDK_SNAPSHOT_FORMAT_MINOR)


@dataclasses.dataclass
class SaveOptions:
    """kvsdk_save_options; defaults from kvsdk_save_options_init."""
    zstd_level: int = None
    include_backing: int = None
    max_frame_bytes: int = None
    max_journal_percent: int = None
    embed_prefix: int = None  # a conversation on a shared prefix: 1 embeds the prefix
    # Save-time compression (kvsdk.h "Targeted saves"): a Policy, or None to save the cache as
    # it is; the file then holds the cache converted to it and compressed to
    # target_budget_bytes (0: the cache's own budget). The live cache is not changed.
    target_policy: Policy = None
    target_budget_bytes: int = None

    def __post_init__(self):
        defaults = _initialised_sized(_capi.kvsdk_save_options, lib.kvsdk_save_options_init_sized)
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None and f.name != "target_policy":
                setattr(self, f.name, getattr(defaults, f.name))

    def to_c(self):
        raw = _to_c(dataclasses.replace(self, target_policy=None), _capi.kvsdk_save_options)
        if self.target_policy is not None:
            # The struct keeps the policy alive (ctypes records the pointer's object in it).
            raw.target_policy = ctypes.pointer(self.target_policy.to_c())
        return raw


@dataclasses.dataclass(frozen=True)
class LoadInfo:
    """kvsdk_load_info: what a load found."""
    format_major: int
    format_minor: int
    journal_frames_applied: int
    journal_frames_dropped: int


def _options(options):
    return ctypes.byref((options or SaveOptions()).to_c())


def _expected(geometry):
    return None if geometry is None else ctypes.byref(geometry.to_c())


def _load_info():
    return _initialised_sized(_capi.kvsdk_load_info, lib.kvsdk_load_info_init_sized)


class SnapshotMixin:
    def save(self, path, options=None):
        """Saves the whole cache to `path` atomically."""
        check(lib.kvsdk_cache_save(self.handle, os.fsencode(path), _options(options)))

    def save_to_bytes(self, options=None):
        """Saves the whole cache into a new bytes object (size query, then the save)."""
        size = ctypes.c_size_t()
        opts = _options(options)
        check(lib.kvsdk_cache_save_to_buffer(self.handle, opts, None, 0, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        check(lib.kvsdk_cache_save_to_buffer(self.handle, opts, buf, size.value,
                                             ctypes.byref(size)))
        return buf.raw[:size.value]

    def save_delta(self, path, options=None):
        """Appends what changed since the last save, delta or load of `path` as journal frames."""
        check(lib.kvsdk_cache_save_delta(self.handle, os.fsencode(path), _options(options)))

    @classmethod
    def load(cls, context, path, expected=None):
        """Loads a snapshot file into a new cache on `context`; returns (cache, LoadInfo).
        `expected`: None accepts the file's geometry, else it must match (GEOMETRY)."""
        handle, info = ctypes.c_void_p(), _load_info()
        check(lib.kvsdk_cache_load(ctypes.byref(handle), context.handle, os.fsencode(path),
                                   _expected(expected), ctypes.byref(info)))
        return cls._from_handle(handle), _from_c(LoadInfo, info)

    @classmethod
    def load_on_prefix(cls, prefix, path):
        """Loads the snapshot of a conversation that references its shared prefix by content
        hash (kvsdk_cache_load_on_prefix); `prefix`: the frozen cache it continued (or one with
        the same content). Returns (cache, LoadInfo); the cache keeps `prefix` alive."""
        handle, info = ctypes.c_void_p(), _load_info()
        check(lib.kvsdk_cache_load_on_prefix(ctypes.byref(handle), prefix.handle,
                                             os.fsencode(path), ctypes.byref(info)))
        cache = cls._from_handle(handle)
        cache._prefix = prefix
        return cache, _from_c(LoadInfo, info)

    @classmethod
    def load_from_bytes(cls, context, data, expected=None):
        """As load, from the bytes of a snapshot (any bytes-like object)."""
        data = bytes(data)
        handle, info = ctypes.c_void_p(), _load_info()
        check(lib.kvsdk_cache_load_from_buffer(ctypes.byref(handle), context.handle, data,
                                               len(data), _expected(expected),
                                               ctypes.byref(info)))
        return cls._from_handle(handle), _from_c(LoadInfo, info)

    @property
    def policy(self):
        """The cache's policy (e.g. the one a loaded snapshot carries)."""
        raw = _capi.kvsdk_policy()
        raw.struct_size = ctypes.sizeof(raw)
        check(lib.kvsdk_cache_policy(self.handle, ctypes.byref(raw)))
        return Policy.from_c(raw)
