//! AVX-512 kernels: the W4A16 decode GEMV (AVX-512 F/BW/VL) and the W4A16 prefill's bf16 GEMM
//! (AVX512-BF16 `vdpbf16ps`).
//!
//! **Decode.** A tinygemm layout stores neighbouring lane groups side by side for every input channel (any
//! block width, tails included): lane groups `h` and `h + 1` are sixteen contiguous bytes, and the four
//! lane groups of a 64-channel block are 32. So one zero-extending load of sixteen bytes gives sixteen
//! dwords holding 32 codes (two lane groups), and a full 64-channel block takes two such loads per input
//! channel, each byte read once. On Zen 4, whose 512-bit units are two 256-bit halves, this is about as
//! fast per weight as the AVX2 kernel in cache (the same instruction count per weight), and faster on
//! weights streamed from memory (the measurements are in `docs/perf.md`); on cores with full-width 512-bit
//! units it does twice the work per instruction. With AVX512-BF16, [`decode_block_bf16`] takes a full
//! 64-channel block with half the instructions per weight: codes become bf16 `128 + q` with an OR, and
//! `vdpbf16ps` multiplies two input channels per lane against bf16 activations.
//!
//! **Prefill.** The panels the AVX2 prefill dequantizes (exact f32 weights, straight from the packed layout)
//! are rounded to bf16 pairs and multiplied against bf16 activations by `vdpbf16ps`, two products per lane
//! per instruction: twice the f32 FMA rate.
//!
//! **Safety model.** As in [`super::avx2`]: every function is an `unsafe fn` with `#[target_feature]`,
//! callable only while holding the matching token ([`crate::isa::Avx512`], [`crate::isa::Avx512Bf16`]),
//! checked on the live CPU at run time, with the pointer ranges its `# Safety` section lists checked by the
//! safe drivers in [`crate::w4a16`] and [`crate::gemm`].

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// How far ahead of its reads the `vdpbf16ps` decode prefetches a block's codes: 1 KiB, 16 input-channel
/// pairs. With weights coming from memory (a model's layers evict each other), the hardware prefetcher
/// alone left four-row decode waiting on loads: from memory, M = 4 cost 1.6–1.9× M = 1 without it and
/// 1.2–1.6× with it (`kernel-table --memory-only`, alternated); M = 1 and cache-resident weights do not
/// move. A prefetch never faults, so running past the block's end is harmless.
const DECODE_PREFETCH_BYTES: usize = 1024;

/// How far ahead a decode prefetches its group parameters, in passes: a pass over `w` lane groups reads
/// their `w` parameter tables side by side, `w` streams of a few lines each that the hardware prefetcher
/// does not follow far enough ahead when the weights come from memory.
const PARAMS_PREFETCH_PASSES: usize = 2;

/// At group `g` of a pass over `w` lane groups whose parameter tables (`groups·32` floats each) start at
/// `sz0`, prefetches the `g`-th `w·32` floats of the tables the pass [`PARAMS_PREFETCH_PASSES`] ahead
/// reads, a line at a time: in address order, so that over its `groups` groups a pass requests the whole
/// of that pass's tables. [`crate::w4a16`] lays the lane groups' tables out one after another, so the next
/// pass's start `w·groups·32` floats on; were they elsewhere, only the prefetch would be wasted. A
/// prefetch never faults: running past the tables is harmless.
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_params_ahead(sz0: *const f32, w: usize, groups: usize, g: usize) {
    let ahead = sz0.wrapping_add(w * 32 * (groups * PARAMS_PREFETCH_PASSES + g));
    for line in (0..w * 32).step_by(16) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
    }
}

