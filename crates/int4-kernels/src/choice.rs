//! Which kernel a layer runs in each phase: chosen once, by one function, apart from proving it can run.
//!
//! Two steps, kept apart:
//!
//! * **Choice** ([`choose`]): a pure function from a set of CPU features ([`FeatureSet`]) and what the
//!   layer is ([`LayerSpec`]: its family, packed layout and prefill options) to a [`KernelChoice`] — a
//!   [`KernelId`] for decode, one for prefill, and the row count from which prefill runs. No tokens, no
//!   CPU access: the policy calls it with a recorded CPU's features to predict, and a layer calls it with
//!   the live CPU's (under the process caps) to decide. Both get the same answer for the same features,
//!   because there is only this function.
//! * **Binding** ([`KernelChoice::bind`]): one `match` that builds, for each phase, the capability token
//!   its instructions need, checked on the live CPU under the given [`IsaCaps`]. A choice the live CPU
//!   cannot honour (a recorded profile that promised more, a cap that took a feature away) is an error
//!   naming the kernel and what is missing — never a silent fallback, never SIGILL.
//!
//! A layer keeps its [`BoundKernels`] and dispatches on them with one `match` per phase, so the kernel it
//! reports for `m` rows ([`BoundKernels::for_rows`]) is by construction the one that runs.

use int4_layout::tinygemm::TinygemmBlock;

use crate::error::{KernelError, KernelErrorKind};
pub use crate::isa::FeatureSet;
use crate::isa::{AmxBf16, AmxInt8, Avx2Fma, Avx512, Avx512Bf16, Avx512Vnni, Feature, IsaCaps, IsaLevel};
use crate::kernel_id::KernelId;

/// The most rows a dense layer runs as a GEMV (more run the GEMM). The GEMV reads each weight row once for
/// all rows and converts bf16 in registers; the GEMM first widens the weights into f32 panels, which at a
/// few rows costs more than the products (docs/perf.md, "Dense layers: the GEMV up to 16 rows").
pub const DENSE_GEMV_MAX_ROWS: usize = 16;

/// W4A8 runs the AMX tiles from this many rows and AVX-512 VNNI below. Measured on an Emerald Rapids
/// (docs/perf.md, "AMX on hardware"; prompts of the default model's shape, three alternated rounds): at
/// 32 rows and group 32 the tiles ran at 0.73× VNNI on two threads (every round); from 64 rows, at groups
/// 32 and 128 on 2 and 16 threads, no loss showed beyond the noise (VNNI against itself: 0.89–1.34× per
/// round), and at 512 rows the tiles won every round (1.07–1.37×).
pub const W4A8_AMX_MIN_ROWS: usize = 64;

/// The rows from which a W8A16 layer runs its prefill kernel by default. The prefill's tiles of activation
/// rows load and convert each code once for the whole tile, where the decode GEMV repeats that work per
/// activation row: measured faster from two rows (N = 49152, K = 576, AVX-512, two threads: M = 2 in
/// 1.0 ms against 1.4, M = 3 1.05 against 1.75, M = 4 1.2 against 1.6; `decode_timing_beside_int8_linear`
/// in `tests/w8a16.rs`).
pub const W8A16_PREFILL_FROM_ROWS: usize = 2;

