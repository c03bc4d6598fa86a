//! Writes a synthetic Llama checkpoint of a given shape: `config.json`, `model.safetensors` (bf16, random
//! normal weights of standard deviation 0.02, norms 1) and the tokenizer files of a donor model directory,
//! so the whole engine loads and runs it. Used to measure load times, memory and speed at the upstream
//! model's size (1.54 B parameters) without shipping such a model.
//!
//! `make-model --shape spark-shaped|smollm2-shaped --out DIR [--tokenizer-from DIR]` (the donor defaults to
//! the default model). Writing is skipped when `DIR` already holds a complete model of the same shape.

use std::path::PathBuf;

use int4_benches::synthetic::{shape_named, write_model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let name = arg("--shape").unwrap_or_else(|| "spark-shaped".into());
    let Some(model) = shape_named(&name) else {
        eprintln!("make-model: unknown shape {name} (spark-shaped, smollm2-shaped)");
        std::process::exit(2);
    };
    let Some(out) = arg("--out").map(PathBuf::from) else {
        eprintln!("make-model: give --out DIR");
        std::process::exit(2);
    };
    let donor = arg("--tokenizer-from").map(PathBuf::from).or_else(int4::cache::dirs::default_model_dir);
    if let Err(e) = write_model(&model, &out, donor.as_deref()) {
        eprintln!("make-model: {e}");
        std::process::exit(1);
    }
}
