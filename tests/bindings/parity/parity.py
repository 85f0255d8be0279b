"""Binding parity, Python side: the scenario of SCENARIO.md through the kvsdk package. Writes
the record to sys.argv[1] and the snapshot to sys.argv[2]; the C and Rust programs must match."""
import array
import struct
import sys

import kvsdk

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, PROMPT, WINDOW, DECODE = 3, 4, 2, 16, 24, 8, 4
PER_QUERY = Q_HEADS * HEAD_DIM


class Rng:
    def __init__(self, seed):
        self.state = seed

    def fill(self, n):
        out = array.array("f")
        for _ in range(n):
            self.state = (self.state * 1664525 + 1013904223) & 0xFFFFFFFF
            out.append(((self.state >> 8) & 0xFFFF) / 32768.0 - 1.0)
        return out


class Record(bytearray):
    def f32s(self, values):
        self.extend(struct.pack(f"<{len(values)}f", *values))

    def i32s(self, values):
        self.extend(struct.pack(f"<{len(values)}i", *values))

    def u64s(self, values):
        self.extend(struct.pack(f"<{len(values)}Q", *values))


def main(record_path, snapshot_path):
    rng, rec = Rng(20261120), Record()
    ctx = kvsdk.Context()
    g = kvsdk.Geometry(n_layers=LAYERS, n_q_heads=Q_HEADS, n_kv_heads=KV_HEADS,
                       head_dim=HEAD_DIM, dtype=kvsdk.Dtype.F32)
    policy = kvsdk.Policy.parse("snapkv")
    policy.obs_window = WINDOW
    cache = kvsdk.Cache(ctx, g, policy)

    def decode_step(cache, layer, pos, observe):
        k, v = rng.fill(KV_HEADS * HEAD_DIM), rng.fill(KV_HEADS * HEAD_DIM)
        cache.append(layer, k, v, [pos])
        q = rng.fill(PER_QUERY)
        rec.f32s(cache.attend(layer, q))
        if observe:
            cache.observe(layer, q, [pos])

    for layer in range(LAYERS):
        positions = list(range(PROMPT))
        k, v = rng.fill(PROMPT * KV_HEADS * HEAD_DIM), rng.fill(PROMPT * KV_HEADS * HEAD_DIM)
        cache.append(layer, k, v, positions)
        q = rng.fill(PROMPT * PER_QUERY)
        rec.f32s(cache.attend(layer, q, positions))
        cache.observe(layer, q[(PROMPT - WINDOW) * PER_QUERY:], positions[PROMPT - WINDOW:])

    size = cache.stats().bytes
    rec.u64s([size])
    cache.set_budget(size * 3 // 5)
    cache.compress()
    rec.u64s(cache.allocation())
    for step in range(DECODE):
        for layer in range(LAYERS):
            decode_step(cache, layer, PROMPT + step, True)
    for layer in range(LAYERS):
        for head in range(KV_HEADS):
            data = cache.read(layer, head)
            rec.u64s([len(data.positions)])
            rec.f32s(data.keys)
            rec.f32s(data.values)
            rec.i32s(data.positions)
    s = cache.stats()
    rec.u64s([s.tokens, s.appended_tokens, s.bytes, *s.bytes_by_tier, s.full_bytes])

    cache.save(snapshot_path)
    loaded, _ = kvsdk.Cache.load(ctx, snapshot_path, expected=g)
    p = loaded.policy
    rec.i32s([p.method, p.obs_window, p.pool_kernel, p.pool_kind])
    for layer in range(LAYERS):
        rec.f32s(loaded.attend(layer, rng.fill(PER_QUERY)))
    for layer in range(LAYERS):
        decode_step(loaded, layer, PROMPT + DECODE, False)
    branch = loaded.fork()
    for layer in range(LAYERS):
        decode_step(branch, layer, PROMPT + DECODE + 1, False)
    try:
        branch.truncate(PROMPT + DECODE + 1)
        rec.i32s([0])
    except kvsdk.KvsdkError as e:
        rec.i32s([int(e.status)])
    for layer in range(LAYERS):
        decode_step(branch, layer, PROMPT + DECODE + 1, False)
    branch.close()
    loaded.close()
    cache.close()
    ctx.close()
    with open(record_path, "wb") as f:
        f.write(rec)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
