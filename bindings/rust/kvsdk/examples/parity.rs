//! Binding parity, Rust side: the scenario of tests/bindings/parity/SCENARIO.md through the
//! safe API, recorded to the file named by the first argument. The C and Python programs must
//! write the same bytes.
use kvsdk::{Cache, Context, Dtype, Geometry, Policy};

const LAYERS: u32 = 3;
const Q_HEADS: u32 = 4;
const KV_HEADS: u32 = 2;
const HEAD_DIM: u32 = 16;
const PROMPT: i32 = 24;
const DECODE: i32 = 4;

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
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: parity RECORD_FILE")?;
    let mut rng = Rng(20261120);
    let mut rec = Record::default();
    let ctx = Context::new(&Default::default())?;
    let mut g = Geometry::new(LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM);
    g.dtype = Dtype::F32;
    let mut cache = Cache::new(&ctx, &g, &Policy::parse("full")?)?;

    let mut append_and_attend =
        |cache: &mut Cache, layer: u32, pos0: i32, n: i32, causal: bool| -> kvsdk::Result<()> {
            let pos: Vec<i32> = (pos0..pos0 + n).collect();
            let kv_elems = n as usize * (KV_HEADS * HEAD_DIM) as usize;
            let (k, v) = (rng.fill(kv_elems), rng.fill(kv_elems));
            cache.append(layer, &k, &v, &pos)?;
            let q = rng.fill(n as usize * (Q_HEADS * HEAD_DIM) as usize);
            let out = cache.attend(layer, &q, causal.then_some(&pos[..]))?;
            rec.f32s(&out);
            Ok(())
        };
    for layer in 0..LAYERS {
        append_and_attend(&mut cache, layer, 0, PROMPT, true)?;
    }
    for step in 0..DECODE {
        for layer in 0..LAYERS {
            append_and_attend(&mut cache, layer, PROMPT + step, 1, false)?;
        }
    }
    for layer in 0..LAYERS {
        for head in 0..KV_HEADS {
            let data = cache.read::<f32>(layer, head)?;
            rec.u64(data.positions.len() as u64);
            rec.f32s(&data.keys);
            rec.f32s(&data.values);
            rec.i32s(&data.positions);
        }
    }
    let s = cache.stats()?;
    for x in [s.tokens, s.appended_tokens, s.bytes] {
        rec.u64(x);
    }
    s.bytes_by_tier.iter().for_each(|x| rec.u64(*x));
    rec.u64(s.full_bytes);
    std::fs::write(&path, &rec.0)?;
    Ok(())
}
