"""Dtype rules of the Python binding (kvsdk.buffers), for every cache dtype (F32, F16, BF16) x
every kind of input, on every call that takes or returns tensors: append, attend (q and out),
read, observe, prefetch, the planner, plan_allocation, and a SmallKV pair of caches of different
dtypes. Accepted input is stored bit-exactly; refused input raises KvsdkError(INVALID_ARG) whose
message names the expected dtype, and leaves the cache unchanged."""
import array
import struct
import unittest

import kvsdk
from kvsdk import BF16Bits, Dtype, F16Bits, Status

try:
    import numpy as np
except ImportError:  # the numpy cases skip with a message
    np = None

needs_numpy = unittest.skipUnless(np is not None, "numpy is not installed (python3-numpy): "
                                  "numpy dtype cases skipped")

DTYPES = (Dtype.F32, Dtype.F16, Dtype.BF16)
EXPECTED = {Dtype.F32: "expected float32 for an F32 cache",
            Dtype.F16: "expected float16 for an F16 cache",
            Dtype.BF16: "expected bfloat16 bit patterns for a BF16 cache"}
CONTIGUOUS = "expected a C-contiguous array"
Q_HEADS, KV_HEADS, DIM = 4, 2, 8
PER_TOKEN, PER_QUERY = KV_HEADS * DIM, Q_HEADS * DIM


def geometry(dtype, n_layers=2):
    return kvsdk.Geometry(n_layers=n_layers, n_q_heads=Q_HEADS, n_kv_heads=KV_HEADS,
                          head_dim=DIM, dtype=dtype)


def values(n, seed):
    """n values exactly representable in f32, f16 and bf16 (at most 5 significant bits)."""
    return [((i * 7 + seed * 5) % 31 - 15) / 16.0 for i in range(n)]


def f16_bits(vals):
    return [struct.unpack("<H", struct.pack("<e", v))[0] for v in vals]


def bf16_bits(vals):
    return [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in vals]


def bits_of(dtype, vals):
    return list(array.array("f", vals)) if dtype == Dtype.F32 else (
        f16_bits(vals) if dtype == Dtype.F16 else bf16_bits(vals))


def plain(dtype, vals):
    """The plain container of a dtype: array.array('f') values or array.array('H') bits."""
    if dtype == Dtype.F32:
        return array.array("f", vals)
    return array.array("H", bits_of(dtype, vals))


def as_list(data):
    """Elements of an output (array.array or numpy array) as exact Python values/bits."""
    if np is not None and isinstance(data, np.ndarray):
        return data.view(np.uint16).tolist() if data.dtype == np.float16 else data.tolist()
    return list(data)


