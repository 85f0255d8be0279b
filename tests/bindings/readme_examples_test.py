"""Keeps the README's binding examples honest:
  - every ```python block is executed (in a fresh namespace) against the real library;
  - every ```swift block appears line for line, in order, in the Swift package's test
    Tests/KVSDKTests/ReadmeExampleTests.swift (compiled and run by bindings/swift/check.sh);
  - ```rust blocks are compiled and run as doc tests of the kvsdk crate (see its build.rs).

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


def main(src):
    with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    failures = 0
    python_blocks = blocks(readme, "python")
    for i, code in enumerate(python_blocks):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), {"__name__": "__readme__"})
        print(f"README python block {i + 1}: ran OK")
    swift_test = os.path.join(src, "bindings/swift/Tests/KVSDKTests/ReadmeExampleTests.swift")
    with open(swift_test, encoding="utf-8") as f:
        swift_text = f.read()
    swift_blocks = blocks(readme, "swift")
    for i, code in enumerate(swift_blocks):
        missing = lines_in_order(code, swift_text)
        if missing:
            print(f"README swift block {i + 1}: line not in {swift_test}: {missing}")
            failures += 1
        else:
            print(f"README swift block {i + 1}: matches the compiled Swift test")
    if not python_blocks or not swift_blocks or not blocks(readme, "rust"):
        print("README lacks a python, swift or rust example")
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
