//! Keys and the store: normalisation, key sensitivity, atomic writes, checked loads and every fault the
//! store promises to survive.

use int4_cache::key::{ArtifactKey, SourceFile, SourceIdentity};
use int4_cache::quant_config::normalize;
use int4_cache::store::{ArtifactStore, Lookup};
use int4_cache::{Artifact, CacheErrorKind};
use int4_select::policy::{CheckpointKind, Overrides, Priority, plan};
use serde_json::json;
use std::path::PathBuf;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("int4-cache-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn a_plan() -> int4_select::Plan {
    let snap = int4_select::probe::non_x86_snapshot("aarch64", "test");
    plan(&snap, CheckpointKind::CpuInt4, Priority::Speed, &Overrides::default()).unwrap()
}

fn a_key(tag: &str) -> ArtifactKey {
    ArtifactKey::new(
        normalize(Some(&json!({"quant_method": "cpu_int4", "group_size": 128}))).unwrap(),
        &a_plan(),
        vec!["avx2".into(), "fma".into()],
        SourceIdentity { files: vec![SourceFile { name: "model.safetensors".into(), size: 10, blake3: tag.into() }] },
    )
}

fn sections() -> Vec<(String, Vec<u8>)> {
    vec![("a".into(), (0..1000u32).map(|i| i as u8).collect()), ("empty".into(), vec![]), ("b".into(), vec![7u8; 4097])]
}

#[test]
fn defaults_normalise_equal_and_unknown_keys_are_kept_and_warned() {
    let absent = normalize(Some(&json!({"quant_method": "gptq"}))).unwrap();
    let explicit = normalize(Some(&json!({
        "quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true, "desc_act": false,
        "checkpoint_format": "gptq", "lm_head": false
    })))
    .unwrap();
    assert_eq!(absent, explicit);
    let with_ignored =
        normalize(Some(&json!({"quant_method": "gptq", "damp_percent": 0.01, "true_sequential": true}))).unwrap();
    assert!(with_ignored.warnings.is_empty());
    assert_eq!(with_ignored.ignored.len(), 2);
    assert_ne!(with_ignored, absent, "known-ignored keys are hashed, not dropped");
    let unknown = normalize(Some(&json!({"quant_method": "cpu_int4", "mystery": 3}))).unwrap();
    assert_eq!(unknown.unknown.len(), 1);
    assert!(unknown.warnings[0].contains("mystery"));
    assert_eq!(normalize(None).unwrap().method, "none");
}

#[test]
fn values_that_cannot_be_honoured_are_errors() {
    for (cfg, needle) in [
        (json!({"quant_method": "gptq", "bits": 8}), "bits"),
        (json!({"quant_method": "cpu_int4", "group_size": 100}), "group_size"),
        (json!({"quant_method": "cpu_int4", "group_size": "128"}), "wrong type"),
        (json!({"quant_method": "cpu_int4", "direct_dequant": "yes"}), "wrong type"),
        (json!({"quant_method": "bitsandbytes"}), "not supported"),
        (json!({"bits": 4}), "quant_method"),
        (json!([1, 2]), "object"),
    ] {
        let e = normalize(Some(&cfg)).unwrap_err();
        assert!(matches!(e.kind(), CacheErrorKind::BadConfig(_)));
        assert!(e.to_string().contains(needle), "{cfg}: {e}");
    }
}

#[test]
fn canonical_encodings() {
    let cfgs = [
        json!({"quant_method": "cpu_int4"}),
        json!({"quant_method": "gptq", "sym": false, "checkpoint_format": "gptq_v2", "damp_percent": 0.1, "x_new": 1}),
        json!({"quant_method": "awq"}),
    ];
    let text: Vec<String> = cfgs.iter().map(|c| serde_json::to_string(&normalize(Some(c)).unwrap()).unwrap()).collect();
    insta::assert_snapshot!("normalized_configs", text.join("\n"));
    insta::assert_snapshot!("artifact_key", a_key("0123").canonical());
}