/// What a layer is, as far as the choice of its kernels goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerSpec {
    /// 4-bit weights in a tinygemm layout, 16-bit (or f32) activations.
    W4a16 {
        /// The layout's channel block: the `vdpbf16ps` decode reads whole 64-channel blocks.
        block: TinygemmBlock,
        /// The prefill dequantizes straight from the packed bytes (`true`) or reads split halves.
        direct_dequant: bool,
        /// Rows at or above which the prefill kernel runs (`dequant_threshold`).
        prefill_from: usize,
    },
    /// 4-bit (or two-plane 8-bit) weights, int8 activations.
    W4a8 {
        /// Rows at or above which the prefill kernel runs (at least [`W4A8_AMX_MIN_ROWS`] on AMX).
        prefill_from: usize,
    },
    /// int8 weight codes with an f32 scale per 32 inputs (GGUF Q8_0, Q5_0), f32 activations.
    W8a16 {
        /// Rows at or above which the prefill kernel runs ([`W8A16_PREFILL_FROM_ROWS`] by default).
        prefill_from: usize,
    },
    /// Unquantized weights.
    Dense {
        /// bf16 weights (`false`: f32).
        bf16: bool,
    },
    /// 4-bit row-major codes: the portable wna16 fallback (one kernel for every row count).
    Wna16 {
        /// The row count from which calls count as the prefill phase.
        prefill_from: usize,
    },
}

/// The kernel of each phase, without the tokens to run them: [`choose`]'s answer and a plan's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelChoice {
    /// The kernel for fewer than `prefill_from` rows.
    pub decode: KernelId,
    /// The kernel for `prefill_from` rows or more.
    pub prefill: KernelId,
    /// The row count from which `prefill` runs.
    pub prefill_from: usize,
}

impl KernelChoice {
    /// The kernel that runs `m` rows.
    pub fn for_rows(&self, m: usize) -> KernelId {
        if m < self.prefill_from { self.decode } else { self.prefill }
    }

    /// The highest ISA level either phase needs.
    pub fn level(&self) -> IsaLevel {
        self.decode.level().max(self.prefill.level())
    }

    /// Builds each phase's capability token on the live CPU under `caps`: the only place a choice becomes
    /// something that can execute. Fails, naming the kernel and what is missing, when a phase's features
    /// are absent from the CPU or taken away by `caps`.
    pub fn bind(&self, caps: &IsaCaps) -> Result<BoundKernels, KernelError> {
        Ok(BoundKernels { decode: bind(self.decode, caps)?, prefill: bind(self.prefill, caps)?, choice: *self })
    }
}

