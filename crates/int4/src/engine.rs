//! The library API: load a model directory on the path the policy picks, and generate.
//!
//! ```no_run
//! use int4::{Engine, GenerationRequest, LoadOptions, Prompt};
//! let engine = Engine::load("path/to/SmolLM2-135M-Instruct".as_ref(), &LoadOptions::default())?;
//! let mut req = GenerationRequest::new(Prompt::Text("The capital of Australia is".into()));
//! req.max_tokens = Some(16);
//! let out = engine.generate(req, |event| print!("{}", event.text))?;
//! println!(" ({:?}, {} tokens)", out.finish, out.usage.completion_tokens);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use int4_cache::key::SourceContent;
use int4_cache::quant_config::{NormalizedConfig, normalize};
use int4_cache::{Artifact, ArtifactKey, ArtifactStore, MappedArtifact, SourceIdentity};
use int4_kernels::LayerSpec;
use int4_kernels::bytes::SharedBytes;
use int4_kernels::choice;
use int4_kernels::isa::{Feature, IsaCaps, IsaLevel};
use int4_kernels::w4a8::ActivationScales;
use int4_kernels::w4a16::W4A16Config;
use int4_layout::GroupSize;
use int4_layout::tinygemm::TinygemmBlock;
use int4_select::policy::{CheckpointKind, KvType, Overrides, PackedLayout, Plan, Priority, RunPath, plan};

use crate::config::ModelConfig;
use crate::error::{Error, Result, at};
use crate::kv::KvCache;
use crate::linear::{HeadBits, Numerics};
use crate::model::{LinearSpec, Model, linear_specs};
use crate::model_dir::ModelDir;
use crate::quantized::QuantFormat;
use crate::sampling::GenerationDefaults;
use crate::text::TextCodec;
use crate::weights::Checkpoint;

/// How to load.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The path.
    pub path: RunPath,
    /// Speed or fidelity.
    pub priority: Priority,
    /// Group size for quantizing an unquantized checkpoint on load (default 32: the group docs/quantize.md
    /// measures as the only faithful one; a quantized checkpoint keeps its own).
    pub group_size: GroupSize,
    /// Positions the KV cache holds (the session's context, not the model's maximum).
    pub context: usize,
    /// The most bytes the KV cache may take.
    pub max_kv_bytes: usize,
    /// Where packed weights are cached (`None`: pack in memory on every load, write nothing).
    pub cache: Option<ArtifactStore>,
    /// Told `(layers packed, layers)` as a cold or uncached load packs its layers (for a progress bar).
    pub progress: Option<PackProgress>,
    /// W4A16 prefill: `Some(false)` keeps a split-halves copy of the weights for the prefill GEMM instead
    /// of dequantizing straight from the decode layout (more memory; `None` lets the policy decide, which
    /// is direct dequantization).
    pub direct_dequant: Option<bool>,
    /// W4A8: activation scales per group (default) or per token.
    pub activation_scales: ActivationScales,
    /// How KV caches store keys and values (`None`: the policy's choice, [`int4_select::kv_type`]).
    pub kv: Option<KvType>,
    /// The bits of a head the checkpoint stores unquantized, on the packed paths (default 8: llama.cpp's
    /// Q8_0 grid, for a tied head the embedding too, as docs/quantize.md measures; 4 is smaller and faster).
    pub head_bits: HeadBits,
    /// What the kernels may use: the plan takes nothing these caps forbid, and the layers bind their
    /// kernels under them (default: the process caps, `INT4_ISA` and `INT4_DISABLE`).
    pub caps: IsaCaps,
}

/// A callback told `(done, total)` as layers are packed; called from the packing threads.
#[derive(Clone)]
pub struct PackProgress(pub Arc<dyn Fn(usize, usize) + Send + Sync>);

impl std::fmt::Debug for PackProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PackProgress")
    }
}

