//! Project automation, written in Rust so it runs wherever cargo does (`cargo xtask <task>`).
//!
//! * `cargo xtask ci` — everything CI checks, in order, failing on the first failure: formatting,
//!   clippy with warnings denied, every test in the workspace, then `cargo xtask bench --quick` so the
//!   README's main command is known to work.
//! * `cargo xtask bench [--quick]` — the kernel table: W4A16 decode and prefill and the dense bf16 kernels
//!   at the project's real shapes, beside the machine's own bandwidth and FMA ceilings measured in the same
//!   run (`target/bench/kernels.json` too). `--quick` uses fewer shapes and rounds. The criterion
//!   benchmarks (`cargo bench -p int4-benches`) time single kernels and the layout routines.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(rest.contains(&"--quick")),
        Some(other) if other.starts_with('-') => bail!("unknown option `{other}` (try `cargo xtask --help`)"),
        Some("-h") | Some("--help") | None => {
            println!("usage: cargo xtask <ci | bench [--quick]>");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}` (try `cargo xtask --help`)"),
    }
}

fn ci() -> Result<()> {
    run("cargo", &["fmt", "--all", "--", "--check"], &[])?;
    run("cargo", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"], &[])?;
    let skips = Path::new("target/tmp/int4-test-skips.txt");
    let _ = std::fs::remove_file(skips);
    run("cargo", &["test", "--workspace"], &[])?;
    // The kernel suite again with the ISA capped at portable, so dispatch itself is exercised on the
    // fallback (each test also runs every variant directly).
    run("cargo", &["test", "-p", "int4-kernels"], &[("INT4_ISA", "portable")])?;
    report_skips(skips)?;
    bench(true)?;
    println!("xtask ci: all checks passed");
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

/// The benchmarks: the kernel table (W4A16 and dense kernels beside the machine's measured bandwidth and
/// FMA ceilings), written to `target/bench/kernels.json` as well as printed.
fn bench(quick: bool) -> Result<()> {
    let mut args = vec!["run", "--release", "-p", "int4-benches", "--bin", "kernel-table", "--"];
    if quick {
        args.push("--quick");
    }
    args.extend(["--json", "target/bench/kernels.json"]);
    run("cargo", &args, &[])
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
