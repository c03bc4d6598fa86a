//! Every benchmark binary answers `--help` with its usage and refuses a flag it does not know (a usage
//! error, exit 2) before doing any work.

use std::process::Command;

const BINARIES: [(&str, &str); 8] = [
    ("kernel-table", env!("CARGO_BIN_EXE_kernel-table")),
    ("model-bench", env!("CARGO_BIN_EXE_model-bench")),
    ("sampling-bench", env!("CARGO_BIN_EXE_sampling-bench")),
    ("serve-bench", env!("CARGO_BIN_EXE_serve-bench")),
    ("load-bench", env!("CARGO_BIN_EXE_load-bench")),
    ("cache-load", env!("CARGO_BIN_EXE_cache-load")),
    ("fidelity", env!("CARGO_BIN_EXE_fidelity")),
    ("make-model", env!("CARGO_BIN_EXE_make-model")),
];

#[test]
fn every_bench_binary_has_help_and_refuses_unknown_flags() {
    for (name, bin) in BINARIES {
        let help = Command::new(bin).arg("--help").output().unwrap();
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success() && text.contains("Usage:"), "{name} --help: {text}");
        let bad = Command::new(bin).arg("--no-such-flag").output().unwrap();
        let err = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{name} --no-such-flag: {err}");
        assert!(err.contains("--no-such-flag"), "{name}: {err}");
    }
}