def input_kinds(vals, cache_dtype):
    """name -> (input for these values, the dtypes that accept it, {dtype: the refusal message
    where it is not the wrong dtype}). Kinds that hold bit patterns hold those of `cache_dtype`
    (refusal must not depend on the bits)."""
    own = f16_bits(vals) if cache_dtype == Dtype.F16 else bf16_bits(vals)
    kinds = {
        "list of floats": (list(vals), {Dtype.F32}),
        "tuple of floats": (tuple(vals), {Dtype.F32}),
        "array.array('f')": (array.array("f", vals), {Dtype.F32}),
        "array.array('d')": (array.array("d", vals), set()),
        "array.array('i')": (array.array("i", own), set()),
        "bytes": (array.array("f", vals).tobytes(), set()),
        "str": ("0.5" * len(vals), set()),
        "nested lists": ([[v] for v in vals], set()),
        "F16Bits(array)": (F16Bits(array.array("H", f16_bits(vals))), {Dtype.F16}),
        "BF16Bits(array)": (BF16Bits(array.array("H", bf16_bits(vals))), {Dtype.BF16}),
        "F16Bits(list)": (F16Bits(f16_bits(vals)), {Dtype.F16}),
        "BF16Bits(list)": (BF16Bits(bf16_bits(vals)), {Dtype.BF16}),
    }
    if cache_dtype != Dtype.F32:
        kinds["array.array('H') bits"] = (array.array("H", own), {Dtype.F16, Dtype.BF16})
        kinds["list of bit-pattern ints"] = (list(own), {Dtype.F16, Dtype.BF16})
        kinds["list of bit patterns as floats"] = ([float(b) for b in own], set())
    else:
        kinds["array.array('H') bits"] = (array.array("H", f16_bits(vals)), set())
    if np is not None:
        f32 = np.array(vals, dtype=np.float32)
        kinds.update({
            "numpy float32": (f32, {Dtype.F32}),
            "numpy float16": (f32.astype(np.float16), {Dtype.F16}),
            "numpy float64": (f32.astype(np.float64), set()),
            "numpy int32": (np.array(own, dtype=np.int32), set()),
            "numpy int64": (np.array(own, dtype=np.int64), set()),
            "numpy uint16 bits": (np.array(own, dtype=np.uint16), set()),
            "numpy int16": (np.array(own, dtype=np.uint16).view(np.int16), set()),
            "numpy big-endian float16": (f32.astype(">f2"), set()),
            "numpy big-endian float32": (f32.astype(">f4"), set()),
            "numpy bool": (f32 > 0, set()),
            "numpy complex64": (f32.astype(np.complex64), set()),
            "numpy float16 non-contiguous": (np.repeat(f32.astype(np.float16), 2)[::2],
                                             set(), {Dtype.F16: CONTIGUOUS}),
            "numpy float32 non-contiguous": (np.repeat(f32, 2)[::2], set(),
                                             {Dtype.F32: CONTIGUOUS}),
            "F16Bits(numpy)": (F16Bits(f32.astype(np.float16).view(np.uint16)), {Dtype.F16}),
            "BF16Bits(numpy)": (BF16Bits(np.array(bf16_bits(vals), dtype=np.uint16)),
                                {Dtype.BF16}),
            "BF16Bits(numpy non-contiguous)": (BF16Bits(np.repeat(np.array(
                bf16_bits(vals), dtype=np.uint16), 2)[::2]), set(), {Dtype.BF16: CONTIGUOUS}),
        })
    return {name: (kind[0], kind[1], kind[2] if len(kind) > 2 else {})
            for name, kind in kinds.items()}


class DtypeCase(unittest.TestCase):
    def assertRefused(self, fn, *args, expected, **kwargs):
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            fn(*args, **kwargs)
        self.assertEqual(caught.exception.status, Status.INVALID_ARG, caught.exception)
        self.assertIn(expected, caught.exception.message)
        return caught.exception.message

    def snapshot_state(self, cache):
        """Everything an error must leave alone: stats and every head's rows."""
        g = cache.geometry
        heads = [(list(h.keys), list(h.values), list(h.positions))
                 for layer in range(g.n_layers) for kv in range(g.n_kv_heads)
                 for h in [cache.read(layer, kv)]]
        return cache.stats(), heads


