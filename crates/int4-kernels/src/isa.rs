//! Which instruction sets this process may use, and the capability tokens that prove it.
//!
//! Two questions are kept apart:
//!
//! * **What does the live CPU support?** Answered once by `is_x86_feature_detected!` (which checks CPUID
//!   and the OS's XCR0 state), never by a configuration file. A capability token such as [`Avx2Fma`] can
//!   only be constructed when the live CPU has its features, so holding one is the proof that calling its
//!   `#[target_feature]` functions cannot raise SIGILL.
//! * **What may this process use?** The live set minus any cap: `INT4_ISA=portable|avx2|avx512|amx` caps
//!   the level, and `INT4_DISABLE=fma,avx512bf16,…` removes single features, so tests and users can run every
//!   variant below the machine's best. [`IsaCaps`] holds that cap; tokens consult it too, so a capped
//!   process never builds a token above its cap. A cap can only remove features, never add one.
//!
//! The environment is read once per process ([`IsaCaps::from_env`] is cached by [`IsaCaps::process`]);
//! tests that need other caps build an [`IsaCaps`] directly and pass it to the token constructors.

use std::sync::OnceLock;

/// ISA levels, in increasing order. A level includes everything below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IsaLevel {
    /// No SIMD intrinsics: the portable Rust paths only.
    Portable,
    /// AVX2 with FMA.
    Avx2,
    /// AVX-512 F/BW/VL (and BF16/VNNI where present).
    Avx512,
    /// AVX-512 plus AMX tiles.
    Amx,
}

impl IsaLevel {
    /// Parses `portable`, `avx2`, `avx512` or `amx`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" => Some(IsaLevel::Portable),
            "avx2" => Some(IsaLevel::Avx2),
            "avx512" => Some(IsaLevel::Avx512),
            "amx" => Some(IsaLevel::Amx),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            IsaLevel::Portable => "portable",
            IsaLevel::Avx2 => "avx2",
            IsaLevel::Avx512 => "avx512",
            IsaLevel::Amx => "amx",
        }
    }
}

/// Single features that `INT4_DISABLE` can remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feature {
    /// AVX2.
    Avx2,
    /// FMA3.
    Fma,
    /// AVX-512 F/BW/VL (as one unit: the kernels need all three).
    Avx512,
    /// AVX512-BF16 (`vdpbf16ps`).
    Avx512Bf16,
    /// AVX512-VNNI (`vpdpbusd`).
    Avx512Vnni,
    /// AVX512-VBMI (`vpermb`).
    Avx512Vbmi,
    /// AMX-TILE with AMX-INT8 (`tdpbsud`), with the OS's tile state and Linux's permission.
    AmxInt8,
    /// AMX-TILE with AMX-BF16 (`tdpbf16ps`), with the OS's tile state and Linux's permission.
    AmxBf16,
}

impl Feature {
    /// Every feature, for listings.
    pub const ALL: [Feature; 8] = [
        Feature::Avx2,
        Feature::Fma,
        Feature::Avx512,
        Feature::Avx512Bf16,
        Feature::Avx512Vnni,
        Feature::Avx512Vbmi,
        Feature::AmxInt8,
        Feature::AmxBf16,
    ];

