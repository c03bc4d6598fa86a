//! The probe's only unsafe code: reading XCR0 and asking Linux for AMX tile state.
//!
//! Both are x86-64 Linux facts that no safe API exposes. Each call is guarded so that it cannot fault:
//! `xgetbv` only after CPUID reports OSXSAVE (without it the instruction itself raises #UD), and
//! `arch_prctl` only on Linux, where an unknown request is an error return, never a signal.

/// XCR0 (the state components the OS has enabled), or `None` when the OS has not enabled XSAVE.
#[cfg(target_arch = "x86_64")]
pub(crate) fn xcr0(osxsave: bool) -> Option<u64> {
    if !osxsave {
        return None;
    }
    // SAFETY: CPUID.1:ECX.OSXSAVE is set (checked by the caller from the live CPUID), which is exactly the
    // condition under which XGETBV is a valid instruction; reading XCR0 (index 0) has no side effects.
    Some(unsafe { read_xcr0() })
}

/// # Safety
/// CPUID.1:ECX.OSXSAVE must be set on the running CPU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn read_xcr0() -> u64 {
    // SAFETY: the caller guarantees OSXSAVE, so XGETBV is defined; XCR0 (index 0) always exists then.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn xcr0(_osxsave: bool) -> Option<u64> {
    None
}

/// `ARCH_GET_XCOMP_SUPP`: the extended state components the kernel supports.
pub const ARCH_GET_XCOMP_SUPP: i32 = 0x1021;
/// `ARCH_GET_XCOMP_PERM`: the components this process is permitted to use.
pub const ARCH_GET_XCOMP_PERM: i32 = 0x1022;
/// `ARCH_REQ_XCOMP_PERM`: request permission for a component.
pub const ARCH_REQ_XCOMP_PERM: i32 = 0x1023;
/// The XTILEDATA state component (AMX tile registers).
pub const XFEATURE_XTILEDATA: u64 = 18;

/// `arch_prctl(code, &mut out)` for the GET requests; `Err(errno)` on failure.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn arch_prctl_get(code: i32) -> Result<u64, i32> {
    let mut out: u64 = 0;
    // SAFETY: the GET requests write one u64 through the pointer, which points at a live local; the
    // syscall has no other effect. An unsupported request returns -1 with errno set.
    let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, code as libc::c_long, &mut out as *mut u64) };
    if rc == 0 { Ok(out) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, feature)`; `Err(errno)` on failure.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn arch_prctl_request(feature: u64) -> Result<(), i32> {
    // SAFETY: ARCH_REQ_XCOMP_PERM takes the feature number by value and touches no user memory; failure is
    // an error return (for example ENOSUPP when a thread's signal stack is too small for the tile state).
    let rc =
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM as libc::c_long, feature as libc::c_ulong) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
}