/// Every single field of the key changes the hash. The destructuring below has no `..`: a field added to
/// `ArtifactKey` does not compile here until this test changes it too.
#[test]
fn changing_any_single_field_changes_the_key() {
    let base = a_key("0123");
    let ArtifactKey { key_format, crate_version, layout_version, quantization, plan, cpu_features, options, source } =
        base.clone();
    let mut variants = Vec::new();
    variants.push(ArtifactKey { key_format: key_format + 1, ..base.clone() });
    variants.push(ArtifactKey { crate_version: format!("{crate_version}-x"), ..base.clone() });
    variants.push(ArtifactKey { layout_version: layout_version + 1, ..base.clone() });
    let mut q = quantization.clone();
    q.fields.insert("group_size".into(), json!(64));
    variants.push(ArtifactKey { quantization: q, ..base.clone() });
    let mut q = quantization.clone();
    q.unknown.insert("x".into(), json!(1));
    variants.push(ArtifactKey { quantization: q, ..base.clone() });
    for mutate in [
        |p: &mut int4_cache::key::PlanDecision| p.direct_dequant = !p.direct_dequant,
        |p: &mut int4_cache::key::PlanDecision| p.dequant_threshold += 1,
        |p: &mut int4_cache::key::PlanDecision| p.layout = int4_select::policy::PackedLayout::Tinygemm64,
        |p: &mut int4_cache::key::PlanDecision| p.prefill.kernel = int4_kernels::KernelId::W4a16PrefillHalvesAvx2,
        |p: &mut int4_cache::key::PlanDecision| p.path = int4_select::policy::Rung::W4a16Avx512,
    ] {
        let mut p = plan.clone();
        mutate(&mut p);
        variants.push(ArtifactKey { plan: p, ..base.clone() });
    }
    variants.push(ArtifactKey { cpu_features: vec![cpu_features[0].clone()], ..base.clone() });
    assert!(options.is_empty());
    variants.push(base.clone().with_option("head_bits", json!(8)));
    variants.push(base.clone().with_option("head_bits", json!(4)));
    let mut s = source.clone();
    s.files[0].size += 1;
    variants.push(ArtifactKey { source: s, ..base.clone() });
    variants.push(a_key("0124"));
    let mut hashes: Vec<String> = variants.iter().map(ArtifactKey::hash).collect();
    hashes.push(base.hash());
    let n = hashes.len();
    hashes.sort();
    hashes.dedup();
    assert_eq!(hashes.len(), n, "two different keys hashed equal");
}

#[test]
fn stored_artifacts_load_zero_copy_and_aligned() {
    let store = ArtifactStore::new(tempdir("roundtrip"));
    let key = a_key("r");
    assert!(matches!(store.load(&key), Lookup::Miss));
    let written = store.store(&key, &sections()).unwrap();
    for (name, bytes) in sections() {
        let got = written.section(&name).unwrap();
        assert_eq!(got, &bytes[..]);
        assert_eq!(got.as_ptr() as usize % 64, 0, "section {name} is not 64-byte aligned");
    }
    drop(written);
    let Lookup::Hit(m) = store.load(&key) else { panic!("expected a hit") };
    assert_eq!(m.section("b").unwrap(), &vec![7u8; 4097][..]);
    assert!(store.verify().iter().all(|(_, r)| r.is_ok()));
    // Another key is not served this artifact.
    assert!(matches!(store.load(&a_key("other")), Lookup::Miss));
    let _ = std::fs::remove_dir_all(store.dir());
}

fn artifact_path(store: &ArtifactStore, key: &ArtifactKey) -> PathBuf {
    store.dir().join(format!("{}.int4art", key.hash()))
}

