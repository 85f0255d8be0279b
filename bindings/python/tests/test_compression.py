"""Compression, allocation planning, profiles and the planner through the Python binding."""
import os
import tempfile
import unittest

import kvsdk
from kvsdk import AllocMode, Status

from support import Rng, small_geometry as geometry, status_of


def window_policy():
    p = kvsdk.Policy.parse("snapkv")
    p.obs_window = 4
    return p


def filled_cache(ctx):
    """A snapkv cache with 32 tokens in each layer and a 4-query window observed."""
    cache = kvsdk.Cache(ctx, geometry(), window_policy())
    rng = Rng(5)
    for layer in range(2):
        k, v = rng.draw(32 * 16), rng.draw(32 * 16)
        cache.append(layer, k, v, range(32))
        cache.observe(layer, rng.draw(4 * 32), range(28, 32))
    return cache


class CompressionTest(unittest.TestCase):
    def test_kivi_weight_bits_resolve_by_quant_bits_and_are_checked(self):
        ctx = kvsdk.Context()
        p = kvsdk.Policy.parse("kivi")
        self.assertEqual(p.kivi_weight_bits, 0)  # the default: by quant_bits
        self.assertEqual(kvsdk.Cache(ctx, geometry(), p).policy.kivi_weight_bits, 7)
        p4 = kvsdk.Policy.parse("snapkv+kivi4")
        self.assertEqual(kvsdk.Cache(ctx, geometry(), p4).policy.kivi_weight_bits, 14)
        p.kivi_weight_bits = 8
        self.assertEqual(status_of(kvsdk.Cache, ctx, geometry(), p), Status.INVALID_ARG)

    def test_budget_compresses_and_allocation_round_trips(self):
        ctx = kvsdk.Context()
        cache = filled_cache(ctx)
        self.assertEqual(cache.allocation(), [32, 32])
        capacity, token_bytes = cache.token_capacity()
        self.assertIsNone(capacity)
        self.assertGreater(token_bytes, 0)

        before = cache.stats().bytes
        cache.set_budget(before // 2)
        cache.compress()
        self.assertLessEqual(cache.stats().bytes, before // 2)
        self.assertTrue(all(n < 32 for n in cache.allocation()))
        self.assertIsNotNone(cache.token_capacity()[0])

        cache.set_allocation([8, 6])
        self.assertEqual(cache.allocation(), [8, 6])
        self.assertEqual(len(cache.read(1, 0).positions), 6)
        self.assertEqual(status_of(cache.set_allocation, [8]), Status.INVALID_ARG)
        cache.set_allocation(None)
        self.assertEqual(status_of(cache.observe, 0, [0.0] * 3), Status.INVALID_ARG)
        self.assertEqual(status_of(cache.observe, 5, [0.0] * 32), Status.OUT_OF_RANGE)

        full = kvsdk.Cache(ctx, geometry())
        self.assertEqual(status_of(full.set_allocation, [1, 1]), Status.UNSUPPORTED)

    def test_auto_residual_window_is_resolved_for_the_head_dim(self):
        # head_dim 8 and 2 bits: round(768 / 8) = 96 (include/kvsdk.h, KVSDK_QUANT_RESIDUAL_AUTO).
        g = geometry()
        p = kvsdk.Policy.parse("kivi")
        p.quant_residual = kvsdk.Policy.RESIDUAL_AUTO
        cache = kvsdk.Cache(kvsdk.Context(), g, p)
        self.assertEqual(cache.policy.quant_residual, 96)
        p.quant_residual = -2
        self.assertEqual(status_of(kvsdk.Cache, kvsdk.Context(), g, p), Status.INVALID_ARG)

    def test_plan_allocation_marshals_every_layer(self):
        w0, w1 = [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
        self.assertEqual(kvsdk.plan_allocation([w0, w1], AllocMode.TOTAL_TOKENS, 7), [4, 3])
        self.assertEqual(kvsdk.plan_allocation([w0, w1], AllocMode.TOTAL_TOKENS, 4), [1, 3])
        self.assertEqual(status_of(kvsdk.plan_allocation, [[-1.0]], AllocMode.TOTAL_TOKENS, 1),
                         Status.INVALID_ARG)
        self.assertEqual(status_of(kvsdk.plan_allocation, [w0], AllocMode.TARGET_RETENTION, 1.5),
                         Status.INVALID_ARG)

    def test_profiles_record_save_load_and_apply(self):
        profile = kvsdk.Profile(2)
        self.assertEqual(status_of(profile.shares), Status.STATE)
        profile.record([2, 6])
        profile.record([1, 3])
        self.assertEqual(profile.shares(), ([0.25, 0.75], 2))
        self.assertEqual(status_of(profile.record, [1]), Status.INVALID_ARG)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "task.kvap")
            profile.save(path)
            loaded = kvsdk.Profile.load(path, 2)
            self.assertEqual(loaded.shares(), ([0.25, 0.75], 2))
            self.assertEqual(status_of(kvsdk.Profile.load, path, 3), Status.INVALID_ARG)
            self.assertEqual(status_of(kvsdk.Profile.load, os.path.join(tmp, "none"), 2),
                             Status.IO)
        cache = filled_cache(kvsdk.Context())
        cache.set_budget(cache.stats().bytes // 2)
        cache.apply_profile(loaded)
        loaded.close()  # the cache copied the shares
        alloc = cache.allocation()
        self.assertLess(alloc[0], alloc[1])
        cache.apply_profile(None)

    def test_planner_feeds_layers_and_plans(self):
        planner = kvsdk.Planner(geometry(), window_policy())
        self.assertEqual(status_of(planner.finish, AllocMode.TOTAL_TOKENS, 20), Status.STATE)
        rng = Rng(9)
        for layer in range(2):
            k, q = rng.draw(32 * 16), rng.draw(4 * 32)
            planner.feed_layer(layer, k, range(32), q, range(28, 32))
        plan = planner.finish(AllocMode.TOTAL_TOKENS, 20)
        self.assertEqual(sum(plan), 20)
        self.assertTrue(all(n >= 4 for n in plan))
        self.assertEqual(status_of(planner.feed_layer, 0, [0.0] * 3, [0], [0.0] * 32),
                         Status.INVALID_ARG)
        cache = filled_cache(kvsdk.Context())
        cache.set_allocation(plan)
        self.assertEqual(cache.allocation(), plan)


if __name__ == "__main__":
    unittest.main()