impl LoadOptions {
    /// How KV caches store keys and values under these options: `kv` where set, else the policy's choice
    /// for the priority and path ([`int4_select::policy::kv_type`]).
    pub fn kv_type(&self) -> KvType {
        self.kv.unwrap_or_else(|| int4_select::policy::kv_type(self.priority, self.path))
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            path: RunPath::Auto,
            priority: Priority::Speed,
            group_size: GroupSize::G32,
            context: 2048,
            max_kv_bytes: 4 << 30,
            // A malformed INT4_CACHE_MAX_BYTES turns the cache off here (nothing written without its cap);
            // `LoadOptions::from_env` reports it.
            cache: ArtifactStore::from_env().ok().flatten(),
            progress: None,
            direct_dequant: None,
            activation_scales: ActivationScales::default(),
            kv: None,
            head_bits: HeadBits::default(),
            caps: *IsaCaps::process(),
        }
    }
}

impl LoadOptions {
    /// The defaults, with every environment variable they read checked: a malformed `INT4_ISA`,
    /// `INT4_DISABLE` or `INT4_CACHE_MAX_BYTES` is an error naming it (where [`LoadOptions::default`] falls
    /// back to the portable kernels and no cache).
    pub fn from_env() -> Result<Self> {
        let caps = IsaCaps::from_env().map_err(at("environment"))?;
        let cache = ArtifactStore::from_env().map_err(at("environment"))?;
        Ok(LoadOptions { caps, cache, ..LoadOptions::default() })
    }
}

/// Where a load's packed weights came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PackedFrom {
    /// Unquantized numerics: nothing is packed.
    NotPacked,
    /// Packed in this process; the cache was turned off.
    Uncached,
    /// Mapped from an artifact already in the cache (a warm load).
    Cache(PathBuf),
    /// Packed in this process and written to the cache (a cold load).
    Built(PathBuf),
    /// Packed in this process; the cache could not be written (see the load's warnings).
    InMemory,
}

/// A loaded model with its tokenizer.
#[derive(Debug)]
pub struct Engine {
    /// The model.
    pub model: Model,
    /// Tokenizer and chat template.
    pub text: TextCodec,
    /// The policy's plan: the rung, and the kernels every layer bound.
    pub plan: Plan,
    /// Load time.
    pub load_time: Duration,
    /// The model directory.
    pub dir: PathBuf,
    /// Where the packed weights came from.
    pub packed_from: PackedFrom,
    /// What the load wants the user to know (a rebuilt or uncacheable artifact, unknown config keys).
    pub warnings: Vec<String>,
    /// Sampling defaults and the token budget from `generation_config.json`.
    pub defaults: GenerationDefaults,
    context: usize,
    max_kv_bytes: usize,
}

/// Rows per prefill forward call.
pub(crate) const PREFILL_CHUNK: usize = 256;

