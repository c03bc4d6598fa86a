//! Model references, `org/name[@revision][:QUANT]`, parsed and validated before any of their text becomes
//! part of a path.
//!
//! * **Repo ids** follow huggingface_hub's `validate_repo_id`, restricted to ASCII: an organisation and a
//!   name, each 1 to 96 characters of `[A-Za-z0-9._-]` beginning and ending with a letter, digit or `_`,
//!   joined by exactly one `/`; no `--` (the cache folder `models--{org}--{name}` must map back to one id),
//!   no `..`, no `.git` ending. So an id is never `.` or `..` and never holds a separator: the folder it
//!   names is always a child of the cache root.
//! * **Revisions** are what git accepts as a ref name (`main`, `v1.0`, `refs/pr/1`) or a commit hash, and
//!   are looked up as `refs/<revision>` under the repo's folder, so no component may be empty, `.`, `..` or
//!   start with `.`, and no character may be a control character, a space, or one of ``~^:?*[\``.
//! * **Quants** (`Q4_0`, `q8_0`, `Q4_K_M`, `UD-Q4_K_XL`) are 1 to 64 characters of `[A-Za-z0-9._-]`; they
//!   are only ever compared with file names, never joined to a path.

use std::fmt;
use std::str::FromStr;

use crate::error::{HubError, HubErrorKind};

/// The revision a reference without `@revision` means.
pub const DEFAULT_REVISION: &str = "main";

/// The longest organisation or repo name huggingface_hub accepts.
const MAX_NAME: usize = 96;
/// The longest revision accepted (git's own limit on a ref's file name is the file system's, 255).
const MAX_REVISION: usize = 255;
/// The longest quant accepted.
const MAX_QUANT: usize = 64;

/// A validated Hugging Face repo id, `org/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoId {
    org: String,
    name: String,
}

impl RepoId {
    /// Parses and validates `org/name` (see the module docs for the rules).
    pub fn parse(id: &str) -> Result<Self, HubError> {
        let invalid = |reason: String| {
            HubError::new(HubErrorKind::InvalidReference { input: id.to_owned(), reason: format!("repo id {reason}") })
        };
        let mut parts = id.split('/');
        let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(invalid(format!(
                "`{id}` must be an organisation and a name joined by exactly one `/`, such as \
                 HuggingFaceTB/SmolLM2-135M-Instruct"
            )));
        };
        if id.contains("--") || id.contains("..") {
            return Err(invalid(format!("`{id}` may not contain `--` or `..`")));
        }
        if id.ends_with(".git") {
            return Err(invalid(format!("`{id}` may not end with `.git`")));
        }
        for (what, part) in [("organisation", org), ("name", name)] {
            if part.is_empty() || part.len() > MAX_NAME {
                return Err(invalid(format!("{what} `{part}` must be 1 to {MAX_NAME} characters long")));
            }
            if let Some(c) = part.chars().find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
                return Err(invalid(format!(
                    "{what} `{part}` has {c:?}; only letters, digits, `.`, `_` and `-` are allowed"
                )));
            }
            let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
            if !word(part.as_bytes()[0]) || !word(part.as_bytes()[part.len() - 1]) {
                return Err(invalid(format!("{what} `{part}` must begin and end with a letter, digit or `_`")));
            }
        }
        Ok(RepoId { org: org.to_owned(), name: name.to_owned() })
    }

    /// The organisation (or user).
    pub fn org(&self) -> &str {
        &self.org
    }

    /// The repo's name within its organisation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The repo's folder in the hub cache, `models--{org}--{name}`.
    pub fn folder_name(&self) -> String {
        format!("models--{}--{}", self.org, self.name)
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.org, self.name)
    }
}

impl FromStr for RepoId {
    type Err = HubError;

    fn from_str(s: &str) -> Result<Self, HubError> {
        RepoId::parse(s)
    }
}

/// A model reference, `org/name[@revision][:QUANT]`: a repo, the revision to take (default `main`) and,
/// for a GGUF repo, the quant that picks one `.gguf` file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelRef {
    repo: RepoId,
    revision: Option<String>,
    quant: Option<String>,
}

