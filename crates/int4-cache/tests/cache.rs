//! Keys and the store: normalisation, key sensitivity, atomic writes, checked loads and every fault the
//! store promises to survive.

use int4_cache::key::{ArtifactKey, SourceFile, SourceIdentity};
use int4_cache::quant_config::normalize;
use int4_cache::store::{ArtifactStore, Lookup};
use int4_cache::{Artifact, CacheErrorKind};
use int4_select::policy::{CheckpointKind, Overrides, Priority, plan};
use serde_json::json;
use std::path::{Path, PathBuf};

/// A path that nothing holds yet, inside a directory of the test's own that the guard removes when dropped.
fn tempdir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::Builder::new().prefix(&format!("int4-cache-test-{name}-")).tempdir().unwrap();
    let path = root.path().join(name);
    (root, path)
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
    let ArtifactKey {
        key_format,
        crate_version,
        layout_version,
        quantization,
        plan,
        cpu_features,
        options,
        model,
        source,
    } = base.clone();
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
    assert!(model.is_null());
    variants.push(base.clone().with_model(json!({"linears": [{"name": "lm_head", "n": 96, "k": 64}]})));
    variants.push(base.clone().with_model(json!({"linears": [{"name": "lm_head", "n": 96, "k": 128}]})));
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
    let (_scratch, store_dir) = tempdir("roundtrip");
    let store = ArtifactStore::new(store_dir);
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

