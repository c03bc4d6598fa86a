//! Artifact keys: a canonical, versioned encoding of everything that shapes a packed artifact, and its
//! blake3.
//!
//! The key is the hash of the *whole* serialisation of [`ArtifactKey`] (serde into a JSON value, whose maps
//! are sorted, then compact text), so a field added to the struct is hashed without anyone remembering to;
//! the tests also destructure it without `..`, so adding a field fails to compile until the tests cover it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::CacheError;
use crate::quant_config::NormalizedConfig;

/// Version of the key encoding itself. 2: load options ([`ArtifactKey::options`]).
pub const KEY_FORMAT_VERSION: u32 = 2;

/// Version of the packed layouts an artifact holds (bumped whenever any layout's bytes or the set of
/// sections change). 2: W4A16 layers store their parameters in lane order (`lane_params`), read in place.
/// 3: W4A8 layers quantized at load hold float zeros as a `w4a8_offsets` section. 4: W4A8 scales, zero
/// points and offsets in block order (`[N/16][G][16]`, beside their codes).
pub const LAYOUT_FORMAT_VERSION: u32 = 4;

/// One source file's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// File name within the checkpoint directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// blake3 of the contents, hex.
    pub blake3: String,
}

/// The identity of a source checkpoint: the content hash of each of its tensor files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceIdentity {
    /// Files, sorted by name.
    pub files: Vec<SourceFile>,
}

impl SourceIdentity {
    /// Hashes `paths`. With `index` (a JSON file mapping path → size, mtime and hash), a file whose size
    /// and mtime are unchanged reuses its recorded hash instead of being read again; the index is updated.
    pub fn of_files(paths: &[PathBuf], index: Option<&Path>) -> Result<Self, CacheError> {
        let mut known: BTreeMap<String, (u64, u128, String)> = index
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let mut files = Vec::new();
        for p in paths {
            let meta = std::fs::metadata(p).map_err(|e| CacheError::io(p, e))?;
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()).to_string_lossy().to_string();
            let hash = match known.get(&abs) {
                Some((size, m, h)) if *size == meta.len() && *m == mtime && mtime != 0 => h.clone(),
                _ => {
                    let h = hash_file(p)?;
                    known.insert(abs, (meta.len(), mtime, h.clone()));
                    h
                }
            };
            let name = p.file_name().map_or_else(String::new, |n| n.to_string_lossy().to_string());
            files.push(SourceFile { name, size: meta.len(), blake3: hash });
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(index) = index
            && let Ok(text) = serde_json::to_string(&known)
        {
            // Best effort: an index that cannot be written only costs a rehash next time.
            let _ = std::fs::write(index, text);
        }
        Ok(SourceIdentity { files })
    }
}

/// blake3 of a file's contents, hex (memory-mapped and hashed on every core).
pub fn hash_file(path: &Path) -> Result<String, CacheError> {
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(path).map_err(|e| CacheError::io(path, e))?;
    Ok(h.finalize().to_hex().to_string())
}

/// The decisions of a plan that shape an artifact: everything in [`int4_select::Plan`] except the list of
/// rejected paths (its wording describes the machine, not the artifact).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanDecision {
    /// The rung taken (serialised as its name).
    pub path: int4_select::policy::Rung,
    /// Decode kernel.
    pub decode: int4_select::policy::KernelPlan,
    /// Prefill kernel.
    pub prefill: int4_select::policy::KernelPlan,
    /// The packed layout.
    pub layout: int4_select::policy::PackedLayout,
    /// Rows at or above which prefill runs.
    pub dequant_threshold: usize,
    /// Whether prefill dequantizes from the packed layout.
    pub direct_dequant: bool,
}

impl From<&int4_select::Plan> for PlanDecision {
    fn from(p: &int4_select::Plan) -> Self {
        // No `..`: a field added to `Plan` must be placed here (in the key, or explicitly out of it).
        let int4_select::Plan { path, decode, prefill, layout, dequant_threshold, direct_dequant, rejected: _ } =
            p.clone();
        PlanDecision { path, decode, prefill, layout, dequant_threshold, direct_dequant }
    }
}

/// Everything that shapes a packed artifact.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArtifactKey {
    /// [`KEY_FORMAT_VERSION`].
    pub key_format: u32,
    /// This crate's version (a new release may pack differently).
    pub crate_version: String,
    /// [`LAYOUT_FORMAT_VERSION`].
    pub layout_version: u32,
    /// The normalised `quantization_config`.
    pub quantization: NormalizedConfig,
    /// The plan from int4-select (kernels, layout, `direct_dequant`, `dequant_threshold`, ...).
    pub plan: PlanDecision,
    /// The CPU features the artifact's layout depends on, sorted.
    pub cpu_features: Vec<String>,
    /// Load options outside the plan and the quantization config that change the packed bytes (such as
    /// an 8-bit head), by name.
    pub options: std::collections::BTreeMap<String, serde_json::Value>,
    /// The source checkpoint.
    pub source: SourceIdentity,
}

impl ArtifactKey {
    /// A key for the current crate and layout versions.
    pub fn new(
        quantization: NormalizedConfig,
        plan: &int4_select::Plan,
        mut cpu_features: Vec<String>,
        source: SourceIdentity,
    ) -> Self {
        cpu_features.sort();
        cpu_features.dedup();
        ArtifactKey {
            key_format: KEY_FORMAT_VERSION,
            crate_version: env!("CARGO_PKG_VERSION").to_string(),
            layout_version: LAYOUT_FORMAT_VERSION,
            quantization,
            plan: PlanDecision::from(plan),
            cpu_features,
            options: Default::default(),
            source,
        }
    }

    /// The key with load option `name` set to `value`.
    pub fn with_option(mut self, name: &str, value: serde_json::Value) -> Self {
        self.options.insert(name.to_string(), value);
        self
    }

    /// The canonical encoding: compact JSON of the whole struct with every map's keys sorted.
    pub fn canonical(&self) -> String {
        let v = serde_json::to_value(self).expect("an artifact key always serialises");
        serde_json::to_string(&v).expect("a JSON value always serialises")
    }

    /// blake3 of the canonical encoding, hex: the artifact's file name.
    pub fn hash(&self) -> String {
        blake3::hash(self.canonical().as_bytes()).to_hex().to_string()
    }
}
