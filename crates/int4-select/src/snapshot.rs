//! The probe's result: a plain-data snapshot of what the CPU and OS offer, which the policy reads.
//!
//! It records three layers separately, because each can say no on its own: what CPUID reports
//! ([`CpuFeatures`]), what the OS has enabled in XCR0 ([`OsSupport`]), and whether Linux granted this
//! process the AMX tile state ([`AmxPermission`]). [`CpuSnapshot::usable`] combines them. A snapshot can
//! be serialised, edited and loaded back (`INT4_CPU_PROFILE`), which changes the policy's decisions and
//! nothing else: kernels are still built only through tokens that check the live CPU.

use serde::{Deserialize, Serialize};

/// Features as CPUID reports them (before asking whether the OS enabled their state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuFeatures {
    /// SSE4.2.
    pub sse42: bool,
    /// AVX.
    pub avx: bool,
    /// AVX2.
    pub avx2: bool,
    /// FMA3.
    pub fma: bool,
    /// F16C.
    pub f16c: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 Byte/Word.
    pub avx512bw: bool,
    /// AVX-512 Vector Length.
    pub avx512vl: bool,
    /// AVX-512 VNNI (`vpdpbusd`).
    pub avx512vnni: bool,
    /// AVX-512 BF16 (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// AVX-VNNI (VEX-encoded `vpdpbusd`).
    pub avx_vnni: bool,
    /// AMX tiles.
    pub amx_tile: bool,
    /// AMX int8 (`tdpbusd`).
    pub amx_int8: bool,
    /// AMX bf16 (`tdpbf16ps`).
    pub amx_bf16: bool,
    /// OSXSAVE: the OS uses XSAVE, so XCR0 can be read.
    pub osxsave: bool,
}

/// What the OS has enabled, from XCR0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsSupport {
    /// The raw XCR0, if it could be read (OSXSAVE set).
    pub xcr0: Option<u64>,
    /// SSE and AVX (YMM) state enabled: bits 1 and 2.
    pub avx_state: bool,
    /// AVX-512 state enabled: opmask, ZMM_Hi256 and Hi16_ZMM, bits 5, 6 and 7 (plus the AVX state).
    pub avx512_state: bool,
    /// AMX state enabled: TILECFG and TILEDATA, bits 17 and 18.
    pub amx_state: bool,
}

impl OsSupport {
    /// Decodes XCR0.
    pub fn from_xcr0(xcr0: Option<u64>) -> Self {
        let bits = |mask: u64| xcr0.is_some_and(|x| x & mask == mask);
        OsSupport {
            xcr0,
            avx_state: bits(0b110),
            avx512_state: bits(0b1110_0110),
            amx_state: bits((1 << 17) | (1 << 18)),
        }
    }
}

/// Whether this process may use the AMX tile data state (Linux's `arch_prctl` permission).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "detail", rename_all = "snake_case")]
pub enum AmxPermission {
    /// Granted (`ARCH_GET_XCOMP_PERM` shows XTILEDATA).
    Granted,
    /// Not asked for, and why (the CPU or OS lacks AMX, so there is nothing to ask).
    NotApplicable(String),
    /// Asked for and refused, with the step and errno.
    Refused(String),
}

/// AMX palette-1 tile limits (CPUID leaves 0x1D and 0x1E).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileLimits {
    /// Tile registers.
    pub max_names: u16,
    /// Bytes per tile row.
    pub bytes_per_row: u16,
    /// Rows per tile.
    pub max_rows: u16,
    /// TMUL's largest K (rows of B).
    pub tmul_max_k: u8,
    /// TMUL's largest N (bytes per row of B).
    pub tmul_max_n: u16,
}

/// Cache sizes in bytes (per instance), as CPUID describes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caches {
    /// L1 data cache.
    pub l1d: Option<u64>,
    /// L2.
    pub l2: Option<u64>,
    /// L3.
    pub l3: Option<u64>,
}

/// Everything the policy needs to know about a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSnapshot {
    /// Where this came from: `live`, `fixture:<name>` or `override:<path>`.
    pub source: String,
    /// `x86_64`, `aarch64`, ...
    pub arch: String,
    /// CPUID vendor string.
    pub vendor: String,
    /// CPUID brand string.
    pub model_name: String,
    /// Family, model, stepping (display values).
    pub family_model_stepping: (u32, u32, u32),
    /// Logical processors available to this process (`None` for a recorded CPU).
    pub logical_cores: Option<usize>,
    /// Physical cores, where known.
    pub physical_cores: Option<usize>,
    /// Cache sizes.
    pub caches: Caches,
    /// CPUID features.
    pub cpu: CpuFeatures,
    /// OS-enabled state.
    pub os: OsSupport,
    /// The AMX permission outcome.
    pub amx_permission: AmxPermission,
    /// Tile limits, when the CPU has AMX.
    pub tile_limits: Option<TileLimits>,
}

/// Features that are present, enabled by the OS and (for AMX) permitted: what code may actually use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usable {
    /// AVX2 + FMA with AVX state enabled.
    pub avx2_fma: bool,
    /// AVX-512 F/BW/VL with AVX-512 state enabled.
    pub avx512: bool,
    /// AVX-512 BF16, usable.
    pub avx512bf16: bool,
    /// AVX-512 VNNI, usable.
    pub avx512vnni: bool,
    /// AMX tiles with int8, enabled and permitted.
    pub amx_int8: bool,
    /// AMX tiles with bf16, enabled and permitted.
    pub amx_bf16: bool,
}

impl CpuSnapshot {
    /// What the kernels may use on this CPU, as the kernel choice takes it
    /// ([`int4_kernels::choice::choose`]): [`CpuSnapshot::usable`] as a feature set.
    pub fn features(&self) -> int4_kernels::isa::FeatureSet {
        use int4_kernels::isa::{Feature, FeatureSet};
        let u = self.usable();
        let mut f = FeatureSet::NONE;
        for (on, feature) in [
            (u.avx2_fma, Feature::Avx2),
            (u.avx2_fma, Feature::Fma),
            (u.avx512, Feature::Avx512),
            (u.avx512bf16, Feature::Avx512Bf16),
            (u.avx512vnni, Feature::Avx512Vnni),
            (u.amx_int8, Feature::AmxInt8),
            (u.amx_bf16, Feature::AmxBf16),
        ] {
            if on {
                f = f.with(feature);
            }
        }
        f
    }

    /// Combines CPUID, XCR0 and the AMX permission.
    pub fn usable(&self) -> Usable {
        let c = &self.cpu;
        let os = &self.os;
        let x86 = self.arch == "x86_64";
        let avx2_fma = x86 && c.avx2 && c.fma && os.avx_state;
        let avx512 = avx2_fma && c.avx512f && c.avx512bw && c.avx512vl && os.avx512_state;
        let amx = avx512 && c.amx_tile && os.amx_state && self.amx_permission == AmxPermission::Granted;
        Usable {
            avx2_fma,
            avx512,
            avx512bf16: avx512 && c.avx512bf16,
            avx512vnni: avx512 && c.avx512vnni,
            amx_int8: amx && c.amx_int8,
            amx_bf16: amx && c.amx_bf16,
        }
    }
}
