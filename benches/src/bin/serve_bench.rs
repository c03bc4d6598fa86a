//! The serving load benchmark: `int4 serve` under concurrent streaming clients, beside llama.cpp's
//! `llama-server` on the same GGUF file in the same run.
//!
//! Each server is a separate process this binary starts on loopback and stops at the end. Every request is
//! greedy (temperature 0), streams (server-sent events), takes one prompt of the committed prompt set
//! ([`int4_benches::prompts`], chats through `/v1/chat/completions`, plain text through
//! `/v1/completions`, in turn) and asks for `--max-tokens` tokens with `ignore_eos`, so every request of
//! every server generates as many tokens and the load does not depend on where a model's greedy text ends.
//!
//! Levels of concurrency (`--levels`, default 1, 4 and 16): at each, that many client threads send
//! `--requests` requests between them, each sending its next as soon as its last ends. Per level and
//! server: completed requests, errors, aggregate output tokens per second (every request's completion
//! tokens over the wall time of the level), time to first token and inter-token latency (the gap between
//! successive streamed chunks with text) at p50 and p99, and the server's peak `RssAnon` during the level
//! (sampled every 50 ms; beside its `RssAnon + RssFile` settled before the first level).
//!
//! Rounds (`--rounds`) alternate the servers: each level runs on every server in turn, the order reversed
//! every other round, so a noisy neighbour falls on both. The table gives the median over rounds of each
//! figure, with the range of the throughput.
//!
//! `llama-server` (`--llama-server PATH`, or `LLAMA_SERVER`) is built outside this repository; it runs as
//! the comparison the project states: `-np <highest level> -t <threads> -c <highest level × (longest
//! prompt, max tokens and 16 more)>` on the GGUF file the model directory holds (`--gguf` to name another).
//! Without it only int4 is measured.
//!
//! Usage: `serve-bench [--model DIR] [--paths auto,w4a16] [--levels 1,4,16] [--requests 64]
//! [--max-tokens 128] [--rounds 3] [--threads N] [--llama-server PATH] [--gguf FILE] [--json FILE]`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use int4_benches::prompts::{BenchPrompt, NamedPrompt, prompt_set};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "serve-bench",
    about = "int4 serve under concurrent streaming clients, beside llama-server on the same GGUF file"
)]
struct Args {
    /// The model int4 serves (default: the one `cargo xtask fetch-model` prepares).
    #[arg(long)]
    model: Option<PathBuf>,
    /// int4's `--path` for each int4 server measured, comma-separated (auto, w4a16, w4a8, …).
    #[arg(long, default_value = "auto", value_delimiter = ',')]
    paths: Vec<String>,
    /// Concurrent clients at each level, comma-separated.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    levels: Vec<usize>,
    /// Requests sent at each level.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Tokens each request generates (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Rounds; each runs every level on every server.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Threads each server computes on (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// The `int4` binary (default: the one beside this binary).
    #[arg(long)]
    int4: Option<PathBuf>,
    /// A `llama-server` binary to measure beside int4 (default: `LLAMA_SERVER`, if set).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// The GGUF file llama-server loads (default: the one the model directory holds).
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// Seconds a request may take before it counts as an error.
    #[arg(long, default_value_t = 600)]
    request_timeout: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("serve-bench: {msg}");
    std::process::exit(1)
}

