//! The W4A8 block kernels: AVX2 (`vpmaddubsw`) and AVX-512 VNNI (`vpdpbusd`), the AVX-512 epilogues of the
//! AMX tiling (`finish_pass_avx512`, a row tile's outputs in registers across every group, and
//! `finish_rows_avx512` for a partial tile), and the activation quantization's AVX2 and AVX-512 loops (the
//! portable rule's bits, eight and sixteen values at a time).
//!
//! Both read one 16-channel block's packed codes 64 bytes (8 input channels) at a time, split the nibbles
//! with an AND and a shift into two K quads of unsigned codes (of an 8-bit pair, [`Block::low`]: VNNI
//! merges the two planes' nibbles into 8-bit codes, AVX2 runs the planes one after the other and combines
//! their sums), and multiply them with the broadcast signed
//! int8 activations of those quads, `R` rows per pass so each weight load serves several rows. Sums stay
//! in i32 for a whole group; the epilogue is the same f32 sequence as the portable kernel's
//! ([`crate::w4a8`]), so every variant gives identical bits. A block's float tables are f32 or f16
//! ([`crate::w4a8::params`]); an f16 value is widened exactly (`vcvtph2ps`), so the epilogue's inputs are
//! the same f32 values either way.
//!
//! **Safety model.** The public functions are safe: they take a capability token (proof the CPU has the
//! features) and a [`Block`], whose slices the driver built with checked lengths: `w` (and `low`, for a
//! pair) holds `kp/8 × 64` bytes, `x` holds `m × kp`, every span lies within `0..kp` on multiples of 32 (the smallest
//! tile K block; [`crate::w4a8::block::GroupSpans`] checks that once per product), the block's scale, zero and offset tables hold 16 values per group (`[G][16]`), and the
//! activation-scale and sum tables cover every row and group, and a pair has no zero-point or offset
//! tables (checked once per block). The `unsafe`
//! inner functions read only inside those.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::isa::{Avx2Fma, Avx512, Avx512Vnni};
use crate::tile::TileError;
use crate::w4a8::block::{Block, BlockOut, GroupSums};
use crate::w4a8::params::Params;
use crate::w4a8::round::{ROUND_MAGIC, quantize_one};

/// Whether the block's scale, zero and offset tables hold 16 values per span (group), its row terms one
/// per row and group, and an 8-bit pair has neither zero points nor offsets (its zero point is 128).
fn params_cover(b: &Block) -> bool {
    let need = b.spans.len() * 16;
    b.w_scales.len() >= need
        && (b.low.is_none() || (b.zeros.is_none() && b.offsets.is_none()))
        && b.zeros.is_none_or(|z| z.len() >= need)
        && b.offsets.is_none_or(|f| f.len() >= need)
        && b.terms.len() >= b.m * b.groups
        && b.spans.len() <= b.groups
}

/// How far ahead of its loads a kernel prefetches a block's codes, in bytes. A block is `8·K` bytes of
/// codes (16 channels × K inputs; 4.5 KiB at K = 576), and a decode step reads a layer's blocks one
/// after another with little arithmetic per byte, so its loads, not its arithmetic, set the pace; the
/// hardware prefetcher alone does not run far enough ahead of them (docs/perf.md). About a block ahead
/// at K = 576: where the weights come from a large L3 (the AMX Xeon), half that distance left a decode
/// step waiting on its loads. Blocks are contiguous, so near a block's end this requests the next one;
/// past the weights' end a prefetch is harmless (it never faults).
const PREFETCH_AHEAD_BYTES: usize = 4096;

/// Blocks of at most this many activation rows prefetch (decode, one row per sequence). Both kernels take
/// such a block in one pass, which reads it from memory with the least arithmetic per byte. A block of
/// more rows (a prompt) is not prefetched: the arithmetic of each pass is several times larger, and
/// passes after the first find the block in cache.
const PREFETCH_MAX_ROWS: usize = 4;

/// Prefetches the 64-byte line [`PREFETCH_AHEAD_BYTES`] past chunk `j` of the codes at `w`.
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_codes_ahead(w: *const u8, j: usize) {
    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(j * 64 + PREFETCH_AHEAD_BYTES).cast());
}

/// Reads the 4 activation bytes at `p` as one i32 (for a broadcast).
///
/// # Safety
/// `p` must be valid for reading 4 bytes.
#[inline(always)]
unsafe fn quad(p: *const i8) -> i32 {
    // SAFETY: the caller guarantees 4 readable bytes; read_unaligned has no alignment requirement.
    unsafe { p.cast::<i32>().read_unaligned() }
}

/// The AVX2 kernel for one block.
pub(crate) fn block_avx2(tok: Avx2Fma, b: &Block, out: &mut BlockOut) {
    // F16C widens an f16 table eight values at a time; every AVX2 CPU known has it, but the kernel does
    // not assume it: without it, f16 values are widened one by one (the same f32 values).
    // SAFETY: `f16c` is exactly the live CPU's answer.
    unsafe { block_avx2_widening(tok, b, out, std::arch::is_x86_feature_detected!("f16c")) }
}

/// [`block_avx2`], widening f16 tables with F16C only when `f16c`.
///
/// # Safety
/// `f16c` may be true only where the live CPU has F16C.
unsafe fn block_avx2_widening(_tok: Avx2Fma, b: &Block, out: &mut BlockOut, f16c: bool) {
    assert!(out.rows() >= b.m && b.x.len() >= b.m * b.kp && b.w.len() >= b.kp / 8 * 64);
    assert_eq!(b.spans.kp(), b.kp, "a block's spans were checked against its own padded K");
    assert!(params_cover(b), "a block's parameter tables hold 16 per group");
    assert!(b.low.is_none_or(|l| l.len() >= b.w.len()), "an 8-bit pair's planes are the same size");
    let mut r0 = 0;
    while r0 < b.m {
        let rows = (b.m - r0).min(4);
        // SAFETY: the token proves AVX2 + FMA, and `f16c` is true only where the live CPU has F16C (this
        // function's contract); the block's
        // invariants (module docs) and the assert above keep every access in bounds for rows r0..r0+rows.
        unsafe {
            match (rows, f16c) {
                (4, true) => rows_avx2_f16c::<4>(b, r0, out),
                (3, true) => rows_avx2_f16c::<3>(b, r0, out),
                (2, true) => rows_avx2_f16c::<2>(b, r0, out),
                (_, true) => rows_avx2_f16c::<1>(b, r0, out),
                (4, false) => rows_avx2::<4>(b, r0, out),
                (3, false) => rows_avx2::<3>(b, r0, out),
                (2, false) => rows_avx2::<2>(b, r0, out),
                (_, false) => rows_avx2::<1>(b, r0, out),
            }
        }
        r0 += rows;
    }
}

