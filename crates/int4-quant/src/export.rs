//! `int4 quantize`: turning an unquantized model directory into a 4-bit checkpoint, once, to ship.
//!
//! Why a writer at all: an unquantized checkpoint loaded on a 4-bit path is quantized at every cold load
//! (round to nearest, no search, the head and embedding at the loader's discretion), and the directory
//! stays four to eight times larger than the model needs. An exported checkpoint is quantized once, with
//! scale search, into one of the two formats the runtime reads as they are ([`int4::QuantFormat`]):
//!
//! * **`cpu_int4`**: per linear `<p>`, `<p>.weight_packed` u8 `[N][K/2]` (low nibble = even k),
//!   `<p>.weight_scale` and `<p>.weight_zero` f32 `[N][G]`, on the asymmetric min/max grid with a float zero
//!   (tinygemm's convention, `w = (q − 8)·s + z`). Stored in f32, so the parameters the search chose are
//!   the parameters the kernels use.
//! * **GPTQ**: `<p>.qweight` i32 `[K/8][N]`, `<p>.qzeros` i32 `[G][N/8]`, `<p>.scales` f16 `[G][N]` and
//!   `<p>.g_idx` i32 `[K]` (no act-order: `k / g`). Integer zero points, which the W4A8 kernels take as
//!   they are (float zeros they run as per-group offsets). Symmetric exports are
//!   `checkpoint_format: "gptq"` (v1, which stores zero − 1: every
//!   nibble is 7, read as 8); an upstream tool wrote 8s labelled v1, which a v1 reader takes as 9, and this
//!   writer does not. Asymmetric exports are `"gptq_v2"` (zero stored as is), because v1 cannot store a zero
//!   point of 0 and the integer-zero grid produces them.
//!
//! **Codes are chosen against the parameters as stored.** GPTQ scales are f16 on disk, so the grids run
//! with [`ParamPrecision::F16`]: the scale is rounded first and codes (and the search's error) are worked
//! out against the rounded value. Otherwise the search would optimise parameters that are not the ones
//! written.
//!
//! **Tied heads are untied.** The runtime's rule is that no linear on a 4-bit path runs outside a 4-bit
//! kernel, so a tied head that a checkpoint leaves unquantized is quantized at load, with a warning. The
//! export writes the head as its own quantized `lm_head` (from the embedding's values) and sets
//! `tie_word_embeddings: false` (GPTQ: `"lm_head": true`), unless [`QuantizeOptions::quantize_head`] is off.
//! The embedding table itself, norms and every other non-linear tensor are copied as stored.
//!
//! **Streaming, and never a half-written model.** The output header is computed first (every tensor's
//! dtype, shape and offset; tensors ordered by alignment as the safetensors crate orders them, so each
//! starts aligned to its element size), then each input tensor is read from the memory-mapped checkpoint,
//! quantized, and its bytes written at their offsets: peak anonymous memory is a few times the largest
//! tensor, never the model. Everything is written into a hidden directory beside `--out` and renamed into
//! place at the end, so a killed run leaves a `.…tmp` directory, not a model that looks complete.
//!
//! **Two methods.** [`Method::Rtn`] (the default) rounds each group to nearest on its grid, layer by layer,
//! with no data. [`Method::Gptq`] runs the model on calibration text and quantizes each layer with GPTQ's
//! second-order error compensation ([`crate::gptq_method`]) on the same grids, into the same formats; the report
//! then also gives each layer's output error over the calibration inputs, for GPTQ and for RTN.
//!
//! **The report measures what was written.** `quantization_report.json` gives, per quantized tensor, the SNR
//! of the weights decoded from the bytes as stored (not the grid's in-memory result) against the source
//! values in f32, and bits per weight (codes + scales + zero points).

use std::collections::{HashMap, HashSet};

use std::path::{Path, PathBuf};
use std::time::Instant;

use half::f16;
use int4_layout::gptq::{self, ZeroFormat};
use int4_layout::grid::{ParamPrecision, ScaleSearch};
use int4_layout::{GroupSize, LayoutError, dequantize, rowmajor};
use rayon::prelude::*;
use safetensors::tensor::Dtype;
use serde::Serialize;
use serde_json::{Value, json};

use int4::{Checkpoint, ModelConfig, ModelDir, StoredTensor, linear_specs};
use int4_safetensors::{FileLayout, FileWriter, TensorEntry};

use crate::gptq_method::{
    CalibrationReport, GptqError, GptqErrorKind, GptqOptions, GridKind, GridSpec, QuantMatrix, Solved, Target,
};

/// The on-disk format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExportFormat {
    /// `cpu_int4`: row-major nibbles, f32 scales and float zeros.
    CpuInt4,
    /// GPTQ: `qweight`/`qzeros`/`scales`/`g_idx` with integer zero points.
    Gptq,
}

impl ExportFormat {
    /// The `quant_method` string.
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::CpuInt4 => "cpu_int4",
            ExportFormat::Gptq => "gptq",
        }
    }
}

/// How the codes are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// Round to nearest per group (with the scale search), no data.
    Rtn,
    /// GPTQ: second-order error compensation over calibration text ([`crate::gptq_method`]).
    Gptq,
}

impl Method {
    /// `rtn` or `gptq`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Rtn => "rtn",
            Method::Gptq => "gptq",
        }
    }
}

/// What to write.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// How codes are chosen (round to nearest, or GPTQ with [`QuantizeOptions::gptq`]).
    pub method: Method,
    /// GPTQ's calibration text and settings (used with [`Method::Gptq`]).
    pub gptq: GptqOptions,
    /// The format.
    pub format: ExportFormat,
    /// Input channels per scale and zero.
    pub group: GroupSize,
    /// GPTQ only: per-group integer zero points (`sym: false`, written as `gptq_v2`) instead of symmetric.
    pub asym: bool,
    /// Search narrower ranges per group (on by default).
    pub search: ScaleSearch,
    /// Quantize the head (untying a tied one). Off: the head is copied as stored (a tied head stays tied).
    pub quantize_head: bool,
    /// Linear layers left unquantized: a layer's name (`model.layers.0.mlp.down_proj`, with or without
    /// `.weight`), a fused layer's name (`model.layers.0.self_attn.qkv`, `….mlp.gate_up`), `lm_head`, or a
    /// prefix of names at a `.` boundary (`model.layers.0`).
    pub ignore: Vec<String>,
    /// Replace an existing non-empty output directory.
    pub force: bool,
}

impl QuantizeOptions {
    /// The defaults for `format`: group 128, symmetric, scale search on, head quantized, nothing ignored.
    pub fn new(format: ExportFormat) -> Self {
        QuantizeOptions {
            method: Method::Rtn,
            gptq: GptqOptions::default(),
            format,
            group: GroupSize::G128,
            asym: false,
            search: ScaleSearch::Shrink,
            quantize_head: true,
            ignore: Vec::new(),
            force: false,
        }
    }

    /// The GPTQ zero-point convention this export uses: v1 when symmetric, v2 when asymmetric.
    pub fn zero_format(&self) -> Option<ZeroFormat> {
        match (self.format, self.asym) {
            (ExportFormat::CpuInt4, _) => None,
            (ExportFormat::Gptq, false) => Some(ZeroFormat::V1),
            (ExportFormat::Gptq, true) => Some(ZeroFormat::V2),
        }
    }
}

/// Why an export failed: what went wrong is its [`kind`](QuantizeError::kind). Nothing is left at the
/// output path when one does.
#[derive(Debug)]
pub struct QuantizeError {
    kind: QuantizeErrorKind,
}

