"""Host tensors -> (pointer, byte size) for the C ABI, and output buffers back: the binding's
dtype rules. The C ABI takes every tensor (keys, values, queries, outputs) in the cache's own
dtype and converts nothing, so neither does this binding: an input is accepted only if its
elements already are the cache's dtype, and is passed to the library as is (bit-exact).

Inputs (keys, values, queries), by cache dtype:

    cache dtype   numpy array          array.array   plain sequence        explicit bits
    F32           float32              'f'           numbers -> float32    -
    F16           float16              'H' (bits)    ints 0..65535 (bits)  kvsdk.F16Bits
    BF16          - (numpy has none)   'H' (bits)    ints 0..65535 (bits)  kvsdk.BF16Bits

- numpy arrays must have exactly that dtype (little-endian), be C-contiguous and aligned; their
  shape is flat, (rows, head_dim), (tokens, heads * head_dim) or (tokens, heads, head_dim) in
  C order (heads: n_kv_heads for keys/values, n_q_heads for queries). Anything else is refused:
  float64, float32 on a half cache, integer arrays (uint16 too: wrap bit patterns in F16Bits /
  BF16Bits so that their dtype is explicit), non-contiguous views.
- array.array('H') and plain sequences of ints on F16/BF16 caches are bit patterns of the
  cache's dtype (the array module has no 16-bit float; this was always the rule). Plain
  sequences on an F32 cache hold Python numbers, each rounded to float32 as array.array('f')
  does; on a half cache they must hold ints (a float there is refused, never truncated).
- kvsdk.F16Bits / kvsdk.BF16Bits (see kvsdk.half) wrap uint16 bit patterns with their dtype;
  they are accepted only by a cache of that dtype. F16Bits.from_float32 / BF16Bits.from_float32
  round float32 values exactly as the C library does, for hosts that hold float32 data.
- str, bytes, bytearray and memoryview are refused (raw bytes have no dtype).
- Sizes are checked before the call: keys and values hold tokens x n_kv_heads x head_dim
  elements, queries and outputs queries x n_q_heads x head_dim.
Every refusal raises KvsdkError(Status.INVALID_ARG) whose message names the expected dtype, e.g.
"keys: expected float16 for an F16 cache, got float64"; the cache is not touched.

Outputs (attend, read): numpy arrays when the input was numpy (attend: `q` was a numpy array or
a wrapper of one; read: numpy=True) -- float32 for F32, float16 for F16 and uint16 bf16 bit
patterns for BF16 (BF16Bits(a).to_float32() gives the values); otherwise array.array('f') for
F32 and array.array('H') bit patterns for F16/BF16. attend(out=...) writes into a caller's
buffer of that same type (or a F16Bits/BF16Bits wrapper of writable storage of the cache's
dtype) and returns it.

Positions: int32. numpy integer arrays (1-D; any integer dtype, converted exactly, values
outside int32 refused), array.array of an integer type code, or a sequence of ints (range too).
"""
import array
import ctypes

from .errors import invalid
from .half import BF16Bits, F16Bits, HalfBits
from .structs import Dtype

try:  # numpy is optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None

NUMPY_AVAILABLE = _np is not None

_TYPECODE = {Dtype.F32: "f", Dtype.F16: "H", Dtype.BF16: "H"}
# numpy dtype of inputs (None: numpy has no such type) and of outputs.
_NP_IN = {Dtype.F32: "<f4", Dtype.F16: "<f2", Dtype.BF16: None}
_NP_OUT = {Dtype.F32: "<f4", Dtype.F16: "<f2", Dtype.BF16: "<u2"}
_EXPECTED = {
    Dtype.F32: "float32",
    Dtype.F16: "float16",
    Dtype.BF16: "bfloat16 bit patterns",
}
_HINT = {
    Dtype.F32: "a numpy float32 array, array.array('f') or a sequence of numbers",
    Dtype.F16: "a numpy float16 array, array.array('H') or kvsdk.F16Bits of bit patterns",
    Dtype.BF16: "kvsdk.BF16Bits (e.g. BF16Bits(uint16_array) or BF16Bits.from_float32(x)), "
                "array.array('H') or a sequence of ints",
}
_WRAPPER = {Dtype.F16: F16Bits, Dtype.BF16: BF16Bits}


def dtype_of(dtype):
    try:
        return Dtype(dtype)
    except ValueError:
        raise invalid(f"unknown dtype {dtype!r}") from None


def _is_numpy(obj):
    return _np is not None and isinstance(obj, _np.ndarray)


