//! Converting a Llama-architecture GGUF into a Hugging Face style model directory.
//!
//! The project's default model (SmolLM2-135M-Instruct) is published as a Q4_1 GGUF; the runtime reads
//! Hugging Face checkpoints. [`gguf_to_hf`] bridges the two once, at fetch time, writing:
//!
//! * `model.safetensors` — every tensor dequantized exactly to f32 ([`GgufFile::tensor_f32`]) under its
//!   Hugging Face name and shape. A GGUF `[in, out]` tensor (`dims[0]` contiguous) has the bytes of a
//!   row-major `[out, in]` matrix, so nothing is transposed; but llama.cpp's `convert_hf_to_gguf.py`
//!   interleaves the rows of `q_proj`/`k_proj` for its rotary convention, and that is undone
//!   ([`unpermute_qk`]);
//! * `config.json` (`LlamaForCausalLM`), `tokenizer.json` (a byte-level BPE for the `tokenizers` crate,
//!   rebuilt from the GGUF vocabulary, merges and token types), `tokenizer_config.json` (with the chat
//!   template) and `generation_config.json`.
//!
//! The conversion is strict: an unknown tensor name, a missing tensor, a shape that disagrees with the
//! hyperparameters, a tokenizer other than GPT-2 BPE, or rope scaling is an error ([`ConvertError`]) rather
//! than a silently wrong model. Each output file is written beside its final name and renamed into place.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::{Value, json};

use int4_safetensors::{Dtype, FileLayout, FileWriter, TensorEntry};

use crate::file::{GgmlType, GgufError, GgufFile, GgufValue, QuantBlocks};

/// The version of this converter's output, recorded in the `model.safetensors` it writes.
pub const CONVERTER_VERSION: u32 = 2;

/// Why a conversion failed.
#[derive(Debug)]
pub struct ConvertError {
    path: PathBuf,
    kind: ConvertErrorKind,
    field: String,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConvertErrorKind {
    /// The GGUF could not be read (the inner error names file and field).
    Gguf(Box<GgufError>),
    /// An output file could not be written.
    Io(std::io::Error),
    /// An output could not be serialized as JSON (a value JSON cannot hold, such as a NaN).
    Json(serde_json::Error),
    /// A required metadata key or tensor is absent.
    Missing,
    /// A metadata value of the wrong type.
    WrongValueType {
        /// What was expected (`"unsigned integer"`…).
        expected: &'static str,
        /// The GGUF type found.
        found: &'static str,
    },
    /// Something valid GGUF that this converter does not handle (the text says what).
    Unsupported(String),
    /// A value or shape that contradicts the rest of the model (the text says how).
    Invalid(String),
}

impl ConvertError {
    fn new(path: &Path, kind: ConvertErrorKind, field: impl Into<String>) -> Self {
        ConvertError { path: path.to_path_buf(), kind, field: field.into() }
    }

    /// What went wrong.
    pub fn kind(&self) -> &ConvertErrorKind {
        &self.kind
    }

    /// The file concerned (the GGUF, or the output file that could not be written).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata key, tensor or output concerned.
    pub fn field(&self) -> &str {
        &self.field
    }
}

impl From<GgufError> for ConvertError {
    fn from(e: GgufError) -> Self {
        let (path, field) = (e.path().to_path_buf(), e.field().to_string());
        ConvertError { path, kind: ConvertErrorKind::Gguf(Box::new(e)), field }
    }
}

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let ConvertErrorKind::Gguf(e) = &self.kind {
            return write!(f, "{e}");
        }
        write!(f, "{}: ", self.path.display())?;
        match &self.kind {
            ConvertErrorKind::Gguf(_) => unreachable!("handled above"),
            ConvertErrorKind::Io(e) => write!(f, "cannot write: {e}")?,
            ConvertErrorKind::Json(e) => write!(f, "cannot serialize: {e}")?,
            ConvertErrorKind::Missing => write!(f, "required but absent")?,
            ConvertErrorKind::WrongValueType { expected, found } => write!(f, "expected {expected}, found {found}")?,
            ConvertErrorKind::Unsupported(m) | ConvertErrorKind::Invalid(m) => write!(f, "{m}")?,
        }
        write!(f, " ({})", self.field)
    }
}

impl std::error::Error for ConvertError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ConvertErrorKind::Gguf(e) => Some(e.as_ref()),
            ConvertErrorKind::Io(e) => Some(e),
            ConvertErrorKind::Json(e) => Some(e),
            _ => None,
        }
    }
}

/// One tensor written to `model.safetensors`.
#[derive(Clone, Debug)]
pub struct ConvertedTensor {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub gguf_name: String,
    /// The Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub hf_name: String,
    /// The type the GGUF stored it in.
    pub ggml_type: GgmlType,
    /// The Hugging Face shape (`[out, in]` for a weight).
    pub shape: Vec<usize>,
    /// Whether llama.cpp's Q/K row permutation was undone.
    pub unpermuted: bool,
}