impl Engine {
    /// Loads the model in `dir`.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let t = Instant::now();
        let model_dir = ModelDir::open(dir)?;
        let mut cfg = ModelConfig::from_json(&model_dir.config_text()?)?;
        let generation_config = model_dir.read_json("generation_config.json")?;
        add_generation_eos(generation_config.as_ref(), &mut cfg)?;
        let mut warnings = Vec::new();
        let defaults = match &generation_config {
            Some(g) => {
                let (d, w) = GenerationDefaults::from_generation_config(g);
                warnings.extend(w);
                d
            }
            None => GenerationDefaults::default(),
        };
        let quantization = read_quantization_config(&model_dir, &cfg)?;
        warnings.extend(quantization.warnings.iter().cloned());
        let format = QuantFormat::from_config(&quantization)?;
        let kind = format.as_ref().map_or(CheckpointKind::Bf16, QuantFormat::checkpoint_kind);
        let group = format.as_ref().map_or(opts.group_size, QuantFormat::group);
        let (numerics, plan) = numerics_for(opts, kind, group)?;
        let ckpt = Checkpoint::open_in(&model_dir)?;
        warnings.extend(Model::load_notes(&cfg, &ckpt, numerics, format.as_ref()));
        let (model, packed_from) = match &opts.cache {
            Some(store) if numerics.is_packed() => {
                let key = artifact_key(&plan, numerics, &quantization, group, &ckpt, store)?
                    .with_model(packing_inputs(&cfg, &ckpt));
                let mut built = false;
                let (artifact, w) = store.get_or_build(&key, || {
                    built = true;
                    Model::pack(&cfg, &ckpt, numerics, format.as_ref(), opts.progress.as_ref().map(|p| &*p.0))
                })?;
                warnings.extend(w);
                let (source, from) = match artifact {
                    Artifact::Mapped(m) => {
                        let path = m.path().to_path_buf();
                        if is_default_model(dir)
                            && let Err(e) = store.pin(&key)
                        {
                            warnings.push(format!("could not pin the default model's artifact: {e}"));
                        }
                        (Sections::mapped(m), if built { PackedFrom::Built(path) } else { PackedFrom::Cache(path) })
                    }
                    Artifact::InMemory { sections, .. } => (Sections::owned(sections), PackedFrom::InMemory),
                };
                match Model::load(cfg.clone(), &ckpt, numerics, Some(&|name: &str| source.get(name)), format.as_ref()) {
                    Ok(m) => (m, from),
                    // A cached artifact that passed its checks but cannot build the model (a section
                    // missing or of the wrong size) is damaged: pack in memory instead, and say so. A
                    // freshly packed one failing is a real error.
                    Err(e) if matches!(from, PackedFrom::Cache(_)) => {
                        warnings.push(format!("cached artifact not used ({e}); packed in memory instead"));
                        drop(source);
                        (Model::load(cfg, &ckpt, numerics, None, format.as_ref())?, PackedFrom::Uncached)
                    }
                    Err(e) => return Err(e),
                }
            }
            _ => {
                let from = if numerics.is_packed() { PackedFrom::Uncached } else { PackedFrom::NotPacked };
                (Model::load(cfg, &ckpt, numerics, None, format.as_ref())?, from)
            }
        };
        let mut model = model;
        model.set_kv_type(opts.kv_type());
        let text = TextCodec::load_in(&model_dir)?;
        // What the load read and no longer needs (a GGUF's parsed metadata, the tokenizer's JSON) goes back
        // before the engine runs: a warm load's anonymous memory is the model's, not its loading's.
        drop(ckpt);
        drop(model_dir);
        if numerics.is_packed() {
            release_freed_memory();
        }
        Ok(Engine {
            model,
            text,
            plan,
            load_time: t.elapsed(),
            dir: dir.to_path_buf(),
            packed_from,
            warnings,
            defaults,
            context: opts.context,
            max_kv_bytes: opts.max_kv_bytes,
        })
    }

    /// A fresh KV cache for this engine's context.
    pub fn new_cache(&self) -> Result<KvCache> {
        self.model.kv_cache(self.context, self.max_kv_bytes)
    }
}

/// An artifact's sections, by name: slices of one shared mapping (which lives as long as any slice), or
/// buffers packed in this process.
struct Sections {
    index: HashMap<String, SharedBytes>,
}

impl Sections {
    fn mapped(m: MappedArtifact) -> Self {
        let names: Vec<String> = m.header().sections.iter().map(|s| s.name.clone()).collect();
        let owner = Arc::new(m);
        let shared: Arc<dyn AsRef<[u8]> + Send + Sync> = owner.clone();
        let index = names
            .into_iter()
            .filter_map(|n| {
                let range = owner.section_range(&n)?;
                SharedBytes::slice_of(shared.clone(), range).ok().map(|b| (n, b))
            })
            .collect();
        Sections { index }
    }

    fn owned(sections: Vec<(String, Vec<u8>)>) -> Self {
        Sections { index: sections.into_iter().map(|(n, b)| (n, b.into())).collect() }
    }

    fn get(&self, name: &str) -> Option<SharedBytes> {
        self.index.get(name).cloned()
    }
}

/// Returns the heap's free pages to the OS after packing (a cold or uncached load): packing allocates and frees many large
/// buffers (each layer's f32 weights, the sections before they are written and mapped), and glibc keeps
/// such memory in the process unless asked, which left a cold start holding about three times the
/// anonymous memory of a warm one.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel; it takes no pointers and changes
    // no live allocation. glibc serialises it with every other allocator call.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether `dir` is the converted default model (whose artifact is pinned against eviction).
fn is_default_model(dir: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    int4_cache::dirs::default_model_dir().is_some_and(|d| canon(&d).is_some() && canon(&d) == canon(dir))
}

