"""Fails when the bindings fall behind include/kvsdk.h:
  - every KVSDK_API function is declared in kvsdk-sys and in the Python ctypes table, and is
    called by the safe Rust crate, the Python package and the Swift wrapper;
  - every option/stats struct has the same fields in the same order in kvsdk-sys and in the
    Python ctypes declarations (a missing or reordered field would corrupt the ABI);
  - every enum constant of the header has the same value in kvsdk-sys;
  - every struct with a struct_size has a *_init_sized function and a *_init macro that passes the
    caller's size to it; the legacy *_init symbols (declared with parenthesized names, frozen at
    the first struct versions for apps built before) are not for bindings, and none calls them.

usage: header_coverage_test.py SOURCE_DIR
"""
import glob
import os
import re
import sys


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_all(pattern, exclude=()):
    return "\n".join(read(p) for p in sorted(glob.glob(pattern, recursive=True))
                     if os.path.basename(p) not in exclude)


def header_declarations(header):
    return re.findall(r"KVSDK_API\s[^;{]*;", header)


# A legacy symbol is declared as `KVSDK_API kvsdk_status (kvsdk_X_init)(...)`: the parentheses
# keep the `kvsdk_X_init` macro from expanding.
LEGACY = re.compile(r"KVSDK_API\s[^;{(]*?\(\s*(kvsdk_\w+)\s*\)\s*\(")


def header_functions(header):
    names = []
    for decl in header_declarations(header):
        if LEGACY.match(decl):
            continue
        m = re.match(r"KVSDK_API\s[^;{(]*?\b(kvsdk_\w+)\s*\(", decl)
        if m:
            names.append(m.group(1))
    return names


def legacy_functions(header):
    return [m.group(1) for d in header_declarations(header) for m in [LEGACY.match(d)] if m]


def header_structs(header):
    structs = {}
    for name, body in re.findall(r"typedef struct (kvsdk_\w+) \{(.*?)\}", header, flags=re.S):
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        structs[name] = re.findall(r"\b(\w+)\s*(?:\[[^\]]*\])?\s*;", body)
    return structs


def header_constants(header):
    body = "\n".join(re.findall(r"typedef enum \w+ \{(.*?)\}", header, flags=re.S))
    consts = {n: int(v) for n, v in re.findall(r"\b(KVSDK_\w+)\s*=\s*(\d+)", body)}
    for n, v in re.findall(r"#define (KVSDK_\w+) (\d+)\s*$", header, flags=re.M):
        consts[n] = int(v)
    return consts


def main(src):
    header = read(os.path.join(src, "include", "kvsdk.h"))
    sys_rs = read_all(os.path.join(src, "bindings/rust/kvsdk-sys/src/**/*.rs"))
    safe_rs = read_all(os.path.join(src, "bindings/rust/kvsdk/src/**/*.rs"))
    capi_py = read(os.path.join(src, "bindings/python/kvsdk/_capi.py"))
    api_py = read_all(os.path.join(src, "bindings/python/kvsdk/*.py"), exclude=("_capi.py",))
    swift = read_all(os.path.join(src, "bindings/swift/Sources/KVSDK/**/*.swift"))
    problems = []

    def binding_places(fn):
        """Where each binding declares or calls `fn`: (what, pattern, text)."""
        return [
            ("kvsdk-sys declaration", rf"pub fn {fn}\(", sys_rs),
            ("safe Rust crate call", rf"sys::{fn}\(", safe_rs),
            ("Python ctypes declaration", rf'"{fn}":', capi_py),
            ("Python package use", rf"lib\.{fn}\b", api_py),
            ("Swift wrapper call", rf"\b{fn}\(", swift),
        ]

    functions = header_functions(header)
    if len(functions) < 20:
        problems.append(f"found only {len(functions)} KVSDK_API functions; is the parser broken?")
    for fn in functions:
        for what, pattern, text in binding_places(fn):
            if not re.search(pattern, text):
                problems.append(f"{fn}: missing {what}")

    legacy = legacy_functions(header)
    if len(legacy) < 7:
        problems.append(f"found only {len(legacy)} legacy (kvsdk_*_init) symbols; parser broken?")
    for fn in legacy:
        if fn in functions:
            problems.append(f"{fn}: declared both as a legacy symbol and as a plain function")
        if f"{fn}_sized" not in functions:
            problems.append(f"{fn}: legacy symbol without a {fn}_sized function")
        macro = rf"#define {fn}\((\w+)[^)]*\)\s*\\?\s*{fn}_sized\(\(\1\), sizeof\(\w+\)"
        if not re.search(macro, header):
            problems.append(f"{fn}: no macro passing the caller's size to {fn}_sized")
        for what, pattern, text in binding_places(fn):
            if re.search(pattern, text):
                problems.append(f"{fn}: the {what} uses the legacy symbol (use {fn}_sized)")

    for name, fields in header_structs(header).items():
        if fields and fields[0] == "struct_size" and f"{name}_init_sized" not in functions:
            problems.append(f"struct {name}: has struct_size but no {name}_init_sized")
        m = re.search(rf"pub struct {name} \{{(.*?)\}}", sys_rs, flags=re.S)
        rs_fields = re.findall(r"pub (\w+):", m.group(1)) if m else None
        if rs_fields != fields:
            problems.append(f"struct {name}: kvsdk-sys fields {rs_fields} != header {fields}")
        m = re.search(rf"class {name}\(Structure\):\s*_fields_ = \[(.*?)\]\n", capi_py, flags=re.S)
        py_fields = re.findall(r'\("(\w+)",', m.group(1)) if m else None
        if py_fields != fields:
            problems.append(f"struct {name}: Python fields {py_fields} != header {fields}")

    for name, value in header_constants(header).items():
        m = re.search(rf"pub const {name}: \w+ = ([^;]+);", sys_rs)
        if not m:
            problems.append(f"constant {name}: missing in kvsdk-sys")
        elif m.group(1).strip().isdigit() and int(m.group(1)) != value:
            problems.append(f"constant {name}: kvsdk-sys {m.group(1)} != header {value}")

    for p in problems:
        print("MISSING:", p)
    print(f"header coverage: {len(functions)} functions, {len(legacy)} legacy init symbols, "
          f"{len(header_structs(header))} structs, {len(header_constants(header))} constants "
          f"checked; {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
