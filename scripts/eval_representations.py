#!/usr/bin/env python3
"""Measures the choices of save-time KIVI representations (issue 19) with kvsdk-eval and writes
docs/eval/representations.md: the exact residual window R (fixed values against
KVSDK_QUANT_RESIDUAL_AUTO), its dependence on the KIVI width and head_dim, the group size G, and
a live KIVI overlay against the same rows quantized at save time.

Every row is one kvsdk-eval cell: a live policy at a budget, its resume snapshot written
converted to KIVI (`--save-as`, as kvsdk_save_options.target_policy / `kvsdk recompress`), loaded
back, and the continuation scored on the loaded cache against the full cache.

usage: scripts/eval_representations.py [--eval PATH] [--out FILE]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each sweep: a title, why it is measured, the cells (models, live policies, budgets: one
# kvsdk-eval run each) and the variants (columns: extra kvsdk-eval arguments), run as a grid.
SHAKESPEARE = "shakespeare-base,shakespeare-small"
SWEEPS = [
    ("Residual window at 2 bits, head_dim 64",
     "The shakespeare models (head_dim 64, 1 KV head), 128 to 767 rows per layer: a window of "
     "8 to 16 rows gives the KL of 128, longer windows add bytes only, no window costs KL. "
     "R=auto is 16 here.",
     [(SHAKESPEARE, "full", "100"), (SHAKESPEARE, "h2o,snapkv", "50,25,15")],
     [("R=%s" % r, ["--save-as", "2", "--save-residual", r])
      for r in ("0", "8", "16", "24", "48", "128", "auto")]),
    ("Residual window at 2 bits, head_dim 8",
     "stories260K (head_dim 8): quantized scores are noisier and 16 rows are not enough, at 128 "
     "rows (StreamingLLM at 25%) as at 383 (the full cache); about 96 are. R=auto is 96 here. "
     "(Its h2o, snapkv and xkv evict per KV head, which a conversion refuses, so only the full "
     "cache and StreamingLLM are converted.)",
     [("stories260K", "full", "100"), ("stories260K", "streaming_llm", "25")],
     [("R=%s" % r, ["--save-as", "2", "--save-residual", r])
      for r in ("16", "32", "64", "96", "128", "auto")]),
    ("Residual window at 1 and 4 bits",
     "The window a width needs: 1 bit about 4x the rows of 2 bits (R=auto: 48 at head_dim 64, "
     "128 at head_dim 8), 4 bits no more than 16 (R=auto: 16).",
     [("stories260K,shakespeare-base", "full", "100"), ("shakespeare-base", "h2o", "15")],
     [("%s bits, R=%s" % (b, r), ["--save-as", b, "--save-residual", r])
      for b in ("1", "4") for r in ("0", "16", "48", "128", "auto")]),
    ("Group size",
     "G = 64 against the default 32 (keys per 64 tokens, values per 64 channels): fewer scales, "
     "but the exact window holds R to R + G - 1 rows, so at these lengths the files grow.",
     [("shakespeare-base", "h2o", "25,15")],
     [("%s bits, G=%s" % (b, g), ["--save-as", b, "--save-group", g])
      for b in ("1", "2", "4") for g in ("32", "64")]),
    ("Live KIVI overlay against quantizing at save time",
     "The live 'h2o+kiviN' overlay keeps its default window (128 rows), and its key blocks turn "
     "ragged as eviction drops rows (each keeps its per-channel scales); converting the kept "
     "rows of a live h2o at save time quantizes them in whole blocks with the automatic window.",
     [("shakespeare-base", "h2o", "25,15")],
     [("live h2o", []), ("live h2o+kivi2", ["--live-overlay", "2"]),
      ("live h2o+kivi4", ["--live-overlay", "4"]),
      ("h2o saved as h2o+kivi2", ["--save-as", "2"]),
      ("h2o saved as h2o+kivi4", ["--save-as", "4"])]),
]


# Choices measured once with a patched build and not kept (no option reproduces them): the
# figures as measured, for the record.
NOT_KEPT = """## Measured and not kept

Both measured on 2026-11-25 on the machine above, shakespeare-base, live h2o saved as
h2o+kiviN with the automatic window, with a one-off patch of the library (not in the tree).

**8-bit scales and zero points.** KIVI stores each group's scale and zero point as f16: at 2
bits and G = 32 they are a third of a quantized row (8 + 8 of 48 bytes a token, with 32 bytes of
codes). Rounded to 8 bits (the f16's sign, exponent and 2 mantissa bits: the scale rounded up,
the zero point down, so every value stays in range), they would cost half:

| width | budget | f16 scales: snapshot / top-1 / KL | 8-bit scales: snapshot / top-1 / KL |
|---|---:|---:|---:|
| 2 bits | 50% | 0.165 / 0.977 / 0.0042 | 0.138 / 0.957 / 0.0109 |
| 2 bits | 25% | 0.102 / 0.930 / 0.0054 | 0.091 / 0.938 / 0.0106 |
| 2 bits | 15% | 0.075 / 0.965 / 0.0061 | 0.069 / 0.938 / 0.0120 |
| 4 bits | 50% | 0.253 / 0.984 / 0.0012 | 0.234 / 0.988 / 0.0012 |
| 4 bits | 25% | 0.144 / 0.957 / 0.0035 | 0.134 / 0.961 / 0.0035 |
| 4 bits | 15% | 0.096 / 0.961 / 0.0042 | 0.092 / 0.953 / 0.0043 |