/// What [`gguf_to_hf`] wrote.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    /// The output directory.
    pub out_dir: PathBuf,
    /// Every tensor, in the order written.
    pub tensors: Vec<ConvertedTensor>,
    /// Total elements (parameters) written.
    pub n_elements: u64,
    /// Size of `model.safetensors` in bytes.
    pub safetensors_bytes: u64,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// BPE merges.
    pub n_merges: usize,
    /// The control tokens (GGUF token type 3), written as special added tokens: `(id, text)`.
    pub special_tokens: Vec<(u32, String)>,
}

impl ConvertReport {
    /// How many tensors the GGUF stored in each type, most common first.
    pub fn type_counts(&self) -> Vec<(GgmlType, usize)> {
        let mut counts: Vec<(GgmlType, usize)> = Vec::new();
        for t in &self.tensors {
            match counts.iter_mut().find(|(ty, _)| *ty == t.ggml_type) {
                Some((_, n)) => *n += 1,
                None => counts.push((t.ggml_type, 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.id().cmp(&b.0.id())));
        counts
    }
}

/// The Llama hyperparameters read from GGUF metadata.
#[derive(Clone, Debug)]
struct Hparams {
    hidden: u64,
    ff: u64,
    n_layers: u64,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    eps: f64,
    rope_theta: f64,
    context: u64,
}

/// Which rows permutation a tensor needs undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Permute {
    None,
    /// Undo with this many heads.
    Heads(u64),
}

/// A planned output tensor.
struct Planned<'a> {
    gguf_name: &'a str,
    hf_name: String,
    ggml_type: GgmlType,
    /// Expected GGUF dims.
    dims: Vec<u64>,
    permute: Permute,
}

/// One tensor of a [`GgufModel`], under its Hugging Face name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub gguf_name: String,
    /// The Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub hf_name: String,
    /// The type the GGUF stores it in.
    pub ggml_type: GgmlType,
    /// The Hugging Face shape (`[out, in]` for a weight, row-major).
    pub shape: Vec<usize>,
    /// For `q_proj`/`k_proj`: the heads whose rows llama.cpp interleaved (undone when read).
    pub qk_heads: Option<usize>,
}

/// A Llama-architecture GGUF seen as a Hugging Face checkpoint: its tensors under Hugging Face names and
/// shapes (the Q/K rows back in Hugging Face order), and the `config.json`, `tokenizer.json`,
/// `tokenizer_config.json` and `generation_config.json` its metadata makes. Opening checks the
/// architecture, the hyperparameters, the tokenizer and every tensor's name and shape; reading a tensor
/// reads it from the mapped file, one at a time.
pub struct GgufModel {
    file: GgufFile,
    hp: Hparams,
    tok: TokenizerData,
    tensors: Vec<GgufTensor>,
    by_hf_name: HashMap<String, usize>,
    tied: bool,
}

impl fmt::Debug for GgufModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufModel")
            .field("path", &self.file.path())
            .field("tensors", &self.tensors.len())
            .field("tied", &self.tied)
            .finish_non_exhaustive()
    }
}

impl GgufModel {
    /// Maps and checks the GGUF at `path`.
    pub fn open(path: &Path) -> Result<Self, ConvertError> {
        Self::from_file(GgufFile::open(path)?)
    }

    /// Checks an opened GGUF: a Llama architecture, hyperparameters, a GPT-2 BPE tokenizer, and every
    /// tensor named and shaped as the hyperparameters say.
    pub fn from_file(file: GgufFile) -> Result<Self, ConvertError> {
        let meta = Meta { file: &file };
        let arch = meta.req_str("general.architecture")?;
        if arch != "llama" {
            return Err(meta.unsupported("general.architecture", format!("architecture {arch:?} (only \"llama\")")));
        }
        let hp = read_hparams(&meta)?;
        let tok = read_tokenizer(&meta)?;
        let tensors: Vec<GgufTensor> = plan_tensors(&file, &hp, tok.tokens.len() as u64)?
            .into_iter()
            .map(|p| GgufTensor {
                gguf_name: p.gguf_name.to_string(),
                hf_name: p.hf_name,
                ggml_type: p.ggml_type,
                shape: p.dims.iter().rev().map(|&d| d as usize).collect(),
                qk_heads: match p.permute {
                    Permute::Heads(h) => Some(h as usize),
                    Permute::None => None,
                },
            })
            .collect();
        let by_hf_name = tensors.iter().enumerate().map(|(i, t)| (t.hf_name.clone(), i)).collect();
        let tied = file.tensor("output.weight").is_none();
        Ok(GgufModel { file, hp, tok, tensors, by_hf_name, tied })
    }

    /// The file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Every tensor, embeddings first, then layer by layer, the final norm and the head last.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The tensor with Hugging Face name `hf_name`.
    pub fn tensor(&self, hf_name: &str) -> Option<&GgufTensor> {
        self.by_hf_name.get(hf_name).map(|&i| &self.tensors[i])
    }

    /// Whether the head shares the embedding (the file has no `output.weight`).
    pub fn is_tied(&self) -> bool {
        self.tied
    }

    fn find(&self, hf_name: &str) -> Result<&GgufTensor, ConvertError> {
        self.tensor(hf_name).ok_or_else(|| ConvertError::new(self.file.path(), ConvertErrorKind::Missing, hf_name))
    }

