//! AVX2 + FMA kernels: the W4A16 decode GEMV over lane groups, the dequantizing panel producer for prefill,
//! the f32 GEMM microkernel and the dense dot products.
//!
//! **Lane groups.** Every tinygemm layout, for either block width and for the adjacent-pair tails, can be
//! read eight bytes at a time: for each input channel `k`, eight contiguous bytes at `offset + k·stride`
//! hold sixteen output channels, eight in the low nibbles and eight in the high nibbles (which sixteen is the
//! layout's business: [`crate::w4a16::LaneGroup`] records it). One 8-byte load, a zero extension to eight
//! dwords, a mask and a shift give both halves. The decode converts the codes to f32 directly and factors
//! the 8 out per group; the prefill needs `q − 8` itself (its panels hold the exact dequantized weight), and
//! gets it by OR-ing the nibble into the mantissa of 2²³ and subtracting 2²³ + 8, exact in one more
//! instruction.
//!
//! **Safety model.** Every function here is an `unsafe fn` with `#[target_feature(enable = "avx2,fma")]`.
//! Its `# Safety` section has two parts: the CPU must have AVX2 and FMA (callers hold an
//! [`crate::isa::Avx2Fma`] token, which is only constructed after a runtime check), and the pointer
//! ranges it lists must be valid. The safe drivers in [`crate::w4a16`], [`crate::gemm`] and [`crate::dense`]
//! check those ranges with slice lengths before calling.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// 2²³ as f32 bits: OR a value below 2²³ into its mantissa and the float equals 2²³ + value.
const MAGIC: i32 = 0x4B00_0000;
/// 2²³ + 8: subtracting it from `MAGIC | q` gives `q − 8` exactly.
const MAGIC_PLUS_8: f32 = 8_388_616.0;

/// Unpacks one lane group's eight bytes for one input channel into `(q − 8)` for the low-nibble lanes and
/// the high-nibble lanes.
///
/// # Safety
/// The CPU must support AVX2; `src` must be valid for reading 8 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn unpack8(src: *const u8, mask: __m256i, magic: __m256i, magic8: __m256) -> (__m256, __m256) {
    // SAFETY: the caller guarantees 8 readable bytes at `src`; `_mm_loadl_epi64` reads exactly 8 and has no
    // alignment requirement.
    let v = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(src.cast()) });
    let lo = _mm256_or_si256(_mm256_and_si256(v, mask), magic);
    let hi = _mm256_or_si256(_mm256_srli_epi32::<4>(v), magic);
    (_mm256_sub_ps(_mm256_castsi256_ps(lo), magic8), _mm256_sub_ps(_mm256_castsi256_ps(hi), magic8))
}

/// Unpacks one lane group's eight bytes for one input channel into the codes `q` (0..15, as f32) of the
/// low-nibble lanes and the high-nibble lanes: five instructions for sixteen weights.
///
/// # Safety
/// The CPU must support AVX2; `src` must be valid for reading 8 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn unpack8_codes(src: *const u8, mask: __m256i) -> (__m256, __m256) {
    // SAFETY: the caller guarantees 8 readable bytes at `src`; `_mm_loadl_epi64` reads exactly 8 and has no
    // alignment requirement.
    let v = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(src.cast()) });
    (_mm256_cvtepi32_ps(_mm256_and_si256(v, mask)), _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v)))
}

