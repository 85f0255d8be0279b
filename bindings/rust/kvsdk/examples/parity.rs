//! Binding parity, Rust side: the scenario of tests/bindings/parity/SCENARIO.md through the
//! safe API. Writes the record to the first argument and the snapshot to the second; the C and
//! Python programs must match.
use kvsdk::{Cache, Context, Dtype, Geometry, Policy, SaveOptions};

const LAYERS: u32 = 3;
const Q_HEADS: u32 = 4;
const KV_HEADS: u32 = 2;
const HEAD_DIM: u32 = 16;
const PROMPT: i32 = 24;
const WINDOW: i32 = 8;
const DECODE: i32 = 4;
const PER_QUERY: usize = (Q_HEADS * HEAD_DIM) as usize;
const PER_TOKEN: usize = (KV_HEADS * HEAD_DIM) as usize;

struct Rng(u32);

impl Rng {
    fn fill(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
                ((self.0 >> 8) & 0xffff) as f32 / 32768.0 - 1.0
            })
            .collect()
    }
}

#[derive(Default)]
struct Record(Vec<u8>);

impl Record {
    fn f32s(&mut self, xs: &[f32]) {
        xs.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn i32s(&mut self, xs: &[i32]) {
        xs.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn u64s(&mut self, xs: &[u64]) {
        xs.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
}

struct Scenario {
    rng: Rng,
    rec: Record,
}

impl Scenario {
    /// Appends one token at `pos`, attends one fresh query and records the output; observes
    /// the query at `pos` when `observe`.
    fn decode_step(
        &mut self,
        cache: &mut Cache,
        layer: u32,
        pos: i32,
        observe: bool,
    ) -> kvsdk::Result<()> {
        let (k, v) = (self.rng.fill(PER_TOKEN), self.rng.fill(PER_TOKEN));
        cache.append(layer, &k, &v, &[pos])?;
        let q = self.rng.fill(PER_QUERY);
        self.rec.f32s(&cache.attend(layer, &q, None)?);
        if observe {
            cache.observe(layer, &q, Some(&[pos]))?;
        }
        Ok(())
    }

    fn prefill(&mut self, cache: &mut Cache, layer: u32) -> kvsdk::Result<()> {
        let positions: Vec<i32> = (0..PROMPT).collect();
        let n = PROMPT as usize;
        let (k, v) = (self.rng.fill(n * PER_TOKEN), self.rng.fill(n * PER_TOKEN));
        cache.append(layer, &k, &v, &positions)?;
        let q = self.rng.fill(n * PER_QUERY);
        self.rec.f32s(&cache.attend(layer, &q, Some(&positions))?);
        let first = (PROMPT - WINDOW) as usize;
        cache.observe(layer, &q[first * PER_QUERY..], Some(&positions[first..]))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (record_path, snapshot_path) = match (args.next(), args.next()) {
        (Some(r), Some(s)) => (r, s),
        _ => return Err("usage: parity RECORD_FILE SNAPSHOT_FILE".into()),
    };
    let mut sc = Scenario { rng: Rng(20261120), rec: Record::default() };
    let ctx = Context::new(&Default::default())?;
    let g = Geometry { dtype: Dtype::F32, ..Geometry::new(LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM) };
    let mut policy = Policy::parse("snapkv")?;
    policy.obs_window = WINDOW;
    let mut cache = Cache::new(&ctx, &g, &policy)?;

    for layer in 0..LAYERS {
        sc.prefill(&mut cache, layer)?;
    }
    let bytes = cache.stats()?.bytes;
    sc.rec.u64s(&[bytes]);
    cache.set_budget(bytes * 3 / 5)?;
    cache.compress()?;
    sc.rec.u64s(&cache.allocation()?);
    for step in 0..DECODE {
        for layer in 0..LAYERS {
            sc.decode_step(&mut cache, layer, PROMPT + step, true)?;
        }
    }
    for layer in 0..LAYERS {
        for head in 0..KV_HEADS {
            let data = cache.read::<f32>(layer, head)?;
            sc.rec.u64s(&[data.positions.len() as u64]);
            sc.rec.f32s(&data.keys);
            sc.rec.f32s(&data.values);
            sc.rec.i32s(&data.positions);
        }
    }
    let s = cache.stats()?;
    sc.rec.u64s(&[s.tokens, s.appended_tokens, s.bytes]);
    sc.rec.u64s(&s.bytes_by_tier);
    sc.rec.u64s(&[s.full_bytes]);

    cache.save(&snapshot_path, &SaveOptions::default())?;
    let (mut loaded, _) = Cache::load(&ctx, &snapshot_path, Some(&g))?;
    let p = loaded.policy()?;
    sc.rec.i32s(&[p.method.raw(), p.obs_window, p.pool_kernel, p.pool_kind.raw()]);
    for layer in 0..LAYERS {
        let q = sc.rng.fill(PER_QUERY);
        sc.rec.f32s(&loaded.attend(layer, &q, None)?);
    }
    for layer in 0..LAYERS {
        sc.decode_step(&mut loaded, layer, PROMPT + DECODE, false)?;
    }
    let mut branch = loaded.fork()?;
    for layer in 0..LAYERS {
        sc.decode_step(&mut branch, layer, PROMPT + DECODE + 1, false)?;
    }
    let status = match branch.truncate(PROMPT + DECODE + 1) {
        Ok(()) => 0,
        Err(e) => e.status.raw(),
    };
    sc.rec.i32s(&[status]);
    for layer in 0..LAYERS {
        sc.decode_step(&mut branch, layer, PROMPT + DECODE + 1, false)?;
    }
    std::fs::write(&record_path, &sc.rec.0)?;
    Ok(())
}
