"""Half-precision bit patterns, labelled with their dtype, and exact conversions.

numpy has float16 but no bfloat16, and the array module has neither. To pass uint16 bit patterns
to an F16 or BF16 cache explicitly, wrap them: `kvsdk.F16Bits(bits)` or `kvsdk.BF16Bits(bits)`,
where `bits` is a numpy uint16 array, an array.array('H') or a sequence of ints in 0..65535.
A wrapper is accepted only by a cache of its own dtype (BF16Bits on an F16 cache is an error).

Conversions from float32 round to nearest even exactly as the C library does
(src/util/half.h: f32_to_f16, f32_to_bf16), NaN included (a quiet NaN of the same sign:
0x7e00 for f16, the top 16 bits | 0x40 for bf16); conversions to float32 are exact.
    kvsdk.F16Bits.from_float32(values)   kvsdk.BF16Bits.from_float32(values)
    bits.to_float32()
`values`: a numpy float32 array (the result then holds a numpy uint16 array), an
array.array('f'), or a sequence of Python numbers (each first rounded to float32, as
array.array('f') does; the result then holds an array.array('H')). numpy float64 input is
refused: round it to float32 yourself (astype) so that the two roundings are visible.
"""
import array
import struct

from .errors import invalid
from .structs import Dtype

try:  # numpy is optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None


def _is_numpy(obj):
    return _np is not None and isinstance(obj, _np.ndarray)


def _bits_storage(data, label):
    """numpy uint16 array, array.array('H') (both kept as they are, no copy) or a new
    array.array('H') from a sequence of ints in 0..65535."""
    if isinstance(data, HalfBits):
        raise invalid(f"{label}: already a {type(data).__name__}")
    if _is_numpy(data):
        if data.dtype != _np.dtype("<u2"):
            raise invalid(f"{label}: expected a uint16 array of bit patterns, got {data.dtype}")
        return data
    if isinstance(data, array.array):
        if data.typecode != "H":
            raise invalid(f"{label}: expected array.array('H') of bit patterns, got "
                          f"array.array('{data.typecode}')")
        return data
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        raise invalid(f"{label}: expected uint16 bit patterns, got {type(data).__name__}")
    try:
        items = list(data)
    except TypeError:
        raise invalid(f"{label}: expected a sequence of uint16 bit patterns, got "
                      f"{type(data).__name__}") from None
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int) and not (
                _np is not None and isinstance(x, _np.integer)):
            raise invalid(f"{label}: bit patterns are ints in 0..65535, got "
                          f"{type(x).__name__} {x!r}")
        if not 0 <= x <= 0xFFFF:
            raise invalid(f"{label}: bit pattern {x} is outside 0..65535")
    return array.array("H", items)


def _float32_values(values, label):
    """numpy float32 array (C-contiguous copy if needed), or array.array('f')."""
    if _is_numpy(values):
        if values.dtype != _np.dtype("<f4"):
            raise invalid(f"{label}: expected float32 values, got {values.dtype} (round it to "
                          f"float32 first, e.g. .astype(numpy.float32))")
        return _np.ascontiguousarray(values).reshape(-1)
    if isinstance(values, array.array):
        if values.typecode != "f":
            raise invalid(f"{label}: expected array.array('f'), got "
                          f"array.array('{values.typecode}')")
        return values
    if isinstance(values, (str, bytes, bytearray, memoryview, HalfBits)):
        raise invalid(f"{label}: expected float32 values, got {type(values).__name__}")
    try:
        return array.array("f", values)
    except (TypeError, ValueError, OverflowError) as e:
        raise invalid(f"{label}: expected a sequence of numbers ({e})") from None


def f32_bits_to_f16(x):
    """src/util/half.h f32_to_f16 on the bit pattern of one float32 (an int)."""
    sign = (x >> 16) & 0x8000
    ax = x & 0x7FFFFFFF
    if ax >= 0x7F800000:  # Inf or NaN (NaN stays quiet and non-zero)
        return sign | 0x7C00 | (0x200 if ax > 0x7F800000 else 0)
    if ax >= 0x477FF000:  # rounds to >= 65520
        return sign | 0x7C00
    if ax < 0x38800000:  # subnormal or zero: round(value * 2^24) to nearest even, exactly
        exp = ax >> 23
        man = (ax & 0x7FFFFF) | (0x800000 if exp else 0)
        shift = 126 - max(exp, 1)  # value * 2^24 = man * 2^(max(exp,1) - 126)
        if shift >= 32:
            return sign
        q, r, half = man >> shift, man & ((1 << shift) - 1), 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        return sign | q
    odd = (ax >> 13) & 1
    return sign | (((ax + 0xC8000FFF + odd) & 0xFFFFFFFF) >> 13)