/// Eight of a block's parameters from `at`, widened to f32 one by one (a CPU without F16C).
///
/// # Safety
/// The CPU must support AVX; `at + 8` must not exceed `p`'s length.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn params8(p: Params, at: usize) -> __m256 {
    match p {
        // SAFETY: at + 8 ≤ len (the caller's contract).
        Params::F32(v) => unsafe { _mm256_loadu_ps(v.as_ptr().add(at)) },
        Params::F16(_) => {
            let v: [f32; 8] = std::array::from_fn(|i| p.get(at + i));
            // SAFETY: v holds 8 values.
            unsafe { _mm256_loadu_ps(v.as_ptr()) }
        }
    }
}

/// Eight of a block's parameters from `at`, widened to f32 with F16C.
///
/// # Safety
/// The CPU must support AVX and F16C; `at + 8` must not exceed `p`'s length.
#[inline]
#[target_feature(enable = "avx,f16c")]
unsafe fn params8_f16c(p: Params, at: usize) -> __m256 {
    match p {
        // SAFETY: at + 8 ≤ len (the caller's contract).
        Params::F32(v) => unsafe { _mm256_loadu_ps(v.as_ptr().add(at)) },
        // SAFETY: as above, eight u16.
        Params::F16(h) => unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(at).cast())) },
    }
}

/// The AVX2 rows kernel, once per way of widening f16 tables: `$params` under `$features`.
macro_rules! rows_avx2_fn {
    ($name:ident, $features:literal, $params:ident) => {
        /// # Safety
        /// The CPU must support the enabled features; `b` must satisfy the block invariants (module docs),
        /// `r0 + R ≤ m`, and `out` must hold `m` rows; with `b.low`, it must be as long as `b.w`.
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize>(b: &Block, r0: usize, out: &mut BlockOut) {
            let mask = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            // An 8-bit pair's planes run one after the other, `acc = 16·Σ xq·hi + Σ xq·lo` (exact in i32):
            // its 8-bit codes as one operand would saturate vpmaddubsw's pair sums.
            let (high_plane, low_plane) = (b.w.as_ptr(), b.low.map(<[u8]>::as_ptr));
            let prefetch = b.m <= PREFETCH_MAX_ROWS;
            // The rows' outputs stay in registers from the first group to the last, as in `rows_vnni`, and
            // start from the bias there.
            let start = match out.bias() {
                // SAFETY: the bias holds sixteen values.
                Some(bias) => unsafe { [_mm256_loadu_ps(bias.as_ptr()), _mm256_loadu_ps(bias.as_ptr().add(8))] },
                None => [_mm256_setzero_ps(); 2],
            };
            let mut rows_out = [start; R];
            for (g, span) in b.spans.iter().enumerate() {
                let mut acc = [[_mm256_setzero_si256(); 2]; R];
                for w in std::iter::once(high_plane).chain(low_plane) {
                    if w != high_plane {
                        // The low plane: what the high plane summed weighs 16 times as much.
                        for acc in acc.iter_mut() {
                            acc[0] = _mm256_slli_epi32::<4>(acc[0]);
                            acc[1] = _mm256_slli_epi32::<4>(acc[1]);
                        }
                    }
                    // Four chunks (32 input channels) are summed in i16 before one vpmaddwd widens them: each chunk adds
                    // at most ±7620 per lane, so four stay within ±30480 < 2¹⁵. Spans are multiples of 32 (the tile K
                    // block), so every span is whole quads of chunks.
                    let mut j = span.start / 8;
                    while j < span.end / 8 {
                        let mut part = [[_mm256_setzero_si256(); 2]; R];
                        for j in j..j + 4 {
                            if prefetch {
                                prefetch_codes_ahead(w, j);
                            }
                            // SAFETY: chunk j lies within the plane (j < kp/8; a low plane is as long as b.w).
                            let (v0, v1) = unsafe {
                                (
                                    _mm256_loadu_si256(w.add(j * 64).cast()),
                                    _mm256_loadu_si256(w.add(j * 64 + 32).cast()),
                                )
                            };
                            let (lo0, hi0) =
                                (_mm256_and_si256(v0, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(v0), mask));
                            let (lo1, hi1) =
                                (_mm256_and_si256(v1, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(v1), mask));
                            for (r, part) in part.iter_mut().enumerate() {
                                // SAFETY: row r0 + r < m and 8j + 8 ≤ kp, so both quads lie within x.
                                let xp = unsafe { b.x.as_ptr().add((r0 + r) * b.kp + 8 * j) };
                                // SAFETY: as above.
                                let (q0, q1) = unsafe { (quad(xp), quad(xp.add(4))) };
                                let (a0, a1) = (_mm256_set1_epi32(q0), _mm256_set1_epi32(q1));
                                // Pair sums of u4·s8 stay within ±3810, so vpmaddubsw never saturates.
                                let s0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, a0), _mm256_maddubs_epi16(hi0, a1));
                                let s1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, a0), _mm256_maddubs_epi16(hi1, a1));
                                part[0] = _mm256_add_epi16(part[0], s0);
                                part[1] = _mm256_add_epi16(part[1], s1);
                            }
                        }
                        for (acc, part) in acc.iter_mut().zip(&part) {
                            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(part[0], ones));
                            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(part[1], ones));
                        }
                        j += 4;
                    }
                }
                // The group's zero points, scales and offsets, shared by its rows, each half of the 16 channels
                // (written out, not through `array::map`, whose closures would not inline under the target
                // features).
                let (at0, at1) = (g * 16, g * 16 + 8);
                let z = match b.zeros {
                    // SAFETY: the block's [G][16] zero points hold 8 at g·16 and 8 at g·16 + 8.
                    Some(z) => Some(unsafe {
                        [
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(z.as_ptr().add(at0).cast())),
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(z.as_ptr().add(at1).cast())),
                        ]
                    }),
                    None => None,
                };
                // SAFETY: the block's [G][16] scales hold 8 at g·16 and 8 at g·16 + 8; this function runs with
                // the features `$params` needs.
                let ws = unsafe { [$params(b.w_scales, at0), $params(b.w_scales, at1)] };
                let f = match b.offsets {
                    // SAFETY: as above, for the offsets.
                    Some(f) => Some(unsafe { [$params(f, at0), $params(f, at1)] }),
                    None => None,
                };
                for (r, (acc, row_out)) in acc.iter().zip(rows_out.iter_mut()).enumerate() {
                    let row = r0 + r;
                    let t = &b.terms[row * b.groups + g];
                    let a_scale = _mm256_set1_ps(t.a_scale);
                    for (h, &acc) in acc.iter().enumerate() {
                        // z·Σx per lane; with the implicit zero 8 (a pair's 128) the same wrapping product, taken
                        // once per call.
                        let zsum = match z {
                            Some(z) => _mm256_mullo_epi32(z[h], _mm256_set1_epi32(t.sum)),
                            None if b.low.is_some() => _mm256_set1_epi32(t.sum_times_128),
                            None => _mm256_set1_epi32(t.sum_times_8),
                        };
                        let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, zsum));
                        let mut acc_f = _mm256_fmadd_ps(v, _mm256_mul_ps(a_scale, ws[h]), row_out[h]);
                        if let Some(f) = f {
                            acc_f = _mm256_fmadd_ps(_mm256_set1_ps(t.sum_f32), _mm256_mul_ps(a_scale, f[h]), acc_f);
                        }
                        row_out[h] = acc_f;
                    }
                }
            }
            for (r, o) in rows_out.iter().enumerate() {
                let p = out.row_ptr(r0 + r);
                // SAFETY: r0 + r < m ≤ out's rows, so the row's sixteen values are valid; no row slice of
                // `out` is held.
                unsafe {
                    _mm256_storeu_ps(p, o[0]);
                    _mm256_storeu_ps(p.wrapping_add(8), o[1]);
                }
            }
        }
    };
}

