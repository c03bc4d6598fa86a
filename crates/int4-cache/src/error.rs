//! The cache's error type.

use std::fmt;
use std::path::PathBuf;

/// Something the cache could not do, with the file or key it concerns.
#[derive(Debug)]
pub struct CacheError {
    kind: CacheErrorKind,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheErrorKind {
    /// A `quantization_config` value this project cannot honour.
    BadConfig(String),
    /// An environment variable the cache reads holds a value it cannot use (the message names it).
    BadEnvironment(String),
    /// An I/O failure on a path.
    Io {
        /// The path.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A file the store reads (an artifact, its source index) is missing, not a regular file, unreadable
    /// or over its size cap.
    File(int4_files::FileError),
    /// Another process held a lock on an artifact for longer than the store waits.
    Locked {
        /// The artifact file.
        path: PathBuf,
        /// How long the store waited.
        waited: std::time::Duration,
    },
    /// An artifact whose JSON header does not parse as one.
    BadHeader {
        /// The artifact file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// An artifact whose bytes do not match what its header promises.
    Corrupt {
        /// The artifact file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl CacheError {
    pub(crate) fn new(kind: CacheErrorKind) -> Self {
        CacheError { kind }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CacheError::new(CacheErrorKind::Io { path: path.into(), source })
    }

    pub(crate) fn config(msg: impl Into<String>) -> Self {
        CacheError::new(CacheErrorKind::BadConfig(msg.into()))
    }

    /// What went wrong.
    pub fn kind(&self) -> &CacheErrorKind {
        &self.kind
    }
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            CacheErrorKind::BadConfig(m) => write!(f, "quantization_config: {m}"),
            CacheErrorKind::BadEnvironment(m) => f.write_str(m),
            CacheErrorKind::Io { path, source } => write!(f, "{}: {source}", path.display()),
            CacheErrorKind::File(e) => write!(f, "{e}"),
            CacheErrorKind::Locked { path, waited } => {
                write!(f, "{}: locked by another process for more than {} s", path.display(), waited.as_secs_f32())
            }
            CacheErrorKind::BadHeader { path, source } => {
                write!(f, "{}: header is not valid: {source}", path.display())
            }
            CacheErrorKind::Corrupt { path, reason } => write!(f, "{}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for CacheError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            CacheErrorKind::Io { source, .. } => Some(source),
            CacheErrorKind::BadHeader { source, .. } => Some(source),
            CacheErrorKind::File(e) => Some(e),
            CacheErrorKind::BadConfig(_)
            | CacheErrorKind::BadEnvironment(_)
            | CacheErrorKind::Corrupt { .. }
            | CacheErrorKind::Locked { .. } => None,
        }
    }
}
