//! The safe API over the real library: marshalling, errors with status and message, ownership.
use kvsdk::{Cache, Context, Dtype, Geometry, Method, Policy, Status, Tier, F16};

fn geometry() -> Geometry {
    // 2 layers, 4 query heads sharing 2 KV heads (GQA), head_dim 8, f32 in and out.
    let mut g = Geometry::new(2, 4, 2, 8);
    g.dtype = Dtype::F32;
    g
}

/// Token t, KV head h, channel c holds a value exactly representable in f16.
fn kv(tokens: std::ops::Range<i32>, g: &Geometry, scale: f32) -> Vec<f32> {
    let mut out = Vec::new();
    for t in tokens {
        for h in 0..g.n_kv_heads as i32 {
            for c in 0..g.head_dim as i32 {
                out.push(scale * ((t * 7 + h * 3 + c) % 16) as f32 / 8.0);
            }
        }
    }
    out
}

#[test]
fn version_matches_header() {
    assert_eq!(kvsdk::version() / 10000, kvsdk::HEADER_VERSION / 10000);
    assert_eq!(kvsdk::version_string().split('.').count(), 3);
}

#[test]
fn append_read_attend_and_stats() {
    let g = geometry();
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &g, &Policy::parse("full").unwrap()).unwrap();
    let positions: Vec<i32> = (0..5).collect();
    let k = kv(0..5, &g, 1.0);
    let v = kv(0..5, &g, -0.5);
    cache.append(1, &k, &v, &positions).unwrap();

    let head = cache.read::<f32>(1, 1).unwrap();
    assert_eq!(head.positions, positions);
    let d = g.head_dim as usize;
    for t in 0..5 {
        let src = (t * g.n_kv_heads as usize + 1) * d;
        assert_eq!(&head.keys[t * d..(t + 1) * d], &k[src..src + d]);
        assert_eq!(&head.values[t * d..(t + 1) * d], &v[src..src + d]);
    }
    assert_eq!(cache.token_count(0, 0).unwrap(), 0);

    // A zero query weighs every token equally: the output is the mean of the values.
    let q = vec![0.0f32; g.q_elems_per_query()];
    let out = cache.attend(1, &q, None).unwrap();
    for qh in 0..g.n_q_heads as usize {
        let kvh = qh / 2;
        for c in 0..d {
            let mean: f32 = (0..5).map(|t| v[(t * 2 + kvh) * d + c]).sum::<f32>() / 5.0;
            assert!((out[qh * d + c] - mean).abs() < 1e-6, "head {qh} channel {c}");
        }
    }
    // Causal: a query at position 0 sees only token 0.
    let out0 = cache.attend(1, &q, Some(&[0])).unwrap();
    assert_eq!(&out0[..d], &v[..d]);

    let stats = cache.stats().unwrap();
    assert_eq!(stats.n_layers, 2);
    assert_eq!(stats.tokens, 10);
    assert_eq!(stats.appended_tokens, 5);
    assert_eq!(stats.bytes, stats.bytes_by_tier.iter().sum::<u64>());
    assert!(stats.bytes_by_tier[Tier::Exact as usize] > 0);
    assert_eq!(stats.context_used_bytes, ctx.used_bytes().unwrap());
    let layer = cache.layer_stats(1).unwrap();
    assert_eq!((layer.layer, layer.tokens, layer.tokens_min_head), (1, 10, 5));
    assert_eq!(cache.layer_stats(0).unwrap().tokens, 0);
    // The library resolves attn_scale 0 to 1/sqrt(head_dim); everything else comes back as set.
    let back = cache.geometry().unwrap();
    assert_eq!(back.attn_scale, 1.0 / (g.head_dim as f32).sqrt());
    assert_eq!(Geometry { attn_scale: 0.0, ..back }, g);
}