/// The kernels for a layer like `spec` on a CPU with `features`: the fastest this crate has for each
/// phase. The single author of the choice; see the module docs.
pub fn choose(features: FeatureSet, spec: LayerSpec) -> KernelChoice {
    let f = features;
    match spec {
        LayerSpec::W4a16 { block, direct_dequant, prefill_from } => {
            let decode = if f.avx512() {
                // The `vdpbf16ps` decode reads whole 64-channel blocks; the f32 AVX-512 decode runs the rest.
                if f.has(Feature::Avx512Bf16) && block == TinygemmBlock::N64 {
                    KernelId::W4a16DecodeAvx512Bf16
                } else {
                    KernelId::W4a16DecodeAvx512
                }
            } else if f.avx2_fma() {
                KernelId::W4a16DecodeAvx2
            } else {
                KernelId::W4a16DecodePortable
            };
            let prefill = if f.avx2_fma() && f.has(Feature::AmxBf16) && direct_dequant {
                KernelId::W4a16PrefillAmxBf16
            } else if f.avx512() && f.has(Feature::Avx512Bf16) {
                if direct_dequant {
                    KernelId::W4a16PrefillDirectAvx512Bf16
                } else {
                    KernelId::W4a16PrefillHalvesAvx512Bf16
                }
            } else if f.avx512() {
                // Without BF16: the f32 GEMM on 512-bit FMA (twice the 256-bit peak where the CPU has two
                // 512-bit units, as Xeons from Skylake-SP to Ice Lake do; no slower where it has one).
                if direct_dequant { KernelId::W4a16PrefillDirectAvx512 } else { KernelId::W4a16PrefillHalvesAvx512 }
            } else if f.avx2_fma() {
                if direct_dequant { KernelId::W4a16PrefillDirectAvx2 } else { KernelId::W4a16PrefillHalvesAvx2 }
            } else {
                KernelId::W4a16PrefillPortable
            };
            KernelChoice { decode, prefill, prefill_from }
        }
        LayerSpec::W4a8 { prefill_from } => {
            let vnni = f.avx512() && f.has(Feature::Avx512Vnni);
            if vnni && f.has(Feature::AmxInt8) {
                let prefill_from = prefill_from.max(W4A8_AMX_MIN_ROWS);
                KernelChoice { decode: KernelId::W4a8Vnni, prefill: KernelId::W4a8Amx, prefill_from }
            } else {
                let k = if vnni {
                    KernelId::W4a8Vnni
                } else if f.avx2_fma() {
                    KernelId::W4a8Avx2
                } else {
                    KernelId::W4a8Portable
                };
                KernelChoice { decode: k, prefill: k, prefill_from }
            }
        }
        LayerSpec::W8a16 { prefill_from } => {
            // Every variant computes the same bits (crate::w8a16), so the widest one the CPU has is taken.
            let (decode, prefill) = if f.avx512() {
                (KernelId::W8a16DecodeAvx512, KernelId::W8a16PrefillAvx512)
            } else if f.avx2_fma() {
                (KernelId::W8a16DecodeAvx2, KernelId::W8a16PrefillAvx2)
            } else {
                (KernelId::W8a16DecodePortable, KernelId::W8a16PrefillPortable)
            };
            KernelChoice { decode, prefill, prefill_from }
        }
        LayerSpec::Dense { bf16 } => {
            let prefill_from = DENSE_GEMV_MAX_ROWS + 1;
            let (decode, prefill) = match (f.avx2_fma(), bf16) {
                (false, _) => (KernelId::DensePortable, KernelId::DensePortable),
                (true, true) => (KernelId::DenseBf16GemvAvx2, KernelId::DenseBf16GemmAvx2),
                (true, false) => (KernelId::DenseF32GemvAvx2, KernelId::DenseF32GemmAvx2),
            };
            KernelChoice { decode, prefill, prefill_from }
        }
        LayerSpec::Wna16 { prefill_from } => {
            KernelChoice { decode: KernelId::Wna16Portable, prefill: KernelId::Wna16Portable, prefill_from }
        }
    }
}

/// A kernel with the capability token its instructions need: what layers dispatch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BoundKernel {
    W4a16DecodePortable,
    W4a16DecodeAvx2(Avx2Fma),
    W4a16DecodeAvx512(Avx512),
    W4a16DecodeAvx512Bf16(Avx512Bf16),
    W4a16PrefillPortable,
    W4a16PrefillDirectAvx2(Avx2Fma),
    W4a16PrefillHalvesAvx2(Avx2Fma),
    W4a16PrefillDirectAvx512(Avx512),
    W4a16PrefillHalvesAvx512(Avx512),
    W4a16PrefillDirectAvx512Bf16(Avx512Bf16),
    W4a16PrefillHalvesAvx512Bf16(Avx512Bf16),
    W4a16PrefillAmxBf16(AmxBf16),
    Wna16Portable,
    DensePortable,
    DenseBf16GemvAvx2(Avx2Fma),
    DenseBf16GemmAvx2(Avx2Fma),
    DenseF32GemvAvx2(Avx2Fma),
    DenseF32GemmAvx2(Avx2Fma),
    W4a8Portable,
    W4a8Avx2(Avx2Fma),
    W4a8Vnni(Avx512Vnni),
    W4a8Amx(AmxInt8),
    W8a16DecodePortable,
    W8a16DecodeAvx2(Avx2Fma),
    W8a16DecodeAvx512(Avx512),
    W8a16PrefillPortable,
    W8a16PrefillAvx2(Avx2Fma),
    W8a16PrefillAvx512(Avx512),
}