/// W4A16 decode for `MR` rows of `C` side-by-side pairs of lane groups (`C` = 1 or 2: two or four lane
/// groups), or of one lane group alone (`HALF`, with `C` = 1):
///
/// `tile[r][j] = Σ_g s·Σ_{k∈g} x[r][k]·q + (z − 8s)·xs[r][g]`, which is `Σ_k x·((q − 8)·s + z)`.
///
/// Per input channel and pair, one load of sixteen bytes widened to sixteen dwords; a mask and a shift give
/// the low and high codes, converted to f32. Registers: for pair `c`, `acc[c][0]` holds `[lane group 2c's
/// low-nibble lanes | 2c + 1's]`, `acc[c][1]` their high-nibble lanes. `U` independent accumulator sets
/// take input channels in turn within a group (the last `len mod U` go to set 0), so that enough FMA
/// chains are in flight for one row. At the end of a group the sets are summed in set order, then
/// `tot = fma(s, acc, tot)`, `tot = fma(z − 8s, xs, tot)`: per lane, with `U = 1`, the AVX2 kernel's
/// arithmetic exactly.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA. For every `r < MR` and `kk < k`,
/// `x.add(r·ldx + kk)` must be readable; `xs.add(r·groups + g)` readable for every group
/// `g < ceil(k/g_len)`; `bytes.add(kk·stride + 16·C − 1)` readable for every `kk < k` (`bytes.add(kk·stride
/// + 7)` with `HALF`); `sz[i].add(g·32 + 31)` readable for every group and every lane group `i < 2C`
/// (`i < 1` with `HALF`); `tiles[i].add(r·16 + 15)` writable for every `r < MR` and the same `i`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn decode_lanes<const MR: usize, const U: usize, const C: usize, const HALF: bool>(
    x: *const f32,
    ldx: usize,
    xs: *const f32,
    bytes: *const u8,
    stride: usize,
    sz: [*const f32; 4],
    k: usize,
    g_len: usize,
    tiles: [*mut f32; 4],
) {
    let mask = _mm512_set1_epi32(0xF);
    let groups = k.div_ceil(g_len);
    // Pair c's codes at input channel kk: low and high, as f32.
    let codes = |kk: usize, c: usize| -> (__m512, __m512) {
        // SAFETY: kk < k and c < C (every caller below), so the caller's contract makes 16 bytes (8 with
        // HALF) readable at kk·stride + 16c; the loads read exactly that many, unaligned.
        let v = unsafe {
            let p = bytes.add(kk * stride + 16 * c);
            _mm512_cvtepu8_epi32(if HALF { _mm_loadl_epi64(p.cast()) } else { _mm_loadu_si128(p.cast()) })
        };
        (_mm512_cvtepi32_ps(_mm512_and_si512(v, mask)), _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(v)))
    };
    let mut tot = [[[_mm512_setzero_ps(); 2]; C]; MR];
    let width = if HALF { 1 } else { 2 * C };
    for g in 0..groups {
        prefetch_params_ahead(sz[0], width, groups, g);
        let k0 = g * g_len;
        let k1 = (k0 + g_len).min(k);
        let mut acc = [[[[_mm512_setzero_ps(); 2]; C]; MR]; U];
        let step = |kk: usize, set: &mut [[[__m512; 2]; C]; MR]| {
            for c in 0..C {
                let (wlo, whi) = codes(kk, c);
                for (r, a) in set.iter_mut().enumerate() {
                    // SAFETY: r < MR and kk < k: x[r·ldx + kk] is readable (caller contract).
                    let xb = _mm512_set1_ps(unsafe { *x.add(r * ldx + kk) });
                    a[c][0] = _mm512_fmadd_ps(wlo, xb, a[c][0]);
                    a[c][1] = _mm512_fmadd_ps(whi, xb, a[c][1]);
                }
            }
        };
        let mut kk = k0;
        while kk + U <= k1 {
            for (u, set) in acc.iter_mut().enumerate() {
                step(kk + u, set);
            }
            kk += U;
        }
        while kk < k1 {
            step(kk, &mut acc[0]);
            kk += 1;
        }
        // SAFETY: this function's features include AVX-512F.
        let sum = unsafe { sum_sets(&acc) };
        // SAFETY: the caller's contract covers what `group_epilogue` reads for group g.
        unsafe { group_epilogue::<MR, C, HALF>(sz, g, xs, groups, 8.0, &sum, &mut tot) };
    }
    // SAFETY: the caller's contract covers the rows `store_tiles` writes.
    unsafe { store_tiles::<MR, C, HALF>(&tot, tiles) };
}

/// bf16 bits of `128.0`: OR-ing a 4-bit code `q` into the low mantissa bits gives `128 + q` exactly (eight
/// significant bits), the cheapest way from a nibble to a bf16.
pub const BF16_CODE_BIAS: f32 = 128.0;

/// Word order pairing sixteen channels' codes at input channels `kk` (words 0..32 of the first source) and
/// `kk + 1` (the second source): word `2j` is channel `16h + j` at `kk`, word `2j + 1` the same channel at
/// `kk + 1`.
const fn pair_codes(h: u16) -> [u16; 32] {
    let mut idx = [0u16; 32];
    let mut j = 0;
    while j < 16 {
        idx[2 * j] = 16 * h + j as u16;
        idx[2 * j + 1] = 32 + 16 * h + j as u16;
        j += 1;
    }
    idx
}

/// `vpermb` byte indices into the 64 code bytes of input channels kk, kk + 1 that put block half `h`'s
/// channel pairs in the low bytes of words: byte `4j` takes byte `16h + j` (kk), byte `4j + 2` byte
/// `32 + 16h + j` (kk + 1). The odd bytes (each word's high byte) take byte 0; the decode keeps only the
/// low byte's nibbles.
const fn pair_bytes(h: u8) -> [u8; 64] {
    let mut idx = [0u8; 64];
    let mut j = 0;
    while j < 16 {
        idx[4 * j] = 16 * h + j as u8;
        idx[4 * j + 2] = 32 + 16 * h + j as u8;
        j += 1;
    }
    idx
}

/// W4A16 decode for `MR` rows of one full 64-channel tinygemm block (four lane groups, 32 bytes per input
/// channel at `bytes + kk·32`), with bf16 activations and `vdpbf16ps`:
///
/// `tile[r][j] = Σ_g s·Σ_{k∈g} xb[r][k]·(128 + q) + (z − 136·s)·xs[r][g]`, which is `Σ_k xb·((q − 8)·s + z)`
/// with `xs` the group sums of the bf16 activations `xb`.
///
/// Per pair of input channels, the two rows' 32 code bytes are widened to words and interleaved into
/// channel pairs (`vpermt2w`, two per block); one ternary-logic op then makes each word the bf16 of
/// `128 + q` for the low nibble, and a shift and another for the high nibble: four vectors of sixteen bf16
/// pairs for 128 weights, each multiplied by the row's broadcast activation pair in one `vdpbf16ps`. The
/// products are exact in f32 (8-bit significands); the sums are f32. Registers as in [`decode_lanes`]
/// with `C` = 2. `U` independent accumulator sets take pairs in turn within a group; a group's odd last
/// input channel (only where `k` or the group length is odd) pairs with zero.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX512-BF16. For every `r < MR`, `xb.add(r·ldx + p)` must be
/// readable for every pair `p < ceil(k/2)`, and `xs.add(r·groups + g)` for every group
/// `g < ceil(k/g_len)`; `bytes.add(kk·32 + 31)` readable for every `kk < k`; `sz[i].add(g·32 + 31)`
/// readable for every group and `i < 4`; `tiles[i].add(r·16 + 15)` writable for every `r < MR`, `i < 4`.
/// `g_len` must be even unless it is `k` (one group).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn decode_block_bf16<const MR: usize, const U: usize>(
    xb: *const u32,
    ldx: usize,
    xs: *const f32,
    bytes: *const u8,
    sz: [*const f32; 4],
    k: usize,
    g_len: usize,
    tiles: [*mut f32; 4],
) {
    // SAFETY: this function's features and the caller's contract are `decode_block_bf16_with`'s.
    unsafe { decode_block_bf16_with::<MR, U, false>(xb, ldx, xs, bytes, sz, k, g_len, tiles) }
}

