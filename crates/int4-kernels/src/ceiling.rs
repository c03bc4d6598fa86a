//! The machine's own ceilings, measured the same way the kernels run: a streaming read over a buffer
//! (the bandwidth a memory-bound GEMV can at best reach on *that* buffer) and a tight FMA loop (the f32
//! arithmetic peak a compute-bound GEMM can at best reach). Benchmarks report kernels as fractions of
//! these, measured in the same run.

use rayon::prelude::*;

use crate::isa::{Avx2Fma, Avx512, Avx512Bf16, IsaCaps};

/// Reads every byte of `buf` once, split over the current rayon pool in contiguous chunks (as the kernels
/// split their weights), and returns a checksum so the reads cannot be optimised away.
pub fn stream_read(buf: &[u8]) -> u64 {
    let tok = Avx2Fma::with_caps(IsaCaps::process());
    let chunk = buf.len().div_ceil(rayon::current_num_threads().max(1)).next_multiple_of(4096).max(4096);
    buf.par_chunks(chunk).map(|c| read_chunk(tok, c)).reduce(|| 0, |a, b| a ^ b)
}

fn read_chunk(tok: Option<Avx2Fma>, c: &[u8]) -> u64 {
    match tok {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2Fma` proves AVX2; the function reads exactly `c.len()` bytes from `c.as_ptr()`.
        Some(_) => unsafe { read_avx2(c.as_ptr(), c.len()) },
        _ => c.chunks(8).fold(0u64, |a, w| a ^ w.iter().fold(0u64, |x, &b| (x << 8) | u64::from(b))),
    }
}

/// XORs 128 bytes per iteration into four accumulators.
///
/// # Safety
/// The CPU must support AVX2; `p` must be readable for `len` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_avx2(p: *const u8, len: usize) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut i = 0;
    while i + 128 <= len {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 128 <= len, so 32 bytes at i + 32j are readable.
            *a = _mm256_xor_si256(*a, unsafe { _mm256_loadu_si256(p.add(i + 32 * j).cast()) });
        }
        i += 128;
    }
    let v = _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]), _mm256_xor_si256(acc[2], acc[3]));
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 writable bytes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    let mut s = lanes.iter().fold(0, |a, &b| a ^ b);
    while i < len {
        // SAFETY: i < len.
        s ^= u64::from(unsafe { *p.add(i) });
        i += 1;
    }
    s
}

/// Runs `iters` iterations of a loop of 12 independent 8-lane FMA chains on every thread of the current
/// pool and returns the floating-point operations done (2 per lane per FMA) and a checksum. Divide by the
/// elapsed time for the FMA peak; 0 operations if this process has no AVX2+FMA.
pub fn fma_peak(iters: u64) -> (u64, f32) {
    let Some(tok) = Avx2Fma::with_caps(IsaCaps::process()) else {
        return (0, 0.0);
    };
    let threads = rayon::current_num_threads();
    let sum: f32 = (0..threads).into_par_iter().map(|t| fma_loop(tok, iters, t as f32)).sum();
    (iters * 12 * 8 * 2 * threads as u64, sum)
}

#[cfg(target_arch = "x86_64")]
fn fma_loop(_tok: Avx2Fma, iters: u64, seed: f32) -> f32 {
    // SAFETY: `Avx2Fma` proves AVX2 and FMA; the loop touches no memory.
    unsafe { fma_loop_avx2(iters, seed) }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_loop(_tok: Avx2Fma, _iters: u64, seed: f32) -> f32 {
    seed
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: u64, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(seed); 12];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm256_fmadd_ps(*c, a, b);
        }
    }
    let mut lanes = [0.0f32; 8];
    let v = acc.iter().fold(_mm256_setzero_ps(), |s, &c| _mm256_add_ps(s, c));
    // SAFETY: `lanes` is 32 writable bytes.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    lanes.iter().sum()
}

/// [`fma_peak`] with 16-lane (512-bit) FMA chains: the peak the AVX-512 f32 prefill can at best reach. On a
/// CPU with two 512-bit FMA units it is twice the 256-bit peak; on one that splits each 512-bit FMA in two
/// halves (Zen 4) or has one 512-bit unit (Intel client cores), about the same. 0 operations if this
/// process has no AVX-512.
pub fn fma512_peak(iters: u64) -> (u64, f32) {
    let Some(tok) = Avx512::with_caps(IsaCaps::process()) else {
        return (0, 0.0);
    };
    let threads = rayon::current_num_threads();
    let sum: f32 = (0..threads).into_par_iter().map(|t| fma512_loop(tok, iters, t as f32)).sum();
    (iters * 12 * 16 * 2 * threads as u64, sum)
}

#[cfg(target_arch = "x86_64")]
fn fma512_loop(_tok: Avx512, iters: u64, seed: f32) -> f32 {
    // SAFETY: `Avx512` proves AVX-512F; the loop touches no memory.
    unsafe { fma512_loop_avx512(iters, seed) }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma512_loop(_tok: Avx512, _iters: u64, seed: f32) -> f32 {
    seed
}

/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma512_loop_avx512(iters: u64, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(seed); 12];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_fmadd_ps(*c, a, b);
        }
    }
    let v = acc.iter().fold(_mm512_setzero_ps(), |s, &c| _mm512_add_ps(s, c));
    _mm512_reduce_add_ps(v)
}

/// Runs `iters` iterations of a loop of 12 independent `vdpbf16ps` chains (16 lanes, two products each) on
/// every thread of the current pool and returns the floating-point operations done (4 per lane per
/// instruction) and a checksum: the bf16 peak the W4A16 prefill's GEMM can at best reach. 0 operations if
/// this process has no AVX512-BF16.
pub fn bf16_peak(iters: u64) -> (u64, f32) {
    let Some(tok) = Avx512Bf16::with_caps(IsaCaps::process()) else {
        return (0, 0.0);
    };
    let threads = rayon::current_num_threads();
    let sum: f32 = (0..threads).into_par_iter().map(|t| bf16_loop(tok, iters, t as f32)).sum();
    (iters * 12 * 16 * 4 * threads as u64, sum)
}

#[cfg(target_arch = "x86_64")]
fn bf16_loop(_tok: Avx512Bf16, iters: u64, seed: f32) -> f32 {
    // SAFETY: `Avx512Bf16` proves AVX-512 F/BW/VL and BF16; the loop touches no memory.
    unsafe { bf16_loop_avx512(iters, seed) }
}

#[cfg(not(target_arch = "x86_64"))]
fn bf16_loop(_tok: Avx512Bf16, _iters: u64, seed: f32) -> f32 {
    seed
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_loop_avx512(iters: u64, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    // Small operands so the sums stay finite: 2⁻⁸ · 2⁻⁸ per product.
    let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0 / 256.0), _mm512_set1_ps(1.0 / 256.0));
    let mut acc = [_mm512_set1_ps(seed); 12];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            *c = _mm512_dpbf16_ps(*c, a, a);
        }
    }
    let v = acc.iter().fold(_mm512_setzero_ps(), |s, &c| _mm512_add_ps(s, c));
    _mm512_reduce_add_ps(v)
}