class InputMatrixTest(DtypeCase):
    """Every cache dtype x every input kind, on append / attend / observe / planner."""

    def check_kind(self, dtype, name, kind, op):
        """Runs `op(data)`; accepted kinds must succeed, refused ones must raise naming the
        expected dtype (or the kind's own reason)."""
        data, accepted, reasons = kind
        with self.subTest(cache=dtype.name, input=name, op=op.__name__):
            if dtype in accepted:
                op(data)
            else:
                self.assertRefused(op, data, expected=reasons.get(dtype, EXPECTED[dtype]))

    def test_append_accepts_exactly_the_cache_dtype_and_stores_bits(self):
        for dtype in DTYPES:
            vals = values(PER_TOKEN, 1)
            for name, kind in input_kinds(vals, dtype).items():
                accepted = kind[1]
                cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
                first = plain(dtype, values(PER_TOKEN, 9))
                cache.append(0, first, first, [0])
                before = self.snapshot_state(cache)

                def append(d):
                    cache.append(0, d, d, [1])

                self.check_kind(dtype, name, kind, append)
                if dtype in accepted:
                    head = cache.read(0, 1)
                    self.assertEqual(list(head.positions), [0, 1])
                    self.assertEqual(list(head.keys[DIM:]), bits_of(dtype, vals[DIM:]),
                                     f"{name} on {dtype.name}: stored bit-exactly")
                else:
                    self.assertEqual(self.snapshot_state(cache), before,
                                     f"{name} refused on {dtype.name} but the cache changed")

    def test_keys_and_values_are_checked_separately(self):
        for dtype in DTYPES:
            good = plain(dtype, values(PER_TOKEN, 1))
            cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
            bad = array.array("d", values(PER_TOKEN, 1))
            msg = self.assertRefused(cache.append, 0, good, bad, [0], expected=EXPECTED[dtype])
            self.assertTrue(msg.startswith("values:"), msg)
            msg = self.assertRefused(cache.append, 0, bad, good, [0], expected=EXPECTED[dtype])
            self.assertTrue(msg.startswith("keys:"), msg)
            self.assertEqual(cache.stats().tokens, 0)

    def test_queries_of_attend_observe_and_planner(self):
        for dtype in DTYPES:
            kv = plain(dtype, values(2 * PER_TOKEN, 3))
            cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype), kvsdk.Policy.parse("snapkv"))
            cache.append(0, kv, kv, [0, 1])
            planner = kvsdk.Planner(geometry(dtype), kvsdk.Policy.parse("snapkv"))
            keys_kinds = input_kinds(values(2 * PER_TOKEN, 3), dtype)
            for name, kind in input_kinds(values(PER_QUERY, 4), dtype).items():
                accepted = kind[1]
                before = self.snapshot_state(cache)

                def attend(d):
                    out = cache.attend(0, d)
                    self.assertEqual(len(out), PER_QUERY)

                def observe(d):
                    cache.observe(0, d, [1])

                def feed_layer(d):
                    planner.feed_layer(0, kv, [0, 1], d, [1])

                for op in (attend, feed_layer):
                    self.check_kind(dtype, name, kind, op)
                self.assertEqual(self.snapshot_state(cache), before)
                self.check_kind(dtype, name, kind, observe)
                if dtype not in accepted:
                    self.assertEqual(self.snapshot_state(cache), before)
                # The planner's keys follow the same rules.
                good_q = plain(dtype, values(PER_QUERY, 4))

                def feed_keys(d):
                    planner.feed_layer(1, d, [0, 1], good_q, None)

                self.check_kind(dtype, name, keys_kinds[name], feed_keys)

    def test_prefetch_on_specache(self):
        for dtype in DTYPES:
            policy = kvsdk.Policy.parse("specache")
            policy.quant_group, policy.quant_residual, policy.fetch_tokens = 8, 8, 4
            cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype), policy)
            n = 24
            kv = plain(dtype, values(n * PER_TOKEN, 5))
            cache.append(0, kv, kv, range(n))
            for name, kind in input_kinds(values(PER_QUERY, 6), dtype).items():
                before = cache.stats()

                def prefetch(d):
                    cache.prefetch(0, d, q_position=n)

                self.check_kind(dtype, name, kind, prefetch)
                if dtype not in kind[1]:
                    self.assertEqual(cache.stats(), before)
            self.assertRefused(cache.prefetch, 0, plain(dtype, values(PER_QUERY - 1, 6)),
                               expected="expected one query of 32")
            self.assertRefused(cache.prefetch, 0, plain(dtype, values(2 * PER_QUERY, 6)),
                               expected="expected one query of 32")


