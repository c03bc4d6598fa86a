//! `config.json` of a Llama-family checkpoint, in both transformers v4 and v5 spellings.
//!
//! Supported: `LlamaForCausalLM` (Llama 2/3, SmolLM2; `rope_scaling` of type `llama3`), `Qwen2ForCausalLM`
//! (q/k/v bias) and `Qwen3ForCausalLM` (q/k RMS norms, explicit `head_dim`). v5 moves `rope_scaling` and
//! `rope_theta` into `rope_parameters` and renames `torch_dtype` to `dtype`; both are read.

use serde_json::Value;

use crate::error::{Error, Result, at};

/// Which family member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen2ForCausalLM` (bias on q/k/v).
    Qwen2,
    /// `Qwen3ForCausalLM` (RMS norm on q and k per head).
    Qwen3,
}

/// Llama 3's RoPE frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_position_embeddings: f64,
}

/// The parts of `config.json` the runtime uses.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Architecture,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP intermediate size.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f64,
    /// Llama 3 RoPE scaling, if any.
    pub rope_llama3: Option<Llama3Rope>,
    /// Trained context length.
    pub max_position_embeddings: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// The head shares the embedding's weights.
    pub tie_word_embeddings: bool,
    /// End-of-sequence ids (any of them stops generation).
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence id.
    pub bos_token_id: Option<u32>,
    /// The raw `quantization_config`, if present.
    pub quantization_config: Option<Value>,
}

// Every value is read with its type checked: a present value of the wrong type is an error naming the key,
// never the default (a `"rope_theta": "500000"` string must not run at 10000). `null` counts as absent, as
// transformers writes it for unset optional fields.

fn present<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn wrong(key: &str, value: &Value, want: &str) -> Error {
    let shown: String = value.to_string().chars().take(60).collect();
    Error::config("config.json", format!("\"{key}\" is {shown}, not {want}"))
}

fn opt_u64(v: &Value, key: &str) -> Result<Option<u64>> {
    present(v, key).map(|x| x.as_u64().ok_or_else(|| wrong(key, x, "a non-negative integer"))).transpose()
}

fn opt_f64(v: &Value, key: &str) -> Result<Option<f64>> {
    present(v, key).map(|x| x.as_f64().ok_or_else(|| wrong(key, x, "a number"))).transpose()
}

fn opt_bool(v: &Value, key: &str) -> Result<Option<bool>> {
    present(v, key).map(|x| x.as_bool().ok_or_else(|| wrong(key, x, "true or false"))).transpose()
}

fn get_usize(v: &Value, key: &str) -> Result<usize> {
    let x = opt_u64(v, key)?.ok_or_else(|| Error::config("config.json", format!("\"{key}\" is missing")))?;
    usize::try_from(x).map_err(|_| wrong(key, &v[key], "a size this machine can hold"))
}

/// A token id or a list of them (`eos_token_id` may be either), each a 32-bit id.
fn ids(v: &Value, key: &str) -> Result<Vec<u32>> {
    let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| wrong(key, x, "a token id"));
    match present(v, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(x) => Ok(vec![one(x)?]),
    }
}