/// Adds the end-of-sequence ids of `generation_config.json`, if the directory has one, to those of
/// `config.json` (instruction-tuned models often list their end-of-turn tokens only there).
fn add_generation_eos(generation_config: Option<&serde_json::Value>, cfg: &mut ModelConfig) -> Result<()> {
    let Some(v) = generation_config else { return Ok(()) };
    let bad = || Error::config("generation_config.json", "\"eos_token_id\" is not a token id or a list of them");
    let id = |x: &serde_json::Value| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad);
    let ids: Vec<u32> = match v.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(a)) => a.iter().map(id).collect::<Result<_>>()?,
        Some(x) => vec![id(x)?],
    };
    for id in ids {
        if !cfg.eos_token_ids.contains(&id) {
            cfg.eos_token_ids.push(id);
        }
    }
    Ok(())
}

/// The checkpoint's normalised quantization config: `config.json`'s `quantization_config`, else a
/// `quantize_config.json` beside it (older GPTQ exports; `quant_method` defaults to `gptq` there), else
/// none (an unquantized checkpoint).
fn read_quantization_config(model: &ModelDir, cfg: &ModelConfig) -> Result<NormalizedConfig> {
    if let Some(gguf) = model.gguf() {
        return Ok(gguf_quantization(gguf));
    }
    let (raw, source) = match &cfg.quantization_config {
        Some(v) => (Some(v.clone()), "config.json"),
        None => {
            let side = model.read_json("quantize_config.json")?.map(|mut v| {
                if let Some(o) = v.as_object_mut() {
                    o.entry("quant_method").or_insert_with(|| "gptq".into());
                }
                v
            });
            (side, "quantize_config.json")
        }
    };
    normalize(raw.as_ref()).map_err(at(model.path().join(source).display().to_string()))
}

/// A GGUF's quantization as the runtime records it: method `gguf`, group 32, the count of tensors per type,
/// whether any linear layer has float zeros (Q4_1), and whether a decoder layer's weight is stored
/// unquantized (so quantized at load) or every one in more than 4 bits (both read by the policy's W4A8
/// rule). A GGUF with no block-quantized
/// tensor is unquantized (`none`).
fn gguf_quantization(gguf: &int4_gguf::GgufModel) -> NormalizedConfig {
    use int4_gguf::GgmlType;
    let mut types = std::collections::BTreeMap::new();
    for t in gguf.tensors() {
        *types.entry(crate::weights::gguf_dtype(t.ggml_type)).or_insert(0usize) += 1;
    }
    let blocks = |t: GgmlType| crate::quantized::gguf_stored_bits(t).is_some() || crate::quantized::gguf_wide(t);
    let quantized = gguf.tensors().iter().any(|t| blocks(t.ggml_type));
    let float_zeros = gguf.tensors().iter().any(|t| matches!(t.ggml_type, GgmlType::Q4_1 | GgmlType::Q4_K));
    let layers: Vec<GgmlType> = gguf
        .tensors()
        .iter()
        .filter(|t| t.hf_name.starts_with("model.layers.") && t.shape.len() == 2)
        .map(|t| t.ggml_type)
        .collect();
    let layers_at_load = layers.iter().any(|&t| !blocks(t));
    let eight_bit = |t: GgmlType| crate::quantized::gguf_stored_bits(t) == Some(8) || crate::quantized::gguf_wide(t);
    let layers_in_eight_bits = !layers.is_empty() && layers.iter().all(|&t| eight_bit(t));
    let fields = if !quantized {
        Vec::new()
    } else {
        let mut f = vec![
            ("group_size".to_string(), serde_json::json!(32)),
            ("types".to_string(), serde_json::json!(types)),
            ("float_zeros".to_string(), serde_json::json!(float_zeros)),
        ];
        if layers_at_load {
            f.push(("layers_quantized_at_load".to_string(), serde_json::json!(true)));
        } else if layers_in_eight_bits {
            f.push(("layers_in_eight_bits".to_string(), serde_json::json!(true)));
        }
        f
    };
    NormalizedConfig {
        method: if quantized { "gguf" } else { "none" }.into(),
        fields: fields.into_iter().collect(),
        ignored: Default::default(),
        unknown: Default::default(),
        warnings: Vec::new(),
    }
}