/// What made an export fail.
#[derive(Debug)]
#[non_exhaustive]
pub enum QuantizeErrorKind {
    /// The input is not a model directory, or its safetensors files or linear layers are invalid in a way
    /// the export checks itself (the message says how).
    Input {
        /// The file or directory.
        path: PathBuf,
        /// The problem.
        message: String,
    },
    /// The input is already quantized (its config has a `quantization_config`, or it stores packed tensors).
    AlreadyQuantized {
        /// The model directory.
        path: PathBuf,
        /// What says so.
        what: String,
    },
    /// A tensor the model needs is missing, or has a shape or dtype that disagrees with the config.
    Tensor {
        /// The tensor.
        tensor: String,
        /// The problem.
        message: String,
    },
    /// A linear layer's shape cannot be stored in the chosen format.
    Shape {
        /// The layer.
        tensor: String,
        /// Output channels.
        n: usize,
        /// Input channels.
        k: usize,
        /// The format.
        format: ExportFormat,
        /// What the format needs.
        need: &'static str,
    },
    /// A NaN or infinite value.
    NonFinite {
        /// The tensor.
        tensor: String,
        /// Where (one index per dimension).
        index: Vec<usize>,
        /// The value, as f32.
        value: f32,
    },
    /// An `--ignore` entry that names no linear layer.
    UnknownIgnore {
        /// The entry.
        name: String,
        /// A few real names, to show the spelling.
        examples: Vec<String>,
    },
    /// An `--ignore` entry that leaves part of a fused layer quantized (the runtime fuses q/k/v and
    /// gate/up, and a fused layer is stored either all quantized or not at all).
    PartialFusedIgnore {
        /// The layer ignored.
        name: String,
        /// Every layer of its fused group.
        fused: Vec<String>,
        /// The fused group's name.
        group: String,
    },
    /// Options that contradict each other.
    Options(String),
    /// The output directory exists and is not empty (and `force` is off).
    OutputExists {
        /// The output directory.
        path: PathBuf,
    },
    /// The output path cannot be used (it is the input, inside it, or contains it).
    Output {
        /// The output path.
        path: PathBuf,
        /// The problem.
        message: String,
    },
    /// The grid or a packer of the layout crate refused a tensor.
    Quantize {
        /// The tensor.
        tensor: String,
        /// The layout crate's error.
        source: LayoutError,
    },
    /// A layer's quantized parameters cannot be stored: a scale or zero point that is not finite or
    /// overflows f16 (the weights are too large), or a result that does not fit the layer or the format.
    Unstorable {
        /// The tensor.
        tensor: String,
        /// The problem.
        message: String,
    },
    /// GPTQ could not run: no or empty calibration text, a bad option, a non-finite Hessian, …
    Gptq(GptqError),
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A JSON file could not be read (`config.json` is not valid JSON) or a JSON document could not be
    /// written (`config.json`, the report, the safetensors header).
    Json {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// An input safetensors file's header is not valid JSON, or a tensor's entry in it does not parse.
    Header {
        /// The safetensors file.
        path: PathBuf,
        /// The entry that does not parse: the tensor's name, the field (`dtype`, `shape` or `data_offsets`)
        /// and its value as written; `None` when the header as a whole is not valid JSON.
        entry: Option<String>,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The runtime refused the input: its `config.json`, its checkpoint, or a tensor in it (the error names
    /// the file or tensor).
    Model(int4::Error),
}

impl QuantizeError {
    pub(crate) fn new(kind: QuantizeErrorKind) -> Self {
        QuantizeError { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &QuantizeErrorKind {
        &self.kind
    }
}

impl From<QuantizeErrorKind> for QuantizeError {
    fn from(kind: QuantizeErrorKind) -> Self {
        QuantizeError::new(kind)
    }
}

impl std::fmt::Display for QuantizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            QuantizeErrorKind::Input { path, message } => write!(f, "{}: {message}", path.display()),
            QuantizeErrorKind::AlreadyQuantized { path, what } => write!(
                f,
                "{} is already quantized ({what}): int4 quantize reads an unquantized (f32, bf16 or f16) checkpoint",
                path.display()
            ),
            QuantizeErrorKind::Tensor { tensor, message } => write!(f, "{tensor}: {message}"),
            QuantizeErrorKind::Shape { tensor, n, k, format, need } => {
                write!(f, "{tensor}: N = {n}, K = {k} cannot be stored as {}: it needs {need}", format.name())
            }
            QuantizeErrorKind::NonFinite { tensor, index, value } => write!(
                f,
                "{tensor}: the weight at {index:?} is {value}; a checkpoint with NaN or infinite weights cannot be \
                 quantized"
            ),
            QuantizeErrorKind::UnknownIgnore { name, examples } => write!(
                f,
                "--ignore {name}: no linear layer is called that or starts with it (linear layers are named like {})",
                examples.join(", ")
            ),
            QuantizeErrorKind::PartialFusedIgnore { name, fused, group } => write!(
                f,
                "--ignore {name}: {} run as one fused layer, stored all quantized or not at all; ignore {group} \
                 (or all of them)",
                fused.join(", ")
            ),
            QuantizeErrorKind::Options(m) => f.write_str(m),
            QuantizeErrorKind::OutputExists { path } => write!(
                f,
                "{} exists and is not empty: choose another output directory, or pass --force to replace it",
                path.display()
            ),
            QuantizeErrorKind::Output { path, message } => write!(f, "{}: {message}", path.display()),
            QuantizeErrorKind::Quantize { tensor, source } => write!(f, "{tensor}: {source}"),
            QuantizeErrorKind::Unstorable { tensor, message } => write!(f, "{tensor}: {message}"),
            QuantizeErrorKind::Gptq(e) => write!(f, "{e}"),
            QuantizeErrorKind::Io { path, source } => write!(f, "{}: {source}", path.display()),
            // A parse error has a position in the text read (lines count from 1); a serialization error has none.
            QuantizeErrorKind::Json { path, source } if source.line() > 0 => {
                write!(f, "{}: not valid JSON: {source}", path.display())
            }
            QuantizeErrorKind::Json { path, source } => write!(f, "{}: {source}", path.display()),
            QuantizeErrorKind::Header { path, entry: None, source } => {
                write!(f, "{}: bad safetensors header: {source}", path.display())
            }
            QuantizeErrorKind::Header { path, entry: Some(entry), source } => {
                write!(f, "{}: {entry}: {source}", path.display())
            }
            QuantizeErrorKind::Model(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for QuantizeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            QuantizeErrorKind::Quantize { source, .. } => Some(source),
            QuantizeErrorKind::Gptq(e) => Some(e),
            QuantizeErrorKind::Io { source, .. } => Some(source),
            QuantizeErrorKind::Json { source, .. } | QuantizeErrorKind::Header { source, .. } => Some(source),
            QuantizeErrorKind::Model(e) => Some(e),
            QuantizeErrorKind::Input { .. }
            | QuantizeErrorKind::AlreadyQuantized { .. }
            | QuantizeErrorKind::Tensor { .. }
            | QuantizeErrorKind::Shape { .. }
            | QuantizeErrorKind::NonFinite { .. }
            | QuantizeErrorKind::UnknownIgnore { .. }
            | QuantizeErrorKind::PartialFusedIgnore { .. }
            | QuantizeErrorKind::Options(_)
            | QuantizeErrorKind::OutputExists { .. }
            | QuantizeErrorKind::Output { .. }
            | QuantizeErrorKind::Unstorable { .. } => None,
        }
    }
}

impl From<GptqError> for QuantizeError {
    fn from(e: GptqError) -> Self {
        match e.into_kind() {
            // A weight that cannot be read is the input's fault, whichever method read it.
            GptqErrorKind::Model(e) => QuantizeErrorKind::Model(e).into(),
            kind => QuantizeErrorKind::Gptq(kind.into()).into(),
        }
    }
}

/// Shorthand.
type Result<T> = std::result::Result<T, QuantizeError>;

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> QuantizeError + '_ {
    move |source| QuantizeErrorKind::Io { path: path.to_path_buf(), source }.into()
}

/// One quantized linear layer in the report.
#[derive(Clone, Debug, Serialize)]
pub struct TensorReport {
    /// The layer's name (its tensors' prefix): `model.layers.0.self_attn.q_proj`, …, `lm_head`.
    pub name: String,
    /// The tensor its values came from (`model.embed_tokens.weight` for an untied head).
    pub source: String,
    /// The source tensor's dtype.
    pub source_dtype: String,
    /// `[N, K]`.
    pub shape: [usize; 2],
    /// `10·log10(Σw² / Σ(w − ŵ)²)` with `ŵ` decoded from the stored bytes and `w` the source values in
    /// f32, sums in f64 (per row, then over rows in order); `None` when the stored weights are exact.
    pub snr_db: Option<f64>,
    /// `Σw²`.
    pub signal: f64,
    /// `Σ(w − ŵ)²`.
    pub noise: f64,
    /// Bits per weight stored: codes, scales and zero points (GPTQ's `g_idx` is not counted).
    pub bits_per_weight: f64,
    /// Bytes of codes, scales and zero points.
    pub stored_bytes: u64,
    /// Group size (-1: one group per row).
    pub group_size: i64,
    /// Whether scale search was on.
    pub search: bool,
    /// `cpu_int4`, `gptq` (v1, symmetric) or `gptq_v2` (asymmetric).
    pub format: String,
    /// `rtn` or `gptq`.
    pub method: String,
    /// GPTQ only: `10·log10(tr(WHWᵀ) / tr(ΔHΔᵀ))`, the layer's output SNR over the calibration inputs
    /// (`H = Σxᵀx` of its inputs, `Δ = W − Ŵ`): what GPTQ minimises. `None` without calibration.
    pub output_snr_db: Option<f64>,
    /// The same for round to nearest on the same grid and the same `H`, for comparison.
    pub rtn_output_snr_db: Option<f64>,
}

/// One tensor copied as stored.
#[derive(Clone, Debug, Serialize)]
pub struct CopiedTensor {
    /// Its name.
    pub name: String,
    /// Its dtype.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes.
    pub bytes: u64,
    /// Why it is not quantized: `not a linear layer`, `ignored`, `head left unquantized`.
    pub why: String,
}

/// Totals over the export.
#[derive(Clone, Debug, Serialize)]
pub struct QuantizeTotals {
    /// Linear layers quantized.
    pub quantized_tensors: usize,
    /// Their weights.
    pub quantized_weights: u64,
    /// Their stored bytes (codes, scales, zero points).
    pub quantized_bytes: u64,
    /// Bits per quantized weight over all of them.
    pub bits_per_weight: f64,
    /// `10·log10(ΣΣw² / ΣΣ(w − ŵ)²)` over every quantized layer.
    pub snr_db: Option<f64>,
    /// The lowest per-layer SNR.
    pub min_snr_db: Option<f64>,
    /// The layer with the lowest SNR.
    pub worst_tensor: Option<String>,
    /// Tensors copied as stored.
    pub copied_tensors: usize,
    /// Their bytes.
    pub copied_bytes: u64,
    /// Bytes of the input's safetensors files.
    pub input_bytes: u64,
    /// Bytes of the output's `model.safetensors`.
    pub output_bytes: u64,
    /// Wall time, seconds (up to writing the report).
    pub seconds: f64,
    /// The largest anonymous resident memory seen after each tensor (Linux `RssAnon`), bytes.
    pub peak_rss_anon_bytes: Option<u64>,
}

/// What an export wrote (also written as `quantization_report.json`).
#[derive(Clone, Debug, Serialize)]
pub struct QuantizeReport {
    /// `cpu_int4` or `gptq`.
    pub format: String,
    /// GPTQ's `checkpoint_format` (`gptq` or `gptq_v2`).
    pub checkpoint_format: Option<String>,
    /// Symmetric (GPTQ) — `cpu_int4` is always asymmetric with a float zero.
    pub sym: bool,
    /// Group size (-1: one group per row).
    pub group_size: i64,
    /// Whether scale search was on.
    pub search: bool,
    /// `rtn` or `gptq`.
    pub method: String,
    /// GPTQ only: the calibration text and settings.
    pub calibration: Option<CalibrationReport>,
    /// What happened to the head.
    pub head: String,
    /// The linear layers left unquantized by `ignore`.
    pub ignored: Vec<String>,
    /// The input directory.
    pub input: PathBuf,
    /// The output directory.
    pub output: PathBuf,
    /// Every quantized linear layer, in the order written.
    pub tensors: Vec<TensorReport>,
    /// Every tensor copied as stored.
    pub copied: Vec<CopiedTensor>,
    /// The other files copied (tokenizer, generation config, …).
    pub files_copied: Vec<String>,
    /// Totals.
    pub totals: QuantizeTotals,
    /// The int4 version that wrote it.
    pub int4_version: String,
}

/// Progress of a running export, told after each tensor (for a progress bar).
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// Tensors processed.
    pub done: usize,
    /// Tensors to process.
    pub total: usize,
    /// Source bytes processed.
    pub bytes_done: u64,
    /// Source bytes to process.
    pub bytes_total: u64,
    /// The tensor just processed.
    pub tensor: &'a str,
}

/// A tensor of the input as stored, read in place from the checkpoint's mapping.
type RawTensor<'a> = StoredTensor<'a>;

/// Every tensor of the input's files as stored, in file order: what copying a tensor unchanged needs
/// (the runtime's [`Checkpoint`] reads the files, once; this is its stored view, indexed by name).
struct RawIndex<'a> {
    files: Vec<PathBuf>,
    tensors: Vec<RawTensor<'a>>,
    by_name: HashMap<&'a str, usize>,
}

