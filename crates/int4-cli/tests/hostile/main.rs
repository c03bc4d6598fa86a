//! The hostile-input suite: the `int4` binary against a few hundred inputs and scenarios built to break
//! it — hostile safetensors, configs, quantized tensors, tokenizers and templates, a tampered artifact
//! cache, FIFOs and devices where files belong, bad flags and environment variables, standard input
//! without end and standard output that goes away.
//!
//! Each case runs the binary once, bounded (15 s for a release binary, 8 GiB of address space), and is
//! classified: ok, clean error, panic, death by signal, hang, or wrong output (standard output compared
//! with an uncached or otherwise independent run). The suite passes when every case meets its expectation
//! — in particular no panic, no signal, no hang and no wrong output — and prints the table and the counts.

mod cases;
mod files;
mod harness;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cases::Expect;
use harness::{Class, Outcome};

fn scratch() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What the case's outcome is, judged against its expectation; `Err` says what was wrong.
fn judge(outcome: &Outcome, expect: &Expect, reference: Option<&Outcome>) -> (Class, Result<(), String>) {
    let class = outcome.class();
    if matches!(class, Class::Panic | Class::Signal | Class::Hang) {
        return (class, Err(format!("{class:?}")));
    }
    let stderr_has = |words: &str| outcome.stderr.contains(words);
    let verdict = match expect {
        Expect::Error(w) => {
            if outcome.code == Some(1) && stderr_has(w) {
                Ok(())
            } else {
                Err(format!("expected exit 1 with {w:?}"))
            }
        }
        Expect::Usage(w) => {
            if outcome.code == Some(2) && stderr_has(w) {
                Ok(())
            } else {
                Err(format!("expected a usage error (exit 2) with {w:?}"))
            }
        }
        Expect::Exit(code, w) => {
            if outcome.code == Some(*code) && (stderr_has(w) || outcome.stdout_text().contains(w)) {
                Ok(())
            } else {
                Err(format!("expected exit {code} with {w:?}"))
            }
        }
        Expect::Ok => {
            if class == Class::Ok {
                Ok(())
            } else {
                Err("expected success".into())
            }
        }
        Expect::OkWarning(w) => {
            if class == Class::Ok && stderr_has(w) {
                Ok(())
            } else {
                Err(format!("expected success with {w:?} on stderr"))
            }
        }
        Expect::SameAs(_) => {
            let r = reference.expect("a SameAs case has a reference run");
            if r.class() != Class::Ok {
                Err(format!("the reference run failed: {}", first_line(&r.stderr)))
            } else if class != Class::Ok {
                Err("expected success".into())
            } else if outcome.stdout != r.stdout {
                return (
                    Class::WrongOutput,
                    Err(format!(
                        "output {:?} differs from the reference's {:?}",
                        outcome.stdout_text(),
                        r.stdout_text()
                    )),
                );
            } else {
                Ok(())
            }
        }
    };
    match verdict {
        Ok(()) => (class, Ok(())),
        Err(e) => (Class::UnexpectedResult, Err(e)),
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().rev().find(|l| !l.trim().is_empty() && !l.starts_with("[int4] load")).unwrap_or("");
    line.chars().take(160).collect()
}

#[test]
fn hostile_inputs_never_panic_hang_crash_or_answer_wrong() {
    let bin = Path::new(env!("CARGO_BIN_EXE_int4"));
    let root = scratch();
    let cache = root.join("cache");
    let tiny = files::tiny(&root);
    let started = std::time::Instant::now();
    let cases = cases::all(&root, &tiny, &cache, bin);
    let built = started.elapsed();
    let mut counts: BTreeMap<Class, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut report = String::new();
    for c in &cases {
        if let Some(p) = &c.prepare {
            p();
        }
        let outcome = harness::run(bin, &root, &cache, &c.inv);
        let reference = match &c.expect {
            Expect::SameAs(r) => Some(harness::run(bin, &root, &cache, r)),
            _ => None,
        };
        if let Some(cl) = &c.cleanup {
            cl();
        }
        let (class, verdict) = judge(&outcome, &c.expect, reference.as_ref());
        *counts.entry(class).or_default() += 1;
        report.push_str(&format!(
            "{:<58} {:<16} exit {:<5} {:>6.2} s  {}\n",
            c.name,
            format!("{class:?}"),
            outcome.code.map_or_else(|| format!("sig{}", outcome.signal.unwrap_or(0)), |c| c.to_string()),
            outcome.wall.as_secs_f64(),
            first_line(&outcome.stderr)
        ));
        if let Err(why) = verdict {
            failures.push(format!("{}: {why}\n    stderr: {}", c.name, first_line(&outcome.stderr)));
        }
    }
    let total = started.elapsed();
    eprintln!("{report}");
    eprintln!(
        "hostile inputs: {} cases in {:.1} s (inputs built in {:.1} s): {}",
        cases.len(),
        total.as_secs_f64(),
        built.as_secs_f64(),
        counts.iter().map(|(k, v)| format!("{k:?} {v}")).collect::<Vec<_>>().join(", ")
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    for bad in [Class::Panic, Class::Signal, Class::Hang, Class::WrongOutput] {
        assert_eq!(counts.get(&bad), None, "{bad:?}");
    }
    let _ = std::fs::remove_dir_all(&root);
}
