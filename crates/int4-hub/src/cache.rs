//! Where the hub cache is: huggingface_hub's rule, read through a lookup the caller passes so that tests
//! (and embedders) never touch the process environment.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{HubError, HubErrorKind};
use crate::reference::{ModelRef, RepoId};
use crate::resolve::{self, Resolved};

/// The local Hugging Face hub cache: the directory holding `models--{org}--{name}/` folders.
///
/// A cache may have no root (no variable names one); resolving in it is then a
/// [`HubErrorKind::NoCacheDir`] error, while [`resolve_model_arg`](crate::resolve_model_arg) still accepts
/// local paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubCache {
    root: Option<PathBuf>,
}

impl HubCache {
    /// The cache at `root` exactly (what `HF_HUB_CACHE` would name).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        HubCache { root: Some(root.into()) }
    }

    /// The cache huggingface_hub would use, from the process environment; see [`HubCache::from_env_with`].
    pub fn from_env() -> Self {
        HubCache::from_env_with(|var| std::env::var_os(var))
    }

    /// The cache huggingface_hub would use, reading variables through `lookup`: the first of
    /// `$HF_HUB_CACHE`, `$HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub` and
    /// `$HOME/.cache/huggingface/hub` whose variable is set and not empty (huggingface_hub reads them in
    /// that order). A value beginning with `~/` (or that is `~`) has the `~` replaced by `$HOME`, as
    /// huggingface_hub's `expanduser` does, when `HOME` is set. With none set, the cache has no root.
    pub fn from_env_with(mut lookup: impl FnMut(&str) -> Option<OsString>) -> Self {
        let mut get = |var: &str| lookup(var).filter(|v| !v.is_empty());
        let home = get("HOME");
        let expand = |v: OsString| -> PathBuf {
            let p = PathBuf::from(&v);
            if let (Some(home), Ok(rest)) = (&home, p.strip_prefix("~")) {
                return PathBuf::from(home).join(rest);
            }
            p
        };
        let root = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map(expand)
            .or_else(|| get("HF_HOME").map(|v| expand(v).join("hub")))
            .or_else(|| get("XDG_CACHE_HOME").map(|v| expand(v).join("huggingface").join("hub")))
            .or_else(|| home.clone().map(|h| PathBuf::from(h).join(".cache").join("huggingface").join("hub")));
        HubCache { root }
    }

    /// The cache directory, if any variable named one.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Where `repo` lives in this cache, `<root>/models--{org}--{name}`, whether or not it is there.
    pub fn repo_dir(&self, repo: &RepoId) -> Option<PathBuf> {
        self.root.as_ref().map(|r| r.join(repo.folder_name()))
    }

    /// The files `reference` names in this cache, checked (see the crate docs). Reads only; never touches
    /// the network.
    pub fn resolve(&self, reference: &ModelRef) -> Result<Resolved, HubError> {
        let about = |e: HubError| e.about(&reference.to_string(), Some(reference.fetch_command()));
        let root = self.root.as_deref().ok_or_else(|| about(HubError::new(HubErrorKind::NoCacheDir)))?;
        resolve::resolve(root, reference).map_err(about)
    }
}