/// W4A16 decode for `W` lane groups (1, 2 or 4) that share a stride and `MR` rows, for each lane group's
/// sixteen lanes `j` (low-nibble lanes 0..8, high-nibble lanes 8..16):
///
/// `tile[r][j] = Σ_g s·Σ_{k∈g} x[r][k]·q + (z − 8s)·xs[r][g]`, which is `Σ_k x·((q − 8)·s + z)`.
///
/// Using `q` rather than `q − 8` in the inner loop saves two instructions per sixteen weights (the inner
/// loop is compute-bound on AVX2); the price is a larger sum of magnitudes in the error budget
/// ([`crate::budget::magnitudes_w4_decode`]). Order, per row and lane: one FMA chain over the group's
/// input channels in K order, then `tile = fma(s, acc, tile)` and `tile = fma(z − 8s, xs, tile)`, groups
/// in order; so a row gets the same bits whatever `MR` and `W` it runs with. Lane group `d` holds input
/// channel `kk`'s eight bytes at `bytes[d] + kk·stride`, its parameters at `sz[d]` and its `[MR][16]` tile
/// at `tile[d]` (overwritten).
///
/// A tinygemm block stores its lane groups side by side (two in a 32-channel block, 16 bytes per input
/// channel; four in a 64-channel one), so one row over all of a block's lane groups reads the block as a
/// sequential stream and uses every code while its line arrives. One lane group per pass uses a part of
/// each line and leaves the rest to the next passes, from cache, while memory waits.
///
/// # Safety
/// The CPU must support AVX2 and FMA. For every `r < MR` and `kk < k`, `x.add(r·ldx + kk)` must be
/// readable; `xs.add(r·groups + g)` readable for every group `g < ceil(k/g_len)`; for every `d < W`,
/// `bytes[d].add(kk·stride + 7)` readable for every `kk < k`, `sz[d].add(g·32 + 31)` readable for every
/// group, and `tile[d].add(r·16 + 15)` writable for every `r < MR`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn decode_lanes<const MR: usize, const W: usize>(
    x: *const f32,
    ldx: usize,
    xs: *const f32,
    bytes: [*const u8; 4],
    stride: usize,
    sz: [*const f32; 4],
    k: usize,
    g_len: usize,
    tile: [*mut f32; 4],
) {
    let mask = _mm256_set1_epi32(0xF);
    let eight = _mm256_set1_ps(8.0);
    let groups = k.div_ceil(g_len);
    for t in &tile[..W] {
        for r in 0..MR {
            // SAFETY: r < MR: tile[d][r·16 .. r·16 + 16] is writable (caller contract).
            unsafe {
                _mm256_storeu_ps(t.add(r * 16), _mm256_setzero_ps());
                _mm256_storeu_ps(t.add(r * 16 + 8), _mm256_setzero_ps());
            }
        }
    }
    for g in 0..groups {
        let k0 = g * g_len;
        let k1 = (k0 + g_len).min(k);
        let mut acc = [[[_mm256_setzero_ps(); 2]; W]; MR];
        for kk in k0..k1 {
            // SAFETY: r < MR and kk < k: x[r·ldx + kk] is readable (caller contract).
            let xb: [__m256; MR] = std::array::from_fn(|r| _mm256_set1_ps(unsafe { *x.add(r * ldx + kk) }));
            for d in 0..W {
                // SAFETY: kk < k and d < W: the 8 bytes at bytes[d] + kk·stride are readable (caller contract).
                let (wlo, whi) = unsafe { unpack8_codes(bytes[d].add(kk * stride), mask) };
                for (a, xb) in acc.iter_mut().zip(&xb) {
                    a[d][0] = _mm256_fmadd_ps(wlo, *xb, a[d][0]);
                    a[d][1] = _mm256_fmadd_ps(whi, *xb, a[d][1]);
                }
            }
        }
        for d in 0..W {
            // SAFETY: g < groups and d < W: sz[d][g·32 .. g·32 + 32] is readable (caller contract).
            let (s_lo, s_hi, z_lo, z_hi) = unsafe {
                let p = sz[d].add(g * 32);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)))
            };
            // z − 8s, once per group.
            let (z_lo, z_hi) = (_mm256_fnmadd_ps(eight, s_lo, z_lo), _mm256_fnmadd_ps(eight, s_hi, z_hi));
            for (r, a) in acc.iter().enumerate() {
                // SAFETY: r < MR, g < groups: xs[r·groups + g] is readable, and tile[d][r·16 .. r·16 + 16]
                // is writable (caller contract).
                unsafe {
                    let xsum = _mm256_set1_ps(*xs.add(r * groups + g));
                    let t = tile[d].add(r * 16);
                    let (t0, t1) = (_mm256_loadu_ps(t), _mm256_loadu_ps(t.add(8)));
                    _mm256_storeu_ps(t, _mm256_fmadd_ps(z_lo, xsum, _mm256_fmadd_ps(s_lo, a[d][0], t0)));
                    _mm256_storeu_ps(t.add(8), _mm256_fmadd_ps(z_hi, xsum, _mm256_fmadd_ps(s_hi, a[d][1], t1)));
                }
            }
        }
    }
}