impl<'a> RawIndex<'a> {
    fn of(ckpt: &'a Checkpoint) -> Self {
        let tensors = ckpt.stored_tensors();
        let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name, i)).collect();
        RawIndex { files: ckpt.files(), tensors, by_name }
    }

    fn get(&self, name: &str) -> Option<&RawTensor<'a>> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}

/// A stored tensor's length in bytes.
fn stored_len(t: &RawTensor<'_>) -> u64 {
    t.bytes.len() as u64
}

/// One linear layer of the model as stored: `<prefix>.weight` `[n][k]`.
#[derive(Clone, Debug)]
struct LinearPart {
    prefix: String,
    /// The tensor holding its values.
    source: String,
    n: usize,
    k: usize,
    /// The fused layer the runtime builds from it (`….self_attn.qkv`, `….mlp.gate_up`, or its own name).
    group: String,
}

/// The model's linear layers per decoder layer, as the checkpoint stores them (unfused), checked against
/// the runtime's own list ([`linear_specs`]) so both agree on names and shapes.
fn layer_linears(cfg: &ModelConfig, ckpt: &Checkpoint, config_path: &Path) -> Result<Vec<LinearPart>> {
    let (h, hd, nh, nkv, inter) =
        (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size);
    let mut out = Vec::new();
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}");
        let part = |name: String, n: usize, k: usize, group: &str| LinearPart {
            source: format!("{name}.weight"),
            prefix: name,
            n,
            k,
            group: group.to_string(),
        };
        let qkv = format!("{p}.self_attn.qkv");
        let gate_up = format!("{p}.mlp.gate_up");
        out.push(part(format!("{p}.self_attn.q_proj"), nh * hd, h, &qkv));
        out.push(part(format!("{p}.self_attn.k_proj"), nkv * hd, h, &qkv));
        out.push(part(format!("{p}.self_attn.v_proj"), nkv * hd, h, &qkv));
        out.push(part(format!("{p}.self_attn.o_proj"), h, nh * hd, &format!("{p}.self_attn.o_proj")));
        out.push(part(format!("{p}.mlp.gate_proj"), inter, h, &gate_up));
        out.push(part(format!("{p}.mlp.up_proj"), inter, h, &gate_up));
        out.push(part(format!("{p}.mlp.down_proj"), h, inter, &format!("{p}.mlp.down_proj")));
    }
    // The runtime's fused list must be exactly these parts grouped (the head is handled separately).
    let specs = linear_specs(cfg, ckpt);
    for spec in specs.iter().filter(|s| s.name != "lm_head") {
        let parts: Vec<&LinearPart> = out.iter().filter(|p| p.group == spec.name).collect();
        let n: usize = parts.iter().map(|p| p.n).sum();
        if parts.is_empty() || n != spec.n || parts.iter().any(|p| p.k != spec.k) {
            return Err(QuantizeErrorKind::Input {
                path: config_path.to_path_buf(),
                message: format!("the runtime's layer {} does not match the checkpoint's linear layers", spec.name),
            }
            .into());
        }
    }
    Ok(out)
}

