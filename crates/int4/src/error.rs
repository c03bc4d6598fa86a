//! The facade's error type: every failure names the file (or model part) and the problem.

use std::fmt;

/// Why loading or running a model failed.
#[derive(Debug)]
pub struct Error {
    /// What the error is about: a file path, a tensor name, a config key.
    pub context: String,
    /// The problem.
    pub message: String,
}

impl Error {
    /// An error about `context`.
    pub fn new(context: impl Into<String>, message: impl Into<String>) -> Self {
        Error { context: context.into(), message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, self.message)
    }
}

impl std::error::Error for Error {}

/// Shorthand.
pub type Result<T> = std::result::Result<T, Error>;