    /// Tensor `hf_name` dequantized to f32 ([`GgufFile::tensor_f32`]), row-major in its Hugging Face shape.
    pub fn tensor_f32(&self, hf_name: &str) -> Result<Vec<f32>, ConvertError> {
        let t = self.find(hf_name)?;
        let values = self.file.tensor_f32(&t.gguf_name)?;
        Ok(match t.qk_heads {
            Some(heads) => unpermute_qk(&values, heads, t.shape[0], t.shape[1]),
            None => values,
        })
    }

    /// The codes and block parameters of block-quantized tensor `hf_name` ([`GgufFile::blocks`]), its
    /// rows in Hugging Face order: codes `[rows][cols]`, `d` and `m` `[rows][cols / 32]`.
    pub fn blocks(&self, hf_name: &str) -> Result<QuantBlocks, ConvertError> {
        let t = self.find(hf_name)?;
        let mut b = self.file.blocks(&t.gguf_name)?;
        if let Some(heads) = t.qk_heads {
            let (rows, cols) = (t.shape[0], t.shape[1]);
            let unpermute = |v: &[f32]| swap_axes_1_2(v, [heads, rows / heads / 2, 2, cols / 32]);
            b.codes = swap_axes_1_2(&b.codes, [heads, rows / heads / 2, 2, cols]);
            b.d = unpermute(&b.d);
            b.m = b.m.as_deref().map(unpermute);
        }
        Ok(b)
    }

    /// The `config.json` of the model (`LlamaForCausalLM`).
    pub fn config_json(&self) -> Value {
        config_json(&self.hp, &self.tok, self.tied)
    }

    /// The `tokenizer.json` of the model: a byte-level BPE for the `tokenizers` crate, rebuilt from the
    /// vocabulary, merges and token types.
    pub fn tokenizer_json(&self) -> Result<Vec<u8>, ConvertError> {
        let path = self.file.path();
        serde_json::to_vec(&tokenizer_json(&self.tok, path)?)
            .map_err(|e| ConvertError::new(path, ConvertErrorKind::Json(e), "tokenizer.json"))
    }

    /// The `tokenizer_config.json` (special tokens and the chat template, if the file has one).
    pub fn tokenizer_config_json(&self) -> Value {
        tokenizer_config_json(&self.tok, self.hp.context)
    }

    /// The `generation_config.json` (BOS, EOS and padding ids).
    pub fn generation_config_json(&self) -> Value {
        let mut generation = serde_json::Map::new();
        generation.insert("bos_token_id".into(), json!(self.tok.bos));
        generation.insert("eos_token_id".into(), json!(self.tok.eos));
        if let Some(pad) = self.tok.pad {
            generation.insert("pad_token_id".into(), json!(pad));
        }
        Value::Object(generation)
    }

    /// The control tokens (GGUF token type 3): `(id, text)`.
    pub fn special_tokens(&self) -> Vec<(u32, String)> {
        self.tok
            .token_types
            .iter()
            .enumerate()
            .filter(|&(_, &t)| t == TOKEN_TYPE_CONTROL)
            .map(|(i, _)| (i as u32, self.tok.tokens[i].clone()))
            .collect()
    }
}

/// Converts the Llama-architecture GGUF at `gguf` into a Hugging Face style directory `out_dir` (created if
/// needed; files already there are replaced): `model.safetensors` (f32), `config.json`, `tokenizer.json`,
/// `tokenizer_config.json` and `generation_config.json`.
pub fn gguf_to_hf(gguf: &Path, out_dir: &Path) -> Result<ConvertReport, ConvertError> {
    let model = GgufModel::open(gguf)?;
    std::fs::create_dir_all(out_dir).map_err(|e| io_err(out_dir, e))?;
    let (tensors, n_elements, safetensors_bytes) = write_safetensors(&model, &out_dir.join("model.safetensors"))?;
    write_json(&out_dir.join("config.json"), &model.config_json())?;
    write_json(&out_dir.join("tokenizer.json"), &tokenizer_json(&model.tok, gguf)?)?;
    write_json(&out_dir.join("tokenizer_config.json"), &model.tokenizer_config_json())?;
    write_json(&out_dir.join("generation_config.json"), &model.generation_config_json())?;
    Ok(ConvertReport {
        out_dir: out_dir.to_path_buf(),
        tensors,
        n_elements,
        safetensors_bytes,
        vocab_size: model.tok.tokens.len(),
        n_merges: model.tok.merges.len(),
        special_tokens: model.special_tokens(),
    })
}

/// Typed access to the metadata, with errors naming the file and key.
struct Meta<'a> {
    file: &'a GgufFile,
}