/// [`decode_block_bf16`] with the codes paired by one `vpermb` per 64 weights instead of two widening
/// loads and two `vpermt2w` per 128: the same pairs, so the same bits, in fewer shuffles (M = 1 in cache
/// on Zen 4: 15–20% less time per weight).
///
/// # Safety
/// As [`decode_block_bf16`], and the CPU must support AVX512-VBMI.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
pub unsafe fn decode_block_bf16_vbmi<const MR: usize, const U: usize>(
    xb: *const u32,
    ldx: usize,
    xs: *const f32,
    bytes: *const u8,
    sz: [*const f32; 4],
    k: usize,
    g_len: usize,
    tiles: [*mut f32; 4],
) {
    // SAFETY: this function's features (VBMI included) and the caller's contract are
    // `decode_block_bf16_with`'s for `VBMI = true`.
    unsafe { decode_block_bf16_with::<MR, U, true>(xb, ldx, xs, bytes, sz, k, g_len, tiles) }
}

/// Block half `c`'s channel pairs of the 64 code bytes at `p` (input channels kk, kk + 1), by `vpermb`
/// with the byte indices of [`pair_bytes`]: the low byte of word `2j` of half `c` is byte `16c + j` of kk,
/// that of word `2j + 1` byte `16c + j` of kk + 1; the high bytes are left over (the caller masks them).
/// With `two` false only kk's 32 bytes are read and kk + 1's bytes are zero.
///
/// # Safety
/// The CPU must support AVX-512 F/BW and AVX512-VBMI; `p` must be readable for 64 bytes (32 unless `two`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair_codes_vbmi(p: *const u8, two: bool, idx: &[__m512i; 2]) -> [__m512i; 2] {
    // SAFETY: the caller makes 64 bytes readable at p (32 unless `two`); the masked load reads only the
    // first 32 and never faults on the rest.
    let v = unsafe { if two { _mm512_loadu_si512(p.cast()) } else { _mm512_maskz_loadu_epi8(0xFFFF_FFFF, p.cast()) } };
    idx.map(|ix| _mm512_permutexvar_epi8(ix, v))
}

/// The body of both bf16 decodes; `VBMI` picks how the codes are paired.
///
/// # Safety
/// As [`decode_block_bf16`]; with `VBMI`, the CPU must also support AVX512-VBMI.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn decode_block_bf16_with<const MR: usize, const U: usize, const VBMI: bool>(
    xb: *const u32,
    ldx: usize,
    xs: *const f32,
    bytes: *const u8,
    sz: [*const f32; 4],
    k: usize,
    g_len: usize,
    tiles: [*mut f32; 4],
) {
    let nibble = _mm512_set1_epi32(0x000F_000F);
    let bias = _mm512_set1_epi32(0x4300_4300);
    let idx = if VBMI {
        [pair_bytes(0), pair_bytes(1)].map(|i| {
            // SAFETY: a 64-byte array read unaligned.
            unsafe { _mm512_loadu_si512(i.as_ptr().cast()) }
        })
    } else {
        [pair_codes(0), pair_codes(1)].map(|i| {
            // SAFETY: a 64-byte array read unaligned.
            unsafe { _mm512_loadu_si512(i.as_ptr().cast()) }
        })
    };
    let groups = k.div_ceil(g_len);
    // The bf16 weight pairs of block half `c` (lane groups 2c, 2c + 1) at input channels kk and kk + 1
    // (`two`), or kk alone paired with zero.
    let codes = |kk: usize, two: bool| -> [[__m512bh; 2]; 2] {
        _mm_prefetch::<_MM_HINT_T0>(bytes.wrapping_add(kk * 32 + DECODE_PREFETCH_BYTES).cast());
        let pairs = if VBMI {
            // SAFETY: `VBMI` is true only in `decode_block_bf16_vbmi`, whose caller proved AVX512-VBMI;
            // kk < k (and kk + 1 < k when `two`), so 32 bytes at kk·32 (and the next 32) are readable.
            unsafe { pair_codes_vbmi(bytes.add(kk * 32), two, &idx) }
        } else {
            // SAFETY: kk < k (and kk + 1 < k when `two`): 32 bytes at kk·32 (and the next 32) are readable.
            let (a, b) = unsafe {
                let p = bytes.add(kk * 32);
                let a = _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.cast()));
                let b = if two {
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.add(32).cast()))
                } else {
                    _mm512_setzero_si512()
                };
                (a, b)
            };
            idx.map(|ix| _mm512_permutex2var_epi16(a, ix, b))
        };
        pairs.map(|pairs| {
            // (pairs & 0xF) | 0x4300 per word, which also drops whatever the permute left in the high byte:
            // 0xEA is `(A & B) | C`.
            let lo = _mm512_ternarylogic_epi32::<0xEA>(pairs, nibble, bias);
            let hi = _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<4>(pairs), nibble, bias);
            [bh512(lo), bh512(hi)]
        })
    };
    let mut tot = [[[_mm512_setzero_ps(); 2]; 2]; MR];
    for g in 0..groups {
        prefetch_params_ahead(sz[0], 4, groups, g);
        let k0 = g * g_len;
        let k1 = (k0 + g_len).min(k);
        let mut acc = [[[[_mm512_setzero_ps(); 2]; 2]; MR]; U];
        let step = |kk: usize, two: bool, set: &mut [[[__m512; 2]; 2]; MR]| {
            let w = codes(kk, two);
            for (r, a) in set.iter_mut().enumerate() {
                // SAFETY: r < MR and kk/2 < ceil(k/2): the pair is readable (caller contract).
                let xv = bh512(_mm512_set1_epi32(unsafe { *xb.add(r * ldx + kk / 2) } as i32));
                for c in 0..2 {
                    a[c][0] = _mm512_dpbf16_ps(a[c][0], w[c][0], xv);
                    a[c][1] = _mm512_dpbf16_ps(a[c][1], w[c][1], xv);
                }
            }
        };
        let mut kk = k0;
        while kk + 2 * U <= k1 {
            for (u, set) in acc.iter_mut().enumerate() {
                step(kk + 2 * u, true, set);
            }
            kk += 2 * U;
        }
        while kk + 2 <= k1 {
            step(kk, true, &mut acc[0]);
            kk += 2;
        }
        if kk < k1 {
            step(kk, false, &mut acc[0]);
        }
        // SAFETY: this function's features include AVX-512F.
        let sum = unsafe { sum_sets(&acc) };
        // SAFETY: the caller's contract covers what `group_epilogue` reads for group g.
        unsafe { group_epilogue::<MR, 2, false>(sz, g, xs, groups, BF16_CODE_BIAS + 8.0, &sum, &mut tot) };
    }
    // SAFETY: the caller's contract covers the rows `store_tiles` writes.
    unsafe { store_tiles::<MR, 2, false>(&tot, tiles) };
}