    /// The name `INT4_DISABLE` uses.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Avx2 => "avx2",
            Feature::Fma => "fma",
            Feature::Avx512 => "avx512",
            Feature::Avx512Bf16 => "avx512bf16",
            Feature::Avx512Vnni => "avx512vnni",
            Feature::Avx512Vbmi => "avx512vbmi",
            Feature::AmxInt8 => "amx",
            Feature::AmxBf16 => "amxbf16",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Feature::ALL.into_iter().find(|f| f.name() == s.trim().to_ascii_lowercase())
    }

    /// The ISA level the feature belongs to (what `INT4_ISA` caps it by).
    pub fn level(self) -> IsaLevel {
        match self {
            Feature::Avx2 | Feature::Fma => IsaLevel::Avx2,
            Feature::AmxInt8 | Feature::AmxBf16 => IsaLevel::Amx,
            _ => IsaLevel::Avx512,
        }
    }

    /// Whether the live CPU (and OS) supports the feature.
    pub fn detected(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Feature::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
                Feature::Fma => std::arch::is_x86_feature_detected!("fma"),
                Feature::Avx512 => {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                }
                Feature::Avx512Bf16 => std::arch::is_x86_feature_detected!("avx512bf16"),
                Feature::Avx512Vnni => std::arch::is_x86_feature_detected!("avx512vnni"),
                Feature::Avx512Vbmi => std::arch::is_x86_feature_detected!("avx512vbmi"),
                Feature::AmxInt8 => crate::x86_64::amx_probe::amx_int8_usable(),
                Feature::AmxBf16 => crate::x86_64::amx_probe::amx_bf16_usable(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// A set of CPU features: what a kernel choice is made from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FeatureSet(u16);

impl FeatureSet {
    /// No feature: the portable kernels only.
    pub const NONE: FeatureSet = FeatureSet(0);

    /// Every feature [`Feature`] names.
    pub fn all() -> Self {
        Feature::ALL.into_iter().fold(FeatureSet::NONE, FeatureSet::with)
    }

    /// The features of the live CPU that `caps` allows: what this process may run.
    pub fn live(caps: &IsaCaps) -> Self {
        Feature::ALL.into_iter().filter(|&f| caps.usable(f)).fold(FeatureSet::NONE, FeatureSet::with)
    }

    /// The set with `feature` added.
    pub fn with(self, feature: Feature) -> Self {
        FeatureSet(self.0 | 1 << feature as u16)
    }

    /// The set with `feature` removed.
    pub fn without(self, feature: Feature) -> Self {
        FeatureSet(self.0 & !(1 << feature as u16))
    }

    /// Whether `feature` is in the set.
    pub fn has(self, feature: Feature) -> bool {
        self.0 & 1 << feature as u16 != 0
    }

    /// The features of this set at or below `level` (the set as `INT4_ISA=<level>` would leave it).
    pub fn capped(self, level: IsaLevel) -> Self {
        Feature::ALL.into_iter().filter(|f| self.has(*f) && f.level() <= level).fold(FeatureSet::NONE, FeatureSet::with)
    }

    /// The features of this set that `caps` allows (regardless of any CPU).
    pub fn allowed_by(self, caps: &IsaCaps) -> Self {
        Feature::ALL.into_iter().filter(|&f| self.has(f) && caps.allows(f)).fold(FeatureSet::NONE, FeatureSet::with)
    }

    pub(crate) fn avx2_fma(self) -> bool {
        self.has(Feature::Avx2) && self.has(Feature::Fma)
    }

    pub(crate) fn avx512(self) -> bool {
        self.avx2_fma() && self.has(Feature::Avx512)
    }
}

/// A cap on what this process may use: a maximum level and a set of disabled features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IsaCaps {
    max_level: IsaLevel,
    disabled: FeatureSet,
}

/// A bad `INT4_ISA` or `INT4_DISABLE` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapsError {
    variable: &'static str,
    value: String,
}

impl std::fmt::Display for CapsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.variable {
            "INT4_ISA" => write!(f, "INT4_ISA={:?} is not one of portable, avx2, avx512, amx", self.value),
            _ => write!(
                f,
                "INT4_DISABLE names {:?}, which is not one of {}",
                self.value,
                Feature::ALL.map(Feature::name).join(", ")
            ),
        }
    }
}

impl std::error::Error for CapsError {}

impl Default for IsaCaps {
    fn default() -> Self {
        IsaCaps::unrestricted()
    }
}

impl IsaCaps {
    /// No cap: everything the CPU has.
    pub fn unrestricted() -> Self {
        IsaCaps { max_level: IsaLevel::Amx, disabled: FeatureSet::NONE }
    }

    /// Caps the level.
    pub fn with_max_level(mut self, level: IsaLevel) -> Self {
        self.max_level = level;
        self
    }

    /// Removes one feature.
    pub fn without(mut self, feature: Feature) -> Self {
        self.disabled = self.disabled.with(feature);
        self
    }

    /// The highest level allowed.
    pub fn max_level(&self) -> IsaLevel {
        self.max_level
    }

    /// The features removed one by one (`INT4_DISABLE`).
    pub fn disabled(&self) -> FeatureSet {
        self.disabled
    }

    /// Reads `INT4_ISA` and `INT4_DISABLE` (comma-separated).
    pub fn from_env() -> Result<Self, CapsError> {
        Self::parse(std::env::var("INT4_ISA").ok().as_deref(), std::env::var("INT4_DISABLE").ok().as_deref())
    }

    /// Parses the two variables' values (`None` when unset).
    pub fn parse(isa: Option<&str>, disable: Option<&str>) -> Result<Self, CapsError> {
        let mut caps = IsaCaps::unrestricted();
        if let Some(v) = isa.filter(|v| !v.trim().is_empty()) {
            caps.max_level =
                IsaLevel::parse(v).ok_or_else(|| CapsError { variable: "INT4_ISA", value: v.to_string() })?;
        }
        for item in disable.unwrap_or("").split(',').filter(|s| !s.trim().is_empty()) {
            let f =
                Feature::parse(item).ok_or_else(|| CapsError { variable: "INT4_DISABLE", value: item.to_string() })?;
            caps = caps.without(f);
        }
        Ok(caps)
    }