/// The one `match` from a kernel's name to the kernel with its token.
fn bind(id: KernelId, caps: &IsaCaps) -> Result<BoundKernel, KernelError> {
    let missing = || KernelError::new(KernelErrorKind::Unavailable { kernel: id, missing: id.needs() });
    let avx2 = || Avx2Fma::with_caps(caps).ok_or_else(missing);
    let avx512 = || Avx512::with_caps(caps).ok_or_else(missing);
    let bf16 = || Avx512Bf16::with_caps(caps).ok_or_else(missing);
    Ok(match id {
        KernelId::W4a16DecodePortable => BoundKernel::W4a16DecodePortable,
        KernelId::W4a16DecodeAvx2 => BoundKernel::W4a16DecodeAvx2(avx2()?),
        KernelId::W4a16DecodeAvx512 => BoundKernel::W4a16DecodeAvx512(avx512()?),
        KernelId::W4a16DecodeAvx512Bf16 => BoundKernel::W4a16DecodeAvx512Bf16(bf16()?),
        KernelId::W4a16PrefillPortable => BoundKernel::W4a16PrefillPortable,
        KernelId::W4a16PrefillDirectAvx2 => BoundKernel::W4a16PrefillDirectAvx2(avx2()?),
        KernelId::W4a16PrefillHalvesAvx2 => BoundKernel::W4a16PrefillHalvesAvx2(avx2()?),
        KernelId::W4a16PrefillDirectAvx512 => BoundKernel::W4a16PrefillDirectAvx512(avx512()?),
        KernelId::W4a16PrefillHalvesAvx512 => BoundKernel::W4a16PrefillHalvesAvx512(avx512()?),
        KernelId::W4a16PrefillDirectAvx512Bf16 => BoundKernel::W4a16PrefillDirectAvx512Bf16(bf16()?),
        KernelId::W4a16PrefillHalvesAvx512Bf16 => BoundKernel::W4a16PrefillHalvesAvx512Bf16(bf16()?),
        KernelId::W4a16PrefillAmxBf16 => {
            BoundKernel::W4a16PrefillAmxBf16(AmxBf16::with_caps(caps).ok_or_else(missing)?)
        }
        KernelId::Wna16Portable => BoundKernel::Wna16Portable,
        KernelId::DensePortable => BoundKernel::DensePortable,
        KernelId::DenseBf16GemvAvx2 => BoundKernel::DenseBf16GemvAvx2(avx2()?),
        KernelId::DenseBf16GemmAvx2 => BoundKernel::DenseBf16GemmAvx2(avx2()?),
        KernelId::DenseF32GemvAvx2 => BoundKernel::DenseF32GemvAvx2(avx2()?),
        KernelId::DenseF32GemmAvx2 => BoundKernel::DenseF32GemmAvx2(avx2()?),
        KernelId::W4a8Portable => BoundKernel::W4a8Portable,
        KernelId::W4a8Avx2 => BoundKernel::W4a8Avx2(avx2()?),
        KernelId::W4a8Vnni => BoundKernel::W4a8Vnni(Avx512Vnni::with_caps(caps).ok_or_else(missing)?),
        KernelId::W4a8Amx => BoundKernel::W4a8Amx(AmxInt8::with_caps(caps).ok_or_else(missing)?),
        KernelId::W8a16DecodePortable => BoundKernel::W8a16DecodePortable,
        KernelId::W8a16DecodeAvx2 => BoundKernel::W8a16DecodeAvx2(avx2()?),
        KernelId::W8a16DecodeAvx512 => BoundKernel::W8a16DecodeAvx512(avx512()?),
        KernelId::W8a16PrefillPortable => BoundKernel::W8a16PrefillPortable,
        KernelId::W8a16PrefillAvx2 => BoundKernel::W8a16PrefillAvx2(avx2()?),
        KernelId::W8a16PrefillAvx512 => BoundKernel::W8a16PrefillAvx512(avx512()?),
    })
}

