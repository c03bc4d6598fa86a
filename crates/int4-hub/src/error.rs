//! The crate's error type: what went wrong, the reference it concerns, and the command that would fetch
//! what is missing, so that every message says what to do next.

use std::fmt;
use std::path::{Path, PathBuf};

/// The most list items a message shows before it says how many more there are.
const SHOWN: usize = 20;

/// Why a model reference could not be resolved.
#[derive(Debug)]
pub struct HubError(Box<Inner>);

/// The error's parts, boxed so that a `Result` carrying one stays small.
#[derive(Debug)]
struct Inner {
    reference: Option<String>,
    fetch: Option<String>,
    kind: HubErrorKind,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum HubErrorKind {
    /// None of `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME` and `HOME` is set.
    NoCacheDir,
    /// The text is not a model reference `org/name[@revision][:QUANT]`.
    InvalidReference {
        /// The text as given.
        input: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A command-line argument is no existing path, and cannot be (or is not) a repo id either.
    NoSuchPath {
        /// The argument as given.
        path: PathBuf,
        /// Why it is not a repo id, when it was tried as one; `None` when it can only be a path (it starts
        /// with `.`, `/` or `~`, or has more than one `/` before any `@`).
        not_a_repo: Option<String>,
    },
    /// The repo has no directory in the cache.
    NotCached {
        /// The directory looked for, `<cache>/models--{org}--{name}`.
        repo_dir: PathBuf,
    },
    /// The revision is neither a cached ref (branch or tag) nor a cached commit.
    UnknownRevision {
        /// The revision asked for.
        revision: String,
        /// The refs the cache has for this repo (`main`, `refs/pr/1`, …), sorted.
        refs: Vec<String>,
    },
    /// A ref names a commit whose snapshot directory is missing.
    SnapshotMissing {
        /// The revision asked for.
        revision: String,
        /// The commit its ref holds.
        commit: String,
        /// The missing snapshot directory.
        dir: PathBuf,
    },
    /// A refs file is not a regular file of at most 1 KiB holding a 40-character hexadecimal commit.
    BadRef {
        /// The refs file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A symlink in the repo's directory leads outside it; it is never followed.
    SymlinkEscapes {
        /// The symlink.
        link: PathBuf,
        /// Where it leads.
        target: PathBuf,
        /// The repo's directory it must stay inside.
        repo_dir: PathBuf,
    },
    /// A file the model needs is a symlink to a blob that is not there.
    DanglingSymlink {
        /// The file in the snapshot.
        file: PathBuf,
        /// The missing blob.
        blob: PathBuf,
    },
    /// Files the model needs are still downloading, or their download was interrupted.
    Incomplete {
        /// The files in the snapshot that are missing or point at unfinished blobs.
        files: Vec<PathBuf>,
        /// The partial downloads, `blobs/<sha>.incomplete`.
        partial: Vec<PathBuf>,
    },
    /// Files a safetensors model needs are not in the snapshot.
    MissingFiles {
        /// The snapshot directory.
        dir: PathBuf,
        /// The missing files, relative to the snapshot.
        files: Vec<String>,
    },
    /// A path is a directory where a file belongs, or the other way round, or neither.
    WrongType {
        /// The path.
        path: PathBuf,
        /// What it should be ("a regular file", "a directory").
        expected: &'static str,
    },
    /// A `model.safetensors.index.json` that does not parse or names an unsafe shard path.
    BadIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A snapshot with neither `config.json` nor a model `.gguf` file (and no `:QUANT` asked for).
    NoModelFiles {
        /// The snapshot directory.
        dir: PathBuf,
        /// What it holds, relative to the snapshot, sorted.
        found: Vec<String>,
        /// Partial downloads in the repo's `blobs/`, if any.
        partial: Vec<PathBuf>,
    },
    /// Several GGUF models fit: none asked for, or the quant matches more than one.
    AmbiguousGguf {
        /// The quant asked for, if any.
        quant: Option<String>,
        /// The candidate files, relative to the snapshot, sorted.
        candidates: Vec<String>,
    },
    /// No GGUF model file's name has the quant as a whole token.
    QuantNoMatch {
        /// The quant asked for.
        quant: String,
        /// The model `.gguf` files there are, relative to the snapshot, sorted.
        available: Vec<String>,
        /// Partial downloads in the repo's `blobs/`, if any.
        partial: Vec<PathBuf>,
    },
    /// The chosen GGUF model is split into several files, which int4 does not read yet.
    SplitGguf {
        /// The parts, relative to the snapshot, sorted.
        files: Vec<String>,
    },
    /// A directory has more entries than a listing may visit.
    TooManyEntries {
        /// The directory.
        dir: PathBuf,
        /// The most entries a listing visits.
        limit: usize,
    },
    /// The operating system refused (the error is the [`source`](std::error::Error::source)).
    Io {
        /// The path concerned.
        path: PathBuf,
    },
}

impl HubError {
    pub(crate) fn new(kind: HubErrorKind) -> Self {
        HubError(Box::new(Inner { reference: None, fetch: None, kind, source: None }))
    }

    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        HubError::new(HubErrorKind::Io { path: path.to_path_buf() }).with_source(source)
    }

    pub(crate) fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.0.source = Some(Box::new(source));
        self
    }

    /// Names the reference and the fetch command, unless an inner step already did.
    pub(crate) fn about(mut self, reference: &str, fetch: Option<String>) -> Self {
        let inner = &mut *self.0;
        if inner.reference.is_none() {
            inner.reference = Some(reference.to_owned());
        }
        if inner.fetch.is_none() && inner.kind.wants_fetch() {
            inner.fetch = fetch;
        }
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> &HubErrorKind {
        &self.0.kind
    }

    /// The model reference concerned (`org/name@revision:QUANT` as given), when there is one.
    pub fn reference(&self) -> Option<&str> {
        self.0.reference.as_deref()
    }

    /// The `hf download …` command that would fetch what is missing, when something is missing.
    pub fn fetch_command(&self) -> Option<&str> {
        self.0.fetch.as_deref()
    }
}

impl HubErrorKind {
    /// Whether fetching the repo would cure this.
    fn wants_fetch(&self) -> bool {
        matches!(
            self,
            HubErrorKind::NotCached { .. }
                | HubErrorKind::UnknownRevision { .. }
                | HubErrorKind::SnapshotMissing { .. }
                | HubErrorKind::DanglingSymlink { .. }
                | HubErrorKind::Incomplete { .. }
                | HubErrorKind::MissingFiles { .. }
                | HubErrorKind::NoModelFiles { .. }
                | HubErrorKind::QuantNoMatch { .. }
        )
    }
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.0;
        if let Some(r) = &inner.reference {
            write!(f, "{r}: ")?;
        }
        fmt_kind(&inner.kind, inner.source.as_deref(), f)?;
        if let Some(cmd) = &inner.fetch {
            let old = cmd.replacen("hf download", "huggingface-cli download", 1);
            write!(f, "; int4 never downloads: fetch it with `{cmd}` (`{old}` with an older huggingface_hub)")?;
            if matches!(inner.kind, HubErrorKind::NotCached { .. }) {
                f.write_str(", or point HF_HUB_CACHE or HF_HOME at the cache that has it")?;
            }
        }
        Ok(())
    }
}

fn fmt_kind(
    kind: &HubErrorKind,
    source: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    const SYNTAX: &str = "org/name[@revision][:QUANT]";
    match kind {
        HubErrorKind::NoCacheDir => f.write_str(
            "no Hugging Face cache directory: set HF_HUB_CACHE (the hub cache itself), HF_HOME (its parent) or HOME",
        ),
        HubErrorKind::InvalidReference { input, reason } => {
            write!(f, "`{input}` is not a Hugging Face model reference ({SYNTAX}): {reason}")
        }
        HubErrorKind::NoSuchPath { path, not_a_repo: None } => {
            write!(f, "{}: no such file or directory", path.display())
        }
        HubErrorKind::NoSuchPath { path, not_a_repo: Some(reason) } => write!(
            f,
            "{}: no such file or directory, and not a Hugging Face repo id ({SYNTAX}) either: {reason}",
            path.display()
        ),
        HubErrorKind::NotCached { repo_dir } => {
            write!(f, "not in the Hugging Face cache (there is no {})", repo_dir.display())
        }
        HubErrorKind::UnknownRevision { revision, refs } => {
            write!(
                f,
                "revision `{revision}` is not cached (no refs file of that name and no snapshot of that commit)"
            )?;
            if refs.is_empty() {
                f.write_str("; no refs are cached")
            } else {
                write!(f, "; cached refs: {}", List(refs))
            }
        }
        HubErrorKind::SnapshotMissing { revision, commit, dir } => write!(
            f,
            "ref `{revision}` names commit {commit}, but its snapshot {} is missing (the cache is damaged)",
            dir.display()
        ),
        HubErrorKind::BadRef { path, reason } => write!(f, "{}: not a usable ref: {reason}", path.display()),
        HubErrorKind::SymlinkEscapes { link, target, repo_dir } => write!(
            f,
            "{} is a symlink to {}, outside the repo's cache directory {}; refusing to follow it",
            link.display(),
            target.display(),
            repo_dir.display()
        ),
        HubErrorKind::DanglingSymlink { file, blob } => write!(
            f,
            "{} points at blob {}, which is missing (the cache is damaged or was partly cleaned)",
            file.display(),
            blob.display()
        ),
        HubErrorKind::Incomplete { files, partial } => write!(
            f,
            "the download is incomplete: {} not there yet, and {} {} a partial download (still running, or \
             interrupted)",
            Paths(files),
            Paths(partial),
            if partial.len() == 1 { "is" } else { "are" }
        ),
        HubErrorKind::MissingFiles { dir, files } => {
            write!(f, "snapshot {} lacks {}, which the model needs", dir.display(), List(files))
        }
        HubErrorKind::WrongType { path, expected } => write!(f, "{} is not {expected}", path.display()),
        HubErrorKind::BadIndex { path, reason } => write!(f, "{}: {reason}", path.display()),
        HubErrorKind::NoModelFiles { dir, found, partial } => {
            write!(
                f,
                "snapshot {} has neither config.json (a safetensors model) nor a model .gguf file",
                dir.display()
            )?;
            if found.is_empty() {
                f.write_str("; it is empty")?
            } else {
                write!(f, "; it holds {}", List(found))?
            }
            partial_note(partial, f)
        }
        HubErrorKind::AmbiguousGguf { quant: None, candidates } => write!(
            f,
            "the repo has several GGUF models; add `:QUANT` to pick one by its quant (such as `:Q4_0`): {}",
            List(candidates)
        ),
        HubErrorKind::AmbiguousGguf { quant: Some(q), candidates } => {
            write!(f, "quant `{q}` matches several GGUF files: {}", List(candidates))
        }
        HubErrorKind::QuantNoMatch { quant, available, partial } => {
            write!(f, "no GGUF file has quant `{quant}` in its name")?;
            if available.is_empty() {
                f.write_str("; the snapshot has no model .gguf files")?
            } else {
                write!(f, "; the GGUF files are {}", List(available))?
            }
            partial_note(partial, f)
        }
        HubErrorKind::SplitGguf { files } => write!(
            f,
            "split GGUF files are not supported yet: {}; merge them into one file with `llama-gguf-split --merge` and \
             pass its path",
            List(files)
        ),
        HubErrorKind::TooManyEntries { dir, limit } => {
            write!(f, "{} has more than {limit} entries; refusing to list it", dir.display())
        }
        HubErrorKind::Io { path } => match source {
            Some(e) => write!(f, "{}: {e}", path.display()),
            None => write!(f, "{}: I/O error", path.display()),
        },
    }
}

fn partial_note(partial: &[PathBuf], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if partial.is_empty() {
        return Ok(());
    }
    write!(f, " (a download is still running or was interrupted: {})", Paths(partial))
}

impl std::error::Error for HubError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A list of names, shortened past [`SHOWN`] items.
struct List<'a>(&'a [String]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(item)?;
        }
        if self.0.len() > SHOWN {
            write!(f, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

/// A list of paths, shortened past [`SHOWN`] items.
struct Paths<'a>(&'a [PathBuf]);

impl fmt::Display for Paths<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.0.iter().map(|p| p.display().to_string()).collect();
        List(&names).fmt(f)
    }
}