    /// The process-wide caps, read from the environment once. A malformed variable is reported on stderr
    /// once and treated as the strictest cap (portable), so a typo can only make things slower, never wrong.
    pub fn process() -> &'static IsaCaps {
        static CAPS: OnceLock<IsaCaps> = OnceLock::new();
        CAPS.get_or_init(|| {
            IsaCaps::from_env().unwrap_or_else(|e| {
                eprintln!("int4: {e}; using the portable kernels only");
                IsaCaps::unrestricted().with_max_level(IsaLevel::Portable)
            })
        })
    }

    /// Whether the cap allows `feature` (regardless of the CPU).
    pub fn allows(&self, feature: Feature) -> bool {
        feature.level() <= self.max_level && !self.disabled.has(feature)
    }

    /// Whether `feature` is both allowed and present on the live CPU.
    pub fn usable(&self, feature: Feature) -> bool {
        self.allows(feature) && feature.detected()
    }

    /// The highest level whose W4A16 kernels this process can run (given what this crate implements).
    pub fn effective_level(&self) -> IsaLevel {
        if Avx512::with_caps(self).is_some() {
            IsaLevel::Avx512
        } else if Avx2Fma::with_caps(self).is_some() {
            IsaLevel::Avx2
        } else {
            IsaLevel::Portable
        }
    }
}

/// Proof that the live CPU supports AVX2 and FMA and that the caps allow both.
///
/// The only way to get one is [`Avx2Fma::new`] (or [`Avx2Fma::with_caps`]), which checks the live CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx2Fma {
    _private: (),
}

impl Avx2Fma {
    /// The token, if the live CPU has AVX2 and FMA and the process caps allow them.
    pub fn new() -> Option<Self> {
        Self::with_caps(IsaCaps::process())
    }

    /// The token, if the live CPU has AVX2 and FMA and `caps` allows them.
    pub fn with_caps(caps: &IsaCaps) -> Option<Self> {
        (caps.usable(Feature::Avx2) && caps.usable(Feature::Fma)).then_some(Avx2Fma { _private: () })
    }
}

/// Proof that the live CPU supports AVX-512 F/BW/VL (with AVX2 and FMA) and that the caps allow them: the
/// W4A16 AVX-512 decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512 {
    avx2: Avx2Fma,
}

impl Avx512 {
    /// The token, if the live CPU has AVX-512 F/BW/VL, AVX2 and FMA and the process caps allow them.
    pub fn new() -> Option<Self> {
        Self::with_caps(IsaCaps::process())
    }

    /// The token, if the live CPU has AVX-512 F/BW/VL, AVX2 and FMA and `caps` allows them.
    pub fn with_caps(caps: &IsaCaps) -> Option<Self> {
        let avx2 = Avx2Fma::with_caps(caps)?;
        caps.usable(Feature::Avx512).then_some(Avx512 { avx2 })
    }

    /// The AVX2 + FMA token every AVX-512 host has.
    pub fn avx2(self) -> Avx2Fma {
        self.avx2
    }
}

/// Proof that the live CPU supports AVX-512 F/BW/VL with AVX512-BF16 (`vdpbf16ps`, `vcvtne2ps2bf16`) and
/// that the caps allow them: the bf16 GEMM of the W4A16 prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512Bf16 {
    avx512: Avx512,
    /// Whether the CPU also has AVX512-VBMI and the caps allow it (see [`Avx512Bf16::vbmi`]).
    vbmi: bool,
}

impl Avx512Bf16 {
    /// The token, if the live CPU has AVX-512 F/BW/VL and BF16 (with AVX2 and FMA) and the process caps
    /// allow them.
    pub fn new() -> Option<Self> {
        Self::with_caps(IsaCaps::process())
    }

    /// The token, if the live CPU has AVX-512 F/BW/VL and BF16 (with AVX2 and FMA) and `caps` allows them.
    pub fn with_caps(caps: &IsaCaps) -> Option<Self> {
        let avx512 = Avx512::with_caps(caps)?;
        let vbmi = caps.usable(Feature::Avx512Vbmi);
        caps.usable(Feature::Avx512Bf16).then_some(Avx512Bf16 { avx512, vbmi })
    }

    /// The AVX-512 token it implies.
    pub fn avx512(self) -> Avx512 {
        self.avx512
    }

    /// The token for AVX512-VBMI beside BF16, if the CPU has it and the caps that made this token allow it.
    pub fn vbmi(self) -> Option<Avx512Bf16Vbmi> {
        self.vbmi.then_some(Avx512Bf16Vbmi { bf16: self })
    }
}