/// Dequantizes input channels `k0..k1` of one lane group straight from the packed bytes into a panel
/// `[k1 − k0][16]` of f32 weights, `(q − 8)·s + z` by the crate-wide rule (bit for bit
/// `int4_layout::dequantize`). Without bf16 arithmetic there is nothing to gain from rounding them to
/// bf16, so the FMA GEMM runs on the exact weights.
///
/// # Safety
/// The CPU must support AVX2 and FMA. `bytes.add(kk·stride + 7)` readable for `kk` in `k0..k1`;
/// `sz.add(g·32 + 31)` readable for every group `g` touched (`kk / g_len`); `panel` writable for
/// `(k1 − k0)·16` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dequant_panel(
    bytes: *const u8,
    stride: usize,
    sz: *const f32,
    k0: usize,
    k1: usize,
    g_len: usize,
    panel: *mut f32,
) {
    let mask = _mm256_set1_epi32(0xF);
    let magic = _mm256_set1_epi32(MAGIC);
    let magic8 = _mm256_set1_ps(MAGIC_PLUS_8);
    let mut kk = k0;
    while kk < k1 {
        let g = kk / g_len;
        let end = ((g + 1) * g_len).min(k1);
        // SAFETY: group g is touched, so sz[g·32 .. g·32 + 32] is readable (caller contract).
        let (s_lo, s_hi, z_lo, z_hi) = unsafe {
            let p = sz.add(g * 32);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)))
        };
        for j in kk..end {
            // SAFETY: j is in k0..k1: its 8 bytes are readable and panel row j − k0 is writable.
            unsafe {
                let (qlo, qhi) = unpack8(bytes.add(j * stride), mask, magic, magic8);
                // (q − 8)·s, then + z: two roundings, no FMA, exactly `int4_layout::dequantize`.
                let wlo = _mm256_add_ps(_mm256_mul_ps(qlo, s_lo), z_lo);
                let whi = _mm256_add_ps(_mm256_mul_ps(qhi, s_hi), z_hi);
                let dst = panel.add((j - k0) * 16);
                _mm256_storeu_ps(dst, wlo);
                _mm256_storeu_ps(dst.add(8), whi);
            }
        }
        kk = end;
    }
}

/// The f32 GEMM microkernel: `tile[r][0..16] += Σ_p a[r][p]·panel[p][0..16]` for `r < MR`, `p < kc`,
/// accumulating in K order with FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA. `a.add(r·lda + p)` readable for `r < MR`, `p < kc`;
/// `panel.add(p·16 + 15)` readable for `p < kc`; `tile.add(r·16 + 15)` readable and writable for `r < MR`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn gemm_microkernel<const MR: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    panel: *const f32,
    tile: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for (r, c) in acc.iter_mut().enumerate() {
        // SAFETY: r < MR: tile row r is readable (caller contract).
        unsafe {
            c[0] = _mm256_loadu_ps(tile.add(r * 16));
            c[1] = _mm256_loadu_ps(tile.add(r * 16 + 8));
        }
    }
    for p in 0..kc {
        // SAFETY: p < kc: panel row p is readable (caller contract).
        let (b0, b1) = unsafe { (_mm256_loadu_ps(panel.add(p * 16)), _mm256_loadu_ps(panel.add(p * 16 + 8))) };
        for (r, c) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR, p < kc: a[r·lda + p] is readable (caller contract).
            let ab = _mm256_set1_ps(unsafe { *a.add(r * lda + p) });
            c[0] = _mm256_fmadd_ps(ab, b0, c[0]);
            c[1] = _mm256_fmadd_ps(ab, b1, c[1]);
        }
    }
    for (r, c) in acc.iter().enumerate() {
        // SAFETY: r < MR: tile row r is writable (caller contract).
        unsafe {
            _mm256_storeu_ps(tile.add(r * 16), c[0]);
            _mm256_storeu_ps(tile.add(r * 16 + 8), c[1]);
        }
    }
}