rows_avx2_fn!(rows_avx2, "avx2,fma", params8);
rows_avx2_fn!(rows_avx2_f16c, "avx2,fma,f16c", params8_f16c);

/// The AVX-512 VNNI kernel for one block.
pub(crate) fn block_vnni(_tok: Avx512Vnni, b: &Block, out: &mut BlockOut) {
    assert!(out.rows() >= b.m && b.x.len() >= b.m * b.kp && b.w.len() >= b.kp / 8 * 64);
    assert_eq!(b.spans.kp(), b.kp, "a block's spans were checked against its own padded K");
    assert!(params_cover(b), "a block's parameter tables hold 16 per group");
    assert!(b.low.is_none_or(|l| l.len() >= b.w.len()), "an 8-bit pair's planes are the same size");
    let mut r0 = 0;
    while r0 < b.m {
        let rows = (b.m - r0).min(8);
        // SAFETY: the token proves AVX-512 F/BW/VL + VNNI; the block's invariants (module docs) and the
        // asserts above keep every access in bounds for rows r0..r0+rows.
        unsafe {
            match (rows, b.low.is_some()) {
                (8, false) => rows_vnni::<8, 1, 1, false>(b, r0, out),
                (7, false) => rows_vnni::<7, 1, 1, false>(b, r0, out),
                (6, false) => rows_vnni::<6, 1, 1, false>(b, r0, out),
                (5, false) => rows_vnni::<5, 1, 1, false>(b, r0, out),
                (4, false) => rows_vnni::<4, 1, 2, false>(b, r0, out),
                (3, false) => rows_vnni::<3, 1, 2, false>(b, r0, out),
                (2, false) => rows_vnni::<2, 2, 2, false>(b, r0, out),
                (_, false) => rows_vnni::<1, 2, 2, false>(b, r0, out),
                (8, true) => rows_vnni::<8, 1, 1, true>(b, r0, out),
                (7, true) => rows_vnni::<7, 1, 1, true>(b, r0, out),
                (6, true) => rows_vnni::<6, 1, 1, true>(b, r0, out),
                (5, true) => rows_vnni::<5, 1, 1, true>(b, r0, out),
                (4, true) => rows_vnni::<4, 1, 2, true>(b, r0, out),
                (3, true) => rows_vnni::<3, 1, 2, true>(b, r0, out),
                (2, true) => rows_vnni::<2, 2, 2, true>(b, r0, out),
                (_, true) => rows_vnni::<1, 2, 2, true>(b, r0, out),
            }
        }
        r0 += rows;
    }
}