#[test]
fn errors_carry_status_and_message_and_change_nothing() {
    let g = geometry();
    let per_token = (g.n_kv_heads * g.head_dim * 2 * 2 + g.n_kv_heads * 4) as u64;
    let ctx = Context::with_budget(per_token * 3).unwrap();
    assert_eq!(ctx.budget_bytes().unwrap(), per_token * 3);
    let mut cache = Cache::new(&ctx, &g, &Policy::new(Method::Full).unwrap()).unwrap();
    cache.append(0, &kv(0..2, &g, 1.0), &kv(0..2, &g, 1.0), &[0, 1]).unwrap();
    let before = cache.stats().unwrap();

    let err = cache.append(0, &kv(2..4, &g, 1.0), &kv(2..4, &g, 1.0), &[2, 3]).unwrap_err();
    assert_eq!(err.status, Status::Budget);
    assert!(!err.message.is_empty());
    assert!(err.to_string().contains(&err.message));

    let err = cache.append(7, &kv(2..3, &g, 1.0), &kv(2..3, &g, 1.0), &[2]).unwrap_err();
    assert_eq!(err.status, Status::OutOfRange);
    let err = cache.append(0, &kv(2..3, &g, 1.0), &kv(2..4, &g, 1.0), &[2]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);
    let err = cache.append(0, &kv(2..4, &g, 1.0), &kv(2..4, &g, 1.0), &[2]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg, "kv size does not match one token");
    let err = cache.append(0, &[F16(0); 16], &[F16(0); 16], &[2]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg, "F16 buffers for an f32 cache");
    assert!(err.message.contains("expected f32 elements for an F32 cache, got kvsdk::F16"));
    let err = cache.append(0, &kv(2..3, &g, 1.0), &kv(2..3, &g, 1.0), &[-1]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);

    let mut out = vec![7.0f32; g.q_elems_per_query()];
    let q = vec![0.0f32; g.q_elems_per_query() + 1];
    assert_eq!(cache.attend_into(0, &q, None, &mut out).unwrap_err().status, Status::InvalidArg);
    let q = vec![0.0f32; g.q_elems_per_query()];
    let err = cache.attend_into(0, &q, None, &mut out[..3]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);
    assert_eq!(cache.attend_into(9, &q, None, &mut out).unwrap_err().status, Status::OutOfRange);
    assert!(out.iter().all(|x| *x == 7.0), "output untouched on failure");
    assert_eq!(cache.read::<f32>(0, 5).unwrap_err().status, Status::OutOfRange);
    assert_eq!(cache.layer_stats(2).unwrap_err().status, Status::OutOfRange);

    assert_eq!(cache.stats().unwrap(), before);
}

#[test]
fn policies_and_methods() {
    for m in Method::ALL {
        assert_eq!(Method::from_raw(m.raw()), m);
        let name = m.name().unwrap();
        assert_eq!(Policy::parse(name).unwrap().method, m);
        assert_eq!(Policy::new(m).unwrap().method, m);
    }
    assert_eq!(Method::Unknown(99).name(), None);
    assert_eq!(Policy::new(Method::Unknown(99)).unwrap_err().status, Status::InvalidArg);
    assert_eq!(Policy::parse("no-such-method").unwrap_err().status, Status::InvalidArg);
    assert_eq!(Policy::parse("fu\0ll").unwrap_err().status, Status::InvalidArg);
    let p = Policy::parse("xkv+kivi2").unwrap();
    assert_eq!((p.method, p.quant_bits), (Method::Xkv, 2));
    assert_eq!(Status::Budget.raw(), kvsdk::sys::KVSDK_E_BUDGET);
    assert!(!Status::Unknown(1234).description().is_empty());
}

#[test]
fn invalid_geometry_is_rejected() {
    let ctx = Context::with_budget(0).unwrap();
    let mut g = geometry();
    g.n_q_heads = 3; // not a multiple of n_kv_heads
    let err = Cache::new(&ctx, &g, &Policy::new(Method::Full).unwrap()).unwrap_err();
    assert_eq!(err.status, Status::InvalidArg);
    assert!(!err.message.is_empty());
}

