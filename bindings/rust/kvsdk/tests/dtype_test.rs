//! Dtype rules of the safe API, for every cache dtype (F32, F16, Bf16) x every element type
//! (f32, F16, Bf16) on every call that takes or returns tensors: append, attend, attend_into,
//! read, observe, prefetch, the planner and a SmallKV pair of caches of different dtypes.
//! The matching element type is stored bit-exactly; another one is Err(InvalidArg) naming the
//! expected element type, with the cache unchanged. (f64, integers and raw u16 are not
//! elements: the compile_fail doc tests in src/element.rs show they do not compile.)
use kvsdk::{
    Bf16, Cache, CacheStats, Context, Dtype, Element, Geometry, Planner, Policy, Status, F16,
};

const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];
const Q_HEADS: u32 = 4;
const KV_HEADS: u32 = 2;
const DIM: u32 = 8;
const PER_TOKEN: usize = (KV_HEADS * DIM) as usize;
const PER_QUERY: usize = (Q_HEADS * DIM) as usize;

fn geometry(dtype: Dtype) -> Geometry {
    Geometry { dtype, ..Geometry::new(2, Q_HEADS, KV_HEADS, DIM) }
}

/// The phrase an error for `dtype` must contain.
fn expected(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "expected f32 elements for an F32 cache",
        Dtype::F16 => "expected kvsdk::F16 elements for an F16 cache",
        Dtype::Bf16 => "expected kvsdk::Bf16 elements for a Bf16 cache",
        Dtype::Unknown(_) => unreachable!(),
    }
}