/// `R` rows per pass; `U` chunks in flight; `S` accumulators per row and chunk (2: one for the low and one
/// for the high nibbles). A `vpdpbusd` waits for the previous one on the same accumulator, so with few
/// rows and one chain per row the loop ran at the instruction's latency, not its throughput; from five
/// rows the rows alone give enough independent chains. The chains are added at the end of the group; i32
/// addition wraps and is associative, so the sum is the same bits as one chain's.
///
/// `PAIR`: the block is an 8-bit pair ([`Block::low`]). Each quad's codes are `16·hi + lo`, merged from
/// the two planes' nibbles (a shift and a bitwise select per quad) into one unsigned byte operand, so a
/// chunk takes one `vpdpbusd` per quad and row, as a 4-bit block does; `Σ xq·u` stays within i32 (a
/// group's products are at most 255·127 each, so groups of up to 66,000 inputs fit).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and VNNI; `b` must satisfy the block invariants (module docs),
/// `r0 + R ≤ m`, `U` must divide 4 (spans are whole multiples of 4 chunks), `S` must be 1 or 2, and `out`
/// must hold `m` rows; with `PAIR`, `b.low` must be as long as `b.w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_vnni<const R: usize, const U: usize, const S: usize, const PAIR: bool>(
    b: &Block,
    r0: usize,
    out: &mut BlockOut,
) {
    let mask = _mm512_set1_epi8(0x0F);
    let high_nibbles = _mm512_set1_epi8(0xF0u8 as i8);
    let w = b.w.as_ptr();
    let low = b.low.map_or(w, <[u8]>::as_ptr);
    let prefetch = b.m <= PREFETCH_MAX_ROWS;
    // The rows' outputs stay in registers from the first group to the last, started from the bias there
    // and stored once per pass, not loaded and stored once per group: a group's multiply-adds then need no
    // load of the last group's store, and the pass none of a bias just written to memory (docs/perf.md,
    // "A W4A8 pass keeps its outputs in registers").
    // SAFETY: the bias holds sixteen values.
    let start = out.bias().map_or(_mm512_setzero_ps(), |bias| unsafe { _mm512_loadu_ps(bias.as_ptr()) });
    let mut rows_out = [start; R];
    for (g, span) in b.spans.iter().enumerate() {
        let mut chains = [[[_mm512_setzero_si512(); S]; R]; U];
        let mut j = span.start / 8;
        while j < span.end / 8 {
            for (u, chain) in chains.iter_mut().enumerate() {
                let j = j + u;
                if prefetch {
                    prefetch_codes_ahead(w, j);
                    if PAIR {
                        prefetch_codes_ahead(low, j);
                    }
                }
                // SAFETY: chunk j lies within w (j < kp/8: spans hold whole multiples of U chunks).
                let v = unsafe { _mm512_loadu_si512(w.add(j * 64).cast()) };
                // The chunk's two K quads (low nibbles, high nibbles) as unsigned bytes.
                let (lo, hi) = if PAIR {
                    // SAFETY: the low plane is as long as w (this function's contract).
                    let l = unsafe { _mm512_loadu_si512(low.add(j * 64).cast()) };
                    // Select (0xE4): the first operand's bits where the mask (third) has ones, else the
                    // second's. Shifts by 4 within 16-bit lanes move each byte's nibble into place; the bits
                    // crossing a byte boundary fall where the select takes the other operand.
                    (
                        _mm512_ternarylogic_epi32::<0xE4>(_mm512_slli_epi16::<4>(v), l, high_nibbles),
                        _mm512_ternarylogic_epi32::<0xE4>(v, _mm512_srli_epi16::<4>(l), high_nibbles),
                    )
                } else {
                    (_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask))
                };
                for (r, acc) in chain.iter_mut().enumerate() {
                    // SAFETY: row r0 + r < m and 8j + 8 ≤ kp, so both quads lie within x.
                    let xp = unsafe { b.x.as_ptr().add((r0 + r) * b.kp + 8 * j) };
                    // SAFETY: as above.
                    let (a0, a1) = unsafe { (_mm512_set1_epi32(quad(xp)), _mm512_set1_epi32(quad(xp.add(4)))) };
                    acc[0] = _mm512_dpbusd_epi32(acc[0], lo, a0);
                    acc[S - 1] = _mm512_dpbusd_epi32(acc[S - 1], hi, a1);
                }
            }
            j += U;
        }
        let mut acc = [_mm512_setzero_si512(); R];
        for chain in &chains {
            for (acc, part) in acc.iter_mut().zip(chain) {
                for &p in part {
                    *acc = _mm512_add_epi32(*acc, p);
                }
            }
        }
        // SAFETY: this function runs with AVX-512F; g is one of the block's groups, whose tables cover it.
        let params = unsafe { GroupParams16::load(b, g) };
        for (r, (&acc, o)) in acc.iter().zip(rows_out.iter_mut()).enumerate() {
            // SAFETY: as above; r0 + r < m.
            *o = unsafe { params.finish_row(b, r0 + r, g, acc, PAIR, *o) };
        }
    }
    for (r, o) in rows_out.iter().enumerate() {
        // SAFETY: r0 + r < m and out holds m rows (this function's contract), so the row's sixteen values
        // are valid; no row slice of `out` is held.
        unsafe { _mm512_storeu_ps(out.row_ptr(r0 + r), *o) };
    }
}

/// One group's parameters for a block's sixteen channels, as the AVX-512 epilogue uses them: integer zero
/// points (`None`: the implicit 8, or a pair's 128), scales, and float offsets (`None`: 0).
#[derive(Clone, Copy)]
struct GroupParams16 {
    zeros: Option<__m512i>,
    scales: __m512,
    offsets: Option<__m512>,
}

impl GroupParams16 {
    /// Group `g`'s parameters.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `b`'s `[G][16]` tables must hold 16 values at `g·16`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(b: &Block, g: usize) -> Self {
        // SAFETY: the zero-point table holds 16 bytes at g·16 (the caller's contract).
        let zeros = b.zeros.map(|z| _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(z.as_ptr().add(g * 16).cast()) }));
        // SAFETY: as above, for the scales and the offsets.
        let (scales, offsets) = unsafe { (params16(b.w_scales, g * 16), b.offsets.map(|f| params16(f, g * 16))) };
        GroupParams16 { zeros, scales, offsets }
    }

    /// [`Block::finish`] for row `row`, whose sums for this group are `acc` and whose sixteen outputs so
    /// far are `out`: `out = fma(acc − z·Σx, a_s·w_s, out)`, then with offsets `out = fma(Σx, a_s·f, out)`,
    /// each product and multiply-add rounded as there, so the bits are the same; the new outputs are
    /// returned. `pair`: the block is an 8-bit pair (zero point 128).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn finish_row(&self, b: &Block, row: usize, g: usize, acc: __m512i, pair: bool, out: __m512) -> __m512 {
        let t = &b.terms[row * b.groups + g];
        // z·Σx per lane; with the implicit zero 8 (a pair's 128) the same wrapping product, taken once per
        // call.
        let zsum = match self.zeros {
            Some(z) => _mm512_mullo_epi32(z, _mm512_set1_epi32(t.sum)),
            None if pair => _mm512_set1_epi32(t.sum_times_128),
            None => _mm512_set1_epi32(t.sum_times_8),
        };
        // SAFETY: the caller's contract is this one's.
        unsafe { self.finish_centered_row(b, row, g, _mm512_sub_epi32(acc, zsum), self.offsets, out) }
    }

    /// [`GroupParams16::finish_row`] from `acc − z·Σx` ([`Block::finish_centered`]), with the block's
    /// offsets passed as `offsets` (`self.offsets`, as a value a loop can be specialized on).
    ///
    /// # Safety
    /// As for [`GroupParams16::finish_row`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn finish_centered_row(
        &self,
        b: &Block,
        row: usize,
        g: usize,
        centered: __m512i,
        offsets: Option<__m512>,
        out: __m512,
    ) -> __m512 {
        let t = &b.terms[row * b.groups + g];
        let v = _mm512_cvtepi32_ps(centered);
        let a_scale = _mm512_set1_ps(t.a_scale);
        let mut acc_f = _mm512_fmadd_ps(v, _mm512_mul_ps(a_scale, self.scales), out);
        if let Some(f) = offsets {
            acc_f = _mm512_fmadd_ps(_mm512_set1_ps(t.sum_f32), _mm512_mul_ps(a_scale, f), acc_f);
        }
        acc_f
    }
}