#[test]
fn half_precision_uses_f16_elements() {
    let mut g = geometry();
    g.dtype = Dtype::F16;
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &g, &Policy::new(Method::Full).unwrap()).unwrap();
    let one = F16::from_bits(0x3c00); // 1.0 in binary16
    let n = g.kv_elems_per_token();
    cache.append(0, &vec![one; n], &vec![one; n], &[0]).unwrap();
    let out = cache.attend(0, &vec![one; g.q_elems_per_query()], None).unwrap();
    assert!(out.iter().all(|x| *x == one));
    assert_eq!(cache.read::<f32>(0, 0).unwrap_err().status, Status::InvalidArg);
}

#[test]
fn caches_outlive_their_context_and_move_between_threads() {
    fn assert_send<T: Send>() {}
    fn assert_sync<T: Sync>() {}
    assert_send::<Cache>();
    assert_send::<Context>();
    assert_sync::<Context>();

    let g = geometry();
    let ctx = std::sync::Arc::new(Context::with_budget(0).unwrap());
    let mut handles = Vec::new();
    for i in 0..4 {
        let ctx = ctx.clone();
        handles.push(std::thread::spawn(move || {
            let mut cache = Cache::new(&ctx, &g, &Policy::new(Method::Full).unwrap()).unwrap();
            cache
                .append(
                    0,
                    &kv(0..i + 1, &g, 1.0),
                    &kv(0..i + 1, &g, 1.0),
                    &(0..i + 1).collect::<Vec<_>>(),
                )
                .unwrap();
            cache
        }));
    }
    let caches: Vec<Cache> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(ctx); // the caches keep the library-side context alive
    let tokens: Vec<u64> = caches.iter().map(|c| c.stats().unwrap().tokens).collect();
    assert_eq!(tokens, vec![2, 4, 6, 8]);
    assert!(caches[0].stats().unwrap().context_used_bytes > 0);
}

#[test]
fn smallkv_proxy_link_borrows_both_caches() {
    let g = geometry();
    let ctx = Context::with_budget(0).unwrap();
    let mut large = Cache::new(&ctx, &g, &Policy::parse("smallkv").unwrap()).unwrap();
    let mut proxy_geometry = Geometry::new(1, 2, 1, 8);
    proxy_geometry.dtype = Dtype::F32;
    let mut proxy = Cache::new(&ctx, &proxy_geometry, &Policy::parse("full").unwrap()).unwrap();
    let mut other = Cache::new(&ctx, &g, &Policy::parse("smallkv").unwrap()).unwrap();
    {
        let mut link = kvsdk::ProxyLink::new(&mut large, &mut proxy).unwrap();
        // Within the budget both caches take the same tokens, the proxy's step first.
        let positions = [0, 1];
        let pk = vec![0.5f32; 2 * 8];
        link.proxy().append(0, &pk, &pk, &positions).unwrap();
        let k = kv(0..2, &g, 1.0);
        link.large().append(0, &k, &k, &positions).unwrap();
        assert_eq!(link.large().read::<f32>(0, 0).unwrap().positions, vec![0, 1]);
    }
    // The proxy's step on another thread, in parallel with the large cache's (heads matched on
    // the first step, so that later attends read the proxy).
    let mut policy = Policy::parse("smallkv").unwrap();
    policy.match_tokens = 2;
    let mut parallel = Cache::new(&ctx, &g, &policy).unwrap();
    let mut proxy2 = Cache::new(&ctx, &proxy_geometry, &Policy::parse("full").unwrap()).unwrap();
    {
        let mut link = kvsdk::ProxyLink::new(&mut parallel, &mut proxy2).unwrap();
        link.set_wait(10_000).unwrap();
        let (large, proxy) = link.both();
        let positions = [0, 1];
        std::thread::scope(|s| {
            s.spawn(|| {
                let pk = vec![0.25f32; 2 * 8];
                proxy.append(0, &pk, &pk, &positions).unwrap();
                let pq = vec![0.5f32; 2 * 2 * 8];
                proxy.attend(0, &pq, Some(&positions)).unwrap();
            });
            let k = kv(0..2, &g, 1.0);
            large.append(0, &k, &k, &positions).unwrap();
            let q: Vec<f32> = (0..2 * g.n_q_heads * g.head_dim).map(|i| (i % 3) as f32).collect();
            large.attend(0, &q, Some(&positions)).unwrap();
        });
        assert_eq!(large.read::<f32>(0, 0).unwrap().positions, vec![0, 1]);
        // A proxy that does not come: the wait times out with Status::State.
        link.set_wait(20).unwrap();
        let (large, _) = link.both();
        let k = kv(2..3, &g, 1.0);
        large.append(0, &k, &k, &[2]).unwrap();
        let q = vec![0.5f32; (g.n_q_heads * g.head_dim) as usize];
        let err = large.attend(0, &q, Some(&[2])).unwrap_err();
        assert_eq!(err.status, Status::State);
        link.set_wait(0).unwrap();
    }
    // The link was dropped: the proxy is free for another cache; a 'full' cache has no proxy.
    let err = kvsdk::ProxyLink::new(&mut proxy, &mut other).unwrap_err();
    assert_eq!(err.status, Status::Unsupported);
    kvsdk::ProxyLink::new(&mut other, &mut proxy).unwrap();
}

