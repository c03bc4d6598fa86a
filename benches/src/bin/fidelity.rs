//! Fidelity of each path against the same engine's exact path, on the 12 greedy prompts of the upstream
//! evaluation (3 chat, 9 plain) and teacher-forced over the reference's own continuations.
//!
//! The reference is the f32 path: for the default model (shipped as GGUF Q4_1) that is the checkpoint's
//! exact dequantization, i.e. the model as its authors shipped it. Each other path is loaded from the same
//! directory and compared with it:
//!
//! * greedy, 64 new tokens per prompt: exact matches out of 12 and the mean prefix kept (common-prefix
//!   characters over reference characters, as upstream computes it); small models have many near-ties,
//!   so also where each run first diverges and the reference's top-2 logit gap there;
//! * teacher-forced over prompt + reference continuation (every position after the prompt): top-1
//!   agreement with the reference and the mean KL(reference ‖ path) in nats. These positions are the
//!   reference's own greedy text, where it is confident, so agreement reads higher than on natural text.
//!   Scored by `int4_quant::eval` (the scoring `int4 eval` uses on natural text).
//!
//! `fidelity [--model DIR] [--ref DIR] [--json FILE] [--quick]` (`--quick`: 4 prompts, 16 tokens).
//!
//! `--ref DIR` takes the reference from another directory's f32 path: to score a quantized export (`int4
//! quantize`) against the original model rather than against its own dequantized weights. The export is
//! then run on its f32 path (its stored 4-bit weights decoded exactly: the quantization's own error) and on
//! the W4A16 and W4A8 paths (as stored, plus each kernel's rounding).

use int4::{ChatOptions, Engine, HeadBits, LoadOptions, Messages, RunPath, argmax, top2_gap};
use int4_benches::prompts::{BenchPrompt, NamedPrompt, prompt_set};
use int4_layout::GroupSize;
use int4_quant::eval::{Tally, score_position};
use serde_json::json;

fn prompts(e: &Engine) -> Vec<(String, Vec<u32>)> {
    prompt_set()
        .into_iter()
        .map(|NamedPrompt { name, prompt }| {
            let text = match prompt {
                BenchPrompt::Plain(p) => p.to_string(),
                BenchPrompt::Chat(turns) => {
                    let mut messages = Messages::new();
                    for (role, content) in &turns {
                        messages.push(role, content);
                    }
                    e.text
                        .apply_chat_template(&messages, &ChatOptions::default())
                        .expect("the model has a chat template")
                }
            };
            let ids = e.text.encode(&text).expect("encode");
            (name, ids)
        })
        .collect()
}

/// Greedy continuation: the tokens and the logits that chose each.
fn greedy(e: &Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = e.new_cache().expect("cache");
    let mut logits = e.model.forward(prompt, &mut cache, false).expect("prefill");
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&logits);
        all.push(logits.clone());
        toks.push(t);
        if e.model.config().eos_token_ids.contains(&t) || toks.len() == n {
            break;
        }
        logits = e.model.forward(&[t], &mut cache, false).expect("decode");
    }
    (toks, all)
}

