//! The architectures beyond plain Llama against an independent implementation: tiny random checkpoints
//! that Hugging Face transformers built, saved and ran in f32 (`fixtures/arch/<name>/`, made by
//! `scripts/arch_reference.py`; command and versions in each `reference.json`):
//!
//! * `llama3` — LlamaForCausalLM with Llama 3's RoPE scaling (theta 500000, factor 32, low/high frequency
//!   factors 1/4, original context 8192), an untied head, one 64-token prompt;
//! * `qwen2` — Qwen2ForCausalLM: bias on q/k/v, tied head;
//! * `qwen3` — Qwen3ForCausalLM: RMS norms on q and k per head, `head_dim` 32 with hidden 64 and 4 heads.
//!
//! Norm weights and biases are random, away from 1 and 0; each `reference.json` records in
//! `feature_sensitivity` how far the logits move when transformers turns a feature off (0.14 for the rope
//! scaling, several units for the biases and norms), far above the tolerance used here.

use std::path::{Path, PathBuf};

use int4::kernels::isa::IsaCaps;
use int4::{Architecture, Checkpoint, Model, ModelConfig, Numerics};
use serde_json::{Value, json};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch").join(name)
}

fn config_text(name: &str) -> String {
    std::fs::read_to_string(fixture_dir(name).join("config.json")).unwrap()
}

fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_dir(name).join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The gap between the two largest logits.
fn top2_gap(logits: &[f32]) -> f32 {
    let best = argmax(logits) as usize;
    let second = logits.iter().enumerate().filter(|&(i, _)| i != best).map(|(_, &v)| v).fold(f32::MIN, f32::max);
    logits[best] - second
}

fn load(name: &str) -> Model {
    let cfg = ModelConfig::from_json(&config_text(name)).unwrap();
    let ckpt = Checkpoint::open(&fixture_dir(name)).unwrap();
    Model::load(cfg, &ckpt, Numerics::f32(IsaCaps::process()), None, None).unwrap()
}

/// Runs every prompt of the fixture: the prompt's last-position logits must agree with transformers' within
/// f32 precision, and 8 greedy tokens (decoded one at a time through the KV cache, as transformers'
/// `generate(use_cache=True)` does) must be the reference's exactly.
///
/// Tolerance: `max |Δ| <= 1e-4 · max |logit| + 1e-5`. Both sides compute in f32 (the runtime's RoPE angles
/// in f64, transformers' in f32) and differ only in summation order, over sums of at most 128 terms through
/// 2 layers: each step's rounding is a few f32 ulps (2⁻²⁴ ≈ 6e-8 relative), so agreement is expected at
/// about 1e-6 of the logits' scale (the worst seen is 1.3e-5 at a scale of 6.9, 2e-6 of it); 1e-4 leaves a
/// fiftyfold margin for accumulated rounding. Dropping a feature moves some logit by far more: the smallest
/// such change on any prompt is 2.7e-2 at a scale of 8.4 (the rope scaling, on the 12-token prompt), thirty
/// times the bound; biases and q/k norms move logits by whole units. The 1e-5 absolute term only
/// matters for logits near zero.
fn check(name: &str) {
    let model = load(name);
    let fx = reference(name);
    let new_tokens = fx["new_tokens"].as_u64().unwrap() as usize;
    let mut failures = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let case_name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let want_logits = floats(&case["last_logits"]);
        let want_ids = ids(&case["greedy_ids"]);
        let ref_gaps = floats(&case["greedy_top2_gaps"]);
        let mut cache = model.kv_cache(prompt.len() + new_tokens, 1 << 30).unwrap();
        let logits = model.forward(&prompt, &mut cache, false).unwrap();
        assert_eq!(logits.len(), want_logits.len(), "{name} {case_name}: vocabulary size");

        let scale = want_logits.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let (worst_at, worst) = logits
            .iter()
            .zip(&want_logits)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .enumerate()
            .fold((0, 0.0f64), |best, (i, d)| if d > best.1 { (i, d) } else { best });
        let bound = 1e-4 * scale + 1e-5;
        println!(
            "{name} {case_name} ({} tokens): max |Δlogit| {worst:.3e} at id {worst_at} (scale {scale:.2}, bound {bound:.2e})",
            prompt.len()
        );
        if worst > bound {
            failures.push(format!(
                "{case_name}: last logits differ by {worst:.3e} at id {worst_at} ({} vs transformers {}), bound \
                 {bound:.2e}",
                logits[worst_at], want_logits[worst_at]
            ));
        }

        let mut got_ids = Vec::with_capacity(new_tokens);
        let mut gaps = Vec::with_capacity(new_tokens);
        let mut step_logits = logits;
        for step in 0..new_tokens {
            let next = argmax(&step_logits);
            gaps.push(top2_gap(&step_logits));
            got_ids.push(next);
            if step + 1 < new_tokens {
                step_logits = model.forward(&[next], &mut cache, false).unwrap();
            }
        }
        let min_gap = gaps.iter().copied().fold(f32::INFINITY, f32::min);
        println!("{name} {case_name}: greedy {got_ids:?}, smallest top-2 gap {min_gap:.4}");
        if let Some(step) = got_ids.iter().zip(&want_ids).position(|(a, b)| a != b) {
            failures.push(format!(
                "{case_name}: greedy ids {got_ids:?} diverge from transformers' {want_ids:?} at step {step} (top-2 \
                 gap here {:.4}, in transformers {:.4})",
                gaps[step], ref_gaps[step]
            ));
        }
    }
    assert!(failures.is_empty(), "{name} disagrees with transformers:\n{}", failures.join("\n"));
}

