//! From a reference to checked files: the repo's folder, the revision's snapshot, then the model's files in
//! it, every step bounded and kept inside the repo's folder.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::error::{HubError, HubErrorKind};
use crate::gguf_name;
use crate::reference::{ModelRef, is_commit};

/// The most bytes a `refs/<revision>` file may hold (a commit hash is 40).
pub const MAX_REF_BYTES: u64 = 1024;
/// The most bytes a `model.safetensors.index.json` may hold (the largest public indexes are a few MiB).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;
/// The most directory entries one listing (a snapshot, `refs/`, `blobs/`) visits.
pub const MAX_DIR_ENTRIES: usize = 10_000;
/// The deepest a listing descends below the directory it starts from.
const MAX_DEPTH: usize = 8;
/// The most symlink hops followed by hand when looking for a dangling link's blob.
const MAX_HOPS: usize = 40;

/// What a reference resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// A safetensors model: the snapshot directory, `<repo>/snapshots/<commit>`, holding `config.json`,
    /// `tokenizer.json` and the weights (each checked to be there).
    Directory(PathBuf),
    /// A GGUF model: the one `.gguf` file chosen, as its path in the snapshot (usually a symlink to a
    /// blob, so the file keeps its name).
    Gguf(PathBuf),
}

impl Resolved {
    /// The directory or file.
    pub fn path(&self) -> &Path {
        match self {
            Resolved::Directory(p) | Resolved::Gguf(p) => p,
        }
    }
}

/// One repo's folder: as joined from the cache root (for the paths handed out) and canonical (for the
/// containment check).
struct Repo {
    dir: PathBuf,
    canonical: PathBuf,
}

/// Whether a file is there (errors cover everything else).
#[derive(PartialEq, Eq)]
enum Presence {
    Present,
    Missing,
}

/// A symlink whose target does not exist, and the error that said so.
struct Dangling<'a> {
    path: &'a Path,
    error: std::io::Error,
}

pub(crate) fn resolve(root: &Path, reference: &ModelRef) -> Result<Resolved, HubError> {
    let dir = root.join(reference.repo().folder_name());
    let canonical = match fs::canonicalize(&dir) {
        Ok(c) => c,
        Err(e) if is_missing(&e) => {
            return Err(HubError::new(HubErrorKind::NotCached { repo_dir: dir }).with_source(e));
        }
        Err(e) => return Err(HubError::io(&dir, e)),
    };
    if !canonical.is_dir() {
        return Err(HubError::new(HubErrorKind::WrongType { path: dir, expected: "a directory" }));
    }
    let repo = Repo { dir, canonical };
    let snapshot = repo.snapshot(reference.revision())?;
    let config = snapshot.join("config.json");
    let has_config = exists_entry(&config).map_err(|e| HubError::io(&config, e))?;
    match reference.quant() {
        None if has_config => repo.safetensors(&snapshot).map(|()| Resolved::Directory(snapshot)),
        quant => repo.gguf(&snapshot, quant).map(Resolved::Gguf),
    }
}

impl Repo {
    /// The snapshot directory of `revision`: a ref's commit, or a full commit hash as given.
    fn snapshot(&self, revision: &str) -> Result<PathBuf, HubError> {
        let snapshots = self.dir.join("snapshots");
        if is_commit(revision) {
            let dir = snapshots.join(revision);
            if self.check_dir(&dir)? == Presence::Present {
                return Ok(dir);
            }
            return Err(self.unknown_revision(revision));
        }
        let ref_file = revision.split('/').fold(self.dir.join("refs"), |p, c| p.join(c));
        let is_file = match fs::symlink_metadata(&ref_file) {
            Ok(m) => !m.is_dir(),
            Err(e) if is_missing(&e) => false,
            Err(e) => return Err(HubError::io(&ref_file, e)),
        };
        if !is_file {
            return Err(self.unknown_revision(revision));
        }
        let commit = self.read_ref(&ref_file)?;
        let dir = snapshots.join(&commit);
        match self.check_dir(&dir)? {
            Presence::Present => Ok(dir),
            Presence::Missing => {
                Err(HubError::new(HubErrorKind::SnapshotMissing { revision: revision.to_owned(), commit, dir }))
            }
        }
    }