/// The output tensors of one quantized layer, in the order [`encode`] returns their bytes.
fn quantized_tensors(prefix: &str, n: usize, k: usize, opts: &QuantizeOptions) -> Vec<(String, Dtype, Vec<usize>)> {
    let groups = opts.group.groups(k);
    let t = |s: &str| format!("{prefix}.{s}");
    match opts.format {
        ExportFormat::CpuInt4 => vec![
            (t("weight_packed"), Dtype::U8, vec![n, k / 2]),
            (t("weight_scale"), Dtype::F32, vec![n, groups]),
            (t("weight_zero"), Dtype::F32, vec![n, groups]),
        ],
        ExportFormat::Gptq => vec![
            (t("qweight"), Dtype::I32, vec![k / 8, n]),
            (t("qzeros"), Dtype::I32, vec![groups, n / 8]),
            (t("scales"), Dtype::F16, vec![groups, n]),
            (t("g_idx"), Dtype::I32, vec![k]),
        ],
    }
}

/// Checks that `n × k` can be stored in the format.
fn check_shape(prefix: &str, n: usize, k: usize, format: ExportFormat) -> Result<()> {
    let bad = |need| Err(QuantizeErrorKind::Shape { tensor: prefix.to_string(), n, k, format, need }.into());
    match format {
        ExportFormat::CpuInt4 if !k.is_multiple_of(2) => bad("an even K (two codes per byte along K)"),
        ExportFormat::Gptq if !k.is_multiple_of(8) || !n.is_multiple_of(8) => {
            bad("N and K multiples of 8 (eight codes per 32-bit word along K in qweight, along N in qzeros)")
        }
        _ => Ok(()),
    }
}

