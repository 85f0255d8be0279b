"""Runs the parity scenario (SCENARIO.md) in C, Python and Rust and requires byte-identical
records and byte-identical snapshots (see SCENARIO.md). Without cargo, C and Python are still compared and the test reports itself
skipped (exit 77) so that the missing Rust side is visible.

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


def read(path):
    with open(path, "rb") as f:
        return f.read()


def compare_snapshots(snapshots):
    """Snapshots are deterministic (the snapshot id is a hash of the cache's state): three more
    C saves of the same cache must equal the first, and each language's snapshot must equal C's
    byte for byte."""
    reference = read(snapshots["c"])
    probes = [read(f"{snapshots['c']}.{i}") for i in (1, 2, 3)]
    if any(p != reference for p in probes):
        print("parity: saves of one unchanged C cache differ; the format is not deterministic")
        return False
    ok = True
    for name, path in snapshots.items():
        if name == "c":
            continue
        data = read(path)
        if data != reference:
            first = next((i for i in range(min(len(data), len(reference)))
                          if data[i] != reference[i]), min(len(data), len(reference)))
            print(f"parity: {name} snapshot differs from C: {len(data)} vs {len(reference)} "
                  f"bytes, first difference at byte {first}")
            ok = False
        else:
            print(f"parity: {name} snapshot identical to C ({len(reference)} bytes)")
    return ok


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

    records, snapshots = {}, {}
    for name in ("c", "python", "rust"):
        records[name] = os.path.join(args.work, f"record_{name}.bin")
        snapshots[name] = os.path.join(args.work, f"snapshot_{name}.kvsdk")
        stale = [records[name], snapshots[name]] + [f"{snapshots[name]}.{i}" for i in (1, 2, 3)]
        for path in stale:
            if os.path.exists(path):
                os.remove(path)
    run([args.c_program, records["c"], snapshots["c"]], env)
    run([sys.executable, os.path.join(here, "parity.py"), records["python"], snapshots["python"]],
        env)
    cargo = shutil.which("cargo")
    if cargo:
        manifest = os.path.join(args.source_dir, "bindings", "rust", "Cargo.toml")
        run([cargo, "run", "--quiet", "--offline", "--manifest-path", manifest, "--example",
             "parity", "--", records["rust"], snapshots["rust"]], env)
    else:
        del records["rust"], snapshots["rust"]

    reference = read(records["c"])
    if not reference:
        print("parity: the C record is empty")
        return 1
    failed = False
    for name, path in records.items():
        data = read(path)
        if data == reference:
            print(f"parity: {name} record identical to C ({len(data)} bytes)")
        else:
            first = next((i for i, (a, b) in enumerate(zip(data, reference)) if a != b),
                         min(len(data), len(reference)))
            print(f"parity: {name} record differs from C: {len(data)} vs {len(reference)} "
                  f"bytes, first difference at byte {first}")
            failed = True
    failed |= not compare_snapshots(snapshots)
    if failed:
        return 1
    if not cargo:
        print("parity: cargo not found on PATH: Rust side SKIPPED (C and Python identical)")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
