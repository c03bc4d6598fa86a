//! The W8A16 kernels: AVX2 + FMA (the sixteen lanes of [`crate::w8a16`]'s order as two 8-wide registers)
//! and AVX-512 (one 16-wide register).
//!
//! Both compute, for `NR` weight rows and `MR` activation rows, exactly the operations of that order:
//! per group, codes widened from bytes to dwords and converted to f32 (exact), `t = fma(q_b, x_b, q_a·x_a)`
//! and `acc = fma(d, t, acc)` per lane, then the tree `8 + 8`, `4 + 4`, `2 + 2`, `1 + 1`. Lane `j` of the
//! order is lane `j` of the AVX-512 register, and lane `j mod 8` of AVX2's register `j / 8`; so AVX2's
//! first tree step, adding its two registers, is the order's `acc[j] + acc[j + 8]`. Lanes never mix before
//! the tree, so AVX2 runs its two halves one after the other (half the accumulators live at a time).
//!
//! **Safety model.** As in [`super::w4a8`]: the public functions are safe. They take a capability token
//! (proof the CPU has the features) and slices whose lengths they assert (`codes` `[NR][k]`, `scales`
//! `[NR][k/32]`, `x` `[MR][k]`, `k` a multiple of 32); the `unsafe` inner functions read only inside
//! those.

use std::arch::x86_64::*;

use crate::isa::{Avx2Fma, Avx512};

/// Input channels per scale: `crate::w8a16::GROUP`, which checks at compile time that the two agree (this
/// file is below that one, so it names its own).
pub(crate) const GROUP: usize = 32;

/// How far ahead a one-activation-row (decode) pass prefetches codes, in blocks of `NR` weight rows. The
/// `NR` rows a pass reads side by side are `NR` streams a few lines long, which the hardware prefetcher
/// does not follow far enough ahead: from memory the head's decode waited on its loads.
const DECODE_PREFETCH_BLOCKS: usize = 2;

/// At group `g` of a one-activation-row pass over `NR` weight rows at `codes`, prefetches the `g`-th
/// `NR·32` bytes of the block [`DECODE_PREFETCH_BLOCKS`] blocks ahead, a line at a time: in address order,
/// so that over its `k/32` groups a pass requests the whole of that block (`NR·k` bytes), while the block
/// two before it runs. Weight rows are contiguous, so the block ahead starts `NR·k` bytes on. A prefetch
/// never faults: running past the weights is harmless.
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_block_ahead<const NR: usize>(codes: *const i8, k: usize, g: usize) {
    let ahead = codes.wrapping_add(NR * k * DECODE_PREFETCH_BLOCKS + g * NR * GROUP);
    for line in (0..NR * GROUP).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
    }
}

/// Asserts the operand lengths every kernel here relies on.
fn check_operands<const NR: usize, const MR: usize>(codes: &[i8], scales: &[f32], x: &[f32], k: usize) {
    assert!(k.is_multiple_of(GROUP), "W8A16 rows are whole groups of 32");
    assert_eq!(codes.len(), NR * k, "W8A16 codes [NR][k]");
    assert_eq!(scales.len(), NR * (k / GROUP), "W8A16 scales [NR][k/32]");
    assert_eq!(x.len(), MR * k, "W8A16 activations [MR][k]");
}

/// The sums (before the bias) of `NR` weight rows against `MR` activation rows, `[weight row][activation
/// row]`, on AVX2 + FMA.
pub(crate) fn sums_avx2<const NR: usize, const MR: usize>(
    _tok: Avx2Fma,
    codes: &[i8],
    scales: &[f32],
    x: &[f32],
    k: usize,
) -> [[f32; MR]; NR] {
    check_operands::<NR, MR>(codes, scales, x, k);
    // SAFETY: the token proves AVX2 and FMA; `check_operands` asserted the lengths `sums_avx2_raw` reads.
    unsafe { sums_avx2_raw::<NR, MR>(codes.as_ptr(), scales.as_ptr(), x.as_ptr(), k) }
}

/// The sums (before the bias) of `NR` weight rows against `MR` activation rows, `[weight row][activation
/// row]`, on AVX-512.
pub(crate) fn sums_avx512<const NR: usize, const MR: usize>(
    _tok: Avx512,
    codes: &[i8],
    scales: &[f32],
    x: &[f32],
    k: usize,
) -> [[f32; MR]; NR] {
    check_operands::<NR, MR>(codes, scales, x, k);
    // SAFETY: the token proves AVX-512 F/BW/VL, AVX2 and FMA; `check_operands` asserted the lengths
    // `sums_avx512_raw` reads.
    unsafe { sums_avx512_raw::<NR, MR>(codes.as_ptr(), scales.as_ptr(), x.as_ptr(), k) }
}

/// Eight codes at `p`, as f32.
///
/// # Safety
/// The CPU must support AVX2; `p` must be valid for reading 8 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn codes8(p: *const i8) -> __m256 {
    // SAFETY: the caller guarantees 8 readable bytes; `_mm_loadl_epi64` reads exactly 8, unaligned.
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(p.cast()) }))
}

/// The tree's last three steps over eight lanes: `4 + 4`, `2 + 2`, `1 + 1`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tree8(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2)))
}