#[test]
fn truncate_rewinds_exactly_or_refuses() {
    let g = geometry();
    let ctx = Context::with_budget(0).unwrap();
    let full = Policy::parse("full").unwrap();
    let mut a = Cache::new(&ctx, &g, &full).unwrap();
    let mut b = Cache::new(&ctx, &g, &full).unwrap();
    let six: Vec<i32> = (0..6).collect();
    a.append(0, &kv(0..6, &g, 1.0), &kv(0..6, &g, -0.5), &six).unwrap();
    b.append(0, &kv(0..4, &g, 1.0), &kv(0..4, &g, -0.5), &six[..4]).unwrap();
    a.truncate(4).unwrap();
    assert_eq!(a.stats().unwrap().tokens, 4 * g.n_kv_heads as u64);
    assert_eq!(a.stats().unwrap().bytes, b.stats().unwrap().bytes);
    let q: Vec<f32> = (0..g.n_q_heads * g.head_dim).map(|i| (i % 5) as f32 / 4.0).collect();
    assert_eq!(a.attend(0, &q, Some(&[9])).unwrap(), b.attend(0, &q, Some(&[9])).unwrap());
    assert_eq!(a.truncate(-1).unwrap_err().status, Status::InvalidArg);
    // kivi (blocks of 32 after a residual of 128) has quantized the first tokens of 200.
    let mut k = Cache::new(&ctx, &g, &Policy::parse("kivi").unwrap()).unwrap();
    let many: Vec<i32> = (0..200).collect();
    k.append(0, &kv(0..200, &g, 1.0), &kv(0..200, &g, -0.5), &many).unwrap();
    let before = k.stats().unwrap().bytes;
    let err = k.truncate(10).unwrap_err();
    assert_eq!(err.status, Status::State);
    assert!(err.message.contains("exactly"), "{}", err.message);
    assert_eq!(k.stats().unwrap().bytes, before);
}

#[test]
fn fork_continues_like_the_original_and_is_charged() {
    let g = geometry();
    let ctx = Context::with_budget(0).unwrap();
    let mut a = Cache::new(&ctx, &g, &Policy::parse("snapkv").unwrap()).unwrap();
    let positions: Vec<i32> = (0..6).collect();
    a.append(0, &kv(0..6, &g, 1.0), &kv(0..6, &g, -0.5), &positions).unwrap();
    let before = ctx.used_bytes().unwrap();
    let mut b = a.fork().unwrap();
    assert_eq!(ctx.used_bytes().unwrap(), 2 * before);
    let q: Vec<f32> = (0..g.n_q_heads * g.head_dim).map(|i| (i % 5) as f32 / 4.0).collect();
    let out_a = a.attend(0, &q, Some(&[6])).unwrap();
    let out_b = b.attend(0, &q, Some(&[6])).unwrap();
    assert_eq!(out_a, out_b);
    drop(a);
    b.append(0, &kv(6..7, &g, 1.0), &kv(6..7, &g, -0.5), &[6]).unwrap();
    assert_eq!(b.stats().unwrap().tokens, 7 * g.n_kv_heads as u64);
}

