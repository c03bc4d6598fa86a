//! Project automation, written in Rust so it runs wherever cargo does (`cargo xtask <task>`).
//!
//! * `cargo xtask ci` — everything CI checks, in order, failing on the first failure: formatting,
//!   clippy with warnings denied, every test in the workspace, then `cargo xtask bench --quick` so the
//!   README's main command is known to work.
//! * `cargo xtask bench [--quick]` — the benchmarks (today: the layout crate's repack and direct-dequant
//!   throughput at the project's real shapes). `--quick` shortens warm-up and measurement for smoke tests.

use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(rest.contains(&"--quick")),
        Some("-h") | Some("--help") | None => {
            println!("usage: cargo xtask <ci | bench [--quick]>");
            Ok(())
        }
        Some(other) => bail!("unknown task `{other}` (try `cargo xtask --help`)"),
    }
}

fn ci() -> Result<()> {
    run("cargo", &["fmt", "--all", "--", "--check"])?;
    run("cargo", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    run("cargo", &["test", "--workspace"])?;
    bench(true)?;
    println!("xtask ci: all checks passed");
    Ok(())
}

fn bench(quick: bool) -> Result<()> {
    let mut args = vec!["bench", "-p", "int4-benches", "--bench", "layout", "--"];
    if quick {
        args.extend(["--warm-up-time", "0.1", "--measurement-time", "0.3", "--sample-size", "10"]);
    }
    run("cargo", &args)
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = Command::new(program).args(args).status().with_context(|| format!("could not start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}
