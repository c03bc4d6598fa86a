//! Resolving Hugging Face model references — `HuggingFaceTB/SmolLM2-135M-Instruct`,
//! `bartowski/SmolLM2-135M-Instruct-GGUF:Q4_0`, `org/name@v1.0` — to files in the local hub cache, offline.
//!
//! Users name models the way the Hub does, and most already have them in the cache `huggingface_hub`
//! (`hf download`, transformers, llama.cpp) fills. This crate finds them there, and never downloads: int4
//! does no network I/O, so a model that is not cached is an error that names the directory searched and
//! the `hf download` command that would fetch it.
//!
//! # The cache, as huggingface_hub lays it out
//!
//! The root is the first set, non-empty one of `$HF_HUB_CACHE`, `$HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`,
//! `$XDG_CACHE_HOME/huggingface/hub` and `$HOME/.cache/huggingface/hub` ([`HubCache::from_env`]). Below it:
//!
//! ```text
//! models--{org}--{name}/
//!   refs/main                      the commit (40 hex digits) the branch `main` had when downloaded
//!   refs/refs/pr/1                 likewise for the revision `refs/pr/1`
//!   snapshots/<commit>/<files…>    symlinks ../../blobs/<sha> (real files in caches copied from Windows)
//!   blobs/<sha>                    the contents; <sha>.incomplete while a download is in progress
//! ```
//!
//! A reference `org/name[@revision][:QUANT]` ([`ModelRef`]) resolves to the snapshot of `revision` (default
//! `main`; a branch or tag through `refs/`, a full commit hash directly), and then ([`Resolved`]):
//!
//! * without a quant, to the snapshot directory if it has `config.json` (a safetensors model), after
//!   checking that `config.json`, `tokenizer.json` and the weights (`model.safetensors`, or the index and
//!   every shard it names) are there;
//! * otherwise to the one model `.gguf` file whose name holds the quant as a whole token (the rule is in
//!   `gguf_name`: llama.cpp's `-hf repo:QUANT`, made exact), or the only one if no quant is given and
//!   there is just one. Several candidates are an error listing them, never a guess; a split model
//!   (`-00001-of-00003.gguf`) is an error, as int4 reads single files only.
//!
//! # Why so careful
//!
//! Everything read here came from outside: the reference from a command line, the cache from a download
//! or a copy. So a repo id is validated as huggingface_hub validates it before it becomes a folder name
//! (it can never be `..` or hold a separator), and a revision as git validates a ref name; every file read
//! has a size cap (a refs file 1 KiB, a safetensors index 64 MiB) and is opened by `int4_files`, which
//! refuses FIFOs and devices; every directory listing stops after [`MAX_DIR_ENTRIES`] entries; and no
//! symlink is followed out of the repo's folder: each file is canonicalized and must stay below the
//! canonical `models--{org}--{name}/` (which may itself be a symlink, for a cache moved to another disk).
//! A file the model needs that is missing, a dangling symlink, a partial download and an unknown revision
//! are each their own [`HubErrorKind`], with a message that says what to run.
//!
//! # The command line
//!
//! [`resolve_model_arg`] is the rule for a model argument: an existing local path wins, then a repo
//! reference, and an argument that can only be a path (it starts with `.`, `/` or `~`, or has more than one
//! `/` before any `@`) is never looked up in the cache.
#![deny(missing_docs)]

mod cache;
mod error;
mod gguf_name;
mod reference;
mod resolve;

use std::path::{Path, PathBuf};

pub use cache::HubCache;
pub use error::{HubError, HubErrorKind};
pub use reference::{DEFAULT_REVISION, ModelRef, RepoId};
pub use resolve::{MAX_DIR_ENTRIES, MAX_INDEX_BYTES, MAX_REF_BYTES, Resolved};

/// Where a model argument led.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// An existing local path, exactly as given (a model directory or a `.gguf` file; not checked here).
    Local(PathBuf),
    /// A repo reference, resolved in the hub cache.
    Hub {
        /// The reference as parsed.
        reference: ModelRef,
        /// What it resolved to.
        resolved: Resolved,
    },
}

impl ModelSource {
    /// The model directory or file to load.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Local(p) => p,
            ModelSource::Hub { resolved, .. } => resolved.path(),
        }
    }
}

/// Resolves a command-line model argument: an existing local path (anything there, even a dangling
/// symlink, which the loader then reports) is returned as is; else an argument that reads as
/// `org/name[@revision][:QUANT]` is resolved in `cache`; else it is an error saying the path does not exist
/// and, if it could have been one, why it is not a repo id.
///
/// An argument that starts with `.`, `/` or `~`, holds a `\`, or has more than one `/` before any `@` is
/// only ever a path: `./org/name` that does not exist is "no such file", never a cache lookup.
pub fn resolve_model_arg(arg: &str, cache: &HubCache) -> Result<ModelSource, HubError> {
    let path = Path::new(arg);
    if !arg.is_empty() {
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Ok(ModelSource::Local(path.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(HubError::io(path, e)),
            Err(_) => {}
        }
    }
    let no_such = |not_a_repo| HubError::new(HubErrorKind::NoSuchPath { path: path.to_path_buf(), not_a_repo });
    let head = arg.split(['@', ':']).next().unwrap_or(arg);
    if arg.starts_with(['.', '/', '~']) || arg.contains('\\') || head.matches('/').count() > 1 {
        return Err(no_such(None));
    }
    let reference = match ModelRef::parse(arg) {
        Ok(r) => r,
        Err(e) => {
            let reason = match e.kind() {
                HubErrorKind::InvalidReference { reason, .. } => reason.clone(),
                _ => e.to_string(),
            };
            return Err(no_such(Some(reason)));
        }
    };
    let resolved = cache.resolve(&reference)?;
    Ok(ModelSource::Hub { reference, resolved })
}
