"""Helpers shared by the binding tests."""
import array

import kvsdk


def small_geometry():
    """2 layers, 4 query heads sharing 2 KV heads (GQA), head_dim 8, f32 in and out."""
    return kvsdk.Geometry(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=8,
                          dtype=kvsdk.Dtype.F32)


class Rng:
    """The 32-bit LCG of the parity scenario; draws are exact float32 values in [-1, 1)."""

    def __init__(self, seed):
        self.state = seed

    def draw(self, n):
        out = array.array("f")
        for _ in range(n):
            self.state = (self.state * 1664525 + 1013904223) & 0xFFFFFFFF
            out.append(((self.state >> 8) & 0xFFFF) / 32768.0 - 1.0)
        return out


def status_of(fn, *args, **kwargs):
    """The status of the KvsdkError that fn raises (None if it succeeds); the error must carry
    a detail message."""
    try:
        fn(*args, **kwargs)
    except kvsdk.KvsdkError as e:
        assert e.message, "a failure without a message"
        return e.status
    return None
