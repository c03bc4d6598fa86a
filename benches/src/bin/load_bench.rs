//! Engine load time and memory, cold versus warm versus uncached, each in a fresh process.
//!
//! * **cold**: the artifact cache is empty: hash the checkpoint, quantize and pack every layer, write the
//!   artifact, map it;
//! * **warm**: the artifact is there: check and map it (the source hash comes from its size/mtime record);
//! * **uncached** (`--no-cache`): quantize and pack in memory, write nothing.
//!
//! Rounds are interleaved (cold, warm, uncached, cold, …) so a noisy machine disturbs all three alike.
//! Each child reports its load time, `RssAnon` settled after the load and its peak during the load
//! (sampled every 2 ms), and `RssFile` after one decode step (the mapped artifact's pages it touched).
//!
//! `load-bench [--model DIR] [--rounds N] [--json OUT]` (the model defaults to the default model).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use int4::cache::ArtifactStore;
use int4::{Engine, LoadOptions, PackedFrom, RunPath};
use int4_benches::{PeakRssAnon, rss_anon_and_file};

const MODES: [&str; 3] = ["cold", "warm", "uncached"];

#[derive(clap::Parser)]
#[command(name = "load-bench", about = "Engine load time and memory: cold, warm and uncached, each in a fresh process")]
struct Args {
    /// The model (default: the one `cargo xtask fetch-model` prepares).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Interleaved rounds (cold, warm, uncached each).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Internal: run one load in this process (cold, warm or uncached) and print its figures.
    #[arg(long, hide = true)]
    child: Option<String>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let Some(model) = args.model.clone().or_else(int4::cache::dirs::default_model_dir) else {
        eprintln!("load-bench: no model directory: pass --model DIR, or set INT4_MODEL_DIR or HOME");
        std::process::exit(1);
    };
    if !int4_benches::is_model(&model) {
        eprintln!("load-bench: no model at {} (run `cargo xtask fetch-model`)", model.display());
        std::process::exit(1);
    }
    let name = model.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().to_string());
    let cache = PathBuf::from(format!("target/bench/load-cache-{name}"));
    if let Some(mode) = &args.child {
        child(mode, &model, &cache);
        return;
    }
    let rounds = args.rounds;
    let exe = std::env::current_exe().expect("own path");
    let mut results: Vec<Vec<serde_json::Value>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        // Only the cold run needs an empty cache; the warm one reuses what the cold one wrote.
        let _ = std::fs::remove_dir_all(&cache);
        for (i, mode) in MODES.iter().enumerate() {
            let out =
                Command::new(&exe).args(["--child", mode, "--model"]).arg(&model).output().expect("run the child");
            let text = String::from_utf8_lossy(&out.stdout);
            let Some(v) = text.lines().last().and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok()) else {
                eprintln!("load-bench: {mode} child failed: {}", String::from_utf8_lossy(&out.stderr));
                std::process::exit(1);
            };
            eprintln!("  round {round} {mode}: {v}");
            results[i].push(v);
        }
    }
    let median = |vals: &[serde_json::Value], key: &str| -> f64 {
        let mut v: Vec<f64> = vals.iter().filter_map(|x| x[key].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let mib = |b: f64| b / (1 << 20) as f64;
    let artifact = results[0].first().and_then(|v| v["artifact_bytes"].as_f64()).unwrap_or(0.0);
    println!("\n### Load: {name} ({rounds} interleaved rounds, medians; artifact {:.1} MiB)\n", mib(artifact));
    println!("| load | time | RssAnon after load | peak RssAnon during load | RssFile after one token |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, mode) in MODES.iter().enumerate() {
        let r = &results[i];
        let (t, anon, peak, file) =
            (median(r, "load_s"), median(r, "rss_anon"), median(r, "peak_anon"), median(r, "rss_file"));
        println!("| {mode} | {t:.3} s | {:.1} MiB | {:.1} MiB | {:.1} MiB |", mib(anon), mib(peak), mib(file));
        rows.push(
            serde_json::json!({"mode": mode, "load_s": t, "rss_anon": anon, "peak_anon": peak, "rss_file": file}),
        );
    }
    if let Some(path) = args.json.clone() {
        let doc = serde_json::json!({"model": name, "rounds": rounds, "artifact_bytes": artifact, "rows": rows});
        if let Some(parent) = Path::new(&path).parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("json")).expect("write the JSON");
    }
}

/// One load in this process; prints a JSON line.
fn child(mode: &str, model: &Path, cache: &Path) {
    let store = ArtifactStore::new(cache);
    let opts = LoadOptions {
        path: RunPath::W4a16,
        context: 64,
        cache: (mode != "uncached").then(|| store.clone()),
        ..LoadOptions::default()
    };
    let sampler = PeakRssAnon::start(Duration::from_millis(2));
    let engine = Engine::load(model, &opts).expect("load");
    let peak = sampler.stop();
    let (anon, _) = rss_anon_and_file().unwrap_or((0, 0));
    let want_cold = mode == "cold";
    let ok = match &engine.packed_from {
        PackedFrom::Built(_) => want_cold,
        PackedFrom::Cache(_) => mode == "warm",
        PackedFrom::Uncached => mode == "uncached",
        _ => false,
    };
    assert!(ok, "a {mode} load came from {:?} ({:?})", engine.packed_from, engine.warnings);
    let mut kv = engine.new_cache().expect("kv cache");
    engine.model.forward(&[1], &mut kv, false).expect("one token");
    let (_, file) = rss_anon_and_file().unwrap_or((0, 0));
    let artifact: u64 = store.list().iter().map(|e| e.size).sum();
    println!(
        "{}",
        serde_json::json!({
            "mode": mode, "load_s": engine.load_time.as_secs_f64(), "rss_anon": anon, "peak_anon": peak,
            "rss_file": file, "artifact_bytes": artifact,
        })
    );
}
