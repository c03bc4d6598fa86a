//! Artifact keys: a canonical, versioned encoding of everything that shapes a packed artifact, and its
//! blake3.
//!
//! The key is the hash of the *whole* serialisation of [`ArtifactKey`] (serde into a JSON value, whose maps
//! are sorted, then compact text), so a field added to the struct is hashed without anyone remembering to;
//! the tests also destructure it without `..`, so adding a field fails to compile until the tests cover it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{CacheError, CacheErrorKind};
use crate::quant_config::NormalizedConfig;

/// Version of the key encoding itself. 2: load options ([`ArtifactKey::options`]). 3: what packing
/// reads of the model's configuration ([`ArtifactKey::model`]).
pub const KEY_FORMAT_VERSION: u32 = 3;

/// Version of the packed layouts an artifact holds (bumped whenever any layout's bytes or the set of
/// sections change). 2: W4A16 layers store their parameters in lane order (`lane_params`), read in place.
/// 3: W4A8 layers quantized at load hold float zeros as a `w4a8_offsets` section. 4: W4A8 scales, zero
/// points and offsets in block order (`[N/16][G][16]`, beside their codes). 5: 8-bit layers on W4A16 and the
/// portable path as `w8a16_codes` and `w8a16_scales` sections (a GGUF's Q5_0 and Q8_0 layers, an 8-bit head).
/// 6: W4A8 scale and offset tables in f16 where every value is one exactly (`w4a8_scales_f16`,
/// `w4a8_offsets_f16`, `int8_scales_f16`).
pub const LAYOUT_FORMAT_VERSION: u32 = 6;

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

/// The most bytes read from a source index (`sources.json`: a few hundred bytes per file ever hashed).
pub const SOURCE_INDEX_CAP: u64 = 16 << 20;

/// What a source index records of a file's metadata when it hashes it: as git's index does, enough to
/// tell whether the file could have changed since. The change time cannot be set back by a user (`touch
/// -r`, `cp -p` and `rsync -a` restore the modification time only), and a rewrite in place keeps the
/// inode but moves the change time; a replaced file has another inode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// One file's entry in the source index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    stamp: Stamp,
    /// When the hashing started (ns since the epoch).
    recorded_ns: i128,
    blake3: String,
}

/// The source index file (`sources.json` in the cache directory), by canonical path.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SourceIndex {
    /// 2: device, inode and both times in ns (1, a bare `[size, mtime, hash]` per path, is not read).
    format: u32,
    files: BTreeMap<String, Record>,
}

const SOURCE_INDEX_FORMAT: u32 = 2;

/// One source file as the caller holds it open: its path (the index's key and the name in the identity),
/// the metadata of the descriptor it holds (`fstat`, not a fresh `stat` of the path), and its bytes (the
/// mapping it reads). Hashing what is held, not the path again, means the identity is that of the bytes
/// the caller uses, even if the path is renamed over meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct SourceContent<'a> {
    /// The file's path.
    pub path: &'a Path,
    /// The metadata of the open file.
    pub metadata: &'a std::fs::Metadata,
    /// Its contents.
    pub bytes: &'a [u8],
}

/// How much older than the recording a file's times must be for its recorded hash to be trusted: a
/// filesystem whose timestamps are coarser than the clock (1–2 s on FAT and some network filesystems) can
/// give a write made after the recording a time before it.
pub const RACY_MARGIN_NS: i128 = 2_000_000_000;

impl SourceIdentity {
    /// The identity of `files`. With `index` (the source index file), a file whose recorded device, inode,
    /// size, modification and change times all match, and whose times are older than the moment its
    /// recorded hash was started by [`RACY_MARGIN_NS`] (git's "racy" rule, with room for coarse
    /// timestamps), reuses that hash; any other is hashed from its bytes; the index is updated.
    pub fn of_contents(files: &[SourceContent<'_>], index: Option<&Path>) -> Result<Self, CacheError> {
        let mut known = index.map_or_else(SourceIndex::default, read_index);
        let mut out = Vec::new();
        for f in files {
            let stamp = Stamp::of(f.metadata);
            let abs = std::fs::canonicalize(f.path).unwrap_or_else(|_| f.path.to_path_buf());
            let abs = abs.to_string_lossy().to_string();
            let trusted = known.files.get(&abs).filter(|r| {
                let settled = r.recorded_ns - RACY_MARGIN_NS;
                r.stamp == stamp && stamp.mtime_ns < settled && stamp.ctime_ns < settled
            });
            let hash = match trusted {
                Some(r) => r.blake3.clone(),
                None => {
                    let recorded_ns = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as i128);
                    let h = blake3::Hasher::new().update_rayon(f.bytes).finalize().to_hex().to_string();
                    known.files.insert(abs, Record { stamp, recorded_ns, blake3: h.clone() });
                    h
                }
            };
            let name = f.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().to_string());
            out.push(SourceFile { name, size: f.metadata.len(), blake3: hash });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(index) = index {
            known.format = SOURCE_INDEX_FORMAT;
            write_index(index, &known);
        }
        Ok(SourceIdentity { files: out })
    }

    /// [`SourceIdentity::of_contents`] of the files at `paths`, each opened here (a regular file only) and
    /// mapped.
    pub fn of_files(paths: &[PathBuf], index: Option<&Path>) -> Result<Self, CacheError> {
        let mut held = Vec::new();
        for p in paths {
            let file = int4_files::open_regular(p).map_err(|e| CacheError::new(CacheErrorKind::File(e)))?;
            let metadata = file.metadata().map_err(|e| CacheError::io(p, e))?;
            // SAFETY: a read-only private mapping of a file held open here. A source changed while it is
            // hashed gives the hash of no version of it, and its change time moved, so the next load hashes
            // it again.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| CacheError::io(p, e))?;
            held.push((p.clone(), metadata, map));
        }
        let contents: Vec<SourceContent<'_>> =
            held.iter().map(|(path, metadata, map)| SourceContent { path, metadata, bytes: map }).collect();
        Self::of_contents(&contents, index)
    }
}

/// The source index at `path`; empty when there is none or it cannot be used (a FIFO, too large, another
/// format, not JSON): an unusable index only costs hashing again.
fn read_index(path: &Path) -> SourceIndex {
    int4_files::read_text_capped(path, SOURCE_INDEX_CAP)
        .ok()
        .and_then(|t| serde_json::from_str::<SourceIndex>(&t).ok())
        .filter(|i| i.format == SOURCE_INDEX_FORMAT)
        .unwrap_or_default()
}

/// Writes the index whole, through a temporary of this call's own (created new, never through a link)
/// renamed over it, so a reader never sees half an index. Best effort: an index that cannot be written
/// only costs a rehash next time.
fn write_index(path: &Path, index: &SourceIndex) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Ok(text) = serde_json::to_string(index) else { return };
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("json.{}.{n}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
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
    /// What packing reads of the model's configuration: every linear layer's name, shape and the
    /// checkpoint tensors it stacks (so the vocabulary, the layer shapes and whether the head is tied are
    /// all in the key), and the architecture. `null` until [`ArtifactKey::with_model`] sets it.
    pub model: serde_json::Value,
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
            model: serde_json::Value::Null,
            source,
        }
    }

    /// The key with load option `name` set to `value`.
    pub fn with_option(mut self, name: &str, value: serde_json::Value) -> Self {
        self.options.insert(name.to_string(), value);
        self
    }

    /// The key with what packing reads of the model's configuration ([`ArtifactKey::model`]).
    pub fn with_model(mut self, model: serde_json::Value) -> Self {
        self.model = model;
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