impl BoundKernel {
    /// The kernel's name.
    pub(crate) fn id(self) -> KernelId {
        match self {
            BoundKernel::W4a16DecodePortable => KernelId::W4a16DecodePortable,
            BoundKernel::W4a16DecodeAvx2(_) => KernelId::W4a16DecodeAvx2,
            BoundKernel::W4a16DecodeAvx512(_) => KernelId::W4a16DecodeAvx512,
            BoundKernel::W4a16DecodeAvx512Bf16(_) => KernelId::W4a16DecodeAvx512Bf16,
            BoundKernel::W4a16PrefillPortable => KernelId::W4a16PrefillPortable,
            BoundKernel::W4a16PrefillDirectAvx2(_) => KernelId::W4a16PrefillDirectAvx2,
            BoundKernel::W4a16PrefillHalvesAvx2(_) => KernelId::W4a16PrefillHalvesAvx2,
            BoundKernel::W4a16PrefillDirectAvx512(_) => KernelId::W4a16PrefillDirectAvx512,
            BoundKernel::W4a16PrefillHalvesAvx512(_) => KernelId::W4a16PrefillHalvesAvx512,
            BoundKernel::W4a16PrefillDirectAvx512Bf16(_) => KernelId::W4a16PrefillDirectAvx512Bf16,
            BoundKernel::W4a16PrefillHalvesAvx512Bf16(_) => KernelId::W4a16PrefillHalvesAvx512Bf16,
            BoundKernel::W4a16PrefillAmxBf16(_) => KernelId::W4a16PrefillAmxBf16,
            BoundKernel::Wna16Portable => KernelId::Wna16Portable,
            BoundKernel::DensePortable => KernelId::DensePortable,
            BoundKernel::DenseBf16GemvAvx2(_) => KernelId::DenseBf16GemvAvx2,
            BoundKernel::DenseBf16GemmAvx2(_) => KernelId::DenseBf16GemmAvx2,
            BoundKernel::DenseF32GemvAvx2(_) => KernelId::DenseF32GemvAvx2,
            BoundKernel::DenseF32GemmAvx2(_) => KernelId::DenseF32GemmAvx2,
            BoundKernel::W4a8Portable => KernelId::W4a8Portable,
            BoundKernel::W4a8Avx2(_) => KernelId::W4a8Avx2,
            BoundKernel::W4a8Vnni(_) => KernelId::W4a8Vnni,
            BoundKernel::W4a8Amx(_) => KernelId::W4a8Amx,
            BoundKernel::W8a16DecodePortable => KernelId::W8a16DecodePortable,
            BoundKernel::W8a16DecodeAvx2(_) => KernelId::W8a16DecodeAvx2,
            BoundKernel::W8a16DecodeAvx512(_) => KernelId::W8a16DecodeAvx512,
            BoundKernel::W8a16PrefillPortable => KernelId::W8a16PrefillPortable,
            BoundKernel::W8a16PrefillAvx2(_) => KernelId::W8a16PrefillAvx2,
            BoundKernel::W8a16PrefillAvx512(_) => KernelId::W8a16PrefillAvx512,
        }
    }
}

/// A [`KernelChoice`] bound to the live CPU: each phase's kernel with its capability token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundKernels {
    decode: BoundKernel,
    prefill: BoundKernel,
    choice: KernelChoice,
}

impl BoundKernels {
    /// The choice these kernels were bound from.
    pub fn choice(&self) -> KernelChoice {
        self.choice
    }

    /// The kernel that runs `m` rows.
    pub fn for_rows(&self, m: usize) -> KernelId {
        self.choice.for_rows(m)
    }

    /// The bound kernel that runs `m` rows.
    pub(crate) fn bound_for_rows(&self, m: usize) -> BoundKernel {
        if m < self.choice.prefill_from { self.decode } else { self.prefill }
    }

    /// The decode phase's kernel, bound.
    pub(crate) fn decode(&self) -> BoundKernel {
        self.decode
    }

    /// The prefill phase's kernel, bound.
    pub(crate) fn prefill(&self) -> BoundKernel {
        self.prefill
    }

