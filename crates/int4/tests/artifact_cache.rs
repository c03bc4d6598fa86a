//! The engine's use of the artifact cache, on the tiny random checkpoint: a cold load packs and writes the
//! artifact, a warm load maps it, and both compute exactly what an uncached load does; the key follows
//! the checkpoint's contents and the quantization; a damaged artifact is rebuilt and an unusable cache
//! runs uncached, each with a warning; `cache: None` writes nothing.

use std::path::Path;

use int4::cache::ArtifactStore;
use int4::layout::GroupSize;
use int4::{Engine, LoadOptions, PackedFrom, RunPath};
use int4_test_support::{TempDir, tiny_model, write_tiny_model};

const PROMPT: [u32; 12] = [1, 17, 33, 5, 90, 44, 12, 61, 7, 3, 80, 29];

fn store_dir(name: &str) -> TempDir {
    TempDir::unmade(&format!("engine-cache-{name}"))
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
        assert!(ArtifactStore::new(dir.path()).verify().iter().all(|(_, r)| r.is_ok()));
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
    write_tiny_model(&model, |name, mut w| {
        if name.ends_with("layers.1.mlp.down_proj.weight") {
            w[7] += 3.0;
        }
        w
    });
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
    // Truncated, then a header byte flipped, then a payload byte flipped: each is refused, rebuilt, and
    // the result is unchanged. (Artifacts are read-only files; these play another program that changes
    // the permissions first.)
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(writable(&file)).unwrap().set_len(len - 10).unwrap();
    let e = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(e.packed_from, PackedFrom::Built(_)));
    assert!(e.warnings.iter().any(|w| w.contains("truncated") && w.contains("rebuilding")), "{:?}", e.warnings);
    assert_eq!(logits(&e), want);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(writable(&file), bytes).unwrap();
    let e = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(e.warnings.iter().any(|w| w.contains("rebuilding")), "{:?}", e.warnings);
    assert_eq!(logits(&e), want);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0x10;
    std::fs::write(writable(&file), bytes).unwrap();
    let e = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(e.warnings.iter().any(|w| w.contains("payload") && w.contains("rebuilding")), "{:?}", e.warnings);
    assert_eq!(logits(&e), want);
}

fn writable(path: &Path) -> &Path {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

/// The tiny model with a head of its own (`lm_head.weight`, unlike the embedding) and `config.json`
/// rewritten by `edit`; the weights file is `weights` itself through a symlink when given (as a hub
/// snapshot links its files into one blob store), else written here.
fn model_with_head(name: &str, weights: Option<&Path>, edit: impl Fn(&mut serde_json::Value)) -> TempDir {
    let base = tiny_model("cache-head-base");
    let dir = store_dir(&format!("model-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("config.json")).unwrap()).unwrap();
    config["tie_word_embeddings"] = false.into();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(base.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    match weights {
        Some(w) => std::os::unix::fs::symlink(w, dir.join("model.safetensors")).unwrap(),
        None => {
            let bytes = std::fs::read(base.join("model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let head: Vec<u8> =
                (0..96 * 64).flat_map(|i| (((i * 7919 % 263) as f32 - 131.0) / 200.0).to_le_bytes()).collect();
            let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors().into_iter().collect();
            views.push((
                "lm_head.weight".into(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![96, 64], &head).unwrap(),
            ));
            safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
        }
    }
    dir
}

fn edit_config(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
}

/// Everything of `config.json` that packing reads is in the key: two directories sharing one weights file
/// but differing in `tie_word_embeddings` never get each other's head, nor does one edited in place; a
/// changed layer count is a new artifact too. Each load computes what an uncached load of the same
/// directory does.
#[test]
fn the_key_covers_what_packing_reads_of_config_json() {
    let dir = store_dir("config-key");
    let untied = model_with_head("untied", None, |_| {});
    let tied =
        model_with_head("tied", Some(&untied.join("model.safetensors")), |c| c["tie_word_embeddings"] = true.into());
    let check = |model: &Path, what: &str| {
        let e = load(model, RunPath::W4a16, GroupSize::G32, Some(&dir));
        assert!(matches!(e.packed_from, PackedFrom::Built(_)), "{what}: reused an artifact: {:?}", e.packed_from);
        assert_eq!(logits(&e), logits(&load(model, RunPath::W4a16, GroupSize::G32, None)), "{what}");
        logits(&e)
    };
    let a = check(&untied, "untied head");
    let b = check(&tied, "the same weights file, tied head");
    assert_ne!(a, b, "the tied and untied heads compute the same logits: the test shows nothing");
    // Edited in place.
    edit_config(&untied, |c| c["num_hidden_layers"] = 1.into());
    check(&untied, "one layer instead of two");
    edit_config(&tied, |c| c["tie_word_embeddings"] = false.into());
    let e = load(&tied, RunPath::W4a16, GroupSize::G32, Some(&dir));
    // Now the same configuration and weights as `untied` had first: its artifact is the right one.
    assert!(matches!(e.packed_from, PackedFrom::Cache(_)), "{:?}", e.packed_from);
    assert_eq!(logits(&e), a);
}

/// What packing does not read leaves the key alone, and the new values are used: `rope_theta`, the
/// generation config's end-of-sequence ids and the tokenizer.
#[test]
fn what_packing_does_not_read_keeps_the_artifact_and_the_new_values_are_used() {
    let dir = store_dir("config-same-key");
    let model = model_with_head("same-key", None, |_| {});
    let first = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(first.packed_from, PackedFrom::Built(_)));
    edit_config(&model, |c| c["rope_theta"] = 500000.0.into());
    std::fs::write(model.join("generation_config.json"), r#"{"eos_token_id": [2, 77]}"#).unwrap();
    let tokenizer = std::fs::read_to_string(model.join("tokenizer.json")).unwrap().replace("\"w5\"", "\"five\"");
    std::fs::write(model.join("tokenizer.json"), tokenizer).unwrap();
    let warm = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(warm.packed_from, PackedFrom::Cache(_)), "{:?}", warm.packed_from);
    assert_ne!(logits(&warm), logits(&first), "the new rope_theta is not used");
    assert_eq!(logits(&warm), logits(&load(&model, RunPath::W4a16, GroupSize::G32, None)));
    assert!(warm.model.config().eos_token_ids.contains(&77));
    assert_eq!(warm.text.encode("five").unwrap(), [5]);
}

/// A checkpoint rewritten in place at the same size, its modification time put back (`cp -p`, `rsync
/// -a`, `touch -r`): the change time moved, so it is hashed again and the new weights run.
#[test]
fn a_checkpoint_rewritten_with_its_old_mtime_is_not_served_the_old_artifact() {
    let dir = store_dir("same-mtime");
    let model = tiny_model("cache-same-mtime");
    let weights = model.join("model.safetensors");
    let old = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    let (size, mtime) = {
        let m = std::fs::metadata(&weights).unwrap();
        (m.len(), m.modified().unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_tiny_model(&model, |name, mut w| {
        if name.ends_with("layers.0.self_attn.q_proj.weight") {
            w[3] -= 2.0;
        }
        w
    });
    std::fs::File::open(&weights).unwrap().set_modified(mtime).unwrap();
    assert_eq!(std::fs::metadata(&weights).unwrap().len(), size);
    let after = load(&model, RunPath::W4a16, GroupSize::G32, Some(&dir));
    assert!(matches!(after.packed_from, PackedFrom::Built(_)), "{:?}", after.packed_from);
    assert_ne!(logits(&after), logits(&old));
    assert_eq!(logits(&after), logits(&load(&model, RunPath::W4a16, GroupSize::G32, None)));
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
