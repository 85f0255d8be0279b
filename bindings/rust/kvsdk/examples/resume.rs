//! kvsdk Rust sample: build a conversation's cache, compress it into a budget, save it, and
//! resume it from the snapshot in a fresh context, continuing bit-identically.
//!
//! Run: KVSDK_LIB_DIR=build/dev LD_LIBRARY_PATH=build/dev \
//!      cargo run --offline --manifest-path bindings/rust/Cargo.toml --example resume
use kvsdk::{Cache, Context, Dtype, Geometry, Policy, SaveOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let geometry = Geometry { dtype: Dtype::F32, ..Geometry::new(4, 8, 2, 32) };
    let (per_token, per_query) = (geometry.kv_elems_per_token(), geometry.q_elems_per_query());
    let mut seed = 42u32;
    let mut draw = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                ((seed >> 8) & 0xffff) as f32 / 32768.0 - 1.0
            })
            .collect()
    };

    // A SnapKV cache: prefill 128 tokens per layer, observing the prompt's last queries.
    let ctx = Context::with_budget(0)?;
    let mut policy = Policy::parse("snapkv")?;
    policy.obs_window = 8;
    let mut cache = Cache::new(&ctx, &geometry, &policy)?;
    let positions: Vec<i32> = (0..128).collect();
    for layer in 0..geometry.n_layers {
        cache.append(layer, &draw(128 * per_token), &draw(128 * per_token), &positions)?;
        let window = draw(8 * per_query);
        cache.observe(layer, &window, Some(&positions[120..]))?;
    }
    let full = cache.stats()?.bytes;

    // Compress to half the bytes (the observation windows' f32 queries count too).
    cache.set_budget(full / 2)?;
    cache.compress()?;
    let stats = cache.stats()?;
    println!(
        "compressed {} -> {} bytes; tokens per layer {:?}",
        full,
        stats.bytes,
        cache.allocation()?
    );

    // Suspend to a file, resume in a new context.
    let path = std::env::temp_dir().join(format!("kvsdk-resume-{}.kvsdk", std::process::id()));
    cache.save(&path, &SaveOptions::default())?;
    let resumed_ctx = Context::with_budget(0)?;
    let (mut resumed, info) = Cache::load(&resumed_ctx, &path, Some(&geometry))?;
    println!(
        "saved {} bytes; loaded format {}.{}",
        std::fs::metadata(&path)?.len(),
        info.format_major,
        info.format_minor
    );
    std::fs::remove_file(&path)?;

    // Both caches answer the next decode step identically.
    let (k, v, q) = (draw(per_token), draw(per_token), draw(per_query));
    for c in [&mut cache, &mut resumed] {
        c.append(0, &k, &v, &[128])?;
    }
    let (a, b) = (cache.attend(0, &q, None)?, resumed.attend(0, &q, None)?);
    assert_eq!(a, b, "the resumed cache continues bit-identically");
    println!("resumed cache continues bit-identically: OK");
    Ok(())
}