#[test]
fn conversations_share_a_frozen_prefix() {
    let g = geometry();
    let ctx = Context::with_budget(0).unwrap();
    let full = Policy::new(Method::Full).unwrap();
    let mut prefix = Cache::new(&ctx, &g, &full).unwrap();
    let prefix_positions: Vec<i32> = (0..8).collect();
    for layer in 0..g.n_layers {
        prefix.append(layer, &kv(0..8, &g, 1.0), &kv(0..8, &g, -0.5), &prefix_positions).unwrap();
    }
    // Only a frozen cache can be a prefix.
    let err = Cache::on_prefix(&prefix, &full).unwrap_err();
    assert_eq!(err.status, Status::State);
    assert!(!err.message.is_empty());
    prefix.freeze().unwrap();
    prefix.freeze().unwrap(); // idempotent
    let prefix_bytes = prefix.stats().unwrap().bytes;
    assert_eq!(ctx.used_bytes().unwrap(), prefix_bytes);

    let mut a = Cache::on_prefix(&prefix, &full).unwrap();
    let mut b = Cache::on_prefix(&prefix, &Policy::parse("snapkv").unwrap()).unwrap();
    let (a_pos, b_pos): (Vec<i32>, Vec<i32>) = ((8..11).collect(), (8..13).collect());
    for layer in 0..g.n_layers {
        a.append(layer, &kv(8..11, &g, 0.5), &kv(8..11, &g, 0.75), &a_pos).unwrap();
        b.append(layer, &kv(8..13, &g, -0.25), &kv(8..13, &g, 1.5), &b_pos).unwrap();
    }
    let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
    assert_eq!(sa.tokens, (g.n_layers * g.n_kv_heads) as u64 * 3);
    assert_eq!(sb.tokens, (g.n_layers * g.n_kv_heads) as u64 * 5);
    assert_eq!(a.token_count(0, 0).unwrap(), 3);
    // The prefix is charged once: the context holds it and each conversation's own rows.
    assert!(sa.bytes > 0 && sb.bytes > 0);
    let used = prefix_bytes + sa.bytes + sb.bytes;
    assert_eq!(ctx.used_bytes().unwrap(), used);
    assert_eq!(sa.context_used_bytes, used);
    assert_eq!(sb.context_used_bytes, used);

    // Full over full attends like one cache holding the prefix and then the conversation.
    let q: Vec<f32> = (0..g.n_q_heads * g.head_dim).map(|i| (i % 5) as f32 / 4.0 - 0.3).collect();
    let expected = {
        let rctx = Context::with_budget(0).unwrap();
        let mut r = Cache::new(&rctx, &g, &full).unwrap();
        r.append(1, &kv(0..8, &g, 1.0), &kv(0..8, &g, -0.5), &prefix_positions).unwrap();
        r.append(1, &kv(8..11, &g, 0.5), &kv(8..11, &g, 0.75), &a_pos).unwrap();
        r.attend(1, &q, Some(&[20])).unwrap()
    };
    let got = a.attend(1, &q, Some(&[20])).unwrap();
    for (x, y) in got.iter().zip(&expected) {
        assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{x} vs {y}");
    }
    assert_ne!(got, b.attend(1, &q, Some(&[20])).unwrap());
    // A query at a prefix position sees only the prefix tokens up to it.
    assert_eq!(a.attend(1, &q, Some(&[3])).unwrap(), b.attend(1, &q, Some(&[3])).unwrap());

    // The frozen prefix is read-only; a refused append changes nothing.
    let err = prefix.append(0, &kv(8..9, &g, 1.0), &kv(8..9, &g, 1.0), &[8]).unwrap_err();
    assert_eq!(err.status, Status::State);
    assert_eq!(prefix.stats().unwrap().bytes, prefix_bytes);
    assert_eq!(ctx.used_bytes().unwrap(), used);

    // Dropping the prefix handle keeps it alive (and charged) for its conversations.
    drop(prefix);
    assert_eq!(a.attend(1, &q, Some(&[20])).unwrap(), got);
    assert_eq!(ctx.used_bytes().unwrap(), used);
    drop(a);
    drop(b);
    assert_eq!(ctx.used_bytes().unwrap(), 0);
}