def _describe(data):
    """How an error message names what the caller passed."""
    if _is_numpy(data):
        return f"a numpy {data.dtype} array"
    if isinstance(data, array.array):
        return f"array.array('{data.typecode}')"
    if isinstance(data, HalfBits):
        return f"{data.name} bit patterns (kvsdk.{type(data).__name__})"
    if isinstance(data, (list, tuple)):
        return f"a {type(data).__name__}"
    return f"a {type(data).__name__} object"


def cache_name(dtype):
    """'an F32 cache', 'an F16 cache', 'a BF16 cache'."""
    return f"{'a' if dtype.name.startswith('B') else 'an'} {dtype.name} cache"


def _refuse(what, dtype, data, detail=""):
    return invalid(f"{what}: expected {_EXPECTED[dtype]} for {cache_name(dtype)}, got "
                   f"{_describe(data)}{detail} (pass {_HINT[dtype]})")


class Buffer:
    """A contiguous host buffer the library may read or write, kept alive by this object.
    obj: what the caller gets back (outputs); ptr, count (elements), nbytes; numpy: whether
    outputs derived from it are numpy arrays."""

    def __init__(self, obj, storage, numpy):
        self.obj, self.numpy = obj, numpy
        self._storage = storage
        if _is_numpy(storage):
            self.ptr = ctypes.c_void_p(storage.ctypes.data)
            self.count = storage.size
            self.nbytes = storage.nbytes
        else:
            address, _ = storage.buffer_info()
            self.ptr = ctypes.c_void_p(address)
            self.count = len(storage)
            self.nbytes = self.count * storage.itemsize

    def as_int32_ptr(self):
        return ctypes.cast(self.ptr, ctypes.POINTER(ctypes.c_int32))


def _check_layout(arr, what, heads, head_dim, writable=False):
    """C-contiguous, aligned (writable) and shaped as the module docstring says."""
    if not arr.flags.c_contiguous:
        raise invalid(f"{what}: expected a C-contiguous array, got a non-contiguous "
                      f"{arr.dtype} array of shape {arr.shape} (numpy.ascontiguousarray "
                      f"makes a contiguous copy)")
    if not arr.flags.aligned:
        raise invalid(f"{what}: the array's data is not aligned to its element size")
    if writable and not arr.flags.writeable:
        raise invalid(f"{what}: the array is read-only")
    if heads is None:
        return
    shape = arr.shape
    ok = (len(shape) == 1
          or len(shape) == 2 and shape[1] in (head_dim, heads * head_dim)
          or len(shape) == 3 and shape[1:] == (heads, head_dim))
    if not ok:
        raise invalid(f"{what}: shape {shape} is not flat, (rows, {head_dim}), "
                      f"(tokens, {heads * head_dim}) or (tokens, {heads}, {head_dim})")


def tensor(data, dtype, what, heads=None, head_dim=None):
    """An input tensor of the cache dtype `dtype` as a read-only Buffer (no copy for numpy
    arrays, array.array and wrappers; plain sequences are copied into an array.array)."""
    dtype = dtype_of(dtype)
    if _is_numpy(data):
        expected = _NP_IN[dtype]
        if expected is None or data.dtype != _np.dtype(expected):
            detail = ""
            if dtype == Dtype.BF16 and data.dtype == _np.dtype("<u2"):
                detail = " (a uint16 array does not say which dtype its bits are)"
            raise _refuse(what, dtype, data, detail)
        _check_layout(data, what, heads, head_dim)
        return Buffer(data, data, True)
    if isinstance(data, HalfBits):
        if data.dtype != dtype:
            raise _refuse(what, dtype, data)
        bits = data.bits
        if _is_numpy(bits):
            _check_layout(bits, what, heads, head_dim)
        return Buffer(data, bits, _is_numpy(bits))
    typecode = _TYPECODE[dtype]
    if isinstance(data, array.array):
        if data.typecode != typecode:
            raise _refuse(what, dtype, data)
        return Buffer(data, data, False)
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        raise _refuse(what, dtype, data)
    try:
        items = list(data)
    except TypeError:
        raise _refuse(what, dtype, data) from None
    if dtype == Dtype.F32:
        for x in items:
            if isinstance(x, (str, bytes)) or _is_numpy(x) or isinstance(x, (list, tuple)):
                raise _refuse(what, dtype, data, f" holding a {type(x).__name__}")
        try:
            storage = array.array("f", items)
        except (TypeError, ValueError, OverflowError) as e:
            raise _refuse(what, dtype, data, f" that is not all numbers ({e})") from None
        return Buffer(storage, storage, False)
    try:
        storage = _WRAPPER[dtype](items).bits
    except Exception as e:  # a KvsdkError naming the bad element
        message = getattr(e, "message", str(e))
        raise _refuse(what, dtype, data, f" that is not all ints in 0..65535 ({message}); a "
                      f"plain sequence for {cache_name(dtype)} holds bit patterns") from None
    return Buffer(storage, storage, False)


