//! The `int4` command-line tool.
//!
//! A thin layer over the `int4` library: `generate` (load a model directory on the path the policy picks and
//! stream text), `probe` (the hardware probe and the plan for every checkpoint kind), `cache` (list,
//! verify, clear and evict packed artifacts), `quantize` (write a `cpu_int4` or GPTQ checkpoint once, to
//! ship), `eval` (a path's perplexity and agreement against an exact reference, teacher-forced), `chat`,
//! `info`, `serve` (the OpenAI-compatible server, `int4-serve`) and `bench` (speed with llama-bench's flags
//! and rows, in `bench`). What loading a model takes is in `load`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::TypedValueParser;
use clap::{Parser, Subcommand, ValueEnum};
use int4::layout::GroupSize;
use int4::layout::grid::ScaleSearch;
use int4::select::policy::{CheckpointKind, Overrides, Priority, plan};
use int4::select::{CpuSnapshot, snapshot_for_policy};
use int4::{
    ChatOptions, Engine, GenerationRequest, LoadOptions, Messages, Next, PackedFrom, Prompt, RunPath, SamplingOverrides,
};
use int4_quant::export::{ExportFormat, Method, QuantizeOptions, QuantizeReport, quantize_checkpoint};
use int4_quant::gptq_method::GptqOptions;

mod bench;
mod lines;
mod load;
mod out;

use load::{ActScalesArg, QuantArgs, load_options, path_parser, priority};

use out::{OutError, err, errln, out, outln};

#[derive(Parser)]
#[command(name = "int4", version, about = "4-bit-weight LLM inference on x86 CPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// CPU features, OS support, AMX permission and the plan per checkpoint kind.
    Probe {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The packed-artifact cache: ls, verify, clear, or evict BYTES.
    Cache {
        /// ls | verify | clear | evict
        action: String,
        /// The size cap for evict.
        bytes: Option<u64>,
    },
    /// Generate text from a prompt.
    Generate(GenerateArgs),
    /// Chat: each line you type is a user turn; the KV cache is kept across turns. `/reset` starts over,
    /// an empty line or end of input quits.
    Chat(ChatArgs),
    /// Describe a model directory: architecture, tensor formats, how each kind of layer is stored and will
    /// run on this machine, and whether its packed weights are cached.
    Info(InfoArgs),
    /// Quantize an unquantized model directory into a 4-bit checkpoint (cpu_int4 or GPTQ), once, to ship.
    Quantize(QuantizeArgs),
    /// Fidelity of a path against an exact reference, teacher-forced over a text: perplexity and top-1
    /// accuracy of both, top-1 agreement and mean KL(ref ‖ path).
    Eval(EvalArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health, /metrics), running requests together with continuous batching.
    Serve(ServeArgs),
    /// Time a model as llama-bench does (-m, -p, -n, -pg, -r, -t, -o md|csv|json|jsonl), on int4's paths
    /// (--path, --group, --head-bits): prompt processing and generation in tokens per second.
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The model: a Hugging Face directory, a .gguf file (or a directory holding one), or a repo id in the
    /// Hugging Face cache (org/name, org/name@revision, org/name:Q4_0).
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model: String,
    #[command(flatten)]
    run: RunArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed on start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's name in the API (default: MODEL as given).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Bytes of KV cache the running requests may hold together (default: 4 GiB, or a third of the
    /// memory available if less); each request reserves its prompt plus max_tokens.
    #[arg(long)]
    kv_budget: Option<u64>,
    /// Prompt caches kept for later requests that begin the same way (whole 256-token chunks: a shared
    /// system prompt, a chat's earlier turns); 0 keeps none, at most 1024. They count against
    /// --kv-budget and give way first when a request needs room.
    #[arg(long, default_value_t = 16)]
    prefix_cache: usize,
    /// Requests that may wait for admission; beyond, 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Seconds a shutdown (SIGTERM, SIGINT) waits for running requests before ending them.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Seconds a client may take to send a request's headers, and again its body (then the connection
    /// is closed, or the request answered 408).
    #[arg(long, default_value_t = 10)]
    request_read_timeout: u64,
    /// Connections served at once (more wait until one closes).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
}

