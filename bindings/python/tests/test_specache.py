"""SpeCache through the Python binding: prefetch, the fetch hit rate, a file-backed backing
store that gives the same results as host memory, and UNSUPPORTED for other policies."""
import os
import tempfile
import unittest

import kvsdk
from kvsdk import Status

from support import Rng, small_geometry as geometry, status_of


def specache_policy(spec="specache"):
    p = kvsdk.Policy.parse(spec)
    p.quant_group = 8
    p.quant_residual = 8
    p.fetch_tokens = 6
    return p


def fill(cache, n=40):
    rng = Rng(3)
    for layer in range(2):
        cache.append(layer, rng.draw(n * 16), rng.draw(n * 16), range(n))


class SpeCacheTest(unittest.TestCase):
    def test_prefetch_attend_and_hit_rate(self):
        ctx = kvsdk.Context()
        cache = kvsdk.Cache(ctx, geometry(), specache_policy())
        fill(cache)
        self.assertEqual(cache.fetch_stats(), (None, 0))
        q = Rng(9).draw(32)
        before = list(cache.attend(0, q))
        cache.prefetch(0, q, q_position=40)
        after = list(cache.attend(0, q))
        self.assertNotEqual(before, after)  # the fetched rows are full precision
        hit, samples = cache.fetch_stats()
        self.assertEqual(samples, 2)  # one per KV head
        self.assertGreater(hit, 0.0)
        self.assertLessEqual(hit, 1.0)
        stats = cache.stats()
        self.assertGreater(stats.backing_bytes, 0)
        self.assertEqual(stats.context_used_bytes, stats.bytes)
        self.assertEqual(status_of(cache.prefetch, 5, q), Status.OUT_OF_RANGE)

    def test_backing_file_matches_host_memory(self):
        ctx = kvsdk.Context()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "backing.bin")
            host = kvsdk.Cache(ctx, geometry(), specache_policy("specache+kivi1"))
            file = kvsdk.Cache(ctx, geometry(), specache_policy("specache+kivi1"))
            file.set_backing_file(path)
            fill(host)
            fill(file)
            q = Rng(11).draw(32)
            host.prefetch(1, q)
            file.prefetch(1, q)
            self.assertEqual(list(host.attend(1, q)), list(file.attend(1, q)))
            self.assertTrue(os.path.getsize(path) >= file.stats().backing_bytes)
            self.assertEqual(status_of(file.set_backing_file, path), Status.STATE)
            file.close()

    def test_other_policies_are_unsupported(self):
        ctx = kvsdk.Context()
        cache = kvsdk.Cache(ctx, geometry(), kvsdk.Policy.parse("kivi"))
        fill(cache)
        self.assertEqual(status_of(cache.prefetch, 0, Rng(1).draw(32)), Status.UNSUPPORTED)
        self.assertEqual(status_of(cache.fetch_stats), Status.UNSUPPORTED)
        self.assertEqual(status_of(cache.set_backing_file, "/tmp/unused"), Status.UNSUPPORTED)


if __name__ == "__main__":
    unittest.main()
