//! Compression, allocation planning, profiles and the planner through the safe API.
use kvsdk::{
    AllocTarget, Cache, Context, Dtype, Geometry, Method, Planner, Policy, Profile, Status,
};

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

fn window_policy() -> Policy {
    let mut p = Policy::parse("snapkv").unwrap();
    p.obs_window = 4;
    p
}

/// A snapkv cache with 32 tokens in each layer and a 4-query window observed.
fn filled_cache(ctx: &Context) -> Cache {
    let g = geometry();
    let mut cache = Cache::new(ctx, &g, &window_policy()).unwrap();
    let mut rng = 5u32;
    let positions: Vec<i32> = (0..32).collect();
    for layer in 0..g.n_layers {
        let (k, v) = (draw(&mut rng, 32 * 16), draw(&mut rng, 32 * 16));
        cache.append(layer, &k, &v, &positions).unwrap();
        cache.observe(layer, &draw(&mut rng, 4 * 32), Some(&positions[28..])).unwrap();
    }
    cache
}

#[test]
fn budget_compresses_and_allocation_round_trips() {
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = filled_cache(&ctx);
    assert_eq!(cache.allocation().unwrap(), vec![32, 32]);
    let (capacity, token_bytes) = cache.token_capacity().unwrap();
    assert_eq!(capacity, None, "no budget applies");
    assert!(token_bytes > 0);

    let before = cache.stats().unwrap();
    cache.set_budget(before.bytes / 2).unwrap();
    cache.compress().unwrap();
    let after = cache.stats().unwrap();
    assert!(after.bytes <= before.bytes / 2, "{} > {}", after.bytes, before.bytes / 2);
    assert!(cache.allocation().unwrap().iter().all(|&n| n < 32));
    assert!(cache.token_capacity().unwrap().0.is_some());

    cache.set_allocation(Some(&[8, 6])).unwrap();
    assert_eq!(cache.allocation().unwrap(), vec![8, 6]);
    assert_eq!(cache.read::<f32>(1, 0).unwrap().positions.len(), 6);
    assert_eq!(cache.set_allocation(Some(&[8])).unwrap_err().status, Status::InvalidArg);
    cache.set_allocation(None).unwrap();

    let q = vec![0.0f32; 3];
    assert_eq!(cache.observe(0, &q, None).unwrap_err().status, Status::InvalidArg);
    assert_eq!(cache.observe(5, &vec![0.0f32; 32], None).unwrap_err().status, Status::OutOfRange);

    let mut full = Cache::new(&ctx, &geometry(), &Policy::new(Method::Full).unwrap()).unwrap();
    assert_eq!(full.set_allocation(Some(&[1, 1])).unwrap_err().status, Status::Unsupported);
}

#[test]
fn plan_allocation_marshals_every_layer() {
    let w0 = [1.0f32, 0.0, 0.0, 0.0];
    let w1 = [1.0f32, 1.0, 1.0];
    let all = kvsdk::plan_allocation(&[&w0, &w1], AllocTarget::TotalTokens(7)).unwrap();
    assert_eq!(all, vec![4, 3]);
    let some = kvsdk::plan_allocation(&[&w0, &w1], AllocTarget::TotalTokens(4)).unwrap();
    assert_eq!(some.iter().sum::<u64>(), 4);
    assert_eq!(some, vec![1, 3], "layer 0 keeps its one weighted token, layer 1 all three");
    let err = kvsdk::plan_allocation(&[&[-1.0f32][..]], AllocTarget::TotalTokens(1)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);
    let err = kvsdk::plan_allocation(&[&w0[..]], AllocTarget::TargetRetention(1.5)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);
}

