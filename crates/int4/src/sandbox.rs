//! Running a model's chat template — a Turing-complete program its author wrote — with a budget of time
//! and memory.
//!
//! minijinja bounds neither: a template that doubles a string forty times asks for a terabyte in forty
//! steps, and nested loops never end. So on Linux the render runs in a forked child process with
//! `RLIMIT_AS` set to what it has plus [`Budget::memory`], stderr pointed at `/dev/null`, and a deadline:
//! the parent reads the rendered text from a pipe (at most the memory budget of it) and kills the child at
//! the deadline. A child that runs out of memory dies of its failed allocation; either way the parent
//! reports which budget ran out and the template never touches the parent's memory or time. The child
//! runs only the render — no other thread exists in it — and leaves with `_exit`, so nothing of the
//! parent's state (buffers, locks, destructors) runs twice. It cannot outlive the parent or the budget on
//! its own either: it asks to be killed when the parent dies (`PR_SET_PDEATHSIG`) and carries a CPU-time
//! limit; it keeps no descriptor of the parent's but its end of the pipe.
//!
//! Elsewhere the render runs in process, unbounded (documented in `docs/bad-inputs.md`).

use std::time::Duration;

/// What a render may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// Bytes of address space beyond what the process already has.
    pub memory: u64,
    /// Wall-clock time.
    pub time: Duration,
}

/// How a bounded run ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It finished, with these bytes.
    Done(Vec<u8>),
    /// It finished without a result (the caller re-runs it in process for the error itself, which is
    /// deterministic and was just shown to fit the budget).
    Failed,
    /// It panicked (not re-run: the panic would recur in the caller's process).
    Panicked,
    /// It needed more memory than the budget.
    OutOfMemory,
    /// It ran past the deadline.
    OutOfTime,
}

/// The tags the child writes after its output.
const TAG_FAILED: u8 = 0;
const TAG_DONE: u8 = 1;
const TAG_PANICKED: u8 = 2;

/// Runs `work` under `budget`; its output travels back as bytes.
#[cfg(target_os = "linux")]
pub(crate) fn run_bounded(budget: Budget, work: impl FnOnce() -> Option<Vec<u8>>) -> std::io::Result<Outcome> {
    use std::io::Read;
    use std::os::fd::FromRawFd;

    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork has no preconditions; the child below only runs `child` and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: both descriptors were just created by pipe2 and are closed once.
        unsafe {
            libc::close(read_fd);
            libc::close(write_fd);
        }
        return Err(e);
    }
    if pid == 0 {
        // SAFETY: the child closes its copy of the read end, then runs the work and never returns.
        unsafe { libc::close(read_fd) };
        child(write_fd, parent, budget, work);
    }
    // SAFETY: the parent owns the read end from here (closed when `reader` drops) and closes its copy of
    // the write end, so the read sees end-of-file when the child exits.
    let mut reader = unsafe {
        libc::close(write_fd);
        std::fs::File::from_raw_fd(read_fd)
    };
    let deadline = std::time::Instant::now() + budget.time;
    let mut out = Vec::new();
    let mut timed_out = false;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd { fd: read_fd, events: libc::POLLIN, revents: 0 };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            kill_and_reap(pid);
            return Err(e);
        }
        if ready == 0 {
            timed_out = true;
            break;
        }
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if (out.len() + n) as u64 <= budget.memory + 1 => out.extend_from_slice(&buf[..n]),
            Ok(_) => {
                kill_and_reap(pid);
                return Ok(Outcome::OutOfMemory);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                kill_and_reap(pid);
                return Err(e);
            }
        }
    }
    if timed_out {
        kill_and_reap(pid);
        return Ok(Outcome::OutOfTime);
    }
    let status = reap(pid);
    // The child writes a tag byte last, after all its output: a complete message is one whose tag arrived
    // with a clean exit, or with no exit status to see (SIGCHLD ignored by whoever started us reaps the
    // child itself).
    match (status, out.pop()) {
        (Some(0) | None, Some(TAG_DONE)) => Ok(Outcome::Done(out)),
        (Some(0) | None, Some(TAG_FAILED)) => Ok(Outcome::Failed),
        (Some(0) | None, Some(TAG_PANICKED)) => Ok(Outcome::Panicked),
        // The child could not set its limits: nothing ran.
        (Some(3), _) => Err(std::io::Error::other("the render's child process could not limit its memory")),
        // Killed by its failed allocation (an abort) or by its CPU-time limit, or any other death before
        // its tag: out of its budget.
        _ => Ok(Outcome::OutOfMemory),
    }
}