/// Horizontal sum of eight lanes in a fixed order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// The lanes of [`dot_f32`] before its horizontal sum: four 8-lane FMA chains over the whole vectors of
/// `len`, the last partial vector's worth on the first chain, combined as `(c0 + c1) + (c2 + c3)`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a` and `b` readable for `len` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_lanes(a: *const f32, b: *const f32, len: usize) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= len {
        for (j, c) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= len, so lanes i + 8j .. i + 8j + 8 are readable.
            unsafe { *c = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i + 8 * j)), _mm256_loadu_ps(b.add(i + 8 * j)), *c) };
        }
        i += 32;
    }
    while i + 8 <= len {
        // SAFETY: i + 8 <= len.
        unsafe { acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc[0]) };
        i += 8;
    }
    _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))
}

/// `s + Σ a[i]·b[i]` over the scalar tail `i` in `len − len % 8 .. len`, one fused multiply-add each.
///
/// # Safety
/// `a` and `b` readable for `len` floats.
#[inline]
pub(crate) unsafe fn dot_tail(a: *const f32, b: *const f32, len: usize, mut s: f32) -> f32 {
    for i in len - len % 8..len {
        // SAFETY: i < len.
        unsafe { s = (*a.add(i)).mul_add(*b.add(i), s) };
    }
    s
}

/// `Σ_i a[i]·b[i]` over `len` f32 pairs: four 8-lane FMA chains, combined in a fixed order, then the tail.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a` and `b` readable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_f32(a: *const f32, b: *const f32, len: usize) -> f32 {
    // SAFETY: the caller's contract is dot_lanes's and dot_tail's.
    unsafe { dot_tail(a, b, len, hsum(dot_lanes(a, b, len))) }
}

/// The horizontal sums of eight vectors at once, each added in [`hsum`]'s order
/// (`((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`), so each is bit for bit `hsum(v[t])`. Written as
/// its three stages, [`hsum8_halves`] (of vectors 0 and 1, 2 and 3, 4 and 5, 6 and 7), [`hsum8_pairs`] (of
/// the first two results, and of the last two) and [`hsum8_finish`], which a caller short of registers
/// runs as it makes the vectors instead of holding all eight.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum8(v: [__m256; 8]) -> [f32; 8] {
    let (s01, s23) = (hsum8_halves(v[0], v[1]), hsum8_halves(v[2], v[3]));
    let (s45, s67) = (hsum8_halves(v[4], v[5]), hsum8_halves(v[6], v[7]));
    hsum8_finish(hsum8_pairs(s01, s23), hsum8_pairs(s45, s67))
}

/// [`hsum8`]'s first stage, for vectors `x` and `y` (t and t + 1, t even): `[x.lo + x.hi | y.lo + y.hi]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum8_halves(x: __m256, y: __m256) -> __m256 {
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(x, y), _mm256_permute2f128_ps::<0x31>(x, y))
}

/// [`hsum8`]'s second stage, for the first stage of vectors t, t + 1 (`x`) and of t + 2, t + 3 (`y`):
/// (s0 + s2, s1 + s3) of each vector, so `[k0 | k1]` and `[k2 | k3]` become `[k0, k2 | k1, k3]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum8_pairs(x: __m256, y: __m256) -> __m256 {
    _mm256_add_ps(_mm256_shuffle_ps::<0x44>(x, y), _mm256_shuffle_ps::<0xEE>(x, y))
}

/// [`hsum8`]'s last stage, from the second stage of vectors 0–3 and of 4–7: t0 + t1 of each vector, in
/// vector order.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum8_finish(t0123: __m256, t4567: __m256) -> [f32; 8] {
    // Lanes hold vectors 0, 2, 4, 6, 1, 3, 5, 7.
    let sums = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(t0123, t4567), _mm256_shuffle_ps::<0xDD>(t0123, t4567));
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
    [lanes[0], lanes[4], lanes[1], lanes[5], lanes[2], lanes[6], lanes[3], lanes[7]]
}