impl Meta<'_> {
    fn path(&self) -> &Path {
        self.file.path()
    }

    fn req(&self, key: &str) -> Result<&GgufValue, ConvertError> {
        self.file.metadata(key).ok_or_else(|| ConvertError::new(self.path(), ConvertErrorKind::Missing, key))
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &GgufValue) -> ConvertError {
        ConvertError::new(self.path(), ConvertErrorKind::WrongValueType { expected, found: v.type_name() }, key)
    }

    fn unsupported(&self, key: &str, what: String) -> ConvertError {
        ConvertError::new(self.path(), ConvertErrorKind::Unsupported(what), key)
    }

    fn invalid(&self, key: &str, what: String) -> ConvertError {
        ConvertError::new(self.path(), ConvertErrorKind::Invalid(what), key)
    }

    fn req_str(&self, key: &str) -> Result<&str, ConvertError> {
        let v = self.req(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "string", v))
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>, ConvertError> {
        match self.file.metadata(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "string", v)),
        }
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, ConvertError> {
        match self.file.metadata(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(key, "unsigned integer", v)),
        }
    }

    /// A required count that must be positive.
    fn req_count(&self, key: &str) -> Result<u64, ConvertError> {
        match self.opt_u64(key)? {
            None => Err(ConvertError::new(self.path(), ConvertErrorKind::Missing, key)),
            Some(0) => Err(self.invalid(key, "must be positive".into())),
            Some(n) => Ok(n),
        }
    }

    /// A float stored as f32 in GGUF, returned as the f64 of its shortest decimal form (an f32 `1e-5` is
    /// written to JSON as `1e-5`, not `9.999999747378752e-6`).
    fn opt_float(&self, key: &str) -> Result<Option<f64>, ConvertError> {
        match self.file.metadata(key) {
            None => Ok(None),
            Some(GgufValue::F32(x)) => Ok(Some(x.to_string().parse::<f64>().unwrap_or(f64::from(*x)))),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.wrong(key, "number", v)),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConvertError> {
        match self.file.metadata(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "bool", v)),
        }
    }

    fn req_array(&self, key: &str) -> Result<&[GgufValue], ConvertError> {
        let v = self.req(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, "array", v))
    }
}

fn read_hparams(meta: &Meta<'_>) -> Result<Hparams, ConvertError> {
    let hidden = meta.req_count("llama.embedding_length")?;
    let ff = meta.req_count("llama.feed_forward_length")?;
    let n_layers = meta.req_count("llama.block_count")?;
    // Nine tensors per block: a count the file cannot hold is refused before anything is sized by it.
    let tensors = meta.file.tensors().len() as u64;
    if n_layers > tensors / 9 {
        let m = format!("{n_layers} blocks, but the file holds {tensors} tensors (9 per block)");
        return Err(meta.invalid("llama.block_count", m));
    }
    let n_head = meta.req_count("llama.attention.head_count")?;
    let n_head_kv = match meta.opt_u64("llama.attention.head_count_kv")? {
        None => n_head,
        Some(0) => return Err(meta.invalid("llama.attention.head_count_kv", "must be positive".into())),
        Some(n) => n,
    };
    if !n_head.is_multiple_of(n_head_kv) {
        let m = format!("{n_head} attention heads are not a multiple of {n_head_kv} key/value heads");
        return Err(meta.invalid("llama.attention.head_count_kv", m));
    }
    let head_dim = match meta.opt_u64("llama.attention.key_length")? {
        Some(k) => k,
        None if hidden.is_multiple_of(n_head) => hidden / n_head,
        None => {
            let m = format!("hidden size {hidden} is not a multiple of {n_head} heads");
            return Err(meta.invalid("llama.attention.head_count", m));
        }
    };
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(meta.invalid("llama.attention.key_length", format!("head dim {head_dim} must be even")));
    }
    if let Some(v) = meta.opt_u64("llama.attention.value_length")?
        && v != head_dim
    {
        let m = format!("value length {v} differs from key length {head_dim}");
        return Err(meta.unsupported("llama.attention.value_length", m));
    }
    if let Some(r) = meta.opt_u64("llama.rope.dimension_count")?
        && r != head_dim
    {
        let m = format!("rotary dimension {r} differs from head dim {head_dim} (partial rotary)");
        return Err(meta.unsupported("llama.rope.dimension_count", m));
    }
    if let Some(s) = meta.opt_str("llama.rope.scaling.type")?
        && s != "none"
    {
        return Err(meta.unsupported("llama.rope.scaling.type", format!("rope scaling {s:?}")));
    }
    let eps = meta.opt_float("llama.attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
        ConvertError::new(meta.path(), ConvertErrorKind::Missing, "llama.attention.layer_norm_rms_epsilon")
    })?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(meta.invalid("llama.attention.layer_norm_rms_epsilon", format!("{eps} is not a finite epsilon")));
    }
    let rope_theta = meta.opt_float("llama.rope.freq_base")?.unwrap_or(10000.0);
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return Err(meta.invalid("llama.rope.freq_base", format!("{rope_theta} is not a positive finite base")));
    }
    let context = meta.req_count("llama.context_length")?;
    Ok(Hparams { hidden, ff, n_layers, n_head, n_head_kv, head_dim, eps, rope_theta, context })
}

/// GGUF token type of control tokens (`LLAMA_TOKEN_TYPE_CONTROL`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined added tokens (`LLAMA_TOKEN_TYPE_USER_DEFINED`).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The tokenizer read from GGUF metadata.
struct TokenizerData {
    /// `tokenizer.ggml.pre`.
    pre: String,
    tokens: Vec<String>,
    token_types: Vec<i64>,
    merges: Vec<(String, String)>,
    bos: Option<u64>,
    eos: Option<u64>,
    unk: Option<u64>,
    pad: Option<u64>,
    add_bos: bool,
    chat_template: Option<String>,
}

