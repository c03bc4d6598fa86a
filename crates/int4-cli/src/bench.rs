//! `int4 bench`: a model's speed with llama-bench's interface and rows, so the two tools' tables line up.
//!
//! Flags as llama-bench spells them — `-m` (repeatable or comma-separated), `-p`, `-n`, `-pg pp,tg`, `-r`,
//! `-t`, `-o md|csv|json|jsonl` — plus `--path`, `--group`, `--head-bits`, `--kv` and `--act-scales`, which
//! say how int4 runs the model (the KV cache's type goes in llama-bench's `type_k` and `type_v` fields, the
//! W4A8 activation scales in `act_scales`). Every combination of model, path and thread count is one
//! configuration; each of its tests (`ppN`, `tgN`, `ppN+tgM`) runs once untimed, then `-r` times, through
//! [`int4::speed`] (the runs the benchmark binaries time too). A row reports tokens per second as the mean
//! and standard deviation over the repetitions, and every sample.

use std::time::SystemTime;

use clap::ValueEnum;
use int4::{Engine, ModelConfig, RunPath};
use serde_json::{Value, json};

use crate::load::{ActScalesArg, QuantArgs, load_options, path_parser, priority};
use crate::out::{errln, outln};

/// Flags of `int4 bench`.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Models: Hugging Face directories, .gguf files or repo ids (repeatable, or comma-separated).
    #[arg(short = 'm', long = "model", required = true, value_delimiter = ',')]
    models: Vec<String>,
    /// Prompt lengths to time (pp), comma-separated; 0 times none.
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    n_prompt: Vec<usize>,
    /// Generation lengths to time (tg), comma-separated; 0 times none.
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    n_gen: Vec<usize>,
    /// A prompt length and a generation length timed together, `pp,tg` (`-pg 512,128`; repeatable).
    #[arg(long = "pg", value_parser = parse_pg)]
    pg: Vec<(usize, usize)>,
    /// Timed repetitions of each test (after one untimed run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// Thread counts, comma-separated (default: every core).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    output: Format,
    /// Paths to run, comma-separated.
    #[arg(long = "path", value_delimiter = ',', default_value = "auto", value_parser = path_parser())]
    paths: Vec<RunPath>,
    #[command(flatten)]
    engine: BenchEngineArgs,
}

/// The load options `int4 bench` takes (its `-t` list replaces `--threads`).
#[derive(clap::Args)]
pub(crate) struct BenchEngineArgs {
    #[command(flatten)]
    quant: QuantArgs,
    /// Pack the weights in memory and neither read nor write the artifact cache.
    #[arg(long)]
    no_cache: bool,
    /// W4A8: one int8 activation scale per weight group (finer), or one per token.
    #[arg(long, value_enum, default_value_t = ActScalesArg::PerGroup)]
    act_scales: ActScalesArg,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Md,
    Csv,
    Json,
    Jsonl,
}

/// `pp,tg`.
fn parse_pg(s: &str) -> Result<(usize, usize), String> {
    let (p, g) = s.split_once(',').ok_or_else(|| format!("`{s}`: expected pp,tg (e.g. 512,128)"))?;
    let num = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("`{s}`: {e}"));
    Ok((num(p)?, num(g)?))
}

/// One test of a configuration.
#[derive(Clone, Copy)]
struct Test {
    n_prompt: usize,
    n_gen: usize,
}

impl Test {
    fn name(self) -> String {
        match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        }
    }
}

