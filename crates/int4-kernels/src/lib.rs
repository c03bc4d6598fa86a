//! 4-bit matrix kernels: `y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias)` over the layouts of `int4-layout`.
//!
//! * [`w4a16`] — 4-bit weights in a tinygemm layout: a decode GEMV below `dequant_threshold` rows and a
//!   prefill that dequantizes straight from the packed layout into bf16 panels for a GEMM at or above it;
//! * [`dense`] — unquantized bf16 and f32 weights (the speed baseline and the fidelity reference path);
//! * [`w4a8`] — int8 activations and 4-bit weights: AVX2, AVX-512 VNNI and AMX tiles, and portable Rust;
//! * [`tile`] — the interface over Intel AMX's tile instructions that the W4A8 and the W4A16 AMX-BF16
//!   kernels are written against, and a bit-exact software emulator of it; [`AmxTiles`] is the hardware
//!   unit, built only from an AMX capability token;
//! * [`portable`] — the wna16 fallback over row-major codes, and the scalar counterparts of every SIMD
//!   inner loop, running on any architecture;
//! * [`reference`](mod@reference) — the scalar f64 definition every kernel is tested against; [`budget`] — the error
//!   budget formulas those tests use; [`shapes`] — the shape corpus shared by tests and benchmarks.
//!
//! # ISA dispatch and safety model
//!
//! One binary runs on any x86-64. SIMD code lives in `x86_64::*` as `#[target_feature]` functions, and is
//! only reachable through a capability token ([`isa::Avx2Fma`]) that can only be constructed after a runtime
//! check of the live CPU. A layer picks its engine once, when it is built ([`isa::IsaCaps`] applies the
//! `INT4_ISA`/`INT4_DISABLE` caps), and reports which kernel runs each phase ([`kernel_id::KernelId`]).
//! Every `unsafe` block carries a `// SAFETY:` argument; every `unsafe fn` a `# Safety` section.
//!
//! Threads (rayon) split output channels, never a K reduction, so every result is bit-identical for any
//! thread count.
//!
//! W4A16 has AVX2 + FMA kernels and portable ones; its AVX-512 (BF16) and AMX-BF16 kernels are not in this
//! crate yet. W4A8 has portable, AVX2, AVX-512 VNNI and AMX kernels. The development machine has AVX2
//! only: the VNNI kernel is tested under an emulated AVX-512 CPU (`scripts/avx512-emulator.sh`) and the
//! AMX tiling on the tile emulator; the AMX instructions themselves await an AMX host.
#![deny(missing_docs)]

pub mod budget;
pub mod bytes;
pub mod ceiling;
pub mod dense;
pub mod error;
mod gemm;
pub mod isa;
pub mod kernel_id;
pub mod portable;
pub mod reference;
pub mod shapes;
pub mod tile;
pub mod vector;
pub mod w4a16;
pub mod w4a8;
#[cfg(target_arch = "x86_64")]
mod x86_64;

pub use error::{KernelError, KernelErrorKind};
pub use kernel_id::KernelId;
#[cfg(target_arch = "x86_64")]
pub use x86_64::amx::AmxTiles;