/// `f` applied to row `row`'s sixteen outputs in `out`, in place.
///
/// # Safety
/// The CPU must support AVX-512F; `out` must hold at least `row + 1` rows.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn update_row(out: &mut BlockOut, row: usize, f: impl FnOnce(__m512) -> __m512) {
    let o = out.row_ptr(row);
    // SAFETY: row's sixteen values are valid: out holds row + 1 rows (the caller's contract), and no row
    // slice of `out` is held.
    unsafe { _mm512_storeu_ps(o, f(_mm512_loadu_ps(o))) };
}

/// [`Block::finish`] for the consecutive rows `rows` of group `g`, sixteen lanes at a time: the AMX
/// tiling's epilogue. `acc` holds the rows' i32 sums, `[rows.len()][16]`, as a tile store leaves them:
/// `Σ xq·q`, or with `centered` `Σ xq·(q − z)` ([`Block::finish_centered`]). The arithmetic is
/// `rows_vnni`'s epilogue (one [`GroupParams16::finish_row`]), so the bits are [`Block::finish`]'s.
pub(crate) fn finish_rows_avx512(
    _tok: Avx512Vnni,
    b: &Block,
    rows: Range<usize>,
    g: usize,
    acc: &[i32],
    centered: bool,
    out: &mut BlockOut,
) {
    assert!(params_cover(b), "a block's parameter tables hold 16 per group");
    assert!(g < b.spans.len() && rows.end <= b.m, "group {g} and rows {rows:?} lie within the block");
    assert!(acc.len() >= rows.len() * 16 && out.rows() >= rows.end, "16 sums a row in, 16 outputs a row out");
    // SAFETY: the token proves AVX-512 F/BW/VL; the asserts above are the function's contract.
    unsafe { finish_rows_avx512_impl(b, rows, g, acc, centered, out) }
}

/// The body of [`finish_rows_avx512`].
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL; `b`'s tables must cover its groups (`params_cover`), `g` must be
/// one of its groups, `rows.end ≤ b.m`, `acc` must hold `rows.len() × 16` sums and `out` `rows.end` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn finish_rows_avx512_impl(
    b: &Block,
    rows: Range<usize>,
    g: usize,
    acc: &[i32],
    centered: bool,
    out: &mut BlockOut,
) {
    // SAFETY: AVX-512F, and g's tables cover it (the contract).
    let params = unsafe { GroupParams16::load(b, g) };
    // One loop per case, so no row tests what the group's parameters already say.
    match (centered, params.offsets) {
        (true, Some(f)) => {
            for (i, row) in rows.enumerate() {
                // SAFETY: i < rows.len(), so acc[16i .. 16i + 16] is within acc; row < rows.end ≤ m, g is a
                // group, and out holds rows.end rows (the contract).
                unsafe {
                    let sums = _mm512_loadu_si512(acc.as_ptr().add(i * 16).cast());
                    update_row(out, row, |o| params.finish_centered_row(b, row, g, sums, Some(f), o));
                }
            }
        }
        (true, None) => {
            for (i, row) in rows.enumerate() {
                // SAFETY: as above.
                unsafe {
                    let sums = _mm512_loadu_si512(acc.as_ptr().add(i * 16).cast());
                    update_row(out, row, |o| params.finish_centered_row(b, row, g, sums, None, o));
                }
            }
        }
        (false, _) => {
            for (i, row) in rows.enumerate() {
                // SAFETY: as above.
                unsafe {
                    let sums = _mm512_loadu_si512(acc.as_ptr().add(i * 16).cast());
                    update_row(out, row, |o| params.finish_row(b, row, g, sums, b.low.is_some(), o));
                }
            }
        }
    }
}

/// [`Block::finish`] for sixteen consecutive rows from `row0` over every group of the block, one group
/// after another: the AMX tiling's epilogue for one pass, where `steps.group(g)` stores group `g`'s sums,
/// `[16][16]` (`Σ xq·q`, or with `centered` `Σ xq·(q − z)`), and runs the tiles ahead. The sixteen rows'
/// outputs stay in registers from the first group to the last, so each row and group costs a conversion,
/// the scale's multiply and a multiply-add (two more with offsets), not a load and a store of its outputs
/// as well. Every output sees the same operations in the same order as through [`finish_rows_avx512`],
/// so the bits are [`Block::finish`]'s.
pub(crate) fn finish_pass_avx512<S: GroupSums>(
    _tok: Avx512Vnni,
    b: &Block,
    row0: usize,
    centered: bool,
    out: &mut BlockOut,
    steps: &mut S,
) -> Result<(), TileError> {
    assert!(params_cover(b), "a block's parameter tables hold 16 per group");
    assert!(row0 + 16 <= b.m && out.rows() >= row0 + 16, "rows {row0}..{} lie within the block", row0 + 16);
    // SAFETY: the token proves AVX-512 F/BW/VL; the asserts above are the functions' contract.
    unsafe {
        match (centered, b.offsets.is_some()) {
            (true, false) => finish_pass_avx512_impl::<S, true, false>(b, row0, out, steps),
            (true, true) => finish_pass_avx512_impl::<S, true, true>(b, row0, out, steps),
            (false, false) => finish_pass_avx512_impl::<S, false, false>(b, row0, out, steps),
            (false, true) => finish_pass_avx512_impl::<S, false, true>(b, row0, out, steps),
        }
    }
}