impl ModelRef {
    /// Parses `org/name`, `org/name@revision`, `org/name:QUANT` or `org/name@revision:QUANT`.
    ///
    /// The first `:` starts the quant (neither a repo id nor a git ref may hold one), and the first `@`
    /// before it starts the revision.
    pub fn parse(text: &str) -> Result<Self, HubError> {
        let invalid = |reason: String| HubError::new(HubErrorKind::InvalidReference { input: text.to_owned(), reason });
        let (head, quant) = match text.split_once(':') {
            Some((head, quant)) => (head, Some(quant)),
            None => (text, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision)),
            None => (head, None),
        };
        let repo = RepoId::parse(repo).map_err(|e| match e.kind() {
            HubErrorKind::InvalidReference { reason, .. } => invalid(reason.clone()),
            _ => e,
        })?;
        if let Some(revision) = revision {
            check_revision(revision).map_err(|r| invalid(format!("revision `{revision}` {r}")))?;
        }
        if let Some(quant) = quant {
            check_quant(quant).map_err(|r| invalid(format!("quant `{quant}` {r}")))?;
        }
        Ok(ModelRef { repo, revision: revision.map(str::to_owned), quant: quant.map(str::to_owned) })
    }

    /// A reference to `repo` at its default revision, with no quant.
    pub fn new(repo: RepoId) -> Self {
        ModelRef { repo, revision: None, quant: None }
    }

    /// The repo.
    pub fn repo(&self) -> &RepoId {
        &self.repo
    }

    /// The revision: the one given, else [`DEFAULT_REVISION`].
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// The quant given after `:`, if any.
    pub fn quant(&self) -> Option<&str> {
        self.quant.as_deref()
    }

    /// The command that downloads what this reference names into the hub cache, for messages:
    /// `hf download org/name [--revision R] [--include "*QUANT*.gguf"]`.
    pub fn fetch_command(&self) -> String {
        let mut cmd = format!("hf download {}", self.repo);
        if let Some(r) = &self.revision {
            cmd.push_str(&format!(" --revision {r}"));
        }
        if let Some(q) = &self.quant {
            cmd.push_str(&format!(" --include \"*{q}*.gguf\""));
        }
        cmd
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.repo)?;
        if let Some(r) = &self.revision {
            write!(f, "@{r}")?;
        }
        if let Some(q) = &self.quant {
            write!(f, ":{q}")?;
        }
        Ok(())
    }
}

impl FromStr for ModelRef {
    type Err = HubError;

    fn from_str(s: &str) -> Result<Self, HubError> {
        ModelRef::parse(s)
    }
}

/// Whether `s` is a full commit hash as huggingface_hub writes them: 40 lowercase hexadecimal digits.
pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Git's ref-name rules, as far as they keep a revision a relative path below `refs/`.
fn check_revision(r: &str) -> Result<(), String> {
    if r.is_empty() || r.len() > MAX_REVISION {
        return Err(format!("must be 1 to {MAX_REVISION} characters long"));
    }
    if let Some(c) = r.chars().find(|&c| c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\'))
    {
        return Err(format!("may not contain {c:?}"));
    }
    if r.contains("..") || r.contains("@{") {
        return Err("may not contain `..` or `@{`".into());
    }
    if r.ends_with(".lock") || r.ends_with('.') {
        return Err("may not end with `.lock` or `.`".into());
    }
    if r.split('/').any(|c| c.is_empty() || c.starts_with('.')) {
        return Err("may not have an empty part or a part beginning with `.`".into());
    }
    Ok(())
}

fn check_quant(q: &str) -> Result<(), String> {
    if q.is_empty() || q.len() > MAX_QUANT {
        return Err(format!("must be 1 to {MAX_QUANT} characters long"));
    }
    if let Some(c) = q.chars().find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("has {c:?}; only letters, digits, `.`, `_` and `-` are allowed (such as Q4_0 or Q4_K_M)"));
    }
    Ok(())
}
