"""kvsdk Python sample: build a conversation's cache, compress it into a budget, save it, and
resume it from the snapshot in a fresh context, continuing bit-identically.

Run: PYTHONPATH=bindings/python KVSDK_LIB_DIR=build/dev python3 bindings/python/examples/resume.py
Exits non-zero (an exception or the final check) when anything fails.
"""
import array
import os
import sys
import tempfile

import kvsdk


def main():
    geometry = kvsdk.Geometry(n_layers=4, n_q_heads=8, n_kv_heads=2, head_dim=32,
                              dtype=kvsdk.Dtype.F32)
    per_token, per_query = geometry.kv_elems_per_token, geometry.q_elems_per_query
    state = [42]

    def draw(n):
        out = array.array("f")
        for _ in range(n):
            state[0] = (state[0] * 1664525 + 1013904223) & 0xFFFFFFFF
            out.append(((state[0] >> 8) & 0xFFFF) / 32768.0 - 1.0)
        return out

    # A SnapKV cache: prefill 128 tokens per layer, observing the prompt's last 8 queries.
    ctx = kvsdk.Context()
    policy = kvsdk.Policy.parse("snapkv")
    policy.obs_window = 8
    cache = kvsdk.Cache(ctx, geometry, policy)
    for layer in range(geometry.n_layers):
        cache.append(layer, draw(128 * per_token), draw(128 * per_token), range(128))
        cache.observe(layer, draw(8 * per_query), range(120, 128))
    full = cache.stats().bytes

    # Compress to half the bytes (the observation windows' f32 queries count too).
    cache.set_budget(full // 2)
    cache.compress()
    print(f"compressed {full} -> {cache.stats().bytes} bytes; "
          f"tokens per layer {cache.allocation()}")

    # Suspend to a file, resume in a new context.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "conversation.kvsdk")
        cache.save(path)
        resumed, info = kvsdk.Cache.load(kvsdk.Context(), path, expected=geometry)
        print(f"saved {os.path.getsize(path)} bytes; loaded format "
              f"{info.format_major}.{info.format_minor}")

    # Both caches answer the next decode step identically.
    k, v, q = draw(per_token), draw(per_token), draw(per_query)
    for c in (cache, resumed):
        c.append(0, k, v, [128])
    if cache.attend(0, q) != resumed.attend(0, q):
        sys.exit("the resumed cache differs: FAILED")  # exit status 1
    print("resumed cache continues bit-identically: OK")


if __name__ == "__main__":
    main()