/// The body of [`finish_pass_avx512`], for sums `CENTERED` or not and a block with `OFFSETS` or without.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL; `b`'s tables must cover its groups (`params_cover`),
/// `row0 + 16 ≤ b.m`, and `out` must hold `row0 + 16` rows; `OFFSETS` must be whether `b` has offsets.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn finish_pass_avx512_impl<S: GroupSums, const CENTERED: bool, const OFFSETS: bool>(
    b: &Block,
    row0: usize,
    out: &mut BlockOut,
    steps: &mut S,
) -> Result<(), TileError> {
    /// `$body` once for each of the sixteen rows, with `$r` the row as a constant, so the sixteen outputs
    /// are sixteen registers rather than an array in memory (a loop over them stays a loop).
    macro_rules! each_row {
        ($r:ident => $body:block) => {
            each_row!(@ $r $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
        };
        (@ $r:ident $body:block; $($n:literal)*) => {
            $({
                const $r: usize = $n;
                $body
            })*
        };
    }
    // Every row starts at the bias (zeros without one): the outputs are set, not added into.
    // SAFETY: a bias is sixteen values.
    let start = out.bias().map_or(_mm512_setzero_ps(), |bias| unsafe { _mm512_loadu_ps(bias.as_ptr()) });
    let mut acc = [start; 16];
    // The pass's output lines are requested now, so the stores at its end find them in cache. Stores
    // commit in order, and a store that misses holds back the tile stores behind it, which the next
    // pass's epilogue waits to load (docs/perf.md); a prefetch of any address is harmless.
    each_row!(R => {
        _mm_prefetch::<_MM_HINT_T0>(out.row_ptr(row0 + R).cast());
    });
    for g in 0..b.spans.len() {
        // SAFETY: AVX-512F, and g's tables cover it (the contract).
        let params = unsafe { GroupParams16::load(b, g) };
        let offsets = params.offsets.unwrap_or(_mm512_setzero_ps());
        // SAFETY: row0 + 16 ≤ m and g < groups, so each row's entry is within `terms` (`m × groups`,
        // params_cover).
        let terms = unsafe { b.terms.as_ptr().add(row0 * b.groups + g) };
        let tile = steps.group(g)?.as_ptr();
        each_row!(R => {
            // SAFETY: as above, entry (row0 + R)·groups + g; row R of the 16 × 16 sums.
            let (t, s) = unsafe { (&*terms.add(R * b.groups), _mm512_loadu_si512(tile.add(R * 16).cast())) };
            let centered = if CENTERED {
                s
            } else {
                // z·Σx per lane, as in `finish_row`.
                let zsum = match params.zeros {
                    Some(z) => _mm512_mullo_epi32(z, _mm512_set1_epi32(t.sum)),
                    None if b.low.is_some() => _mm512_set1_epi32(t.sum_times_128),
                    None => _mm512_set1_epi32(t.sum_times_8),
                };
                _mm512_sub_epi32(s, zsum)
            };
            let a_scale = _mm512_set1_ps(t.a_scale);
            acc[R] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centered), _mm512_mul_ps(a_scale, params.scales), acc[R]);
            if OFFSETS {
                acc[R] = _mm512_fmadd_ps(_mm512_set1_ps(t.sum_f32), _mm512_mul_ps(a_scale, offsets), acc[R]);
            }
        });
    }
    each_row!(R => {
        // SAFETY: row0 + R < row0 + 16 ≤ out's rows (the contract), so the row's sixteen values are valid.
        unsafe { _mm512_storeu_ps(out.row_ptr(row0 + R), acc[R]) };
    });
    Ok(())
}

/// Sixteen of a block's parameters from `at`, widened to f32 (`vcvtph2ps` is AVX-512F).
///
/// # Safety
/// The CPU must support AVX-512F; `at + 16` must not exceed `p`'s length.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn params16(p: Params, at: usize) -> __m512 {
    match p {
        // SAFETY: at + 16 ≤ len (the caller's contract).
        Params::F32(v) => unsafe { _mm512_loadu_ps(v.as_ptr().add(at)) },
        // SAFETY: as above, sixteen u16.
        Params::F16(h) => unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().add(at).cast())) },
    }
}

/// The largest magnitude in `v`, sixteen at a time: what `v.iter().fold(0.0, |a, v| a.max(v.abs()))` gives
/// (a NaN is passed over, as `f32::max` passes it over; the maximum of the rest is exact in any order).
pub(crate) fn amax_avx512(_tok: Avx512, v: &[f32]) -> f32 {
    // SAFETY: the token proves AVX-512F; the function reads only within `v`.
    unsafe { amax_avx512_impl(v) }
}

/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn amax_avx512_impl(v: &[f32]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        // SAFETY: the chunk holds 16 floats.
        let x = _mm512_abs_ps(unsafe { _mm512_loadu_ps(c.as_ptr()) });
        // `vmaxps` returns its second operand when either is NaN: a NaN `x` leaves `acc` as it was.
        acc = _mm512_max_ps(x, acc);
    }
    chunks.remainder().iter().fold(_mm512_reduce_max_ps(acc), |a, v| a.max(v.abs()))
}

/// Quantizes `src` by the scale `s` into `dst` (the same length) with the portable rule
/// ([`crate::w4a8::round::quantize_one`]), sixteen at a time: the same f32 division and `1.5·2²³` additions, a
/// NaN to 0. Returns `Σ dst`.
pub(crate) fn quantize_avx512(_tok: Avx512, src: &[f32], s: f32, dst: &mut [i8]) -> i32 {
    assert_eq!(src.len(), dst.len(), "quantize_avx512 of slices of different lengths");
    // SAFETY: the token proves AVX-512F; the function reads and writes only within the two slices.
    unsafe { quantize_avx512_impl(src, s, dst) }
}

