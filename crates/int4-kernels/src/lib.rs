//! 4-bit matrix kernels: `y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias)` over the layouts of `int4-layout`.
//!
//! * [`choice`] — which kernel a layer runs in each phase: [`choice::choose`], a pure function of the CPU
//!   features and the layer, and [`choice::KernelChoice::bind`], which proves the choice can run here;
//! * [`w4a16`] — 4-bit weights in a tinygemm layout: a decode GEMV below `dequant_threshold` rows and a
//!   prefill that dequantizes straight from the packed layout into bf16 panels for a GEMM at or above it;
//! * [`dense`] — unquantized bf16 and f32 weights (the speed baseline and the fidelity reference path);
//! * [`w4a8`] — int8 activations and 4-bit weights: AVX2, AVX-512 VNNI and AMX tiles, and portable Rust;
//! * [`w8a16`] — a checkpoint's int8 codes (GGUF Q8_0, Q5_0) with a scale per 32 inputs, against f32
//!   activations: one documented f32 order that every variant follows, so every CPU gets the same bits;
//! * [`tile`] — the interface over Intel AMX's tile instructions that the W4A8 and the W4A16 AMX-BF16
//!   kernels are written against, and a bit-exact software emulator of it; [`AmxTiles`] is the hardware
//!   unit, built only from an AMX capability token;
//! * [`os`] — what the operating system grants (XCR0, Linux's AMX permission): the one reader of both;
//! * [`portable`] — the wna16 fallback over row-major codes, and the scalar counterparts of every SIMD
//!   inner loop, running on any architecture;
//! * [`reference`](mod@reference) — the scalar f64 definition every kernel is tested against; [`budget`] — the error
//!   budget formulas those tests use; [`shapes`] — the shape corpus shared by tests and benchmarks.
//!
//! # ISA dispatch and safety model
//!
//! One binary runs on any x86-64. SIMD code lives in `x86_64::*` as `#[target_feature]` functions, and is
//! only reachable through a capability token ([`isa::Avx2Fma`] and its siblings) that can only be
//! constructed after a runtime check of the live CPU. A layer's kernels are chosen once, when it is built,
//! by [`choice::choose`] from the live CPU's features under the process caps ([`isa::IsaCaps`] applies
//! `INT4_ISA`/`INT4_DISABLE`), bound to their tokens, and reported per phase ([`KernelId`]); the layer
//! dispatches on what it bound, so what it reports is what runs. Every `unsafe` block carries a
//! `// SAFETY:` argument; every `unsafe fn` a `# Safety` section.
//!
//! Threads (rayon) split output channels, never a K reduction, so every result is bit-identical for any
//! thread count.
//!
//! W4A16 has portable, AVX2 + FMA, AVX-512 (f32 FMA and AVX512-BF16) and AMX-BF16 kernels; W4A8 has
//! portable, AVX2, AVX-512 VNNI and AMX kernels; W8A16 has portable, AVX2 + FMA and AVX-512 kernels.
//! Where a machine lacks AVX-512 VNNI, the VNNI kernel is tested under an emulated AVX-512 CPU
//! (`scripts/avx512-emulator.sh`); both AMX tilings are tested on the tile emulator everywhere and on the
//! hardware tiles where a host has them (`scripts/device-tests.sh` packs the tests for one).
#![deny(missing_docs)]

pub mod budget;
pub mod bytes;
pub mod ceiling;
pub mod choice;
pub mod dense;
pub mod error;
mod gemm;
pub mod isa;
pub mod kernel_id;
pub mod lines;
pub mod os;
pub mod portable;
pub mod prefetch;
pub mod reference;
pub mod shapes;
pub mod tile;
pub mod vector;
pub mod w4a16;
pub mod w4a8;
pub mod w8a16;
#[cfg(target_arch = "x86_64")]
mod x86_64;

pub use choice::{BoundKernels, FeatureSet, KernelChoice, LayerSpec};
pub use error::{KernelError, KernelErrorKind};
pub use kernel_id::KernelId;
#[cfg(target_arch = "x86_64")]
pub use x86_64::amx::AmxTiles;