class SizeAndShapeTest(DtypeCase):
    """Wrong sizes, shapes and output buffers, for every cache dtype."""

    def good(self, dtype, vals):
        if np is not None:
            f32 = np.array(vals, dtype=np.float32)
            return {Dtype.F32: f32, Dtype.F16: f32.astype(np.float16),
                    Dtype.BF16: BF16Bits.from_float32(f32)}[dtype]
        return plain(dtype, vals)

    def test_wrong_sizes_raise_and_change_nothing(self):
        for dtype in DTYPES:
            with self.subTest(cache=dtype.name):
                cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
                two = self.good(dtype, values(2 * PER_TOKEN, 1))
                cache.append(0, two, two, [0, 1])
                before = self.snapshot_state(cache)
                short = self.good(dtype, values(2 * PER_TOKEN - 1, 1))
                self.assertRefused(cache.append, 0, short, two, [2, 3],
                                   expected="keys: 31 elements for 2 tokens, expected 32")
                self.assertRefused(cache.append, 0, two, short, [2, 3],
                                   expected="values: 31 elements for 2 tokens, expected 32")
                self.assertRefused(cache.append, 0, two, two, [2],
                                   expected="expected 16 (tokens x n_kv_heads x head_dim")
                q = self.good(dtype, values(PER_QUERY + 1, 2))
                self.assertRefused(cache.attend, 0, q, expected="not a whole number of queries")
                q2 = self.good(dtype, values(2 * PER_QUERY, 2))
                self.assertRefused(cache.attend, 0, q2, [1],
                                   expected="64 elements for 1 q_positions, expected 32")
                self.assertRefused(cache.observe, 0, q2, [1], expected="expected 32")
                self.assertEqual(self.snapshot_state(cache), before)

    @needs_numpy
    def test_shapes(self):
        for dtype in (Dtype.F32, Dtype.F16):
            npt = np.float32 if dtype == Dtype.F32 else np.float16
            cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
            flat = np.array(values(3 * PER_TOKEN, 1), dtype=npt)
            for shape in [(48,), (6, DIM), (3, PER_TOKEN), (3, KV_HEADS, DIM)]:
                with self.subTest(cache=dtype.name, shape=shape):
                    cache.append(0, flat.reshape(shape), flat.reshape(shape), [0, 1, 2])
            before = self.snapshot_state(cache)
            for shape in [(DIM, 6), (3, DIM, KV_HEADS), (1, 3, KV_HEADS, DIM), (48, 1),
                          (3, 4, 4)]:
                with self.subTest(cache=dtype.name, shape=shape):
                    self.assertRefused(cache.append, 0, flat.reshape(shape),
                                       flat.reshape(shape), [3, 4, 5], expected="shape")
            fortran = np.asfortranarray(flat.reshape(6, DIM))
            self.assertRefused(cache.append, 0, fortran, fortran, [3, 4, 5],
                               expected="expected a C-contiguous array")
            q = np.zeros((1, Q_HEADS, DIM), dtype=npt)
            self.assertEqual(cache.attend(0, q).shape, (PER_QUERY,))
            self.assertRefused(cache.attend, 0, q.reshape(1, DIM, Q_HEADS), expected="shape")
            self.assertRefused(cache.attend, 0, q.reshape(1, 2, 2, DIM), expected="shape")
            self.assertEqual(self.snapshot_state(cache), before)

    def test_out_buffers(self):
        for dtype in DTYPES:
            with self.subTest(cache=dtype.name):
                cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
                kv = self.good(dtype, values(PER_TOKEN, 1))
                cache.append(0, kv, kv, [0])
                q = self.good(dtype, values(PER_QUERY, 2))
                want = as_list(cache.attend(0, q))
                typecode = "f" if dtype == Dtype.F32 else "H"
                mine = array.array(typecode, [0] * PER_QUERY)
                self.assertIs(cache.attend(0, q, out=mine), mine)
                self.assertEqual(list(mine), want)
                expected = "output"
                for bad in (array.array("d", [0] * PER_QUERY), [0.0] * PER_QUERY,
                            array.array(typecode, [7] * 3)):
                    self.assertRefused(cache.attend, 0, q, out=bad,
                                       expected="out" if len(bad) == 3 else expected)
                wrong_wrapper = (BF16Bits if dtype == Dtype.F16 else F16Bits)(
                    array.array("H", [0] * PER_QUERY))
                self.assertRefused(cache.attend, 0, q, out=wrong_wrapper,
                                   expected=EXPECTED[dtype])
                if dtype != Dtype.F32:
                    wrapper = (F16Bits if dtype == Dtype.F16 else BF16Bits)(
                        array.array("H", [0] * PER_QUERY))
                    self.assertIs(cache.attend(0, q, out=wrapper), wrapper)
                    self.assertEqual(list(wrapper.bits), list(mine))

    @needs_numpy
    def test_numpy_out_buffers(self):
        out_dtype = {Dtype.F32: np.float32, Dtype.F16: np.float16, Dtype.BF16: np.uint16}
        for dtype in DTYPES:
            with self.subTest(cache=dtype.name):
                cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
                kv = self.good(dtype, values(PER_TOKEN, 1))
                cache.append(0, kv, kv, [0])
                q = self.good(dtype, values(PER_QUERY, 2))
                want = cache.attend(0, q)
                self.assertIsInstance(want, np.ndarray)
                self.assertEqual(want.dtype, out_dtype[dtype])
                mine = np.full((1, Q_HEADS, DIM), 7, dtype=out_dtype[dtype])
                self.assertIs(cache.attend(0, q, out=mine), mine)
                self.assertEqual(mine.reshape(-1).tobytes(), want.tobytes())
                sentinel = np.full(PER_QUERY, 7, dtype=out_dtype[dtype])
                for other in (np.float32, np.float16, np.float64, np.uint16, np.int32):
                    if other is out_dtype[dtype]:
                        continue
                    self.assertRefused(cache.attend, 0, q, out=np.zeros(PER_QUERY, other),
                                       expected=f"expected a numpy "
                                                f"{np.dtype(out_dtype[dtype]).name} array")
                read_only = sentinel.copy()
                read_only.flags.writeable = False
                self.assertRefused(cache.attend, 0, q, out=read_only, expected="read-only")
                strided = np.repeat(sentinel, 2)[::2]
                self.assertRefused(cache.attend, 0, q, out=strided,
                                   expected="C-contiguous")
                self.assertRefused(cache.attend, 0, q, out=sentinel[:-1],
                                   expected="out: 31 elements, expected 32")
                with self.assertRaises(kvsdk.KvsdkError) as caught:
                    cache.attend(9, q, out=sentinel)
                self.assertEqual(caught.exception.status, Status.OUT_OF_RANGE)
                self.assertTrue((sentinel == 7).all(), "output untouched on failure")