/// The child's side: tie its life to the parent's, cap its address space and CPU time, keep only its end of
/// the pipe (standard streams to `/dev/null`), run `work`, send its result, leave.
#[cfg(target_os = "linux")]
fn child(write_fd: libc::c_int, parent: libc::pid_t, budget: Budget, work: impl FnOnce() -> Option<Vec<u8>>) -> ! {
    // Only this thread exists in the child. It reads its own address-space size, sets its own limit and
    // descriptors, runs the work (which allocates through the allocator, which glibc's fork left usable),
    // writes to the pipe and ends with `_exit`, running no destructor or exit handler of the parent's state.
    // SAFETY: each call below takes valid arguments (a NUL-terminated path, descriptors this process owns, a
    // valid `rlimit`), and `_exit` never returns, so nothing after the work runs twice.
    unsafe {
        // Killed when the parent dies; and if it already has, gone at once.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(5);
        }
        let devnull = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if devnull >= 0 {
            libc::dup2(devnull, 0);
            libc::dup2(devnull, 1);
            libc::dup2(devnull, 2);
        }
        // The pipe's write end at descriptor 3, and nothing else the parent had open (another render's
        // pipe held here would keep that render from seeing its end of output).
        const OUT: libc::c_int = 3;
        if write_fd != OUT {
            libc::dup2(write_fd, OUT);
        }
        libc::syscall(libc::SYS_close_range, (OUT + 1) as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint);
        let write_fd = OUT;
        let cpu = budget.time.as_secs() + 1;
        libc::setrlimit(libc::RLIMIT_CPU, &libc::rlimit { rlim_cur: cpu, rlim_max: cpu + 1 });
        // The soft limit: what the child has plus the budget, never above the hard limit it inherited.
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        let hard = if libc::getrlimit(libc::RLIMIT_AS, &mut limit) == 0 { limit.rlim_max } else { libc::RLIM_INFINITY };
        let now = address_space_bytes().unwrap_or(0);
        let soft = now.saturating_add(budget.memory).min(hard);
        let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        if now == 0 || libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
            libc::_exit(3);
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let (bytes, tag) = match &result {
            Ok(Some(b)) => (b.as_slice(), TAG_DONE),
            Ok(None) => (&[][..], TAG_FAILED),
            Err(_) => (&[][..], TAG_PANICKED),
        };
        let ok = write_all(write_fd, bytes) && write_all(write_fd, &[tag]);
        libc::_exit(if ok { 0 } else { 4 });
    }
}

#[cfg(target_os = "linux")]
fn write_all(fd: libc::c_int, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for its length; `fd` is the child's write end.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// The process's address-space size (`VmSize`), in bytes.
#[cfg(target_os = "linux")]
fn address_space_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status.lines().find(|l| l.starts_with("VmSize:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Waits for the child; its exit code, `None` if a signal ended it.
#[cfg(target_os = "linux")]
fn reap(pid: libc::pid_t) -> Option<i32> {
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child, not yet reaped; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return None;
        }
    }
    libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
}

#[cfg(target_os = "linux")]
fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: `pid` is our child, not yet reaped, so the signal cannot reach another process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    reap(pid);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    const BUDGET: Budget = Budget { memory: 64 << 20, time: Duration::from_secs(2) };

    #[test]
    fn results_failures_and_both_budgets() {
        let ok = run_bounded(BUDGET, || Some(b"rendered".to_vec())).unwrap();
        assert!(matches!(ok, Outcome::Done(b) if b == b"rendered"));
        assert!(matches!(run_bounded(BUDGET, || None).unwrap(), Outcome::Failed));
        assert!(matches!(run_bounded(BUDGET, || panic!("in the child")).unwrap(), Outcome::Panicked));
        let doubling = || {
            let mut s = String::from("x");
            for _ in 0..60 {
                s = format!("{s}{s}");
            }
            Some(s.into_bytes())
        };
        assert!(matches!(run_bounded(BUDGET, doubling).unwrap(), Outcome::OutOfMemory));
        let t = std::time::Instant::now();
        let endless = || loop {
            std::hint::black_box(0);
        };
        assert!(matches!(run_bounded(BUDGET, endless).unwrap(), Outcome::OutOfTime));
        assert!(t.elapsed() < Duration::from_secs(4));
    }
}
