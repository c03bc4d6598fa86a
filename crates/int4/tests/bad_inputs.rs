//! The bad-inputs table of `docs/bad-inputs.md`, one row per case: each bad input given to the engine must
//! give an error (or, where noted, a warning) containing the words the table quotes — never a panic and
//! never a silently wrong answer. Keep the two in step.

mod common;

use std::path::{Path, PathBuf};

use common::{CONFIG, tiny_model, tiny_model_with};
use int4::engine::{Engine, LoadOptions, RunPath};
use int4::sampling::SamplingConfig;

fn opts(path: RunPath) -> LoadOptions {
    LoadOptions { path, context: 16, cache: None, ..LoadOptions::default() }
}

fn load_err(dir: &Path, path: RunPath) -> String {
    match Engine::load(dir, &opts(path)) {
        Ok(_) => String::from("(loaded without error)"),
        Err(e) => e.to_string(),
    }
}

/// A copy of the tiny model with `config.json` edited.
fn with_config(name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = tiny_model(name);
    let mut cfg: serde_json::Value = serde_json::from_str(CONFIG).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// A copy of the tiny model whose safetensors header says `from` where it said `to`.
fn with_header_edit(name: &str, from: &str, to: &str) -> PathBuf {
    let dir = tiny_model(name);
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let edited = header.replacen(from, to, 1);
    assert_eq!(edited.len(), header.len(), "header edits keep the length");
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(edited.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&p, out).unwrap();
    dir
}

#[test]
fn every_bad_input_in_the_table_gives_its_error() {
    let ok = tiny_model("bad-ok");
    let engine = Engine::load(&ok, &opts(RunPath::W4a16)).unwrap();
    let generate = |prompt: &[u32]| match engine.generate(prompt, 4, SamplingConfig::greedy(), |_| {}) {
        Ok(_) => String::from("(generated without error)"),
        Err(e) => e.to_string(),
    };
    let truncated = {
        let dir = tiny_model("bad-truncated");
        let p = dir.join("model.safetensors");
        let len = std::fs::metadata(&p).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len / 2).unwrap();
        dir
    };
    let nan = tiny_model_with("bad-nan", |name, mut w| {
        if name.ends_with("layers.0.self_attn.q_proj.weight") {
            w[5] = f32::NAN;
        }
        w
    });
    let rows: Vec<(&str, String, &str)> = vec![
        ("truncated model.safetensors", load_err(&truncated, RunPath::W4a16), "not a valid safetensors file"),
        (
            "wrong dtype (a weight declared I32)",
            load_err(&with_header_edit("bad-dtype", "\"F32\"", "\"I32\""), RunPath::W4a16),
            "dtype",
        ),
        (
            "wrong shape (config hidden_size 32 for 64-wide tensors)",
            load_err(&with_config("bad-shape", |c| c["hidden_size"] = 32.into()), RunPath::W4a16),
            "shape",
        ),
        ("a NaN weight", load_err(&nan, RunPath::W4a16), "NaN"),
        (
            "a zero-size dimension (vocab_size 0)",
            load_err(&with_config("bad-zero", |c| c["vocab_size"] = 0.into()), RunPath::F32),
            "vocab_size = 0",
        ),
        ("an odd head_dim", load_err(&with_config("bad-odd", |c| c["head_dim"] = 15.into()), RunPath::F32), "odd"),
        (
            "an absurd size (hidden_size 2^40)",
            load_err(&with_config("bad-huge", |c| c["hidden_size"] = (1u64 << 40).into()), RunPath::F32),
            "outside what int4 supports",
        ),
        (
            "a missing required key",
            load_err(
                &with_config("bad-key", |c| c.as_object_mut().unwrap().retain(|k, _| k != "vocab_size")),
                RunPath::F32,
            ),
            "\"vocab_size\" is missing",
        ),
        (
            "an unsupported architecture",
            load_err(
                &with_config("bad-arch", |c| c["architectures"] = serde_json::json!(["GPT2LMHeadModel"])),
                RunPath::F32,
            ),
            "not supported",
        ),
        (
            "bits other than 4",
            load_err(
                &with_config("bad-bits", |c| {
                    c["quantization_config"] = serde_json::json!({"quant_method": "gptq", "bits": 8})
                }),
                RunPath::W4a16,
            ),
            "only 4-bit",
        ),
        (
            "a group size int4 cannot run (48)",
            load_err(
                &with_config("bad-group", |c| {
                    c["quantization_config"] = serde_json::json!({"quant_method": "cpu_int4", "group_size": 48})
                }),
                RunPath::W4a16,
            ),
            "group_size = 48",
        ),
        (
            "a quantization method int4 does not read",
            load_err(
                &with_config("bad-method", |c| {
                    c["quantization_config"] = serde_json::json!({"quant_method": "bitsandbytes"})
                }),
                RunPath::W4a16,
            ),
            "not supported",
        ),
        (
            "a quantized config over unquantized tensors (a warning: it loads)",
            Engine::load(
                &with_config("bad-mismatch", |c| {
                    c["quantization_config"] = serde_json::json!({"quant_method": "gptq"})
                }),
                &opts(RunPath::W4a16),
            )
            .map(|e| e.warnings.join("; "))
            .unwrap_or_else(|e| e.to_string()),
            "none of the 9 linear layers is quantized in the checkpoint",
        ),
        ("an empty prompt", generate(&[]), "empty"),
        ("a prompt longer than the context", generate(&[1; 17]), "do not fit the context"),
        ("a token id outside the vocabulary", generate(&[1, 96]), "outside the vocabulary"),
        (
            "a KV cache larger than allowed",
            engine.model.kv_cache(1 << 40, 1 << 30).map(|_| String::new()).unwrap_or_else(|e| e.to_string()),
            "KV cache",
        ),
        ("a model directory that does not exist", load_err(&ok.join("nowhere"), RunPath::F32), "config.json"),
    ];
    let mut failures = Vec::new();
    for (case, got, want) in &rows {
        eprintln!("{case}: {got}");
        if !got.contains(want) {
            failures.push(format!("{case}: expected \"{want}\" in \"{got}\""));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