#[derive(clap::Args)]
struct EvalArgs {
    /// The model to evaluate: a Hugging Face directory, a .gguf file (or a directory holding one), or a
    /// repo id in the Hugging Face cache (org/name, org/name@revision, org/name:Q4_0).
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model: String,
    /// The evaluated path: auto, w4a16, wna16, w4a8, bf16 or f32.
    #[arg(long, default_value = "auto", value_parser = path_parser())]
    path: RunPath,
    /// The reference path: bf16 or f32.
    #[arg(long = "ref", value_parser = reference_parser())]
    reference: RunPath,
    /// The reference's model (default: MODEL), e.g. the original of a quantized export.
    #[arg(long, alias = "ref-dir", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    ref_model: Option<String>,
    /// The evaluation text: a file, or a directory's eval-*.txt files (default: data/text in the current
    /// directory).
    #[arg(long)]
    text: Option<PathBuf>,
    /// Tokens per window (each window is one prefill in a fresh KV cache).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score only positions from this one on in each window (llama-perplexity scores from ctx/2).
    #[arg(long, default_value_t = 0)]
    score_from: usize,
    /// Also write the report as JSON (schema int4-eval/1) to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(clap::Args)]
struct QuantizeArgs {
    /// An unquantized model: a Hugging Face directory (f32, bf16 or f16 safetensors), an F32, F16 or BF16
    /// GGUF, or a repo id in the Hugging Face cache.
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model: String,
    /// cpu_int4 (float zeros) or gptq (integer zero points); both run on W4A16 and W4A8.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// Input channels per scale and zero: 32, 64, 128, 256, or -1 for one group per row.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    group_size: i64,
    /// GPTQ with a per-group integer zero point (sym: false, written as gptq_v2) instead of symmetric.
    #[arg(long)]
    asym: bool,
    /// Plain min/max ranges, no search over narrower ones (faster, lower SNR).
    #[arg(long)]
    no_search: bool,
    /// Leave the head unquantized (a tied head stays tied to the embedding).
    #[arg(long)]
    no_lm_head: bool,
    /// Linear layers to leave unquantized, comma-separated: names (model.layers.0.mlp.down_proj), fused
    /// names (model.layers.0.self_attn.qkv), lm_head, or prefixes (model.layers.0).
    #[arg(long, value_delimiter = ',')]
    ignore: Vec<String>,
    /// The output directory (must not exist, or be empty, unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Replace an existing output directory.
    #[arg(long)]
    force: bool,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// How codes are chosen: rtn (round to nearest per group, no data) or gptq (second-order error
    /// compensation over --calib text, on the same grids and into the same formats).
    #[arg(long, value_enum, default_value_t = MethodArg::Rtn)]
    method: MethodArg,
    /// GPTQ's calibration text: a text file, or a directory whose .txt files are read in name order
    /// (except eval-*.txt, held out for `int4 eval`); the repository's own is data/text.
    #[arg(long)]
    calib: Option<PathBuf>,
    /// GPTQ: tokens per calibration sequence.
    #[arg(long, default_value_t = 512)]
    calib_seq: usize,
    /// GPTQ: at most this many calibration tokens (the text is cut there; the default takes all of
    /// data/text's calibration files, about 24k tokens).
    #[arg(long, default_value_t = 32768)]
    calib_tokens: usize,
    /// GPTQ: dampening added to the Hessian's diagonal, as a fraction of its mean.
    #[arg(long, default_value_t = 0.01)]
    damp: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MethodArg {
    Rtn,
    Gptq,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    #[value(name = "cpu_int4", alias = "cpu-int4")]
    CpuInt4,
    Gptq,
}

#[derive(clap::Args)]
struct ChatArgs {
    /// The model: a Hugging Face directory, a .gguf file (or a directory holding one), or a repo id in the
    /// Hugging Face cache (org/name, org/name@revision, org/name:Q4_0 for a GGUF repo's file).
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model: String,
    #[command(flatten)]
    run: RunArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    system: Option<String>,
    /// Tokens per reply at most.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// The conversation's context (KV cache positions).
    #[arg(long, default_value_t = 4096)]
    context: usize,
}

#[derive(clap::Args)]
struct InfoArgs {
    /// The model: a Hugging Face directory, a .gguf file (or a directory holding one), or a repo id in the
    /// Hugging Face cache (org/name, org/name@revision, org/name:Q4_0 for a GGUF repo's file).
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model: String,
    /// Which numerics to describe the plan for.
    #[arg(long, default_value = "auto", value_parser = path_parser())]
    path: RunPath,
    /// Speed or fidelity: decides, for --path auto, whether int8 activations are acceptable, and on every
    /// path but f32 whether the KV cache stores f16 (speed) or f32 (fidelity; --kv overrides).
    #[arg(long, default_value = "speed")]
    priority: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Do not look in the artifact cache.
    #[arg(long)]
    no_cache: bool,
    #[command(flatten)]
    quant: QuantArgs,
}

/// `--ref`: an exact path (`bf16` or `f32`): a 4-bit reference would measure nothing.
fn reference_parser() -> impl clap::builder::TypedValueParser<Value = RunPath> {
    let exact: Vec<&str> = RunPath::ALL.into_iter().filter(|p| p.is_exact()).map(RunPath::name).collect();
    clap::builder::PossibleValuesParser::new(exact)
        .map(|name| name.parse::<RunPath>().expect("every listed name parses"))
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// The model: a Hugging Face directory, a .gguf file (or a directory holding one), or a repo id in the
    /// Hugging Face cache (org/name, org/name@revision, org/name:Q4_0 for a GGUF repo's file).
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    model: String,
    /// The prompt text (or use --prompt-ids).
    prompt: Option<String>,
    /// Apply the chat template (the prompt is the user's message).
    #[arg(long)]
    chat: bool,
    #[command(flatten)]
    run: RunArgs,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// With --json: each token's log-probability and this many of the most likely ones (0 to 20).
    #[arg(long)]
    logprobs: Option<usize>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print the prompt and generated ids, the kernels per phase and timings as JSON.
    #[arg(long)]
    json: bool,
    /// Token ids to use as the prompt, comma-separated.
    #[arg(long)]
    prompt_ids: Option<String>,
    /// The session's context (KV cache positions).
    #[arg(long, default_value_t = 2048)]
    context: usize,
}

/// How the next token is chosen: the options `generate` and `chat` share. A value not given comes from
/// the model's `generation_config.json` (greedy when it does not sample).
#[derive(clap::Args)]
struct SamplingArgs {
    /// Greedy decoding, whatever the model's defaults.
    #[arg(long)]
    greedy: bool,
    /// Sampling temperature (0: greedy).
    #[arg(long)]
    temperature: Option<f32>,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long)]
    top_k: Option<usize>,
    /// Keep the most likely tokens up to this probability mass (1: off).
    #[arg(long)]
    top_p: Option<f32>,
    /// Drop tokens less likely than this fraction of the most likely one (0: off).
    #[arg(long)]
    min_p: Option<f32>,
    /// Discourage tokens already in the prompt or the output (1: off; 1.1 is a common choice).
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Subtract this from the logits of tokens already in the output (-2 to 2; 0: off).
    #[arg(long, allow_hyphen_values = true)]
    presence_penalty: Option<f32>,
    /// Subtract this times their count from the logits of tokens already in the output (-2 to 2; 0: off).
    #[arg(long, allow_hyphen_values = true)]
    frequency_penalty: Option<f32>,
    /// Random seed (default: a fresh one each run, printed with --json).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop before this text (repeatable; matched across tokens, never printed).
    #[arg(long)]
    stop: Vec<String>,
}

