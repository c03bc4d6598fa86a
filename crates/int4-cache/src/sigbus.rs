//! A mapped file truncated by another program: the SIGBUS of the next read past its new end, reported as
//! what it is instead of a bare "Bus error".
//!
//! Every mapping the store makes, and every checkpoint file the runtime maps, is registered here (its
//! address range and a message naming its file) for as long as it lives. The first registration installs a `SIGBUS` handler. When a read faults inside
//! a registered range, the handler writes that message to stderr and ends the process with
//! [`EXIT_ARTIFACT_CHANGED`]: the weights it was reading are gone, and no result computed from them may be
//! printed. A fault anywhere else goes to the handler that was installed before (Rust's own, which
//! restores the default action), so the process dies of the signal as it would have.
//!
//! The handler only loads atomics, calls `write(2)` and `_exit(2)`, all async-signal-safe, and only for a
//! fault the kernel raised (`si_code` > 0: a `kill` carries no address). Messages are built when a mapping
//! is registered and never freed (a few hundred bytes per registered load), so the handler cannot read
//! freed memory however a mapping's drop races it. Only whole pages past a new end fault: the rest of a
//! partly cut page reads as zeros, which is why modifying a mapped file in place is unsupported.

use std::ffi::c_void;
use std::path::Path;
use std::ptr;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// The exit status of a process whose mapped file was truncated underneath it (`EX_IOERR`).
pub const EXIT_ARTIFACT_CHANGED: i32 = 74;

/// At most this many mappings are registered at once; a mapping beyond them is unregistered, and a fault
/// in it ends the process with the plain signal.
const SLOTS: usize = 256;

struct Slot {
    in_use: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    message: AtomicPtr<u8>,
    message_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // each array element is its own slot
const EMPTY: Slot = Slot {
    in_use: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    message: AtomicPtr::new(ptr::null_mut()),
    message_len: AtomicUsize::new(0),
};

static REGISTRY: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
/// The `SIGBUS` disposition before ours (leaked, set once before the handler is installed).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(ptr::null_mut());

/// A registered mapping; dropping it unregisters the range (declare it before the mapping it guards, so
/// it is dropped first).
#[derive(Debug)]
pub struct MappingGuard {
    slot: Option<usize>,
}

impl MappingGuard {
    /// Registers `map`, the mapping of a cached artifact at `path`.
    pub(crate) fn register(map: &[u8], path: &Path) -> MappingGuard {
        Self::register_file(
            map,
            &format!("the cached artifact {}", path.display()),
            "artifacts are never modified in place; `int4 cache verify` checks the cache, and the next load \
             rebuilds what is damaged",
        )
    }

    /// Registers `map`, the mapping of `what` (the file, in words); `hint` says what to do about it.
    pub fn register_file(map: &[u8], what: &str, hint: &str) -> MappingGuard {
        if map.is_empty() {
            return MappingGuard { slot: None };
        }
        INSTALL.call_once(install);
        let start = map.as_ptr() as usize;
        for (i, slot) in REGISTRY.iter().enumerate() {
            if slot.in_use.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                // Built (and leaked) only once a slot is held.
                let message = format!(
                    "int4: {what} was truncated while this process had it mapped (another program changed \
                     it): stopping. {hint}.\n"
                )
                .into_bytes()
                .leak();
                slot.message.store(message.as_mut_ptr(), Ordering::Release);
                slot.message_len.store(message.len(), Ordering::Release);
                slot.end.store(start + map.len(), Ordering::Release);
                slot.start.store(start, Ordering::Release);
                return MappingGuard { slot: Some(i) };
            }
        }
        MappingGuard { slot: None }
    }
}

impl Drop for MappingGuard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let slot = &REGISTRY[i];
            slot.start.store(0, Ordering::Release);
            slot.end.store(0, Ordering::Release);
            slot.in_use.store(false, Ordering::Release);
        }
    }
}

fn install() {
    // SAFETY: `sigaction` structs are plain data, valid when zeroed; `sigemptyset` initialises the mask we
    // pass; the handler is an `extern "C"` function of the SA_SIGINFO signature. The previous disposition
    // is stored (leaked) before ours is installed, so the handler always finds it.
    unsafe {
        let previous: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_sigbus as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        if libc::sigaction(libc::SIGBUS, ptr::null(), previous) != 0 {
            return;
        }
        PREVIOUS.store(previous, Ordering::Release);
        libc::sigaction(libc::SIGBUS, &ours, ptr::null_mut());
    }
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler; for a fault it raised
    // (`si_code` > 0) `si_addr` is the faulting address.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    for slot in REGISTRY.iter().filter(|_| code > 0) {
        let start = slot.start.load(Ordering::Acquire);
        let end = slot.end.load(Ordering::Acquire);
        if start != 0 && (start..end).contains(&addr) {
            let message = slot.message.load(Ordering::Acquire);
            let len = slot.message_len.load(Ordering::Acquire);
            // SAFETY: `message` points at `len` bytes that are never freed (module docs); write(2) and
            // _exit(2) are async-signal-safe.
            unsafe {
                libc::write(2, message as *const c_void, len);
                libc::_exit(EXIT_ARTIFACT_CHANGED);
            }
        }
    }
    let previous = PREVIOUS.load(Ordering::Acquire);
    // SAFETY: `previous` is null or the leaked disposition `install` read; calling its handler with the
    // arguments we were given is what the kernel would have done without us. With no handler to call, the
    // default disposition is restored: the faulting access repeats on return and the signal ends the
    // process as it would have.
    unsafe {
        if let Some(p) = previous.as_ref() {
            let handler = p.sa_sigaction;
            if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(handler);
                    f(signal, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                    f(signal);
                }
                return;
            }
        }
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}