def f32_bits_to_bf16(x):
    """src/util/half.h f32_to_bf16 on the bit pattern of one float32 (an int)."""
    if (x & 0x7FFFFFFF) > 0x7F800000:
        return (x >> 16) | 0x40
    return ((x + 0x7FFF + ((x >> 16) & 1)) & 0xFFFFFFFF) >> 16


class HalfBits:
    """uint16 bit patterns of one half-precision dtype (see F16Bits and BF16Bits).

    `bits` holds the storage: the numpy uint16 array or array.array('H') given (not copied,
    so a wrapper over writable storage may be passed as attend's `out`), or a new
    array.array('H') for any other sequence of ints."""

    dtype = None  # the Dtype whose elements these are, set by the subclasses
    name = None  # how error messages name this dtype

    def __init__(self, bits):
        self.bits = _bits_storage(bits, type(self).__name__)

    def __len__(self):
        return len(self.bits)

    def __eq__(self, other):
        return (type(self) is type(other) and len(self) == len(other)
                and all(int(a) == int(b) for a, b in zip(self.bits, other.bits)))

    def __repr__(self):
        return f"{type(self).__name__}({self.bits!r})"

    @classmethod
    def from_float32(cls, values):
        """float32 values rounded to this dtype, to nearest even, as the C library rounds."""
        v = _float32_values(values, f"{cls.__name__}.from_float32")
        if _is_numpy(v):
            return cls(cls._from_float32_numpy(v))
        words = struct.unpack(f"<{len(v)}I", v.tobytes()) if len(v) else ()
        return cls(array.array("H", [cls._from_f32_bits(x) for x in words]))

    def to_float32(self):
        """The exact float32 values: a numpy float32 array if the bits are a numpy array, else
        an array.array('f')."""
        if _is_numpy(self.bits):
            return self._to_float32_numpy(_np.ascontiguousarray(self.bits))
        return array.array("f", [self._to_float(int(b)) for b in self.bits])


class F16Bits(HalfBits):
    """IEEE 754 binary16 bit patterns, for an F16 cache (a numpy float16 array is the same thing:
    F16Bits(a.view(numpy.uint16)))."""

    dtype = Dtype.F16
    name = "float16"
    _from_f32_bits = staticmethod(f32_bits_to_f16)

    @staticmethod
    def _to_float(bits):
        return struct.unpack("<e", struct.pack("<H", bits))[0]

    @staticmethod
    def _from_float32_numpy(v):
        with _np.errstate(over="ignore", invalid="ignore"):
            out = v.astype(_np.float16).view(_np.uint16)
        nan = _np.isnan(v)
        if nan.any():  # numpy keeps NaN payloads; the library writes a plain quiet NaN
            sign = (v.view(_np.uint32) >> 16).astype(_np.uint16) & _np.uint16(0x8000)
            out = _np.where(nan, sign | _np.uint16(0x7E00), out).astype(_np.uint16)
        return out

    @staticmethod
    def _to_float32_numpy(bits):
        return bits.view(_np.float16).astype(_np.float32)


class BF16Bits(HalfBits):
    """bfloat16 bit patterns, for a BF16 cache (numpy has no bfloat16 type)."""

    dtype = Dtype.BF16
    name = "bfloat16"
    _from_f32_bits = staticmethod(f32_bits_to_bf16)

    @staticmethod
    def _to_float(bits):
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]

    @staticmethod
    def _from_float32_numpy(v):
        x = v.view(_np.uint32)
        nan = (x & _np.uint32(0x7FFFFFFF)) > _np.uint32(0x7F800000)
        rounded = (x + _np.uint32(0x7FFF) + ((x >> _np.uint32(16)) & _np.uint32(1))) >> \
            _np.uint32(16)
        return _np.where(nan, (x >> _np.uint32(16)) | _np.uint32(0x40), rounded).astype(
            _np.uint16)

    @staticmethod
    def _to_float32_numpy(bits):
        return (bits.astype(_np.uint32) << _np.uint32(16)).view(_np.float32)
