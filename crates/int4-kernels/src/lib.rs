//! 4-bit matrix kernels: `y[M,N] = x[M,K] · W[N,K]ᵀ (+ bias)` over the layouts of `int4-layout`.
//!
//! This crate is where the W4A16 kernels (a decode GEMV reading the tinygemm layout, a prefill that
//! dequantizes straight from it into bf16 panels for a bf16 GEMM), the W4A8 kernels (AVX-512 VNNI and AMX
//! tiles, with a bit-exact software emulator of the tile instructions), the portable wna16 fallback and the
//! scalar reference will live. Each ISA variant will be a type that can only be constructed after a runtime
//! check of the live CPU, so that one binary runs on any x86-64.
//!
//! Nothing is implemented yet; the crate exists so the workspace has its final shape.
#![deny(missing_docs)]