/// A server process this benchmark started; killed when dropped.
struct Server {
    label: String,
    child: Child,
    port: u16,
    model: String,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails with the log's tail if the process has exited.
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            fail(format!("{} exited ({status}); its log ({}):\n{}", self.label, self.log.display(), tail.join("\n")));
        }
    }

    /// Waits until `GET /health` answers 200, up to `limit`.
    fn wait_healthy(&mut self, limit: Duration) {
        let agent = agent(Duration::from_secs(5));
        let deadline = Instant::now() + limit;
        loop {
            self.check_alive();
            if agent.get(&self.url("/health")).call().is_ok_and(|r| r.status() == 200) {
                return;
            }
            if Instant::now() > deadline {
                fail(format!("{} was not healthy within {limit:?} (log: {})", self.label, self.log.display()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into()
}

/// A port free on loopback now (the kernel's pick for port 0).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| fail(format!("binding loopback: {e}")));
    l.local_addr().map(|a| a.port()).unwrap_or_else(|e| fail(e))
}

fn log_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench/serve-bench");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(format!("{}: {e}", dir.display())));
    dir
}

fn spawn(label: &str, mut cmd: Command, port: u16, model: &str) -> Server {
    let log = log_dir().join(format!("{}.log", label.replace(['/', ' '], "_")));
    let file = std::fs::File::create(&log).unwrap_or_else(|e| fail(format!("{}: {e}", log.display())));
    let err = file.try_clone().unwrap_or_else(|e| fail(e));
    cmd.stdin(Stdio::null()).stdout(Stdio::from(file)).stderr(Stdio::from(err));
    let child = cmd.spawn().unwrap_or_else(|e| fail(format!("starting {label}: {e}")));
    let mut s = Server { label: label.to_string(), child, port, model: model.to_string(), log };
    s.wait_healthy(Duration::from_secs(300));
    s
}

fn start_int4(bin: &Path, model: &Path, path: &str, threads: usize) -> Server {
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg(model).args(["--port", &port.to_string(), "--served-model-name", "bench"]);
    cmd.args(["--path", path, "--threads", &threads.to_string()]);
    // The server picks its kernels from this machine, whatever the caller's environment caps.
    cmd.env_remove("INT4_ISA").env_remove("INT4_DISABLE");
    spawn(&format!("int4 {path}"), cmd, port, "bench")
}

fn start_llama(bin: &Path, gguf: &Path, slots: usize, threads: usize, ctx: usize) -> Server {
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.arg("-m").arg(gguf).args(["--host", "127.0.0.1", "--port", &port.to_string()]);
    cmd.args(["-np", &slots.to_string(), "-t", &threads.to_string(), "-c", &ctx.to_string()]);
    spawn("llama-server", cmd, port, "bench")
}

/// The request body and endpoint for prompt `p`.
fn request(p: &NamedPrompt, model: &str, max_tokens: usize, stream: bool) -> (&'static str, Value) {
    let common = json!({
        "model": model, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": true, "stream": stream,
    });
    let mut body = common;
    match &p.prompt {
        BenchPrompt::Plain(text) => {
            body["prompt"] = json!(text);
            ("/v1/completions", body)
        }
        BenchPrompt::Chat(turns) => {
            body["messages"] = turns.iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
            ("/v1/chat/completions", body)
        }
    }
}

/// One streamed request's timings.
#[derive(Debug, Default)]
struct Outcome {
    ok: bool,
    error: Option<String>,
    tokens: usize,
    ttft: Option<f64>,
    gaps: Vec<f64>,
}

/// Sends one streaming request and reads its events to the end.
fn run_one(agent: &ureq::Agent, server: &Server, p: &NamedPrompt, max_tokens: usize) -> Outcome {
    let (endpoint, mut body) = request(p, &server.model, max_tokens, true);
    body["stream_options"] = json!({"include_usage": true});
    let start = Instant::now();
    let mut out = Outcome::default();
    let resp = agent.post(&server.url(endpoint)).header("content-type", "application/json").send(body.to_string());
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => return Outcome { error: Some(e.to_string()), ..out },
    };
    if resp.status() != 200 {
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        return Outcome { error: Some(format!("HTTP {}: {text}", resp.status())), ..out };
    }
    let mut reader = BufReader::new(resp.body_mut().as_reader());
    let (mut last, mut chunks, mut usage) = (None::<Instant>, 0usize, None::<usize>);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => {
                out.error = Some("the stream ended without [DONE]".into());
                return out;
            }
            Ok(_) => {}
            Err(e) => {
                out.error = Some(e.to_string());
                return out;
            }
        }
        let Some(data) = line.trim_end().strip_prefix("data:").map(str::trim) else { continue };
        if data == "[DONE]" {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            out.error = Some(format!("an event that is not JSON: {data}"));
            return out;
        };
        if let Some(e) = v.get("error") {
            out.error = Some(e.to_string());
            return out;
        }
        if let Some(n) = v.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
            usage = Some(n as usize);
        }
        let choice = v.pointer("/choices/0");
        let text = choice
            .and_then(|c| c.pointer("/delta/content").or_else(|| c.get("text")))
            .and_then(Value::as_str)
            .unwrap_or("");
        if !text.is_empty() {
            let now = Instant::now();
            match last {
                None => out.ttft = Some(now.duration_since(start).as_secs_f64()),
                Some(t) => out.gaps.push(now.duration_since(t).as_secs_f64()),
            }
            last = Some(now);
            chunks += 1;
        }
    }
    out.tokens = usage.unwrap_or(chunks);
    out.ok = true;
    out
}

