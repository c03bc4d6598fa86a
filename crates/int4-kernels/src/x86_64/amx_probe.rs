//! Whether the AMX tile instructions can execute in this process: the CPU's tile features and limits,
//! the OS's XCR0 state and Linux's permission for the tile data (both read through [`crate::os`]).
//!
//! A leaf module, apart from the tile unit ([`crate::x86_64::amx`]) that needs the tokens built from it:
//! [`crate::isa`] asks it when a token is requested, and the unit asks [`crate::isa`] for the tokens.

/// Whether AMX-INT8 can execute in this process, checked once on the live CPU and cached:
///
/// * CPUID.(EAX=7,ECX=0):EDX reports AMX-TILE (bit 24) and AMX-INT8 (bit 25);
/// * CPUID.1:ECX.OSXSAVE, and only then XCR0, shows the OS enabled XTILECFG and XTILEDATA (bits 17, 18);
/// * CPUID leaf 0x1D palette 1 offers 8 tiles of 16 rows × 64 bytes, and leaf 0x1E a TMUL of K ≥ 16 rows
///   and N ≥ 64 bytes;
/// * Linux granted `ARCH_REQ_XCOMP_PERM` for XTILEDATA (requested here, once per process).
pub fn amx_int8_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| probe(25))
}

/// As [`amx_int8_usable`], for AMX-BF16 (CPUID.(EAX=7,ECX=0):EDX bit 22) instead of AMX-INT8.
pub fn amx_bf16_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| probe(22))
}

/// The checks of [`amx_int8_usable`], with the dot-product feature at `dot_bit` of CPUID leaf 7's EDX.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn probe(dot_bit: u32) -> bool {
    use std::arch::x86_64::__cpuid_count;
    let max_leaf = __cpuid_count(0, 0).eax;
    if max_leaf < 0x1E {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (tile, dot) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> dot_bit & 1 == 1);
    let osxsave = __cpuid_count(1, 0).ecx >> 27 & 1 == 1;
    if !(tile && dot && osxsave) {
        return false;
    }
    let Some(xcr0) = crate::os::xcr0() else { return false };
    if xcr0 & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    let palette1 = __cpuid_count(0x1D, 1);
    let (names, bytes_per_row, max_rows) = (palette1.ebx >> 16, palette1.ebx & 0xFFFF, palette1.ecx & 0xFFFF);
    let tmul = __cpuid_count(0x1E, 0);
    let (tmul_k, tmul_n) = (tmul.ebx & 0xFF, (tmul.ebx >> 8) & 0xFFFF);
    if names < 8 || bytes_per_row < 64 || max_rows < 16 || tmul_k < 16 || tmul_n < 64 {
        return false;
    }
    crate::os::arch_prctl_request(crate::os::XFEATURE_XTILEDATA).is_ok()
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn probe(_dot_bit: u32) -> bool {
    false
}
