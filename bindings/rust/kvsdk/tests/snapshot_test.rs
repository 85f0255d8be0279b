//! Snapshots through the safe API: file and buffer saves agree, loads continue bit-identically,
//! journal deltas apply, bad input gives a status.
use kvsdk::{Cache, Context, Dtype, Geometry, Policy, SaveOptions, Status};

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

fn append_tokens(cache: &mut Cache, rng: &mut u32, pos0: i32, n: i32) {
    let positions: Vec<i32> = (pos0..pos0 + n).collect();
    for layer in 0..2 {
        let (k, v) = (draw(rng, n as usize * 16), draw(rng, n as usize * 16));
        cache.append(layer, &k, &v, &positions).unwrap();
    }
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvsdk-rust-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_conversation_on_a_prefix_references_or_embeds_it() {
    let ctx = Context::with_budget(0).unwrap();
    let full = Policy::parse("full").unwrap();
    let mut rng = 5u32;
    let mut prefix = Cache::new(&ctx, &geometry(), &full).unwrap();
    append_tokens(&mut prefix, &mut rng, 0, 12);
    prefix.freeze().unwrap();
    let mut chat = Cache::on_prefix(&prefix, &full).unwrap();
    append_tokens(&mut chat, &mut rng, 12, 5);
    let q = draw(&mut rng, 2 * 32);
    let expected = chat.attend(1, &q, None).unwrap();
    let path = scratch_dir("prefix").join("chat.kvsdk");
    chat.save(&path, &SaveOptions::default()).unwrap();
    assert_eq!(Cache::load(&ctx, &path, None).unwrap_err().status, Status::State);
    let (mut loaded, info) = Cache::load_on_prefix(&prefix, &path).unwrap();
    assert_eq!(info.format_major, 6); // exact rows on a prefix: 6.0 (kvsdk.h)
    assert_eq!(loaded.attend(1, &q, None).unwrap(), expected);
    let embed = SaveOptions { embed_prefix: true, ..SaveOptions::default() };
    let bytes = chat.save_to_vec(&embed).unwrap();
    let other_ctx = Context::with_budget(0).unwrap();
    let (mut alone, _) = Cache::load_from_buffer(&other_ctx, &bytes, None).unwrap();
    assert_eq!(alone.attend(1, &q, None).unwrap(), expected);
    let mut other = Cache::new(&ctx, &geometry(), &full).unwrap();
    other.freeze().unwrap();
    assert_eq!(Cache::load_on_prefix(&other, &path).unwrap_err().status, Status::State);
}

#[test]
fn save_load_round_trip_is_bit_identical() {
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &geometry(), &Policy::parse("full").unwrap()).unwrap();
    let mut rng = 3u32;
    append_tokens(&mut cache, &mut rng, 0, 10);

    let dir = scratch_dir("snapshot");
    let path = dir.join("conversation.kvsdk");
    let options = SaveOptions::default();
    let bytes = cache.save_to_vec(&options).unwrap();
    // The last save is the base of later deltas. Each save carries a fresh random snapshot
    // id, so two saves agree in length, not in bytes.
    cache.save(&path, &options).unwrap();
    assert_eq!(std::fs::read(&path).unwrap().len(), bytes.len());

    let (mut from_file, info) = Cache::load(&ctx, &path, Some(&geometry())).unwrap();
    // Caches holding exact rows are written as 6.0 (byte-plane rows; kvsdk.h), the newest.
    assert_eq!((info.format_major, info.format_minor), (6, 0));
    assert_eq!(kvsdk::SNAPSHOT_FORMAT, (6, 0));
    let (mut from_buf, _) = Cache::load_from_buffer(&ctx, &bytes, None).unwrap();
    assert_eq!(from_file.policy().unwrap(), cache.policy().unwrap());
    let q = draw(&mut rng, 2 * 32);
    let expected = cache.attend(1, &q, None).unwrap();
    assert_eq!(from_file.attend(1, &q, None).unwrap(), expected);
    assert_eq!(from_buf.attend(1, &q, None).unwrap(), expected);
    assert_eq!(from_buf.read::<f32>(0, 1).unwrap(), cache.read::<f32>(0, 1).unwrap());

    // A delta records the tokens appended since the save.
    append_tokens(&mut cache, &mut rng, 10, 3);
    cache.save_delta(&path, &options).unwrap();
    let (resumed, info) = Cache::load(&ctx, &path, None).unwrap();
    assert!(info.journal_frames_applied > 0);
    assert_eq!(resumed.stats().unwrap().tokens, cache.stats().unwrap().tokens);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_snapshots_give_a_status() {
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &geometry(), &Policy::parse("full").unwrap()).unwrap();
    let mut rng = 4u32;
    append_tokens(&mut cache, &mut rng, 0, 4);
    let mut bytes = cache.save_to_vec(&SaveOptions::default()).unwrap();

    let mut other_geometry = geometry();
    other_geometry.head_dim = 16;
    let err = Cache::load_from_buffer(&ctx, &bytes, Some(&other_geometry)).unwrap_err();
    assert_eq!(err.status, Status::Geometry);
    let truncated = Cache::load_from_buffer(&ctx, &bytes[..bytes.len() / 2], None).unwrap_err();
    assert_eq!(truncated.status, Status::Corrupt);
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    assert_eq!(Cache::load_from_buffer(&ctx, &bytes, None).unwrap_err().status, Status::Corrupt);
    let missing = Cache::load(&ctx, scratch_dir("missing").join("none.kvsdk"), None).unwrap_err();
    assert_eq!(missing.status, Status::Io);
    // A delta needs this cache's own last save of that file as its base.
    let dir = scratch_dir("nobase");
    let path = dir.join("x.kvsdk");
    let mut other = Cache::new(&ctx, &geometry(), &Policy::parse("full").unwrap()).unwrap();
    append_tokens(&mut other, &mut rng, 0, 2);
    other.save(&path, &SaveOptions::default()).unwrap();
    let err = cache.save_delta(&path, &SaveOptions::default()).unwrap_err();
    assert_eq!(err.status, Status::State);
    std::fs::remove_dir_all(&dir).unwrap();
    let bad = SaveOptions { zstd_level: 99, ..Default::default() };
    assert_eq!(cache.save_to_vec(&bad).unwrap_err().status, Status::InvalidArg);
}

