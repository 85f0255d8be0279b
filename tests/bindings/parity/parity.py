"""Binding parity, Python side: the scenario of SCENARIO.md through the kvsdk package,
recorded to sys.argv[1]. The C and Rust programs must write the same bytes."""
import array
import struct
import sys

import kvsdk

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, PROMPT, DECODE = 3, 4, 2, 16, 24, 4


class Rng:
    def __init__(self, seed):
        self.state = seed

    def fill(self, n):
        out = array.array("f")
        for _ in range(n):
            self.state = (self.state * 1664525 + 1013904223) & 0xFFFFFFFF
            out.append(((self.state >> 8) & 0xFFFF) / 32768.0 - 1.0)
        return out


def f32_bytes(values):
    return struct.pack(f"<{len(values)}f", *values)


def main(path):
    rng = Rng(20261120)
    rec = bytearray()
    ctx = kvsdk.Context()
    g = kvsdk.Geometry(n_layers=LAYERS, n_q_heads=Q_HEADS, n_kv_heads=KV_HEADS,
                       head_dim=HEAD_DIM, dtype=kvsdk.Dtype.F32)
    cache = kvsdk.Cache(ctx, g, kvsdk.Policy.parse("full"))

    def append_and_attend(layer, pos0, n, causal):
        pos = list(range(pos0, pos0 + n))
        k, v = rng.fill(n * KV_HEADS * HEAD_DIM), rng.fill(n * KV_HEADS * HEAD_DIM)
        cache.append(layer, k, v, pos)
        q = rng.fill(n * Q_HEADS * HEAD_DIM)
        rec.extend(f32_bytes(cache.attend(layer, q, pos if causal else None)))

    for layer in range(LAYERS):
        append_and_attend(layer, 0, PROMPT, True)
    for step in range(DECODE):
        for layer in range(LAYERS):
            append_and_attend(layer, PROMPT + step, 1, False)
    for layer in range(LAYERS):
        for head in range(KV_HEADS):
            data = cache.read(layer, head)
            rec.extend(struct.pack("<Q", len(data.positions)))
            rec.extend(f32_bytes(data.keys) + f32_bytes(data.values))
            rec.extend(struct.pack(f"<{len(data.positions)}i", *data.positions))
    s = cache.stats()
    rec.extend(struct.pack("<3Q", s.tokens, s.appended_tokens, s.bytes))
    rec.extend(struct.pack("<8Q", *s.bytes_by_tier))
    rec.extend(struct.pack("<Q", s.full_bytes))
    cache.close()
    ctx.close()
    with open(path, "wb") as f:
        f.write(rec)


if __name__ == "__main__":
    main(sys.argv[1])