/// The f32 GEMM microkernel on 512-bit registers: `MR` activation rows against `P` lane groups' panels
/// (`panels[i]`: `[kc][16]` f32), accumulated into their tiles (`tiles[i]`: `[MR][16]`, read then written;
/// with `from_zero` only written, the sums starting from zero). The activations are packed
/// row-interleaved, `a[p·S + r]` row `r`'s input channel `p`, so every row's broadcast comes from one
/// pointer at a fixed displacement. Each output is `tile + Σ_p a·panel` as one fused multiply-add chain
/// over `p` in order — the AVX2 microkernel's chain, so its bits.
///
/// # Safety
/// The CPU must support AVX-512F. `a.add(p·S + r)` readable for `r < MR`, `p < kc`; `panels[i].add(p·16
/// + 15)` readable for `p < kc`, `i < P`; `tiles[i].add(r·16 + 15)` writable (and readable unless
/// `from_zero`) for `r < MR`, `i < P`, the tiles not overlapping.
#[target_feature(enable = "avx512f")]
pub unsafe fn gemm_microkernel_f32<const MR: usize, const P: usize, const S: usize>(
    kc: usize,
    a: *const f32,
    panels: [*const f32; P],
    tiles: [*mut f32; P],
    from_zero: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); P]; MR];
    for (r, row) in acc.iter_mut().enumerate().filter(|_| !from_zero) {
        for (c, t) in row.iter_mut().zip(&tiles) {
            // SAFETY: r < MR: row r of each tile is readable (caller contract).
            *c = unsafe { _mm512_loadu_ps(t.add(r * 16)) };
        }
    }
    for p in 0..kc {
        // SAFETY: p < kc: row p of each panel is readable (caller contract).
        let b: [__m512; P] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(panels[i].add(p * 16)) });
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR, p < kc: a[p·S + r] is readable (caller contract).
            let ab = _mm512_set1_ps(unsafe { *a.add(p * S + r) });
            for (c, bv) in row.iter_mut().zip(&b) {
                *c = _mm512_fmadd_ps(ab, *bv, *c);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, t) in row.iter().zip(&tiles) {
            // SAFETY: r < MR: row r of each tile is writable (caller contract).
            unsafe { _mm512_storeu_ps(t.add(r * 16), *c) };
        }
    }
}

/// The `U` accumulator sets of a decode kernel summed in set order.
///
/// # Safety
/// The CPU must support AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sum_sets<const MR: usize, const C: usize, const U: usize>(
    acc: &[[[[__m512; 2]; C]; MR]; U],
) -> [[[__m512; 2]; C]; MR] {
    let mut sum = acc[0];
    for set in &acc[1..] {
        for (sr, ar) in sum.iter_mut().zip(set) {
            for (sc, ac) in sr.iter_mut().zip(ar) {
                sc[0] = _mm512_add_ps(sc[0], ac[0]);
                sc[1] = _mm512_add_ps(sc[1], ac[1]);
            }
        }
    }
    sum
}