impl SamplingArgs {
    /// The values given, checked before any model is loaded.
    fn overrides(&self) -> Result<SamplingOverrides, Box<dyn std::error::Error>> {
        if self.greedy && self.temperature.is_some() {
            return Err("--greedy and --temperature contradict each other: give one".into());
        }
        let o = SamplingOverrides {
            temperature: if self.greedy { Some(0.0) } else { self.temperature },
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        };
        // Unset values resolve to valid ones, so only a given value can fail here.
        SamplingOverrides { seed: Some(0), ..o }.resolve().check()?;
        if self.stop.iter().any(String::is_empty) {
            return Err("--stop \"\": an empty stop string would stop at the first token; give some text".into());
        }
        Ok(o)
    }

    /// The values for `engine`: what was given over the model's defaults, and an error when a value that
    /// shapes sampling was given but decoding is greedy.
    fn resolve(&self, engine: &Engine) -> Result<SamplingOverrides, Box<dyn std::error::Error>> {
        let o = self.overrides()?;
        let merged = o.or(engine.defaults.sampling);
        let greedy = merged.temperature.unwrap_or(0.0) == 0.0;
        if greedy && (self.top_k.is_some() || self.top_p.is_some() || self.min_p.is_some()) {
            return Err(if self.greedy {
                "--top-k, --top-p and --min-p shape sampling, which --greedy turns off".into()
            } else {
                "--top-k, --top-p and --min-p shape sampling, which needs --temperature (this model's default is greedy)"
                    .into()
            });
        }
        // One seed for the whole run (a chat's turns continue from it), shown with --json.
        Ok(SamplingOverrides { seed: Some(merged.seed.unwrap_or_else(int4::random_seed)), ..o })
    }
}

/// How a loaded model runs: the options `generate` and `chat` share.
#[derive(clap::Args)]
struct RunArgs {
    /// Which numerics to run.
    #[arg(long, default_value = "auto", value_parser = path_parser())]
    path: RunPath,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Priority, threads and the cache: the options every command that loads a model shares.
#[derive(clap::Args)]
struct EngineArgs {
    /// Speed or fidelity: decides, for --path auto, whether int8 activations are acceptable, and on every
    /// path but f32 whether the KV cache stores f16 (speed) or f32 (fidelity; --kv overrides).
    #[arg(long, default_value = "speed")]
    priority: String,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Pack the weights in memory and neither read nor write the artifact cache.
    #[arg(long)]
    no_cache: bool,
    /// W4A8: one int8 activation scale per weight group (finer), or one per token.
    #[arg(long, value_enum, default_value_t = ActScalesArg::PerGroup)]
    act_scales: ActScalesArg,
    #[command(flatten)]
    quant: QuantArgs,
}

impl EngineArgs {
    /// The options these flags set on a load.
    fn apply(&self, opts: &mut LoadOptions) -> Result<(), String> {
        opts.activation_scales = self.act_scales.scales();
        self.quant.apply(opts)
    }
}

fn main() -> ExitCode {
    // llama-bench spells its prompt-and-generation flag `-pg`, one dash and two letters.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "bench") {
        for a in args.iter_mut().skip(2) {
            if a == "-pg" {
                *a = "--pg".into();
            }
        }
    }
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Probe { json } => report("probe", probe(json)),
        Command::Cache { action, bytes } => match cache(&action, bytes) {
            Ok(code) => code,
            Err(e) => report("cache", Err(e)),
        },
        Command::Generate(a) => report("generate", generate(a)),
        Command::Chat(a) => report("chat", chat(a)),
        Command::Serve(a) => report("serve", serve(a)),
        Command::Info(a) => report("info", info(a)),
        Command::Quantize(a) => report("quantize", quantize(a)),
        Command::Eval(a) => report("eval", eval(a)),
        Command::Bench(a) => report("bench", bench::bench(a)),
    }
}