/// The key of the artifact a load produces: the checkpoint's quantization (for an unquantized one, the
/// load-time quantization it undergoes, written as a `cpu_int4` config), the plan, the CPU features its
/// kernels need, and the content hash of the checkpoint's tensor files (re-hashed only when a file's size
/// or mtime changes).
fn artifact_key(
    plan: &Plan,
    numerics: Numerics,
    checkpoint: &NormalizedConfig,
    group: GroupSize,
    ckpt: &Checkpoint,
    store: &ArtifactStore,
) -> Result<ArtifactKey> {
    let quantization = if checkpoint.method == "none" {
        let config = serde_json::json!({
            "quant_method": "cpu_int4",
            "group_size": group.to_checkpoint(),
            "direct_dequant": plan.direct_dequant,
            "dequant_threshold": plan.dequant_threshold,
        });
        normalize(Some(&config)).map_err(at("quantization"))?
    } else {
        checkpoint.clone()
    };
    let level = plan.decode.isa.max(plan.prefill.isa);
    let features = Feature::ALL
        .into_iter()
        .filter(|f| match f {
            Feature::Avx2 | Feature::Fma => level >= IsaLevel::Avx2,
            _ => level >= IsaLevel::Avx512,
        })
        .map(|f| f.name().to_string())
        .collect();
    let index = store.dir().join("sources.json");
    let _ = std::fs::create_dir_all(store.dir());
    let held: Vec<SourceContent<'_>> =
        ckpt.held_files().into_iter().map(|(path, metadata, bytes)| SourceContent { path, metadata, bytes }).collect();
    let source = SourceIdentity::of_contents(&held, Some(&index)).map_err(at("checkpoint"))?;
    let key = ArtifactKey::new(quantization, plan, features, source);
    Ok(match numerics.head_bits() {
        HeadBits::Eight => key.with_option("head_bits", serde_json::json!(8)),
        HeadBits::Four => key,
    })
}

/// What packing reads of the model's configuration, for the artifact key: the architecture and every
/// linear layer as [`LinearSpec::describe`] gives it. Fields packing does not read (`rope_theta`, the norms'
/// epsilon, the generation config, the tokenizer) are left out, so changing them keeps the artifact and the
/// new values are used.
fn packing_inputs(cfg: &ModelConfig, ckpt: &Checkpoint) -> serde_json::Value {
    let linears: Vec<serde_json::Value> = linear_specs(cfg, ckpt).iter().map(LinearSpec::describe).collect();
    serde_json::json!({"architecture": format!("{:?}", cfg.arch), "linears": linears})
}

/// What `int4 info` says about a model directory, without loading its weights.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelInfo {
    /// `LlamaForCausalLM`-style architecture and its shape.
    pub architecture: String,
    /// Decoder layers, hidden size, heads, KV heads, head dim, intermediate size, vocabulary.
    pub shape: serde_json::Value,
    /// Whether the head is tied to the embedding.
    pub tied_head: bool,
    /// Safetensors files and how many tensors of each dtype they hold.
    pub files: Vec<String>,
    /// Tensor count per dtype.
    pub dtypes: std::collections::BTreeMap<String, usize>,
    /// The normalised quantization config (`method: none` for an unquantized checkpoint).
    pub quantization: serde_json::Value,
    /// Per linear kind (`qkv`, `o_proj`, `gate_up`, `down`, `lm_head`): how the checkpoint stores it and
    /// what loading does with it.
    pub layers: Vec<(String, String)>,
    /// How an unquantized layer is quantized at load: `{"group": 32, "head_bits": 8}` (a stored layer
    /// keeps its own grid).
    pub load_quantization: serde_json::Value,
    /// For a GGUF with Q4_1 or Q4_K tensors: `{"q4_1_blocks": …, "inexact_zeros": …}` (blocks of 32), the
    /// blocks whose zero
    /// `m + 8d` f32 cannot hold exactly (their weights are within ½ ulp of that zero of ggml's; every other
    /// weight is exact).
    pub gguf_q4_1: Option<serde_json::Value>,
    /// The plan this machine would run it with.
    pub plan: Plan,
    /// How its KV cache would store keys and values.
    pub kv: KvType,
    /// Whether the artifact cache holds its packed weights for that plan.
    pub cached: Option<bool>,
    /// Warnings a load would print.
    pub warnings: Vec<String>,
}

