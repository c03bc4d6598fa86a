//! Running one case of the hostile-input suite: the release-like `int4` binary, bounded in time (15 s) and
//! address space (8 GiB), its outcome classified.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a case may run before it counts as a hang: 15 s against a release binary; an unoptimised one
/// (`cargo test` without `--release`) parses a large tokenizer several times slower, so it gets 40 s. A
/// hang never ends, so the bound only sets how long the suite waits to call one; it must sit well above
/// what a case with real work takes on the slowest CPU the suite runs on: a million-entry vocabulary loads
/// in about 3 s alone on a two-core Zen 2, and the suite runs other work beside it.
pub const TIMEOUT: Duration = Duration::from_secs(if cfg!(debug_assertions) { 40 } else { 15 });
/// Address space each case may take: a runaway allocation fails instead of taking the machine.
const ADDRESS_SPACE: u64 = 8 << 30;

/// One invocation of `int4`.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    /// Standard output goes to this file (`/dev/full`) instead of a pipe.
    pub stdout_to: Option<PathBuf>,
    /// Close standard output's pipe after this many bytes (a reader such as `head -c N`).
    pub close_stdout_after: Option<usize>,
    /// Standard input written in two parts, with something done between them (after `wait`).
    pub live: Option<Live>,
}

/// Input fed to a running command in two parts, `hook` run in between.
#[derive(Clone)]
pub struct Live {
    pub first: Vec<u8>,
    pub wait: Duration,
    pub hook: std::sync::Arc<dyn Fn() + Send + Sync>,
    pub then: Vec<u8>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("wait", &self.wait).finish_non_exhaustive()
    }
}

impl Invocation {
    pub fn new<S: AsRef<str>>(args: &[S]) -> Self {
        Invocation { args: args.iter().map(|a| a.as_ref().to_string()).collect(), ..Default::default() }
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(bytes.into());
        self
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub wall: Duration,
}

/// The class of an outcome, as the suite reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    Ok,
    CleanError,
    Panic,
    Signal,
    Hang,
    WrongOutput,
    UnexpectedResult,
}

impl Outcome {
    pub fn class(&self) -> Class {
        if self.timed_out {
            Class::Hang
        } else if self.stderr.contains("panicked at") || self.code == Some(101) {
            Class::Panic
        } else if self.signal.is_some() {
            Class::Signal
        } else if self.code == Some(0) {
            Class::Ok
        } else {
            Class::CleanError
        }
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Runs `inv` with the given binary, in `cwd`, under the suite's bounds.
pub fn run(bin: &Path, cwd: &Path, cache: &Path, inv: &Invocation) -> Outcome {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut cmd = Command::new(bin);
    cmd.args(&inv.args).current_dir(cwd).env("INT4_CACHE_DIR", cache).env("RUST_BACKTRACE", "0");
    for (k, v) in &inv.env {
        cmd.env(k, v);
    }
    cmd.stdin(if inv.stdin.is_some() || inv.live.is_some() { Stdio::piped() } else { Stdio::null() });
    match &inv.stdout_to {
        Some(p) => cmd.stdout(std::fs::OpenOptions::new().write(true).open(p).unwrap()),
        None => cmd.stdout(Stdio::piped()),
    };
    cmd.stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: ADDRESS_SPACE, rlim_max: ADDRESS_SPACE };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("the int4 binary starts");
    if let Some(bytes) = inv.stdin.clone() {
        let mut sin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = sin.write_all(&bytes);
        });
    }
    if let Some(live) = inv.live.clone() {
        let mut sin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = sin.write_all(&live.first);
            std::thread::sleep(live.wait);
            (live.hook)();
            let _ = sin.write_all(&live.then);
        });
    }
    let close_after = inv.close_stdout_after;
    let stdout = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match out.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        got.extend_from_slice(&buf[..n]);
                        if close_after.is_some_and(|c| got.len() >= c) {
                            break; // dropping `out` closes the pipe, as `head` does
                        }
                    }
                }
            }
            got
        })
    });
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > TIMEOUT {
            timed_out = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let wall = start.elapsed();
    Outcome {
        code: status.code(),
        signal: if timed_out { None } else { status.signal() },
        timed_out,
        stdout: stdout.map(|h| h.join().unwrap()).unwrap_or_default(),
        stderr: stderr.join().unwrap(),
        wall,
    }
}