/// [`sums_avx2`] on raw pointers. Per half `h` of the sixteen lanes (lanes `8h..8h + 8`), group `g` reads
/// codes and activations `32g + 8h..+8` (the order's `q(j)`, `x(j)`) and `32g + 16 + 8h..+8` (`q(16 + j)`,
/// `x(16 + j)`).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `k` must be a multiple of 32; `codes` must be readable for `NR·k`
/// bytes, `scales` for `NR·k/32` floats and `x` for `MR·k` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn sums_avx2_raw<const NR: usize, const MR: usize>(
    codes: *const i8,
    scales: *const f32,
    x: *const f32,
    k: usize,
) -> [[f32; MR]; NR] {
    let groups = k / GROUP;
    let mut halves = [[[_mm256_setzero_ps(); MR]; NR]; 2];
    for (h, acc) in halves.iter_mut().enumerate() {
        for g in 0..groups {
            // The second half reads the block's codes again, from L1.
            if MR == 1 && h == 0 {
                prefetch_block_ahead::<NR>(codes, k, g);
            }
            let a = g * GROUP + 8 * h;
            let b = a + 16;
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: i < NR and b + 8 <= (g + 1)·32 <= k: the codes read lie in row i, within NR·k bytes;
                // the scale index i·groups + g < NR·groups.
                let (qa, qb, d) = unsafe {
                    (
                        codes8(codes.add(i * k + a)),
                        codes8(codes.add(i * k + b)),
                        _mm256_set1_ps(*scales.add(i * groups + g)),
                    )
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: r < MR and b + 8 <= k: both 8-float loads lie in activation row r, within MR·k.
                    let (xa, xb) = unsafe { (_mm256_loadu_ps(x.add(r * k + a)), _mm256_loadu_ps(x.add(r * k + b))) };
                    let t = _mm256_fmadd_ps(qb, xb, _mm256_mul_ps(qa, xa));
                    *acc = _mm256_fmadd_ps(d, t, *acc);
                }
            }
        }
    }
    let mut sums = [[0.0f32; MR]; NR];
    for (i, row) in sums.iter_mut().enumerate() {
        for (r, s) in row.iter_mut().enumerate() {
            *s = tree8(_mm256_add_ps(halves[0][i][r], halves[1][i][r]));
        }
    }
    sums
}

/// Sixteen codes at `p`, as f32.
///
/// # Safety
/// The CPU must support AVX-512 F; `p` must be valid for reading 16 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn codes16(p: *const i8) -> __m512 {
    // SAFETY: the caller guarantees 16 readable bytes; `_mm_loadu_si128` reads exactly 16, unaligned.
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(p.cast()) }))
}

/// The whole tree over sixteen lanes: `8 + 8` (the register's halves), then [`tree8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
fn tree16(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    tree8(_mm256_add_ps(lo, hi))
}

/// [`sums_avx512`] on raw pointers. Group `g` reads codes and activations `32g..32g + 16` (the order's
/// `q(j)`, `x(j)`) and `32g + 16..32g + 32` (`q(16 + j)`, `x(16 + j)`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA; `k` must be a multiple of 32; `codes` must be
/// readable for `NR·k` bytes, `scales` for `NR·k/32` floats and `x` for `MR·k` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn sums_avx512_raw<const NR: usize, const MR: usize>(
    codes: *const i8,
    scales: *const f32,
    x: *const f32,
    k: usize,
) -> [[f32; MR]; NR] {
    let groups = k / GROUP;
    let mut acc = [[_mm512_setzero_ps(); MR]; NR];
    for g in 0..groups {
        let a = g * GROUP;
        let b = a + 16;
        if MR == 1 {
            prefetch_block_ahead::<NR>(codes, k, g);
        }
        // The tile's activations, loaded once for every weight row.
        let mut xs = [(_mm512_setzero_ps(), _mm512_setzero_ps()); MR];
        for (r, xr) in xs.iter_mut().enumerate() {
            // SAFETY: r < MR and b + 16 <= k: both 16-float loads lie in activation row r, within MR·k.
            *xr = unsafe { (_mm512_loadu_ps(x.add(r * k + a)), _mm512_loadu_ps(x.add(r * k + b))) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i < NR and b + 16 <= (g + 1)·32 <= k: the codes read lie in row i, within NR·k bytes;
            // the scale index i·groups + g < NR·groups.
            let (qa, qb, d) = unsafe {
                (
                    codes16(codes.add(i * k + a)),
                    codes16(codes.add(i * k + b)),
                    _mm512_set1_ps(*scales.add(i * groups + g)),
                )
            };
            for (acc, &(xa, xb)) in acc.iter_mut().zip(&xs) {
                let t = _mm512_fmadd_ps(qb, xb, _mm512_mul_ps(qa, xa));
                *acc = _mm512_fmadd_ps(d, t, *acc);
            }
        }
    }
    let mut sums = [[0.0f32; MR]; NR];
    for (row, acc) in sums.iter_mut().zip(&acc) {
        for (s, &v) in row.iter_mut().zip(acc) {
            *s = tree16(v);
        }
    }
    sums
}