/// Test data of any element type; the values are exact in f32, f16 and bf16.
trait Make: Element {
    fn make(x: f32) -> Self;
    fn bits(self) -> u32;
}
impl Make for f32 {
    fn make(x: f32) -> f32 {
        x
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
}
impl Make for F16 {
    fn make(x: f32) -> F16 {
        F16::from_f32(x)
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
}
impl Make for Bf16 {
    fn make(x: f32) -> Bf16 {
        Bf16::from_f32(x)
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
}

fn values<T: Make>(n: usize, seed: usize) -> Vec<T> {
    (0..n).map(|i| T::make(((i * 7 + seed * 5) % 31) as f32 / 16.0 - 15.0 / 16.0)).collect()
}

/// Everything a refused call must leave alone: stats and every head's rows (as bits).
fn state(cache: &Cache) -> (CacheStats, Vec<Vec<u32>>) {
    fn rows<T: Make>(cache: &Cache) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        for layer in 0..2 {
            for head in 0..KV_HEADS {
                let h = cache.read::<T>(layer, head).unwrap();
                out.push(h.keys.iter().chain(&h.values).map(|x| x.bits()).collect());
                out.push(h.positions.iter().map(|&p| p as u32).collect());
            }
        }
        out
    }
    let rows = match cache.geometry().unwrap().dtype {
        Dtype::F32 => rows::<f32>(cache),
        Dtype::F16 => rows::<F16>(cache),
        _ => rows::<Bf16>(cache),
    };
    (cache.stats().unwrap(), rows)
}

fn assert_refused<R: std::fmt::Debug>(result: kvsdk::Result<R>, phrase: &str, what: &str) {
    let err = result.expect_err(what);
    assert_eq!(err.status, Status::InvalidArg, "{what}: {err}");
    assert!(err.message.contains(phrase), "{what}: {:?} lacks {phrase:?}", err.message);
}

/// Every call with element type `T` on caches of `dtype`, where `own` fills them.
fn check_element<T: Make, U: Make>(dtype: Dtype) {
    let ctx = Context::with_budget(0).unwrap();
    let accepted = T::DTYPE == dtype;
    let what = |op: &str| format!("{op} of {} on a {dtype:?} cache", T::NAME);
    let (kv_own, kv) = (values::<U>(2 * PER_TOKEN, 1), values::<T>(PER_TOKEN, 2));
    let q = values::<T>(PER_QUERY, 3);

    // append / read / attend / attend_into on a full cache.
    let mut cache = Cache::new(&ctx, &geometry(dtype), &Policy::parse("full").unwrap()).unwrap();
    cache.append(0, &kv_own, &kv_own, &[0, 1]).unwrap();
    let before = state(&cache);
    let appended = cache.append(0, &kv, &kv, &[2]);
    let read = cache.read::<T>(0, 1);
    let attended = cache.attend(0, &q, None);
    let mut out = vec![T::default(); PER_QUERY];
    let into = cache.attend_into(0, &q, Some(&[2]), &mut out);
    if accepted {
        appended.unwrap();
        let head = read.unwrap();
        assert_eq!(head.positions, vec![0, 1, 2]);
        let want: Vec<T> = kv[DIM as usize..PER_TOKEN].to_vec();
        assert_eq!(&head.keys[2 * DIM as usize..], &want[..], "{}", what("read back"));
        assert_eq!(attended.unwrap().len(), PER_QUERY);
        into.unwrap();
        assert_ne!(out, vec![T::default(); PER_QUERY]);
    } else {
        assert_refused(appended, expected(dtype), &what("append"));
        assert_refused(read, expected(dtype), &what("read"));
        assert_refused(attended, expected(dtype), &what("attend"));
        assert_refused(into, expected(dtype), &what("attend_into"));
        assert_eq!(out, vec![T::default(); PER_QUERY], "out untouched");
        assert_eq!(state(&cache), before, "{}", what("refused calls changed the cache"));
    }

    // observe on a snapkv cache.
    let mut snap = Cache::new(&ctx, &geometry(dtype), &Policy::parse("snapkv").unwrap()).unwrap();
    snap.append(0, &kv_own, &kv_own, &[0, 1]).unwrap();
    let before = state(&snap);
    let observed = snap.observe(0, &q, Some(&[1]));
    if accepted {
        observed.unwrap();
    } else {
        assert_refused(observed, expected(dtype), &what("observe"));
        assert_eq!(state(&snap), before);
    }

    // prefetch on a specache cache.
    let mut policy = Policy::parse("specache").unwrap();
    policy.quant_group = 8;
    policy.quant_residual = 8;
    policy.fetch_tokens = 4;
    let mut spec = Cache::new(&ctx, &geometry(dtype), &policy).unwrap();
    let many = values::<U>(24 * PER_TOKEN, 4);
    spec.append(0, &many, &many, &(0..24).collect::<Vec<_>>()).unwrap();
    let before = spec.stats().unwrap();
    let fetched = spec.prefetch(0, &q, Some(24));
    if accepted {
        fetched.unwrap();
    } else {
        assert_refused(fetched, expected(dtype), &what("prefetch"));
        assert_eq!(spec.stats().unwrap(), before);
    }

    // The planner: keys and queries.
    let mut planner = Planner::new(&geometry(dtype), &Policy::parse("snapkv").unwrap()).unwrap();
    let keys = values::<T>(2 * PER_TOKEN, 5);
    let fed = planner.feed_layer(0, &keys, &[0, 1], &q, Some(&[1]));
    if accepted {
        fed.unwrap();
    } else {
        assert_refused(fed, expected(dtype), &what("feed_layer"));
    }
}

#[test]
fn every_cache_dtype_takes_only_its_element_type() {
    check_element::<f32, f32>(Dtype::F32);
    check_element::<F16, f32>(Dtype::F32);
    check_element::<Bf16, f32>(Dtype::F32);
    check_element::<f32, F16>(Dtype::F16);
    check_element::<F16, F16>(Dtype::F16);
    check_element::<Bf16, F16>(Dtype::F16);
    check_element::<f32, Bf16>(Dtype::Bf16);
    check_element::<F16, Bf16>(Dtype::Bf16);
    check_element::<Bf16, Bf16>(Dtype::Bf16);
}

fn wrong_lengths<T: Make>() {
    let dtype = T::DTYPE;
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &geometry(dtype), &Policy::parse("snapkv").unwrap()).unwrap();
    let two = values::<T>(2 * PER_TOKEN, 1);
    cache.append(0, &two, &two, &[0, 1]).unwrap();
    let before = state(&cache);
    let short = &two[..2 * PER_TOKEN - 1];
    assert_refused(
        cache.append(0, short, &two, &[2, 3]),
        "keys: 31 elements for 2 tokens, expected 32",
        "short keys",
    );
    assert_refused(
        cache.append(0, &two, short, &[2, 3]),
        "values: 31 elements for 2 tokens, expected 32",
        "short values",
    );
    assert_refused(cache.append(0, &two, &two, &[2]), "expected 16", "one position");
    let q = values::<T>(PER_QUERY + 1, 2);
    assert_refused(cache.attend(0, &q, None), "not a whole number of queries", "q");
    let q2 = values::<T>(2 * PER_QUERY, 2);
    assert_refused(
        cache.attend(0, &q2, Some(&[1])),
        "64 elements for 1 query positions, expected 32",
        "q vs positions",
    );
    assert_refused(cache.observe(0, &q2, Some(&[1])), "expected 32", "observe q");
    let mut out = vec![T::default(); PER_QUERY - 1];
    assert_refused(
        cache.attend_into(0, &q2[..PER_QUERY], None, &mut out),
        "out: 31 elements, expected 32",
        "out",
    );
    assert_eq!(out, vec![T::default(); PER_QUERY - 1]);
    assert_eq!(state(&cache), before);