#[test]
fn damaged_artifacts_are_never_used() {
    let store = ArtifactStore::new(tempdir("damaged"));
    let key = a_key("d");
    // Truncated.
    drop(store.store(&key, &sections()).unwrap());
    let path = artifact_path(&store, &key);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a truncated artifact loaded") };
    assert!(why.to_string().contains("truncated"), "{why}");
    let (art, warnings) = store.get_or_build(&key, || Ok::<_, ()>(sections())).unwrap();
    assert!(matches!(art, Artifact::Mapped(_)) && warnings[0].contains("rebuilding"), "{warnings:?}");
    drop(art);
    // Wrong version.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 9;
    std::fs::write(&path, &bytes).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a wrong version loaded") };
    assert!(why.to_string().contains("version"), "{why}");
    // A flipped byte in the header.
    drop(store.store(&key, &sections()).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(store.load(&key), Lookup::Invalid(_)));
    // A header that is not JSON: the parser's error is kept as the source.
    drop(store.store(&key, &sections()).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[24] = b'!';
    std::fs::write(&path, &bytes).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("an artifact with a broken header loaded") };
    assert!(matches!(why.kind(), CacheErrorKind::BadHeader { .. }), "{why:?}");
    assert!(std::error::Error::source(&why).is_some_and(|s| s.is::<serde_json::Error>()), "{why:?}");
    // A flipped byte in the payload: loads check header, size and key; `verify` hashes the payload.
    drop(store.store(&key, &sections()).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let report = store.verify();
    assert!(report.iter().any(|(_, r)| r.as_ref().is_err_and(|e| e.to_string().contains("corrupt"))), "{report:?}");
    // An artifact renamed to another key's name is refused.
    let other = a_key("renamed");
    drop(store.store(&key, &sections()).unwrap());
    std::fs::rename(&path, artifact_path(&store, &other)).unwrap();
    let Lookup::Invalid(why) = store.load(&other) else { panic!("a renamed artifact loaded") };
    assert!(why.to_string().contains("key"), "{why}");
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn concurrent_builders_of_one_key_both_succeed_and_one_file_survives() {
    let store = ArtifactStore::new(tempdir("concurrent"));
    let key = a_key("c");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| store.store(&key, &sections()).map(|m| m.section("a").unwrap().to_vec())))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), sections()[0].1);
        }
    });
    let files: Vec<_> = std::fs::read_dir(store.dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn an_unwritable_cache_runs_uncached_with_a_warning() {
    let blocker = tempdir("unwritable");
    std::fs::write(&blocker, b"a file where the directory should be").unwrap();
    let store = ArtifactStore::new(blocker.join("cache"));
    let (art, warnings) = store.get_or_build(&a_key("u"), || Ok::<_, ()>(sections())).unwrap();
    assert!(matches!(art, Artifact::InMemory { .. }));
    assert!(warnings[0].contains("uncached"), "{warnings:?}");
    assert_eq!(art.section("b").unwrap(), &vec![7u8; 4097][..]);
    std::fs::remove_file(&blocker).unwrap();
}

#[test]
fn removing_the_cache_dir_while_mapped_is_survived() {
    let store = ArtifactStore::new(tempdir("removed"));
    let key = a_key("rm");
    let m = store.store(&key, &sections()).unwrap();
    std::fs::remove_dir_all(store.dir()).unwrap();
    assert_eq!(m.section("a").unwrap(), &sections()[0].1[..], "the mapping outlives the file");
    assert!(matches!(store.load(&key), Lookup::Miss));
    let (art, warnings) = store.get_or_build(&key, || Ok::<_, ()>(sections())).unwrap();
    assert!(matches!(art, Artifact::Mapped(_)) && warnings.is_empty());
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn a_killed_writers_temporary_is_never_read_and_is_cleaned_up() {
    let store = ArtifactStore::new(tempdir("killed"));
    let key = a_key("k");
    std::fs::create_dir_all(store.dir()).unwrap();
    let tmp = store.dir().join(format!(".{}.999.0.tmp", key.hash()));
    std::fs::write(&tmp, b"INT4ART\0half-written").unwrap();
    assert!(matches!(store.load(&key), Lookup::Miss));
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options().write(true).open(&tmp).unwrap().set_modified(old).unwrap();
    store.clear();
    assert!(!tmp.exists());
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn eviction_is_lru_and_spares_mapped_and_pinned_artifacts() {
    let store = ArtifactStore::new(tempdir("evict"));
    let keys: Vec<ArtifactKey> = (0..4).map(|i| a_key(&format!("e{i}"))).collect();
    let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(1000);
    for (i, k) in keys.iter().enumerate() {
        drop(store.store(k, &sections()).unwrap());
        let f = std::fs::File::options().write(true).open(artifact_path(&store, k)).unwrap();
        f.set_modified(t0 + std::time::Duration::from_secs(i as u64 * 10)).unwrap();
    }
    store.pin(&keys[0]).unwrap();
    let Lookup::Hit(held) = store.load(&keys[1]) else { panic!() };
    // Loading touched keys[1]; make it old again so only the lock protects it.
    std::fs::File::options().write(true).open(artifact_path(&store, &keys[1])).unwrap().set_modified(t0).unwrap();
    let evicted = store.evict_to(0);
    assert_eq!(evicted, vec![keys[2].hash(), keys[3].hash()], "oldest first, pinned and mapped spared");
    assert!(matches!(store.load(&keys[0]), Lookup::Hit(_)));
    drop(held);
    assert_eq!(store.evict_to(0), vec![keys[1].hash()]);
    assert_eq!(store.list().len(), 1);
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn source_identity_hashes_content_with_a_size_and_mtime_fast_path() {
    let dir = tempdir("source");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("model.safetensors");
    std::fs::write(&f, b"weights v1").unwrap();
    let index = dir.join("index.json");
    let a = SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_eq!(a.files[0].blake3, blake3::hash(b"weights v1").to_hex().to_string());
    assert!(index.exists());
    let b = SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_eq!(a, b);
    std::fs::write(&f, b"weights v2").unwrap();
    let c = SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_ne!(a, c);
    assert!(SourceIdentity::of_files(&[dir.join("missing")], None).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_capped_store_evicts_older_artifacts_after_a_write_but_never_the_new_one() {
    let store = ArtifactStore::new(tempdir("cap")).with_cap(1);
    let a = a_key("cap-a");
    drop(store.store(&a, &sections()).unwrap());
    let b = a_key("cap-b");
    let m = store.store(&b, &sections()).unwrap();
    assert_eq!(m.section("a").unwrap(), &sections()[0].1[..]);
    let left: Vec<String> = store.list().into_iter().map(|e| e.key).collect();
    assert_eq!(left, vec![b.hash()], "the older artifact is evicted, the one just written kept");
    let _ = std::fs::remove_dir_all(store.dir());
}