    /// Fails unless both phases are kernels of `family` (`what` names the layer type in the error).
    pub(crate) fn expect_family(&self, what: &'static str, family: fn(KernelId) -> bool) -> Result<(), KernelError> {
        for id in [self.choice.decode, self.choice.prefill] {
            if !family(id) {
                return Err(KernelError::new(KernelErrorKind::WrongFamily { kernel: id, layer: what }));
            }
        }
        Ok(())
    }
}

/// [`choose`] for `spec` on the live CPU under `caps`, bound: a layer's best kernels in this process.
pub fn best(spec: LayerSpec, caps: &IsaCaps) -> Result<BoundKernels, KernelError> {
    choose(FeatureSet::live(caps), spec).bind(caps)
}

/// The kernels of exactly `level` for `spec`: [`choose`] on the live CPU's features up to `level`, bound.
/// Fails, naming the kernel `level` would run, when the live CPU (or `caps`) lacks that level's features.
pub fn at_level(spec: LayerSpec, level: IsaLevel, caps: &IsaCaps) -> Result<BoundKernels, KernelError> {
    let live = choose(FeatureSet::live(caps).capped(level), spec);
    if live.level() < level && !matches!(spec, LayerSpec::Wna16 { .. }) {
        // What `level` would run on a CPU that had it: binding it names what is missing here.
        let ideal = choose(FeatureSet::all().capped(level), spec);
        ideal.bind(caps)?;
    }
    live.bind(caps)
}