#[test]
fn profiles_record_save_load_and_apply() {
    let mut profile = Profile::new(2).unwrap();
    assert_eq!(profile.shares().unwrap_err().status, Status::State);
    profile.record(&[2, 6]).unwrap();
    profile.record(&[1, 3]).unwrap();
    assert_eq!(profile.shares().unwrap(), (vec![0.25, 0.75], 2));
    assert_eq!(profile.record(&[1]).unwrap_err().status, Status::InvalidArg);

    let dir = std::env::temp_dir().join(format!("kvsdk-rust-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("task.kvap");
    profile.save(&path).unwrap();
    let loaded = Profile::load(&path, 2).unwrap();
    assert_eq!(loaded.shares().unwrap(), (vec![0.25, 0.75], 2));
    assert_eq!(Profile::load(&path, 3).unwrap_err().status, Status::InvalidArg);
    assert_eq!(Profile::load(dir.join("missing"), 2).unwrap_err().status, Status::Io);
    std::fs::remove_dir_all(&dir).unwrap();

    let ctx = Context::with_budget(0).unwrap();
    let mut cache = filled_cache(&ctx);
    let budget = cache.stats().unwrap().bytes / 2;
    cache.set_budget(budget).unwrap();
    cache.apply_profile(Some(&loaded)).unwrap();
    drop(loaded); // the cache copied the shares
    let alloc = cache.allocation().unwrap();
    assert!(alloc[0] < alloc[1], "shares 1:3 give layer 1 more rows: {alloc:?}");
    cache.apply_profile(None).unwrap();
}

#[test]
fn planner_feeds_layers_and_plans() {
    let g = geometry();
    let mut planner = Planner::new(&g, &window_policy()).unwrap();
    let mut rng = 9u32;
    let positions: Vec<i32> = (0..32).collect();
    assert_eq!(planner.finish(AllocTarget::TotalTokens(20)).unwrap_err().status, Status::State);
    for layer in 0..g.n_layers {
        let k = draw(&mut rng, 32 * 16);
        let q = draw(&mut rng, 4 * 32);
        planner.feed_layer(layer, &k, &positions, &q, Some(&positions[28..])).unwrap();
    }
    let plan = planner.finish(AllocTarget::TotalTokens(20)).unwrap();
    assert_eq!(plan.len(), 2);
    assert_eq!(plan.iter().sum::<u64>(), 20);
    assert!(plan.iter().all(|&n| n >= 4), "each layer keeps its window: {plan:?}");
    let err = planner.feed_layer(0, &[0.0f32; 3], &[0], &[0.0f32; 32], None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);

    let ctx = Context::with_budget(0).unwrap();
    let mut cache = filled_cache(&ctx);
    cache.set_allocation(Some(&plan)).unwrap();
    assert_eq!(cache.allocation().unwrap(), plan);
}

#[test]
fn evict_slack_defaults_round_trips_and_is_checked() {
    let p = Policy::parse("h2o").unwrap();
    assert_eq!(p.evict_slack, 0.0625, "the header's default");
    let ctx = Context::with_budget(0).unwrap();
    let g = geometry();
    let mut exact = p;
    exact.evict_slack = 0.0;
    let cache = Cache::new(&ctx, &g, &exact).unwrap();
    assert_eq!(cache.policy().unwrap().evict_slack, 0.0);
    let mut bad = p;
    bad.evict_slack = 0.75;
    assert_eq!(Cache::new(&ctx, &g, &bad).unwrap_err().status, Status::InvalidArg);
    bad.evict_slack = f32::NAN;
    assert_eq!(Cache::new(&ctx, &g, &bad).unwrap_err().status, Status::InvalidArg);
}

#[test]
fn kivi_weight_bits_default_resolves_by_quant_bits_and_is_checked() {
    let ctx = Context::with_budget(0).unwrap();
    let g = geometry();
    let p = Policy::parse("kivi").unwrap();
    assert_eq!(p.kivi_weight_bits, 0, "the header's default: by quant_bits");
    assert_eq!(Cache::new(&ctx, &g, &p).unwrap().policy().unwrap().kivi_weight_bits, 7);
    let p4 = Policy::parse("snapkv+kivi4").unwrap();
    assert_eq!(Cache::new(&ctx, &g, &p4).unwrap().policy().unwrap().kivi_weight_bits, 14);
    let mut wide = p;
    wide.kivi_weight_bits = 14;
    assert_eq!(Cache::new(&ctx, &g, &wide).unwrap().policy().unwrap().kivi_weight_bits, 14);
    let mut bad = p;
    bad.kivi_weight_bits = 8;
    assert_eq!(Cache::new(&ctx, &g, &bad).unwrap_err().status, Status::InvalidArg);
}

#[test]
fn auto_residual_window_is_resolved_for_the_head_dim() {
    // head_dim 8 and 2 bits: round(768 / 8) = 96 (kvsdk.h, KVSDK_QUANT_RESIDUAL_AUTO).
    let g = geometry();
    let mut p = Policy::parse("kivi").unwrap();
    p.quant_residual = Policy::RESIDUAL_AUTO;
    let ctx = Context::with_budget(0).unwrap();
    let cache = Cache::new(&ctx, &g, &p).unwrap();
    assert_eq!(cache.policy().unwrap().quant_residual, 96);
    p.quant_residual = -2;
    assert_eq!(Cache::new(&ctx, &g, &p).unwrap_err().status, Status::InvalidArg);
}