fn read_tokenizer(meta: &Meta<'_>) -> Result<TokenizerData, ConvertError> {
    let model = meta.req_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(meta.unsupported("tokenizer.ggml.model", format!("tokenizer {model:?} (only \"gpt2\" BPE)")));
    }
    let pre = meta.opt_str("tokenizer.ggml.pre")?.unwrap_or("gpt-2").to_string();
    if pre_tokenizer_json(&pre).is_none() {
        let m = format!("pre-tokenizer {pre:?} (known: \"smollm\", \"starcoder\", \"gpt-2\")");
        return Err(meta.unsupported("tokenizer.ggml.pre", m));
    }

    let key = "tokenizer.ggml.tokens";
    let raw = meta.req_array(key)?;
    let mut tokens = Vec::with_capacity(raw.len());
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(raw.len());
    for (i, v) in raw.iter().enumerate() {
        let s = v.as_str().ok_or_else(|| meta.wrong(key, "array of strings", v))?;
        if let Some(j) = index.insert(s, i) {
            return Err(meta.invalid(key, format!("token {s:?} appears twice (ids {j} and {i})")));
        }
        tokens.push(s.to_string());
    }
    if tokens.is_empty() {
        return Err(meta.invalid(key, "empty vocabulary".into()));
    }

    let key = "tokenizer.ggml.token_type";
    let token_types = match meta.file.metadata(key) {
        None => vec![1; tokens.len()],
        Some(v) => {
            let a = v.as_array().ok_or_else(|| meta.wrong(key, "array", v))?;
            let types: Vec<i64> = a
                .iter()
                .map(|t| t.as_i64().ok_or_else(|| meta.wrong(key, "array of integers", t)))
                .collect::<Result<_, _>>()?;
            if types.len() != tokens.len() {
                return Err(meta.invalid(key, format!("{} types for {} tokens", types.len(), tokens.len())));
            }
            types
        }
    };

    let key = "tokenizer.ggml.merges";
    let raw = meta.req_array(key)?;
    let mut merges = Vec::with_capacity(raw.len());
    for (i, v) in raw.iter().enumerate() {
        let s = v.as_str().ok_or_else(|| meta.wrong(key, "array of strings", v))?;
        let pair = s.split_once(' ').filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '));
        let Some((a, b)) = pair else {
            return Err(meta.invalid(key, format!("merge #{i} {s:?} is not two tokens separated by one space")));
        };
        merges.push((a.to_string(), b.to_string()));
    }

    let id = |key: &str| -> Result<Option<u64>, ConvertError> {
        match meta.opt_u64(key)? {
            Some(id) if id >= tokens.len() as u64 => {
                Err(meta.invalid(key, format!("token id {id} is outside the vocabulary of {}", tokens.len())))
            }
            other => Ok(other),
        }
    };
    let (bos, eos) = (id("tokenizer.ggml.bos_token_id")?, id("tokenizer.ggml.eos_token_id")?);
    let (unk, pad) = (id("tokenizer.ggml.unknown_token_id")?, id("tokenizer.ggml.padding_token_id")?);
    let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    if add_bos {
        let m = "a GPT-2 BPE tokenizer that adds BOS (not needed by the project's models)".to_string();
        return Err(meta.unsupported("tokenizer.ggml.add_bos_token", m));
    }
    if meta.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false) {
        let m = "a tokenizer that adds EOS".to_string();
        return Err(meta.unsupported("tokenizer.ggml.add_eos_token", m));
    }
    let chat_template = meta.opt_str("tokenizer.chat_template")?.map(str::to_string);
    Ok(TokenizerData { pre, tokens, token_types, merges, bos, eos, unk, pad, add_bos, chat_template })
}

