"""Context: a backend and a memory budget shared by the caches created on it.

Thread-safe (the header's contract): one Context may be shared by caches on many threads.
"""
import ctypes
import dataclasses

from ._capi import lib
from .errors import check
from .owned import OwnedHandle
from .structs import ContextOptions


class Context(OwnedHandle):
    """An owned kvsdk_context, released by close(), by `with`, or when garbage-collected.
    Caches keep the library-side context alive, so closing it before them is safe."""

    @staticmethod
    def _destroy(handle):
        lib.kvsdk_context_destroy(handle)

    def __init__(self, options=None, *, budget_bytes=None):
        options = ContextOptions() if options is None else dataclasses.replace(options)
        if budget_bytes is not None:
            options.budget_bytes = budget_bytes
        raw_options = options.to_c()
        handle = ctypes.c_void_p()
        check(lib.kvsdk_context_create(ctypes.byref(handle), ctypes.byref(raw_options)))
        self._handle = handle

    @property
    def handle(self):
        """The raw handle (ctypes.c_void_p), still owned by this object."""
        if self._handle is None:
            raise ValueError("kvsdk.Context is closed")
        return self._handle

    @property
    def used_bytes(self):
        out = ctypes.c_uint64()
        check(lib.kvsdk_context_used_bytes(self.handle, ctypes.byref(out)))
        return out.value

    @property
    def budget_bytes(self):
        out = ctypes.c_uint64()
        check(lib.kvsdk_context_budget_bytes(self.handle, ctypes.byref(out)))
        return out.value
