//! Hub caches in temporary directories, laid out exactly as huggingface_hub writes them: contents in
//! `blobs/<sha>`, `snapshots/<commit>/<file>` a relative symlink `../../blobs/<sha>`, `refs/<branch>` the
//! commit without a newline. Unix only (the caches are built with Unix symlinks).
#![allow(dead_code)]

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use int4_hub::HubCache;
pub use int4_test_support::TempDir;

pub const C1: &str = "1111111111111111111111111111111111111111";
pub const C2: &str = "2222222222222222222222222222222222222222";
pub const C3: &str = "3333333333333333333333333333333333333333";

/// A hub cache under construction.
pub struct Hub {
    pub tmp: TempDir,
    pub root: PathBuf,
}

impl Hub {
    pub fn new(name: &str) -> Self {
        let tmp = TempDir::new(name);
        let root = tmp.path().join("hub");
        std::fs::create_dir_all(&root).unwrap();
        Hub { tmp, root }
    }

    pub fn cache(&self) -> HubCache {
        HubCache::at(&self.root)
    }

    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(format!("models--{}", repo.replace('/', "--")))
    }

    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// A blob name as huggingface_hub makes them (a sha256 for LFS files); here a stable hash of the
    /// contents, 64 hex digits.
    pub fn sha(contents: &[u8]) -> String {
        let mut s = String::new();
        for salt in 0..4u8 {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (salt, contents).hash(&mut h);
            s.push_str(&format!("{:016x}", h.finish()));
        }
        s
    }

    /// Downloads `rel` at `commit`: the blob, and the snapshot's relative symlink to it. Returns the blob.
    pub fn file(&self, repo: &str, commit: &str, rel: &str, contents: &[u8]) -> PathBuf {
        let sha = Hub::sha(contents);
        let blobs = self.repo_dir(repo).join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        let blob = blobs.join(&sha);
        std::fs::write(&blob, contents).unwrap();
        self.link(repo, commit, rel, &sha);
        blob
    }

    /// Only the snapshot's symlink to `blobs/<sha>` (which need not exist).
    pub fn link(&self, repo: &str, commit: &str, rel: &str, sha: &str) -> PathBuf {
        let path = self.snapshot(repo, commit).join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let depth = rel.matches('/').count();
        let target = format!("{}../../blobs/{sha}", "../".repeat(depth));
        if path.symlink_metadata().is_ok() {
            std::fs::remove_file(&path).unwrap();
        }
        symlink(&target, &path);
        path
    }

    /// A real file in the snapshot (a cache copied from Windows, or made without symlinks).
    pub fn real_file(&self, repo: &str, commit: &str, rel: &str, contents: &[u8]) -> PathBuf {
        let path = self.snapshot(repo, commit).join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
        path
    }

    pub fn set_ref(&self, repo: &str, name: &str, commit: &str) {
        let path = self.repo_dir(repo).join("refs").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, commit).unwrap();
    }

    /// A complete safetensors model at `commit`, with `refs/main` pointing at it.
    pub fn safetensors_repo(&self, repo: &str, commit: &str) {
        self.file(repo, commit, "config.json", br#"{"model_type": "llama"}"#);
        self.file(repo, commit, "tokenizer.json", b"{}");
        self.file(repo, commit, "model.safetensors", format!("weights of {commit}").as_bytes());
        self.set_ref(repo, "main", commit);
    }
}

pub fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}