/// Logits at every position of `ids` (teacher-forced).
fn all_logits(e: &Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = e.new_cache().expect("cache");
    let vocab = e.model.config().vocab_size;
    let flat = e.model.forward(ids, &mut cache, true).expect("forward");
    flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

#[derive(clap::Parser)]
#[command(
    name = "fidelity",
    about = "Fidelity of each path against the f32 path on the 12 prompts of the committed set"
)]
struct Args {
    /// The model (default: the one `cargo xtask fetch-model` prepares).
    #[arg(long)]
    model: Option<String>,
    /// Take the reference from this directory's f32 path (to score a quantized export against its original).
    #[arg(long = "ref")]
    reference: Option<std::path::PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// 4 prompts of 16 tokens.
    #[arg(long)]
    quick: bool,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let quick = args.quick;
    let dir = int4_benches::model_dir_arg(args.model.as_deref(), "fidelity", false);
    let new_tokens = if quick { 16 } else { 64 };
    let ref_dir = args.reference.clone();
    let load_from = |dir: &std::path::Path, path: RunPath, group: GroupSize, head_bits: HeadBits| {
        // An f32 KV cache on every path, so what is measured against the f32 path is the weights' numerics.
        let opts = LoadOptions {
            path,
            group_size: group,
            context: 4096,
            head_bits,
            kv: Some(int4::KvType::F32),
            ..LoadOptions::default()
        };
        Engine::load(dir, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    };
    let load = |path: RunPath, group: GroupSize, head_bits| load_from(&dir, path, group, head_bits);
    let reference = load_from(ref_dir.as_deref().unwrap_or(&dir), RunPath::F32, GroupSize::G128, HeadBits::Four);
    let mut cases = prompts(&reference);
    if quick {
        cases.truncate(4);
    }
    eprintln!("fidelity: {} prompts, {new_tokens} new tokens, reference f32", cases.len());
    let refs: Vec<(Vec<u32>, Vec<Vec<f32>>)> = cases.iter().map(|(_, p)| greedy(&reference, p, new_tokens)).collect();
    let ref_text: Vec<String> = refs.iter().map(|(t, _)| reference.text.decode(t).expect("decode")).collect();
    let ref_forced: Vec<Vec<Vec<f32>>> = cases
        .iter()
        .zip(&refs)
        .map(|((_, p), (t, _))| all_logits(&reference, &[p.as_slice(), t.as_slice()].concat()))
        .collect();

    let four = HeadBits::Four;
    let paths: &[(&str, RunPath, GroupSize, HeadBits)] = if ref_dir.is_some() {
        &[
            ("f32 (export decoded)", RunPath::F32, GroupSize::G128, four),
            ("w4a16 (as stored)", RunPath::W4a16, GroupSize::G128, four),
            ("w4a8 (as stored)", RunPath::W4a8, GroupSize::G128, four),
        ]
    } else {
        &[
            ("w4a16 g32", RunPath::W4a16, GroupSize::G32, four),
            ("w4a16 g128", RunPath::W4a16, GroupSize::G128, four),
            ("w4a8 g32", RunPath::W4a8, GroupSize::G32, four),
            ("w4a8 g32, 8-bit head", RunPath::W4a8, GroupSize::G32, HeadBits::Eight),
            ("w4a8 g128", RunPath::W4a8, GroupSize::G128, four),
            ("bf16", RunPath::Bf16, GroupSize::G128, four),
        ]
    };
    let ref_name = ref_dir.as_deref().unwrap_or(&dir).file_name().unwrap_or_default().to_string_lossy().to_string();
    println!(
        "\n### Fidelity against the f32 path of {ref_name}: {}\n",
        dir.file_name().unwrap_or_default().to_string_lossy()
    );
    println!(
        "| path | kernels (decode / prefill) | exact | mean prefix kept | first divergence (token, ref top-2 gap) per prompt | teacher-forced top-1 | mean KL (nats) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &(name, path, group, head_bits) in paths {
        let e = load(path, group, head_bits);
        let k = &e.model.kernels(64)[2];
        let (mut exact, mut kept, mut total) = (0, 0usize, 0usize);
        let mut divergences = Vec::new();
        let mut forced = Tally::default();
        for (i, (case, prompt)) in cases.iter().enumerate() {
            let (toks, _) = greedy(&e, prompt, new_tokens);
            let text = e.text.decode(&toks).expect("decode");
            exact += usize::from(text == ref_text[i]);
            kept += text.chars().zip(ref_text[i].chars()).take_while(|(a, b)| a == b).count();
            total += ref_text[i].chars().count().max(1);
            let first = toks.iter().zip(&refs[i].0).position(|(a, b)| a != b);
            divergences.push(match first {
                Some(j) => format!("{case}: {j} ({:.2})", top2_gap(&refs[i].1[j])),
                None if toks.len() == refs[i].0.len() => format!("{case}: —"),
                None => format!("{case}: {} (length)", toks.len().min(refs[i].0.len())),
            });
            let ids = [prompt.as_slice(), refs[i].0.as_slice()].concat();
            let got = all_logits(&e, &ids);
            for pos in prompt.len() - 1..ids.len() - 1 {
                let s = score_position(&ref_forced[i][pos], &got[pos], ids[pos + 1]);
                forced.push(s.unwrap_or_else(|| panic!("{case}: non-finite logits at position {pos}")));
            }
        }
        let prefix = kept as f64 / total as f64;
        let (positions, top1, kl) = (forced.positions, forced.top1_agreement(), forced.mean_kl());
        println!(
            "| {name} | {} / {} | {exact}/{} | {prefix:.4} | {} | {:.1}% of {positions} | {kl:.4} |",
            k.decode,
            k.prefill,
            cases.len(),
            divergences.join("; "),
            100.0 * top1
        );
        rows.push(json!({
            "path": name, "decode_kernel": k.decode.name(), "prefill_kernel": k.prefill.name(),
            "exact": exact, "prompts": cases.len(), "mean_prefix_kept": prefix, "first_divergence": divergences,
            "teacher_forced_positions": positions, "teacher_forced_top1": top1, "mean_kl_nats": kl,
        }));
    }
    if let Some(path) = args.json.clone() {
        let reference = ref_dir.as_ref().map_or_else(|| json!("f32"), |d| json!({"f32_of": d}));
        let doc = json!({"schema": "int4-fidelity/1", "model": dir, "reference": reference, "new_tokens": new_tokens, "rows": rows});
        if let Some(d) = std::path::Path::new(&path).parent() {
            std::fs::create_dir_all(d).expect("json directory");
        }
        std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("json")).expect("write json");
    }
}
