//! Resolving references in hub caches built as huggingface_hub builds them.
#![cfg(unix)]

mod common;

use std::error::Error as _;
use std::path::Path;

use common::{C1, C2, C3, Hub, TempDir, symlink};
use int4_hub::{HubError, HubErrorKind, ModelRef, Resolved};

const ST: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
const GG: &str = "bartowski/SmolLM2-135M-Instruct-GGUF";

fn resolve(hub: &Hub, reference: &str) -> Result<Resolved, HubError> {
    hub.cache().resolve(&ModelRef::parse(reference).unwrap())
}

fn err(hub: &Hub, reference: &str) -> HubError {
    match resolve(hub, reference) {
        Ok(r) => panic!("{reference} resolved to {r:?}"),
        Err(e) => e,
    }
}

fn file_name(p: &Path) -> &str {
    p.file_name().unwrap().to_str().unwrap()
}

/// A GGUF repo at C1 holding `names`, with refs/main.
fn gguf_repo(hub: &Hub, names: &[&str]) {
    for name in names {
        hub.file(GG, C1, name, name.as_bytes());
    }
    hub.set_ref(GG, "main", C1);
}

#[test]
fn safetensors_repo_resolves_to_its_snapshot_at_main() {
    let hub = Hub::new("st-main");
    hub.safetensors_repo(ST, C1);
    let r = resolve(&hub, ST).unwrap();
    assert_eq!(r, Resolved::Directory(hub.snapshot(ST, C1)));
    assert_eq!(std::fs::read(r.path().join("model.safetensors")).unwrap(), format!("weights of {C1}").as_bytes());
    assert_eq!(resolve(&hub, &format!("{ST}@main")).unwrap(), r);
}

#[test]
fn safetensors_repo_resolves_by_branch_and_pr_ref() {
    let hub = Hub::new("st-branch");
    hub.safetensors_repo(ST, C1);
    hub.safetensors_repo(ST, C2);
    hub.safetensors_repo(ST, C3);
    hub.set_ref(ST, "main", C1);
    hub.set_ref(ST, "dev", C2);
    hub.set_ref(ST, "refs/pr/7", C3);
    assert_eq!(resolve(&hub, ST).unwrap(), Resolved::Directory(hub.snapshot(ST, C1)));
    assert_eq!(resolve(&hub, &format!("{ST}@dev")).unwrap(), Resolved::Directory(hub.snapshot(ST, C2)));
    assert_eq!(resolve(&hub, &format!("{ST}@refs/pr/7")).unwrap(), Resolved::Directory(hub.snapshot(ST, C3)));
}

#[test]
fn safetensors_repo_resolves_by_full_commit_without_a_ref() {
    let hub = Hub::new("st-commit");
    hub.safetensors_repo(ST, C1);
    hub.safetensors_repo(ST, C2);
    hub.set_ref(ST, "main", C1);
    assert_eq!(resolve(&hub, &format!("{ST}@{C2}")).unwrap(), Resolved::Directory(hub.snapshot(ST, C2)));
    // A commit hash with no snapshot is an unknown revision.
    let e = err(&hub, &format!("{ST}@{C3}"));
    assert!(matches!(e.kind(), HubErrorKind::UnknownRevision { revision, .. } if revision == C3), "{e}");
}

#[test]
fn real_files_in_a_snapshot_are_accepted() {
    let hub = Hub::new("st-real");
    for name in ["config.json", "tokenizer.json", "model.safetensors"] {
        hub.real_file(ST, C1, name, b"{}");
    }
    hub.set_ref(ST, "main", C1);
    assert_eq!(resolve(&hub, ST).unwrap(), Resolved::Directory(hub.snapshot(ST, C1)));
}

#[test]
fn sharded_safetensors_needs_every_shard_the_index_names() {
    let hub = Hub::new("st-shards");
    hub.file(ST, C1, "config.json", b"{}");
    hub.file(ST, C1, "tokenizer.json", b"{}");
    let index = r#"{"metadata": {}, "weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors",
        "c": "model-00001-of-00002.safetensors"}}"#;
    hub.file(ST, C1, "model.safetensors.index.json", index.as_bytes());
    hub.file(ST, C1, "model-00001-of-00002.safetensors", b"one");
    hub.set_ref(ST, "main", C1);
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::MissingFiles { files, .. } => assert_eq!(files, &["model-00002-of-00002.safetensors"]),
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("model-00002-of-00002.safetensors"), "{e}");
    assert_eq!(e.fetch_command(), Some(format!("hf download {ST}").as_str()));
    hub.file(ST, C1, "model-00002-of-00002.safetensors", b"two");
    assert_eq!(resolve(&hub, ST).unwrap(), Resolved::Directory(hub.snapshot(ST, C1)));
}