/// Artifacts are read-only; a test that damages one makes it writable first (as another program would).
fn writable(path: &Path) -> &Path {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

/// Sets a file's modification time (the owner may, through a read-only descriptor too).
fn set_mtime(path: &Path, t: std::time::SystemTime) {
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

#[test]
fn damaged_artifacts_are_never_used() {
    let (_scratch, store_dir) = tempdir("damaged");
    let store = ArtifactStore::new(store_dir);
    let key = a_key("d");
    // Truncated.
    drop(store.store(&key, &sections()).unwrap());
    let path = artifact_path(&store, &key);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(writable(&path)).unwrap().set_len(len - 1).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a truncated artifact loaded") };
    assert!(why.to_string().contains("truncated"), "{why}");
    let (art, warnings) = store.get_or_build(&key, || Ok::<_, ()>(sections())).unwrap();
    assert!(matches!(art, Artifact::Mapped(_)) && warnings[0].contains("rebuilding"), "{warnings:?}");
    drop(art);
    // Wrong version.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 9;
    std::fs::write(writable(&path), &bytes).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a wrong version loaded") };
    assert!(why.to_string().contains("version"), "{why}");
    // A flipped byte in the header.
    drop(store.store(&key, &sections()).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(writable(&path), &bytes).unwrap();
    assert!(matches!(store.load(&key), Lookup::Invalid(_)));
    // A header that is not JSON: the parser's error is kept as the source.
    drop(store.store(&key, &sections()).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[24] = b'!';
    std::fs::write(writable(&path), &bytes).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("an artifact with a broken header loaded") };
    assert!(matches!(why.kind(), CacheErrorKind::BadHeader { .. }), "{why:?}");
    assert!(std::error::Error::source(&why).is_some_and(|s| s.is::<serde_json::Error>()), "{why:?}");
    // A flipped byte in the payload: loads check header, size and key; `verify` hashes the payload.
    drop(store.store(&key, &sections()).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(writable(&path), &bytes).unwrap();
    let report = store.verify();
    assert!(report.iter().any(|(_, r)| r.as_ref().is_err_and(|e| e.to_string().contains("corrupt"))), "{report:?}");
    // A warm load checks the payload too: the flipped byte is never served.
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a damaged payload loaded") };
    assert!(why.to_string().contains("payload blake3 does not match"), "{why}");
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
    let (_scratch, store_dir) = tempdir("concurrent");
    let store = ArtifactStore::new(store_dir);
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
    let (_scratch, blocker) = tempdir("unwritable");
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
    let (_scratch, store_dir) = tempdir("removed");
    let store = ArtifactStore::new(store_dir);
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
    let (_scratch, store_dir) = tempdir("killed");
    let store = ArtifactStore::new(store_dir);
    let key = a_key("k");
    std::fs::create_dir_all(store.dir()).unwrap();
    let tmp = store.dir().join(format!(".{}.999.0.tmp", key.hash()));
    std::fs::write(&tmp, b"INT4ART\0half-written").unwrap();
    assert!(matches!(store.load(&key), Lookup::Miss));
    // Listed, and dead (no writer holds its lock), however young.
    assert_eq!(store.temporaries(), vec![(tmp.clone(), 20, false)]);
    store.clear();
    assert!(!tmp.exists());
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn eviction_is_lru_and_spares_mapped_and_pinned_artifacts() {
    let (_scratch, store_dir) = tempdir("evict");
    let store = ArtifactStore::new(store_dir);
    let keys: Vec<ArtifactKey> = (0..4).map(|i| a_key(&format!("e{i}"))).collect();
    let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(1000);
    for (i, k) in keys.iter().enumerate() {
        drop(store.store(k, &sections()).unwrap());
        set_mtime(&artifact_path(&store, k), t0 + std::time::Duration::from_secs(i as u64 * 10));
    }
    store.pin(&keys[0]).unwrap();
    let Lookup::Hit(held) = store.load(&keys[1]) else { panic!() };
    // Loading touched keys[1]; make it old again so only the lock protects it.
    set_mtime(&artifact_path(&store, &keys[1]), t0);
    let evicted = store.evict_to(0);
    assert_eq!(evicted, vec![keys[2].hash(), keys[3].hash()], "oldest first, pinned and mapped spared");
    assert!(matches!(store.load(&keys[0]), Lookup::Hit(_)));
    drop(held);
    assert_eq!(store.evict_to(0), vec![keys[1].hash()]);
    assert_eq!(store.list().len(), 1);
    let _ = std::fs::remove_dir_all(store.dir());
}

#[test]
fn source_identity_hashes_content_and_reuses_a_hash_only_for_an_unchanged_file() {
    let (_scratch, dir) = tempdir("source");
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

    // Rewritten in place at the same size with the old modification time put back (`cp -p`, `rsync -a`,
    // `touch -r`): the change time moved, so the file is hashed again.
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&f, b"weights v3").unwrap();
    set_mtime(&f, mtime);
    let d = SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_eq!(d.files[0].blake3, blake3::hash(b"weights v3").to_hex().to_string());

    // A file replaced by another (a new inode) with the same size and times is hashed again too.
    let other = dir.join("other");
    std::fs::write(&other, b"weights v4").unwrap();
    let meta = std::fs::metadata(&f).unwrap();
    set_mtime(&other, meta.modified().unwrap());
    std::fs::rename(&other, &f).unwrap();
    let e = SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_eq!(e.files[0].blake3, blake3::hash(b"weights v4").to_hex().to_string());

    // An unchanged file reuses its recorded hash (the record, with when it was made, stays as it was)...
    let record = |index: &Path| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(index).unwrap()).unwrap();
        v["files"].as_object().unwrap().values().next().unwrap().clone()
    };
    // (once its last change is older than the recording by the racy margin: a file changed just before
    // it was hashed is hashed again, as below, until then).
    let margin = std::time::Duration::from_nanos(int4_cache::key::RACY_MARGIN_NS as u64);
    std::thread::sleep(margin + std::time::Duration::from_millis(100));
    SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    let before = record(&index);
    SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_eq!(record(&index), before, "an unchanged file is not hashed again");
    // ...unless its times are not older than the record (git's racy rule): a file written in the same
    // clock tick as its hashing may have changed unseen, so it is hashed again each time until it is old.
    set_mtime(&f, std::time::SystemTime::now() + std::time::Duration::from_secs(3600));
    SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    let first = record(&index);
    SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap();
    assert_ne!(record(&index)["recorded_ns"], first["recorded_ns"], "a racy entry is hashed again");

    // An index that is not one (garbage, a FIFO) only costs a rehash.
    std::fs::write(&index, b"{garbage").unwrap();
    assert_eq!(SourceIdentity::of_files(std::slice::from_ref(&f), Some(&index)).unwrap(), e);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_capped_store_evicts_older_artifacts_after_a_write_but_never_the_new_one() {
    let (_scratch, store_dir) = tempdir("cap");
    let store = ArtifactStore::new(store_dir).with_cap(1);
    let a = a_key("cap-a");
    drop(store.store(&a, &sections()).unwrap());
    let b = a_key("cap-b");
    let m = store.store(&b, &sections()).unwrap();
    assert_eq!(m.section("a").unwrap(), &sections()[0].1[..]);
    let left: Vec<String> = store.list().into_iter().map(|e| e.key).collect();
    assert_eq!(left, vec![b.hash()], "the older artifact is evicted, the one just written kept");
    let _ = std::fs::remove_dir_all(store.dir());
}

/// Artifacts are written read-only; two section names of equal length swapped in the header (the key
/// and every offset still valid) are refused on a warm load, because the payload hash covers names.
#[test]
fn artifacts_are_read_only_and_a_renamed_section_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let (_scratch, store_dir) = tempdir("renamed-section");
    let store = ArtifactStore::new(store_dir);
    let key = a_key("s");
    let sections = vec![("layer.0".to_string(), vec![1u8; 300]), ("layer.1".to_string(), vec![2u8; 300])];
    drop(store.store(&key, &sections).unwrap());
    let path = artifact_path(&store, &key);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o222, 0, "artifacts are read-only");
    let text = std::fs::read(&path).unwrap();
    let mut bytes = text.clone();
    let find = |b: &[u8], pat: &[u8]| b.windows(pat.len()).position(|w| w == pat).unwrap();
    let (a, b) = (find(&bytes, b"\"layer.0\""), find(&bytes, b"\"layer.1\""));
    bytes[a + 7] = b'1';
    bytes[b + 7] = b'0';
    std::fs::write(writable(&path), &bytes).unwrap();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("an artifact with swapped section names loaded") };
    assert!(why.to_string().contains("payload"), "{why}");
    let _ = std::fs::remove_dir_all(store.dir());
}