class RoundTripTest(DtypeCase):
    """Accepted inputs come back bit-identically; outputs come back in the cache's dtype."""

    @needs_numpy
    def test_numpy_float16_on_f16_cache_reads_back_bit_identically(self):
        # The acceptance case of the bug: [0.3457, 0.822, 0.3303, -1.303] read back as
        # [0, 0, 0, 65535] when the binding cast float16 values to uint16.
        g = kvsdk.Geometry(n_layers=1, n_q_heads=1, n_kv_heads=1, head_dim=4, dtype=Dtype.F16)
        cache = kvsdk.Cache(kvsdk.Context(), g)
        k = np.array([0.3457, 0.822, 0.3303, -1.303], dtype=np.float16)
        v = -k
        cache.append(0, k, v, [0])
        head = cache.read(0, 0, numpy=True)
        self.assertEqual(head.keys.dtype, np.float16)
        self.assertEqual(head.keys.tobytes(), k.tobytes())
        self.assertEqual(head.values.tobytes(), v.tobytes())
        self.assertEqual(head.positions.dtype, np.int32)
        plain = cache.read(0, 0)
        self.assertEqual(plain.keys, array.array("H", k.view(np.uint16).tolist()))
        # A wrong dtype names the expected one.
        for bad in (k.astype(np.float32), k.astype(np.float64), k.view(np.uint16)):
            msg = self.assertRefused(cache.append, 0, bad, bad, [1],
                                     expected="expected float16 for an F16 cache")
            self.assertIn(f"got a numpy {bad.dtype} array", msg)
        self.assertEqual(cache.token_count(0, 0), 1)

    @needs_numpy
    def test_every_f16_bit_pattern_round_trips(self):
        g = kvsdk.Geometry(n_layers=1, n_q_heads=1, n_kv_heads=1, head_dim=1024,
                           dtype=Dtype.F16)
        cache = kvsdk.Cache(kvsdk.Context(), g)
        every = np.arange(1 << 16, dtype=np.uint16)
        cache.append(0, every.view(np.float16), every[::-1].view(np.float16).copy(),
                     np.arange(64))
        head = cache.read(0, 0, numpy=True)
        np.testing.assert_array_equal(head.keys.view(np.uint16), every)
        np.testing.assert_array_equal(head.values.view(np.uint16), every[::-1])

    @needs_numpy
    def test_bf16_and_f32_storage_matches_the_library_conversions(self):
        """BF16 and F32 caches store f16 rows (the exact tier): reading back applies the C
        library's f32->f16 and f32->bf16 rounding, which kvsdk.F16Bits / BF16Bits.from_float32
        must reproduce bit for bit (numpy and pure-Python paths alike)."""
        g = kvsdk.Geometry(n_layers=1, n_q_heads=1, n_kv_heads=1, head_dim=1024,
                           dtype=Dtype.BF16)
        cache = kvsdk.Cache(kvsdk.Context(), g)
        every = np.arange(1 << 16, dtype=np.uint16)
        cache.append(0, BF16Bits(every), BF16Bits(every), np.arange(64))
        got = cache.read(0, 0, numpy=True).keys
        self.assertEqual(got.dtype, np.uint16)
        via_f16 = F16Bits.from_float32(BF16Bits(every).to_float32()).to_float32()
        np.testing.assert_array_equal(got, BF16Bits.from_float32(via_f16).bits)
        # bf16 values inside f16's range and precision come back unchanged.
        f16_exact = F16Bits.from_float32(BF16Bits(every).to_float32()).to_float32()
        same = BF16Bits(every).to_float32().view(np.uint32) == f16_exact.view(np.uint32)
        np.testing.assert_array_equal(got[same], every[same])
        self.assertGreater(same.sum(), 8000)

        g.dtype = Dtype.F32
        cache = kvsdk.Cache(kvsdk.Context(), g)
        rng = np.random.default_rng(7)
        x = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
        x[:12] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x477FF000, 0x477FEFFF, 0x33000000,
                  0x33000001, 0x387FC000, 0x387FE000, 0x7FC00001, 0xFFFFFFFF]
        x = x.view(np.float32)
        cache.append(0, x, x, np.arange(64))
        got = cache.read(0, 0, numpy=True).keys.view(np.uint32)
        np.testing.assert_array_equal(got, F16Bits.from_float32(x).to_float32().view(np.uint32))
        pure = F16Bits.from_float32(array.array("f", x.tobytes())).to_float32()
        self.assertEqual(bytes(pure), got.tobytes())

    @needs_numpy
    def test_attend_outputs_round_like_the_library(self):
        """An F16 / BF16 cache's attention output is the F32 cache's, rounded by the library;
        from_float32 gives the same bits."""
        kv = np.array(values(5 * PER_TOKEN, 2), dtype=np.float32)
        q = np.array(values(3 * PER_QUERY, 3), dtype=np.float32) * np.float32(1.7)
        q = F16Bits.from_float32(BF16Bits.from_float32(q).to_float32()).to_float32()
        ref = kvsdk.Cache(kvsdk.Context(), geometry(Dtype.F32))
        ref.append(0, kv, kv, range(5))
        out32 = ref.attend(0, q, [2, 3, 4])
        f16 = kvsdk.Cache(kvsdk.Context(), geometry(Dtype.F16))
        f16.append(0, kv.astype(np.float16), kv.astype(np.float16), range(5))
        out16 = f16.attend(0, q.astype(np.float16), [2, 3, 4])
        self.assertEqual(out16.dtype, np.float16)
        np.testing.assert_array_equal(out16.view(np.uint16), F16Bits.from_float32(out32).bits)
        bf = kvsdk.Cache(kvsdk.Context(), geometry(Dtype.BF16))
        bf.append(0, BF16Bits.from_float32(kv), BF16Bits.from_float32(kv), range(5))
        outb = bf.attend(0, BF16Bits.from_float32(q), [2, 3, 4])
        self.assertEqual(outb.dtype, np.uint16)
        np.testing.assert_array_equal(outb, BF16Bits.from_float32(out32).bits)
        self.assertFalse((outb == BF16Bits(np.zeros_like(outb)).bits).all())

    def test_plain_containers_round_trip(self):
        for dtype in DTYPES:
            with self.subTest(cache=dtype.name):
                cache = kvsdk.Cache(kvsdk.Context(), geometry(dtype))
                vals = values(PER_TOKEN, 4)
                data = vals if dtype == Dtype.F32 else bits_of(dtype, vals)
                cache.append(1, data, data, [0])
                head = cache.read(1, 0)
                self.assertEqual(head.keys.typecode, "f" if dtype == Dtype.F32 else "H")
                self.assertEqual(head.positions.typecode, "i")
                self.assertEqual(list(head.keys), bits_of(dtype, vals[:DIM]))
                out = cache.attend(1, [0] * PER_QUERY)  # zero bits are +0.0 in every dtype
                self.assertEqual(out.typecode, "f" if dtype == Dtype.F32 else "H")
                self.assertEqual(list(out[:DIM]), bits_of(dtype, vals[:DIM]))

    def test_ints_on_an_f32_cache_are_values(self):
        cache = kvsdk.Cache(kvsdk.Context(), geometry(Dtype.F32))
        cache.append(0, [1, 2] * DIM, [3] * PER_TOKEN, [0])
        self.assertEqual(list(cache.read(0, 0).keys), [1.0, 2.0] * (DIM // 2))

    def test_wrappers_convert_like_the_library(self):
        samples = [0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e-8, 3.0e-8, 6.1e-5, 0.1, 1 / 3,
                   float("inf"), float("-inf"), float("nan"), 3.4e38]
        # f16 of 0.1 is 0x2E66, 1/3 -> 0x3555; bf16 of 0.1 is 0x3DCD, 1/3 -> 0x3EAB.
        f16 = F16Bits.from_float32(samples)
        self.assertEqual(list(f16.bits)[:11], [0x0000, 0x8000, 0x3C00, 0xC100, 0x7BFF, 0x7C00,
                                               0x0000, 0x0001, 0x03FF, 0x2E66, 0x3555])
        self.assertEqual(list(f16.bits)[11:], [0x7C00, 0xFC00, 0x7E00, 0x7C00])
        bf = BF16Bits.from_float32(samples)
        self.assertEqual(list(bf.bits)[9:11], [0x3DCD, 0x3EAB])
        self.assertEqual(bf.bits[13], 0x7FC0)
        self.assertEqual(list(F16Bits([0x3C00, 0xC100]).to_float32()), [1.0, -2.5])
        self.assertEqual(list(BF16Bits([0x3F80, 0xC020]).to_float32()), [1.0, -2.5])
        for bad in ([70000], [-1], [0.5], "ab", [True]):
            with self.assertRaises(kvsdk.KvsdkError):
                F16Bits(bad)
        self.assertRaises(kvsdk.KvsdkError, BF16Bits.from_float32, array.array("d", [1.0]))
        if np is not None:
            self.assertRaises(kvsdk.KvsdkError, BF16Bits.from_float32, np.zeros(2))
            self.assertRaises(kvsdk.KvsdkError, F16Bits, np.zeros(2, dtype=np.int16))
            x = np.array(samples, dtype=np.float32)
            self.assertEqual(F16Bits.from_float32(x).bits.tolist(), list(f16.bits))
            self.assertEqual(BF16Bits.from_float32(x).bits.tolist(), list(bf.bits))


class PositionsAndOtherVectorsTest(DtypeCase):
    def test_positions(self):
        cache = kvsdk.Cache(kvsdk.Context(), geometry(Dtype.F32))
        kv = values(2 * PER_TOKEN, 1)
        cache.append(0, kv, kv, range(2))
        cache.append(0, kv, kv, array.array("q", [2, 3]))
        for bad, expected in (([4.0, 5.0], "expected ints"), ([4, 2 ** 31], "outside int32"),
                              (array.array("d", [4, 5]), "expected integers"),
                              ("ab", "expected a sequence of ints"), (7, "sequence of ints")):
            with self.subTest(positions=repr(bad)):
                self.assertRefused(cache.append, 0, kv, kv, bad, expected=expected)
        if np is not None:
            cache.append(0, kv, kv, np.arange(4, 6, dtype=np.int64))
            cache.append(0, kv, kv, np.arange(6, 8, dtype=np.uint8))
            for bad, expected in ((np.arange(2.0), "got a numpy float64 array"),
                                  (np.array([8, 2 ** 40]), "outside int32"),
                                  (np.arange(8, 10).reshape(1, 2), "1-D")):
                self.assertRefused(cache.append, 0, kv, kv, bad, expected=expected)
        self.assertEqual(list(cache.read(0, 0).positions), list(range(8 if np else 4)))

    def test_plan_allocation_importance(self):
        imp = [[0.5, 0.25, 0.125], [1.0, 0.0, 0.0]]
        want = kvsdk.plan_allocation(imp, kvsdk.AllocMode.TOTAL_TOKENS, 3)
        self.assertEqual(kvsdk.plan_allocation([array.array("f", w) for w in imp],
                                               kvsdk.AllocMode.TOTAL_TOKENS, 3), want)
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            kvsdk.plan_allocation([imp[0], array.array("d", imp[1])],
                                  kvsdk.AllocMode.TOTAL_TOKENS, 3)
        self.assertIn("importance[1]: expected float32", caught.exception.message)
        if np is not None:
            self.assertEqual(kvsdk.plan_allocation([np.array(w, dtype=np.float32) for w in imp],
                                                   kvsdk.AllocMode.TOTAL_TOKENS, 3), want)
            with self.assertRaises(kvsdk.KvsdkError) as caught:
                kvsdk.plan_allocation([np.array(w) for w in imp],
                                      kvsdk.AllocMode.TOTAL_TOKENS, 3)
            self.assertIn("expected float32", caught.exception.message)
            self.assertIn("float64", caught.exception.message)


class SmallKvMixedDtypesTest(DtypeCase):
    def test_proxy_of_another_dtype(self):
        """A smallkv cache and its proxy each take their own dtype (the C API lets them
        differ); each refuses the other's."""
        for large_dtype, proxy_dtype in ((Dtype.F16, Dtype.F32), (Dtype.BF16, Dtype.F16),
                                         (Dtype.F32, Dtype.BF16)):
            with self.subTest(large=large_dtype.name, proxy=proxy_dtype.name):
                ctx = kvsdk.Context()
                large = kvsdk.Cache(ctx, geometry(large_dtype), kvsdk.Policy.parse("smallkv"))
                proxy = kvsdk.Cache(ctx, kvsdk.Geometry(n_layers=1, n_q_heads=2, n_kv_heads=1,
                                                        head_dim=DIM, dtype=proxy_dtype))
                large.set_proxy(proxy)
                for t in range(3):
                    pkv = plain(proxy_dtype, values(DIM, t))
                    proxy.append(0, pkv, pkv, [t])
                    proxy.attend(0, plain(proxy_dtype, values(2 * DIM, t)))
                    for layer in range(2):
                        kv = plain(large_dtype, values(PER_TOKEN, t))
                        large.append(layer, kv, kv, [t])
                        large.attend(layer, plain(large_dtype, values(PER_QUERY, t)))
                wrong = array.array("f", values(PER_TOKEN, 9)) if large_dtype != Dtype.F32 \
                    else array.array("H", [0] * PER_TOKEN)
                before = self.snapshot_state(large)
                self.assertRefused(large.append, 0, wrong, wrong, [3],
                                   expected=EXPECTED[large_dtype])
                self.assertEqual(self.snapshot_state(large), before)
                large.set_proxy(None)


if __name__ == "__main__":
    unittest.main()
