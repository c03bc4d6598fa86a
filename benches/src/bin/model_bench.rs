//! Tokens per second on a whole model, llama-bench style, for every path this machine runs, beside the
//! machine's streaming-read ceiling measured in the same run.
//!
//! * **pp** — a prompt of N token ids (`10, 11, …`) processed in one go, logits for the last token only
//!   (as llama-bench does), at several prompt lengths (the prefill batch-size sweep; pp64 and pp512 among
//!   them): [`int4::speed::prompt_time`], as `int4 bench` times it;
//! * **tg** — N tokens decoded one at a time after a one-token prompt, greedy
//!   ([`int4::speed::generation_time`]);
//! * **batched decode** — B sequences (4 and 16) decoded together, one token each per step
//!   (`Model::forward_batch`): tokens per second summed over the sequences;
//! * **decode GB/s** — the bytes one decode step reads (`Model::decode_bytes`) times tg tok/s, against a
//!   streaming read over a buffer of the same size, timed in the same rounds (the fastest of several passes
//!   per round).
//!
//! Each figure is the mean ± standard deviation over repetitions after a warm-up; the paths are interleaved
//! repetition by repetition so that a noisy neighbour moves them together. Per path, also: the kernels that
//! ran per phase as the model reports them, load time and where the packed weights came from (the artifact
//! cache: cold, warm), the weights held and read per decode step, the KV cache, and `RssAnon` added by the
//! load, settled and at its peak (sampled every 10 ms during the load).
//!
//! Models: a directory, by default the one `cargo xtask fetch-model` prepares, or `spark-shaped` — a
//! synthetic model with the upstream model's shapes (1.54 B parameters) and seeded random weights,
//! generated under `target/bench/models/` on first use (speed and memory only: its outputs mean nothing).
//!
//! `model-bench [--quick] [--model DIR|spark-shaped] [--paths w4a16,w4a16-h8,w4a16-split,w4a8,w4a8-h8,wna16,bf16,f32]
//! [--reps N] [--group N] [--json FILE] [--svg FILE]`; `--group` is the group size an unquantized checkpoint
//! is quantized to at load (default 128). The JSON schema (`int4-model-bench/2`) is documented in
//! `docs/bench.md`.

use std::time::{Duration, Instant};

use int4::{Engine, HeadBits, KvCache, LoadOptions, PackedFrom, RunPath, argmax};
use int4_benches::{PeakRssAnon, rss_anon_and_file};
use serde_json::json;

/// A path as the bench names it.
#[derive(Clone, Copy)]
struct PathSpec {
    name: &'static str,
    path: RunPath,
    direct_dequant: Option<bool>,
    /// Bits of a head the checkpoint stores unquantized (a stored head runs as stored).
    head_bits: HeadBits,
    about: &'static str,
    /// Measured lightly: the first prompt length of the sweep only, at most 32 generated tokens, no
    /// batched decode (the portable fallback is an order of magnitude slower; its full rows would take
    /// most of the run).
    light: bool,
}

const PATHS: [PathSpec; 8] = [
    PathSpec {
        name: "w4a16",
        path: RunPath::W4a16,
        direct_dequant: None,
        head_bits: HeadBits::Four,
        about: "direct dequant",
        light: false,
    },
    PathSpec {
        name: "w4a16-h8",
        path: RunPath::W4a16,
        direct_dequant: None,
        head_bits: HeadBits::Eight,
        about: "direct dequant, 8-bit head (Q8_0 grid, W8A16 kernels)",
        light: false,
    },
    PathSpec {
        name: "w4a16-split",
        path: RunPath::W4a16,
        direct_dequant: Some(false),
        head_bits: HeadBits::Four,
        about: "direct_dequant: false (split-halves copy for prefill)",
        light: false,
    },
    PathSpec {
        name: "w4a8",
        path: RunPath::W4a8,
        direct_dequant: None,
        head_bits: HeadBits::Four,
        about: "int8 activations",
        light: false,
    },
    PathSpec {
        name: "w4a8-h8",
        path: RunPath::W4a8,
        direct_dequant: None,
        head_bits: HeadBits::Eight,
        about: "int8 activations, 8-bit head (Q8_0 grid)",
        light: false,
    },
    PathSpec {
        name: "wna16",
        path: RunPath::Wna16,
        direct_dequant: None,
        head_bits: HeadBits::Four,
        about: "portable fallback (measured lightly)",
        light: true,
    },
    PathSpec {
        name: "bf16",
        path: RunPath::Bf16,
        direct_dequant: None,
        head_bits: HeadBits::Four,
        about: "unquantized bf16",
        light: false,
    },
    PathSpec {
        name: "f32",
        path: RunPath::F32,
        direct_dequant: None,
        head_bits: HeadBits::Four,
        about: "unquantized f32 (the reference)",
        light: false,
    },
];

