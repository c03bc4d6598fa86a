//! The bad-inputs table of `docs/bad-inputs.md`, one row per case: each bad input given to the engine must
//! give an error (or, where noted, a warning) containing the words the table quotes — never a panic and
//! never a silently wrong answer. Keep the two in step.

use std::path::Path;

use int4::{Engine, GenerationRequest, LoadOptions, Prompt, RunPath};
use int4_test_support::{CONFIG, TempDir, tiny_model, tiny_model_with};

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
fn with_config(name: &str, edit: impl Fn(&mut serde_json::Value)) -> TempDir {
    let dir = tiny_model(name);
    let mut cfg: serde_json::Value = serde_json::from_str(CONFIG).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// A copy of the tiny model whose safetensors header says `from` where it said `to`.
fn with_header_edit(name: &str, from: &str, to: &str) -> TempDir {
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
    let generate =
        |prompt: &[u32]| match engine.generate(GenerationRequest::greedy(Prompt::Ids(prompt.to_vec()), 4), |_| {}) {
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
        ("a model directory that does not exist", load_err(&ok.join("nowhere"), RunPath::F32), "No such file"),
        (
            "a file where the model directory should be",
            load_err(&ok.join("config.json"), RunPath::F32),
            "not a model directory",
        ),
        (
            "a KV cache made for another model",
            {
                let one_layer = with_config("bad-layers", |c| c["num_hidden_layers"] = 1.into());
                let other = Engine::load(&one_layer, &opts(RunPath::F32)).unwrap();
                let mut kv = other.new_cache().unwrap();
                engine.model.forward(&[1], &mut kv, false).map(|_| String::new()).unwrap_or_else(|e| e.to_string())
            },
            "was made for another model",
        ),
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

/// A layer whose N is not a multiple of 16 (a vocabulary of 90) runs on the padded 4-bit layout: its
/// logits are, bit for bit, the first 90 of the same model with its 96 tokens (each output channel is
/// computed on its own, and the 90 rows are quantized alike), and close to the fallback's, which needs no
/// padding (the W4A16 kernels may round activations to bf16, the fallback does not).
#[test]
fn a_vocabulary_not_a_multiple_of_16_is_padded_and_dropped() {
    use int4::Checkpoint;
    use safetensors::tensor::{Dtype, TensorView};
    let src = tiny_model("bad-vocab-src");
    let ckpt = Checkpoint::open(&src).unwrap();
    let dir = TempDir::new("bad-vocab90");
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = ckpt
        .tensors()
        .into_iter()
        .map(|(name, _)| {
            let mut shape = ckpt.shape(&name).unwrap().to_vec();
            let mut v = ckpt.f32(&name, &shape).unwrap();
            if name == "model.embed_tokens.weight" {
                v.truncate(90 * shape[1]);
                shape[0] = 90;
            }
            (name, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
        })
        .collect();
    let views: std::collections::HashMap<String, TensorView<'_>> =
        tensors.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG.replace("\"vocab_size\": 96", "\"vocab_size\": 90")).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let logits = |model: &Path, path| {
        let e = Engine::load(model, &opts(path)).unwrap();
        let mut kv = e.new_cache().unwrap();
        e.model.forward(&[1, 17, 33, 5, 89], &mut kv, true).unwrap()
    };
    let (w4, fallback, full) =
        (logits(&dir, RunPath::W4a16), logits(&dir, RunPath::Wna16), logits(&src, RunPath::W4a16));
    assert_eq!((w4.len(), full.len()), (5 * 90, 5 * 96));
    for p in 0..5 {
        let (got, want) = (&w4[p * 90..(p + 1) * 90], &full[p * 96..p * 96 + 90]);
        assert!(got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "position {p}: padded logits differ");
    }
    let scale = fallback.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = w4.iter().zip(&fallback).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 2e-2 * scale, "padded W4A16 differs from the fallback by {worst} (scale {scale})");
}