/// The exit status of a command: 0 on success and when standard output was closed (`| head`), else the
/// error on one line of stderr and 1.
fn report(command: &str, r: Result<(), Box<dyn std::error::Error>>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if out::is_closed(e.as_ref()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("int4 {command}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Probes (and asks Linux for AMX tile state) before any worker thread exists — the kernel refuses the
/// request if an existing thread's signal stack is too small for the tile state — then sizes the pool.
/// `--threads` is at least 1; more than the logical CPUs this process may run on is clamped to them, with
/// a warning (more workers than CPUs only contend).
fn start_threads(threads: Option<usize>) -> Result<(), Box<dyn std::error::Error>> {
    let _ = int4::select::probe::live();
    if let Some(t) = threads {
        if t == 0 {
            return Err("--threads 0: give at least 1 (or leave it out for every core)".into());
        }
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let t = if t > cpus {
            errln!(
                "[int4] warning: --threads {t} is more than the {cpus} logical CPUs this process may use; using {cpus}"
            );
            cpus
        } else {
            t
        };
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global()?;
    }
    Ok(())
}

/// Starts the thread pool, loads the model and prints the load's warnings.
fn load_engine(model: &str, run: &RunArgs, context: usize) -> Result<Engine, Box<dyn std::error::Error>> {
    let e = &run.engine;
    start_threads(e.threads)?;
    let mut opts = load_options(run.path, priority(&e.priority)?, context, e.no_cache)?;
    e.apply(&mut opts)?;
    let engine = Engine::load(&int4::resolve_model(model)?, &opts)?;
    for w in &engine.warnings {
        errln!("[int4] warning: {w}");
    }
    Ok(engine)
}

/// How a load's packed weights were obtained, in words.
fn packed_from(e: &Engine) -> String {
    match &e.packed_from {
        PackedFrom::NotPacked => "not packed".to_string(),
        PackedFrom::Uncached => "packed, cache off".to_string(),
        PackedFrom::Cache(p) => format!("warm, mapped from {}", p.display()),
        PackedFrom::Built(p) => format!("cold, packed and cached in {}", p.display()),
        PackedFrom::InMemory => "packed, cache unusable".to_string(),
    }
}

fn info(a: InfoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut opts = load_options(a.path, priority(&a.priority)?, 64, a.no_cache)?;
    a.quant.apply(&mut opts)?;
    let dir = int4::resolve_model(&a.model)?;
    let info = Engine::describe(&dir, &opts)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&info)?)?;
        return Ok(());
    }
    outln!("{}  {}", dir.display(), info.architecture)?;
    outln!("  shape        {}", info.shape)?;
    outln!("  tied head    {}", info.tied_head)?;
    outln!("  files        {}", info.files.join(", "))?;
    let dtypes: Vec<String> = info.dtypes.iter().map(|(d, n)| format!("{n} {d}")).collect();
    outln!("  tensors      {}", dtypes.join(", "))?;
    outln!("  quantization {} {}", info.quantization["method"].as_str().unwrap_or("?"), info.quantization["fields"])?;
    outln!(
        "  at load      unquantized layers: group {}, head {} bits",
        info.load_quantization["group"],
        info.load_quantization["head_bits"]
    )?;
    if let Some(q) = &info.gguf_q4_1 {
        outln!(
            "  4-bit zeros  {} of {} Q4_1/Q4_K blocks have a zero m + 8d f32 cannot hold exactly (weights within 1/2 ulp of it)",
            q["inexact_zeros"],
            q["q4_1_blocks"]
        )?;
    }
    outln!("  layers")?;
    for (layer, how) in &info.layers {
        outln!("    {layer:<22} {how}")?;
    }
    let p = &info.plan;
    outln!(
        "  plan         {} (decode {}, prefill {}, layout {:?})",
        p.path,
        p.decode.kernel,
        p.prefill.kernel,
        p.layout
    )?;
    outln!("  kv cache     {} (--kv f32 or f16)", info.kv)?;
    match info.cached {
        Some(true) => outln!("  cache        packed weights cached: the next load is warm")?,
        Some(false) => outln!("  cache        not cached: the next load packs the weights")?,
        None => outln!("  cache        not used")?,
    }
    for w in &info.warnings {
        outln!("  warning      {w}")?;
    }
    Ok(())
}