#[test]
fn an_index_naming_a_path_outside_the_snapshot_is_refused() {
    let hub = Hub::new("st-index");
    hub.file(ST, C1, "config.json", b"{}");
    hub.file(ST, C1, "tokenizer.json", b"{}");
    hub.file(ST, C1, "model.safetensors.index.json", br#"{"weight_map": {"a": "../../../refs/main"}}"#);
    hub.set_ref(ST, "main", C1);
    let e = err(&hub, ST);
    assert!(matches!(e.kind(), HubErrorKind::BadIndex { .. }), "{e}");
    assert!(e.to_string().contains("not a plain relative file name"), "{e}");
}

#[test]
fn missing_tokenizer_and_weights_are_named() {
    let hub = Hub::new("st-missing");
    hub.file(ST, C1, "config.json", b"{}");
    hub.set_ref(ST, "main", C1);
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::MissingFiles { dir, files } => {
            assert_eq!(dir, &hub.snapshot(ST, C1));
            assert_eq!(files[0], "tokenizer.json");
            assert!(files[1].starts_with("model.safetensors"), "{files:?}");
        }
        _ => panic!("{e}"),
    }
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{ST}: snapshot ")), "{msg}");
    assert!(msg.contains("tokenizer.json") && msg.contains(&format!("hf download {ST}")), "{msg}");
}

#[test]
fn gguf_quant_picks_one_file_case_insensitively() {
    let hub = Hub::new("gguf-pick");
    gguf_repo(
        &hub,
        &["SmolLM2-135M-Instruct-Q4_0.gguf", "SmolLM2-135M-Instruct-Q8_0.gguf", "SmolLM2-135M-Instruct-f16.gguf"],
    );
    let snap = hub.snapshot(GG, C1);
    assert_eq!(
        resolve(&hub, &format!("{GG}:Q4_0")).unwrap(),
        Resolved::Gguf(snap.join("SmolLM2-135M-Instruct-Q4_0.gguf"))
    );
    assert_eq!(
        resolve(&hub, &format!("{GG}:q8_0")).unwrap(),
        Resolved::Gguf(snap.join("SmolLM2-135M-Instruct-Q8_0.gguf"))
    );
    assert_eq!(
        resolve(&hub, &format!("{GG}@main:F16")).unwrap(),
        Resolved::Gguf(snap.join("SmolLM2-135M-Instruct-f16.gguf"))
    );
    let r = resolve(&hub, &format!("{GG}:Q4_0")).unwrap();
    assert_eq!(std::fs::read(r.path()).unwrap(), b"SmolLM2-135M-Instruct-Q4_0.gguf", "the symlink leads to the blob");
}

#[test]
fn gguf_quant_matches_whole_tokens_only() {
    let hub = Hub::new("gguf-token");
    gguf_repo(&hub, &["SmolLM2-Q4_0_4_4.gguf", "SmolLM2-IQ4_0.gguf", "model.q4_0.gguf", "SmolLM2-Q4_K_M.gguf"]);
    assert_eq!(
        resolve(&hub, &format!("{GG}:Q4_0")).unwrap(),
        Resolved::Gguf(hub.snapshot(GG, C1).join("model.q4_0.gguf"))
    );
    for quant in ["Q4_K", "K_M", "Q4"] {
        let e = err(&hub, &format!("{GG}:{quant}"));
        assert!(matches!(e.kind(), HubErrorKind::QuantNoMatch { .. }), "{quant}: {e}");
    }
    assert!(resolve(&hub, &format!("{GG}:Q4_0_4_4")).is_ok());
    assert!(resolve(&hub, &format!("{GG}:iq4_0")).is_ok());
}

#[test]
fn gguf_single_file_needs_no_quant_and_projectors_do_not_count() {
    let hub = Hub::new("gguf-single");
    gguf_repo(&hub, &["SmolLM2-Q4_0.gguf", "mmproj-SmolLM2-f16.gguf", "README.md"]);
    assert_eq!(resolve(&hub, GG).unwrap(), Resolved::Gguf(hub.snapshot(GG, C1).join("SmolLM2-Q4_0.gguf")));
}

