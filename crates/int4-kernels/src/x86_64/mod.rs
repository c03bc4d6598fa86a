//! x86-64 kernels. Each submodule's functions are `#[target_feature]` functions that may only be called
//! while holding the matching capability token from [`crate::isa`].

pub mod avx2;
pub mod avx512;
pub mod w4a8;