/// # Safety
/// The CPU must support AVX-512F; `src` and `dst` must be the same length.
#[target_feature(enable = "avx512f")]
unsafe fn quantize_avx512_impl(src: &[f32], s: f32, dst: &mut [i8]) -> i32 {
    let (scale, lo, hi, magic) =
        (_mm512_set1_ps(s), _mm512_set1_ps(-127.0), _mm512_set1_ps(127.0), _mm512_set1_ps(ROUND_MAGIC));
    let mut sum = _mm512_setzero_si512();
    let whole = src.len() - src.len() % 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 ≤ whole ≤ src.len().
        let t = _mm512_div_ps(unsafe { _mm512_loadu_ps(src.as_ptr().add(i)) }, scale);
        // `vmaxps`/`vminps` return the second operand when either is NaN: a NaN stays NaN, as through
        // `f32::clamp`.
        let t = _mm512_min_ps(hi, _mm512_max_ps(lo, t));
        let r = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
        // A NaN becomes 0, as `as i8` makes it; every other value is an integer in −127..=127.
        let q = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r), r);
        sum = _mm512_add_epi32(sum, q);
        // SAFETY: i + 16 ≤ dst.len() (the same length as src).
        unsafe { _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi8(q)) };
    }
    let mut total = _mm512_reduce_add_epi32(sum);
    for (d, &v) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = quantize_one(v, s);
        total += i32::from(*d);
    }
    total
}

/// [`amax_avx512`] eight at a time, for AVX2: the same value.
pub(crate) fn amax_avx2(_tok: Avx2Fma, v: &[f32]) -> f32 {
    // SAFETY: the token proves AVX2; the function reads only within `v`.
    unsafe { amax_avx2_impl(v) }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn amax_avx2_impl(v: &[f32]) -> f32 {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut acc = _mm256_setzero_ps();
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: the chunk holds 8 floats.
        let x = _mm256_and_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, magnitude);
        // `vmaxps` returns its second operand when either is NaN: a NaN `x` leaves `acc` as it was.
        acc = _mm256_max_ps(x, acc);
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    // The lanes hold no NaN, so their maximum is the same in any order.
    let wide = lanes.iter().fold(0.0f32, |a, &v| a.max(v));
    chunks.remainder().iter().fold(wide, |a, v| a.max(v.abs()))
}

/// [`quantize_avx512`] eight at a time, for AVX2: the same f32 division and `1.5·2²³` additions, a NaN
/// to 0, the same bits. Returns `Σ dst`.
pub(crate) fn quantize_avx2(_tok: Avx2Fma, src: &[f32], s: f32, dst: &mut [i8]) -> i32 {
    assert_eq!(src.len(), dst.len(), "quantize_avx2 of slices of different lengths");
    // SAFETY: the token proves AVX2; the function reads and writes only within the two slices.
    unsafe { quantize_avx2_impl(src, s, dst) }
}