impl Engine {
    /// Describes the model in `dir` as `opts` would load it: architecture, tensor formats, how each kind
    /// of layer is stored and will run, the plan, and whether its packed artifact is cached. Reads
    /// headers and hashes (or recalls) the checkpoint, but quantizes nothing.
    pub fn describe(dir: &Path, opts: &LoadOptions) -> Result<ModelInfo> {
        let model_dir = ModelDir::open(dir)?;
        let cfg = ModelConfig::from_json(&model_dir.config_text()?)?;
        let quantization = read_quantization_config(&model_dir, &cfg)?;
        let format = QuantFormat::from_config(&quantization)?;
        let kind = format.as_ref().map_or(CheckpointKind::Bf16, QuantFormat::checkpoint_kind);
        let group = format.as_ref().map_or(opts.group_size, QuantFormat::group);
        let (numerics, plan) = numerics_for(opts, kind, group)?;
        let ckpt = Checkpoint::open_in(&model_dir)?;
        let mut dtypes = std::collections::BTreeMap::new();
        for (_, d) in ckpt.tensors() {
            *dtypes.entry(d).or_insert(0) += 1;
        }
        let specs = linear_specs(&cfg, &ckpt);
        let kinds = ["qkv", "o_proj", "gate_up", "down_proj", "lm_head"];
        let layers = kinds
            .iter()
            .filter_map(|k| specs.iter().find(|s| s.name.ends_with(k)))
            .map(|s| {
                let is_head = s.name == "lm_head";
                let stored_quantized = format.as_ref().is_some_and(|f| s.quantized_in(&ckpt, f));
                let eight = s.stored_in_eight_bits(&ckpt, format.as_ref());
                let stored = match &format {
                    Some(QuantFormat::Gguf { .. }) if stored_quantized => {
                        format!("{} ({}-bit), group 32", s.dtype(&ckpt).unwrap_or_default(), if eight { 8 } else { 4 })
                    }
                    Some(f) if stored_quantized => {
                        format!("{} 4-bit, group {}", quantization.method, f.group().to_checkpoint())
                    }
                    Some(QuantFormat::Gguf { .. }) => {
                        let types: Vec<String> = s.parts().iter().filter_map(|(t, _)| ckpt.dtype(t)).collect();
                        format!("{} (read exactly)", types.join(" + "))
                    }
                    _ => format!("unquantized {}", s.dtype(&ckpt).unwrap_or_default()),
                };
                let layer_numerics = s.numerics(&ckpt, format.as_ref(), numerics, is_head);
                let run = match layer_numerics {
                    Numerics::F32 { .. } => "dequantized to f32".to_string(),
                    Numerics::Bf16 { .. } => "as bf16".to_string(),
                    Numerics::W8a16 { .. } | Numerics::W8a8 { .. } if !stored_quantized => {
                        "quantized at load to 8 bits (llama.cpp's Q8_0 grid)".to_string()
                    }
                    _ if !stored_quantized => {
                        format!("quantized at load (round to nearest, group {})", group.to_checkpoint())
                    }
                    Numerics::W8a16 { .. } => "packed as stored, W8A16 kernels".to_string(),
                    Numerics::W8a8 { .. } => "packed as stored, two 4-bit planes on the W4A8 kernels".to_string(),
                    _ => "packed as stored".to_string(),
                };
                let name = s.name.rsplit('.').next().unwrap_or(&s.name).to_string();
                (format!("{name} [{}×{}]", s.n, s.k), format!("{stored}; {run}"))
            })
            .collect();
        let cached = match &opts.cache {
            Some(store) if numerics.is_packed() => {
                let key = artifact_key(&plan, numerics, &quantization, group, &ckpt, store)?
                    .with_model(packing_inputs(&cfg, &ckpt));
                Some(matches!(store.load(&key), int4_cache::Lookup::Hit(_)))
            }
            _ => None,
        };
        let mut warnings = quantization.warnings.clone();
        warnings.extend(Model::load_notes(&cfg, &ckpt, numerics, format.as_ref()));
        let gguf_q4_1 = match ckpt.gguf() {
            Some(g) => {
                let (mut blocks, mut inexact) = (0, 0);
                let float_zeros =
                    |t: int4_gguf::GgmlType| matches!(t, int4_gguf::GgmlType::Q4_1 | int4_gguf::GgmlType::Q4_K);
                for t in g.tensors().iter().filter(|t| float_zeros(t.ggml_type)) {
                    let b = g.blocks(&t.hf_name).map_err(at(&t.hf_name))?;
                    blocks += b.d.len();
                    inexact += crate::quantized::inexact_q4_1_zeros(&b.d, b.m.as_deref().unwrap_or_default());
                }
                (blocks > 0).then(|| serde_json::json!({"q4_1_blocks": blocks, "inexact_zeros": inexact}))
            }
            None => None,
        };
        Ok(ModelInfo {
            architecture: format!("{:?}", cfg.arch),
            shape: serde_json::json!({
                "layers": cfg.num_layers, "hidden": cfg.hidden_size, "heads": cfg.num_heads,
                "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "intermediate": cfg.intermediate_size,
                "vocab": cfg.vocab_size,
            }),
            tied_head: cfg.tie_word_embeddings,
            files: ckpt.files().iter().map(|f| f.display().to_string()).collect(),
            dtypes,
            quantization: serde_json::to_value(&quantization).unwrap_or_default(),
            layers,
            load_quantization: serde_json::json!({
                "group": group.to_checkpoint(),
                "head_bits": opts.head_bits.bits(),
            }),
            gguf_q4_1,
            plan,
            kv: opts.kv_type(),
            cached,
            warnings,
        })
    }
}

