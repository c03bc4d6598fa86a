//! Config-hash keys and the packed-artifact store.
//!
//! Repacking a checkpoint for a device is done once. [`quant_config`] normalises a checkpoint's
//! `quantization_config`; [`key::ArtifactKey`] combines it with the plan from int4-select, the layout and
//! crate versions, the CPU features the artifact depends on and the source checkpoint's content hash, and
//! hashes the whole canonical encoding with blake3; [`store::ArtifactStore`] writes artifacts atomically
//! and memory-maps them on warm loads, checking header, size and key every time, so a wrong artifact is
//! never loaded: it is rebuilt, with a warning. [`sigbus`] reports a mapped artifact truncated by another
//! program instead of dying of a bare signal. [`dirs`] resolves where the cache and the default model
//! live, for every part of the workspace.
//!
//! The unsafe code is the memory maps and `flock` in `store.rs` (artifacts) and `key.rs` (a source file
//! hashed by path), and the `SIGBUS` handler in `sigbus.rs`, each argued.
#![deny(missing_docs)]

pub mod dirs;
pub mod error;
pub mod key;
pub mod quant_config;
pub mod sigbus;
pub mod store;

pub use error::{CacheError, CacheErrorKind};
pub use key::{ArtifactKey, SourceIdentity};
pub use store::{Artifact, ArtifactStore, Lookup, MappedArtifact};
