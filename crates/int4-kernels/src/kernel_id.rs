//! Names for the kernels, so a model can report which one ran each layer in each phase, and a plan can
//! record which one it expects.

use std::fmt;

use crate::isa::IsaLevel;

/// One kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// W4A16 decode GEMV over the tinygemm layout, AVX2 + FMA.
    W4a16DecodeAvx2,
    /// W4A16 decode GEMV over the tinygemm layout, AVX-512 F/BW/VL, f32 FMA (up to four lane groups per pass).
    W4a16DecodeAvx512,
    /// W4A16 decode GEMV, AVX512-BF16: codes made bf16 `128 + q` in two ops, `vdpbf16ps` against bf16
    /// activations, a whole 64-channel block per pass (other blocks as [`KernelId::W4a16DecodeAvx512`]).
    W4a16DecodeAvx512Bf16,
    /// W4A16 decode, portable Rust over the tinygemm layout.
    W4a16DecodePortable,
    /// W4A16 prefill: dequantize straight from the tinygemm layout to bf16 panels, f32-FMA GEMM, AVX2.
    W4a16PrefillDirectAvx2,
    /// W4A16 prefill from the split-halves planes (`direct_dequant: false`), AVX2.
    W4a16PrefillHalvesAvx2,
    /// W4A16 prefill: dequantize straight from the tinygemm layout to f32 panels, 512-bit f32-FMA GEMM (two
    /// lane groups per call; the same sums as [`KernelId::W4a16PrefillDirectAvx2`], so the same bits), for
    /// AVX-512 CPUs without AVX512-BF16.
    W4a16PrefillDirectAvx512,
    /// W4A16 prefill from the split-halves planes (`direct_dequant: false`), 512-bit f32-FMA GEMM.
    W4a16PrefillHalvesAvx512,
    /// W4A16 prefill: dequantize straight from the tinygemm layout, round to bf16 pairs, `vdpbf16ps` GEMM.
    W4a16PrefillDirectAvx512Bf16,
    /// W4A16 prefill from the split-halves planes (`direct_dequant: false`), `vdpbf16ps` GEMM.
    W4a16PrefillHalvesAvx512Bf16,
    /// W4A16 prefill, portable Rust.
    W4a16PrefillPortable,
    /// W4A16 prefill: dequantize straight from the tinygemm layout to bf16 B tiles, AMX `tdpbf16ps`.
    W4a16PrefillAmxBf16,
    /// The wna16 fallback: portable Rust over row-major codes.
    Wna16Portable,
    /// Unquantized bf16 weights, GEMV, AVX2.
    DenseBf16GemvAvx2,
    /// Unquantized bf16 weights, GEMM, AVX2.
    DenseBf16GemmAvx2,
    /// Unquantized f32 weights, GEMV, AVX2.
    DenseF32GemvAvx2,
    /// Unquantized f32 weights, GEMM, AVX2.
    DenseF32GemmAvx2,
    /// Unquantized weights, portable Rust.
    DensePortable,
    /// W4A8 (int8 activations), portable Rust.
    W4a8Portable,
    /// W4A8, AVX2 `vpmaddubsw`.
    W4a8Avx2,
    /// W4A8, AVX-512 VNNI `vpdpbusd`.
    W4a8Vnni,
    /// W4A8, AMX tiles (`tdpbsud`; `tdpbssd` where the zero point is implicit).
    W4a8Amx,
    /// W8A16 (int8 codes, f32 activations) decode GEMV, portable Rust (`f32::mul_add` on sixteen lanes).
    W8a16DecodePortable,
    /// W8A16 decode GEMV, AVX2 + FMA (the sixteen lanes as two 8-wide registers).
    W8a16DecodeAvx2,
    /// W8A16 decode GEMV, AVX-512 (the sixteen lanes as one register).
    W8a16DecodeAvx512,
    /// W8A16 prefill (a tile of activation rows per pass over each weight row), portable Rust.
    W8a16PrefillPortable,
    /// W8A16 prefill, AVX2 + FMA.
    W8a16PrefillAvx2,
    /// W8A16 prefill, AVX-512.
    W8a16PrefillAvx512,
}