    /// The commit a refs file holds: at most [`MAX_REF_BYTES`], trimmed, 40 lowercase hex digits.
    fn read_ref(&self, path: &Path) -> Result<String, HubError> {
        let bad = |reason: String| HubError::new(HubErrorKind::BadRef { path: path.to_path_buf(), reason });
        self.contain(path)?;
        let text =
            int4_files::read_text_capped(path, MAX_REF_BYTES).map_err(|e| bad(e.kind().to_string()).with_source(e))?;
        let commit = text.trim();
        if !is_commit(commit) {
            let shown: String = commit.chars().take(60).collect();
            return Err(bad(format!("holds {shown:?}, not a 40-character hexadecimal commit hash")));
        }
        Ok(commit.to_owned())
    }

    fn unknown_revision(&self, revision: &str) -> HubError {
        let refs_dir = self.dir.join("refs");
        let mut refs = Vec::new();
        // The list only decorates the message: a refs directory too large to list just lists less.
        let _ = walk(&refs_dir, &mut |rel, file_type| {
            if !file_type.is_dir() {
                refs.push(rel.to_owned());
            }
        });
        refs.sort();
        HubError::new(HubErrorKind::UnknownRevision { revision: revision.to_owned(), refs })
    }

    /// Checks a safetensors snapshot: `config.json`, `tokenizer.json`, and `model.safetensors` or the
    /// index with every shard it names.
    fn safetensors(&self, snapshot: &Path) -> Result<(), HubError> {
        // What is missing, as named to the user, and as the path that would be there.
        let mut missing: Vec<String> = Vec::new();
        let mut missing_paths: Vec<PathBuf> = Vec::new();
        for name in ["config.json", "tokenizer.json"] {
            if self.check_file(&snapshot.join(name))? == Presence::Missing {
                missing.push(name.to_owned());
                missing_paths.push(snapshot.join(name));
            }
        }
        if self.check_file(&snapshot.join("model.safetensors"))? == Presence::Missing {
            let index = snapshot.join("model.safetensors.index.json");
            match self.check_file(&index)? {
                Presence::Missing => {
                    missing.push("model.safetensors (or model.safetensors.index.json and its shards)".to_owned());
                    missing_paths.push(snapshot.join("model.safetensors"));
                }
                Presence::Present => {
                    for shard in read_index(&index)? {
                        let path = shard.split('/').fold(snapshot.to_path_buf(), |p, c| p.join(c));
                        if self.check_file(&path)? == Presence::Missing {
                            missing.push(shard);
                            missing_paths.push(path);
                        }
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let partial = self.partial_downloads();
        if partial.is_empty() {
            Err(HubError::new(HubErrorKind::MissingFiles { dir: snapshot.to_path_buf(), files: missing }))
        } else {
            Err(HubError::new(HubErrorKind::Incomplete { files: missing_paths, partial }))
        }
    }

    /// Picks the one model `.gguf` file of a snapshot, by `quant` when given.
    fn gguf(&self, snapshot: &Path, quant: Option<&str>) -> Result<PathBuf, HubError> {
        let mut found = Vec::new();
        let mut models: Vec<String> = Vec::new();
        walk(snapshot, &mut |rel, file_type| {
            if file_type.is_dir() {
                return;
            }
            let name = rel.rsplit('/').next().unwrap_or(rel);
            if gguf_name::is_gguf(name) && gguf_name::is_model(name) {
                models.push(rel.to_owned());
            }
            found.push(rel.to_owned());
        })?;
        models.sort();
        found.sort();
        // One candidate per model: a file on its own, or all the parts of a split model.
        let mut candidates: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
        for rel in &models {
            let name = rel.rsplit('/').next().unwrap_or(rel);
            if quant.is_some_and(|q| !gguf_name::has_quant(name, q)) {
                continue;
            }
            let key = match gguf_name::split_of(rel) {
                Some((prefix, count)) => (prefix.to_ascii_lowercase(), count),
                None => (rel.clone(), 0),
            };
            candidates.entry(key).or_default().push(rel.clone());
        }
        if candidates.len() > 1 {
            let mut candidates: Vec<String> = candidates.into_values().flatten().collect();
            candidates.sort();
            return Err(HubError::new(HubErrorKind::AmbiguousGguf { quant: quant.map(str::to_owned), candidates }));
        }
        let Some(((_, parts), files)) = candidates.pop_first() else {
            let partial = self.partial_downloads();
            return Err(HubError::new(match quant {
                Some(q) => HubErrorKind::QuantNoMatch { quant: q.to_owned(), available: models, partial },
                None => HubErrorKind::NoModelFiles { dir: snapshot.to_path_buf(), found, partial },
            }));
        };
        if parts > 0 {
            return Err(HubError::new(HubErrorKind::SplitGguf { files }));
        }
        let file = files[0].split('/').fold(snapshot.to_path_buf(), |p, c| p.join(c));
        match self.check_file(&file)? {
            Presence::Present => Ok(file),
            // Listed a moment ago, gone now: say so as a missing file.
            Presence::Missing => Err(HubError::new(HubErrorKind::MissingFiles {
                dir: snapshot.to_path_buf(),
                files: vec![files[0].clone()],
            })),
        }
    }

    /// Checks a directory the resolution needs (a snapshot): there, inside the repo, and a directory.
    fn check_dir(&self, path: &Path) -> Result<Presence, HubError> {
        self.check_entry(path, "a directory", Path::is_dir, |dangling| {
            // A dangling symlink to a directory: as good as missing, once it is known to stay inside.
            self.dangling_target(dangling.path)?;
            Ok(Presence::Missing)
        })
    }

    /// Checks a file the model needs: missing, or a regular file inside the repo (directly or through
    /// symlinks). A symlink to a missing blob is an error naming both, or saying the download is incomplete
    /// when the blob's `.incomplete` partner is there.
    fn check_file(&self, path: &Path) -> Result<Presence, HubError> {
        self.check_entry(path, "a regular file", Path::is_file, |dangling| {
            let blob = self.dangling_target(path)?;
            let mut partial = blob.clone().into_os_string();
            partial.push(".incomplete");
            let partial = PathBuf::from(partial);
            if exists_entry(&partial).map_err(|e| HubError::io(&partial, e))? {
                return Err(HubError::new(HubErrorKind::Incomplete {
                    files: vec![path.to_path_buf()],
                    partial: vec![partial],
                }));
            }
            Err(HubError::new(HubErrorKind::DanglingSymlink { file: path.to_path_buf(), blob })
                .with_source(dangling.error))
        })
    }

    /// The steps `check_dir` and `check_file` share: an absent entry is missing; a present one must
    /// resolve inside the repo to `expected` (`is_kind`); a symlink whose target is gone is `on_dangling`'s
    /// to judge.
    fn check_entry(
        &self,
        path: &Path,
        expected: &'static str,
        is_kind: fn(&Path) -> bool,
        on_dangling: impl FnOnce(Dangling<'_>) -> Result<Presence, HubError>,
    ) -> Result<Presence, HubError> {
        match fs::symlink_metadata(path) {
            Err(e) if is_missing(&e) => return Ok(Presence::Missing),
            Err(e) => return Err(HubError::io(path, e)),
            Ok(_) => {}
        }
        let real = match fs::canonicalize(path) {
            Ok(real) => real,
            Err(e) if is_missing(&e) => return on_dangling(Dangling { path, error: e }),
            Err(e) => return Err(HubError::io(path, e)),
        };
        self.inside(path, &real)?;
        if !is_kind(&real) {
            return Err(HubError::new(HubErrorKind::WrongType { path: path.to_path_buf(), expected }));
        }
        Ok(Presence::Present)
    }

    /// Checks that an existing path (a refs file) resolves inside the repo.
    fn contain(&self, path: &Path) -> Result<(), HubError> {
        let real = fs::canonicalize(path).map_err(|e| HubError::io(path, e))?;
        self.inside(path, &real)
    }

    fn inside(&self, link: &Path, real: &Path) -> Result<(), HubError> {
        if real.starts_with(&self.canonical) {
            return Ok(());
        }
        Err(HubError::new(HubErrorKind::SymlinkEscapes {
            link: link.to_path_buf(),
            target: real.to_path_buf(),
            repo_dir: self.dir.clone(),
        }))
    }

    /// Where a dangling symlink chain ends: the missing path, checked to lie inside the repo. Each hop is
    /// resolved from its link's canonical directory, and canonicalized as far as its own directory exists.
    fn dangling_target(&self, link: &Path) -> Result<PathBuf, HubError> {
        let mut at = link.to_path_buf();
        for _ in 0..MAX_HOPS {
            let target = fs::read_link(&at).map_err(|e| HubError::io(&at, e))?;
            let parent = at.parent().unwrap_or(Path::new("."));
            let parent = fs::canonicalize(parent).map_err(|e| HubError::io(parent, e))?;
            let joined = parent.join(target);
            let next = match (joined.parent(), joined.file_name()) {
                (Some(dir), Some(name)) => match fs::canonicalize(dir) {
                    Ok(dir) => dir.join(name),
                    Err(_) => normalize(&joined),
                },
                _ => normalize(&joined),
            };
            if !next.starts_with(&self.canonical) {
                return Err(self.escapes(link, &next));
            }
            match fs::symlink_metadata(&next) {
                Ok(m) if m.file_type().is_symlink() => at = next,
                _ => return Ok(next),
            }
        }
        Err(HubError::io(link, io::Error::other("too many levels of symbolic links")))
    }

    fn escapes(&self, link: &Path, target: &Path) -> HubError {
        HubError::new(HubErrorKind::SymlinkEscapes {
            link: link.to_path_buf(),
            target: target.to_path_buf(),
            repo_dir: self.dir.clone(),
        })
    }

    /// The partial downloads in `blobs/` (`<sha>.incomplete`), sorted; an unreadable or huge `blobs/`
    /// yields what could be listed (this only adds a hint to a message).
    fn partial_downloads(&self) -> Vec<PathBuf> {
        let blobs = self.dir.join("blobs");
        let Ok(entries) = fs::read_dir(&blobs) else { return Vec::new() };
        let mut partial: Vec<PathBuf> = entries
            .take(MAX_DIR_ENTRIES)
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
            .map(|e| e.path())
            .collect();
        partial.sort();
        partial
    }
}

/// The shard files a `model.safetensors.index.json` names, each a relative path of plain components.
fn read_index(path: &Path) -> Result<BTreeSet<String>, HubError> {
    let bad = |reason: String| HubError::new(HubErrorKind::BadIndex { path: path.to_path_buf(), reason });
    let bytes = int4_files::read_capped(path, MAX_INDEX_BYTES).map_err(|e| bad(e.kind().to_string()).with_source(e))?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("is not valid JSON: {e}")).with_source(e))?;
    let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(bad("has no `weight_map` object".into()));
    };
    let mut shards = BTreeSet::new();
    for (tensor, file) in map {
        let Some(file) = file.as_str() else {
            return Err(bad(format!("weight_map[{tensor:?}] is not a file name")));
        };
        let plain = !file.is_empty()
            && !file.contains('\\')
            && Path::new(file).components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(bad(format!("weight_map[{tensor:?}] = {file:?} is not a plain relative file name")));
        }
        shards.insert(file.to_owned());
    }
    if shards.is_empty() {
        return Err(bad("names no shard files".into()));
    }
    Ok(shards)
}

/// Visits every entry below `dir` (not following symlinks, at most [`MAX_DEPTH`] levels down), passing its
/// path relative to `dir` with `/` separators; more than [`MAX_DIR_ENTRIES`] entries is an error. A missing
/// `dir` has no entries.
fn walk(dir: &Path, visit: &mut dyn FnMut(&str, fs::FileType)) -> Result<(), HubError> {
    let mut fuel = MAX_DIR_ENTRIES;
    let mut stack = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((at, prefix, depth)) = stack.pop() {
        let entries = match fs::read_dir(&at) {
            Ok(entries) => entries,
            Err(e) if depth == 0 && is_missing(&e) => return Ok(()),
            Err(e) => return Err(HubError::io(&at, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| HubError::io(&at, e))?;
            if fuel == 0 {
                return Err(HubError::new(HubErrorKind::TooManyEntries {
                    dir: dir.to_path_buf(),
                    limit: MAX_DIR_ENTRIES,
                }));
            }
            fuel -= 1;
            let file_type = entry.file_type().map_err(|e| HubError::io(&entry.path(), e))?;
            let rel = format!("{prefix}{}", entry.file_name().to_string_lossy());
            visit(&rel, file_type);
            if file_type.is_dir() && depth < MAX_DEPTH {
                stack.push((entry.path(), format!("{rel}/"), depth + 1));
            }
        }
    }
    Ok(())
}

/// `path` with `.` dropped and each `..` taking away the component before it, without touching the disk.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether an entry (even a dangling symlink) is at `path`.
fn exists_entry(path: &Path) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if is_missing(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether an I/O error means "nothing there": not found, or a path through a non-directory.
fn is_missing(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}