/// One level's figures on one server in one round.
#[derive(Debug, Clone)]
struct LevelRun {
    completed: usize,
    errors: usize,
    first_error: Option<String>,
    tokens: usize,
    tok_s: f64,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    peak_rss_anon: u64,
}

fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() - 1) as f64 * q).round() as usize;
    s[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn run_level(server: &Server, prompts: &[NamedPrompt], clients: usize, a: &Args) -> LevelRun {
    let agent = agent(Duration::from_secs(a.request_timeout));
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let peak = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if let Some((anon, _)) = int4_benches::process_rss_anon_and_file(server.pid()) {
                    peak.fetch_max(anon as usize, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let workers: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= a.requests {
                            return;
                        }
                        let o = run_one(&agent, server, &prompts[i % prompts.len()], a.max_tokens);
                        results.lock().unwrap_or_else(|p| p.into_inner()).push(o);
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.join();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let wall = start.elapsed().as_secs_f64();
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let ok: Vec<&Outcome> = results.iter().filter(|o| o.ok).collect();
    let tokens: usize = ok.iter().map(|o| o.tokens).sum();
    LevelRun {
        completed: ok.len(),
        errors: results.len() - ok.len(),
        first_error: results.iter().find_map(|o| o.error.clone()),
        tokens,
        tok_s: tokens as f64 / wall,
        ttft: ok.iter().filter_map(|o| o.ttft).collect(),
        itl: ok.iter().flat_map(|o| o.gaps.iter().copied()).collect(),
        peak_rss_anon: peak.load(Ordering::Relaxed) as u64,
    }
}

/// The prompt lengths in tokens as `server` counts them (one token generated for each).
fn prompt_tokens(server: &Server, prompts: &[NamedPrompt]) -> Vec<usize> {
    let agent = agent(Duration::from_secs(120));
    prompts
        .iter()
        .map(|p| {
            let (endpoint, body) = request(p, &server.model, 1, false);
            let mut r = agent
                .post(&server.url(endpoint))
                .header("content-type", "application/json")
                .send(body.to_string())
                .unwrap_or_else(|e| fail(format!("{}: {e}", server.label)));
            let text = r.body_mut().read_to_string().unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            v.pointer("/usage/prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or_else(|| fail(format!("{}: no usage.prompt_tokens in {text}", server.label)))
                as usize
        })
        .collect()
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn main() {
    let a = Args::parse();
    if a.levels.is_empty() || a.levels.contains(&0) || a.requests == 0 || a.rounds == 0 || a.max_tokens == 0 {
        fail("--levels, --requests, --rounds and --max-tokens must be positive");
    }
    let model = match a.model.clone().or_else(int4::cache::dirs::default_model_dir) {
        Some(d) if d.exists() => d,
        Some(d) => fail(format!("no model at {} (run `cargo xtask fetch-model`)", d.display())),
        None => fail("no model directory: pass --model DIR, or set INT4_MODEL_DIR or HOME"),
    };
    let int4_bin = a.int4.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
        exe.with_file_name(format!("int4{}", std::env::consts::EXE_SUFFIX))
    });
    if !int4_bin.is_file() {
        fail(format!("no int4 binary at {} (build it: cargo build --release -p int4-cli)", int4_bin.display()));
    }
    let llama_bin = a.llama_server.clone().or_else(|| std::env::var_os("LLAMA_SERVER").map(PathBuf::from));
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cpu_name = int4::select::snapshot_for_policy()
        .map(|s| {
            let (f, m, _) = s.family_model_stepping;
            format!("{} family {f} model {m}", s.model_name)
        })
        .unwrap_or_default();
    eprintln!("serve-bench on {cpu_name}, {threads} threads; model {}", model.display());

    let prompts = prompt_set();
    let mut servers: Vec<Server> = a.paths.iter().map(|p| start_int4(&int4_bin, &model, p, threads)).collect();
    let lengths = prompt_tokens(&servers[0], &prompts);
    let longest = lengths.iter().copied().max().unwrap_or(0);
    eprintln!("prompt tokens: {lengths:?}");
    if let Some(bin) = &llama_bin {
        let gguf = a.gguf.clone().or_else(|| find_gguf(&model)).unwrap_or_else(|| {
            fail(format!("{} holds no .gguf file for llama-server; pass --gguf FILE", model.display()))
        });
        let slots = a.levels.iter().copied().max().unwrap_or(1);
        // A slot per client, each with room for the longest prompt and the tokens asked for.
        let ctx = slots * (longest + a.max_tokens + 16);
        servers.push(start_llama(bin, &gguf, slots, threads, ctx));
    }
    // Settled memory (after one request, so pages touched at first use count), and a warm-up.
    let mut settled = Vec::new();
    for s in &mut servers {
        let warm = run_one(&agent(Duration::from_secs(a.request_timeout)), s, &prompts[3], 8);
        if !warm.ok {
            fail(format!("{}: warm-up request failed: {}", s.label, warm.error.unwrap_or_default()));
        }
        std::thread::sleep(Duration::from_millis(300));
        settled.push(int4_benches::process_rss_anon_and_file(s.pid()).unwrap_or((0, 0)));
    }

    // runs[server][level] = one LevelRun per round.
    let mut runs: Vec<Vec<Vec<LevelRun>>> = vec![vec![Vec::new(); a.levels.len()]; servers.len()];
    for round in 0..a.rounds {
        for (li, &clients) in a.levels.iter().enumerate() {
            let order: Vec<usize> =
                if round % 2 == 0 { (0..servers.len()).collect() } else { (0..servers.len()).rev().collect() };
            for si in order {
                servers[si].check_alive();
                let r = run_level(&servers[si], &prompts, clients, &a);
                eprintln!(
                    "round {round} {} c={clients}: {} ok, {} errors, {:.1} tok/s, TTFT p50 {:.0} ms",
                    servers[si].label,
                    r.completed,
                    r.errors,
                    r.tok_s,
                    percentile(&r.ttft, 0.5) * 1e3
                );
                if let Some(e) = &r.first_error {
                    eprintln!("  first error: {e}");
                }
                runs[si][li].push(r);
            }
        }
    }

    println!(
        "serve-bench on {cpu_name}: {threads} threads, {} requests per level, max_tokens {}, greedy, ignore_eos, {} rounds (medians; tok/s range)",
        a.requests, a.max_tokens, a.rounds
    );
    println!();
    println!(
        "| server | clients | completed | errors | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | peak RssAnon MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (si, s) in servers.iter().enumerate() {
        for (li, &clients) in a.levels.iter().enumerate() {
            let rs = &runs[si][li];
            let m = |f: &dyn Fn(&LevelRun) -> f64| median(rs.iter().map(f).collect());
            let tok: Vec<f64> = rs.iter().map(|r| r.tok_s).collect();
            let (lo, hi) = tok.iter().fold((f64::MAX, 0.0f64), |(l, h), &t| (l.min(t), h.max(t)));
            let completed: usize = rs.iter().map(|r| r.completed).sum();
            let errors: usize = rs.iter().map(|r| r.errors).sum();
            let row = json!({
                "server": s.label, "clients": clients, "completed": completed, "errors": errors,
                "output_tok_s": m(&|r| r.tok_s), "output_tok_s_range": [lo, hi],
                "ttft_ms_p50": m(&|r| percentile(&r.ttft, 0.5)) * 1e3, "ttft_ms_p99": m(&|r| percentile(&r.ttft, 0.99)) * 1e3,
                "itl_ms_p50": m(&|r| percentile(&r.itl, 0.5)) * 1e3, "itl_ms_p99": m(&|r| percentile(&r.itl, 0.99)) * 1e3,
                "peak_rss_anon_mib": mib(rs.iter().map(|r| r.peak_rss_anon).max().unwrap_or(0)),
                "settled_rss_anon_mib": mib(settled[si].0), "settled_rss_file_mib": mib(settled[si].1),
                "tokens_per_request": rs.iter().map(|r| r.tokens as f64 / r.completed.max(1) as f64).fold(0.0, f64::max),
            });
            println!(
                "| {} | {clients} | {completed} | {errors} | {:.1} ({lo:.1}–{hi:.1}) | {:.0} / {:.0} | {:.1} / {:.1} | {:.0} |",
                s.label,
                row["output_tok_s"].as_f64().unwrap_or(f64::NAN),
                row["ttft_ms_p50"].as_f64().unwrap_or(f64::NAN),
                row["ttft_ms_p99"].as_f64().unwrap_or(f64::NAN),
                row["itl_ms_p50"].as_f64().unwrap_or(f64::NAN),
                row["itl_ms_p99"].as_f64().unwrap_or(f64::NAN),
                row["peak_rss_anon_mib"].as_f64().unwrap_or(f64::NAN),
            );
            rows.push(row);
        }
    }
    println!();
    for (si, s) in servers.iter().enumerate() {
        println!("settled {}: RssAnon {:.0} MiB + RssFile {:.0} MiB", s.label, mib(settled[si].0), mib(settled[si].1));
    }
    let tok = |si: usize, li: usize| median(runs[si][li].iter().map(|r| r.tok_s).collect());
    let ttft = |si: usize, li: usize| median(runs[si][li].iter().map(|r| percentile(&r.ttft, 0.5)).collect());
    let (lo_level, hi_level) = (0, a.levels.len() - 1);
    let llama = llama_bin.as_ref().map(|_| servers.len() - 1);
    let mut ratios = Vec::new();
    for (si, server) in servers.iter().enumerate().take(a.paths.len()) {
        let label = &server.label;
        let scale = tok(si, hi_level) / tok(si, lo_level);
        println!("{label}: {} clients / {} client: {scale:.2}× output tok/s", a.levels[hi_level], a.levels[lo_level]);
        let mut r = json!({"server": label, "scaling": scale});
        if let Some(l) = llama {
            let vs = tok(si, hi_level) / tok(l, hi_level);
            let t = ttft(si, lo_level) / ttft(l, lo_level);
            println!(
                "{label} / llama-server at {} clients: {vs:.2}× output tok/s; TTFT p50 at {} client: {t:.2}× llama-server's",
                a.levels[hi_level], a.levels[lo_level]
            );
            r["vs_llama_server_tok_s"] = json!(vs);
            r["vs_llama_server_ttft"] = json!(t);
        }
        ratios.push(r);
    }
    if let Some(path) = &a.json {
        let doc = json!({
            "schema": "int4-serve-bench/1", "cpu": cpu_name, "threads": threads, "model": model.display().to_string(),
            "requests": a.requests, "max_tokens": a.max_tokens, "rounds": a.rounds, "levels": a.levels,
            "prompt_tokens": lengths, "rows": rows, "ratios": ratios,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        std::fs::write(path, text).unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
    }
    let errors: usize = runs.iter().flatten().flatten().map(|r| r.errors).sum();
    if errors > 0 {
        fail(format!("{errors} requests failed"));
    }
}

/// The one `.gguf` file in `dir`, if `dir` is one or holds one.
fn find_gguf(dir: &Path) -> Option<PathBuf> {
    if dir.extension().is_some_and(|e| e == "gguf") {
        return Some(dir.to_path_buf());
    }
    let mut found = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}
