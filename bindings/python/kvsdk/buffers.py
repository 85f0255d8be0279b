"""Turns host tensors into (pointer, byte size) pairs and back.

Accepted inputs: array.array of the right type code, numpy arrays (when numpy is installed;
converted to a contiguous array of the right dtype), any other sequence of numbers (copied into
an array.array). Element types: float32 for Dtype.F32, uint16 bits for Dtype.F16 / Dtype.BF16.
Outputs are array.array, or numpy arrays when the input was one.
"""
import array
import ctypes

from .errors import invalid
from .structs import Dtype

try:  # numpy is optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None

_TYPECODE = {Dtype.F32: "f", Dtype.F16: "H", Dtype.BF16: "H"}
_NP_DTYPE = {"f": "<f4", "H": "<u2", "i": "<i4"}


def typecode_of(dtype):
    try:
        return _TYPECODE[Dtype(dtype)]
    except (KeyError, ValueError):
        raise invalid(f"unknown dtype {dtype!r}") from None


def _is_numpy(obj):
    return _np is not None and isinstance(obj, _np.ndarray)


class Buffer:
    """A contiguous host buffer the library may read or write, kept alive by this object."""

    def __init__(self, data, typecode):
        if _is_numpy(data):
            self.obj = _np.ascontiguousarray(data, dtype=_NP_DTYPE[typecode]).reshape(-1)
            self.ptr = ctypes.c_void_p(self.obj.ctypes.data)
            self.numpy = True
        else:
            if isinstance(data, array.array) and data.typecode == typecode:
                self.obj = data
            elif isinstance(data, array.array):
                raise invalid(f"array of type '{data.typecode}' where '{typecode}' is needed")
            else:
                self.obj = array.array(typecode, data)
            address, _ = self.obj.buffer_info()
            self.ptr = ctypes.c_void_p(address)
            self.numpy = False
        self.count = len(self.obj)
        self.nbytes = self.count * self.obj.itemsize

    def as_int32_ptr(self):
        return ctypes.cast(self.ptr, ctypes.POINTER(ctypes.c_int32))


def empty(typecode, count, like_numpy=False):
    """A zero-filled writable Buffer of `count` elements."""
    if like_numpy and _np is not None:
        return Buffer(_np.zeros(count, dtype=_NP_DTYPE[typecode]), typecode)
    return Buffer(array.array(typecode, bytes(count * array.array(typecode).itemsize)), typecode)


def positions(data):
    """int32 positions (array 'i' is 4 bytes on every platform kvsdk supports)."""
    assert array.array("i").itemsize == 4
    return Buffer(data, "i")


NUMPY_AVAILABLE = _np is not None