impl ModelConfig {
    /// Parses `config.json`'s contents.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(at("config.json"))?;
        let arch_name = v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| Error::config("config.json", "\"architectures\" is missing"))?;
        let arch = match arch_name {
            "LlamaForCausalLM" | "MistralForCausalLM" => Architecture::Llama,
            "Qwen2ForCausalLM" => Architecture::Qwen2,
            "Qwen3ForCausalLM" => Architecture::Qwen3,
            other => {
                return Err(Error::config(
                    "config.json",
                    format!("architecture {other} is not supported (Llama, Qwen2, Qwen3 families)"),
                ));
            }
        };
        let hidden_size = get_usize(&v, "hidden_size")?;
        let num_heads = get_usize(&v, "num_attention_heads")?;
        let num_kv_heads = opt_u64(&v, "num_key_value_heads")?.map_or(num_heads, |x| x as usize);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::config(
                "config.json",
                format!("num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"),
            ));
        }
        let head_dim = match opt_u64(&v, "head_dim")? {
            Some(h) => h as usize,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => return Err(Error::config("config.json", "hidden_size is not a multiple of num_attention_heads")),
        };
        // v5 keeps rope_theta and the scaling inside rope_parameters; v4 has rope_theta and rope_scaling.
        // Either may be present (or null); what is present must be an object.
        let object = |key: &str| match present(&v, key) {
            None => Ok(None),
            Some(o) if o.is_object() => Ok(Some(o)),
            Some(x) => Err(wrong(key, x, "an object")),
        };
        let (params, scaling) = (object("rope_parameters")?, object("rope_scaling")?);
        let rope_theta = match opt_f64(&v, "rope_theta")? {
            Some(t) => t,
            None => params.map(|r| opt_f64(r, "rope_theta")).transpose()?.flatten().unwrap_or(10000.0),
        };
        let type_of = |r: &Value| -> Result<Option<(Value, String)>> {
            match present(r, "rope_type").or_else(|| present(r, "type")) {
                None => Ok(None),
                Some(t) => {
                    Ok(Some((r.clone(), t.as_str().ok_or_else(|| wrong("rope_type", t, "a string"))?.to_string())))
                }
            }
        };
        let typed = match (params.map(type_of).transpose()?.flatten(), scaling.map(type_of).transpose()?.flatten()) {
            (Some(p), Some(s)) if p.1 != s.1 => {
                return Err(Error::config(
                    "config.json",
                    format!("rope_parameters says rope type {}, rope_scaling says {}", p.1, s.1),
                ));
            }
            (Some(p), _) => Some(p),
            (None, s) => s,
        };
        let rope = typed.as_ref().map(|(r, _)| r);
        let rope_type = typed.as_ref().map(|(_, t)| t.as_str());
        let rope_llama3 = match rope_type {
            None | Some("default") => None,
            Some("llama3") => {
                let r = rope.expect("rope_type came from it");
                let f = |k: &str| {
                    opt_f64(r, k)?.ok_or_else(|| Error::config("config.json", format!("rope scaling lacks \"{k}\"")))
                };
                Some(Llama3Rope {
                    factor: f("factor")?,
                    low_freq_factor: f("low_freq_factor")?,
                    high_freq_factor: f("high_freq_factor")?,
                    original_max_position_embeddings: f("original_max_position_embeddings")?,
                })
            }
            Some(other) => {
                return Err(Error::config("config.json", format!("rope scaling type {other} is not supported")));
            }
        };
        let cfg = ModelConfig {
            arch,
            hidden_size,
            intermediate_size: get_usize(&v, "intermediate_size")?,
            num_layers: get_usize(&v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: opt_f64(&v, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_llama3,
            max_position_embeddings: opt_u64(&v, "max_position_embeddings")?.unwrap_or(2048).min(u64::from(u32::MAX))
                as usize,
            vocab_size: get_usize(&v, "vocab_size")?,
            tie_word_embeddings: opt_bool(&v, "tie_word_embeddings")?.unwrap_or(false),
            eos_token_ids: ids(&v, "eos_token_id")?,
            bos_token_id: ids(&v, "bos_token_id")?.first().copied(),
            quantization_config: present(&v, "quantization_config").cloned(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Refuses sizes no real model has before anything is allocated from them: a hostile or mistyped
    /// config must be an error, not an overflow or an attempt to allocate terabytes.
    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::config("config.json", what));
        for (name, v, max) in [
            ("hidden_size", self.hidden_size, 1 << 18),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("num_hidden_layers", self.num_layers, 1 << 12),
            ("num_attention_heads", self.num_heads, 1 << 12),
            ("head_dim", self.head_dim, 1 << 12),
            ("vocab_size", self.vocab_size, 1 << 22),
        ] {
            if v == 0 || v > max {
                return bad(format!("{name} = {v} is outside what int4 supports (1..={max})"));
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim = {} is odd: RoPE rotates pairs of dimensions", self.head_dim));
        }
        let finite = self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0;
        if !(finite && self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad("rms_norm_eps and rope_theta must be finite (and rope_theta positive)".into());
        }
        if let Some(r) = self.rope_llama3 {
            let ok = [r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings]
                .iter()
                .all(|x| x.is_finite() && *x > 0.0)
                && r.high_freq_factor != r.low_freq_factor;
            if !ok {
                return bad(
                    "llama3 rope scaling needs positive factors and distinct high and low frequency factors".into()
                );
            }
        }
        Ok(())
    }

    /// The RoPE inverse frequencies (`head_dim / 2` of them), with Llama 3 scaling applied if configured.
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        (0..self.head_dim / 2)
            .map(|i| {
                let f = self.rope_theta.powf(-(2.0 * i as f64) / d);
                match self.rope_llama3 {
                    None => f,
                    Some(s) => {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        let low = s.original_max_position_embeddings / s.low_freq_factor;
                        let high = s.original_max_position_embeddings / s.high_freq_factor;
                        if wavelen < high {
                            f
                        } else if wavelen > low {
                            f / s.factor
                        } else {
                            let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                                / (s.high_freq_factor - s.low_freq_factor);
                            (1.0 - smooth) * f / s.factor + smooth * f
                        }
                    }
                }
            })
            .collect()
    }
}
