"""The Python binding over the real library: marshalling, errors, ownership, threading."""
import array
import threading
import unittest

import kvsdk
from kvsdk import Status


def geometry():
    # 2 layers, 4 query heads sharing 2 KV heads (GQA), head_dim 8, f32 in and out.
    return kvsdk.Geometry(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=8, dtype=kvsdk.Dtype.F32)


def kv(tokens, g, scale):
    """Token t, KV head h, channel c: a value exactly representable in f16."""
    return array.array("f", [scale * ((t * 7 + h * 3 + c) % 16) / 8.0
                             for t in tokens for h in range(g.n_kv_heads)
                             for c in range(g.head_dim)])


class VersionTest(unittest.TestCase):
    def test_version_matches_header(self):
        self.assertEqual(kvsdk.version() // 10000, kvsdk.HEADER_VERSION // 10000)
        self.assertEqual(len(kvsdk.version_string().split(".")), 3)


class CacheTest(unittest.TestCase):
    def test_fork_continues_like_the_original_and_is_charged(self):
        g = geometry()
        ctx = kvsdk.Context()
        a = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("snapkv"))
        a.append(0, kv(range(6), g, 1.0), kv(range(6), g, -0.5), range(6))
        before = ctx.used_bytes
        b = a.fork()
        self.assertEqual(ctx.used_bytes, 2 * before)
        q = [(i % 5) / 4.0 for i in range(g.q_elems_per_query)]
        self.assertEqual(list(a.attend(0, q, [6])), list(b.attend(0, q, [6])))
        a.close()
        b.append(0, kv([6], g, 1.0), kv([6], g, -0.5), [6])
        self.assertEqual(b.stats().tokens, 7 * g.n_kv_heads)

    def test_truncate_rewinds_exactly_or_refuses(self):
        g = geometry()
        ctx = kvsdk.Context()
        a = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("full"))
        b = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("full"))
        a.append(0, kv(range(6), g, 1.0), kv(range(6), g, -0.5), range(6))
        b.append(0, kv(range(4), g, 1.0), kv(range(4), g, -0.5), range(4))
        a.truncate(4)
        self.assertEqual(a.stats().tokens, 4 * g.n_kv_heads)
        self.assertEqual(a.stats().bytes, b.stats().bytes)
        q = [(i % 5) / 4.0 for i in range(g.q_elems_per_query)]
        self.assertEqual(list(a.attend(0, q, [9])), list(b.attend(0, q, [9])))
        with self.assertRaises(kvsdk.KvsdkError) as e:
            a.truncate(-1)
        self.assertEqual(e.exception.status, kvsdk.Status.INVALID_ARG)
        with self.assertRaises(ValueError):
            a.truncate(2**31)
        # kivi (blocks of 32 after a residual of 128) has quantized the first tokens of 200.
        k = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("kivi"))
        k.append(0, kv(range(200), g, 1.0), kv(range(200), g, -0.5), range(200))
        before = k.stats().bytes
        with self.assertRaises(kvsdk.KvsdkError) as e:
            k.truncate(10)
        self.assertEqual(e.exception.status, kvsdk.Status.STATE)
        self.assertIn("exactly", str(e.exception))
        self.assertEqual(k.stats().bytes, before)

    def test_append_read_attend_and_stats(self):
        g = geometry()
        ctx = kvsdk.Context()
        cache = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("full"))
        k, v = kv(range(5), g, 1.0), kv(range(5), g, -0.5)
        cache.append(1, k, v, range(5))

        head = cache.read(1, 1)
        self.assertEqual(list(head.positions), list(range(5)))
        d = g.head_dim
        for t in range(5):
            src = (t * g.n_kv_heads + 1) * d
            self.assertEqual(head.keys[t * d:(t + 1) * d], k[src:src + d])
            self.assertEqual(head.values[t * d:(t + 1) * d], v[src:src + d])
        self.assertEqual(cache.token_count(0, 0), 0)
        self.assertEqual(len(cache.read(0, 0).keys), 0)

        # A zero query weighs every token equally: the output is the mean of the values.
        out = cache.attend(1, [0.0] * g.q_elems_per_query)
        for qh in range(g.n_q_heads):
            kvh = qh // 2
            for c in range(d):
                mean = sum(v[(t * 2 + kvh) * d + c] for t in range(5)) / 5
                self.assertAlmostEqual(out[qh * d + c], mean, places=6)
        # Causal: a query at position 0 sees only token 0.
        out0 = cache.attend(1, [0.0] * g.q_elems_per_query, q_positions=[0])
        self.assertEqual(out0[:d], v[:d])
        # Writing into a caller's buffer.
        mine = array.array("f", [0.0] * g.q_elems_per_query)
        self.assertIs(cache.attend(1, [0.0] * g.q_elems_per_query, [0], out=mine), mine)
        self.assertEqual(mine, out0)

        stats = cache.stats()
        self.assertEqual((stats.n_layers, stats.tokens, stats.appended_tokens), (2, 10, 5))
        self.assertEqual(stats.bytes, sum(stats.bytes_by_tier))
        self.assertGreater(stats.bytes_by_tier[kvsdk.Tier.EXACT], 0)
        self.assertEqual(stats.context_used_bytes, ctx.used_bytes)
        layer = cache.layer_stats(1)
        self.assertEqual((layer.layer, layer.tokens, layer.tokens_min_head), (1, 10, 5))
        back = cache.geometry
        self.assertAlmostEqual(back.attn_scale, 1 / d ** 0.5, places=6)
        back.attn_scale = 0.0
        self.assertEqual(back, g)
        cache.close()
        cache.close()  # idempotent
        with self.assertRaises(ValueError):
            cache.stats()

    def test_errors_carry_status_and_message_and_change_nothing(self):
        g = geometry()
        per_token = g.n_kv_heads * (g.head_dim * 2 * 2 + 4)
        with kvsdk.Context(budget_bytes=per_token * 3) as ctx:
            self.assertEqual(ctx.budget_bytes, per_token * 3)
            cache = kvsdk.Cache(ctx, g)
            cache.append(0, kv(range(2), g, 1), kv(range(2), g, 1), [0, 1])
            before = cache.stats()

            def status_of(fn, *args, **kw):
                with self.assertRaises(kvsdk.KvsdkError) as caught:
                    fn(*args, **kw)
                self.assertTrue(caught.exception.message)
                self.assertIn(caught.exception.message, str(caught.exception))
                return caught.exception.status

            self.assertEqual(status_of(cache.append, 0, kv(range(2, 4), g, 1),
                                       kv(range(2, 4), g, 1), [2, 3]), Status.BUDGET)
            self.assertEqual(status_of(cache.append, 7, kv([2], g, 1), kv([2], g, 1), [2]),
                             Status.OUT_OF_RANGE)
            self.assertEqual(status_of(cache.append, 0, kv([2], g, 1), kv([2, 3], g, 1), [2]),
                             Status.INVALID_ARG)
            self.assertEqual(status_of(cache.append, 0, kv([2, 3], g, 1), kv([2, 3], g, 1), [2]),
                             Status.INVALID_ARG)
            self.assertEqual(status_of(cache.append, 0, kv([2], g, 1), kv([2], g, 1), [-1]),
                             Status.INVALID_ARG)
            self.assertEqual(status_of(cache.append, 0, array.array("H", [0] * 16),
                                       array.array("H", [0] * 16), [2]), Status.INVALID_ARG)
            self.assertEqual(status_of(cache.append, 0, [], [], []), Status.INVALID_ARG)
            out = array.array("f", [7.0] * g.q_elems_per_query)
            q = [0.0] * g.q_elems_per_query
            self.assertEqual(status_of(cache.attend, 0, q + [0.0], out=out), Status.INVALID_ARG)
            self.assertEqual(status_of(cache.attend, 0, q, out=out[:3]), Status.INVALID_ARG)
            self.assertEqual(status_of(cache.attend, 9, q, out=out), Status.OUT_OF_RANGE)
            self.assertEqual(status_of(cache.attend, 0, q, out=[0.0] * len(q)),
                             Status.INVALID_ARG)
            self.assertEqual(list(out), [7.0] * len(q), "output untouched on failure")
            self.assertEqual(status_of(cache.read, 0, 5), Status.OUT_OF_RANGE)
            self.assertEqual(status_of(cache.layer_stats, 2), Status.OUT_OF_RANGE)
            self.assertEqual(cache.stats(), before)
            bad = geometry()
            bad.n_q_heads = 3
            self.assertEqual(status_of(kvsdk.Cache, ctx, bad), Status.INVALID_ARG)
            cache.close()

    def test_policies_and_methods(self):
        for m in kvsdk.Method:
            name = kvsdk.method_name(m)
            self.assertEqual(kvsdk.Policy.parse(name).method, m)
            self.assertEqual(kvsdk.Policy.defaults(m).method, m)
        self.assertIsNone(kvsdk.method_name(99))
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            kvsdk.Policy.defaults(99)
        self.assertEqual(caught.exception.status, Status.INVALID_ARG)
        for spec in ("no-such-method", "fu\0ll"):
            with self.assertRaises(kvsdk.KvsdkError):
                kvsdk.Policy.parse(spec)
        p = kvsdk.Policy.parse("xkv+kivi2")
        self.assertEqual((p.method, p.quant_bits), (kvsdk.Method.XKV, 2))
        self.assertEqual(kvsdk.status_str(1234), kvsdk.status_str(4321))
        self.assertNotEqual(kvsdk.status_str(Status.BUDGET), kvsdk.status_str(1234))

    def test_half_precision_uses_uint16_bits(self):
        g = geometry()
        g.dtype = kvsdk.Dtype.F16
        cache = kvsdk.Cache(kvsdk.Context(), g)
        one = 0x3C00  # 1.0 in binary16
        cache.append(0, [one] * g.kv_elems_per_token, [one] * g.kv_elems_per_token, [0])
        out = cache.attend(0, [one] * g.q_elems_per_query)
        self.assertEqual(out.typecode, "H")
        self.assertEqual(set(out), {one})

    def test_caches_outlive_their_context_and_run_on_threads(self):
        g = geometry()
        ctx = kvsdk.Context()
        caches = [kvsdk.Cache(ctx, g) for _ in range(4)]
        errors = []

        def work(i):
            try:
                n = i + 1
                caches[i].append(0, kv(range(n), g, 1), kv(range(n), g, 1), range(n))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        ctx.close()  # the caches keep the library-side context alive
        self.assertEqual([c.stats().tokens for c in caches], [2, 4, 6, 8])
        self.assertGreater(caches[0].stats().context_used_bytes, 0)


