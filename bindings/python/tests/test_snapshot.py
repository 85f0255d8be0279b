"""Snapshots through the Python binding: save/load round trips continue bit-identically,
journal deltas apply, bad input gives a status."""
import os
import tempfile
import unittest

import kvsdk
from kvsdk import Status

from support import Rng, small_geometry as geometry, status_of


def append_tokens(cache, rng, pos0, n):
    for layer in range(2):
        k, v = rng.draw(n * 16), rng.draw(n * 16)
        cache.append(layer, k, v, range(pos0, pos0 + n))


class SnapshotTest(unittest.TestCase):
    def test_conversation_on_a_prefix_references_or_embeds_it(self):
        ctx = kvsdk.Context()
        rng = Rng(5)
        prefix = kvsdk.Cache(ctx, geometry())
        append_tokens(prefix, rng, 0, 12)
        prefix.freeze()
        chat = kvsdk.Cache.on_prefix(prefix)
        append_tokens(chat, rng, 12, 5)
        q = rng.draw(2 * 32)
        expected = chat.attend(1, q)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chat.kvsdk")
            chat.save(path)  # references the prefix by content hash
            self.assertEqual(status_of(lambda: kvsdk.Cache.load(ctx, path)), Status.STATE)
            loaded, info = kvsdk.Cache.load_on_prefix(prefix, path)
            self.assertEqual(info.format_major, 6)  # exact rows on a prefix: 6.0 (kvsdk.h)
            self.assertEqual(loaded.attend(1, q), expected)
            alone, _ = kvsdk.Cache.load_from_bytes(
                kvsdk.Context(), chat.save_to_bytes(kvsdk.SaveOptions(embed_prefix=1)))
            self.assertEqual(alone.attend(1, q), expected)
            other = kvsdk.Cache(ctx, geometry())
            other.freeze()
            self.assertEqual(status_of(lambda: kvsdk.Cache.load_on_prefix(other, path)),
                             Status.STATE)

    def test_save_load_round_trip_is_bit_identical(self):
        ctx = kvsdk.Context()
        cache = kvsdk.Cache(ctx, geometry())
        rng = Rng(3)
        append_tokens(cache, rng, 0, 10)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "conversation.kvsdk")
            data = cache.save_to_bytes()
            cache.save(path, kvsdk.SaveOptions(zstd_level=1))  # the default; base of later deltas
            # Each save carries a fresh random snapshot id: same length, not same bytes.
            self.assertEqual(os.path.getsize(path), len(data))
            from_file, info = kvsdk.Cache.load(ctx, path, expected=geometry())
            # Caches holding exact rows are written as 6.0 (byte-plane rows; kvsdk.h), the newest.
            self.assertEqual((info.format_major, info.format_minor), (6, 0))
            self.assertEqual(kvsdk.SNAPSHOT_FORMAT, (6, 0))
            from_bytes, _ = kvsdk.Cache.load_from_bytes(ctx, data)
            self.assertEqual(from_file.policy, cache.policy)
            q = rng.draw(2 * 32)
            expected = cache.attend(1, q)
            self.assertEqual(from_file.attend(1, q), expected)
            self.assertEqual(from_bytes.attend(1, q), expected)
            self.assertEqual(from_bytes.read(0, 1).keys, cache.read(0, 1).keys)

            append_tokens(cache, rng, 10, 3)
            cache.save_delta(path)
            resumed, info = kvsdk.Cache.load(ctx, path)
            self.assertGreater(info.journal_frames_applied, 0)
            self.assertEqual(resumed.stats().tokens, cache.stats().tokens)

    def test_targeted_save_holds_the_target_policy(self):
        ctx = kvsdk.Context()
        cache = kvsdk.Cache(ctx, geometry())
        rng = Rng(6)
        append_tokens(cache, rng, 0, 40)
        before = cache.save_to_bytes()
        budget = cache.stats().bytes // 2
        options = kvsdk.SaveOptions(target_policy=kvsdk.Policy.parse("snapkv"),
                                    target_budget_bytes=budget)
        data = cache.save_to_bytes(options)
        self.assertEqual(cache.save_to_bytes(), before)  # the live cache is as it was
        loaded, _ = kvsdk.Cache.load_from_bytes(kvsdk.Context(), data)
        self.assertEqual(loaded.policy, kvsdk.Policy.parse("snapkv"))
        self.assertLessEqual(loaded.stats().bytes, budget)
        append_tokens(loaded, rng, 40, 1)  # it continues
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "small.kvsdk")
            cache.save(path, options)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), data)  # the file save writes the buffer's bytes
            self.assertEqual(status_of(cache.save_delta, path, options), Status.UNSUPPORTED)
        self.assertEqual(status_of(cache.save_to_bytes, kvsdk.SaveOptions(target_budget_bytes=9)),
                         Status.INVALID_ARG)

    def test_bad_snapshots_give_a_status(self):
        ctx = kvsdk.Context()
        cache = kvsdk.Cache(ctx, geometry())
        rng = Rng(4)
        append_tokens(cache, rng, 0, 4)
        data = bytearray(cache.save_to_bytes())
        other = geometry()
        other.head_dim = 16
        load = kvsdk.Cache.load_from_bytes
        self.assertEqual(status_of(load, ctx, data, other), Status.GEOMETRY)
        self.assertEqual(status_of(load, ctx, data[:len(data) // 2]), Status.CORRUPT)
        data[len(data) // 2] ^= 0x40
        self.assertEqual(status_of(load, ctx, data), Status.CORRUPT)
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(status_of(kvsdk.Cache.load, ctx, os.path.join(tmp, "none")),
                             Status.IO)
            path = os.path.join(tmp, "x.kvsdk")
            other_cache = kvsdk.Cache(ctx, geometry())
            append_tokens(other_cache, rng, 0, 2)
            other_cache.save(path)
            self.assertEqual(status_of(cache.save_delta, path), Status.STATE)
        self.assertEqual(status_of(cache.save_to_bytes, kvsdk.SaveOptions(zstd_level=99)),
                         Status.INVALID_ARG)


if __name__ == "__main__":
    unittest.main()