/// Parameters of a configuration, from its config: embedding, per-layer attention and MLP weights and
/// norms, the final norm and an untied head.
fn parameters(c: &ModelConfig) -> usize {
    let (h, q, kv) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let layer = h * q + 2 * h * kv + q * h + 3 * h * c.intermediate_size + 2 * h;
    let head = if c.tie_word_embeddings { 0 } else { c.vocab_size * h };
    c.vocab_size * h + c.num_layers * layer + h + head
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

pub(crate) fn bench(a: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.repetitions == 0 {
        return Err("-r 0: give at least 1 repetition".into());
    }
    let mut tests: Vec<Test> = a.n_prompt.iter().filter(|&&p| p > 0).map(|&p| Test { n_prompt: p, n_gen: 0 }).collect();
    tests.extend(a.n_gen.iter().filter(|&&g| g > 0).map(|&g| Test { n_prompt: 0, n_gen: g }));
    tests.extend(a.pg.iter().filter(|(p, g)| p + g > 0).map(|&(p, g)| Test { n_prompt: p, n_gen: g }));
    if tests.is_empty() {
        return Err("nothing to time: every -p, -n and -pg is 0".into());
    }
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = if a.threads.is_empty() { vec![cpus] } else { a.threads.clone() };
    if let Some(t) = threads.iter().find(|&&t| t == 0 || t > cpus) {
        return Err(format!("-t {t}: give 1 to {cpus} (the logical CPUs this process may use)").into());
    }
    // The probe (and AMX permission) before any worker thread exists.
    let _ = int4::select::probe::live();
    let cpu_info = int4::select::snapshot_for_policy().map(|s| s.model_name.clone()).unwrap_or_default();
    let context = tests.iter().map(|t| t.n_prompt + t.n_gen + 1).max().unwrap_or(1);
    let mut rows: Vec<Value> = Vec::new();
    let mut printer = Printer::new(a.output);
    for model in &a.models {
        let dir = int4::resolve_model(model)?;
        for &path in &a.paths {
            let mut opts = load_options(path, priority("speed")?, context, a.engine.no_cache)?;
            a.engine.quant.apply(&mut opts)?;
            opts.activation_scales = a.engine.act_scales.scales();
            let engine = Engine::load(&dir, &opts).map_err(|e| format!("{model}: {e}"))?;
            for w in &engine.warnings {
                errln!("[int4] warning: {w}");
            }
            let limit = engine.model.config().max_position_embeddings;
            if let Some(t) = tests.iter().find(|t| t.n_prompt + t.n_gen + 1 > limit) {
                return Err(format!(
                    "{model}: {} needs {} positions; the model's context is {limit}",
                    t.name(),
                    t.n_prompt + t.n_gen + 1
                )
                .into());
            }
            for &t in &threads {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build()?;
                for &test in &tests {
                    let samples = pool.install(|| time_test(&engine, test, a.repetitions))?;
                    let row = row(model, &engine, t, test, &samples, &cpu_info);
                    printer.row(&row)?;
                    rows.push(row);
                }
            }
        }
    }
    printer.finish(&rows)
}

/// Tokens per second of each timed repetition of `test` (after one untimed run).
fn time_test(engine: &Engine, test: Test, repetitions: usize) -> Result<Vec<f64>, int4::Error> {
    let tokens = (test.n_prompt + test.n_gen) as f64;
    let mut samples = Vec::with_capacity(repetitions);
    for rep in 0..=repetitions {
        let took = match (test.n_prompt, test.n_gen) {
            (p, 0) => int4::speed::prompt_time(engine, p)?,
            (0, g) => int4::speed::generation_time(engine, g)?,
            (p, g) => int4::speed::prompt_and_generation_time(engine, p, g)?,
        };
        if rep > 0 {
            samples.push(tokens / took.as_secs_f64());
        }
    }
    Ok(samples)
}

/// One result, with llama-bench's JSON field names where they mean the same thing.
fn row(model: &str, engine: &Engine, threads: usize, test: Test, samples: &[f64], cpu_info: &str) -> Value {
    let (avg, sd) = mean_sd(samples);
    let tokens = (test.n_prompt + test.n_gen) as f64;
    let ns: Vec<u64> = samples.iter().map(|ts| (tokens / ts * 1e9) as u64).collect();
    let (avg_ns, sd_ns) = mean_sd(&ns.iter().map(|&n| n as f64).collect::<Vec<_>>());
    let config = engine.model.config();
    let file = std::path::Path::new(model).file_name().map_or(model.to_string(), |f| f.to_string_lossy().into_owned());
    json!({
        "build_commit": env!("CARGO_PKG_VERSION"),
        "cpu_info": cpu_info,
        "model_filename": model,
        "model_type": file,
        "model_size": engine.model.weight_bytes(),
        "model_n_params": parameters(config),
        "path": engine.plan.path.to_string(),
        "type_k": engine.model.kv_type().name(),
        "type_v": engine.model.kv_type().name(),
        // int4's own field: W4A8's activation-scale granularity (null on the other paths).
        "act_scales": match engine.model.numerics() {
            int4::Numerics::W4a8 { activations, .. } => Some(activations.name()),
            _ => None,
        },
        "n_threads": threads,
        "n_prompt": test.n_prompt,
        "n_gen": test.n_gen,
        "test": test.name(),
        "test_time": humantime(SystemTime::now()),
        "avg_ns": avg_ns as u64,
        "stddev_ns": sd_ns as u64,
        "avg_ts": avg,
        "stddev_ts": sd,
        "samples_ns": ns,
        "samples_ts": samples,
    })
}

/// `2026-12-02T01:02:03Z`.
fn humantime(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Writes rows as they come (md, csv, jsonl) or all at the end (json).
struct Printer {
    format: Format,
    started: bool,
}

impl Printer {
    fn new(format: Format) -> Self {
        Printer { format, started: false }
    }

    fn row(&mut self, r: &Value) -> Result<(), Box<dyn std::error::Error>> {
        let first = !self.started;
        self.started = true;
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        let n = |k: &str| r[k].as_u64().unwrap_or_default();
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        match self.format {
            Format::Md => {
                if first {
                    outln!("| model | size | params | path | threads | type_k | test | t/s |")?;
                    outln!("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |")?;
                }
                outln!(
                    "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {} | {:.2} ± {:.2} |",
                    s("model_type"),
                    n("model_size") as f64 / (1u64 << 20) as f64,
                    n("model_n_params") as f64 / 1e6,
                    s("path"),
                    n("n_threads"),
                    s("type_k"),
                    s("test"),
                    f("avg_ts"),
                    f("stddev_ts")
                )?;
            }
            Format::Csv => {
                const KEYS: [&str; 14] = [
                    "build_commit",
                    "cpu_info",
                    "model_filename",
                    "model_type",
                    "model_size",
                    "model_n_params",
                    "path",
                    "type_k",
                    "type_v",
                    "n_threads",
                    "n_prompt",
                    "n_gen",
                    "avg_ts",
                    "stddev_ts",
                ];
                if first {
                    outln!("{}", KEYS.join(","))?;
                }
                let cells: Vec<String> = KEYS
                    .iter()
                    .map(|k| match &r[*k] {
                        Value::String(v) => format!("\"{}\"", v.replace('"', "\"\"")),
                        v => v.to_string(),
                    })
                    .collect();
                outln!("{}", cells.join(","))?;
            }
            Format::Jsonl => outln!("{r}")?,
            Format::Json => {}
        }
        Ok(())
    }

    fn finish(&self, rows: &[Value]) -> Result<(), Box<dyn std::error::Error>> {
        if let Format::Json = self.format {
            outln!("{}", serde_json::to_string_pretty(rows)?)?;
        }
        Ok(())
    }
}