impl KernelId {
    /// Every kernel.
    pub const ALL: [KernelId; 28] = [
        KernelId::W4a16DecodeAvx2,
        KernelId::W4a16DecodeAvx512,
        KernelId::W4a16DecodeAvx512Bf16,
        KernelId::W4a16DecodePortable,
        KernelId::W4a16PrefillDirectAvx2,
        KernelId::W4a16PrefillHalvesAvx2,
        KernelId::W4a16PrefillDirectAvx512,
        KernelId::W4a16PrefillHalvesAvx512,
        KernelId::W4a16PrefillDirectAvx512Bf16,
        KernelId::W4a16PrefillHalvesAvx512Bf16,
        KernelId::W4a16PrefillPortable,
        KernelId::W4a16PrefillAmxBf16,
        KernelId::Wna16Portable,
        KernelId::DenseBf16GemvAvx2,
        KernelId::DenseBf16GemmAvx2,
        KernelId::DenseF32GemvAvx2,
        KernelId::DenseF32GemmAvx2,
        KernelId::DensePortable,
        KernelId::W4a8Portable,
        KernelId::W4a8Avx2,
        KernelId::W4a8Vnni,
        KernelId::W4a8Amx,
        KernelId::W8a16DecodePortable,
        KernelId::W8a16DecodeAvx2,
        KernelId::W8a16DecodeAvx512,
        KernelId::W8a16PrefillPortable,
        KernelId::W8a16PrefillAvx2,
        KernelId::W8a16PrefillAvx512,
    ];

    /// The kernel called `name` ([`KernelId::name`]).
    pub fn from_name(name: &str) -> Option<KernelId> {
        KernelId::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The ISA level whose features the kernel needs.
    pub fn level(self) -> IsaLevel {
        match self.needs() {
            "" => IsaLevel::Portable,
            _ => match self {
                KernelId::W4a16DecodeAvx2
                | KernelId::W4a16PrefillDirectAvx2
                | KernelId::W4a16PrefillHalvesAvx2
                | KernelId::DenseBf16GemvAvx2
                | KernelId::DenseBf16GemmAvx2
                | KernelId::DenseF32GemvAvx2
                | KernelId::DenseF32GemmAvx2
                | KernelId::W4a8Avx2
                | KernelId::W8a16DecodeAvx2
                | KernelId::W8a16PrefillAvx2 => IsaLevel::Avx2,
                KernelId::W4a16PrefillAmxBf16 | KernelId::W4a8Amx => IsaLevel::Amx,
                _ => IsaLevel::Avx512,
            },
        }
    }

    /// What the kernel needs of the CPU and the process (empty for the portable kernels): its capability
    /// token's checks, in words.
    pub fn needs(self) -> &'static str {
        match self {
            KernelId::W4a16DecodePortable
            | KernelId::W4a16PrefillPortable
            | KernelId::Wna16Portable
            | KernelId::DensePortable
            | KernelId::W4a8Portable
            | KernelId::W8a16DecodePortable
            | KernelId::W8a16PrefillPortable => "",
            KernelId::W4a16DecodeAvx2
            | KernelId::W4a16PrefillDirectAvx2
            | KernelId::W4a16PrefillHalvesAvx2
            | KernelId::DenseBf16GemvAvx2
            | KernelId::DenseBf16GemmAvx2
            | KernelId::DenseF32GemvAvx2
            | KernelId::DenseF32GemmAvx2
            | KernelId::W4a8Avx2
            | KernelId::W8a16DecodeAvx2
            | KernelId::W8a16PrefillAvx2 => "AVX2 and FMA (absent on this CPU, or capped by INT4_ISA/INT4_DISABLE)",
            KernelId::W4a16DecodeAvx512
            | KernelId::W4a16PrefillDirectAvx512
            | KernelId::W4a16PrefillHalvesAvx512
            | KernelId::W8a16DecodeAvx512
            | KernelId::W8a16PrefillAvx512 => {
                "AVX-512 F/BW/VL, AVX2 and FMA (absent on this CPU, or capped by INT4_ISA/INT4_DISABLE)"
            }
            KernelId::W4a16DecodeAvx512Bf16
            | KernelId::W4a16PrefillDirectAvx512Bf16
            | KernelId::W4a16PrefillHalvesAvx512Bf16 => {
                "AVX-512 F/BW/VL with AVX512-BF16, AVX2 and FMA (absent on this CPU, or capped by INT4_ISA/INT4_DISABLE)"
            }
            KernelId::W4a8Vnni => "AVX-512 F/BW/VL with VNNI (absent on this CPU, or capped by INT4_ISA/INT4_DISABLE)",
            KernelId::W4a8Amx => {
                "AMX-INT8 usable in this process (CPUID AMX-TILE/AMX-INT8, XCR0 tile state, Linux's tile permission) and AVX-512 VNNI"
            }
            KernelId::W4a16PrefillAmxBf16 => {
                "AMX-BF16 usable in this process (CPUID AMX-TILE/AMX-BF16, XCR0 tile state, Linux's tile permission) and AVX2 + FMA"
            }
        }
    }

