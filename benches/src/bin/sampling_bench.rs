//! What sampling costs a decode: tokens per second of the same model generating the same number of tokens
//! greedy and with each sampling setting, alternated round by round.
//!
//! Each setting generates `--tokens` tokens (end-of-sequence tokens ignored, so every run is as long)
//! after the same chat prompt, through the generation API (`Engine::generate`), on the path the policy
//! picks. In each round every setting runs between two greedy runs (the settings in forward order in
//! even rounds, reverse in odd ones), and its ratio is to the mean of those two, so a drifting neighbour
//! cancels; each setting is reported as the median over rounds of its decode tok/s and of that ratio.
//!
//! Beside each, the sampler alone: microseconds per token over about 2000 draws from the model's logits
//! at each step of a sampled run (the logits copied afresh for each draw; the copy's own time subtracted).
//!
//! Settings: `greedy`; `t0.8-p0.95` (temperature 0.8, top-p 0.95); `t0.8-k40` (temperature 0.8, top-k
//! 40); `t0.8-minp0.05`; `penalties` (greedy with repetition 1.1, presence 0.5, frequency 0.5);
//! `logprobs20` (greedy, each token's log-probability and the top 20).
//!
//! Usage: `sampling-bench [--model DIR] [--rounds N] [--tokens N] [--json FILE]`.

use std::path::PathBuf;

use clap::Parser;
use int4::{ChatOptions, Engine, GenerationRequest, LoadOptions, Messages, Prompt, SamplingOverrides};
use serde_json::json;

#[derive(Parser)]
#[command(name = "sampling-bench", about = "Decode tok/s greedy and with each sampling setting, alternated")]
struct Args {
    /// The model (default: the one `cargo xtask fetch-model` prepares).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Rounds (each runs every setting once).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Setting {
    name: &'static str,
    sampling: SamplingOverrides,
    logprobs: Option<usize>,
}