/// Maps every GGUF tensor to its Hugging Face name, checking the set is complete and each shape agrees with
/// the hyperparameters.
fn plan_tensors<'a>(file: &'a GgufFile, hp: &Hparams, vocab: u64) -> Result<Vec<Planned<'a>>, ConvertError> {
    let q_out = hp.n_head * hp.head_dim;
    let kv_out = hp.n_head_kv * hp.head_dim;
    let mut plan: Vec<(u64, usize, Planned<'a>)> = Vec::with_capacity(file.tensors().len());
    for t in file.tensors() {
        let name = t.name.as_str();
        let unknown = || {
            let m = "a tensor this Llama converter does not know (bias, rope factors, other architecture?)";
            ConvertError::new(file.path(), ConvertErrorKind::Unsupported(m.into()), name)
        };
        // (sort key: layer (embeddings first, final norm and head last), position within the layer)
        let (layer, pos, hf_name, dims, permute) = match name {
            "token_embd.weight" => {
                (0, 0, "model.embed_tokens.weight".to_string(), vec![hp.hidden, vocab], Permute::None)
            }
            "output_norm.weight" => (u64::MAX, 0, "model.norm.weight".to_string(), vec![hp.hidden], Permute::None),
            "output.weight" => (u64::MAX, 1, "lm_head.weight".to_string(), vec![hp.hidden, vocab], Permute::None),
            _ => {
                let rest = name.strip_prefix("blk.").ok_or_else(unknown)?;
                let (i, part) = rest.split_once('.').ok_or_else(unknown)?;
                let i_text = i;
                let i: u64 = i.parse().map_err(|_| unknown())?;
                if i >= hp.n_layers || i.to_string() != i_text {
                    return Err(unknown());
                }
                let (pos, hf, dims, permute) = match part {
                    "attn_q.weight" => {
                        (0, "self_attn.q_proj.weight", vec![hp.hidden, q_out], Permute::Heads(hp.n_head))
                    }
                    "attn_k.weight" => {
                        (1, "self_attn.k_proj.weight", vec![hp.hidden, kv_out], Permute::Heads(hp.n_head_kv))
                    }
                    "attn_v.weight" => (2, "self_attn.v_proj.weight", vec![hp.hidden, kv_out], Permute::None),
                    "attn_output.weight" => (3, "self_attn.o_proj.weight", vec![q_out, hp.hidden], Permute::None),
                    "ffn_gate.weight" => (4, "mlp.gate_proj.weight", vec![hp.hidden, hp.ff], Permute::None),
                    "ffn_up.weight" => (5, "mlp.up_proj.weight", vec![hp.hidden, hp.ff], Permute::None),
                    "ffn_down.weight" => (6, "mlp.down_proj.weight", vec![hp.ff, hp.hidden], Permute::None),
                    "attn_norm.weight" => (7, "input_layernorm.weight", vec![hp.hidden], Permute::None),
                    "ffn_norm.weight" => (8, "post_attention_layernorm.weight", vec![hp.hidden], Permute::None),
                    _ => return Err(unknown()),
                };
                (i + 1, pos, format!("model.layers.{i}.{hf}"), dims, permute)
            }
        };
        if t.dims != dims {
            let m = format!("GGUF dims {:?}, expected {dims:?} from the hyperparameters and vocabulary", t.dims);
            return Err(ConvertError::new(file.path(), ConvertErrorKind::Invalid(m), name));
        }
        plan.push((layer, pos, Planned { gguf_name: name, hf_name, ggml_type: t.ggml_type, dims, permute }));
    }
    plan.sort_by_key(|(layer, pos, _)| (*layer, *pos));

    let mut expected: Vec<String> = vec!["token_embd.weight".into(), "output_norm.weight".into()];
    for i in 0..hp.n_layers {
        for part in
            ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm"]
        {
            expected.push(format!("blk.{i}.{part}.weight"));
        }
    }
    for name in expected {
        if file.tensor(&name).is_none() {
            return Err(ConvertError::new(file.path(), ConvertErrorKind::Missing, name));
        }
    }
    Ok(plan.into_iter().map(|(_, _, p)| p).collect())
}