    let mut policy = Policy::parse("specache").unwrap();
    policy.quant_group = 8;
    policy.quant_residual = 8;
    let mut spec = Cache::new(&ctx, &geometry(dtype), &policy).unwrap();
    assert_refused(spec.prefetch(0, &q2, None), "expected one query of 32", "prefetch");
    let mut planner = Planner::new(&geometry(dtype), &Policy::parse("snapkv").unwrap()).unwrap();
    assert_refused(
        planner.feed_layer(0, short, &[0, 1], &q2, None),
        "keys: 31 elements for 2 tokens",
        "planner keys",
    );
    assert_refused(
        planner.feed_layer(0, &two, &[0, 1], &q, None),
        "not a whole number of queries",
        "planner queries",
    );
}

#[test]
fn wrong_lengths_are_refused_for_every_dtype() {
    wrong_lengths::<f32>();
    wrong_lengths::<F16>();
    wrong_lengths::<Bf16>();
}

#[test]
fn f16_elements_read_back_bit_identically() {
    // The Python bug's data: [0.3457, 0.822, 0.3303, -1.303] must not come back as zeros.
    let g = Geometry { dtype: Dtype::F16, ..Geometry::new(1, 1, 1, 4) };
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &g, &Policy::parse("full").unwrap()).unwrap();
    let k: Vec<F16> =
        [0.3457f32, 0.822, 0.3303, -1.303].iter().map(|&x| F16::from_f32(x)).collect();
    let v: Vec<F16> = k.iter().map(|x| F16(x.0 ^ 0x8000)).collect();
    cache.append(0, &k, &v, &[0]).unwrap();
    let head = cache.read::<F16>(0, 0).unwrap();
    assert_eq!((head.keys, head.values), (k, v));

    // Every bit pattern, NaNs and infinities included.
    let g = Geometry { dtype: Dtype::F16, ..Geometry::new(1, 1, 1, 1024) };
    let mut cache = Cache::new(&ctx, &g, &Policy::parse("full").unwrap()).unwrap();
    let every: Vec<u16> = (0..=u16::MAX).collect();
    let reversed: Vec<u16> = every.iter().rev().copied().collect();
    let positions: Vec<i32> = (0..64).collect();
    cache
        .append(0, F16::from_bits_slice(&every), F16::from_bits_slice(&reversed), &positions)
        .unwrap();
    let head = cache.read::<F16>(0, 0).unwrap();
    assert_eq!(F16::to_bits_slice(&head.keys), &every[..]);
    assert_eq!(F16::to_bits_slice(&head.values), &reversed[..]);
}

#[test]
fn bf16_and_f32_storage_match_the_crate_conversions() {
    // BF16 and F32 caches store f16 rows: reading back applies the library's f32 -> f16 and
    // f32 -> bf16 rounding, which F16::from_f32 / Bf16::from_f32 must reproduce bit for bit.
    let ctx = Context::with_budget(0).unwrap();
    let positions: Vec<i32> = (0..64).collect();
    let g = Geometry { dtype: Dtype::Bf16, ..Geometry::new(1, 1, 1, 1024) };
    let mut cache = Cache::new(&ctx, &g, &Policy::parse("full").unwrap()).unwrap();
    let every: Vec<u16> = (0..=u16::MAX).collect();
    cache
        .append(0, Bf16::from_bits_slice(&every), Bf16::from_bits_slice(&every), &positions)
        .unwrap();
    let head = cache.read::<Bf16>(0, 0).unwrap();
    let mut unchanged = 0;
    for (i, &b) in every.iter().enumerate() {
        let via_f16 = F16::from_f32(Bf16(b).to_f32()).to_f32();
        assert_eq!(head.keys[i], Bf16::from_f32(via_f16), "bf16 {b:#06x}");
        unchanged += usize::from(head.keys[i] == Bf16(b));
    }
    assert!(unchanged > 8000, "bf16 values inside f16's range come back unchanged");

    let g = Geometry { dtype: Dtype::F32, ..Geometry::new(1, 1, 1, 1024) };
    let mut cache = Cache::new(&ctx, &g, &Policy::parse("full").unwrap()).unwrap();
    let mut state = 12345u32;
    let mut x: Vec<f32> = (0..65536)
        .map(|_| {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            f32::from_bits(state)
        })
        .collect();
    let specials = [
        0u32,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x477f_f000,
        0x477f_efff,
        0x3300_0000,
        0x3300_0001,
        0x387f_c000,
        0x387f_e000,
        0x7fc0_0001,
        0xffff_ffff,
    ];
    for (i, s) in specials.iter().enumerate() {
        x[i] = f32::from_bits(*s);
    }
    cache.append(0, &x, &x, &positions).unwrap();
    let head = cache.read::<f32>(0, 0).unwrap();
    for (i, &xi) in x.iter().enumerate() {
        assert_eq!(
            head.keys[i].to_bits(),
            F16::from_f32(xi).to_f32().to_bits(),
            "{:#x}",
            xi.to_bits()
        );
    }
}