/// What to do with an input tensor (or the head).
enum Job {
    /// Copy `raw` as stored into output tensor `out`.
    Copy { raw: usize, out: usize, why: &'static str },
    /// Quantize linear `part` into the output tensors `outs`.
    Quantize { part: LinearPart, outs: Vec<usize> },
}

/// A hidden work directory beside the output, removed unless the export completes.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Bytes read or written per step when copying a tensor as stored.
const COPY_CHUNK: usize = 8 << 20;

/// Files of a model directory that are weights (never copied: the export writes its own).
fn is_weights_file(name: &str) -> bool {
    let weights_ext = [".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx"];
    weights_ext.iter().any(|e| name.ends_with(e)) || name.ends_with(".index.json")
}

/// Files never copied: rewritten (`config.json`), or about the input's own weights.
const NOT_COPIED: &[&str] = &["config.json", "quantize_config.json", "quantization_report.json", "int4-source.json"];

/// Quantizes the unquantized model directory `input` into a 4-bit checkpoint at `out`.
///
/// `progress` is told after each tensor. Returns the report, also written as
/// `out/quantization_report.json`. On any error nothing is left at `out` (an existing one replaced with
/// `force` is kept until the new one is complete).
pub fn quantize_checkpoint(
    input: &Path,
    out: &Path,
    opts: &QuantizeOptions,
    progress: Option<&dyn Fn(Progress<'_>)>,
) -> Result<QuantizeReport> {
    let started = Instant::now();
    if opts.asym && opts.format == ExportFormat::CpuInt4 {
        return Err(QuantizeErrorKind::Options(
            "--asym is for gptq: cpu_int4 always stores a float zero per group (it is asymmetric already)".into(),
        )
        .into());
    }
    // The input: a directory with an unquantized config (a GGUF is told apart below).
    if !input.is_dir() && !input.is_file() {
        return Err(
            QuantizeErrorKind::Input { path: input.to_path_buf(), message: "is not a model directory".into() }.into()
        );
    }
    // The input's files are read through the runtime's ModelDir (names confined, regular files, capped).
    let model = ModelDir::open(input).map_err(QuantizeErrorKind::Model)?;
    if let Some(gguf) = model.gguf() {
        let quantized: Vec<String> = gguf
            .tensors()
            .iter()
            .filter(|t| t.ggml_type.block_size() > 1)
            .map(|t| t.ggml_type.name().to_ascii_uppercase())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !quantized.is_empty() {
            return Err(QuantizeErrorKind::AlreadyQuantized {
                path: input.to_path_buf(),
                what: format!(
                    "a GGUF of {} tensors, which int4 generate, chat, eval and info run as stored",
                    quantized.join(", ")
                ),
            }
            .into());
        }
    }
    let config_path = input.join("config.json");
    let config_text = model.config_text().map_err(QuantizeErrorKind::Model)?;
    let mut config_json: Value = serde_json::from_str(&config_text)
        .map_err(|source| QuantizeErrorKind::Json { path: config_path.clone(), source })?;
    let cfg = ModelConfig::from_json(&config_text).map_err(QuantizeErrorKind::Model)?;
    if let Some(q) = &cfg.quantization_config {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown method");
        return Err(QuantizeErrorKind::AlreadyQuantized {
            path: input.to_path_buf(),
            what: format!("config.json has a quantization_config, quant_method {method}"),
        }
        .into());
    }
    if model.open_file("quantize_config.json").map_err(QuantizeErrorKind::Model)?.is_some() {
        return Err(QuantizeErrorKind::AlreadyQuantized {
            path: input.to_path_buf(),
            what: "it has a quantize_config.json".into(),
        }
        .into());
    }
    let (parent, out_name) = check_output(input, out, opts.force)?;
    // GPTQ's calibration text, read and tokenized before anything is written.
    let calib = match opts.method {
        Method::Rtn => None,
        Method::Gptq => Some(crate::gptq_method::calibration_tokens(input, &opts.gptq)?),
    };

    let ckpt = Checkpoint::open_in(&model).map_err(QuantizeErrorKind::Model)?;
    let raw = RawIndex::of(&ckpt);
    if let Some(t) =
        raw.tensors.iter().find(|t| [".qweight", ".weight_packed", ".qzeros"].iter().any(|s| t.name.ends_with(s)))
    {
        return Err(QuantizeErrorKind::AlreadyQuantized {
            path: input.to_path_buf(),
            what: format!("it stores the packed tensor {}", t.name),
        }
        .into());
    }

    // The linear layers, their source tensors checked against the config.
    let mut parts = layer_linears(&cfg, &ckpt, &config_path)?;
    let embed = "model.embed_tokens.weight";
    let tied = cfg.tie_word_embeddings || raw.get("lm_head.weight").is_none();
    let head_source = if tied { embed } else { "lm_head.weight" };
    parts.push(LinearPart {
        prefix: "lm_head".into(),
        source: head_source.into(),
        n: cfg.vocab_size,
        k: cfg.hidden_size,
        group: "lm_head".into(),
    });
    for p in &parts {
        let t = raw.get(&p.source).ok_or_else(|| QuantizeErrorKind::Tensor {
            tensor: p.source.clone(),
            message: "is missing from the checkpoint".into(),
        })?;
        if t.shape != [p.n, p.k] {
            return Err(QuantizeErrorKind::Tensor {
                tensor: p.source.clone(),
                message: format!("shape {:?}, but config.json implies {:?}", t.shape, [p.n, p.k]),
            }
            .into());
        }
    }
    let ignored = resolve_ignore(&opts.ignore, &parts)?;
    let quantize_head = opts.quantize_head && !ignored.contains("lm_head");
    let quantized: Vec<&LinearPart> =
        parts.iter().filter(|p| !ignored.contains(&p.prefix) && (p.prefix != "lm_head" || quantize_head)).collect();
    for p in &quantized {
        check_shape(&p.prefix, p.n, p.k, opts.format)?;
    }
    let untie = tied && quantize_head;

    // The plan: one job per input tensor in file order (the untied head right after the embedding), and
    // every output tensor with its offset.
    let by_source: HashMap<&str, &LinearPart> = quantized.iter().map(|p| (p.source.as_str(), *p)).collect();
    let ignored_sources: HashSet<String> =
        parts.iter().filter(|p| ignored.contains(&p.prefix) && p.source != embed).map(|p| p.source.clone()).collect();
    let mut jobs = Vec::new();
    let mut outputs: Vec<TensorEntry> = Vec::new();
    for (ri, t) in raw.tensors.iter().enumerate() {
        let as_linear = by_source.get(t.name).filter(|p| p.prefix != "lm_head" || !untie);
        if let Some(p) = as_linear {
            let outs = quantized_part_outputs(p, opts, &mut outputs);
            jobs.push(Job::Quantize { part: (*p).clone(), outs });
            continue;
        }
        if t.name == "lm_head.weight" && untie {
            // A tied checkpoint's redundant copy of the head: the quantized head replaces it.
            continue;
        }
        let why = if ignored_sources.contains(t.name) {
            "ignored"
        } else if t.name == "lm_head.weight" {
            "head left unquantized"
        } else {
            "not a linear layer"
        };
        let out = push_out(&mut outputs, t.name.to_string(), t.dtype, t.shape.to_vec());
        jobs.push(Job::Copy { raw: ri, out, why });
        if untie && t.name == embed {
            let head = parts.iter().find(|p| p.prefix == "lm_head").cloned().ok_or_else(|| {
                QuantizeErrorKind::Tensor { tensor: "lm_head".into(), message: "no head layer".into() }
            })?;
            let outs = quantized_part_outputs(&head, opts, &mut outputs);
            jobs.push(Job::Quantize { part: head, outs });
        }
    }
    let quantizer = format!("int4 quantize {}", env!("CARGO_PKG_VERSION"));
    let metadata = [("format", "pt"), ("quantizer", quantizer.as_str()), ("quant_method", opts.format.name())];
    let layout = FileLayout::new(&metadata, outputs);

    // Write into a hidden directory beside the output.
    let work =
        WorkDir { path: parent.join(format!(".{out_name}.int4-quantize-{}.tmp", std::process::id())), keep: false };
    std::fs::create_dir_all(&parent).map_err(io_err(&parent))?;
    sweep_stale_work_dirs(&parent, &out_name);
    std::fs::create_dir_all(&work.path).map_err(io_err(&work.path))?;
    let model_path = work.path.join("model.safetensors");
    let output_bytes = layout.file_len();
    let mut file = FileWriter::create(&model_path, layout).map_err(io_err(&model_path))?;

    let bytes_total: u64 = jobs
        .iter()
        .map(|j| match j {
            Job::Copy { raw: r, .. } => stored_len(&raw.tensors[*r]),
            Job::Quantize { part, .. } => raw.get(&part.source).map_or(0, stored_len),
        })
        .sum();
    // GPTQ: every quantized layer solved up front, sequentially through the model (its codes are then
    // packed in file order like RTN's).
    let (solved, calibration) = match calib {
        None => (HashMap::new(), None),
        Some((files, seqs)) => {
            let targets: Vec<Target> = quantized
                .iter()
                .map(|p| Target {
                    prefix: p.prefix.clone(),
                    source: p.source.clone(),
                    n: p.n,
                    k: p.k,
                    group: p.group.clone(),
                })
                .collect();
            let tell = |done: usize, total: usize| {
                if let Some(report) = progress {
                    let msg = format!("GPTQ calibration: layer {done}/{total}");
                    report(Progress { done: 0, total: jobs.len(), bytes_done: 0, bytes_total, tensor: &msg });
                }
            };
            let (solved, rep) = crate::gptq_method::calibrate(
                files,
                &seqs,
                &cfg,
                &ckpt,
                &targets,
                grid_spec(opts),
                &opts.gptq,
                Some(&tell),
            )?;
            (solved, Some(rep))
        }
    };
    let mut bytes_done = 0u64;
    let mut peak_rss = rss_anon_bytes();
    let mut tensors = Vec::new();
    let mut copied = Vec::new();
    for (done, job) in jobs.iter().enumerate() {
        let name = match job {
            Job::Copy { raw: r, out: o, why } => {
                let t = &raw.tensors[*r];
                copy_tensor(t, &mut file, &model_path, *o)?;
                copied.push(CopiedTensor {
                    name: t.name.to_string(),
                    dtype: dtype_name(t.dtype),
                    shape: t.shape.to_vec(),
                    bytes: stored_len(t),
                    why: (*why).to_string(),
                });
                bytes_done += stored_len(t);
                t.name
            }
            Job::Quantize { part, outs } => {
                let src = raw.get(&part.source).ok_or_else(|| QuantizeErrorKind::Tensor {
                    tensor: part.source.clone(),
                    message: "is missing from the checkpoint".into(),
                })?;
                let w = match ckpt.f32(&part.source, &[part.n, part.k]) {
                    Ok(w) => w,
                    Err(e) => {
                        let nf = find_non_finite(src);
                        return Err(nf.unwrap_or_else(|| QuantizeErrorKind::Model(e).into()));
                    }
                };
                let pre = solved.get(&part.prefix);
                let encoded = encode(&part.prefix, &w, part.n, part.k, opts, pre.map(|s| &s.quant))?;
                for (blob, &o) in encoded.blobs.iter().zip(outs) {
                    let entry = &file.layout().entries()[o];
                    debug_assert_eq!(blob.len() as u64, entry.len_bytes(), "{}", entry.name);
                    file.write(o, 0, blob).map_err(io_err(&model_path))?;
                }
                peak_rss = peak_rss.max(rss_anon_bytes());
                tensors.push(layer_report(part, src, &encoded, opts, pre));
                bytes_done += stored_len(src);
                part.prefix.as_str()
            }
        };
        if let Some(report) = progress {
            report(Progress { done: done + 1, total: jobs.len(), bytes_done, bytes_total, tensor: name });
        }
    }
    file.finish().map_err(io_err(&model_path))?;

    // config.json, the other files, the report; then into place.
    let qc = match opts.format {
        ExportFormat::CpuInt4 => {
            json!({"quant_method": "cpu_int4", "bits": 4, "group_size": opts.group.to_checkpoint()})
        }
        ExportFormat::Gptq => json!({
            "quant_method": "gptq", "bits": 4, "group_size": opts.group.to_checkpoint(), "sym": !opts.asym,
            "desc_act": false,
            "checkpoint_format": opts.zero_format().map_or("gptq", ZeroFormat::as_checkpoint_format),
            "lm_head": quantize_head,
        }),
    };
    if let Some(obj) = config_json.as_object_mut() {
        obj.insert("quantization_config".into(), qc);
        if untie {
            obj.insert("tie_word_embeddings".into(), Value::Bool(false));
        }
    }
    write_json(&work.path.join("config.json"), &config_json)?;
    let files_copied = copy_side_files(&model, input, &work.path)?;

    let head = match (quantize_head, tied) {
        (true, true) => "quantized as its own lm_head (untied from the embedding, which stays unquantized)",
        (true, false) => "quantized",
        (false, true) => "left tied to the unquantized embedding",
        (false, false) => "left unquantized",
    };
    let mut ignored_list: Vec<String> = ignored.into_iter().collect();
    ignored_list.sort();
    let input_bytes = raw.files.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let totals = totals(&tensors, &copied, input_bytes, output_bytes, started, peak_rss);
    let report = QuantizeReport {
        format: opts.format.name().into(),
        checkpoint_format: opts.zero_format().map(|z| z.as_checkpoint_format().to_string()),
        sym: opts.format == ExportFormat::Gptq && !opts.asym,
        group_size: opts.group.to_checkpoint(),
        search: opts.search == ScaleSearch::Shrink,
        method: opts.method.name().into(),
        calibration,
        head: head.into(),
        ignored: ignored_list,
        input: input.to_path_buf(),
        output: out.to_path_buf(),
        tensors,
        copied,
        files_copied,
        totals,
        int4_version: env!("CARGO_PKG_VERSION").into(),
    };
    write_json(&work.path.join("quantization_report.json"), &report)?;
    move_into_place(work, out, &parent, &out_name)?;
    Ok(report)
}

/// Adds a quantized layer's output tensors; returns their indices.
fn quantized_part_outputs(p: &LinearPart, opts: &QuantizeOptions, outputs: &mut Vec<TensorEntry>) -> Vec<usize> {
    quantized_tensors(&p.prefix, p.n, p.k, opts)
        .into_iter()
        .map(|(name, dtype, shape)| push_out(outputs, name, dtype, shape))
        .collect()
}

/// Adds an output tensor (its offset is fixed by the file's layout once all are known); returns its index.
fn push_out(outputs: &mut Vec<TensorEntry>, name: String, dtype: Dtype, shape: Vec<usize>) -> usize {
    outputs.push(TensorEntry { name, dtype, shape });
    outputs.len() - 1
}

fn dtype_name(d: Dtype) -> String {
    match serde_json::to_value(d) {
        Ok(Value::String(s)) => s,
        _ => format!("{d:?}"),
    }
}

/// Resolves `--ignore` entries to the layers' prefixes; every entry must match a layer, and a fused group
/// must be ignored whole.
fn resolve_ignore(entries: &[String], parts: &[LinearPart]) -> Result<HashSet<String>> {
    let mut ignored = HashSet::new();
    for raw in entries {
        let e = raw.trim();
        if e.is_empty() {
            continue;
        }
        let e = e.strip_suffix(".weight").unwrap_or(e);
        let prefix_dot = format!("{e}.");
        let hits: Vec<&LinearPart> =
            parts.iter().filter(|p| p.prefix == e || p.group == e || p.prefix.starts_with(&prefix_dot)).collect();
        if hits.is_empty() {
            let mut examples: Vec<String> = parts.iter().take(7).map(|p| p.prefix.clone()).collect();
            examples.extend(["model.layers.0.self_attn.qkv".into(), "model.layers.0".into(), "lm_head".into()]);
            return Err(QuantizeErrorKind::UnknownIgnore { name: raw.clone(), examples }.into());
        }
        ignored.extend(hits.iter().map(|p| p.prefix.clone()));
    }
    for p in parts {
        if !ignored.contains(&p.prefix) {
            continue;
        }
        let fused: Vec<&LinearPart> = parts.iter().filter(|q| q.group == p.group).collect();
        if fused.iter().any(|q| !ignored.contains(&q.prefix)) {
            return Err(QuantizeErrorKind::PartialFusedIgnore {
                name: p.prefix.clone(),
                fused: fused.iter().map(|q| q.prefix.clone()).collect(),
                group: p.group.clone(),
            }
            .into());
        }
    }
    Ok(ignored)
}

/// Refuses an output that is the input (or inside it, or around it) or that exists and is not empty
/// (unless `force`). Returns the directory to work in and the output's file name.
fn check_output(input: &Path, out: &Path, force: bool) -> Result<(PathBuf, String)> {
    let bad =
        |m: &str| QuantizeError::new(QuantizeErrorKind::Output { path: out.to_path_buf(), message: m.to_string() });
    let name = out.file_name().and_then(|n| n.to_str()).ok_or_else(|| bad("has no usable directory name"))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Where the parent does not exist yet, the output cannot be (or contain) the input, and nothing is
    // created until the export starts writing.
    if parent.exists() {
        let canon_in = std::fs::canonicalize(input).map_err(io_err(input))?;
        let canon_out = std::fs::canonicalize(&parent).map_err(io_err(&parent))?.join(name);
        if canon_out.starts_with(&canon_in) || canon_in.starts_with(&canon_out) {
            return Err(bad("is the input directory, inside it, or contains it"));
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(out) {
        let empty_dir = meta.is_dir() && std::fs::read_dir(out).map_err(io_err(out))?.next().is_none();
        if !empty_dir && !force {
            return Err(QuantizeErrorKind::OutputExists { path: out.to_path_buf() }.into());
        }
    }
    Ok((parent, name.to_string()))
}

/// Removes work directories a killed export into the same output left behind (their process is gone;
/// where that cannot be told, as without `/proc`, nothing is removed).
fn sweep_stale_work_dirs(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    let prefix = format!(".{name}.int4-quantize-");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|f| f.strip_prefix(&prefix)).and_then(|f| f.strip_suffix(".tmp"))
        else {
            continue;
        };
        let ours = pid == std::process::id().to_string();
        let dead = Path::new("/proc/self").exists() && !Path::new("/proc").join(pid).exists();
        if ours || dead {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Renames the finished work directory to `out`, replacing what is there (already allowed by
/// [`check_output`]): the old one is moved aside first and removed only once the new one is in place.
fn move_into_place(mut work: WorkDir, out: &Path, parent: &Path, name: &str) -> Result<()> {
    if std::fs::symlink_metadata(out).is_ok() {
        let old = parent.join(format!(".{name}.int4-quantize-{}.old", std::process::id()));
        std::fs::rename(out, &old).map_err(io_err(out))?;
        if let Err(e) = std::fs::rename(&work.path, out) {
            let _ = std::fs::rename(&old, out);
            return Err(QuantizeErrorKind::Io { path: out.to_path_buf(), source: e }.into());
        }
        work.keep = true;
        let is_dir = std::fs::symlink_metadata(&old).is_ok_and(|m| m.is_dir());
        let removed = if is_dir { std::fs::remove_dir_all(&old) } else { std::fs::remove_file(&old) };
        removed.map_err(io_err(&old))?;
    } else {
        std::fs::rename(&work.path, out).map_err(io_err(out))?;
        work.keep = true;
    }
    Ok(())
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|source| QuantizeErrorKind::Json { path: path.to_path_buf(), source })?;
    text.push('\n');
    std::fs::write(path, text).map_err(io_err(path))
}

/// Copies the directory's other regular files (tokenizer, generation config, chat template, licence…); for a
/// GGUF, writes the files its metadata stands for (tokenizer, its config with the chat template, the
/// generation config), never the files that happen to lie beside it.
fn copy_side_files(model: &ModelDir, input: &Path, to: &Path) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    if model.gguf().is_some() {
        for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            if let Some(bytes) = model.read(name, int4::TOKENIZER_CAP).map_err(QuantizeErrorKind::Model)? {
                std::fs::write(to.join(name), bytes).map_err(io_err(&to.join(name)))?;
                copied.push(name.to_string());
            }
        }
        return Ok(copied);
    }
    for entry in std::fs::read_dir(input).map_err(io_err(input))? {
        let entry = entry.map_err(io_err(input))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        let is_file = entry.file_type().map_err(io_err(&entry.path()))?.is_file();
        if !is_file || name.starts_with('.') || is_weights_file(&name) || NOT_COPIED.contains(&name.as_str()) {
            continue;
        }
        std::fs::copy(entry.path(), to.join(&name)).map_err(io_err(&entry.path()))?;
        copied.push(name);
    }
    copied.sort();
    Ok(copied)
}

/// Writes a tensor's stored bytes as output tensor `out`, a chunk at a time, refusing NaN or infinity; a
/// GGUF's Q/K rows go back to Hugging Face order, a row at a time.
fn copy_tensor(t: &RawTensor<'_>, file: &mut FileWriter, out_path: &Path, out: usize) -> Result<()> {
    if let (Some(heads), [rows, _]) = (t.gguf_qk_heads, t.shape) {
        let (rows, row_bytes) = (*rows, t.bytes.len() / (*rows).max(1));
        let hd = rows / heads.max(1);
        for hf_row in 0..rows {
            let (h, rem) = (hf_row / hd, hf_row % hd);
            let stored_row = h * hd + 2 * (rem % (hd / 2)) + rem / (hd / 2);
            let row = &t.bytes[stored_row * row_bytes..(stored_row + 1) * row_bytes];
            if let Some((i, v)) = first_non_finite(t.dtype, row) {
                return Err(non_finite(t, (hf_row * row_bytes) as u64 / elem_bytes(t.dtype) + i as u64, v));
            }
            file.write(out, (hf_row * row_bytes) as u64, row).map_err(io_err(out_path))?;
        }
        return Ok(());
    }
    for (c, chunk) in t.bytes.chunks(COPY_CHUNK).enumerate() {
        if let Some((i, v)) = first_non_finite(t.dtype, chunk) {
            return Err(non_finite(t, (c * COPY_CHUNK) as u64 / elem_bytes(t.dtype) + i as u64, v));
        }
        file.write(out, (c * COPY_CHUNK) as u64, chunk).map_err(io_err(out_path))?;
    }
    Ok(())
}

/// The first NaN or infinity of a stored tensor (why [`Checkpoint::f32`] refused it).
fn find_non_finite(t: &RawTensor<'_>) -> Option<QuantizeError> {
    first_non_finite(t.dtype, t.bytes).map(|(i, v)| non_finite(t, i as u64, v))
}

fn elem_bytes(d: Dtype) -> u64 {
    (d.bitsize() / 8).max(1) as u64
}

fn non_finite(t: &RawTensor<'_>, flat: u64, value: f32) -> QuantizeError {
    let mut index = vec![0usize; t.shape.len()];
    let mut rest = flat as usize;
    for (i, &d) in t.shape.iter().enumerate().rev() {
        if d > 0 {
            index[i] = rest % d;
            rest /= d;
        }
    }
    QuantizeErrorKind::NonFinite { tensor: t.name.to_string(), index, value }.into()
}

/// The first non-finite element of little-endian float bytes (none for other dtypes).
fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<(usize, f32)> {
    let find = |size: usize, decode: &dyn Fn(&[u8]) -> f32| {
        bytes.chunks_exact(size).map(decode).enumerate().find(|(_, v)| !v.is_finite())
    };
    match dtype {
        Dtype::F32 => find(4, &|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::F16 => find(2, &|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::BF16 => find(2, &|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite())
            .map(|(i, v)| (i, v as f32)),
        _ => None,
    }
}

/// A quantized layer's stored bytes, in [`quantized_tensors`]' order, and its SNR sums.
struct Encoded {
    blobs: Vec<Vec<u8>>,
    /// Bytes of codes, scales and zero points.
    stored: u64,
    signal: f64,
    noise: f64,
}

fn f32_le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32_le(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `[N][G]` → `[G][N]`.
fn transpose<T: Copy>(v: &[T], n: usize, g: usize) -> Vec<T> {
    (0..g * n).map(|i| v[(i % n) * g + i / n]).collect()
}

/// The grid the export's format uses: the same for RTN and GPTQ.
fn grid_spec(opts: &QuantizeOptions) -> GridSpec {
    let (kind, precision) = match (opts.format, opts.asym) {
        (ExportFormat::CpuInt4, _) => (GridKind::Asymmetric, ParamPrecision::F32),
        (ExportFormat::Gptq, false) => (GridKind::Symmetric, ParamPrecision::F16),
        (ExportFormat::Gptq, true) => (GridKind::IntegerZero, ParamPrecision::F16),
    };
    GridSpec { kind, group: opts.group, search: opts.search, precision }
}

/// Quantizes `w` (`[n][k]`) round to nearest (or takes GPTQ's result, `pre`) and packs it in the export's
/// format, then decodes the packed bytes to measure the SNR of what is stored. RTN quantizes rows in
/// parallel in blocks; each row's result does not depend on the others.
fn encode(
    tensor: &str,
    w: &[f32],
    n: usize,
    k: usize,
    opts: &QuantizeOptions,
    pre: Option<&QuantMatrix>,
) -> Result<Encoded> {
    let qerr = |source: LayoutError| QuantizeErrorKind::Quantize { tensor: tensor.to_string(), source };
    let group = opts.group;
    let groups = group.groups(k);
    let rtn;
    let q = match pre {
        Some(q) => q,
        None => {
            rtn = crate::gptq_method::rtn(w, n, k, grid_spec(opts)).map_err(qerr)?;
            &rtn
        }
    };
    if q.n() != n || q.k() != k || q.params.groups() != groups {
        return Err(QuantizeErrorKind::Unstorable {
            tensor: tensor.to_string(),
            message: format!("quantized as {} x {}, but the layer is {n} x {k}", q.n(), q.k()),
        }
        .into());
    }
    let codes = &q.codes;
    let scales = q.params.scales();
    match (opts.format, &q.zero_points) {
        (ExportFormat::CpuInt4, None) => {
            let zero = q.params.zeros();
            let packed = rowmajor::pack(codes).map_err(qerr)?;
            check_params(tensor, scales)?;
            check_params(tensor, zero)?;
            let blobs = vec![packed, f32_le(scales), f32_le(zero)];
            let stored = (n * k / 2 + 8 * n * groups) as u64;
            let (signal, noise) = snr_sums(w, n, k, |row, out| decode_cpu_int4_row(&blobs, row, k, group, out));
            Ok(Encoded { blobs, stored, signal, noise })
        }
        (ExportFormat::Gptq, Some(zeros)) => {
            let zf = if opts.asym { ZeroFormat::V2 } else { ZeroFormat::V1 };
            let qweight = gptq::pack_qweight(codes).map_err(qerr)?;
            check_params(tensor, scales)?;
            let scales_gn = transpose(scales, n, groups);
            if let Some(i) = scales_gn.iter().position(|&s| !f16::from_f32(s).to_f32().is_finite()) {
                return Err(QuantizeErrorKind::Unstorable {
                    tensor: tensor.to_string(),
                    message: format!("scale {} (group {}, channel {}) overflows f16", scales_gn[i], i / n, i % n),
                }
                .into());
            }
            let qzeros = gptq::pack_qzeros(&transpose(zeros, n, groups), groups, n, zf).map_err(qerr)?;
            let scale_bytes: Vec<u8> = scales_gn.iter().flat_map(|&s| f16::from_f32(s).to_le_bytes()).collect();
            let g_idx = gptq::default_g_idx(k, group);
            let blobs = vec![i32_le(&qweight), i32_le(&qzeros), scale_bytes, i32_le(&g_idx)];
            drop(qweight);
            let stored = (n * k / 2 + 4 * groups * n / 8 + 2 * groups * n) as u64;
            let (signal, noise) = snr_sums(w, n, k, |row, out| decode_gptq_row(&blobs, row, n, k, group, zf, out));
            Ok(Encoded { blobs, stored, signal, noise })
        }
        _ => Err(QuantizeErrorKind::Unstorable {
            tensor: tensor.to_string(),
            message: "the quantized zeros do not match the format (float zeros are cpu_int4's)".into(),
        }
        .into()),
    }
}

fn check_params(tensor: &str, v: &[f32]) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(QuantizeErrorKind::Unstorable {
            tensor: tensor.to_string(),
            message: format!("a scale or zero ({}, entry {i}) is not finite: the weights are too large", v[i]),
        }
        .into()),
    }
}

fn le_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn le_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Row `row` of a `cpu_int4` layer decoded from its stored bytes: `(q − 8)·s + z` ([`dequantize`]).
fn decode_cpu_int4_row(blobs: &[Vec<u8>], row: usize, k: usize, group: GroupSize, out: &mut [f32]) {
    let (packed, scale, zero) = (&blobs[0], &blobs[1], &blobs[2]);
    let (groups, g_len) = (group.groups(k), group.len(k));
    let bytes = &packed[row * (k / 2)..(row + 1) * (k / 2)];
    for g in 0..groups {
        let (s, z) = (le_f32(scale, row * groups + g), le_f32(zero, row * groups + g));
        let (k0, k1) = (g * g_len, ((g + 1) * g_len).min(k));
        for kk in k0..k1 {
            let byte = bytes[kk / 2];
            out[kk] = dequantize(if kk % 2 == 0 { byte & 0xF } else { byte >> 4 }, s, z);
        }
    }
}

/// Row `row` of a GPTQ layer decoded from its stored bytes: `(q − z)·s`, `z` read in `zf`'s convention.
/// (K and the group size are multiples of 8, so each `qweight` word lies in one group.)
fn decode_gptq_row(
    blobs: &[Vec<u8>],
    row: usize,
    n: usize,
    k: usize,
    group: GroupSize,
    zf: ZeroFormat,
    out: &mut [f32],
) {
    let (qweight, qzeros, scales) = (&blobs[0], &blobs[1], &blobs[2]);
    let (groups, g_len) = (group.groups(k), group.len(k));
    let offset = if zf == ZeroFormat::V1 { 1 } else { 0 };
    for g in 0..groups {
        let i = g * n + row;
        let s = f16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]).to_f32();
        let z = (((le_u32(qzeros, g * (n / 8) + row / 8) >> (4 * (row % 8))) & 0xF) + offset) as f32;
        let (k0, k1) = (g * g_len, ((g + 1) * g_len).min(k));
        for r in k0 / 8..k1 / 8 {
            let word = le_u32(qweight, r * n + row);
            for (j, o) in out[8 * r..8 * r + 8].iter_mut().enumerate() {
                *o = (((word >> (4 * j)) & 0xF) as f32 - z) * s;
            }
        }
    }
}

/// `(Σw², Σ(w − ŵ)²)` in f64: per row (rows in parallel), then over rows in order.
fn snr_sums(w: &[f32], n: usize, k: usize, decode: impl Fn(usize, &mut [f32]) + Sync) -> (f64, f64) {
    let per_row: Vec<(f64, f64)> = (0..n)
        .into_par_iter()
        .map_init(
            || vec![0.0f32; k],
            |buf, row| {
                decode(row, buf);
                let src = &w[row * k..(row + 1) * k];
                let mut s = 0.0f64;
                let mut e = 0.0f64;
                for (&a, &b) in src.iter().zip(buf.iter()) {
                    s += f64::from(a) * f64::from(a);
                    let d = f64::from(a) - f64::from(b);
                    e += d * d;
                }
                (s, e)
            },
        )
        .collect();
    per_row.iter().fold((0.0, 0.0), |(s, e), (a, b)| (s + a, e + b))
}

/// `10·log10(signal/noise)`; `None` when there is no noise.
pub fn snr_db(signal: f64, noise: f64) -> Option<f64> {
    (noise > 0.0).then(|| 10.0 * (signal / noise).log10())
}

fn layer_report(
    part: &LinearPart,
    src: &RawTensor<'_>,
    e: &Encoded,
    opts: &QuantizeOptions,
    solved: Option<&Solved>,
) -> TensorReport {
    let weights = (part.n * part.k) as f64;
    TensorReport {
        name: part.prefix.clone(),
        source: part.source.clone(),
        source_dtype: dtype_name(src.dtype),
        shape: [part.n, part.k],
        snr_db: snr_db(e.signal, e.noise),
        signal: e.signal,
        noise: e.noise,
        bits_per_weight: e.stored as f64 * 8.0 / weights,
        stored_bytes: e.stored,
        group_size: opts.group.to_checkpoint(),
        search: opts.search == ScaleSearch::Shrink,
        format: match opts.zero_format() {
            None => "cpu_int4".into(),
            Some(z) => z.as_checkpoint_format().into(),
        },
        method: if solved.is_some() { Method::Gptq } else { Method::Rtn }.name().into(),
        output_snr_db: solved.and_then(|s| s.output_snr_db),
        rtn_output_snr_db: solved.and_then(|s| s.rtn_output_snr_db),
    }
}

fn totals(
    tensors: &[TensorReport],
    copied: &[CopiedTensor],
    input_bytes: u64,
    output_bytes: u64,
    started: Instant,
    peak_rss: Option<u64>,
) -> QuantizeTotals {
    let weights: u64 = tensors.iter().map(|t| (t.shape[0] * t.shape[1]) as u64).sum();
    let stored: u64 = tensors.iter().map(|t| t.stored_bytes).sum();
    let (signal, noise) = tensors.iter().fold((0.0, 0.0), |(s, e), t| (s + t.signal, e + t.noise));
    let worst = tensors.iter().filter_map(|t| t.snr_db.map(|s| (s, &t.name))).min_by(|a, b| a.0.total_cmp(&b.0));
    QuantizeTotals {
        quantized_tensors: tensors.len(),
        quantized_weights: weights,
        quantized_bytes: stored,
        bits_per_weight: if weights == 0 { 0.0 } else { stored as f64 * 8.0 / weights as f64 },
        snr_db: snr_db(signal, noise),
        min_snr_db: worst.map(|w| w.0),
        worst_tensor: worst.map(|w| w.1.clone()),
        copied_tensors: copied.len(),
        copied_bytes: copied.iter().map(|c| c.bytes).sum(),
        input_bytes,
        output_bytes,
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_anon_bytes: peak_rss,
    }
}

/// This process's anonymous resident memory (Linux `RssAnon`), if readable.
fn rss_anon_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s.lines().find(|l| l.starts_with("RssAnon:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn errors_keep_their_source_and_read_as_before() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = QuantizeError::from(QuantizeErrorKind::Io { path: "m/config.json".into(), source: io });
        assert_eq!(e.to_string(), "m/config.json: no such file");
        assert!(e.source().is_some_and(|s| s.to_string() == "no such file"));

        // Reading JSON that does not parse, and writing a value that cannot be JSON.
        let bad = serde_json::from_str::<Value>("{").unwrap_err();
        let e = QuantizeError::from(QuantizeErrorKind::Json { path: "m/config.json".into(), source: bad });
        assert!(e.to_string().starts_with("m/config.json: not valid JSON: "), "{e}");
        assert!(e.source().is_some());
        let bad = serde_json::to_string(&HashMap::from([(vec![1u8], 1u8)])).unwrap_err();
        let e = QuantizeError::from(QuantizeErrorKind::Json { path: "out/config.json".into(), source: bad });
        assert_eq!(e.to_string(), "out/config.json: key must be a string");

        let bad = serde_json::from_slice::<Value>(b"{").unwrap_err();
        let e =
            QuantizeError::from(QuantizeErrorKind::Header { path: "m.safetensors".into(), entry: None, source: bad });
        assert!(e.to_string().starts_with("m.safetensors: bad safetensors header: "), "{e}");

        // A runtime error the GPTQ method met is the input's, kept whole; GPTQ's own stay GPTQ's.
        let model = ModelConfig::from_json("{}").unwrap_err();
        let shown = model.to_string();
        let e = QuantizeError::from(GptqError::from(GptqErrorKind::Model(model)));
        assert!(matches!(e.kind(), QuantizeErrorKind::Model(m) if m.context() == "config.json"), "{e:?}");
        assert_eq!(e.to_string(), shown);
        assert!(e.source().is_some_and(|s| s.to_string() == shown));
        let e = QuantizeError::from(GptqError::from(GptqErrorKind::NoCalibration));
        assert!(matches!(e.kind(), QuantizeErrorKind::Gptq(g) if matches!(g.kind(), GptqErrorKind::NoCalibration)));
        assert!(e.source().is_some());

        let refused = int4_layout::Codes::new(2, 3, vec![0; 5]).unwrap_err();
        let e = QuantizeError::from(QuantizeErrorKind::Quantize { tensor: "lm_head".into(), source: refused });
        assert!(e.to_string().starts_with("lm_head: "), "{e}");
        assert!(e.source().is_some());
    }
}