def output(dtype, count, numpy):
    """A zero-filled output Buffer of `count` elements in the documented output type."""
    dtype = dtype_of(dtype)
    if numpy and _np is not None:
        storage = _np.zeros(count, dtype=_NP_OUT[dtype])
    else:
        typecode = _TYPECODE[dtype]
        storage = array.array(typecode, bytes(count * array.array(typecode).itemsize))
    return Buffer(storage, storage, _is_numpy(storage))


def out_buffer(out, dtype, what, heads, head_dim):
    """A caller's writable output buffer (see the module docstring); returned as given."""
    dtype = dtype_of(dtype)
    storage = out
    if isinstance(out, HalfBits):
        if out.dtype != dtype:
            raise _refuse(what, dtype, out)
        storage = out.bits
    if _is_numpy(storage):
        if storage.dtype != _np.dtype(_NP_OUT[dtype]):
            raise invalid(f"{what}: expected a numpy {_np.dtype(_NP_OUT[dtype]).name} array for "
                          f"{cache_name(dtype)}'s output, got {_describe(storage)}")
        _check_layout(storage, what, heads, head_dim, writable=True)
        return Buffer(out, storage, True)
    if isinstance(storage, array.array) and storage.typecode == _TYPECODE[dtype]:
        return Buffer(out, storage, False)
    numpy_kind = f"numpy {_np.dtype(_NP_OUT[dtype]).name} array or " if _np else ""
    raise invalid(f"{what}: expected a writable {numpy_kind}array.array('{_TYPECODE[dtype]}') "
                  f"for {cache_name(dtype)}'s output, got {_describe(out)}")


def floats(data, what):
    """A float32 vector that is not a cache tensor (e.g. importance weights): numpy float32
    (1-D, contiguous), array.array('f') or a sequence of numbers (rounded to float32)."""
    if _is_numpy(data) and data.ndim != 1:
        raise invalid(f"{what}: expected a 1-D array, got shape {data.shape}")
    return tensor(data, Dtype.F32, what)


_INT_TYPECODES = "bBhHiIlLqQ"


def positions(data, what="positions"):
    """int32 positions (array 'i' is 4 bytes on every platform kvsdk supports)."""
    assert array.array("i").itemsize == 4
    if _is_numpy(data):
        if data.dtype.kind not in "iu":
            raise invalid(f"{what}: expected integers (int32), got a numpy {data.dtype} array")
        if data.ndim != 1:
            raise invalid(f"{what}: expected a 1-D array, got shape {data.shape}")
        if data.size and (int(data.min()) < -2 ** 31 or int(data.max()) >= 2 ** 31):
            raise invalid(f"{what}: values outside int32")
        storage = _np.ascontiguousarray(data, dtype=_np.int32)  # exact after the range check
        return Buffer(storage, storage, True)
    if isinstance(data, array.array):
        if data.typecode == "i":
            return Buffer(data, data, False)
        if data.typecode not in _INT_TYPECODES:
            raise invalid(f"{what}: expected integers (int32), got array.array('{data.typecode}')")
    elif isinstance(data, (str, bytes, bytearray, memoryview, HalfBits)):
        raise invalid(f"{what}: expected a sequence of ints, got {type(data).__name__}")
    try:
        items = list(data)
    except TypeError:
        raise invalid(f"{what}: expected a sequence of ints, got {type(data).__name__}") from None
    for x in items:
        if isinstance(x, bool) or not (isinstance(x, int) or _np is not None
                                       and isinstance(x, _np.integer)):
            raise invalid(f"{what}: expected ints, got {type(x).__name__} {x!r}")
    try:
        storage = array.array("i", items)
    except OverflowError:
        raise invalid(f"{what}: values outside int32") from None
    return Buffer(storage, storage, False)


def int32_output(count, numpy):
    """A zero-filled int32 output Buffer (positions): numpy int32 or array.array('i')."""
    if numpy and _np is not None:
        storage = _np.zeros(count, dtype=_np.int32)
    else:
        storage = array.array("i", bytes(4 * count))
    return Buffer(storage, storage, _is_numpy(storage))
