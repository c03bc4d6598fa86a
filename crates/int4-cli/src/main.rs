//! The `int4` command-line tool.
//!
//! A thin layer over the `int4` library. It has no model commands yet (`generate`, `chat`, `probe`,
//! `quantize`, `info` and `cache` come with the runtime); today it only reports its version.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("int4 {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        None | Some("--help") | Some("-h") => {
            println!("int4 {}: 4-bit-weight LLM inference on x86 CPUs", env!("CARGO_PKG_VERSION"));
            println!();
            println!("usage: int4 [--version | --help]");
            println!();
            println!("The model commands arrive with the runtime; see README.md.");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("int4: unknown command `{other}` (try `int4 --help`)");
            ExitCode::from(2)
        }
    }
}