fn settings() -> Vec<Setting> {
    let t =
        |temperature: f32| SamplingOverrides { temperature: Some(temperature), seed: Some(1), ..Default::default() };
    vec![
        Setting { name: "greedy", sampling: t(0.0), logprobs: None },
        Setting { name: "t0.8-p0.95", sampling: SamplingOverrides { top_p: Some(0.95), ..t(0.8) }, logprobs: None },
        Setting { name: "t0.8-k40", sampling: SamplingOverrides { top_k: Some(40), ..t(0.8) }, logprobs: None },
        Setting { name: "t0.8-minp0.05", sampling: SamplingOverrides { min_p: Some(0.05), ..t(0.8) }, logprobs: None },
        Setting {
            name: "penalties",
            sampling: SamplingOverrides {
                repetition_penalty: Some(1.1),
                presence_penalty: Some(0.5),
                frequency_penalty: Some(0.5),
                ..t(0.0)
            },
            logprobs: None,
        },
        Setting { name: "logprobs20", sampling: t(0.0), logprobs: Some(20) },
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let a = Args::parse();
    let fail = |msg: String| -> ! {
        eprintln!("sampling-bench: {msg}");
        std::process::exit(1);
    };
    if a.rounds == 0 || a.tokens < 2 {
        fail("--rounds must be at least 1 and --tokens at least 2".into());
    }
    let dir = match a.model.clone().or_else(int4::cache::dirs::default_model_dir) {
        Some(d) => d,
        None => fail("no model directory: pass --model DIR, or set INT4_MODEL_DIR or HOME".into()),
    };
    let opts = LoadOptions::from_env().unwrap_or_else(|e| fail(e.to_string()));
    let engine = Engine::load(&dir, &opts).unwrap_or_else(|e| fail(format!("{}: {e}", dir.display())));
    let cpu = int4::select::snapshot_for_policy()
        .map(|s| {
            let (f, m, _) = s.family_model_stepping;
            format!("{} family {f} model {m}", s.model_name)
        })
        .unwrap_or_default();
    eprintln!(
        "sampling bench: {} on {} ({}), {} tokens per run, {} rounds, {} threads",
        dir.display(),
        engine.plan.path,
        cpu,
        a.tokens,
        a.rounds,
        rayon::current_num_threads()
    );
    let mut messages = Messages::new();
    messages.push("user", "Write a long story about a lighthouse keeper who finds a message in a bottle.");
    let run = |s: &Setting| -> f64 {
        let mut req =
            GenerationRequest::new(Prompt::Chat { messages: messages.clone(), options: ChatOptions::default() });
        req.sampling = s.sampling;
        req.max_tokens = Some(a.tokens);
        req.ignore_eos = true;
        req.logprobs = s.logprobs;
        let out = engine.generate(req, |_| {}).unwrap_or_else(|e| fail(e.to_string()));
        (out.tokens.len() - 1) as f64 / out.decode.as_secs_f64()
    };
    let all = settings();
    // A warm-up run of each.
    for s in &all {
        run(s);
    }
    // Each setting between two greedy runs: its ratio is to their mean, so drift within a round cancels.
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); all.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); all.len()];
    for round in 0..a.rounds {
        let order: Vec<usize> = if round % 2 == 0 { (1..all.len()).collect() } else { (1..all.len()).rev().collect() };
        let mut before = run(&all[0]);
        tps[0].push(before);
        ratios[0].push(1.0);
        for i in order {
            let x = run(&all[i]);
            let after = run(&all[0]);
            tps[i].push(x);
            tps[0].push(after);
            ratios[i].push(x / ((before + after) / 2.0));
            before = after;
        }
    }
    // The sampler alone, on the model's own logits at every step of a sampled run (temperature 0.8, so
    // the distributions are those sampling meets): microseconds per token, the copy of the logits each
    // draw starts from subtracted.
    let prompt = engine
        .text
        .encode(
            &engine
                .text
                .apply_chat_template(&messages, &ChatOptions::default())
                .unwrap_or_else(|e| fail(e.to_string())),
        )
        .unwrap_or_else(|e| fail(e.to_string()));
    let mut cache = engine.new_cache().unwrap_or_else(|e| fail(e.to_string()));
    let mut steps = vec![engine.model.forward(&prompt, &mut cache, false).unwrap_or_else(|e| fail(e.to_string()))];
    let mut walk = int4::Sampler::new(all[1].sampling.resolve());
    while steps.len() < a.tokens.min(cache.capacity() - prompt.len()) {
        let mut l = steps[steps.len() - 1].clone();
        let id = walk.sample(&mut l);
        steps.push(engine.model.forward(&[id], &mut cache, false).unwrap_or_else(|e| fail(e.to_string())));
    }
    let passes = (2000 / steps.len()).max(1);
    let draws = (passes * steps.len()) as f64;
    let mut buf = steps[0].clone();
    let t = std::time::Instant::now();
    for _ in 0..passes {
        for l in &steps {
            buf.copy_from_slice(l);
            std::hint::black_box(&mut buf);
        }
    }
    let copy_us = t.elapsed().as_secs_f64() * 1e6 / draws;
    let mut sampler_us = Vec::new();
    for s in &all {
        let params = s.sampling.or(engine.defaults.sampling).resolve();
        let mut sampler = int4::Sampler::new(params);
        sampler.observe_prompt(&prompt);
        let t = std::time::Instant::now();
        for _ in 0..passes {
            for l in &steps {
                buf.copy_from_slice(l);
                let id = sampler.sample(&mut buf);
                if let Some(top) = s.logprobs {
                    std::hint::black_box(sampler.logprobs(l, id, top));
                }
            }
        }
        sampler_us.push((t.elapsed().as_secs_f64() * 1e6 / draws - copy_us).max(0.0));
    }
    let mut rows = Vec::new();
    println!(
        "| setting | decode tok/s (median) | range | ratio to the greedy runs around it (median) | sampler µs/token |"
    );
    println!("|---|---|---|---|---|");
    for (i, s) in all.iter().enumerate() {
        let ratios = ratios[i].clone();
        let (lo, hi) = tps[i].iter().fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        let (m, r) = (median(tps[i].clone()), median(ratios.clone()));
        let us = sampler_us[i];
        println!("| {} | {m:.1} | {lo:.1}–{hi:.1} | {r:.3} | {us:.1} |", s.name);
        rows.push(json!({
            "setting": s.name, "tok_s": tps[i], "median_tok_s": m, "ratios": ratios, "median_ratio": r,
            "sampler_us_per_token": us,
        }));
    }
    if let Some(path) = &a.json {
        let doc = json!({
            "schema": "int4-sampling-bench/1",
            "model": dir.display().to_string(),
            "cpu": cpu,
            "path": engine.plan.path.to_string(),
            "threads": rayon::current_num_threads(),
            "tokens": a.tokens,
            "rounds": a.rounds,
            "settings": rows,
        });
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
    }
}
