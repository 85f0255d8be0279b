"""Runs the parity scenario (SCENARIO.md) in C, Python and Rust and requires byte-identical
records. Without cargo, C and Python are still compared and the test reports itself skipped
(exit 77) so that the missing Rust side is visible.

usage: run_parity.py --c-program PATH --lib-dir DIR --work DIR --source-dir DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

SKIP = 77


def run(cmd, env):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--c-program", required=True)
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--cargo-target-dir", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    env = dict(os.environ)
    env["KVSDK_LIB_DIR"] = args.lib_dir
    env["LD_LIBRARY_PATH"] = args.lib_dir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    env["PYTHONPATH"] = os.path.join(args.source_dir, "bindings", "python")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["CARGO_TARGET_DIR"] = args.cargo_target_dir
    here = os.path.dirname(os.path.abspath(__file__))

    records = {}
    for name in ("c", "python", "rust"):
        records[name] = os.path.join(args.work, f"record_{name}.bin")
        if os.path.exists(records[name]):
            os.remove(records[name])
    run([args.c_program, records["c"]], env)
    run([sys.executable, os.path.join(here, "parity.py"), records["python"]], env)
    cargo = shutil.which("cargo")
    if cargo:
        manifest = os.path.join(args.source_dir, "bindings", "rust", "Cargo.toml")
        run([cargo, "run", "--quiet", "--offline", "--manifest-path", manifest, "--example",
             "parity", "--", records["rust"]], env)
    else:
        del records["rust"]

    with open(records["c"], "rb") as f:
        reference = f.read()
    if not reference:
        print("parity: the C record is empty")
        return 1
    failed = False
    for name, path in records.items():
        with open(path, "rb") as f:
            data = f.read()
        if data == reference:
            print(f"parity: {name} record identical to C ({len(data)} bytes)")
        else:
            first = next((i for i, (a, b) in enumerate(zip(data, reference)) if a != b),
                         min(len(data), len(reference)))
            print(f"parity: {name} record differs from C: {len(data)} vs {len(reference)} "
                  f"bytes, first difference at byte {first}")
            failed = True
    if failed:
        return 1
    if not cargo:
        print("parity: cargo not found on PATH: Rust side SKIPPED (C and Python identical)")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