At 2 bits KL doubles past the 0.01 target; at 4 bits the file is 4 to 8% smaller at the same
fidelity, which is less than going from 4 to 2 bits with f16 scales gains. Scales stay f16.

**Per-layer widths from XKV's importance.** XKV gives the early layers of shakespeare-base more
rows (its allocation at 15%: 142, 135, 135, 134, 120, 117, 120, 119 rows for layers 0..7), so a
mixed-precision allocation from the same importance gives them more bits. Per-layer widths
(layers 0..7) against uniform 2 bits:

| widths | 50%: snapshot / top-1 / KL | 25% | 15% |
|---|---:|---:|---:|
| 2 everywhere | 0.165 / 0.977 / 0.0042 | 0.102 / 0.930 / 0.0054 | 0.075 / 0.965 / 0.0061 |
| 4,4,4,4,1,1,1,1 (XKV's order) | 0.186 / 0.953 / 0.0059 | 0.112 / 0.945 / 0.0073 | 0.082 / 0.941 / 0.0079 |
| 1,1,1,1,4,4,4,4 (reversed) | 0.194 / 0.965 / 0.0033 | 0.116 / 0.953 / 0.0052 | 0.079 / 0.941 / 0.0053 |
| 4,4,2,2,2,2,1,1 (XKV's order) | 0.173 / 0.965 / 0.0063 | 0.106 / 0.930 / 0.0082 | 0.078 / 0.957 / 0.0082 |
| 1,1,2,2,2,2,4,4 (reversed) | 0.181 / 0.977 / 0.0039 | 0.109 / 0.938 / 0.0051 | 0.077 / 0.957 / 0.0055 |
| 2,2,2,2,1,1,1,1 (XKV's order) | 0.144 / 0.941 / 0.0075 | 0.093 / 0.934 / 0.0091 | 0.070 / 0.930 / 0.0099 |
| 1,1,1,1,2,2,2,2 (reversed) | 0.148 / 0.965 / 0.0055 | 0.094 / 0.934 / 0.0068 | 0.070 / 0.945 / 0.0064 |

The deep layers, which XKV gives fewer rows, are the ones quantization hurts: widths in XKV's
order are worse than uniform at equal or larger size, and the reversed order is no better than
uniform at its size. Uniform widths are kept.
"""


def run(evaluator, models, policies, budgets, extra):
    # --live-overlay N (this script's own): the live policy is the method's '+kiviN' overlay.
    if extra[:1] == ["--live-overlay"]:
        policies = ",".join(p + "+kivi" + extra[1] for p in policies.split(","))
        extra = extra[2:]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cells.json")
        cmd = [evaluator, "--models", models, "--policies", policies, "--budgets", budgets,
               "--json", out] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            return cmd, json.load(f)


def command_text(cmd):
    at = cmd.index("--json")
    return " ".join(["kvsdk-eval"] + cmd[1:at] + cmd[at + 2:])


def live_policy(label):
    """'h2o>kivi2@R16' -> 'h2o': the live policy of a cell."""
    return label.split(">")[0]


def cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval", default=os.path.join(ROOT, "build/release/samples/eval/kvsdk-eval"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/eval/representations.md"))
    args = ap.parse_args()
    lines = [
        "# Save-time KIVI representations: what each choice costs and gives",
        "",
        "Written by `scripts/eval_representations.py` on %s (%s, %s). Each cell is one "
        "kvsdk-eval measurement: the live policy at the budget (a share of the full cache's "
        "bytes for the whole sequence), its resume snapshot written converted to KIVI "
        "(`--save-as N`: kvsdk_save_options.target_policy, the same as `kvsdk recompress`), "
        "loaded back, and the continuation scored on the loaded cache. `snapshot` is that file "
        "against the full cache's snapshot at the same point; top-1 and KL are against the full "
        "cache. `R=auto` is KVSDK_QUANT_RESIDUAL_AUTO (include/kvsdk.h); G is 32 unless a "
        "column says otherwise. Top-1 moves in steps of 1/256 (the continuation's length), so "
        "differences of 0.01 are a few tokens." % (
            datetime.date.today().isoformat(), cpu_name(), "%d cores" % os.cpu_count()),
        "",
    ]
    for title, why, cells, variants in SWEEPS:
        lines += ["## " + title, "", why, "", "Commands:", ""]
        table = {}  # (model, live policy, budget) -> {variant: cell}
        for name, extra in variants:
            for models, policies, budgets in cells:
                cmd, out = run(args.eval, models, policies, budgets, extra)
                lines.append("    " + command_text(cmd))
                for c in out:
                    key = (c["model"], live_policy(c["policy"]), c["budget_pct"])
                    table.setdefault(key, {})[name] = c
        names = [n for n, _ in variants]
        lines += ["", "Each cell: snapshot (x full) / top-1 / KL (nats).", "",
                  "| model | live policy | budget | " + " | ".join(names) + " |",
                  "|---|---|---:|" + "---:|" * len(names)]
        for (model, policy, budget), by_variant in table.items():
            row = []
            for n in names:
                c = by_variant.get(n)
                if c is None:
                    row.append("")
                elif c["status"] != "ok":
                    row.append(c["status"])
                else:
                    row.append("%.3f / %.3f / %.4f" % (c["snapshot_bytes"] / c["full_snapshot_bytes"],
                                                      c["top1_agreement"], c["kl"]))
            lines.append("| %s | %s | %d%% | %s |" % (model, policy, budget, " | ".join(row)))
        lines.append("")
    lines.append(NOT_KEPT)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