/// A decode kernel's end of group `g`, for the group's scales `s` and zeros `z` of each lane:
/// `tot = fma(s, sum, tot)` then `tot = fma(z − o·s, xs, tot)`. The kernel summed `x·c` for codes
/// `c = q + o − 8`, so `s·c + (z − o·s) = (q − 8)·s + z`: `o` is 8 for the f32 kernel's raw codes `q`, and
/// `128 + 8` for the bf16 kernel's `128 + q`.
///
/// # Safety
/// AVX-512F must be enabled. `sz[2c].add(g·32 + 31)` must be readable for every `c < C`, and
/// `sz[2c + 1]`'s too unless `HALF`; `xs.add(r·groups + g)` for every `r < MR`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn group_epilogue<const MR: usize, const C: usize, const HALF: bool>(
    sz: [*const f32; 4],
    g: usize,
    xs: *const f32,
    groups: usize,
    offset: f32,
    sum: &[[[__m512; 2]; C]; MR],
    tot: &mut [[[__m512; 2]; C]; MR],
) {
    // SAFETY: every pointer read below is in the ranges of this function's contract.
    unsafe {
        let offset = _mm512_set1_ps(offset);
        for c in 0..C {
            // `[lane group 2c's eight | 2c + 1's]` of one of the four parameter rows (s_lo, s_hi, z_lo,
            // z_hi); with HALF the upper half repeats the first and is never stored.
            let params = |row: usize| -> __m512 {
                let pa = _mm512_castps256_ps512(_mm256_loadu_ps(sz[2 * c].add(g * 32 + 8 * row)));
                let pb = if HALF {
                    pa
                } else {
                    _mm512_castps256_ps512(_mm256_loadu_ps(sz[2 * c + 1].add(g * 32 + 8 * row)))
                };
                _mm512_shuffle_f32x4::<0b01_00_01_00>(pa, pb)
            };
            let (s_lo, s_hi) = (params(0), params(1));
            let (z_lo, z_hi) = (_mm512_fnmadd_ps(offset, s_lo, params(2)), _mm512_fnmadd_ps(offset, s_hi, params(3)));
            for (r, (t, a)) in tot.iter_mut().zip(sum).enumerate() {
                let xsum = _mm512_set1_ps(*xs.add(r * groups + g));
                t[c][0] = _mm512_fmadd_ps(z_lo, xsum, _mm512_fmadd_ps(s_lo, a[c][0], t[c][0]));
                t[c][1] = _mm512_fmadd_ps(z_hi, xsum, _mm512_fmadd_ps(s_hi, a[c][1], t[c][1]));
            }
        }
    }
}

/// Writes a decode kernel's totals: lane group 2c's tile row is `[lo lanes 0..8 | hi lanes 0..8]`, 2c + 1's
/// the upper eights (not written with `HALF`).
///
/// # Safety
/// AVX-512F must be enabled. `tiles[2c].add(r·16 + 15)` must be writable for every `r < MR`, `c < C`, and
/// `tiles[2c + 1]`'s too unless `HALF`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_tiles<const MR: usize, const C: usize, const HALF: bool>(
    tot: &[[[__m512; 2]; C]; MR],
    tiles: [*mut f32; 4],
) {
    for (r, t) in tot.iter().enumerate() {
        for (c, tc) in t.iter().enumerate() {
            // SAFETY: the rows are writable (this function's contract).
            unsafe {
                _mm512_storeu_ps(tiles[2 * c].add(r * 16), _mm512_shuffle_f32x4::<0b01_00_01_00>(tc[0], tc[1]));
                if !HALF {
                    _mm512_storeu_ps(tiles[2 * c + 1].add(r * 16), _mm512_shuffle_f32x4::<0b11_10_11_10>(tc[0], tc[1]));
                }
            }
        }
    }
}

/// The bits of 32 bf16 as an integer vector.
#[inline]
fn bits512(v: __m512bh) -> __m512i {
    // SAFETY: both are 64-byte plain SIMD values for which every bit pattern is valid.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// The bits of 16 bf16 as an integer vector.
#[inline]
fn bits256(v: __m256bh) -> __m256i {
    // SAFETY: both are 32-byte plain SIMD values for which every bit pattern is valid.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(v) }
}

/// An integer vector's bits as 32 bf16.
#[inline]
fn bh512(v: __m512i) -> __m512bh {
    // SAFETY: both are 64-byte plain SIMD values for which every bit pattern is valid.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// Word order that interleaves two rows of sixteen bf16 (words 0..16 and 16..32) into sixteen pairs.
const INTERLEAVE: [u16; 32] = {
    let mut idx = [0u16; 32];
    let mut j = 0;
    while j < 16 {
        idx[2 * j] = j as u16;
        idx[2 * j + 1] = 16 + j as u16;
        j += 1;
    }
    idx
};

/// Rounds an f32 panel `[kc][16]` to bf16 (round to nearest even, as `vcvtne2ps2bf16` does: denormals
/// flushed to zero, NaN quieted) and writes it as `vdpbf16ps` reads a B operand: `[ceil(kc/2)][16][2]`,
/// lane `j` of pair `p` holding input channels `2p` and `2p + 1`; after an odd last channel, a zero.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX512-BF16. `panel` must be readable for `kc·16` floats and
/// `out` writable for `ceil(kc/2)·32` u16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn pack_bf16_pairs(panel: *const f32, kc: usize, out: *mut u16) {
    // SAFETY: INTERLEAVE is 64 readable bytes.
    let idx = unsafe { _mm512_loadu_si512(INTERLEAVE.as_ptr().cast()) };
    for p in 0..kc.div_ceil(2) {
        // SAFETY: 2p < kc, so row 2p is readable; row 2p + 1 is read only when it exists (caller contract).
        let (even, odd) = unsafe {
            let e = _mm512_loadu_ps(panel.add(2 * p * 16));
            let o = if 2 * p + 1 < kc { _mm512_loadu_ps(panel.add((2 * p + 1) * 16)) } else { _mm512_setzero_ps() };
            (e, o)
        };
        // Words 0..16 are the even channel's lanes, 16..32 the odd one's.
        let both = bits512(_mm512_cvtne2ps_pbh(odd, even));
        // SAFETY: p < ceil(kc/2): out[p·32 .. p·32 + 32] is writable (caller contract).
        unsafe { _mm512_storeu_si512(out.add(p * 32).cast(), _mm512_permutexvar_epi16(idx, both)) };
    }
}

/// Rounds `len` floats to bf16 (as [`pack_bf16_pairs`] does) into `out`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX512-BF16. `x` readable and `out` writable for `len`
/// elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn to_bf16(x: *const f32, len: usize, out: *mut u16) {
    let mut i = 0;
    while i + 16 <= len {
        // SAFETY: i + 16 <= len: 16 floats readable and 16 u16 writable (caller contract).
        unsafe {
            let v = bits256(_mm512_cvtneps_pbh(_mm512_loadu_ps(x.add(i))));
            _mm256_storeu_si256(out.add(i).cast(), v);
        }
        i += 16;
    }
    if i < len {
        let mask: __mmask16 = (1u16 << (len - i)) - 1;
        // SAFETY: the masked load reads and the masked store writes only the len − i remaining elements.
        unsafe {
            let v = bits256(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x.add(i))));
            _mm256_mask_storeu_epi16(out.add(i).cast(), mask, v);
        }
    }
}

