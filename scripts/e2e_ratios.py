#!/usr/bin/env python3
"""End-to-end decode speed of each preset against `full` with the reference runtime (issue 15).

kvsdk-demo times each row's decode by the wall clock (about half a second per row at 900 tokens),
and single rows vary by up to 2x on a shared or virtual machine. So every preset row is placed
between two `full` rows of the same run, its tokens/s is divided by their mean, and the median
over several runs is reported.

usage: scripts/e2e_ratios.py [--runs N] [--tokens T] [--demo PATH] [PRESET@BUDGET ...]
"""
import argparse
import statistics
import subprocess
import sys

DEFAULT_ROWS = ["kivi@50%", "snapkv@25%", "snapkv+kivi2@25%", "xkv+kivi2@25%", "pyramidkv@25%",
                "h2o@25%", "streaming_llm@25%", "specache", "smallkv@25%", "spindlekv@50%",
                "minicache"]


def tokens_per_s(line):
    """The tokens/s column of a demo table row: the integer before top-1 and 'yes'/'no'."""
    f = line.split()
    for i in range(len(f) - 2):
        if f[i].isdigit() and f[i + 2] in ("yes", "no") and f[i + 1].replace(".", "", 1).isdigit():
            return float(f[i])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=900)
    ap.add_argument("--demo", default="build/release/samples/demo/kvsdk-demo")
    ap.add_argument("rows", nargs="*", default=DEFAULT_ROWS)
    a = ap.parse_args()
    policy = ",".join(["full"] + [x for r in a.rows for x in (r, "full")])
    ratios = {r: [] for r in a.rows}
    for _ in range(a.runs):
        out = subprocess.run([a.demo, "--quiet", "--tokens", str(a.tokens), "--policy", policy],
                             check=True, capture_output=True, text=True).stdout
        speeds = [t for t in map(tokens_per_s, out.splitlines()) if t is not None]
        if len(speeds) != 2 * len(a.rows) + 1:
            sys.exit("unexpected demo table:\n" + out)
        for i, r in enumerate(a.rows):
            full = (speeds[2 * i] + speeds[2 * i + 2]) / 2
            ratios[r].append(speeds[2 * i + 1] / full)
    for r, v in ratios.items():
        print(f"{r:20s} x full median {statistics.median(v):.2f}   runs "
              + " ".join(f"{x:.2f}" for x in v))


if __name__ == "__main__":
    main()