#[test]
fn attend_outputs_round_like_the_library() {
    // An F16 / Bf16 cache's attention output is the F32 cache's, rounded by the library.
    let ctx = Context::with_budget(0).unwrap();
    let kv = values::<f32>(5 * PER_TOKEN, 2);
    let q: Vec<f32> = values::<f32>(3 * PER_QUERY, 3)
        .iter()
        .map(|&x| F16::from_f32(Bf16::from_f32(x * 1.7).to_f32()).to_f32())
        .collect();
    let qpos = [2, 3, 4];
    let positions: Vec<i32> = (0..5).collect();
    let mut f32_cache =
        Cache::new(&ctx, &geometry(Dtype::F32), &Policy::parse("full").unwrap()).unwrap();
    f32_cache.append(0, &kv, &kv, &positions).unwrap();
    let reference = f32_cache.attend(0, &q, Some(&qpos)).unwrap();

    let conv = |x: &[f32]| x.iter().map(|&v| F16::from_f32(v)).collect::<Vec<_>>();
    let mut f16_cache =
        Cache::new(&ctx, &geometry(Dtype::F16), &Policy::parse("full").unwrap()).unwrap();
    f16_cache.append(0, &conv(&kv), &conv(&kv), &positions).unwrap();
    assert_eq!(f16_cache.attend(0, &conv(&q), Some(&qpos)).unwrap(), conv(&reference));

    let convb = |x: &[f32]| x.iter().map(|&v| Bf16::from_f32(v)).collect::<Vec<_>>();
    let mut bf16_cache =
        Cache::new(&ctx, &geometry(Dtype::Bf16), &Policy::parse("full").unwrap()).unwrap();
    bf16_cache.append(0, &convb(&kv), &convb(&kv), &positions).unwrap();
    let out = bf16_cache.attend(0, &convb(&q), Some(&qpos)).unwrap();
    assert_eq!(out, convb(&reference));
    assert!(out.iter().any(|x| x.to_bits() != 0));
}

#[test]
fn proxy_of_another_dtype() {
    // A smallkv cache and its proxy each take their own element type (the C API lets the
    // proxy's dtype differ); each refuses the other's.
    fn pair<L: Make, P: Make>() {
        let ctx = Context::with_budget(0).unwrap();
        let mut large =
            Cache::new(&ctx, &geometry(L::DTYPE), &Policy::parse("smallkv").unwrap()).unwrap();
        let proxy_g = Geometry { dtype: P::DTYPE, ..Geometry::new(1, 2, 1, DIM) };
        let mut proxy = Cache::new(&ctx, &proxy_g, &Policy::parse("full").unwrap()).unwrap();
        let mut link = kvsdk::ProxyLink::new(&mut large, &mut proxy).unwrap();
        for t in 0..3 {
            let pkv = values::<P>(DIM as usize, t);
            link.proxy().append(0, &pkv, &pkv, &[t as i32]).unwrap();
            link.proxy().attend(0, &values::<P>(2 * DIM as usize, t), None).unwrap();
            for layer in 0..2 {
                let kv = values::<L>(PER_TOKEN, t);
                link.large().append(layer, &kv, &kv, &[t as i32]).unwrap();
                link.large().attend(layer, &values::<L>(PER_QUERY, t), None).unwrap();
            }
        }
        let before = state(link.large());
        let wrong = values::<P>(PER_TOKEN, 9);
        assert_refused(link.large().append(0, &wrong, &wrong, &[3]), expected(L::DTYPE), "large");
        assert_eq!(state(link.large()), before);
        let wrong = values::<L>(DIM as usize, 9);
        assert_refused(link.proxy().append(0, &wrong, &wrong, &[3]), expected(P::DTYPE), "proxy");
    }
    pair::<F16, f32>();
    pair::<Bf16, F16>();
    pair::<f32, Bf16>();
}

#[test]
fn dtypes_have_one_element_type_each() {
    for dtype in DTYPES {
        let n = [f32::matches(dtype), F16::matches(dtype), Bf16::matches(dtype)];
        assert_eq!(n.iter().filter(|&&m| m).count(), 1, "{dtype:?}");
    }
    assert!(!F16::matches(Dtype::Unknown(9)));
}