/// Writes `model.safetensors` by hand, streaming one tensor at a time (the f32 model is several times the
/// GGUF; holding all of it at once is not needed). Returns the tensors, total elements and file size.
fn write_safetensors(model: &GgufModel, path: &Path) -> Result<(Vec<ConvertedTensor>, u64, u64), ConvertError> {
    let mut converted = Vec::with_capacity(model.tensors.len());
    let mut entries = Vec::with_capacity(model.tensors.len());
    for t in &model.tensors {
        entries.push(TensorEntry { name: t.hf_name.clone(), dtype: Dtype::F32, shape: t.shape.clone() });
        converted.push(ConvertedTensor {
            gguf_name: t.gguf_name.clone(),
            hf_name: t.hf_name.clone(),
            ggml_type: t.ggml_type,
            shape: t.shape.clone(),
            unpermuted: t.qk_heads.is_some(),
        });
    }
    let converter = format!("int4 gguf_to_hf v{CONVERTER_VERSION}");
    let layout = FileLayout::new(&[("format", "pt"), ("source", "gguf"), ("converter", &converter)], entries);
    let n_elements = layout.entries().iter().map(|e| e.len_bytes() / 4).sum();
    let file_len = layout.file_len();
    let tmp = tmp_path(path);
    let result = (|| -> Result<(), ConvertError> {
        let io = |e| io_err(&tmp, e);
        let mut w = FileWriter::create(&tmp, layout).map_err(io)?;
        for (i, t) in model.tensors.iter().enumerate() {
            let values = model.tensor_f32(&t.hf_name)?;
            let mut buf = Vec::with_capacity(1 << 16);
            for (c, chunk) in values.chunks(1 << 14).enumerate() {
                buf.clear();
                buf.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
                w.write(i, (c << 14) as u64 * 4, &buf).map_err(io)?;
            }
        }
        w.finish().map_err(io)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
    Ok((converted, n_elements, file_len))
}

/// Undoes llama.cpp's Q/K row permutation on a row-major `[rows, cols]` matrix (`rows = n_head × head_dim`).
///
/// `convert_hf_to_gguf.py` stores `w.reshape(n_head, 2, head_dim / 2, cols).swapaxes(1, 2).reshape(rows,
/// cols)` (GGUF row `h·head_dim + 2i + t` is Hugging Face row `h·head_dim + t·head_dim/2 + i`), so that
/// ggml's rotary embedding can rotate adjacent pairs; the inverse views the GGUF rows as
/// `(n_head, head_dim / 2, 2, cols)` and swaps axes 1 and 2 back. `rows` must be a multiple of `2 n_head`
/// and `w.len()` must be `rows × cols` (checked by the caller; panics otherwise).
pub fn unpermute_qk(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    assert!(n_head > 0 && rows.is_multiple_of(2 * n_head) && w.len() == rows * cols, "unpermute_qk: bad shape");
    swap_axes_1_2(w, [n_head, rows / n_head / 2, 2, cols])
}

/// llama.cpp's Q/K row permutation (Hugging Face → GGUF), the inverse of [`unpermute_qk`]: views the rows
/// as `(n_head, 2, head_dim / 2, cols)` and swaps axes 1 and 2. Same shape requirements.
pub fn permute_qk(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    assert!(n_head > 0 && rows.is_multiple_of(2 * n_head) && w.len() == rows * cols, "permute_qk: bad shape");
    swap_axes_1_2(w, [n_head, 2, rows / n_head / 2, cols])
}

/// Swaps axes 1 and 2 of a row-major 4-D array of shape `[a, b, c, d]`, giving shape `[a, c, b, d]`.
fn swap_axes_1_2<T: Copy>(src: &[T], [a, b, c, d]: [usize; 4]) -> Vec<T> {
    let mut out = Vec::with_capacity(src.len());
    for i in 0..a {
        for k in 0..c {
            for j in 0..b {
                let start = ((i * b + j) * c + k) * d;
                out.extend_from_slice(&src[start..start + d]);
            }
        }
    }
    out
}

fn config_json(hp: &Hparams, tok: &TokenizerData, tied: bool) -> Value {
    let mut c = serde_json::Map::new();
    c.insert("architectures".into(), json!(["LlamaForCausalLM"]));
    c.insert("model_type".into(), json!("llama"));
    c.insert("hidden_size".into(), json!(hp.hidden));
    c.insert("intermediate_size".into(), json!(hp.ff));
    c.insert("num_hidden_layers".into(), json!(hp.n_layers));
    c.insert("num_attention_heads".into(), json!(hp.n_head));
    c.insert("num_key_value_heads".into(), json!(hp.n_head_kv));
    c.insert("head_dim".into(), json!(hp.head_dim));
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("rms_norm_eps".into(), json!(hp.eps));
    c.insert("rope_theta".into(), json!(hp.rope_theta));
    c.insert("rope_scaling".into(), Value::Null);
    c.insert("max_position_embeddings".into(), json!(hp.context));
    c.insert("vocab_size".into(), json!(tok.tokens.len()));
    c.insert("tie_word_embeddings".into(), json!(tied));
    c.insert("attention_bias".into(), json!(false));
    c.insert("mlp_bias".into(), json!(false));
    c.insert("bos_token_id".into(), json!(tok.bos));
    c.insert("eos_token_id".into(), json!(tok.eos));
    if let Some(pad) = tok.pad {
        c.insert("pad_token_id".into(), json!(pad));
    }
    c.insert("torch_dtype".into(), json!("float32"));
    Value::Object(c)
}

/// The pre-tokenizer for a llama.cpp `tokenizer.ggml.pre` name, as in the original `tokenizer.json`.
fn pre_tokenizer_json(pre: &str) -> Option<Value> {
    let byte_level = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true });
    match pre {
        // llama.cpp splits `\p{N}` one digit at a time, then applies the GPT-2 regex.
        "smollm" | "starcoder" => Some(json!({
            "type": "Sequence",
            "pretokenizers": [{ "type": "Digits", "individual_digits": true }, byte_level],
        })),
        "gpt-2" => Some(byte_level),
        _ => None,
    }
}

#[derive(Serialize)]
struct AddedTokenJson<'a> {
    id: usize,
    content: &'a str,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    special: bool,
}

#[derive(Serialize)]
struct BpeJson<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    dropout: Option<f32>,
    unk_token: Option<&'a str>,
    continuing_subword_prefix: Option<&'a str>,
    end_of_word_suffix: Option<&'a str>,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: VocabJson<'a>,
    merges: Vec<(&'a str, &'a str)>,
}

/// The vocabulary as a JSON object in id order (a `serde_json::Map` would sort it by token text).
struct VocabJson<'a>(&'a [String]);

impl Serialize for VocabJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (id, token) in self.0.iter().enumerate() {
            m.serialize_entry(token, &id)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct TokenizerJson<'a> {
    version: &'static str,
    truncation: Option<Value>,
    padding: Option<Value>,
    added_tokens: Vec<AddedTokenJson<'a>>,
    normalizer: Option<Value>,
    pre_tokenizer: Value,
    post_processor: Value,
    decoder: Value,
    model: BpeJson<'a>,
}

