//! Collects the ```rust examples of the repository README into $OUT_DIR/readme_rust.md, which
//! src/lib.rs includes as doc tests, so `cargo test` compiles and runs them. (Including the whole
//! README would make rustdoc test its untagged blocks too.) Outside the repository (no README)
//! the file is empty.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let readme = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../../README.md");
    println!("cargo:rerun-if-changed={}", readme.display());
    let text = fs::read_to_string(&readme).unwrap_or_default();
    let mut out = String::new();
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
    let dest = PathBuf::from(env::var("OUT_DIR").unwrap()).join("readme_rust.md");
    fs::write(dest, out).unwrap();
}