/// The bf16 GEMM microkernel over `L` lane groups (1 or 2) at once: `tile_l[r][0..16] += Σ_p
/// a[r][p]·panel_l[p]` for `r < MR`, `p < kp`, where `a[r][p]` is a pair of bf16 activations (one u32)
/// and `panel_l[p]` sixteen lanes of bf16 weight pairs, by `vdpbf16ps` (per lane: both products, exact in
/// f32, summed with the accumulator; denormals flushed), pairs in K order. Two lane groups share each
/// activation broadcast.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and AVX512-BF16. `a.add(r·lda + p)` readable for `r < MR`,
/// `p < kp`; `panels[l].add(p·32 + 31)` readable for `p < kp`, `l < L`; `tiles[l].add(r·16 + 15)`
/// readable and writable for `r < MR`, `l < L`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn gemm_microkernel_bf16<const MR: usize, const L: usize>(
    kp: usize,
    a: *const u32,
    lda: usize,
    panels: [*const u16; L],
    tiles: [*mut f32; L],
) {
    let mut acc = [[_mm512_setzero_ps(); L]; MR];
    for (r, c) in acc.iter_mut().enumerate() {
        for (l, cl) in c.iter_mut().enumerate() {
            // SAFETY: r < MR, l < L: tile l's row r is readable (caller contract).
            *cl = unsafe { _mm512_loadu_ps(tiles[l].add(r * 16)) };
        }
    }
    for p in 0..kp {
        // SAFETY: p < kp: pair p (64 bytes) of every panel is readable (caller contract).
        let b: [__m512bh; L] =
            std::array::from_fn(|l| bh512(unsafe { _mm512_loadu_si512(panels[l].add(p * 32).cast()) }));
        for (r, c) in acc.iter_mut().enumerate() {
            // SAFETY: r < MR, p < kp: a[r·lda + p] is readable (caller contract).
            let av = bh512(_mm512_set1_epi32(unsafe { *a.add(r * lda + p) } as i32));
            for (cl, bl) in c.iter_mut().zip(&b) {
                *cl = _mm512_dpbf16_ps(*cl, av, *bl);
            }
        }
    }
    for (r, c) in acc.iter().enumerate() {
        for (l, cl) in c.iter().enumerate() {
            // SAFETY: r < MR, l < L: tile l's row r is writable (caller contract).
            unsafe { _mm512_storeu_ps(tiles[l].add(r * 16), *cl) };
        }
    }
}

/// The AVX2 dot product's eight lanes, `(c0 + c1) + (c2 + c3)`, from its chains held on 512 bits: `c0`
/// (the low half of `c01`, with any partial step added), the high half of `c01` (`c1`) and the two halves
/// of `c23`. Every 512-bit lanes function ends here, so they all combine their chains in one order.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn combined_lanes(c0: __m256, c01: __m512, c23: __m512) -> __m256 {
    let high = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm256_add_ps(c0, high(c01)), _mm256_add_ps(_mm512_castps512_ps256(c23), high(c23)))
}

/// [`super::avx2::dot_f32`]'s lanes before the horizontal sum, sixteen floats per FMA: its chains `c0, c1`
/// are the halves of one 512-bit accumulator and `c2, c3` of another (a 512-bit load of sixteen floats is
/// the two 8-float loads of `c0` and `c1`), the last partial 32-float step goes to `c0` eight at a time,
/// and the halves combine as `(c0 + c1) + (c2 + c3)`: the same roundings, so the same bits.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA; `a` and `b` readable for `len` floats.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dot_lanes_f32(a: *const f32, b: *const f32, len: usize) -> __m256 {
    let (mut c01, mut c23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i + 32 <= len {
        // SAFETY: i + 32 <= len, so floats i..i + 32 of both are readable.
        unsafe {
            c01 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)), c01);
            c23 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i + 16)), _mm512_loadu_ps(b.add(i + 16)), c23);
        }
        i += 32;
    }
    let mut c0 = _mm512_castps512_ps256(c01);
    while i + 8 <= len {
        // SAFETY: i + 8 <= len.
        unsafe { c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), c0) };
        i += 8;
    }
    combined_lanes(c0, c01, c23)
}

/// [`super::avx2::dots_heads_f32`] with sixteen floats per FMA: every score bit for bit the AVX2 one.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA; `q` readable for `heads·len` floats, `keys` for `(n − 1)·
/// stride + len` floats when `n > 0`, `out` writable for `heads·n`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn dots_heads_f32(
    q: *const f32,
    heads: usize,
    keys: *const f32,
    stride: usize,
    len: usize,
    n: usize,
    out: *mut f32,
) {
    // The caller's contract is the one the macro's unsafe blocks rely on (`super::avx2::dots_heads_f32`'s).
    super::avx2::dots_heads_with!(dot_lanes_f32, super::avx2::dot_tail, q, heads, keys, stride, len, n, out)
}

/// [`dot_lanes_f32`] against f16 keys (raw bits), widened exactly as they are loaded (sixteen with
/// `vcvtph2ps` on 512 bits, eight in the last partial step): the same chains, the same lanes as against
/// the widened keys.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `a` readable for `len` floats, `b` for `len` halves.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_lanes_f16(a: *const f32, b: *const u16, len: usize) -> __m256 {
    // SAFETY: one head, `a`, readable for `len` floats; `b` for `len` halves (this function's contract).
    let [lanes] = unsafe { dot_lanes_f16_heads::<1>(a, 0, b, len) };
    lanes
}