/// A temporary is the store's own only by its exact name, and a dead writer's only when its lock can be
/// taken: a live writer's is listed, counted against the cap and kept; look-alikes are never touched.
#[test]
fn only_dead_writers_temporaries_are_removed_and_live_ones_count() {
    use std::os::fd::AsRawFd;
    let (_scratch, store_dir) = tempdir("temporaries");
    let store = ArtifactStore::new(store_dir);
    std::fs::create_dir_all(store.dir()).unwrap();
    let hash = "ab".repeat(32);
    let dead = store.dir().join(format!(".{hash}.4242.7.tmp"));
    let live = store.dir().join(format!(".{hash}.4243.0.tmp"));
    let lookalikes = [
        store.dir().join(".notes.tmp"),
        store.dir().join(format!(".{hash}.tmp")),
        store.dir().join(format!(".{}.1.2.tmp", "AB".repeat(32))),
        store.dir().join(format!("{hash}.1.2.tmp")),
    ];
    std::fs::write(&dead, vec![0u8; 1000]).unwrap();
    std::fs::write(&live, vec![0u8; 5000]).unwrap();
    for l in &lookalikes {
        std::fs::write(l, b"someone else's").unwrap();
    }
    let writer = std::fs::File::open(&live).unwrap();
    // SAFETY: the descriptor is open for the call; flock changes only its advisory lock.
    assert_eq!(unsafe { libc::flock(writer.as_raw_fd(), libc::LOCK_EX) }, 0);
    let mut listed = store.temporaries();
    listed.sort();
    assert_eq!(listed, vec![(dead.clone(), 1000, false), (live.clone(), 5000, true)]);
    // A cold write removes the dead writer's temporary, whatever its age, and only it.
    let m = store.store(&a_key("t"), &sections()).unwrap();
    assert!(!dead.exists() && live.exists());
    assert!(lookalikes.iter().all(|l| l.exists()), "files that only look like temporaries are kept");
    drop(m);
    // The live writer's bytes count against the cap: with room for exactly one artifact and the live
    // temporary, the artifact stays; with less, it goes.
    let artifact = store.list()[0].size;
    assert!(store.evict_to(artifact + 5000).is_empty());
    assert_eq!(store.evict_to(artifact + 4999).len(), 1);
    store.clear();
    assert!(live.exists(), "a live writer's temporary is never removed");
    drop(writer);
    store.clear();
    assert!(!live.exists(), "once its writer is gone it is");
    let _ = std::fs::remove_dir_all(store.dir());
}