    /// A stable, short name (used in reports, benchmark output, plans and artifact keys).
    pub fn name(self) -> &'static str {
        match self {
            KernelId::W4a16DecodeAvx2 => "w4a16-decode-avx2",
            KernelId::W4a16DecodeAvx512 => "w4a16-decode-avx512",
            KernelId::W4a16DecodeAvx512Bf16 => "w4a16-decode-avx512bf16",
            KernelId::W4a16DecodePortable => "w4a16-decode-portable",
            KernelId::W4a16PrefillDirectAvx2 => "w4a16-prefill-direct-avx2",
            KernelId::W4a16PrefillHalvesAvx2 => "w4a16-prefill-halves-avx2",
            KernelId::W4a16PrefillDirectAvx512 => "w4a16-prefill-direct-avx512",
            KernelId::W4a16PrefillHalvesAvx512 => "w4a16-prefill-halves-avx512",
            KernelId::W4a16PrefillDirectAvx512Bf16 => "w4a16-prefill-direct-avx512bf16",
            KernelId::W4a16PrefillHalvesAvx512Bf16 => "w4a16-prefill-halves-avx512bf16",
            KernelId::W4a16PrefillPortable => "w4a16-prefill-portable",
            KernelId::W4a16PrefillAmxBf16 => "w4a16-prefill-amx-bf16",
            KernelId::Wna16Portable => "wna16-portable",
            KernelId::DenseBf16GemvAvx2 => "dense-bf16-gemv-avx2",
            KernelId::DenseBf16GemmAvx2 => "dense-bf16-gemm-avx2",
            KernelId::DenseF32GemvAvx2 => "dense-f32-gemv-avx2",
            KernelId::DenseF32GemmAvx2 => "dense-f32-gemm-avx2",
            KernelId::DensePortable => "dense-portable",
            KernelId::W4a8Portable => "w4a8-portable",
            KernelId::W4a8Avx2 => "w4a8-avx2",
            KernelId::W4a8Vnni => "w4a8-vnni",
            KernelId::W4a8Amx => "w4a8-amx",
            KernelId::W8a16DecodePortable => "w8a16-decode-portable",
            KernelId::W8a16DecodeAvx2 => "w8a16-decode-avx2",
            KernelId::W8a16DecodeAvx512 => "w8a16-decode-avx512",
            KernelId::W8a16PrefillPortable => "w8a16-prefill-portable",
            KernelId::W8a16PrefillAvx2 => "w8a16-prefill-avx2",
            KernelId::W8a16PrefillAvx512 => "w8a16-prefill-avx512",
        }
    }
}

impl fmt::Display for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Serialised as its [`KernelId::name`], so a plan recorded in an artifact key reads as it prints.
impl serde::Serialize for KernelId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for KernelId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        KernelId::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown kernel {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        for k in KernelId::ALL {
            assert_eq!(KernelId::from_name(k.name()), Some(k));
            assert_eq!(k.needs().is_empty(), k.level() == IsaLevel::Portable, "{k}");
        }
        let mut names: Vec<&str> = KernelId::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KernelId::ALL.len());
    }
}