/// [`dot_lanes_f16`] of `CH` query heads (`q + h·q_stride`) against one key, the key widened once for
/// all of them: each head's chains are those of one head alone (which is what [`dot_lanes_f16`] runs), so
/// each head's lanes are bit for bit its own call's.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `q + h·q_stride` readable for `len` floats for every
/// `h < CH`, `b` for `len` halves.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_lanes_f16_heads<const CH: usize>(
    q: *const f32,
    q_stride: usize,
    b: *const u16,
    len: usize,
) -> [__m256; CH] {
    let (mut c01, mut c23) = ([_mm512_setzero_ps(); CH], [_mm512_setzero_ps(); CH]);
    let mut i = 0;
    while i + 32 <= len {
        // SAFETY: i + 32 <= len, so values i..i + 32 of the key and of every head's query are readable.
        unsafe {
            let (k0, k1) = (
                _mm512_cvtph_ps(_mm256_loadu_si256(b.add(i).cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(b.add(i + 16).cast())),
            );
            for h in 0..CH {
                let a = q.add(h * q_stride);
                c01[h] = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i)), k0, c01[h]);
                c23[h] = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i + 16)), k1, c23[h]);
            }
        }
        i += 32;
    }
    let mut c0 = [_mm256_setzero_ps(); CH];
    for h in 0..CH {
        c0[h] = _mm512_castps512_ps256(c01[h]);
    }
    while i + 8 <= len {
        // SAFETY: i + 8 <= len.
        unsafe {
            let k = _mm256_cvtph_ps(_mm_loadu_si128(b.add(i).cast()));
            for (h, c0) in c0.iter_mut().enumerate() {
                *c0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(h * q_stride + i)), k, *c0);
            }
        }
        i += 8;
    }
    let mut lanes = [_mm256_setzero_ps(); CH];
    for h in 0..CH {
        lanes[h] = combined_lanes(c0[h], c01[h], c23[h]);
    }
    lanes
}

/// [`super::avx2::dots_heads_f16`] with sixteen values per FMA: every score bit for bit
/// [`dots_heads_f32`]'s against the widened keys. Up to four query heads at a time share each key's
/// widening ([`dot_lanes_f16_heads`]); a group of up to three heads of 64 values or two of 128 runs in one
/// pass with its queries in registers ([`dots_heads_f16_held`]). Eight keys' lanes are summed horizontally
/// at a time, as in [`dots_heads_f32`].
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `q` readable for `heads·len` floats, `keys` for
/// `(n − 1)·stride + len` halves when `n > 0`, `out` writable for `heads·n`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn dots_heads_f16(
    q: *const f32,
    heads: usize,
    keys: *const u16,
    stride: usize,
    len: usize,
    n: usize,
    out: *mut f32,
) {
    // A group of up to three heads of 64 values, or two of 128 (SmolLM2's and many small models'), runs in
    // one pass with its queries held in registers ([`dots_heads_f16_held`]); any other group runs the
    // general loop, four heads a pass, which loads each query again for every key. (Holding more heads
    // would not fit the registers, and two held passes would read the keys twice.)
    type Held = unsafe fn(*const f32, *const u16, usize, usize, *mut f32);
    let held: Option<Held> = match (len, heads) {
        (64, 3) => Some(dots_heads_f16_held::<3, 4>),
        (64, 2) => Some(dots_heads_f16_held::<2, 4>),
        (64, 1) => Some(dots_heads_f16_held::<1, 4>),
        (128, 2) => Some(dots_heads_f16_held::<2, 8>),
        (128, 1) => Some(dots_heads_f16_held::<1, 8>),
        _ => None,
    };
    if let Some(held) = held {
        // SAFETY: the variant matched is for `heads` heads of `len` values (its `CH` and `16·Q`); the rest
        // is this function's contract.
        unsafe { held(q, keys, stride, n, out) };
        return;
    }
    let mut h0 = 0;
    while h0 < heads {
        let ch = (heads - h0).min(4);
        // SAFETY: heads h0..h0 + ch, h0 + ch ≤ heads: their queries are readable and their rows of `out` writable
        // (this function's contract).
        unsafe {
            let (q, out) = (q.add(h0 * len), out.add(h0 * n));
            match ch {
                4 => dots_heads_f16_chunk::<4>(q, keys, stride, len, n, out),
                3 => dots_heads_f16_chunk::<3>(q, keys, stride, len, n, out),
                2 => dots_heads_f16_chunk::<2>(q, keys, stride, len, n, out),
                _ => dots_heads_f16_chunk::<1>(q, keys, stride, len, n, out),
            }
        }
        h0 += ch;
    }
}