/// # Safety
/// The CPU must support AVX2; `src` and `dst` must be the same length.
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2_impl(src: &[f32], s: f32, dst: &mut [i8]) -> i32 {
    let (scale, lo, hi, magic) =
        (_mm256_set1_ps(s), _mm256_set1_ps(-127.0), _mm256_set1_ps(127.0), _mm256_set1_ps(ROUND_MAGIC));
    let mut sum = _mm256_setzero_si256();
    let whole = src.len() - src.len() % 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 ≤ whole ≤ src.len().
        let t = _mm256_div_ps(unsafe { _mm256_loadu_ps(src.as_ptr().add(i)) }, scale);
        // `vmaxps`/`vminps` return the second operand when either is NaN: a NaN stays NaN, as through
        // `f32::clamp`.
        let t = _mm256_min_ps(hi, _mm256_max_ps(lo, t));
        let r = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
        // A NaN becomes 0, as `as i8` makes it (its conversion, 0x80000000, is masked off); every other
        // value is an integer in −127..=127.
        let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
        let q = _mm256_and_si256(_mm256_cvtps_epi32(r), ordered);
        sum = _mm256_add_epi32(sum, q);
        // Narrow to bytes: within each 128-bit half, i32 → i16 → i8 without saturating (|q| ≤ 127), so
        // each half's low four bytes are its four values.
        let b = _mm256_packs_epi16(_mm256_packs_epi32(q, q), _mm256_setzero_si256());
        let bytes = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
        // SAFETY: i + 8 ≤ dst.len() (the same length as src).
        unsafe { _mm_storel_epi64(dst.as_mut_ptr().add(i).cast(), bytes) };
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` holds 8 i32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum) };
    let mut total: i32 = lanes.iter().sum();
    for (d, &v) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = quantize_one(v, s);
        total += i32::from(*d);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::w4a8::block::{GroupSpans, RowGroupTerms};
    use crate::w4a8::params::ParamTable;

    /// AVX-512 quantizes activations to the bits of the portable rule: NaN, infinities, signed zeros,
    /// ties at every half, values past ±127, and lengths with and without a 16-value tail.
    #[test]
    fn activations_quantize_on_avx512_to_the_portable_bits() {
        let Some(tok) = Avx512::new() else {
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "no AVX-512 to test");
            return eprintln!("activations_quantize_on_avx512_to_the_portable_bits: SKIPPED (no AVX-512F)");
        };
        quantizes_to_the_portable_bits(|v| amax_avx512(tok, v), |src, s, dst| quantize_avx512(tok, src, s, dst));
    }

    /// AVX2 quantizes activations to the bits of the portable rule, as AVX-512 does (lengths with and
    /// without an 8-value tail among the same cases).
    #[test]
    fn activations_quantize_on_avx2_to_the_portable_bits() {
        let Some(tok) = Avx2Fma::new() else {
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "no AVX2 to test");
            return eprintln!("activations_quantize_on_avx2_to_the_portable_bits: SKIPPED (no AVX2)");
        };
        quantizes_to_the_portable_bits(|v| amax_avx2(tok, v), |src, s, dst| quantize_avx2(tok, src, s, dst));
    }

    fn quantizes_to_the_portable_bits(amax: impl Fn(&[f32]) -> f32, quantize: impl Fn(&[f32], f32, &mut [i8]) -> i32) {
        // NaNs filling the last whole vectors, after the largest value: passed over, not propagated.
        let mut late_nan: Vec<f32> = (0..40).map(|i| i as f32 * 0.25).collect();
        late_nan[3] = -90.0;
        late_nan[16..32].fill(f32::NAN);
        assert_eq!(amax(&late_nan), 90.0);
        // The largest magnitude in every position of a vector, of the tail, and of either sign.
        for at in 0..37 {
            let mut v: Vec<f32> = (0..37).map(|i| (i % 5) as f32 * 0.5).collect();
            v[at] = if at % 2 == 0 { 9.0 } else { -9.0 };
            assert_eq!(amax(&v), 9.0, "largest at {at}");
        }
        let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, 1e-30, -1e30, 127.5, -127.5, 126.5];
        let mut values: Vec<f32> = special.to_vec();
        values.extend((0..600).map(|i| (i as f32 - 300.0) * 0.5)); // every half from −150 to 149.5
        values.extend((0..300).map(|i| ((i * 7919) as f32 * 0.001).sin() * 140.0));
        for s in [1.0f32, 0.37, 1.0 / 127.0, 3.5e-3] {
            let lens = [0usize, 1, 7, 8, 9, 15, 16, 17, 23, 31, 32, 100, values.len()];
            // The head of the values (the special ones first) and their tail.
            let slices = lens.iter().flat_map(|&len| [&values[..len], &values[values.len() - len..]]);
            for src in slices {
                let len = src.len();
                let want: Vec<i8> = src.iter().map(|&v| quantize_one(v, s)).collect();
                let mut got = vec![99i8; len];
                let sum = quantize(src, s, &mut got);
                assert_eq!(got, want, "scale {s} len {len}");
                assert_eq!(sum, want.iter().map(|&v| i32::from(v)).sum::<i32>(), "scale {s} len {len}");
                let want_amax = src.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                assert_eq!(amax(src).to_bits(), want_amax.to_bits(), "len {len}");
            }
        }
    }

    /// Without F16C, the AVX2 kernel widens f16 tables one value at a time, to the bits F16C gives (the
    /// path a CPU without F16C takes, run here on one that has it).
    #[test]
    fn f16_tables_widen_to_the_same_bits_without_f16c() {
        // A skip is printed, and is a failure where every level must run (INT4_TEST_EVERYTHING=1).
        let skip = |why: &str| {
            let msg = format!("f16_tables_widen_to_the_same_bits_without_f16c: SKIPPED ({why})");
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            eprintln!("{msg}");
        };
        let Some(tok) = Avx2Fma::new() else {
            return skip("no AVX2 + FMA");
        };
        if !std::arch::is_x86_feature_detected!("f16c") {
            return skip("no F16C to compare with");
        }
        let (groups, kp) = (3, 96);
        let table = |seed: u32| {
            // Both signs, normal values, subnormals (exponent 0) and signed zeros.
            let values = (0..groups * 16).map(|i| {
                let bits = match i % 8 {
                    0 => 0x8000,
                    1 => 0x0000,
                    2 | 3 => (i as u16 * 31 + seed as u16) % 0x0400,
                    _ => 0x2000 + (i as u16 * 997 + seed as u16) % 0x4000,
                };
                half::f16::from_bits(if i % 3 == 1 { bits | 0x8000 } else { bits })
            });
            ParamTable::from_f32(values.map(|h| h.to_f32()).collect())
        };
        let (scales, offsets) = (table(1), table(5));
        let w: Vec<u8> = (0..kp / 8 * 64).map(|i| (i * 37 % 251) as u8).collect();
        let spans: Vec<_> = (0..groups).map(|g| g * 32..(g + 1) * 32).collect();
        for m in 1..=5 {
            let x: Vec<i8> = (0..m * kp).map(|i| (i * 29 % 255) as i8).collect();
            let a_scales: Vec<f32> = (0..m * groups).map(|i| 0.01 * (i + 1) as f32).collect();
            let sums: Vec<i32> = (0..m * groups).map(|i| 100 - 17 * i as i32).collect();
            let terms = RowGroupTerms::table(&a_scales, &sums);
            let block = Block {
                w: &w,
                low: None,
                x: &x,
                kp,
                m,
                terms: &terms,
                groups,
                spans: GroupSpans::new(&spans, kp),
                w_scales: scales.view(),
                zeros: None,
                offsets: Some(offsets.view()),
            };
            let bias = [0.5f32; 16];
            let (mut with, mut without) = (vec![f32::NAN; m * 16], vec![f32::NAN; m * 16]);
            // SAFETY: this CPU has F16C (checked above); without it is allowed anywhere.
            unsafe {
                block_avx2_widening(tok, &block, &mut BlockOut::tile(&mut with, Some(&bias)), true);
                block_avx2_widening(tok, &block, &mut BlockOut::tile(&mut without, Some(&bias)), false);
            }
            assert_eq!(
                with.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                without.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{m} rows"
            );
            let mut portable = vec![0.5f32; m * 16];
            for r in 0..m {
                for (g, span) in spans.iter().enumerate() {
                    let mut acc = [0i32; 16];
                    for j in span.start / 8..span.end / 8 {
                        for (c, a) in acc.iter_mut().enumerate() {
                            for i in 0..4 {
                                let byte = w[j * 64 + 4 * c + i];
                                *a += i32::from(byte & 15) * i32::from(x[r * kp + 8 * j + i])
                                    + i32::from(byte >> 4) * i32::from(x[r * kp + 8 * j + 4 + i]);
                            }
                        }
                    }
                    block.finish(r, g, &acc, &mut portable[r * 16..(r + 1) * 16]);
                }
            }
            assert_eq!(
                with.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{m} rows against the shared epilogue"
            );
        }
    }
}
