//! Synthetic Llama checkpoints of a given shape: `config.json`, `model.safetensors` (bf16, seeded random
//! normal weights of standard deviation 0.02, norms 1) and the tokenizer files of a donor model directory,
//! so the whole engine loads and runs them. They measure load time, memory and speed at the upstream
//! model's size (1.54 B parameters) without shipping such a model; their outputs mean nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};

use crate::model_shapes::{ModelShape, SMOLLM2_135M, SPARK_SHAPED};

/// The synthetic shape called `name` (`spark-shaped`, `smollm2-shaped`).
pub fn shape_named(name: &str) -> Option<ModelShape> {
    [SPARK_SHAPED, SMOLLM2_135M].into_iter().find(|m| m.name == name)
}

/// Where the benchmarks keep a generated synthetic model: `target/bench/models/<name>`.
pub fn default_dir(model: &ModelShape) -> PathBuf {
    PathBuf::from("target/bench/models").join(model.name)
}

pub(crate) struct Shape {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
}

/// The architecture behind a benchmark shape (q/k/v and gate/up are stored unfused in a checkpoint).
fn shape_of(m: &ModelShape) -> Shape {
    let (vocab, hidden) = m.head;
    let head_dim = if hidden >= 2048 { 256 } else { 64 };
    let (heads, kv_heads) = if hidden >= 2048 { (8, 2) } else { (9, 3) };
    // gate_up stacks gate and up: 2·intermediate rows.
    let inter = m.per_layer[2].1 / 2;
    Shape { hidden, layers: m.layers, heads, kv_heads, head_dim, inter, vocab }
}

/// xorshift64* with a Box–Muller normal.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn normal(&mut self) -> f32 {
        let a = ((self.next() >> 11) as f64 / (1u64 << 53) as f64).max(1e-300);
        let b = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()) as f32
    }
}

fn bf16_bytes(n: usize, f: impl Fn(usize) -> f32) -> Vec<u8> {
    (0..n).flat_map(|i| half::bf16::from_f32(f(i)).to_le_bytes()).collect()
}

/// Writes `model` into `out`, with the tokenizer files of `donor`; skipped when `out` already holds a
/// complete model of the same shape (its `config.json`, written last, matches).
pub fn write_model(model: &ModelShape, out: &Path, donor: Option<&Path>) -> Result<(), String> {
    let s = shape_of(model);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": s.hidden, "intermediate_size": s.inter, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "vocab_size": s.vocab, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16", "synthetic": model.name,
    });
    let done = out.join("model.safetensors");
    let same = std::fs::read_to_string(out.join("config.json"))
        .ok()
        .is_some_and(|t| serde_json::from_str::<serde_json::Value>(&t).ok().as_ref() == Some(&config));
    if same && done.exists() {
        eprintln!("make-model: {} already holds {}", out.display(), model.name);
        return Ok(());
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let donor = donor.ok_or("no tokenizer donor (give --tokenizer-from DIR)")?;
    // Read through the runtime's ModelDir, so a GGUF donor (the default model) gives the tokenizer files its
    // metadata makes.
    let donor = int4::ModelDir::open(donor).map_err(|e| e.to_string())?;
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"] {
        if let Some(bytes) = donor.read(f, int4::TOKENIZER_CAP).map_err(|e| e.to_string())? {
            std::fs::write(out.join(f), bytes).map_err(|e| format!("{}: {e}", out.join(f).display()))?;
        }
    }
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut randn = |name: String, shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| 0.02 * rng.normal()).collect();
        (name, shape, bf16_bytes(n, |i| v[i]))
    };
    let ones = |name: String, n: usize| (name, vec![n], bf16_bytes(n, |_| 1.0));
    let (h, hd) = (s.hidden, s.head_dim);
    tensors.push(randn("model.embed_tokens.weight".into(), vec![s.vocab, h]));
    tensors.push(ones("model.norm.weight".into(), h));
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        tensors.push(ones(format!("{p}.input_layernorm.weight"), h));
        tensors.push(ones(format!("{p}.post_attention_layernorm.weight"), h));
        tensors.push(randn(format!("{p}.self_attn.q_proj.weight"), vec![s.heads * hd, h]));
        tensors.push(randn(format!("{p}.self_attn.k_proj.weight"), vec![s.kv_heads * hd, h]));
        tensors.push(randn(format!("{p}.self_attn.v_proj.weight"), vec![s.kv_heads * hd, h]));
        tensors.push(randn(format!("{p}.self_attn.o_proj.weight"), vec![h, s.heads * hd]));
        tensors.push(randn(format!("{p}.mlp.gate_proj.weight"), vec![s.inter, h]));
        tensors.push(randn(format!("{p}.mlp.up_proj.weight"), vec![s.inter, h]));
        tensors.push(randn(format!("{p}.mlp.down_proj.weight"), vec![h, s.inter]));
    }
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .map(|(n, sh, d)| (n.clone(), TensorView::new(Dtype::BF16, sh.clone(), d).expect("consistent tensor")))
        .collect();
    let tmp = out.join("model.safetensors.partial");
    safetensors::serialize_to_file(&views, None, &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &done).map_err(|e| format!("{}: {e}", done.display()))?;
    // config.json last: its presence with this content marks a complete model.
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&config).expect("json"))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let params: usize = tensors.iter().map(|(_, sh, _)| sh.iter().product::<usize>()).sum();
    eprintln!("make-model: wrote {} ({params} parameters) to {}", model.name, out.display());
    Ok(())
}