#[test]
fn targeted_save_holds_the_target_policy() {
    let ctx = Context::with_budget(0).unwrap();
    let mut cache = Cache::new(&ctx, &geometry(), &Policy::parse("full").unwrap()).unwrap();
    let mut rng = 6u32;
    append_tokens(&mut cache, &mut rng, 0, 40);
    let before = cache.save_to_vec(&SaveOptions::default()).unwrap();
    let budget = cache.stats().unwrap().bytes / 2;
    let target = Policy::parse("snapkv").unwrap();
    let options = SaveOptions {
        target_policy: Some(target),
        target_budget_bytes: budget,
        ..SaveOptions::default()
    };
    let bytes = cache.save_to_vec(&options).unwrap();
    // The live cache is as it was.
    assert_eq!(cache.save_to_vec(&SaveOptions::default()).unwrap(), before);
    let (mut loaded, _) =
        Cache::load_from_buffer(&Context::with_budget(0).unwrap(), &bytes, None).unwrap();
    assert_eq!(loaded.policy().unwrap(), target);
    assert!(loaded.stats().unwrap().bytes <= budget);
    append_tokens(&mut loaded, &mut rng, 40, 1); // it continues
    let dir = scratch_dir("target");
    let path = dir.join("small.kvsdk");
    cache.save(&path, &options).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes); // the file save writes the same bytes
    assert_eq!(cache.save_delta(&path, &options).unwrap_err().status, Status::Unsupported);
    std::fs::remove_dir_all(&dir).unwrap();
    let stray = SaveOptions { target_budget_bytes: 9, ..SaveOptions::default() };
    assert_eq!(cache.save_to_vec(&stray).unwrap_err().status, Status::InvalidArg);
}