/// A lock another process holds is waited on for LOCK_WAIT, then the artifact is reported, not waited on
/// forever; a FIFO or a directory at an artifact's name is an error at once, for loads and listings alike.
#[test]
fn locks_are_waited_on_with_a_timeout_and_fifos_never_block() {
    use std::os::fd::AsRawFd;
    let (_scratch, store_dir) = tempdir("lock-fifo");
    let store = ArtifactStore::new(store_dir);
    let key = a_key("l");
    drop(store.store(&key, &sections()).unwrap());
    let path = artifact_path(&store, &key);
    let holder = std::fs::File::open(&path).unwrap();
    // SAFETY: the descriptor is open for the call; flock changes only its advisory lock.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
    let t = std::time::Instant::now();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a locked artifact loaded") };
    assert!(matches!(why.kind(), CacheErrorKind::Locked { .. }), "{why}");
    let waited = t.elapsed();
    assert!(waited >= int4_cache::store::LOCK_WAIT && waited < int4_cache::store::LOCK_WAIT * 3, "{waited:?}");
    drop(holder);
    assert!(matches!(store.load(&key), Lookup::Hit(_)));

    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path; mkfifo creates a file and touches no memory of ours.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = std::time::Instant::now();
    let Lookup::Invalid(why) = store.load(&key) else { panic!("a FIFO loaded") };
    assert!(why.to_string().contains("FIFO"), "{why}");
    assert!(store.header(&key.hash()).is_err());
    assert!(store.verify().iter().all(|(_, r)| r.is_err()));
    assert!(t.elapsed() < std::time::Duration::from_secs(1), "nothing waited on the FIFO");
    let _ = std::fs::remove_dir_all(store.dir());
}

/// A mapped artifact truncated underneath the process: the next read of a page past the new end is
/// reported (the artifact named, exit status 74), not a bare SIGBUS. Runs in a child process (this test
/// binary again), since the process ends.
#[test]
fn a_mapped_artifact_truncated_underneath_ends_the_process_with_a_message() {
    const CHILD: &str = "INT4_SIGBUS_CHILD_DIR";
    if let Ok(dir) = std::env::var(CHILD) {
        let store = ArtifactStore::new(&dir);
        let key = a_key("bus");
        let big = vec![("big".to_string(), vec![5u8; 1 << 20])];
        let m = store.store(&key, &big).unwrap();
        let path = artifact_path(&store, &key);
        std::fs::OpenOptions::new().write(true).open(writable(&path)).unwrap().set_len(4096).unwrap();
        let section = m.section("big").unwrap();
        // Touch every page: the ones past the new end fault.
        let sum: u64 = section.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        println!("read {sum} without a fault");
        return;
    }
    let (_scratch, dir) = tempdir("sigbus");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_mapped_artifact_truncated_underneath_ends_the_process_with_a_message", "--nocapture"])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(int4_cache::sigbus::EXIT_ARTIFACT_CHANGED), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("was truncated while this process had it mapped") && stderr.contains(".int4art"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