#[test]
fn gguf_in_a_subfolder_is_found() {
    let hub = Hub::new("gguf-sub");
    gguf_repo(&hub, &["Q8_0/SmolLM2-Q8_0.gguf", "Q4_0/SmolLM2-Q4_0.gguf"]);
    let r = resolve(&hub, &format!("{GG}:Q8_0")).unwrap();
    assert_eq!(r, Resolved::Gguf(hub.snapshot(GG, C1).join("Q8_0").join("SmolLM2-Q8_0.gguf")));
    assert_eq!(std::fs::read(r.path()).unwrap(), b"Q8_0/SmolLM2-Q8_0.gguf");
}

#[test]
fn gguf_several_files_without_quant_is_ambiguous_and_lists_them_sorted() {
    let hub = Hub::new("gguf-ambiguous");
    gguf_repo(&hub, &["m-Q8_0.gguf", "m-Q4_0.gguf", "m-F16.gguf"]);
    let e = err(&hub, GG);
    match e.kind() {
        HubErrorKind::AmbiguousGguf { quant: None, candidates } => {
            assert_eq!(candidates, &["m-F16.gguf", "m-Q4_0.gguf", "m-Q8_0.gguf"])
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("add `:QUANT`"), "{e}");
    assert_eq!(e.fetch_command(), None, "nothing to fetch");
}

#[test]
fn gguf_quant_matching_several_files_is_ambiguous() {
    let hub = Hub::new("gguf-quant-ambiguous");
    gguf_repo(&hub, &["b-Q4_0.gguf", "a.Q4_0.gguf", "a-Q8_0.gguf"]);
    let e = err(&hub, &format!("{GG}:Q4_0"));
    match e.kind() {
        HubErrorKind::AmbiguousGguf { quant: Some(q), candidates } => {
            assert_eq!(q, "Q4_0");
            assert_eq!(candidates, &["a.Q4_0.gguf", "b-Q4_0.gguf"]);
        }
        _ => panic!("{e}"),
    }
}

#[test]
fn gguf_quant_matching_nothing_lists_what_is_there() {
    let hub = Hub::new("gguf-nomatch");
    gguf_repo(&hub, &["m-Q8_0.gguf", "m-Q4_0.gguf"]);
    let e = err(&hub, &format!("{GG}:Q5_K_M"));
    match e.kind() {
        HubErrorKind::QuantNoMatch { quant, available, partial } => {
            assert_eq!(quant, "Q5_K_M");
            assert_eq!(available, &["m-Q4_0.gguf", "m-Q8_0.gguf"]);
            assert!(partial.is_empty());
        }
        _ => panic!("{e}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("m-Q4_0.gguf, m-Q8_0.gguf"), "{msg}");
    assert!(msg.contains(&format!("hf download {GG} --include \"*Q5_K_M*.gguf\"")), "{msg}");
}

#[test]
fn a_quant_on_a_safetensors_repo_says_there_are_no_gguf_files() {
    let hub = Hub::new("st-quant");
    hub.safetensors_repo(ST, C1);
    let e = err(&hub, &format!("{ST}:Q4_0"));
    assert!(matches!(e.kind(), HubErrorKind::QuantNoMatch { available, .. } if available.is_empty()), "{e}");
    assert!(e.to_string().contains("no model .gguf files"), "{e}");
}

#[test]
fn a_snapshot_without_config_or_gguf_lists_what_it_holds() {
    let hub = Hub::new("nothing");
    hub.file(ST, C1, "README.md", b"hi");
    hub.file(ST, C1, "pytorch_model.bin", b"pickle");
    hub.set_ref(ST, "main", C1);
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::NoModelFiles { found, .. } => assert_eq!(found, &["README.md", "pytorch_model.bin"]),
        _ => panic!("{e}"),
    }
}

#[test]
fn split_gguf_is_refused() {
    let hub = Hub::new("gguf-split");
    gguf_repo(&hub, &["m-Q4_0-00002-of-00002.gguf", "m-Q4_0-00001-of-00002.gguf", "m-Q8_0.gguf"]);
    let e = err(&hub, &format!("{GG}:Q4_0"));
    match e.kind() {
        HubErrorKind::SplitGguf { files } => {
            assert_eq!(files, &["m-Q4_0-00001-of-00002.gguf", "m-Q4_0-00002-of-00002.gguf"])
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("split GGUF files are not supported yet"), "{e}");
    // Without a quant, the split model is one candidate among two.
    let e = err(&hub, GG);
    assert!(matches!(e.kind(), HubErrorKind::AmbiguousGguf { candidates, .. } if candidates.len() == 3), "{e}");
}

#[test]
fn dangling_symlink_names_the_file_and_the_blob() {
    let hub = Hub::new("dangling");
    hub.safetensors_repo(ST, C1);
    let blob = hub.file(ST, C1, "tokenizer.json", b"tokenizer!");
    std::fs::remove_file(&blob).unwrap();
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::DanglingSymlink { file, blob: missing } => {
            assert_eq!(file, &hub.snapshot(ST, C1).join("tokenizer.json"));
            assert_eq!(file_name(missing), file_name(&blob));
        }
        _ => panic!("{e}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("tokenizer.json") && msg.contains(file_name(&blob)) && msg.contains("missing"), "{msg}");
    assert!(e.source().is_some(), "the io::Error is kept");
}

#[test]
fn incomplete_blob_says_the_download_is_incomplete() {
    let hub = Hub::new("incomplete");
    gguf_repo(&hub, &["m-Q4_0.gguf"]);
    // A symlink whose blob is still `<sha>.incomplete`.
    let sha = Hub::sha(b"big");
    let blobs = hub.repo_dir(GG).join("blobs");
    std::fs::write(blobs.join(format!("{sha}.incomplete")), b"bi").unwrap();
    hub.link(GG, C1, "m-Q8_0.gguf", &sha);
    let e = err(&hub, &format!("{GG}:Q8_0"));
    match e.kind() {
        HubErrorKind::Incomplete { files, partial } => {
            assert_eq!(files, &[hub.snapshot(GG, C1).join("m-Q8_0.gguf")]);
            assert_eq!(file_name(&partial[0]), format!("{sha}.incomplete"));
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("the download is incomplete"), "{e}");

    // As huggingface_hub downloads: the blob is `.incomplete` and the snapshot has no link yet.
    let hub = Hub::new("incomplete-st");
    hub.file(ST, C1, "config.json", b"{}");
    hub.file(ST, C1, "tokenizer.json", b"{}");
    hub.set_ref(ST, "main", C1);
    std::fs::write(hub.repo_dir(ST).join("blobs").join(format!("{sha}.incomplete")), b"bi").unwrap();
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::Incomplete { files, partial } => {
            assert_eq!(files, &[hub.snapshot(ST, C1).join("model.safetensors")]);
            assert_eq!(partial.len(), 1);
        }
        _ => panic!("{e}"),
    }
}

#[test]
fn unknown_revision_names_it_and_lists_the_refs() {
    let hub = Hub::new("unknown-rev");
    hub.safetensors_repo(ST, C1);
    hub.set_ref(ST, "dev", C1);
    hub.set_ref(ST, "refs/pr/1", C1);
    let e = err(&hub, &format!("{ST}@v2.0"));
    match e.kind() {
        HubErrorKind::UnknownRevision { revision, refs } => {
            assert_eq!(revision, "v2.0");
            assert_eq!(refs, &["dev", "main", "refs/pr/1"]);
        }
        _ => panic!("{e}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("`v2.0`") && msg.contains("dev, main, refs/pr/1"), "{msg}");
    assert!(msg.contains(&format!("hf download {ST} --revision v2.0")), "{msg}");
}

#[test]
fn a_ref_to_a_missing_snapshot_says_so() {
    let hub = Hub::new("ref-no-snapshot");
    hub.safetensors_repo(ST, C1);
    hub.set_ref(ST, "dev", C2);
    let e = err(&hub, &format!("{ST}@dev"));
    assert!(matches!(e.kind(), HubErrorKind::SnapshotMissing { commit, .. } if commit == C2), "{e}");
}

#[test]
fn repo_not_cached_names_the_directory_and_the_download_command() {
    let hub = Hub::new("not-cached");
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::NotCached { repo_dir } => assert_eq!(repo_dir, &hub.repo_dir(ST)),
        _ => panic!("{e}"),
    }
    let msg = e.to_string();
    assert!(msg.contains(&hub.repo_dir(ST).display().to_string()), "{msg}");
    assert!(msg.contains(&format!("`hf download {ST}`")), "{msg}");
    assert!(msg.contains(&format!("`huggingface-cli download {ST}`")), "{msg}");
    // A cache root that does not exist at all is the same.
    let e = int4_hub::HubCache::at(hub.root.join("nope")).resolve(&ModelRef::parse(ST).unwrap()).unwrap_err();
    assert!(matches!(e.kind(), HubErrorKind::NotCached { .. }), "{e}");
}

#[test]
fn no_cache_directory_is_its_own_error() {
    let cache = int4_hub::HubCache::from_env_with(|_| None);
    let e = cache.resolve(&ModelRef::parse(ST).unwrap()).unwrap_err();
    assert!(matches!(e.kind(), HubErrorKind::NoCacheDir), "{e}");
    assert!(e.to_string().contains("HF_HUB_CACHE"), "{e}");
}

#[test]
fn a_symlink_escaping_the_repo_dir_is_refused() {
    let hub = Hub::new("escape");
    hub.safetensors_repo(ST, C1);
    let outside = hub.tmp.path().join("secret.json");
    std::fs::write(&outside, b"{}").unwrap();
    let tok = hub.snapshot(ST, C1).join("tokenizer.json");
    std::fs::remove_file(&tok).unwrap();
    symlink(&outside, &tok);
    let e = err(&hub, ST);
    match e.kind() {
        HubErrorKind::SymlinkEscapes { link, target, .. } => {
            assert_eq!(link, &tok);
            assert_eq!(file_name(target), "secret.json");
        }
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("refusing to follow it"), "{e}");

    // Into another repo's blobs: also outside.
    std::fs::remove_file(&tok).unwrap();
    let other = hub.file("other/repo", C1, "tokenizer.json", b"other");
    symlink(&other, &tok);
    assert!(matches!(err(&hub, ST).kind(), HubErrorKind::SymlinkEscapes { .. }));

    // A dangling link that would lead outside is refused as escaping, not reported as a missing blob.
    std::fs::remove_file(&tok).unwrap();
    symlink("../../../../nowhere/blob", &tok);
    assert!(matches!(err(&hub, ST).kind(), HubErrorKind::SymlinkEscapes { .. }));

    // A snapshot directory that is a symlink elsewhere, and a refs file that is.
    let hub = Hub::new("escape-dirs");
    hub.safetensors_repo(ST, C1);
    let elsewhere = TempDir::new("elsewhere");
    for name in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::write(elsewhere.path().join(name), b"{}").unwrap();
    }
    symlink(elsewhere.path(), hub.snapshot(ST, C2));
    assert!(matches!(err(&hub, &format!("{ST}@{C2}")).kind(), HubErrorKind::SymlinkEscapes { .. }));
    let outside_ref = elsewhere.path().join("ref");
    std::fs::write(&outside_ref, C1).unwrap();
    symlink(&outside_ref, hub.repo_dir(ST).join("refs").join("evil"));
    assert!(matches!(err(&hub, &format!("{ST}@evil")).kind(), HubErrorKind::SymlinkEscapes { .. }));
}

#[test]
fn a_repo_folder_symlinked_to_another_disk_is_followed() {
    let hub = Hub::new("moved");
    let disk = TempDir::new("disk");
    let other = Hub { tmp: TempDir::new("unused"), root: disk.path().to_path_buf() };
    other.safetensors_repo(ST, C1);
    symlink(other.repo_dir(ST), hub.repo_dir(ST));
    assert_eq!(resolve(&hub, ST).unwrap(), Resolved::Directory(hub.snapshot(ST, C1)));
}

#[test]
fn a_refs_file_that_is_huge_or_not_hex_is_refused() {
    let hub = Hub::new("bad-ref");
    hub.safetensors_repo(ST, C1);
    let refs = hub.repo_dir(ST).join("refs");
    std::fs::write(refs.join("huge"), vec![b'a'; 1 << 20]).unwrap();
    std::fs::write(refs.join("short"), b"abc123").unwrap();
    std::fs::write(refs.join("upper"), C1.to_uppercase().replace('1', "A")).unwrap();
    std::fs::write(refs.join("traversal"), b"../../../etc").unwrap();
    std::fs::write(refs.join("newline"), format!("{C1}\n")).unwrap();
    for name in ["huge", "short", "upper", "traversal"] {
        let e = err(&hub, &format!("{ST}@{name}"));
        assert!(matches!(e.kind(), HubErrorKind::BadRef { .. }), "{name}: {e}");
    }
    let e = err(&hub, &format!("{ST}@huge"));
    assert!(e.to_string().contains("larger than the 1024 bytes"), "{e}");
    assert!(e.source().is_some(), "the file error is kept");
    assert_eq!(resolve(&hub, &format!("{ST}@newline")).unwrap(), Resolved::Directory(hub.snapshot(ST, C1)));
}

#[test]
fn a_huge_snapshot_listing_stops_at_its_fuel() {
    let hub = Hub::new("fuel");
    hub.set_ref(GG, "main", C1);
    let snap = hub.snapshot(GG, C1);
    std::fs::create_dir_all(&snap).unwrap();
    for i in 0..=int4_hub::MAX_DIR_ENTRIES {
        std::fs::write(snap.join(format!("f{i}")), b"").unwrap();
    }
    let e = err(&hub, GG);
    assert!(matches!(e.kind(), HubErrorKind::TooManyEntries { limit: 10_000, .. }), "{e}");
}