/// [`dots_heads_f16_chunk`] for `CH` heads of `16·Q` values (`Q` even), each head's query held in `Q`
/// registers for every key: the same chains and lanes as [`dot_lanes_f16_heads`] (`Q/2` steps of 32
/// values, no partial step), so the same bits. Eight keys' lanes are folded into
/// [`super::avx2::hsum8`]'s stages a pair of keys at a time, so a head holds at most three vectors of
/// partial sums beside its query and its two chains, where holding all eight keys' lanes would spill:
/// `CH·(Q + 5) + 2` vectors live, 29 of the 32 registers for three heads of 64, 28 for two of 128.
///
/// # Safety
/// As [`dots_heads_f16`], with `heads = CH` and `len = 16·Q`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dots_heads_f16_held<const CH: usize, const Q: usize>(
    q: *const f32,
    keys: *const u16,
    stride: usize,
    n: usize,
    out: *mut f32,
) {
    use super::avx2::{hsum, hsum8_finish, hsum8_halves, hsum8_pairs};
    const { assert!(Q > 0 && Q.is_multiple_of(2), "a held query is whole steps of 32 values") };
    let len = 16 * Q;
    let mut queries = [[_mm512_setzero_ps(); Q]; CH];
    for (h, query) in queries.iter_mut().enumerate() {
        for (v, part) in query.iter_mut().enumerate() {
            // SAFETY: h < CH and 16·v + 16 ≤ len: within head h's query.
            *part = unsafe { _mm512_loadu_ps(q.add(h * len + 16 * v)) };
        }
    }
    let mut j = 0;
    while j + 8 <= n {
        // `hsum8`'s stages for keys j..j + 8 (t = 0, 2, 4, 6: the pairs of keys t and t + 1), per head.
        let mut fours = [[_mm256_setzero_ps(); CH]; 2];
        for (quad, four) in fours.iter_mut().enumerate() {
            let mut twos = [[_mm256_setzero_ps(); CH]; 2];
            for (pair, two) in twos.iter_mut().enumerate() {
                let t = 4 * quad + 2 * pair;
                // SAFETY: keys j + t and j + t + 1 (< j + 8 ≤ n) are readable for `len` halves.
                let (a, b) = unsafe {
                    (
                        lanes_held::<CH, Q>(&queries, keys.add((j + t) * stride)),
                        lanes_held::<CH, Q>(&queries, keys.add((j + t + 1) * stride)),
                    )
                };
                for ((two, &a), &b) in two.iter_mut().zip(&a).zip(&b) {
                    *two = hsum8_halves(a, b);
                }
            }
            for ((four, &lo), &hi) in four.iter_mut().zip(&twos[0]).zip(&twos[1]) {
                *four = hsum8_pairs(lo, hi);
            }
        }
        for (h, (&lo, &hi)) in fours[0].iter().zip(&fours[1]).enumerate() {
            // `len` is whole vectors, so there is no scalar tail (`dot_tail_f16` would add nothing).
            for (t, s) in hsum8_finish(lo, hi).into_iter().enumerate() {
                // SAFETY: out[h·n + j + t] is writable for h < CH, j + t < n.
                unsafe { *out.add(h * n + j + t) = s };
            }
        }
        j += 8;
    }
    while j < n {
        // SAFETY: key j < n is readable for `len` halves.
        let lanes = unsafe { lanes_held::<CH, Q>(&queries, keys.add(j * stride)) };
        for (h, &lanes) in lanes.iter().enumerate() {
            // SAFETY: out[h·n + j] is writable for h < CH, j < n.
            unsafe { *out.add(h * n + j) = hsum(lanes) };
        }
        j += 1;
    }
}

/// [`dot_lanes_f16_heads`] for a key of `16·Q` halves against queries held in registers.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `b` readable for `16·Q` halves; `Q` even (checked
/// when the function is instantiated).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn lanes_held<const CH: usize, const Q: usize>(qv: &[[__m512; Q]; CH], b: *const u16) -> [__m256; CH] {
    const { assert!(Q > 0 && Q.is_multiple_of(2), "a held query is whole steps of 32 values") };
    let (mut c01, mut c23) = ([_mm512_setzero_ps(); CH], [_mm512_setzero_ps(); CH]);
    let mut v = 0;
    while v < Q {
        // SAFETY: 16·v + 32 ≤ 16·Q, within the key.
        let (k0, k1) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(b.add(16 * v).cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(b.add(16 * v + 16).cast())),
            )
        };
        for h in 0..CH {
            c01[h] = _mm512_fmadd_ps(qv[h][v], k0, c01[h]);
            c23[h] = _mm512_fmadd_ps(qv[h][v + 1], k1, c23[h]);
        }
        v += 2;
    }
    let mut lanes = [_mm256_setzero_ps(); CH];
    for h in 0..CH {
        lanes[h] = combined_lanes(_mm512_castps512_ps256(c01[h]), c01[h], c23[h]);
    }
    lanes
}

/// [`dots_heads_f16`] for `CH` heads.
///
/// # Safety
/// As [`dots_heads_f16`], with `heads = CH`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dots_heads_f16_chunk<const CH: usize>(
    q: *const f32,
    keys: *const u16,
    stride: usize,
    len: usize,
    n: usize,
    out: *mut f32,
) {
    use super::avx2::{dot_tail_f16, hsum, hsum8};
    let mut j = 0;
    while j + 8 <= n {
        let mut keyed = [[_mm256_setzero_ps(); CH]; 8];
        for (t, lanes) in keyed.iter_mut().enumerate() {
            // SAFETY: keys j..j + 8 lie within the n the caller made readable; every head's query is readable.
            *lanes = unsafe { dot_lanes_f16_heads::<CH>(q, len, keys.add((j + t) * stride), len) };
        }
        for h in 0..CH {
            let mut v = [_mm256_setzero_ps(); 8];
            for (v, lanes) in v.iter_mut().zip(&keyed) {
                *v = lanes[h];
            }
            for (t, s) in hsum8(v).into_iter().enumerate() {
                // SAFETY: as above; out[h·n + j + t] is writable for h < CH, j + t < n.
                unsafe { *out.add(h * n + j + t) = dot_tail_f16(q.add(h * len), keys.add((j + t) * stride), len, s) };
            }
        }
        j += 8;
    }
    while j < n {
        for h in 0..CH {
            // SAFETY: query h and key j < n are readable and out[h·n + j] writable.
            unsafe {
                let (qh, key) = (q.add(h * len), keys.add(j * stride));
                *out.add(h * n + j) = dot_tail_f16(qh, key, len, hsum(dot_lanes_f16(qh, key, len)));
            }
        }
        j += 1;
    }
}