@unittest.skipUnless(kvsdk.buffers.NUMPY_AVAILABLE, "numpy is not installed (python3-numpy)")
class SharedPrefixTest(unittest.TestCase):
    def test_conversations_on_a_frozen_prefix(self):
        g = geometry()
        ctx = kvsdk.Context()
        prefix = kvsdk.Cache(ctx, g)
        for layer in range(g.n_layers):
            prefix.append(layer, kv(range(8), g, 1.0), kv(range(8), g, -0.5), range(8))
        # Only a frozen cache can be a prefix.
        with self.assertRaises(kvsdk.KvsdkError) as e:
            kvsdk.Cache.on_prefix(prefix)
        self.assertEqual(e.exception.status, Status.STATE)
        with self.assertRaises(kvsdk.KvsdkError) as e:
            kvsdk.Cache.on_prefix(object())
        self.assertEqual(e.exception.status, Status.INVALID_ARG)
        prefix.freeze()
        prefix.freeze()  # idempotent
        prefix_bytes = prefix.stats().bytes
        self.assertEqual(ctx.used_bytes, prefix_bytes)

        a = kvsdk.Cache.on_prefix(prefix)
        b = kvsdk.Cache.on_prefix(prefix, kvsdk.Policy.parse("snapkv"))
        self.assertIs(a._prefix, prefix)
        a_tokens, b_tokens = range(8, 11), range(8, 13)
        for layer in range(g.n_layers):
            a.append(layer, kv(a_tokens, g, 0.5), kv(a_tokens, g, 0.75), a_tokens)
            b.append(layer, kv(b_tokens, g, -0.25), kv(b_tokens, g, 1.5), b_tokens)
        self.assertEqual(a.stats().tokens, g.n_layers * g.n_kv_heads * len(a_tokens))
        self.assertEqual(b.stats().tokens, g.n_layers * g.n_kv_heads * len(b_tokens))
        self.assertEqual(a.token_count(0, 0), len(a_tokens))

        # The prefix is charged once: the context holds it and each conversation's own rows.
        used = prefix_bytes + a.stats().bytes + b.stats().bytes
        self.assertGreater(a.stats().bytes, 0)
        self.assertEqual(ctx.used_bytes, used)
        self.assertEqual(a.stats().context_used_bytes, used)
        self.assertEqual(b.stats().context_used_bytes, used)

        # Full over full attends like one cache holding the prefix and then the conversation.
        q = [(i % 5) / 4.0 - 0.3 for i in range(g.q_elems_per_query)]
        with kvsdk.Context() as ref_ctx, kvsdk.Cache(ref_ctx, g) as ref:
            ref.append(1, kv(range(8), g, 1.0), kv(range(8), g, -0.5), range(8))
            ref.append(1, kv(a_tokens, g, 0.5), kv(a_tokens, g, 0.75), a_tokens)
            expected = list(ref.attend(1, q, [20]))
        got = list(a.attend(1, q, [20]))
        for x, y in zip(got, expected):
            self.assertAlmostEqual(x, y, delta=1e-5 * max(1.0, abs(y)))
        self.assertNotEqual(got, list(b.attend(1, q, [20])))
        # A query at a prefix position sees only the prefix tokens up to it.
        self.assertEqual(list(a.attend(1, q, [3])), list(b.attend(1, q, [3])))

        # The frozen prefix is read-only; a refused append changes nothing.
        with self.assertRaises(kvsdk.KvsdkError) as e:
            prefix.append(0, kv([8], g, 1.0), kv([8], g, 1.0), [8])
        self.assertEqual(e.exception.status, Status.STATE)
        self.assertEqual(prefix.stats().bytes, prefix_bytes)
        self.assertEqual(ctx.used_bytes, used)

        # Closing the prefix handle keeps it alive (and charged) for its conversations.
        prefix.close()
        self.assertEqual(list(a.attend(1, q, [20])), got)
        self.assertEqual(ctx.used_bytes, used)
        a.close()
        b.close()
        self.assertEqual(ctx.used_bytes, 0)


