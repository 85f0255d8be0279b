//! SpeCache through the safe API: prefetch, the fetch hit rate, a file-backed backing store
//! that gives the same results as host memory, and Unsupported for other policies.
use kvsdk::{Cache, Context, Dtype, Geometry, Policy, Status};

fn geometry() -> Geometry {
    Geometry { dtype: Dtype::F32, ..Geometry::new(2, 4, 2, 8) }
}

fn draw(state: &mut u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            ((*state >> 8) & 0xffff) as f32 / 32768.0 - 1.0
        })
        .collect()
}

fn specache_policy(spec: &str) -> Policy {
    let mut p = Policy::parse(spec).unwrap();
    p.quant_group = 8;
    p.quant_residual = 8;
    p.fetch_tokens = 6;
    p
}

fn fill(cache: &mut Cache) {
    let mut rng = 3u32;
    let positions: Vec<i32> = (0..40).collect();
    for layer in 0..2 {
        let (k, v) = (draw(&mut rng, 40 * 16), draw(&mut rng, 40 * 16));
        cache.append(layer, &k, &v, &positions).unwrap();
    }
}

#[test]
fn prefetch_changes_attention_and_measures_the_hit_rate() {
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &geometry(), &specache_policy("specache")).unwrap();
    fill(&mut cache);
    assert_eq!(cache.fetch_stats().unwrap(), (None, 0));
    let q = draw(&mut 9u32, 32);
    let before = cache.attend(0, &q, None).unwrap();
    cache.prefetch(0, &q, Some(40)).unwrap();
    let after = cache.attend(0, &q, None).unwrap();
    assert_ne!(before, after);
    let (hit, samples) = cache.fetch_stats().unwrap();
    assert_eq!(samples, 2);
    let hit = hit.unwrap();
    assert!(hit > 0.0 && hit <= 1.0);
    let stats = cache.stats().unwrap();
    assert!(stats.backing_bytes > 0);
    assert_eq!(stats.context_used_bytes, stats.bytes);
}

#[test]
fn backing_file_matches_host_memory() {
    let ctx = Context::with_budget(0).unwrap();
    let path = std::env::temp_dir().join(format!("kvsdk_rust_specache_{}.bin", std::process::id()));
    let mut host = Cache::new(&ctx, &geometry(), &specache_policy("specache+kivi1")).unwrap();
    let mut file = Cache::new(&ctx, &geometry(), &specache_policy("specache+kivi1")).unwrap();
    file.set_backing_file(&path).unwrap();
    fill(&mut host);
    fill(&mut file);
    let q = draw(&mut 11u32, 32);
    host.prefetch(1, &q, None).unwrap();
    file.prefetch(1, &q, None).unwrap();
    assert_eq!(host.attend(1, &q, None).unwrap(), file.attend(1, &q, None).unwrap());
    assert_eq!(file.set_backing_file(&path).unwrap_err().status, Status::State);
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn other_policies_are_unsupported() {
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &geometry(), &Policy::parse("kivi").unwrap()).unwrap();
    fill(&mut cache);
    let q = draw(&mut 1u32, 32);
    assert_eq!(cache.prefetch(0, &q, None).unwrap_err().status, Status::Unsupported);
    assert_eq!(cache.fetch_stats().unwrap_err().status, Status::Unsupported);
    assert_eq!(cache.set_backing_file("/tmp/unused").unwrap_err().status, Status::Unsupported);
}