/// The RoPE inverse frequencies equal transformers' (computed there in f32: relative 1e-6 allows a few
/// f32 roundings of `theta^(-2i/d)` and of the Llama 3 interpolation).
fn check_inv_freq(name: &str) {
    let cfg = ModelConfig::from_json(&config_text(name)).unwrap();
    let want = floats(&reference(name)["rope_inv_freq"]);
    let got = cfg.rope_inv_freq();
    assert_eq!(got.len(), want.len(), "{name}: head_dim / 2 frequencies");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6 * w.abs(), "{name}: inv_freq[{i}] = {g:e}, transformers {w:e}");
    }
}

/// The config as transformers v5 writes it: `rope_theta` and the scaling moved into `rope_parameters`.
fn v5_spelling(v4: &str) -> String {
    let mut v: Value = serde_json::from_str(v4).unwrap();
    let o = v.as_object_mut().unwrap();
    let theta = o.remove("rope_theta").unwrap();
    let mut rope = match o.remove("rope_scaling") {
        Some(Value::Object(s)) => s,
        _ => json!({"rope_type": "default"}).as_object().unwrap().clone(),
    };
    rope.insert("rope_theta".into(), theta);
    o.insert("rope_parameters".into(), Value::Object(rope));
    v.to_string()
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    let cfg = ModelConfig::from_json(&config_text("llama3")).unwrap();
    assert_eq!(cfg.arch, Architecture::Llama);
    assert!(cfg.rope_llama3.is_some() && !cfg.tie_word_embeddings);
    assert_eq!(cfg.rope_theta, 500000.0);
    check_inv_freq("llama3");
    check("llama3");
}

#[test]
fn qwen2_qkv_bias_matches_transformers() {
    let cfg = ModelConfig::from_json(&config_text("qwen2")).unwrap();
    assert_eq!(cfg.arch, Architecture::Qwen2);
    assert!(cfg.tie_word_embeddings && cfg.rope_llama3.is_none());
    assert!(Checkpoint::open(&fixture_dir("qwen2")).unwrap().has("model.layers.0.self_attn.k_proj.bias"));
    check_inv_freq("qwen2");
    check("qwen2");
}

#[test]
fn qwen3_qk_norm_and_head_dim_match_transformers() {
    let cfg = ModelConfig::from_json(&config_text("qwen3")).unwrap();
    assert_eq!(cfg.arch, Architecture::Qwen3);
    assert_eq!((cfg.hidden_size, cfg.num_heads, cfg.head_dim), (64, 4, 32));
    check_inv_freq("qwen3");
    check("qwen3");
}

/// The fixtures' configs read the same in transformers v5's spelling.
#[test]
fn v5_config_spelling_reads_the_same() {
    for name in ["llama3", "qwen2", "qwen3"] {
        let v4 = config_text(name);
        let v5 = v5_spelling(&v4);
        assert!(v5.contains("rope_parameters") && !v5.contains("rope_scaling"), "{name}: {v5}");
        assert_eq!(ModelConfig::from_json(&v5).unwrap(), ModelConfig::from_json(&v4).unwrap(), "{name}");
    }
}