/// Proof that the live CPU supports AVX-512 F/BW/VL with AVX512-BF16 and AVX512-VBMI (`vpermb`), and that
/// the caps allow them: the `vdpbf16ps` decode then pairs its codes with one byte permute per 64 weights.
/// Made only by [`Avx512Bf16::vbmi`]. (Cooper Lake has BF16 without VBMI; Zen 4 and Sapphire Rapids have
/// both.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512Bf16Vbmi {
    bf16: Avx512Bf16,
}

impl Avx512Bf16Vbmi {
    /// The BF16 token it implies.
    pub fn bf16(self) -> Avx512Bf16 {
        self.bf16
    }
}

/// Proof that the live CPU supports AVX-512 F/BW/VL with VNNI (`vpdpbusd`) and that the caps allow them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx512Vnni {
    _private: (),
}

impl Avx512Vnni {
    /// The token, if the live CPU has AVX-512 F/BW/VL and VNNI and the process caps allow them.
    pub fn new() -> Option<Self> {
        Self::with_caps(IsaCaps::process())
    }

    /// The token, if the live CPU has AVX-512 F/BW/VL and VNNI and `caps` allows them.
    pub fn with_caps(caps: &IsaCaps) -> Option<Self> {
        (caps.usable(Feature::Avx512) && caps.usable(Feature::Avx512Vnni)).then_some(Avx512Vnni { _private: () })
    }
}

/// Proof that AMX-INT8 tiles can execute in this process: CPUID reports AMX-TILE and AMX-INT8, the OS
/// enabled the tile state in XCR0 (checked only after OSXSAVE), Linux granted this process the tile-data
/// permission, and AVX-512 VNNI is there for the kernel's small-M half. Checked on the live CPU, never
/// taken from a policy override or a CPU profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmxInt8 {
    vnni: Avx512Vnni,
}

impl AmxInt8 {
    /// The token, if AMX-INT8 is usable in this process and the process caps allow it.
    pub fn new() -> Option<Self> {
        Self::with_caps(IsaCaps::process())
    }

    /// The token, if AMX-INT8 is usable in this process and `caps` allows it.
    pub fn with_caps(caps: &IsaCaps) -> Option<Self> {
        let vnni = Avx512Vnni::with_caps(caps)?;
        caps.usable(Feature::AmxInt8).then_some(AmxInt8 { vnni })
    }

    /// The VNNI token every AMX host has (the tiles do not help a single row).
    pub fn vnni(self) -> Avx512Vnni {
        self.vnni
    }
}

/// Proof that AMX-BF16 tiles (`tdpbf16ps`) can execute in this process, checked on the live CPU as for
/// [`AmxInt8`] (CPUID AMX-TILE and AMX-BF16, XCR0 tile state after OSXSAVE, tile limits, Linux's
/// permission), and that AVX2 + FMA are there for the decode and the dequantization beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmxBf16 {
    avx2: Avx2Fma,
}

impl AmxBf16 {
    /// The token, if AMX-BF16 is usable in this process and the process caps allow it.
    pub fn new() -> Option<Self> {
        Self::with_caps(IsaCaps::process())
    }

    /// The token, if AMX-BF16 is usable in this process and `caps` allows it.
    pub fn with_caps(caps: &IsaCaps) -> Option<Self> {
        let avx2 = Avx2Fma::with_caps(caps)?;
        caps.usable(Feature::AmxBf16).then_some(AmxBf16 { avx2 })
    }

    /// The AVX2 + FMA token every AMX host has.
    pub fn avx2(self) -> Avx2Fma {
        self.avx2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_and_reject_typos() {
        let c = IsaCaps::parse(Some("avx2"), Some("avx512bf16, fma")).unwrap();
        assert!(c.allows(Feature::Avx2));
        assert!(!c.allows(Feature::Fma));
        assert!(!c.allows(Feature::Avx512));
        assert!(!c.allows(Feature::Avx512Bf16));
        assert!(IsaCaps::parse(Some("avx3"), None).is_err());
        let e = IsaCaps::parse(None, Some("avx512bf61")).unwrap_err();
        assert!(e.to_string().contains("avx512bf61"));
        assert_eq!(IsaCaps::parse(None, Some("")).unwrap(), IsaCaps::unrestricted());
    }

    #[test]
    fn a_cap_never_adds_a_feature_the_cpu_lacks() {
        let all = IsaCaps::unrestricted();
        for f in Feature::ALL {
            assert_eq!(all.usable(f), f.detected());
        }
        let portable = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
        assert!(Avx2Fma::with_caps(&portable).is_none());
        assert_eq!(portable.effective_level(), IsaLevel::Portable);
        assert!(Avx2Fma::with_caps(&IsaCaps::unrestricted().without(Feature::Fma)).is_none());
    }
}
