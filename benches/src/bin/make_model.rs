//! Writes a synthetic Llama checkpoint of a given shape: `config.json`, `model.safetensors` (bf16, random
//! normal weights of standard deviation 0.02, norms 1) and the tokenizer files of a donor model directory,
//! so the whole engine loads and runs it. Used to measure load times, memory and speed at the upstream
//! model's size (1.54 B parameters) without shipping such a model.
//!
//! `make-model --shape spark-shaped|smollm2-shaped --out DIR [--tokenizer-from DIR]` (the donor defaults to
//! the default model). Writing is skipped when `DIR` already holds a complete model of the same shape.

use std::path::PathBuf;

use int4_benches::synthetic::{shape_named, write_model};

#[derive(clap::Parser)]
#[command(
    name = "make-model",
    about = "Write a synthetic Llama checkpoint of a given shape (random weights, a donor's tokenizer)"
)]
struct Args {
    /// The shape: spark-shaped or smollm2-shaped.
    #[arg(long, default_value = "spark-shaped")]
    shape: String,
    /// Where to write it.
    #[arg(long)]
    out: PathBuf,
    /// The donor model whose tokenizer files are copied (default: the default model).
    #[arg(long)]
    tokenizer_from: Option<PathBuf>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let Some(model) = shape_named(&args.shape) else {
        eprintln!("make-model: unknown shape {} (spark-shaped, smollm2-shaped)", args.shape);
        std::process::exit(2);
    };
    let donor = args.tokenizer_from.clone().or_else(int4::cache::dirs::default_model_dir);
    if let Err(e) = write_model(&model, &args.out, donor.as_deref()) {
        eprintln!("make-model: {e}");
        std::process::exit(1);
    }
}