/// What one run measures.
struct Plan {
    pp: usize,
    tg: usize,
    sweep: Vec<usize>,
    batches: Vec<usize>,
    batch_steps: usize,
    reps: usize,
}

/// One loaded path and its samples.
struct Loaded {
    spec: PathSpec,
    engine: Engine,
    rss_settled: u64,
    rss_peak: u64,
    rss_file: u64,
    kv_bytes: usize,
    /// Prompt length → tok/s per repetition.
    pp: Vec<Vec<f64>>,
    tg: Vec<f64>,
    batched: Vec<Vec<f64>>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

/// Passes of the streaming read per repetition, the fastest taken.
const READ_PASSES: usize = 16;

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("model-bench: {msg}");
    std::process::exit(1);
}

#[derive(clap::Parser)]
#[command(
    name = "model-bench",
    about = "Tokens per second, memory and load time of a model on every path, beside the streaming-read ceiling"
)]
struct Args {
    /// Fewer paths, prompt lengths and repetitions (the CI smoke run).
    #[arg(long)]
    quick: bool,
    /// A model directory or GGUF, or `spark-shaped` / `smollm2-shaped` (synthetic; default: the model
    /// `cargo xtask fetch-model` prepares).
    #[arg(long)]
    model: Option<String>,
    /// Paths, comma-separated: w4a16, w4a16-h8, w4a16-split, w4a8, w4a8-h8, wna16, bf16, f32 (default: all
    /// of them; fewer with --quick or on the spark-shaped model).
    #[arg(long)]
    paths: Option<String>,
    /// Measured repetitions after the warm-up.
    #[arg(long)]
    reps: Option<usize>,
    /// Group size an unquantized checkpoint is quantized to at load: 32, 64, 128 or 256.
    #[arg(long, default_value_t = 128)]
    group: i64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Write the chart (SVG) here.
    #[arg(long)]
    svg: Option<String>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let quick = args.quick;
    let dir = int4_benches::model_dir_arg(args.model.as_deref(), "model-bench", true);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap_or_default();
    let synthetic =
        serde_json::from_str::<serde_json::Value>(&config).ok().and_then(|c| c["synthetic"].as_str().map(String::from));
    let large = synthetic.as_deref() == Some("spark-shaped");
    let default_paths = match (quick, large) {
        (true, _) => "w4a16,w4a8,bf16",
        // f32 weights of a 1.54 B model are 6 GB and decode at a few tokens per second, and the portable
        // fallback prefills at a few tokens per second: both left out unless named.
        (false, true) => "w4a16,w4a16-split,w4a8,bf16",
        (false, false) => "w4a16,w4a16-h8,w4a16-split,w4a8,w4a8-h8,wna16,bf16,f32",
    };
    let chosen = args.paths.clone().unwrap_or_else(|| default_paths.into());
    let specs: Vec<PathSpec> = chosen
        .split(',')
        .map(|n| {
            PATHS
                .iter()
                .copied()
                .find(|p| p.name == n)
                .unwrap_or_else(|| fail(format!("unknown path {n} (one of {})", PATHS.map(|p| p.name).join(", "))))
        })
        .collect();
    let mut plan = if quick {
        Plan { pp: 64, tg: 16, sweep: vec![16, 64], batches: vec![4], batch_steps: 4, reps: 1 }
    } else {
        Plan { pp: 512, tg: 128, sweep: vec![64, 128, 256, 512], batches: vec![4, 16], batch_steps: 32, reps: 3 }
    };
    if large && !quick {
        // A 1.54 B model: two repetitions, the sweep's ends and shorter batched runs keep the full run
        // within its time (the sd is over two).
        plan.reps = 2;
        plan.sweep = vec![64, 512];
        plan.batch_steps = 16;
    }
    if let Some(r) = args.reps {
        plan.reps = r;
    }
    let threads = rayon::current_num_threads();
    let name = dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().to_string());
    eprintln!(
        "model bench: {} (pp{} sweep {:?}, tg{}, batched decode {:?}, {} repetitions after a warm-up, {threads} threads)",
        dir.display(),
        plan.pp,
        plan.sweep,
        plan.tg,
        plan.batches,
        plan.reps
    );
    let context = plan.pp.max(plan.tg + 1).max(plan.batch_steps + 1) + 8;
    // The group size an unquantized checkpoint is quantized to at load (128 unless `--group N`).
    let group = int4::layout::GroupSize::from_checkpoint(args.group)
        .unwrap_or_else(|e| fail(format!("--group {}: {e}", args.group)));

    let mut loaded: Vec<Loaded> = Vec::new();
    for spec in specs {
        let (before, file_before) = rss_anon_and_file().unwrap_or((0, 0));
        let peak = PeakRssAnon::start(Duration::from_millis(10));
        let opts = LoadOptions {
            path: spec.path,
            context,
            direct_dequant: spec.direct_dequant,
            head_bits: spec.head_bits,
            group_size: group,
            ..LoadOptions::default()
        };
        let engine = Engine::load(&dir, &opts).unwrap_or_else(|e| fail(format!("loading {}: {e}", spec.name)));
        let peak = peak.stop();
        let (after, file_after) = rss_anon_and_file().unwrap_or((0, 0));
        let kv_bytes = engine.new_cache().map(|c| c.bytes()).unwrap_or(0);
        eprintln!("  loaded {} in {:.2} s ({})", spec.name, engine.load_time.as_secs_f64(), from(&engine.packed_from));
        loaded.push(Loaded {
            spec,
            engine,
            rss_settled: after.saturating_sub(before),
            rss_peak: peak.saturating_sub(before),
            rss_file: file_after.saturating_sub(file_before),
            kv_bytes,
            pp: vec![Vec::new(); plan.sweep.len()],
            tg: Vec::new(),
            batched: vec![Vec::new(); plan.batches.len()],
        });
    }
    if loaded.is_empty() {
        fail("no paths to run");
    }

    // The streaming-read ceiling over a buffer the size of the largest 4-bit decode step's reads (the
    // paths whose decode should stream at that rate), or of the largest step when only dense paths run.
    let dense = |l: &Loaded| matches!(l.spec.path, RunPath::Bf16 | RunPath::F32);
    let largest =
        |four_bit: bool| loaded.iter().filter(|l| dense(l) != four_bit).map(|l| l.engine.model.decode_bytes()).max();
    let read_len = largest(true).or_else(|| largest(false)).unwrap_or(0).max(1 << 20);
    let read_buf: Vec<u8> = (0..read_len).map(|i| (i * 31 + 7) as u8).collect();
    let mut read_gbs = Vec::new();
    let mut sink = 0u64;

    let started = Instant::now();
    let total = loaded.len();
    for rep in 0..=plan.reps {
        // The fastest of several passes: right after the decode steps the last-level cache keeps their
        // weights and admits a new stream of the same size only slowly, so the first passes time where
        // the buffer was left (on the AMX Xeon of docs/perf.md, 20–30 GB/s for three or four passes, then
        // 51), not how fast the machine reads it.
        let mut best = 0.0f64;
        for _ in 0..READ_PASSES {
            let t = Instant::now();
            sink ^= int4::kernels::ceiling::stream_read(&read_buf);
            best = best.max(read_len as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        if rep > 0 {
            read_gbs.push(best);
        }
        for (li, l) in loaded.iter_mut().enumerate() {
            eprint!(
                "\r  repetition {rep}/{} ({}), path {}/{}: {:<12} {:.0} s elapsed   ",
                plan.reps,
                if rep == 0 { "warm-up" } else { "measured" },
                li + 1,
                total,
                l.spec.name,
                started.elapsed().as_secs_f64()
            );
            let e = &l.engine;
            let sweep = if l.spec.light { &plan.sweep[..1] } else { &plan.sweep[..] };
            let tg = if l.spec.light { plan.tg.min(32) } else { plan.tg };
            let batches = if l.spec.light { &[][..] } else { &plan.batches[..] };
            for (si, &n) in sweep.iter().enumerate() {
                let took = int4::speed::prompt_time(e, n).unwrap_or_else(|err| fail(err));
                if rep > 0 {
                    l.pp[si].push(n as f64 / took.as_secs_f64());
                }
            }
            let took = int4::speed::generation_time(e, tg).unwrap_or_else(|err| fail(err));
            if rep > 0 {
                l.tg.push(tg as f64 / took.as_secs_f64());
            }
            for (bi, &b) in batches.iter().enumerate() {
                let mut caches: Vec<KvCache> = (0..b).map(|_| new_cache(e)).collect();
                let mut next: Vec<u32> = Vec::with_capacity(b);
                for (i, c) in caches.iter_mut().enumerate() {
                    let lg = e.model.forward(&[10 + i as u32], c, false).unwrap_or_else(|err| fail(err));
                    next.push(argmax(&lg));
                }
                let vocab = e.model.config().vocab_size;
                let t = Instant::now();
                for _ in 0..plan.batch_steps {
                    let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
                    let lg = e.model.forward_batch(&next, &mut refs).unwrap_or_else(|err| fail(err));
                    for (i, n) in next.iter_mut().enumerate() {
                        *n = argmax(&lg[i * vocab..(i + 1) * vocab]);
                    }
                }
                if rep > 0 {
                    l.batched[bi].push((b * plan.batch_steps) as f64 / t.elapsed().as_secs_f64());
                }
            }
        }
    }
    eprintln!("\r  done in {:.0} s{:60}", started.elapsed().as_secs_f64(), if sink == 1 { " " } else { "" });

    let (read_m, read_sd) = mean_sd(&read_gbs);
    let kind = synthetic
        .as_deref()
        .map_or(String::new(), |s| format!(", synthetic {s}: random weights, speed and memory only"));
    println!("\n### Model: {name} ({threads} threads{kind})\n");
    println!(
        "Streaming read over a {:.0} MiB buffer, same rounds: {read_m:.1} ± {read_sd:.1} GB/s.\n",
        read_len as f64 / 1048576.0
    );
    println!(
        "| path | kernels: decode / prefill (MLP) | pp{} tok/s | tg{} tok/s | decode GB/s (% of read) | weights held / read per token | load |",
        plan.pp, plan.tg
    );
    println!("|---|---|---|---|---|---|---|");
    let pp_index = plan.sweep.iter().position(|&n| n == plan.pp).unwrap_or(plan.sweep.len() - 1);
    let mut rows = Vec::new();
    for l in &loaded {
        let e = &l.engine;
        let k = &e.model.kernels(plan.pp)[2];
        let (pm, ps) = mean_sd(&l.pp[pp_index]);
        let (tm, ts) = mean_sd(&l.tg);
        let decode_bytes = e.model.decode_bytes();
        let gbs = decode_bytes as f64 * tm / 1e9;
        let tg_note = if l.spec.light { format!(" (tg{})", plan.tg.min(32)) } else { String::new() };
        println!(
            "| {} | {} / {} | {} | {}{tg_note} | {gbs:.1} ({:.0}%) | {:.1} / {:.1} MiB | {:.2} s {} |",
            l.spec.name,
            k.decode,
            k.prefill,
            cell(pm, ps),
            cell(tm, ts),
            100.0 * gbs / read_m,
            e.model.weight_bytes() as f64 / 1048576.0,
            decode_bytes as f64 / 1048576.0,
            e.load_time.as_secs_f64(),
            from(&e.packed_from)
        );
        let sweep: Vec<_> = plan
            .sweep
            .iter()
            .zip(&l.pp)
            .map(|(&n, s)| {
                let (m, sd) = mean_sd(s);
                json!({"tokens": n, "tok_s_mean": m, "tok_s_sd": sd})
            })
            .collect();
        let batched: Vec<_> = plan
            .batches
            .iter()
            .zip(&l.batched)
            .map(|(&b, s)| {
                let (m, sd) = mean_sd(s);
                json!({"sequences": b, "steps": plan.batch_steps, "tok_s_mean": m, "tok_s_sd": sd})
            })
            .collect();
        let kernels: Vec<_> = e
            .model
            .kernels(plan.pp)
            .iter()
            .map(|k| json!({"layer": k.layer, "decode": k.decode.name(), "prefill": k.prefill.name()}))
            .collect();
        rows.push(json!({
            "path": l.spec.name, "about": l.spec.about, "kernels": kernels,
            "pp": plan.pp, "pp_tok_s_mean": pm, "pp_tok_s_sd": ps,
            "tg": if l.spec.light { plan.tg.min(32) } else { plan.tg }, "tg_tok_s_mean": tm, "tg_tok_s_sd": ts,
            "prefill_sweep": sweep, "batched_decode": batched,
            "decode_bytes": decode_bytes, "decode_gbs": gbs, "weight_bytes": e.model.weight_bytes(),
            "kv_cache_bytes": l.kv_bytes, "kv_cache_positions": context, "kv_type": l.engine.model.kv_type().name(),
            "rss_anon_settled_bytes": l.rss_settled, "rss_anon_peak_bytes": l.rss_peak, "rss_file_bytes": l.rss_file,
            "load_s": e.load_time.as_secs_f64(), "packed_from": from(&e.packed_from),
        }));
    }

    println!(
        "\nPrefill sweep (tok/s, logits for the last token only) and batched decode (tok/s summed over the sequences):\n"
    );
    let mut head = String::from("| path |");
    let mut rule = String::from("|---|");
    for n in &plan.sweep {
        head += &format!(" pp{n} |");
        rule += "---|";
    }
    head += &format!(" tg{} (1 seq) |", plan.tg);
    rule += "---|";
    for b in &plan.batches {
        head += &format!(" decode ×{b} |");
        rule += "---|";
    }
    println!("{head}\n{rule}");
    for l in &loaded {
        let mut line = format!("| {} |", l.spec.name);
        for s in &l.pp {
            line += &format!(" {} |", cell(mean_sd(s).0, f64::NAN));
        }
        line += &format!(" {} |", cell(mean_sd(&l.tg).0, f64::NAN));
        for s in &l.batched {
            line += &format!(" {} |", cell(mean_sd(s).0, f64::NAN));
        }
        println!("{line}");
    }

    println!("\nMemory (RssAnon added by each load, in this process; mapped artifact pages as RssFile):\n");
    println!(
        "| path | RssAnon settled | RssAnon peak during load | RssFile added | KV cache ({context} positions) | KV type |"
    );
    println!("|---|---|---|---|---|---|");
    let mib = |b: u64| b as f64 / 1048576.0;
    for l in &loaded {
        println!(
            "| {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.2} MiB | {} |",
            l.spec.name,
            mib(l.rss_settled),
            mib(l.rss_peak),
            mib(l.rss_file),
            mib(l.kv_bytes as u64),
            l.engine.model.kv_type()
        );
    }

    let doc = json!({
        "schema": "int4-model-bench/2", "model": dir, "model_name": name, "synthetic": synthetic,
        "group_size": format!("{group:?}"),
        "threads": threads, "quick": quick, "repetitions": plan.reps,
        "stream_read_gbs_mean": read_m, "stream_read_gbs_sd": read_sd, "stream_read_bytes": read_len,
        "rows": rows,
    });
    if let Some(path) = &args.json {
        write(path, &serde_json::to_string_pretty(&doc).expect("json"));
    }
    if let Some(path) = &args.svg {
        write(path, &int4_benches::chart::model_svg(&doc));
        eprintln!("model-bench: chart written to {path}");
    }
}

/// `mean ± sd`, `mean` alone when the sd is not a number, `—` for a figure not measured.
fn cell(mean: f64, sd: f64) -> String {
    match (mean.is_finite(), sd.is_finite()) {
        (false, _) => "—".into(),
        (true, true) => format!("{mean:.1} ± {sd:.1}"),
        (true, false) => format!("{mean:.1}"),
    }
}

fn new_cache(e: &Engine) -> KvCache {
    e.new_cache().unwrap_or_else(|err| fail(err))
}

fn from(p: &PackedFrom) -> &'static str {
    match p {
        PackedFrom::NotPacked => "dense",
        PackedFrom::Uncached => "uncached",
        PackedFrom::Cache(_) => "warm",
        PackedFrom::Built(_) => "cold",
        PackedFrom::InMemory => "in memory",
    }
}

fn write(path: &str, text: &str) {
    if let Some(d) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| fail(format!("{}: {e}", d.display())));
    }
    std::fs::write(path, text).unwrap_or_else(|e| fail(format!("{path}: {e}")));
}
