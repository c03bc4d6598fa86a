//! Tokens per second on a real model, llama-bench style, for every path this machine runs.
//!
//! pp: a prompt of N token ids (`10, 11, …`) processed in one go, logits for the last token only; tg: N
//! tokens decoded one at a time after a one-token prompt, greedy. Each is repeated after a warm-up and
//! reported as mean ± standard deviation; the paths are interleaved repetition by repetition. Also the load
//! time and the process's anonymous memory after loading each path (the weights are quantized at load, so
//! the 4-bit paths hold 4-bit weights and the dense ones f32/bf16). W4A8 on an unquantized checkpoint is
//! quantized at load to integer zero points (round to nearest, group 128), as W4A16 is to float zeros.
//!
//! `model-bench [--quick] [--model DIR] [--json FILE]`; the model defaults to the one `cargo xtask
//! fetch-model` prepares.

use std::time::Instant;

use int4::engine::{Engine, LoadOptions, RunPath};
use int4::sampling::argmax;
use serde_json::json;

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let dir = int4_benches::model_dir_arg(&args, "model-bench");
    let (pp, tg, reps) = if quick { (64, 16, 2) } else { (512, 128, 3) };
    let paths = [("w4a16", RunPath::W4a16), ("w4a8", RunPath::W4a8), ("bf16", RunPath::Bf16), ("f32", RunPath::F32)];
    eprintln!(
        "model bench: {} (pp{pp}, tg{tg}, {reps} repetitions, {} threads)",
        dir.display(),
        rayon::current_num_threads()
    );
    let mut engines = Vec::new();
    for (name, path) in paths {
        let before = int4_benches::rss_anon_and_file().map_or(0, |r| r.0);
        let e =
            Engine::load(&dir, &LoadOptions { path, context: pp + tg + 8, ..LoadOptions::default() }).expect("load");
        let after = int4_benches::rss_anon_and_file().map_or(0, |r| r.0);
        eprintln!("  loaded {name} in {:.2} s", e.load_time.as_secs_f64());
        engines.push((name, e, after.saturating_sub(before)));
    }
    let prompt: Vec<u32> = (10..10 + pp as u32).collect();
    let mut pp_t: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    let mut tg_t: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
    for rep in 0..=reps {
        for (i, (_, e, _)) in engines.iter().enumerate() {
            let mut cache = e.new_cache().unwrap();
            let t = Instant::now();
            let _ = e.model.forward(&prompt, &mut cache, false).unwrap();
            let pp_s = t.elapsed().as_secs_f64();
            let mut cache = e.new_cache().unwrap();
            let mut logits = e.model.forward(&[10], &mut cache, false).unwrap();
            let t = Instant::now();
            for _ in 0..tg {
                let next = argmax(&logits);
                logits = e.model.forward(&[next], &mut cache, false).unwrap();
            }
            let tg_s = t.elapsed().as_secs_f64();
            if rep > 0 {
                pp_t[i].push(pp as f64 / pp_s);
                tg_t[i].push(tg as f64 / tg_s);
            }
        }
    }
    println!(
        "\n### Model: {} ({} threads)\n",
        dir.file_name().unwrap().to_string_lossy(),
        rayon::current_num_threads()
    );
    println!(
        "| path | kernels (decode / prefill of the MLP) | pp{pp} tok/s | tg{tg} tok/s | weights held | RssAnon after load | load |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, (name, e, rss)) in engines.iter().enumerate() {
        let (pm, ps) = mean_sd(&pp_t[i]);
        let (tm, ts) = mean_sd(&tg_t[i]);
        let k = &e.model.kernels(pp)[2];
        println!(
            "| {name} | {} / {} | {pm:.1} ± {ps:.1} | {tm:.1} ± {ts:.1} | {:.1} MiB | {:.1} MiB | {:.2} s |",
            k.decode,
            k.prefill,
            e.model.weight_bytes() as f64 / 1048576.0,
            *rss as f64 / 1048576.0,
            e.load_time.as_secs_f64()
        );
        rows.push(json!({
            "path": name, "decode_kernel": k.decode.name(), "prefill_kernel": k.prefill.name(),
            "pp": pp, "pp_tok_s_mean": pm, "pp_tok_s_sd": ps, "tg": tg, "tg_tok_s_mean": tm, "tg_tok_s_sd": ts,
            "weight_bytes": e.model.weight_bytes(), "rss_anon_after_load": rss, "load_s": e.load_time.as_secs_f64(),
        }));
    }
    if let Some(path) = arg("--json") {
        let doc = json!({"schema": "int4-model-bench/1", "model": dir, "threads": rayon::current_num_threads(), "quick": quick, "rows": rows});
        if let Some(d) = std::path::Path::new(&path).parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    }
}
