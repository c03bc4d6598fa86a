//! Where int4 keeps what it makes: the cache root (packed artifacts, converted models) and the default
//! model's directory. The one resolver of both, so that the engine, the command line, `cargo xtask` and
//! the benchmarks agree on every machine.
//!
//! The cache root is the first of `$INT4_CACHE_DIR`, `$XDG_CACHE_HOME/int4` and `$HOME/.cache/int4` whose
//! variable is set and not empty; with none of them there is no cache root, and each caller says what it
//! does instead (the engine packs in memory; `int4 cache` and `cargo xtask fetch-model` stop with an
//! error naming the variables).

use std::path::PathBuf;

use crate::error::{CacheError, CacheErrorKind};

/// The default model's name: its directory under `<cache root>/models/`.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// The cache root (see the module docs), or `None` when no variable names one.
pub fn cache_root() -> Option<PathBuf> {
    non_empty("INT4_CACHE_DIR")
        .or_else(|| non_empty("XDG_CACHE_HOME").map(|p| p.join("int4")))
        .or_else(|| non_empty("HOME").map(|p| p.join(".cache").join("int4")))
}

/// The default model's directory: `$INT4_MODEL_DIR` if set and not empty, else
/// `<cache root>/models/SmolLM2-135M-Instruct`.
pub fn default_model_dir() -> Option<PathBuf> {
    non_empty("INT4_MODEL_DIR").or_else(|| cache_root().map(|c| c.join("models").join(DEFAULT_MODEL_NAME)))
}

/// The cache's size cap, `$INT4_CACHE_MAX_BYTES` in bytes (unset or empty: none). A value that is not a
/// whole number of bytes is an error naming it, never "no cap".
pub fn cache_cap() -> Result<Option<u64>, CacheError> {
    let Some(v) = std::env::var_os("INT4_CACHE_MAX_BYTES").filter(|v| !v.is_empty()) else { return Ok(None) };
    let text = v.to_string_lossy();
    text.trim().parse::<u64>().map(Some).map_err(|_| {
        CacheError::new(CacheErrorKind::BadEnvironment(format!(
            "INT4_CACHE_MAX_BYTES={text:?} is not a size in bytes (a whole number such as 10000000000)"
        )))
    })
}

fn non_empty(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_default_model_lives_under_the_cache_root() {
        // Only checks the shape of the answer: the environment is shared with other tests.
        if let Some(d) = default_model_dir()
            && std::env::var_os("INT4_MODEL_DIR").is_none()
        {
            assert_eq!(Some(d), cache_root().map(|c| c.join("models").join(DEFAULT_MODEL_NAME)));
            assert!(default_model_dir().unwrap().ends_with(Path::new("models").join(DEFAULT_MODEL_NAME)));
        }
    }
}
