//! x86-64 kernels. Each submodule's functions are `#[target_feature]` functions that may only be called
//! while holding the matching capability token from [`crate::isa`]; [`amx`] is the hardware tile unit,
//! built only from an AMX token, and [`amx_probe`] the check behind those tokens.

pub mod amx;
pub mod amx_probe;
pub mod avx2;
pub mod avx512;
pub mod w4a8;
pub mod w8a16;
