//! The default model's tokenizer (the `tokenizer.json` that `cargo xtask fetch-model` writes from the
//! SmolLM2 GGUF) against golden ids from a tokenizer built independently from the same GGUF: its
//! vocabulary, merges and token types read by the `gguf` Python package and assembled in the Python
//! `tokenizers` library as llama.cpp tokenizes the `smollm` pre-tokenizer type, cross-checked with
//! transformers' GGUF tokenizer (`fixtures/tokenizer_golden.json`, made by `scripts/tokenizer_reference.py`;
//! command and versions inside). The strings cover accents (precomposed and combining), CJK, Hangul, RTL
//! scripts, emoji with skin tones and ZWJ sequences, runs of spaces, tabs and newlines, leading spaces,
//! code, numbers, and the control tokens (`<|im_start|>`, `<|im_end|>`, …) in running text, which must
//! come out as their single special ids.
//!
//! Without the default model these tests are skipped and the skip recorded (a failure under `CI=true`).

use int4::TextCodec;
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!("fixtures/tokenizer_golden.json")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn cases(fx: &Value) -> &Vec<Value> {
    fx["cases"].as_array().unwrap()
}

/// The model directory was converted from the GGUF the golden ids were made from.
#[test]
fn model_comes_from_the_golden_gguf() {
    let Some(dir) = int4_test_support::default_model_or_skip!("tokenizer_golden") else { return };
    let source: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("int4-source.json")).unwrap()).unwrap();
    assert_eq!(source["gguf_sha256"], golden()["gguf_sha256"], "{}", dir.display());
}

/// `encode` (no special tokens added) gives exactly the golden ids for every string.
#[test]
fn encode_matches_golden_ids() {
    let Some(dir) = int4_test_support::default_model_or_skip!("tokenizer_golden") else { return };
    let text = TextCodec::load(&dir).unwrap();
    let fx = golden();
    let mut mismatches = Vec::new();
    for case in cases(&fx) {
        let (name, s) = (case["name"].as_str().unwrap(), case["text"].as_str().unwrap());
        let want = ids(&case["ids"]);
        let got = text.encode(s).unwrap();
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
            mismatches.push(format!(
                "{name} {s:?}: first difference at index {at}\n  got    {got:?}\n  golden {want:?}\n  golden tokens {}",
                case["tokens"]
            ));
        }
    }
    assert_eq!(cases(&fx).len(), 24);
    assert!(mismatches.is_empty(), "{} of {} strings differ:\n{}", mismatches.len(), 24, mismatches.join("\n"));
}

/// `decode` of the golden ids gives the string back, byte for byte (special tokens kept).
#[test]
fn decode_round_trips() {
    let Some(dir) = int4_test_support::default_model_or_skip!("tokenizer_golden") else { return };
    let text = TextCodec::load(&dir).unwrap();
    let fx = golden();
    let mut failures = Vec::new();
    for case in cases(&fx) {
        let (name, s) = (case["name"].as_str().unwrap(), case["text"].as_str().unwrap());
        let back = text.decode(&ids(&case["ids"])).unwrap();
        if back != s {
            failures.push(format!("{name}: {s:?} decodes back as {back:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Control tokens in running text are each one special id, whatever is glued to them, while near-misses
/// (`<|im_start` without its closing, other case, inner spaces) are plain text.
#[test]
fn control_tokens_in_text_are_single_ids() {
    let Some(dir) = int4_test_support::default_model_or_skip!("tokenizer_golden") else { return };
    let text = TextCodec::load(&dir).unwrap();
    let fx = golden();
    assert_eq!(fx["specials_parsed_as_specials"], true);
    let control = fx["tokenizer"]["control_tokens"].as_object().unwrap();
    let id = |t: &str| control[t].as_u64().unwrap() as u32;
    let (start, end, eot) = (id("<|im_start|>"), id("<|im_end|>"), id("<|endoftext|>"));
    let case = |name: &str| cases(&fx).iter().find(|c| c["name"] == name).unwrap().clone();
    for (name, want) in [
        ("chatml", vec![start, end, start]),
        ("specials_glued", vec![end, eot, start, end]),
        ("specials_other", vec![id("<repo_name>"), id("<file_sep>")]),
        ("specials_broken", vec![]),
    ] {
        let c = case(name);
        assert_eq!(ids(&c["special_ids"]), want, "{name}: golden special ids");
        let got = text.encode(c["text"].as_str().unwrap()).unwrap();
        let specials: Vec<u32> = got.iter().copied().filter(|i| control.values().any(|v| v == *i)).collect();
        assert_eq!(specials, want, "{name}: special ids in {got:?}");
    }
}