/// `out[j] = Σ_i q[i]·keys[j·stride + i]` over `len` floats for `j < n`: each bit for bit
/// [`dot_f32`]`(q, keys + j·stride, len)`, with the horizontal sums taken eight keys at a time.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `q` readable for `len` floats, `keys` for `(n − 1)·stride + len`
/// floats when `n > 0`, `out` writable for `n`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dots_f32(q: *const f32, keys: *const f32, stride: usize, len: usize, n: usize, out: *mut f32) {
    let mut j = 0;
    while j + 8 <= n {
        // SAFETY: keys j..j + 8 lie within the n the caller made readable.
        let v: [__m256; 8] = std::array::from_fn(|t| unsafe { dot_lanes(q, keys.add((j + t) * stride), len) });
        for (t, s) in hsum8(v).into_iter().enumerate() {
            // SAFETY: as above; out[j + t] is writable for j + t < n.
            unsafe { *out.add(j + t) = dot_tail(q, keys.add((j + t) * stride), len, s) };
        }
        j += 8;
    }
    while j < n {
        // SAFETY: key j < n is readable and out[j] writable.
        unsafe { *out.add(j) = dot_f32(q, keys.add(j * stride), len) };
        j += 1;
    }
}

/// `out[h·n + j] = Σ_i q[h·len + i]·keys[j·stride + i]` for the `heads` queries `q[h·len..]` (the query
/// heads that share one KV head) and keys `j < n`: each bit for bit [`dot_f32`]`(q + h·len, keys +
/// j·stride, len)`. Every head takes a block of eight keys in turn while the block is in L1, so the keys
/// are read from memory once, not once per head.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `q` readable for `heads·len` floats, `keys` for `(n − 1)·stride +
/// len` floats when `n > 0`, `out` writable for `heads·n`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dots_heads_f32(
    q: *const f32,
    heads: usize,
    keys: *const f32,
    stride: usize,
    len: usize,
    n: usize,
    out: *mut f32,
) {
    // The caller's contract is the one the macro's unsafe blocks rely on.
    dots_heads_with!(dot_lanes, dot_tail, q, heads, keys, stride, len, n, out)
}

/// [`dot_tail`] against f16 keys (raw bits), each widened exactly: the same products, the same bits as
/// against the widened keys.
///
/// # Safety
/// `a` readable for `len` floats, `b` for `len` halves.
#[inline]
pub(crate) unsafe fn dot_tail_f16(a: *const f32, b: *const u16, len: usize, mut s: f32) -> f32 {
    for i in len - len % 8..len {
        // SAFETY: i < len.
        unsafe { s = (*a.add(i)).mul_add(half::f16::from_bits(*b.add(i)).to_f32_const(), s) };
    }
    s
}

/// [`dot_lanes`] against f16 keys (raw bits), each eight widened exactly with F16C as they are loaded:
/// the same chains, so the same lanes as against the widened keys.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `a` readable for `len` floats, `b` for `len` halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_lanes_f16(a: *const f32, b: *const u16, len: usize) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= len {
        for (j, c) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= len, so lanes i + 8j .. i + 8j + 8 of both are readable.
            unsafe {
                let k = _mm256_cvtph_ps(_mm_loadu_si128(b.add(i + 8 * j).cast()));
                *c = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i + 8 * j)), k, *c);
            }
        }
        i += 32;
    }
    while i + 8 <= len {
        // SAFETY: i + 8 <= len.
        unsafe {
            acc[0] =
                _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_cvtph_ps(_mm_loadu_si128(b.add(i).cast())), acc[0])
        };
        i += 8;
    }
    _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))
}

/// [`dots_heads_f32`] against keys stored in f16 (raw bits), widened in registers as they are read:
/// every score bit for bit [`dots_heads_f32`]'s against the widened keys, with half the key bytes read
/// and none written.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `q` readable for `heads·len` floats, `keys` for `(n − 1)·
/// stride + len` halves when `n > 0`, `out` writable for `heads·n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dots_heads_f16(
    q: *const f32,
    heads: usize,
    keys: *const u16,
    stride: usize,
    len: usize,
    n: usize,
    out: *mut f32,
) {
    // The caller's contract is the one the macro's unsafe blocks rely on.
    dots_heads_with!(dot_lanes_f16, dot_tail_f16, q, heads, keys, stride, len, n, out)
}