fn chat(a: ChatArgs) -> Result<(), Box<dyn std::error::Error>> {
    a.sampling.overrides()?;
    if a.max_new_tokens == 0 {
        return Err("--max-new-tokens 0: give at least 1".into());
    }
    let engine = load_engine(&a.model, &a.run, a.context)?;
    let sampling = a.sampling.resolve(&engine)?;
    errln!(
        "[int4] load {:.2} s ({}); type a message, /reset to start over, an empty line to quit",
        engine.load_time.as_secs_f64(),
        packed_from(&engine)
    );
    let mut system = Messages::new();
    if let Some(s) = &a.system {
        system.push("system", s);
    }
    let keep = system.len();
    let mut messages = system.clone();
    let mut cache = engine.new_cache()?;
    let mut stdin = std::io::stdin().lock();
    // Each turn draws from its own stream: the run's seed plus the turn's number.
    let mut turn: u64 = 0;
    loop {
        err!("> ");
        let line = match lines::read_line(&mut stdin)? {
            lines::Line::End => return Ok(()),
            lines::Line::Text(t) => t,
            lines::Line::NotUtf8 => {
                errln!("[int4] that line is not UTF-8 text: nothing was sent; type it again");
                continue;
            }
            lines::Line::TooLong => {
                errln!("[int4] that line is longer than {} bytes: nothing was sent", lines::LINE_CAP);
                continue;
            }
        };
        if line.trim().is_empty() {
            return Ok(());
        }
        if line.trim() == "/reset" {
            messages = system.clone();
            cache.clear();
            continue;
        }
        messages.push("user", line.trim_end());
        // The conversation must leave room for the reply: drop the oldest user/assistant turns (the system
        // message stays) until it does; a turn that cannot fit even alone is refused, and only it.
        // Fitted on a copy: a refused turn leaves the conversation as it was.
        let mut fitted = messages.clone();
        let (ids, dropped) = match fit_conversation(&engine, &mut fitted, keep, a.max_new_tokens, cache.capacity()) {
            Ok(fit) => fit,
            Err(e) => {
                messages.truncate(messages.len() - 1);
                errln!("[int4] {e}: nothing was sent");
                continue;
            }
        };
        messages = fitted;
        if dropped > 0 {
            errln!(
                "[int4] the conversation outgrew the context ({} positions): dropped the {dropped} oldest message(s)",
                cache.capacity()
            );
        }
        // The cache keeps the positions this prompt shares with what it holds; only the rest is run.
        let mut req = GenerationRequest::new(Prompt::Ids(ids));
        req.sampling = SamplingOverrides { seed: sampling.seed.map(|s| s.wrapping_add(turn)), ..sampling };
        req.max_tokens = Some(a.max_new_tokens);
        req.stop = a.sampling.stop.clone();
        turn += 1;
        let mut failed: Option<Box<dyn std::error::Error>> = None;
        let out = engine.generate_in(&mut cache, req, |event| match out::write_str(&event.text) {
            Ok(()) => Next::Continue,
            Err(e) => {
                failed = Some(e.into());
                Next::Stop
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        outln!()?;
        messages.push("assistant", out.text.trim());
        let tps = out.tokens.len().saturating_sub(1) as f64 / out.decode.as_secs_f64().max(1e-9);
        errln!(
            "[int4] {} new prompt tokens, {} generated at {tps:.1} tok/s, {} of {} context used",
            out.prefill_tokens,
            out.tokens.len(),
            cache.len(),
            cache.capacity()
        );
    }
}

/// The conversation's prompt ids, after dropping the oldest messages after the `keep` first (the system
/// message) until the prompt and `reply` new tokens fit `capacity`; with how many were dropped. An error
/// when the last message alone (with the system message) leaves no room for a reply token.
fn fit_conversation(
    engine: &Engine,
    messages: &mut Messages,
    keep: usize,
    reply: usize,
    capacity: usize,
) -> Result<(Vec<u32>, usize), Box<dyn std::error::Error>> {
    let mut dropped = 0;
    loop {
        let ids = engine.text.encode(&engine.text.apply_chat_template(messages, &ChatOptions::default())?)?;
        // Older messages can go while more than the new user turn follows the system message.
        let can_drop = messages.len() > keep + 1;
        if ids.len() + reply <= capacity || (!can_drop && ids.len() < capacity) {
            return Ok((ids, dropped));
        }
        if !can_drop {
            return Err(format!("this turn is {} tokens, more than the context ({capacity}) holds", ids.len()).into());
        }
        // Drop a user turn and the reply to it together.
        let n =
            if messages.len() > keep + 2 && messages.role(keep + 1).as_deref() == Some("assistant") { 2 } else { 1 };
        messages.drain(keep..keep + n);
        dropped += n;
    }
}

fn serve(a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut opts = int4_serve::ServeOptions::new(a.served_model_name.clone().unwrap_or_else(|| a.model.clone()));
    opts.host = a.host.clone();
    opts.port = a.port;
    if let Some(b) = a.kv_budget {
        if b == 0 {
            return Err("--kv-budget 0: give a number of bytes".into());
        }
        opts.kv_budget = usize::try_from(b).unwrap_or(usize::MAX);
    }
    if a.prefix_cache > 1024 {
        return Err(format!("--prefix-cache {}: at most 1024 prompt caches", a.prefix_cache).into());
    }
    opts.prefix_cache = a.prefix_cache;
    if a.max_queue == 0 {
        return Err("--max-queue 0: give at least 1".into());
    }
    opts.max_queue = a.max_queue;
    opts.shutdown_timeout = std::time::Duration::from_secs(a.shutdown_timeout);
    if a.request_read_timeout == 0 || a.max_connections == 0 {
        return Err("--request-read-timeout and --max-connections must be at least 1".into());
    }
    opts.request_read_timeout = std::time::Duration::from_secs(a.request_read_timeout);
    opts.max_connections = a.max_connections;
    // Sequences get caches of their own size; the engine's session context is not used.
    let engine = load_engine(&a.model, &a.run, 16)?;
    errln!(
        "[int4] load {:.2} s ({}); path {}, {} KV cache",
        engine.load_time.as_secs_f64(),
        packed_from(&engine),
        engine.plan.path,
        engine.model.kv_type()
    );
    int4_serve::serve(engine, opts, |addr| {
        errln!("[int4] serving {} on http://{addr}/v1", a.served_model_name.as_deref().unwrap_or(&a.model));
    })?;
    Ok(())
}

fn rss_anon_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = s.lines().find(|l| l.starts_with("RssAnon:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn generate(a: GenerateArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Cheap checks first, so a bad flag does not wait for a model load.
    a.sampling.overrides()?;
    if let Some(n) = a.logprobs
        && n > int4::MAX_TOP_LOGPROBS
    {
        return Err(format!("--logprobs {n}: at most {}", int4::MAX_TOP_LOGPROBS).into());
    }
    if a.max_new_tokens == 0 {
        return Err("--max-new-tokens 0: give at least 1".into());
    }
    let prompt = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => Prompt::Ids(
            ids.split(',')
                .map(|t| t.trim().parse::<u32>().map_err(|e| format!("--prompt-ids: {t:?}: {e}")))
                .collect::<Result<_, _>>()?,
        ),
        (None, Some(p)) if a.chat => {
            let mut messages = Messages::new();
            messages.push("user", p);
            Prompt::Chat { messages, options: ChatOptions::default() }
        }
        (None, Some(p)) => Prompt::Text(p.clone()),
        (None, None) => return Err("give a prompt or --prompt-ids".into()),
    };
    let engine = load_engine(&a.model, &a.run, a.context)?;
    let packed_from = packed_from(&engine);
    let sampling = a.sampling.resolve(&engine)?;
    let mut req = GenerationRequest::new(prompt);
    req.sampling = sampling;
    req.max_tokens = Some(a.max_new_tokens);
    req.stop = a.sampling.stop.clone();
    req.logprobs = a.logprobs.filter(|_| a.json);
    req.ignore_eos = a.ignore_eos;
    let seq_params = sampling.or(engine.defaults.sampling).resolve();
    let mut failed: Option<Box<dyn std::error::Error>> = None;
    let mut logprobs = Vec::new();
    let out = engine.generate(req, |event| {
        if let Some(lp) = &event.logprobs {
            logprobs.push(lp.clone());
        }
        if a.json {
            return Next::Continue;
        }
        match out::write_str(&event.text) {
            Ok(()) => Next::Continue,
            Err(e) => {
                // Standard output is gone or failing: stop generating at once.
                failed = Some(e.into());
                Next::Stop
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let prompt_len = out.usage.prompt_tokens;
    let kernels = engine.model.kernels(prompt_len);
    let prefill_tps = prompt_len as f64 / out.prefill.as_secs_f64();
    let decode_tps = if out.tokens.len() > 1 { (out.tokens.len() - 1) as f64 / out.decode.as_secs_f64() } else { 0.0 };
    if a.json {
        let token_text = |id: u32| engine.text.token_text(id).unwrap_or_default();
        let lp: Vec<serde_json::Value> = out
            .tokens
            .iter()
            .zip(&logprobs)
            .map(|(&id, l)| {
                serde_json::json!({
                    "id": id, "token": token_text(id), "logprob": l.logprob,
                    "top": l.top.iter().map(|&(t, p)| serde_json::json!({"id": t, "token": token_text(t), "logprob": p})).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "prompt_tokens": prompt_len,
            "generated_ids": out.tokens,
            "text": out.text,
            "finish": format!("{:?}", out.finish),
            "finish_reason": out.finish.openai_name(),
            "sampling": {
                "temperature": seq_params.temperature, "top_k": seq_params.top_k, "top_p": seq_params.top_p,
                "min_p": seq_params.min_p, "repetition_penalty": seq_params.repetition_penalty,
                "presence_penalty": seq_params.presence_penalty, "frequency_penalty": seq_params.frequency_penalty,
                "seed": seq_params.seed,
            },
            "logprobs": if a.logprobs.is_some() { serde_json::Value::Array(lp) } else { serde_json::Value::Null },
            "plan": engine.plan,
            "kernels": kernels.iter().map(|k| serde_json::json!({"layer": k.layer, "decode": k.decode.name(), "prefill": k.prefill.name()})).collect::<Vec<_>>(),
            "load_s": engine.load_time.as_secs_f64(),
            "packed_from": packed_from,
            "prefill_s": out.prefill.as_secs_f64(),
            "decode_s": out.decode.as_secs_f64(),
            "prefill_tok_s": prefill_tps,
            "decode_tok_s": decode_tps,
            "rss_anon_mib": rss_anon_mib(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!()?;
        let path = engine.plan.path;
        errln!(
            "[int4] load {:.2} s ({}) | prefill {} tok at {:.1} tok/s | decode {} tok at {:.1} tok/s | path {} (decode {}, prefill {}) | stop {:?} | RssAnon {:.0} MiB",
            engine.load_time.as_secs_f64(),
            packed_from,
            prompt_len,
            prefill_tps,
            out.tokens.len(),
            decode_tps,
            path,
            kernels[0].decode,
            kernels[0].prefill,
            out.finish,
            rss_anon_mib().unwrap_or(0.0)
        );
    }
    Ok(())
}

fn eval(a: EvalArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Cheap checks first, so a bad flag does not wait for two model loads.
    int4_quant::eval::check_ctx(a.ctx)?;
    let docs = int4_quant::eval::read_text(a.text.as_deref())?;
    start_threads(a.engine.threads)?;
    let prio = priority(&a.engine.priority)?;
    // The reference keeps every key and value exact whatever `--kv` says: `--kv` is the evaluated path's.
    let load = |dir: &std::path::Path, path: RunPath, reference: bool| -> Result<Engine, Box<dyn std::error::Error>> {
        let mut opts = load_options(RunPath::Auto, prio, a.ctx, a.engine.no_cache)?;
        opts.path = path;
        a.engine.apply(&mut opts)?;
        if reference {
            opts.kv = Some(int4::KvType::F32);
        }
        let engine = Engine::load(dir, &opts)?;
        for w in &engine.warnings {
            errln!("[int4] warning: {w}");
        }
        Ok(engine)
    };
    let model = int4::resolve_model(&a.model)?;
    let ref_model = match &a.ref_model {
        Some(r) => int4::resolve_model(r)?,
        None => model.clone(),
    };
    let reference = load(&ref_model, a.reference, true)?;
    let evaluated = load(&model, a.path, false)?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("[int4] eval windows {bar:30} {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let result = int4_quant::eval::evaluate_from(&evaluated, &reference, &docs, a.ctx, a.score_from, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let r = result?;
    // The JSON first: a failing standard output must not lose the results.
    if let Some(path) = &a.json {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&r)? + "\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    out!("{}", r.markdown())?;
    Ok(())
}

fn quantize(a: QuantizeArgs) -> Result<(), Box<dyn std::error::Error>> {
    start_threads(a.threads)?;
    let group = GroupSize::from_checkpoint(a.group_size).map_err(|e| format!("--group-size {}: {e}", a.group_size))?;
    if a.method == MethodArg::Rtn && a.calib.is_some() {
        return Err("--calib is for --method gptq (round to nearest uses no data)".into());
    }
    let opts = QuantizeOptions {
        method: match a.method {
            MethodArg::Rtn => Method::Rtn,
            MethodArg::Gptq => Method::Gptq,
        },
        gptq: GptqOptions { calib: a.calib.clone(), seq_len: a.calib_seq, max_tokens: a.calib_tokens, damp: a.damp },
        format: match a.format {
            FormatArg::CpuInt4 => ExportFormat::CpuInt4,
            FormatArg::Gptq => ExportFormat::Gptq,
        },
        group,
        asym: a.asym,
        search: if a.no_search { ScaleSearch::Off } else { ScaleSearch::Shrink },
        quantize_head: !a.no_lm_head,
        ignore: a.ignore.clone(),
        force: a.force,
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "[int4] quantizing {bar:30} {binary_bytes}/{binary_total_bytes} {pos}/{len} tensors {elapsed} {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress = |p: int4_quant::export::Progress<'_>| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done);
        bar.set_message(p.tensor.to_string());
    };
    let model = int4::resolve_model(&a.model)?;
    let result = quantize_checkpoint(&model, &a.out, &opts, Some(&progress));
    bar.finish_and_clear();
    print_quantize_summary(&result?)?;
    Ok(())
}

/// The report in a few lines: one per kind of layer (q_proj, …, lm_head), then totals.
fn print_quantize_summary(r: &QuantizeReport) -> Result<(), OutError> {
    let fmt_snr = |s: Option<f64>| s.map_or_else(|| "exact".to_string(), |v| format!("{v:.2}"));
    let format = r.checkpoint_format.as_deref().map_or(r.format.clone(), |c| format!("{} ({c})", r.format));
    outln!(
        "{} -> {}: {format}, group {}, {}, search {}, method {}",
        r.input.display(),
        r.output.display(),
        r.group_size,
        if r.format == "gptq" && r.sym { "symmetric" } else { "asymmetric" },
        if r.search { "on" } else { "off" },
        r.method
    )?;
    if let Some(c) = &r.calibration {
        outln!(
            "  calibration: {} tokens in {} sequences of up to {} from {} file(s), damp {}, {} ({:.1} s)",
            c.tokens,
            c.sequences,
            c.seq_len,
            c.files.len(),
            c.damp,
            if c.sequential { "sequential" } else { "one pass" },
            c.seconds
        )?;
    }
    let gptq = r.calibration.is_some();
    let mut kinds: Vec<(String, Vec<&int4_quant::export::TensorReport>)> = Vec::new();
    for t in &r.tensors {
        let kind = t.name.rsplit('.').next().unwrap_or(&t.name).to_string();
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, v)) => v.push(t),
            None => kinds.push((kind, vec![t])),
        }
    }
    if gptq {
        outln!(
            "  {:<10} {:>6} {:>14} {:>8} {:>10} {:>10} {:>12} {:>12}",
            "layer",
            "count",
            "shape",
            "bits/w",
            "SNR dB",
            "min dB",
            "out SNR dB",
            "RTN out dB"
        )?;
    } else {
        outln!("  {:<10} {:>6} {:>14} {:>8} {:>10} {:>10}", "layer", "count", "shape", "bits/w", "SNR dB", "min dB")?;
    }
    for (kind, ts) in &kinds {
        let (s, e) = ts.iter().fold((0.0, 0.0), |(s, e), t| (s + t.signal, e + t.noise));
        let snr = int4_quant::export::snr_db(s, e);
        let min = ts.iter().filter_map(|t| t.snr_db).min_by(f64::total_cmp);
        let bits: f64 = ts.iter().map(|t| t.bits_per_weight).sum::<f64>() / ts.len() as f64;
        let shape = format!("{}x{}", ts[0].shape[0], ts[0].shape[1]);
        if gptq {
            // Mean over the layers of this kind of each layer's output SNR (dB), GPTQ and RTN on the same H.
            let mean = |f: fn(&&int4_quant::export::TensorReport) -> Option<f64>| {
                let v: Vec<f64> = ts.iter().filter_map(f).collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            };
            let (out, base) = (mean(|t| t.output_snr_db), mean(|t| t.rtn_output_snr_db));
            outln!(
                "  {kind:<10} {:>6} {shape:>14} {bits:>8.3} {:>10} {:>10} {:>12} {:>12}",
                ts.len(),
                fmt_snr(snr),
                fmt_snr(min),
                fmt_snr(out),
                fmt_snr(base)
            )?;
        } else {
            outln!("  {kind:<10} {:>6} {shape:>14} {bits:>8.3} {:>10} {:>10}", ts.len(), fmt_snr(snr), fmt_snr(min))?;
        }
    }
    let t = &r.totals;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    outln!(
        "  total: {} layers, {} weights at {:.3} bits/w, SNR {} dB (worst {} dB, {}); {} tensors copied ({:.1} MiB)",
        t.quantized_tensors,
        t.quantized_weights,
        t.bits_per_weight,
        fmt_snr(t.snr_db),
        fmt_snr(t.min_snr_db),
        t.worst_tensor.as_deref().unwrap_or("-"),
        t.copied_tensors,
        mib(t.copied_bytes)
    )?;
    outln!(
        "  head: {}; {:.1} MiB -> {:.1} MiB in {:.1} s; peak RssAnon {}",
        r.head,
        mib(t.input_bytes),
        mib(t.output_bytes),
        t.seconds,
        t.peak_rss_anon_bytes.map_or_else(|| "unknown".to_string(), |b| format!("{:.0} MiB", mib(b)))
    )?;
    if !r.ignored.is_empty() {
        outln!("  left unquantized (--ignore): {}", r.ignored.join(", "))?;
    }
    outln!("  report: {}", r.output.join("quantization_report.json").display())
}

fn probe(json: bool) -> Result<(), Box<dyn std::error::Error>> {
    let snap = snapshot_for_policy()?;
    let caps = int4::kernels::isa::IsaCaps::process();
    let overrides = Overrides { caps: *caps, ..Overrides::default() };
    let mut plans = Vec::new();
    for kind in CheckpointKind::ALL {
        for prio in [Priority::Speed, Priority::Fidelity] {
            plans.push((kind, prio, plan(&snap, kind, prio, &overrides)));
        }
    }
    if json {
        let doc = serde_json::json!({
            "snapshot": snap,
            "usable": snap.usable(),
            "kernels_level_in_this_process": caps.effective_level(),
            "plans_at": serde_json::json!({
                "group": overrides.group.to_checkpoint(),
                "head_bits": overrides.head_bits.bits(),
                "activation_scales": overrides.activation_scales.name(),
            }),
            "plans": plans.iter().map(|(k, p, r)| serde_json::json!({
                "checkpoint": k, "priority": p,
                "plan": r.as_ref().ok(), "error": r.as_ref().err().map(|e| e.to_string()),
            })).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    print_snapshot(&snap)?;
    outln!("kernels this process can run: {}", caps.effective_level().name())?;
    outln!()?;
    outln!(
        "plan per checkpoint kind, at the load defaults the W4A8 rule reads (group {}, {}-bit head, {} activation \
         scales; `int4 info MODEL` plans a model's own):",
        overrides.group.to_checkpoint(),
        overrides.head_bits.bits(),
        overrides.activation_scales.name()
    )?;
    for (kind, prio, r) in &plans {
        match r {
            Ok(p) => {
                outln!(
                    "  {kind:?}/{prio:?}: {}  decode {}  prefill {} (M >= {})  layout {:?}",
                    p.path,
                    p.decode.kernel,
                    p.prefill.kernel,
                    p.dequant_threshold,
                    p.layout
                )?;
                for rj in &p.rejected {
                    outln!("      not {}: {}", rj.path, rj.why)?;
                }
            }
            Err(e) => outln!("  {kind:?}/{prio:?}: error: {e}")?,
        }
    }
    Ok(())
}

/// `int4 cache`: its exit status (1 when `verify` finds damage, 2 for a usage error), or an error.
fn cache(action: &str, bytes: Option<u64>) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Some(store) = int4::cache::ArtifactStore::from_env()? else {
        return Err("no cache directory: set INT4_CACHE_DIR, XDG_CACHE_HOME or HOME".into());
    };
    match Some(action) {
        Some("ls") => {
            let entries = store.list();
            outln!("{} ({} artifacts)", store.dir().display(), entries.len())?;
            let mut total = 0;
            for e in entries {
                total += e.size;
                // What the artifact holds, from its header's canonical key: source files, path and group.
                let what = store
                    .header(&e.key)
                    .ok()
                    .and_then(|h| serde_json::from_str::<serde_json::Value>(&h.canonical).ok())
                    .map_or_else(
                        || "unreadable header (int4 cache verify says why)".to_string(),
                        |k| {
                            let files: Vec<&str> = k["source"]["files"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(|f| f["name"].as_str())
                                .collect();
                            format!(
                                "{} | {} | group {} | {}",
                                k["plan"]["path"].as_str().unwrap_or("?"),
                                k["quantization"]["method"].as_str().unwrap_or("?"),
                                k["quantization"]["fields"]["group_size"],
                                files.join(", ")
                            )
                        },
                    );
                outln!("  {}  {:>12} bytes{}  {what}", e.key, e.size, if e.pinned { "  pinned" } else { "" })?;
            }
            // Artifacts being written, and what killed writers left (removed by the next clear, eviction or
            // cold load).
            for (path, size, alive) in store.temporaries() {
                total += size;
                let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                let state =
                    if alive { "being written" } else { "left by a writer that died; removed by the next clear" };
                outln!("  {name}  {size:>12} bytes  {state}")?;
            }
            outln!("total {total} bytes")?;
            Ok(ExitCode::SUCCESS)
        }
        Some("verify") => {
            let mut bad = 0;
            for (key, r) in store.verify() {
                match r {
                    Ok(()) => outln!("ok       {key}")?,
                    Err(e) => {
                        bad += 1;
                        outln!("CORRUPT  {key}: {e}")?;
                    }
                }
            }
            Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Some("clear") => {
            outln!("removed {} artifacts from {}", store.clear(), store.dir().display())?;
            Ok(ExitCode::SUCCESS)
        }
        Some("evict") => match bytes {
            Some(cap) => {
                let gone = store.evict_to(cap);
                outln!("evicted {} artifacts to stay under {cap} bytes", gone.len())?;
                Ok(ExitCode::SUCCESS)
            }
            None => {
                errln!("int4 cache evict: give the size cap in bytes");
                Ok(ExitCode::from(2))
            }
        },
        _ => {
            errln!("usage: int4 cache ls|verify|clear|evict BYTES");
            Ok(ExitCode::from(2))
        }
    }
}

fn print_snapshot(s: &CpuSnapshot) -> Result<(), OutError> {
    let yn = |b: bool| if b { "yes" } else { "no" };
    outln!(
        "CPU: {} ({}, family {} model {} stepping {})",
        s.model_name,
        s.vendor,
        s.family_model_stepping.0,
        s.family_model_stepping.1,
        s.family_model_stepping.2
    )?;
    outln!(
        "source: {}   arch: {}   logical cores: {:?}   physical cores: {:?}",
        s.source,
        s.arch,
        s.logical_cores,
        s.physical_cores
    )?;
    outln!("caches: L1d {:?}  L2 {:?}  L3 {:?} bytes", s.caches.l1d, s.caches.l2, s.caches.l3)?;
    outln!()?;
    let c = &s.cpu;
    let u = s.usable();
    outln!("{:<14} {:>6} {:>8}", "feature", "CPUID", "usable")?;
    for (name, cpu, usable) in [
        ("sse4.2", c.sse42, c.sse42),
        ("avx2+fma", c.avx2 && c.fma, u.avx2_fma),
        ("f16c", c.f16c, c.f16c && s.os.avx_state),
        ("avx512 f/bw/vl", c.avx512f && c.avx512bw && c.avx512vl, u.avx512),
        ("avx512-vnni", c.avx512vnni, u.avx512vnni),
        ("avx512-bf16", c.avx512bf16, u.avx512bf16),
        ("avx-vnni", c.avx_vnni, c.avx_vnni && s.os.avx_state),
        ("amx-tile", c.amx_tile, u.amx_int8 || u.amx_bf16),
        ("amx-int8", c.amx_int8, u.amx_int8),
        ("amx-bf16", c.amx_bf16, u.amx_bf16),
    ] {
        outln!("{name:<14} {:>6} {:>8}", yn(cpu), yn(usable))?;
    }
    outln!()?;
    outln!(
        "OS: osxsave {}  xcr0 {}  avx state {}  avx512 state {}  amx state {}",
        yn(c.osxsave),
        s.os.xcr0.map_or("unreadable".to_string(), |x| format!("{x:#x}")),
        yn(s.os.avx_state),
        yn(s.os.avx512_state),
        yn(s.os.amx_state)
    )?;
    outln!("AMX permission: {:?}", s.amx_permission)?;
    if let Some(t) = s.tile_limits {
        outln!(
            "tiles: {} names, {} rows x {} bytes; TMUL max K {} max N {}",
            t.max_names,
            t.max_rows,
            t.bytes_per_row,
            t.tmul_max_k,
            t.tmul_max_n
        )?;
    }
    Ok(())
}
