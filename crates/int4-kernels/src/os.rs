//! What the operating system grants this process: the extended states it enabled (XCR0) and Linux's
//! permission for the AMX tile data. The workspace's one reader of both, used by the capability tokens
//! ([`crate::isa`]) and by the hardware probe (`int4-select`).
//!
//! Both are x86-64 facts that no safe API exposes, so this module holds the crate's system-level unsafe
//! code, each call guarded so that it cannot fault: `xgetbv` only after CPUID reports OSXSAVE (without it
//! the instruction itself raises #UD), and `arch_prctl` only on Linux, where an unknown request is an
//! error return, never a signal.

/// `ARCH_GET_XCOMP_SUPP`: the extended state components the kernel supports.
pub const ARCH_GET_XCOMP_SUPP: i32 = 0x1021;
/// `ARCH_GET_XCOMP_PERM`: the components this process is permitted to use.
pub const ARCH_GET_XCOMP_PERM: i32 = 0x1022;
/// `ARCH_REQ_XCOMP_PERM`: request permission for a component.
pub const ARCH_REQ_XCOMP_PERM: i32 = 0x1023;
/// The XTILEDATA state component (AMX tile registers).
pub const XFEATURE_XTILEDATA: u64 = 18;

/// XCR0 of the running CPU (the state components the OS has enabled), or `None` when the OS has not
/// enabled XSAVE (CPUID.1:ECX.OSXSAVE clear) or this is not x86-64.
pub fn xcr0() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        let osxsave = std::arch::x86_64::__cpuid_count(1, 0).ecx >> 27 & 1 == 1;
        if !osxsave {
            return None;
        }
        // SAFETY: CPUID.1:ECX.OSXSAVE is set on the running CPU (read just above), which is exactly the
        // condition under which XGETBV is a valid instruction; reading XCR0 (index 0) has no side effects.
        Some(unsafe { read_xcr0() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// # Safety
/// CPUID.1:ECX.OSXSAVE must be set on the running CPU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn read_xcr0() -> u64 {
    // SAFETY: the caller guarantees OSXSAVE, so XGETBV is defined; XCR0 (index 0) always exists then.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// `arch_prctl(code, &mut out)` for the GET requests; `Err(errno)` on failure (and off x86-64 Linux,
/// `Err(ENOSYS)`).
pub fn arch_prctl_get(code: i32) -> Result<u64, i32> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let mut out: u64 = 0;
        // SAFETY: the GET requests write one u64 through the pointer, which points at a live local; the
        // syscall has no other effect. An unsupported request returns -1 with errno set.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, code as libc::c_long, &mut out as *mut u64) };
        if rc == 0 { Ok(out) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = code;
        Err(libc::ENOSYS)
    }
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, feature)`; `Err(errno)` on failure (and off x86-64 Linux,
/// `Err(ENOSYS)`).
pub fn arch_prctl_request(feature: u64) -> Result<(), i32> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // SAFETY: ARCH_REQ_XCOMP_PERM takes the feature number by value and touches no user memory; failure
        // is an error return (for example ENOSUPP when a thread's signal stack is too small for the tile
        // state).
        let rc = unsafe {
            libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM as libc::c_long, feature as libc::c_ulong)
        };
        if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = feature;
        Err(libc::ENOSYS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xcr0_agrees_with_the_standard_librarys_detection() {
        // The standard library consults XCR0 for AVX: AVX state (bits 1 and 2) enabled iff AVX detected.
        #[cfg(target_arch = "x86_64")]
        if let Some(x) = xcr0() {
            assert_eq!(x & 0b110 == 0b110, std::arch::is_x86_feature_detected!("avx"), "XCR0 {x:#x}");
        }
        // A request code Linux does not know is an error return, never a signal.
        assert!(arch_prctl_get(0x7fff_0000).is_err());
    }
}
