//! The engine's use of the artifact cache, on the tiny random checkpoint: a cold load packs and writes the
//! artifact, a warm load maps it, and both compute exactly what an uncached load does; the key follows
//! the checkpoint's contents and the quantization; a damaged artifact is rebuilt and an unusable cache
//! runs uncached, each with a warning; `cache: None` writes nothing.

use std::path::{Path, PathBuf};

use int4::cache::ArtifactStore;
use int4::layout::GroupSize;
use int4::{Engine, LoadOptions, PackedFrom, RunPath};
use int4_test_support::{tiny_model, tiny_model_with};

const PROMPT: [u32; 12] = [1, 17, 33, 5, 90, 44, 12, 61, 7, 3, 80, 29];

fn store_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("int4-engine-cache-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn load(model: &Path, path: RunPath, group: GroupSize, cache: Option<&Path>) -> Engine {
    let opts = LoadOptions {
        path,
        group_size: group,
        context: 64,
        cache: cache.map(ArtifactStore::new),
        ..LoadOptions::default()
    };
    Engine::load(model, &opts).unwrap()
}

/// Every position's logits for the prompt, as bits.
fn logits(e: &Engine) -> Vec<u32> {
    let mut kv = e.new_cache().unwrap();
    e.model.forward(&PROMPT, &mut kv, true).unwrap().iter().map(|x| x.to_bits()).collect()
}

fn artifacts(dir: &Path) -> usize {
    ArtifactStore::new(dir).list().len()
}

#[test]
fn cold_and_warm_loads_compute_exactly_what_an_uncached_load_does() {
    let model = tiny_model("cache-cold-warm");
    for path in [RunPath::W4a16, RunPath::Wna16, RunPath::W4a8] {
        let dir = store_dir(&format!("cold-warm-{path:?}"));
        let uncached = load(&model, path, GroupSize::G32, None);
        assert_eq!(uncached.packed_from, PackedFrom::Uncached);
        assert!(!dir.exists(), "cache: None wrote to the cache directory");
        let cold = load(&model, path, GroupSize::G32, Some(&dir));
        let PackedFrom::Built(file) = &cold.packed_from else { panic!("first load was {:?}", cold.packed_from) };
        assert!(file.exists() && cold.warnings.is_empty(), "{:?}", cold.warnings);
        let warm = load(&model, path, GroupSize::G32, Some(&dir));
        assert_eq!(warm.packed_from, PackedFrom::Cache(file.clone()));
        let want = logits(&uncached);
        assert_eq!(logits(&cold), want, "{path:?}: cold load differs from uncached");
        assert_eq!(logits(&warm), want, "{path:?}: warm load differs from uncached");
        assert_eq!(artifacts(&dir), 1);
        assert!(ArtifactStore::new(&dir).verify().iter().all(|(_, r)| r.is_ok()));
    }
}

#[test]
fn the_key_follows_the_checkpoint_contents_and_the_group_size() {
    let dir = store_dir("key");
    let model = tiny_model("cache-key");
    let first = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(first.packed_from, PackedFrom::Built(_)));
    let other_group = load(&model, RunPath::W4a16, GroupSize::G64, Some(&dir));
    assert!(matches!(other_group.packed_from, PackedFrom::Built(_)), "another group size reused an artifact");
    assert_eq!(artifacts(&dir), 2);
    // The same directory with one weight changed: a new key, and the new weights are what runs.
    let edited = tiny_model_with("cache-key", |name, mut w| {
        if name.ends_with("layers.1.mlp.down_proj.weight") {
            w[7] += 3.0;
        }
        w
    });
    assert_eq!(edited, model);
    let after = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(after.packed_from, PackedFrom::Built(_)), "an edited checkpoint reused the old artifact");
    assert_ne!(logits(&after), logits(&first));
    assert_eq!(logits(&after), logits(&load(&model, RunPath::W4a16, GroupSize::G32, None)));
}