/// The loops of `dots_heads_f32` around a lanes function and its scalar tail (`dot_lanes` and
/// `dot_tail`, the AVX-512 lanes with the same chains, or either against f16 keys), written once for
/// every variant, each of which expands it under its own target features. Expanded in an `unsafe fn`
/// whose contract is [`dots_heads_f32`]'s (with halves for keys where the keys are f16).
macro_rules! dots_heads_with {
    ($lanes:path, $tail:path, $q:expr, $heads:expr, $keys:expr, $stride:expr, $len:expr, $n:expr, $out:expr) => {{
        use $crate::x86_64::avx2::{hsum, hsum8};
        let (q, heads, keys, stride, len, n, out) = ($q, $heads, $keys, $stride, $len, $n, $out);
        let mut j = 0;
        while j + 8 <= n {
            for h in 0..heads {
                // SAFETY: h < heads, so query h's `len` floats are readable.
                let qh = unsafe { q.add(h * len) };
                // A plain loop, not `array::from_fn`: a closure called from a function without these
                // target features is not inlined, and each key would cost a call.
                let mut v = [std::arch::x86_64::_mm256_setzero_ps(); 8];
                for (t, v) in v.iter_mut().enumerate() {
                    // SAFETY: keys j..j + 8 lie within the n the caller made readable.
                    *v = unsafe { $lanes(qh, keys.add((j + t) * stride), len) };
                }
                for (t, s) in hsum8(v).into_iter().enumerate() {
                    // SAFETY: as above; out[h·n + j + t] is writable for h < heads, j + t < n.
                    unsafe { *out.add(h * n + j + t) = $tail(qh, keys.add((j + t) * stride), len, s) };
                }
            }
            j += 8;
        }
        while j < n {
            for h in 0..heads {
                // SAFETY: query h and key j < n are readable and out[h·n + j] writable.
                unsafe {
                    let (qh, key) = (q.add(h * len), keys.add(j * stride));
                    *out.add(h * n + j) = $tail(qh, key, len, hsum($lanes(qh, key, len)));
                }
            }
            j += 1;
        }
    }};
}
pub(crate) use dots_heads_with;

/// Widens eight bf16 (as `u16` bits) to f32.
///
/// # Safety
/// The CPU must support AVX2; `src` readable for 8 `u16`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_bf16x8(src: *const u16) -> __m256 {
    // SAFETY: 16 readable bytes at `src` (caller contract); no alignment requirement.
    let v = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(src.cast()) });
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
}

/// `Σ_i a[i]·b[i]` with `b` in bf16 (raw bits), the same chain structure as [`dot_f32`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a` readable for `len` floats, `b` for `len` `u16`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_bf16(a: *const f32, b: *const u16, len: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= len {
        for (j, c) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= len.
            unsafe { *c = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i + 8 * j)), load_bf16x8(b.add(i + 8 * j)), *c) };
        }
        i += 32;
    }
    while i + 8 <= len {
        // SAFETY: i + 8 <= len.
        unsafe { acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), load_bf16x8(b.add(i)), acc[0]) };
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < len {
        // SAFETY: i < len.
        unsafe { s = (*a.add(i)).mul_add(f32::from_bits(u32::from(*b.add(i)) << 16), s) };
        i += 1;
    }
    s
}

/// `y[i] += alpha·x[i]` with FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `x` readable and `y` writable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn axpy(alpha: f32, x: *const f32, y: *mut f32, len: usize) {
    let a = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: i + 8 <= len.
        unsafe { _mm256_storeu_ps(y.add(i), _mm256_fmadd_ps(a, _mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(y.add(i)))) };
        i += 8;
    }
    while i < len {
        // SAFETY: i < len.
        unsafe { *y.add(i) = alpha.mul_add(*x.add(i), *y.add(i)) };
        i += 1;
    }
}
