//! Collects the ```rust examples of the repository README and of bindings/README.md (tensors
//! and dtypes) into $OUT_DIR/readme_rust.md, which src/lib.rs includes as doc tests, so `cargo
//! test` compiles and runs them. (Including the whole READMEs would make rustdoc test their
//! untagged blocks too.) Outside the repository (no README) the file is empty.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let mut out = String::new();
    for readme in [manifest.join("../../../README.md"), manifest.join("../../README.md")] {
        println!("cargo:rerun-if-changed={}", readme.display());
        rust_blocks(&fs::read_to_string(&readme).unwrap_or_default(), &mut out);
    }
    let dest = PathBuf::from(env::var("OUT_DIR").unwrap()).join("readme_rust.md");
    fs::write(dest, out).unwrap();
}

/// Appends the ```rust blocks of `text` to `out`.
fn rust_blocks(text: &str, out: &mut String) {
    let mut in_rust = false;
    for line in text.lines() {
        let fence = line.trim_start();
        if !in_rust && fence.starts_with("```rust") {
            in_rust = true;
            out.push_str("```rust\n");
        } else if in_rust && fence.starts_with("```") {
            in_rust = false;
            out.push_str("```\n\n");
        } else if in_rust {
            out.push_str(line);
            out.push('\n');
        }
    }
}
