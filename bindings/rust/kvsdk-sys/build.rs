//! Links libkvsdk built by CMake. Where it is, in order of preference:
//!   1. KVSDK_LIB_DIR: the folder holding libkvsdk.so (e.g. build/dev);
//!   2. pkg-config (an installed kvsdk, or PKG_CONFIG_PATH pointing at one);
//!   3. the default linker search path.
//! KVSDK_STATIC=1 links libkvsdk.a instead (then the C++ runtime and zstd are linked too).
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KVSDK_LIB_DIR");
    println!("cargo:rerun-if-env-changed=KVSDK_STATIC");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let statik = env::var("KVSDK_STATIC").map(|v| v == "1").unwrap_or(false);

    if let Ok(dir) = env::var("KVSDK_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    } else if let Some(dirs) = pkg_config_lib_dirs() {
        for dir in dirs {
            println!("cargo:rustc-link-search=native={dir}");
        }
    } else {
        println!(
            "cargo:warning=kvsdk-sys: KVSDK_LIB_DIR is not set and pkg-config does not know \
             kvsdk; relying on the default linker search path"
        );
    }

    if statik {
        println!("cargo:rustc-link-lib=static=kvsdk");
        println!("cargo:rustc-link-lib=dylib=zstd");
        println!("cargo:rustc-link-lib=dylib=stdc++");
    } else {
        println!("cargo:rustc-link-lib=dylib=kvsdk");
    }
}

/// `-L` folders that `pkg-config --libs-only-L kvsdk` reports, or None when pkg-config or the
/// kvsdk package is missing.
fn pkg_config_lib_dirs() -> Option<Vec<String>> {
    let out = Command::new("pkg-config").args(["--libs-only-L", "kvsdk"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.split_whitespace().filter_map(|f| f.strip_prefix("-L")).map(String::from).collect())
}