class NumpyTest(unittest.TestCase):
    def test_numpy_in_numpy_out(self):
        import numpy as np
        g = geometry()
        cache = kvsdk.Cache(kvsdk.Context(), g)
        k = np.arange(3 * g.kv_elems_per_token, dtype=np.float32).reshape(3, 2, 8) / 64
        cache.append(0, k, k, np.arange(3, dtype=np.int32))
        with self.assertRaises(kvsdk.KvsdkError) as caught:  # float64 is not the cache dtype
            cache.attend(0, np.zeros((1, 4, 8), dtype=np.float64))
        self.assertIn("expected float32 for an F32 cache, got a numpy float64 array",
                      caught.exception.message)
        out = cache.attend(0, np.zeros((1, 4, 8), dtype=np.float32))
        self.assertIsInstance(out, np.ndarray)
        self.assertEqual(out.dtype, np.float32)
        head = cache.read(0, 1, numpy=True)
        np.testing.assert_array_equal(head.keys.reshape(3, 8), k[:, 1, :])
        np.testing.assert_allclose(out.reshape(4, 8)[0], k[:, 0, :].mean(axis=0), rtol=1e-6)


class SmallKvProxyTest(unittest.TestCase):
    def test_set_proxy_links_detaches_and_refuses_misuse(self):
        g = geometry()
        ctx = kvsdk.Context()
        large = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("smallkv"))
        proxy = kvsdk.Cache(ctx, kvsdk.Geometry(n_layers=1, n_q_heads=2, n_kv_heads=1,
                                                head_dim=8, dtype=kvsdk.Dtype.F32),
                            kvsdk.Policy.parse("full"))
        large.set_proxy(proxy)
        large.set_proxy(proxy)  # the current proxy again: no-op
        other = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("smallkv"))
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            other.set_proxy(proxy)  # serves one cache at a time
        self.assertEqual(caught.exception.status, Status.STATE)
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            proxy.set_proxy(large)  # a 'full' cache has no proxy
        self.assertEqual(caught.exception.status, Status.UNSUPPORTED)
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            large.set_proxy(other)  # a proxy must be 'full'
        self.assertEqual(caught.exception.status, Status.INVALID_ARG)
        large.set_proxy(None)
        other.set_proxy(proxy)

    def test_set_proxy_wait_runs_the_proxy_on_another_thread(self):
        g = geometry()
        ctx = kvsdk.Context()
        pg = kvsdk.Geometry(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=8,
                            dtype=kvsdk.Dtype.F32)
        policy = kvsdk.Policy.parse("smallkv")
        policy.match_tokens = 2  # heads matched on the first step: later attends read the proxy
        large = kvsdk.Cache(ctx, g, policy)
        proxy = kvsdk.Cache(ctx, pg, kvsdk.Policy.parse("full"))
        large.set_proxy(proxy)
        large.set_proxy_wait(10000)
        q = [(i % 5) / 4.0 for i in range(2 * g.q_elems_per_query)]

        def proxy_step():
            proxy.append(0, [0.25] * 16, [0.5] * 16, [0, 1])
            proxy.attend(0, [0.5] * 32, [0, 1])

        worker = threading.Thread(target=proxy_step)
        worker.start()
        large.append(0, kv(range(2), g, 1.0), kv(range(2), g, -0.5), [0, 1])
        out = large.attend(0, q, [0, 1])
        worker.join()
        self.assertEqual(len(out), 2 * g.q_elems_per_query)
        self.assertEqual(list(large.read(0, 0).positions), [0, 1])
        # A proxy that does not come: STATE after the timeout, nothing changed.
        large.set_proxy_wait(20)
        large.append(0, kv([2], g, 1.0), kv([2], g, -0.5), [2])
        before = large.stats().bytes
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            large.attend(0, q[:g.q_elems_per_query], [2])
        self.assertEqual(caught.exception.status, Status.STATE)
        self.assertEqual(large.stats().bytes, before)
        for bad in (-1, 2**32):
            with self.assertRaises(ValueError):
                large.set_proxy_wait(bad)
        with self.assertRaises(kvsdk.KvsdkError) as caught:
            proxy.set_proxy_wait(5)  # a 'full' cache has no proxy
        self.assertEqual(caught.exception.status, Status.UNSUPPORTED)
        large.set_proxy_wait(0)


if __name__ == "__main__":
    unittest.main()