#[test]
fn a_damaged_artifact_is_rebuilt_with_a_warning() {
    let dir = store_dir("damaged");
    let model = tiny_model("cache-damaged");
    let want = logits(&load(&model, RunPath::W4a16, GroupSize::G32, None));
    let PackedFrom::Built(file) = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir)).packed_from else {
        panic!("no artifact written")
    };
    // Truncated, then a header byte flipped: each is refused, rebuilt, and the result is unchanged.
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - 10).unwrap();
    let e = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(e.packed_from, PackedFrom::Built(_)));
    assert!(e.warnings.iter().any(|w| w.contains("truncated") && w.contains("rebuilding")), "{:?}", e.warnings);
    assert_eq!(logits(&e), want);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(&file, bytes).unwrap();
    let e = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(e.warnings.iter().any(|w| w.contains("rebuilding")), "{:?}", e.warnings);
    assert_eq!(logits(&e), want);
}

#[test]
fn an_unusable_cache_runs_uncached_and_a_removed_one_does_not_disturb_a_running_model() {
    let model = tiny_model("cache-unusable");
    let want = logits(&load(&model, RunPath::W4a16, GroupSize::G32, None));
    // The cache "directory" lies under a regular file: nothing can be written there.
    let blocker = store_dir("blocker");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let e = load(&model, RunPath::W4a16, GroupSize::G32, Some(&blocker.join("cache")));
    assert_eq!(e.packed_from, PackedFrom::InMemory);
    assert!(e.warnings.iter().any(|w| w.contains("running uncached")), "{:?}", e.warnings);
    assert_eq!(logits(&e), want);
    // A warm model keeps running after its cache directory is deleted; the next load rebuilds.
    let dir = store_dir("removed");
    drop(load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir)));
    let warm = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(warm.packed_from, PackedFrom::Cache(_)));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(logits(&warm), want);
    let again = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(again.packed_from, PackedFrom::Built(_)));
    assert_eq!(logits(&again), want);
}

#[test]
fn unquantized_paths_pack_nothing() {
    let dir = store_dir("dense");
    let model = tiny_model("cache-dense");
    for path in [RunPath::F32, RunPath::Bf16] {
        assert_eq!(load(&model, path, GroupSize::G32, Some(&dir)).packed_from, PackedFrom::NotPacked);
    }
    assert_eq!(artifacts(&dir), 0);
}

/// W4A8 with an 8-bit head: the option is part of the key (a 4-bit-head artifact is never reused for it),
/// cold and warm loads compute what an uncached load does, and on the tiny model's f32 head the 8-bit
/// head moves the logits less than the 4-bit one.
#[test]
fn an_eight_bit_head_has_its_own_artifact_and_is_closer_to_f32() {
    use int4::HeadBits;
    let model = tiny_model("cache-head8");
    let dir = store_dir("head8");
    let load_head = |head_bits, cache: Option<&Path>| {
        let opts = LoadOptions {
            path: RunPath::W4a8,
            group_size: GroupSize::G32,
            context: 64,
            cache: cache.map(ArtifactStore::new),
            head_bits,
            ..LoadOptions::default()
        };
        Engine::load(&model, &opts).unwrap()
    };
    let four = load_head(HeadBits::Four, Some(&dir));
    assert!(matches!(four.packed_from, PackedFrom::Built(_)));
    let cold = load_head(HeadBits::Eight, Some(&dir));
    assert!(matches!(cold.packed_from, PackedFrom::Built(_)), "the 8-bit head reused the 4-bit head's artifact");
    assert!(cold.warnings.is_empty(), "{:?}", cold.warnings);
    let warm = load_head(HeadBits::Eight, Some(&dir));
    assert!(matches!(warm.packed_from, PackedFrom::Cache(_)));
    let want = logits(&load_head(HeadBits::Eight, None));
    assert_eq!(logits(&cold), want);
    assert_eq!(logits(&warm), want);
    assert_eq!(artifacts(&dir), 2);
    // The head holds a byte per weight (two 4-bit planes), more than the 4-bit head.
    assert!(cold.model.weight_bytes() > four.model.weight_bytes());
    let f32_logits: Vec<f32> =
        logits(&load(&model, RunPath::F32, GroupSize::G32, None)).into_iter().map(f32::from_bits).collect();
    let err = |e: &Engine| -> f64 {
        logits(e).into_iter().zip(&f32_logits).map(|(a, b)| f64::from(f32::from_bits(a) - b).powi(2)).sum()
    };
    let (e4, e8) = (err(&four), err(&cold));
    assert!(e8 < e4, "8-bit head error {e8} is not below the 4-bit head's {e4}");
}