/// The W8A16 kernels for the 8-bit layers of a W4A16 model whose 4-bit layers run `beside`: those of its
/// instruction-set level, or of the highest level the caps leave below it (AMX-BF16 needs only AVX2, so
/// with AVX-512 disabled an AMX plan's 8-bit layers run AVX2, as its decode does).
pub fn w8a16_beside(beside: &KernelChoice, caps: &IsaCaps) -> Result<BoundKernels, KernelError> {
    let spec = LayerSpec::W8a16 { prefill_from: W8A16_PREFILL_FROM_ROWS };
    at_level(spec, beside.level().min(caps.effective_level()), caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(features: &[Feature]) -> FeatureSet {
        features.iter().copied().fold(FeatureSet::NONE, FeatureSet::with)
    }

    const AVX2: &[Feature] = &[Feature::Avx2, Feature::Fma];
    const ZEN4: &[Feature] =
        &[Feature::Avx2, Feature::Fma, Feature::Avx512, Feature::Avx512Bf16, Feature::Avx512Vnni, Feature::Avx512Vbmi];
    const SKYLAKE: &[Feature] = &[Feature::Avx2, Feature::Fma, Feature::Avx512];

    fn w4a16(block: TinygemmBlock, direct_dequant: bool) -> LayerSpec {
        LayerSpec::W4a16 { block, direct_dequant, prefill_from: 16 }
    }

    #[test]
    fn w4a16_takes_the_fastest_kernel_each_cpu_class_has() {
        use KernelId::*;
        let cases: &[(&[Feature], TinygemmBlock, bool, KernelId, KernelId)] = &[
            (&[], TinygemmBlock::N32, true, W4a16DecodePortable, W4a16PrefillPortable),
            (AVX2, TinygemmBlock::N32, true, W4a16DecodeAvx2, W4a16PrefillDirectAvx2),
            (AVX2, TinygemmBlock::N32, false, W4a16DecodeAvx2, W4a16PrefillHalvesAvx2),
            (SKYLAKE, TinygemmBlock::N64, true, W4a16DecodeAvx512, W4a16PrefillDirectAvx512),
            (SKYLAKE, TinygemmBlock::N64, false, W4a16DecodeAvx512, W4a16PrefillHalvesAvx512),
            (ZEN4, TinygemmBlock::N64, true, W4a16DecodeAvx512Bf16, W4a16PrefillDirectAvx512Bf16),
            (ZEN4, TinygemmBlock::N64, false, W4a16DecodeAvx512Bf16, W4a16PrefillHalvesAvx512Bf16),
            // The bf16 decode reads whole 64-channel blocks: a 32-channel layout keeps the f32 decode.
            (ZEN4, TinygemmBlock::N32, true, W4a16DecodeAvx512, W4a16PrefillDirectAvx512Bf16),
        ];
        for &(features, block, direct, decode, prefill) in cases {
            let c = choose(set(features), w4a16(block, direct));
            assert_eq!((c.decode, c.prefill, c.prefill_from), (decode, prefill, 16), "{features:?} {block:?} {direct}");
        }
        let amx = set(ZEN4).with(Feature::AmxBf16);
        assert_eq!(choose(amx, w4a16(TinygemmBlock::N64, true)).prefill, W4a16PrefillAmxBf16);
        // The AMX-BF16 prefill dequantizes from the packed bytes only.
        assert_eq!(choose(amx, w4a16(TinygemmBlock::N64, false)).prefill, W4a16PrefillHalvesAvx512Bf16);
    }

    #[test]
    fn w4a8_keeps_vnni_below_the_tile_rows_on_amx() {
        use KernelId::*;
        let spec = LayerSpec::W4a8 { prefill_from: 8 };
        assert_eq!(choose(FeatureSet::NONE, spec).for_rows(512), W4a8Portable);
        assert_eq!(choose(set(AVX2), spec).for_rows(1), W4a8Avx2);
        assert_eq!(choose(set(ZEN4), spec).for_rows(512), W4a8Vnni);
        let amx = choose(set(ZEN4).with(Feature::AmxInt8), spec);
        assert_eq!(
            (amx.for_rows(W4A8_AMX_MIN_ROWS - 1), amx.for_rows(W4A8_AMX_MIN_ROWS), amx.prefill_from),
            (W4a8Vnni, W4a8Amx, W4A8_AMX_MIN_ROWS)
        );
        // AMX without VNNI for the decode half is not taken.
        assert_eq!(choose(set(AVX2).with(Feature::AmxInt8), spec).prefill, W4a8Avx2);
    }

    #[test]
    fn w8a16_takes_the_widest_registers_each_cpu_class_has() {
        use KernelId::*;
        let spec = LayerSpec::W8a16 { prefill_from: W8A16_PREFILL_FROM_ROWS };
        let cases: &[(&[Feature], KernelId, KernelId)] = &[
            (&[], W8a16DecodePortable, W8a16PrefillPortable),
            (AVX2, W8a16DecodeAvx2, W8a16PrefillAvx2),
            (SKYLAKE, W8a16DecodeAvx512, W8a16PrefillAvx512),
            (ZEN4, W8a16DecodeAvx512, W8a16PrefillAvx512),
            // AVX-512 without FMA or AVX2 (a capped process) is not an AVX-512 CPU to these kernels.
            (&[Feature::Avx512, Feature::Avx2], W8a16DecodePortable, W8a16PrefillPortable),
        ];
        for &(features, decode, prefill) in cases {
            let c = choose(set(features), spec);
            assert_eq!(
                (c.decode, c.prefill, c.prefill_from),
                (decode, prefill, W8A16_PREFILL_FROM_ROWS),
                "{features:?}"
            );
            assert_eq!(
                (c.for_rows(W8A16_PREFILL_FROM_ROWS - 1), c.for_rows(W8A16_PREFILL_FROM_ROWS)),
                (decode, prefill)
            );
        }
        // AMX adds nothing to these kernels.
        assert_eq!(choose(set(ZEN4).with(Feature::AmxInt8).with(Feature::AmxBf16), spec).level(), IsaLevel::Avx512);
    }

    #[test]
    fn dense_runs_the_gemv_up_to_its_row_limit() {
        let c = choose(set(AVX2), LayerSpec::Dense { bf16: true });
        assert_eq!(c.for_rows(DENSE_GEMV_MAX_ROWS), KernelId::DenseBf16GemvAvx2);
        assert_eq!(c.for_rows(DENSE_GEMV_MAX_ROWS + 1), KernelId::DenseBf16GemmAvx2);
        assert_eq!(choose(FeatureSet::NONE, LayerSpec::Dense { bf16: false }).decode, KernelId::DensePortable);
    }

    #[test]
    fn a_feature_set_is_capped_by_level_and_by_caps() {
        let zen4 = set(ZEN4);
        assert_eq!(zen4.capped(IsaLevel::Avx2), set(AVX2));
        assert_eq!(zen4.capped(IsaLevel::Portable), FeatureSet::NONE);
        assert!(!zen4.allowed_by(&IsaCaps::unrestricted().without(Feature::Avx512Bf16)).has(Feature::Avx512Bf16));
        assert!(FeatureSet::all().capped(IsaLevel::Avx512).has(Feature::Avx512Vnni));
        assert!(!FeatureSet::all().capped(IsaLevel::Avx512).has(Feature::AmxInt8));
    }

    #[test]
    fn a_choice_the_caps_forbid_does_not_bind() {
        let portable = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
        let c = choose(set(AVX2), w4a16(TinygemmBlock::N32, true));
        let e = c.bind(&portable).unwrap_err();
        assert!(matches!(e.kind(), KernelErrorKind::Unavailable { kernel: KernelId::W4a16DecodeAvx2, .. }), "{e}");
        assert!(e.to_string().contains("w4a16-decode-avx2 cannot run in this process: AVX2 and FMA"), "{e}");
        // What the live CPU under the caps chooses always binds, and reports what it bound.
        for caps in [portable, IsaCaps::unrestricted()] {
            let spec = w4a16(TinygemmBlock::N64, true);
            let bound = best(spec, &caps).unwrap();
            assert_eq!(bound.choice(), choose(FeatureSet::live(&caps), spec));
            assert_eq!(bound.for_rows(1), bound.choice().decode);
        }
    }

    #[test]
    fn at_level_names_what_the_level_lacks() {
        let portable = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
        let spec = LayerSpec::W4a8 { prefill_from: 16 };
        let e = at_level(spec, IsaLevel::Avx512, &portable).unwrap_err();
        assert!(matches!(e.kind(), KernelErrorKind::Unavailable { kernel: KernelId::W4a8Vnni, .. }), "{e}");
        assert_eq!(at_level(spec, IsaLevel::Portable, &portable).unwrap().for_rows(1), KernelId::W4a8Portable);
    }

    #[test]
    fn the_eight_bit_kernels_beside_an_amx_plan_bind_without_avx512() {
        // An AMX-BF16 prefill beside an AVX2 decode (what `INT4_DISABLE=avx512` leaves an AMX host), and the
        // full AMX rung: the 8-bit kernels beside either bind here, at no level above what the caps leave.
        let amx = choose(FeatureSet::all(), w4a16(TinygemmBlock::N64, true));
        let amx_avx2 = choose(FeatureSet::all().without(Feature::Avx512), w4a16(TinygemmBlock::N64, true));
        assert_eq!((amx.level(), amx_avx2.level()), (IsaLevel::Amx, IsaLevel::Amx));
        for caps in [IsaCaps::unrestricted().without(Feature::Avx512), IsaCaps::unrestricted()] {
            for beside in [amx, amx_avx2] {
                let eight = w8a16_beside(&beside, &caps).unwrap();
                assert!(eight.choice().level() <= caps.effective_level(), "{:?}", eight.choice());
                let spec = LayerSpec::W8a16 { prefill_from: W8A16_PREFILL_FROM_ROWS };
                assert_eq!(eight.choice(), choose(FeatureSet::live(&caps), spec));
            }
        }
    }
}