/// `tokenizer.json` for the `tokenizers` crate: the byte-level BPE of the original tokenizer (the
/// vocabulary in id order).
fn tokenizer_json<'a>(tok: &'a TokenizerData, gguf: &Path) -> Result<TokenizerJson<'a>, ConvertError> {
    let added_tokens = tok
        .token_types
        .iter()
        .enumerate()
        .filter(|&(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .map(|(id, &t)| AddedTokenJson {
            id,
            content: &tok.tokens[id],
            single_word: false,
            lstrip: false,
            rstrip: false,
            normalized: false,
            special: t == TOKEN_TYPE_CONTROL,
        })
        .collect();
    let pre_tokenizer = pre_tokenizer_json(&tok.pre).ok_or_else(|| {
        ConvertError::new(gguf, ConvertErrorKind::Unsupported("pre-tokenizer".into()), "tokenizer.ggml.pre")
    })?;
    let t = TokenizerJson {
        version: "1.0",
        truncation: None,
        padding: None,
        added_tokens,
        normalizer: None,
        pre_tokenizer,
        post_processor: json!({ "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true }),
        decoder: json!({ "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true }),
        model: BpeJson {
            kind: "BPE",
            dropout: None,
            unk_token: None,
            continuing_subword_prefix: None,
            end_of_word_suffix: None,
            fuse_unk: false,
            byte_fallback: false,
            ignore_merges: false,
            vocab: VocabJson(&tok.tokens),
            merges: tok.merges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect(),
        },
    };
    Ok(t)
}

fn tokenizer_config_json(tok: &TokenizerData, context: u64) -> Value {
    let mut c = serde_json::Map::new();
    let name = |id: Option<u64>| id.map(|i| tok.tokens[i as usize].clone());
    c.insert("tokenizer_class".into(), json!("GPT2Tokenizer"));
    c.insert("add_bos_token".into(), json!(tok.add_bos));
    c.insert("add_prefix_space".into(), json!(false));
    c.insert("clean_up_tokenization_spaces".into(), json!(false));
    c.insert("model_max_length".into(), json!(context));
    c.insert("bos_token".into(), json!(name(tok.bos)));
    c.insert("eos_token".into(), json!(name(tok.eos)));
    if let Some(unk) = name(tok.unk) {
        c.insert("unk_token".into(), json!(unk));
    }
    if let Some(pad) = name(tok.pad) {
        c.insert("pad_token".into(), json!(pad));
    }
    let specials: Vec<&str> = tok
        .token_types
        .iter()
        .enumerate()
        .filter(|&(_, &t)| t == TOKEN_TYPE_CONTROL)
        .map(|(i, _)| tok.tokens[i].as_str())
        .collect();
    c.insert("additional_special_tokens".into(), json!(specials));
    if let Some(t) = &tok.chat_template {
        c.insert("chat_template".into(), json!(t));
    }
    Value::Object(c)
}

fn io_err(path: &Path, e: std::io::Error) -> ConvertError {
    ConvertError::new(path, ConvertErrorKind::Io(e), path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp{}", std::process::id()));
    path.with_file_name(name)
}

/// Writes pretty JSON beside `path`, then renames it into place.
fn write_json(path: &Path, value: &impl Serialize) -> Result<(), ConvertError> {
    let mut text =
        serde_json::to_vec_pretty(value).map_err(|e| ConvertError::new(path, ConvertErrorKind::Json(e), "json"))?;
    text.push(b'\n');
    let tmp = tmp_path(path);
    if let Err(e) = std::fs::write(&tmp, &text) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(&tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The explicit index formula: Hugging Face row `h·hd + t·hd/2 + i` is GGUF row `h·hd + 2i + t`.
    fn unpermute_by_formula(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
        let hd = rows / n_head;
        let mut out = vec![f32::NAN; w.len()];
        for h in 0..n_head {
            for t in 0..2 {
                for i in 0..hd / 2 {
                    let hf_row = h * hd + t * (hd / 2) + i;
                    let gguf_row = h * hd + 2 * i + t;
                    out[hf_row * cols..(hf_row + 1) * cols].copy_from_slice(&w[gguf_row * cols..(gguf_row + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_permute_and_matches_the_formula() {
        for (n_head, head_dim, cols) in [(1, 2, 1), (9, 64, 3), (3, 64, 5), (4, 8, 7), (2, 6, 2)] {
            let rows = n_head * head_dim;
            let w: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let p = permute_qk(&w, n_head, rows, cols);
            if head_dim > 2 {
                assert_ne!(p, w, "the permutation is not the identity for head_dim {head_dim}");
            }
            assert_eq!(unpermute_qk(&p, n_head, rows, cols), w);
            assert_eq!(permute_qk(&unpermute_qk(&w, n_head, rows, cols), n_head, rows, cols), w);
            assert_eq!(unpermute_qk(&w, n_head, rows, cols), unpermute_by_formula(&w, n_head, rows, cols));
        }
    }

    #[test]
    fn permute_matches_llama_cpp_on_a_small_case() {
        // numpy: np.arange(8).reshape(1, 2, 4, 1).swapaxes(1, 2).reshape(8) == [0, 4, 1, 5, 2, 6, 3, 7]
        let w: Vec<f32> = (0..8).map(|i| i as f32).collect();
        assert_eq!(permute_qk(&w, 1, 8, 1), [0., 4., 1., 5., 2., 6., 3., 7.]);
    }
}