/// The numerics for a load: the policy's plan for this machine under the load's caps and grid, and its
/// kernels bound to this process (an error, naming the kernel and what is missing, when a CPU profile
/// promised more than this CPU has).
fn numerics_for(opts: &LoadOptions, kind: CheckpointKind, group: GroupSize) -> Result<(Numerics, Plan)> {
    let snap = int4_select::snapshot_for_policy().map_err(at("CPU profile"))?;
    let overrides = Overrides {
        path: opts.path,
        caps: opts.caps,
        direct_dequant: opts.direct_dequant,
        group,
        head_bits: opts.head_bits,
        activation_scales: opts.activation_scales,
        ..Overrides::default()
    };
    let p = plan(&snap, kind, opts.priority, &overrides).map_err(at("path"))?;
    let kernels = p.kernels().bind(&opts.caps).map_err(at(format!("path {}", p.path)))?;
    // Layers stored in 8 bits run on the W8A16 kernels of the plan's own instruction-set level, as far as
    // the caps leave (`choice::w8a16_beside`); beside the portable row-major layout, the portable ones.
    let portable_eight = || {
        let spec = LayerSpec::W8a16 { prefill_from: choice::W8A16_PREFILL_FROM_ROWS };
        choice::at_level(spec, IsaLevel::Portable, &opts.caps).map_err(at(format!("path {}", p.path)))
    };
    let numerics = match p.layout {
        PackedLayout::Tinygemm32 | PackedLayout::Tinygemm64 => Numerics::W4a16 {
            block: if p.layout == PackedLayout::Tinygemm64 { TinygemmBlock::N64 } else { TinygemmBlock::N32 },
            group,
            config: W4A16Config { dequant_threshold: p.dequant_threshold, direct_dequant: p.direct_dequant },
            kernels,
            eight: choice::w8a16_beside(&kernels.choice(), &opts.caps).map_err(at(format!("path {}", p.path)))?,
            head: opts.head_bits,
        },
        PackedLayout::RowMajor => Numerics::Wna16 { group, kernels, eight: portable_eight()?, head: opts.head_bits },
        PackedLayout::W4a8Vnni => {
            Numerics::W4a8 { group, kernels, activations: opts.activation_scales, head: opts.head_bits }
        }
        PackedLayout::Bf16 => Numerics::Bf16 { kernels },
        PackedLayout::F32 => Numerics::F32 { kernels },
    };
    Ok((numerics, p))
}
