"""Keeps the binding examples of README.md and bindings/README.md (tensors and dtypes) honest:
  - every ```python block is executed (in a fresh namespace) against the real library (a block
    that imports numpy is skipped, saying so, when numpy is not installed);
  - every ```swift block appears line for line, in order, in the Swift package's test
    Tests/KVSDKTests/ReadmeExampleTests.swift (compiled and run by bindings/swift/check.sh);
  - ```rust blocks are compiled and run as doc tests of the kvsdk crate (see its build.rs).
Exits non-zero on any failure.

usage: readme_examples_test.py SOURCE_DIR
"""
import os
import re
import sys


def blocks(text, lang):
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def lines_in_order(snippet, text):
    """The first snippet line (import lines aside) not found in order in `text`, or None."""
    body = [ln.strip() for ln in text.splitlines()]
    i = 0
    for line in snippet.splitlines():
        line = line.strip()
        if not line or line.startswith("import "):
            continue
        while i < len(body) and body[i] != line:
            i += 1
        if i == len(body):
            return line
        i += 1
    return None


def check_readme(src, path, swift_test, swift_text):
    """Runs the python blocks of one README and matches its swift blocks; returns (failures,
    {language: number of blocks})."""
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    name = os.path.relpath(path, src)
    failures = 0
    python_blocks = blocks(readme, "python")
    for i, code in enumerate(python_blocks):
        try:
            exec(compile(code, f"{name} python block {i + 1}", "exec"), {"__name__": "__readme__"})
        except ModuleNotFoundError as e:
            if e.name != "numpy":
                raise
            print(f"{name} python block {i + 1}: SKIPPED (numpy is not installed)")
            continue
        print(f"{name} python block {i + 1}: ran OK")
    swift_blocks = blocks(readme, "swift")
    for i, code in enumerate(swift_blocks):
        missing = lines_in_order(code, swift_text)
        if missing:
            print(f"{name} swift block {i + 1}: line not in {swift_test}: {missing}")
            failures += 1
        else:
            print(f"{name} swift block {i + 1}: matches the compiled Swift test")
    counts = {lang: len(blocks(readme, lang)) for lang in ("python", "swift", "rust")}
    return failures, counts


def main(src):
    swift_test = os.path.join(src, "bindings/swift/Tests/KVSDKTests/ReadmeExampleTests.swift")
    with open(swift_test, encoding="utf-8") as f:
        swift_text = f.read()
    failures = 0
    for path in (os.path.join(src, "README.md"), os.path.join(src, "bindings", "README.md")):
        failed, counts = check_readme(src, path, swift_test, swift_text)
        failures += failed
        if not all(counts.values()):
            print(f"{path} lacks a python, swift or rust example: {counts}")
            failures += 1
    print(f"README examples: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
