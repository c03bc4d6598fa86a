//! The panel GEMM driver shared by the W4A16 prefill and the dense GEMM.
//!
//! Output channels are processed in *lane groups* of sixteen, [`LANES_PER_TASK`] lane groups per rayon task
//! (threads split N, never K). For each K chunk of input channels, a producer writes each lane group's
//! panel `[kc][16]` of f32 weights (dequantized from the packed layout, or copied from dense weights);
//! then a microkernel multiplies a block of activation rows against the panels, accumulating into each
//! lane group's tile `[M][16]`. K chunks are visited in order, so each output's sum has the same order
//! whatever the thread count.
//!
//! Two loop orders, one per register width:
//! * 8-lane microkernels (AVX2, portable): chunks of [`KC`] channels; each block of [`MR`] activation rows
//!   (a few KiB, in L1) sweeps every panel of the task (128 KiB, in L2).
//! * The AVX-512 microkernel does twice the arithmetic per panel byte, and with the panels in L2 an Intel
//!   core's L2 could not feed it. So it takes chunks of [`KC_WIDE`] channels and one pair of panels at a
//!   time (16 KiB, which stays in L1) against every block of [`MR_WIDE`] rows in turn, the activations
//!   packed once per product so that a block's rows stream from one place (docs/perf.md, "The AVX-512 f32
//!   prefill on an Intel core").

use rayon::prelude::*;

use crate::isa::{Avx2Fma, Avx512, Avx512Bf16};
use crate::portable;

/// Input channels per panel of the 8-lane and bf16 microkernels.
pub const KC: usize = 256;
/// Activation rows per call of the 8-lane microkernels.
pub const MR: usize = 6;
/// Activation rows per call of the AVX-512 microkernel: with two lane groups, 24 accumulators (of 32
/// registers), so each panel row loaded feeds 24 multiply-adds.
pub const MR_WIDE: usize = 12;
/// Input channels per panel of the AVX-512 microkernel: a pair of panels is 16 KiB, in L1 beside the
/// activation block even on a 32 KiB L1.
pub const KC_WIDE: usize = 128;
/// Lane groups per task: on the 8-lane microkernels their panels (128 KiB at most) stay in L2 while each
/// block of activation rows sweeps across them; on the AVX-512 one (64 KiB of panels) each pair of them
/// takes every block of rows in turn.
pub const LANES_PER_TASK: usize = 8;

/// Writes lane group `lg`'s panel `[k1 − k0][16]` for input channels `k0..k1`: `(lg, k0, k1, panel)`.
pub(crate) type PanelProducer<'a> = dyn Fn(usize, usize, usize, &mut [f32]) + Sync + 'a;

/// Which implementation runs the inner loops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum InnerLoops {
    Avx2(Avx2Fma),
    Portable,
}

/// Fills `tiles` (`[lanes][m][16]`, of any contents: each task zeroes its own part, or starts its first
/// chunk's sums from zero) with `Σ_k x[r][k]·panel_lg[k][j]`, where `produce(lg, k0, k1, panel)` writes lane
/// group `lg`'s panel for input channels `k0..k1`.
///
/// With `wide`, the microkernel is the AVX-512 one, two lane groups per call (a 512-bit register per row
/// and lane group), in the module's second loop order: each output is the same chain of fused
/// multiply-adds over `k` in order as on the 8-lane microkernels, so the result is bit for bit `loops`'
/// alone.
pub(crate) fn panel_gemm(
    loops: InnerLoops,
    wide: Option<Avx512>,
    x: &[f32],
    m: usize,
    k: usize,
    tiles: &mut [f32],
    produce: &PanelProducer<'_>,
) {
    assert_eq!(x.len(), m * k);
    assert_eq!(tiles.len() % (m * 16), 0);
    let packed = wide.map(|_| pack_rows(x, m, k));
    let packed_rows = packed.as_deref();
    tiles.par_chunks_mut(m * 16 * LANES_PER_TASK).enumerate().for_each(|(task, tiles)| {
        if wide.is_none() {
            tiles.fill(0.0);
        }
        let lg0 = task * LANES_PER_TASK;
        let lanes = tiles.len() / (m * 16);
        let kc_max = if wide.is_some() { KC_WIDE } else { KC };
        let mut panels = vec![0.0f32; lanes * kc_max.min(k) * 16];
        let mut k0 = 0;
        while k0 < k {
            let k1 = (k0 + kc_max).min(k);
            let kc = k1 - k0;
            for (l, panel) in panels.chunks_exact_mut(kc * 16).take(lanes).enumerate() {
                produce(lg0 + l, k0, k1, panel);
            }
            // A pair of panels (in L1) against every block of rows, the blocks streaming from the packed rows.
            if let (Some(tok), Some(packed)) = (wide, packed_rows) {
                let mut l = 0;
                while l < lanes {
                    let pair = usize::from(l + 1 < lanes) + 1;
                    let p = &panels[l * kc * 16..(l + pair) * kc * 16];
                    let (t0s, rest) = tiles[l * m * 16..].split_at_mut(m * 16);
                    let mut r0 = 0;
                    while r0 < m {
                        let mr = MR_WIDE.min(m - r0);
                        let a = &packed[(r0 / MR_WIDE * k + k0) * MR_WIDE..];
                        let t0 = &mut t0s[r0 * 16..(r0 + mr) * 16];
                        let t1 = if pair == 2 { Some(&mut rest[r0 * 16..(r0 + mr) * 16]) } else { None };
                        avx512_microkernel(tok, mr, kc, a, p, t0, t1, k0 == 0);
                        r0 += mr;
                    }
                    l += pair;
                }
                k0 = k1;
                continue;
            }
            // Each block of MR activation rows (a few KiB, in L1) is used against every panel of the task
            // before moving on, so activations are read once per task rather than once per lane group.
            let mut r0 = 0;
            while r0 < m {
                let mr = MR.min(m - r0);
                let a = &x[r0 * k + k0..];
                for (l, panel) in panels.chunks_exact(kc * 16).take(lanes).enumerate() {
                    let t = &mut tiles[l * m * 16 + r0 * 16..l * m * 16 + (r0 + mr) * 16];
                    match loops {
                        InnerLoops::Avx2(tok) => avx2_microkernel(tok, mr, kc, a, k, panel, t),
                        InnerLoops::Portable => portable::gemm_microkernel(mr, kc, a, k, panel, t),
                    }
                }
                r0 += mr;
            }
            k0 = k1;
        }
    });
    if let Some(packed) = packed {
        keep_buffer(&PACKED_ROWS, packed);
    }
}

/// The activations `[m][k]` row-interleaved in blocks of [`MR_WIDE`] rows: block `b`'s input channel `p`
/// of row `r` at `(b·k + p)·MR_WIDE + r`. The slots of the rows past `m` in the last block hold whatever a
/// previous product left (the microkernel reads only a block's rows). In the calling thread's kept buffer
/// (give it back with [`keep_buffer`]).
fn pack_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let mut packed = take_buffer(&PACKED_ROWS, m.div_ceil(MR_WIDE) * k * MR_WIDE);
    packed.par_chunks_mut(k * MR_WIDE).enumerate().for_each(|(b, block)| {
        let rows = MR_WIDE.min(m - b * MR_WIDE);
        for r in 0..rows {
            let src = &x[(b * MR_WIDE + r) * k..(b * MR_WIDE + r + 1) * k];
            for (p, &v) in src.iter().enumerate() {
                block[p * MR_WIDE + r] = v;
            }
        }
    });
    packed
}

/// A product's lane-group tiles (`len` floats), kept by the calling thread between products. A fresh
/// zeroed buffer for a prompt (megabytes) is zeroed on the calling thread once the allocator reuses freed
/// memory (it does after the first few), before the parallel loop starts; a kept one is not. Its contents
/// are whatever the last product left: every writer of tiles sets each value first ([`panel_gemm`] zeroes
/// each task's part in the task, or on AVX-512 writes the first K chunk's sums from zero). A product
/// larger than [`KEEP_TILE_FLOATS`] gets a buffer of its own and leaves the kept one alone. Return it with
/// [`keep_tiles`].
pub(crate) fn take_tiles(len: usize) -> Vec<f32> {
    take_buffer(&TILES, len)
}

/// Gives `tiles` back to [`take_tiles`]' thread for its next product, unless it is larger than
/// [`KEEP_TILE_FLOATS`].
pub(crate) fn keep_tiles(tiles: Vec<f32>) {
    keep_buffer(&TILES, tiles);
}

/// `len` floats from the calling thread's buffer `kept` (of whatever it last held), or a fresh zeroed one
/// when `len` is over [`KEEP_TILE_FLOATS`] or the kept one is shorter.
fn take_buffer(kept: &'static std::thread::LocalKey<std::cell::Cell<Vec<f32>>>, len: usize) -> Vec<f32> {
    if len > KEEP_TILE_FLOATS {
        return vec![0.0; len];
    }
    let mut buf = kept.take();
    if buf.len() < len {
        buf = vec![0.0; len];
    }
    buf.truncate(len);
    buf
}

/// Keeps `buf` as the calling thread's `kept` buffer, unless it is larger than [`KEEP_TILE_FLOATS`].
fn keep_buffer(kept: &'static std::thread::LocalKey<std::cell::Cell<Vec<f32>>>, buf: Vec<f32>) {
    if buf.capacity() <= KEEP_TILE_FLOATS {
        kept.set(buf);
    }
}

/// The most floats a thread keeps in each of its buffers between products (8 MiB: SmolLM2's widest layer
/// at 512 rows takes 6 MiB of tiles). Each thread that runs products keeps its own tiles and, on AVX-512,
/// packed rows, so a process holds at most twice this much per pool thread.
const KEEP_TILE_FLOATS: usize = 2 << 20;

thread_local! {
    /// [`take_tiles`]' buffer.
    static TILES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// [`pack_rows`]' buffer.
    static PACKED_ROWS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Activation rows per bf16 microkernel call: with two lane groups per call, twelve independent
/// `vdpbf16ps` accumulator chains, enough to cover its latency.
pub const MR_BF16: usize = 6;

/// Activations rounded to bf16 for [`panel_gemm_bf16`]: `[m][bf16_stride(k)]` pairs, each row padded with
/// zeros after its `ceil(k/2)` pairs.
pub(crate) fn bf16_rows(tok: Avx512Bf16, x: &[f32], m: usize, k: usize) -> Vec<u32> {
    assert_eq!(x.len(), m * k);
    let lda = bf16_stride(k);
    let mut out = vec![0u32; m * lda];
    for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(lda)) {
        to_bf16_checked(tok, row, dst);
    }
    out
}

/// The row stride of [`bf16_rows`], in pairs: `ceil(k/2)` plus one cache line, so that the rows a
/// microkernel reads together never sit a multiple of 4 KiB apart (which would put them all in one L1 set:
/// at K = 2048 the unpadded rows are exactly 4 KiB apart).
pub(crate) fn bf16_stride(k: usize) -> usize {
    k.div_ceil(2) + 16
}

/// The same GEMM as [`panel_gemm`] on bf16: each f32 panel `produce` writes is rounded to bf16 pairs
/// (`[kc/2][16][2]`) and multiplied by `vdpbf16ps` against the activation pairs `xb` (from
/// [`bf16_rows`], rows [`bf16_stride`] apart), `tiles` as there. K chunks ([`KC`], even, so pairs never straddle one) in order; threads split N.
pub(crate) fn panel_gemm_bf16(
    tok: Avx512Bf16,
    xb: &[u32],
    m: usize,
    k: usize,
    tiles: &mut [f32],
    produce: &PanelProducer<'_>,
) {
    const { assert!(KC.is_multiple_of(2)) };
    let kp = bf16_stride(k);
    assert_eq!(xb.len(), m * kp);
    assert_eq!(tiles.len() % (m * 16), 0);
    tiles.par_chunks_mut(m * 16 * LANES_PER_TASK).enumerate().for_each(|(task, tiles)| {
        tiles.fill(0.0);
        let lg0 = task * LANES_PER_TASK;
        let lanes = tiles.len() / (m * 16);
        let mut f32_panel = vec![0.0f32; KC.min(k) * 16];
        let mut panels = vec![0u16; lanes * KC.min(k).div_ceil(2) * 32];
        let mut k0 = 0;
        while k0 < k {
            let k1 = (k0 + KC).min(k);
            let (kc, kpc) = (k1 - k0, (k1 - k0).div_ceil(2));
            for (l, panel) in panels.chunks_exact_mut(kpc * 32).take(lanes).enumerate() {
                produce(lg0 + l, k0, k1, &mut f32_panel[..kc * 16]);
                pack_bf16_checked(tok, &f32_panel[..kc * 16], kc, panel);
            }
            let mut r0 = 0;
            while r0 < m {
                let mr = MR_BF16.min(m - r0);
                let a = &xb[r0 * kp + k0 / 2..];
                // Lane groups two at a time (sharing each activation broadcast), an odd last one alone.
                let mut l = 0;
                while l < lanes {
                    let width = if l + 1 < lanes { 2 } else { 1 };
                    let (pl, tl) = (&panels[l * kpc * 32..(l + width) * kpc * 32], &mut tiles[l * m * 16..]);
                    bf16_microkernel(tok, mr, kpc, a, kp, pl, tl, m, r0, width);
                    l += width;
                }
                r0 += mr;
            }
            k0 = k1;
        }
    });
}

/// Rounds `row` to bf16 into `dst` (as u16 pairs), after checking the lengths.
fn to_bf16_checked(_tok: Avx512Bf16, row: &[f32], dst: &mut [u32]) {
    assert!(dst.len() * 2 >= row.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `Avx512Bf16` proves AVX-512 F/BW/VL and BF16; `row` is readable for its length and `dst`
    // writable for at least as many u16 (checked above).
    unsafe {
        crate::x86_64::avx512::to_bf16(row.as_ptr(), row.len(), dst.as_mut_ptr().cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Avx512Bf16 token exists off x86-64");
}

/// Packs one f32 panel `[kc][16]` into bf16 pairs after checking the lengths.
fn pack_bf16_checked(_tok: Avx512Bf16, panel: &[f32], kc: usize, out: &mut [u16]) {
    assert!(panel.len() >= kc * 16 && out.len() >= kc.div_ceil(2) * 32);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `Avx512Bf16` proves AVX-512 F/BW/VL and BF16; the assert gives the kc·16 floats read and the
    // ceil(kc/2)·32 u16 written.
    unsafe {
        crate::x86_64::avx512::pack_bf16_pairs(panel.as_ptr(), kc, out.as_mut_ptr())
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Avx512Bf16 token exists off x86-64");
}

/// Calls the bf16 microkernel for rows `r0..r0 + mr` of `width` (1 or 2) consecutive lane groups, after
/// checking every range it will touch: `panels` holds their `[kp][32]` panels back to back, `tiles` starts
/// at the first one's `[m][16]` tile (the next follows it).
#[allow(clippy::too_many_arguments)]
fn bf16_microkernel(
    _tok: Avx512Bf16,
    mr: usize,
    kp: usize,
    a: &[u32],
    lda: usize,
    panels: &[u16],
    tiles: &mut [f32],
    m: usize,
    r0: usize,
    width: usize,
) {
    assert!((1..=MR_BF16).contains(&mr) && (1..=2).contains(&width) && r0 + mr <= m);
    assert!(a.len() >= (mr - 1) * lda + kp, "activation rows out of range");
    assert!(panels.len() >= width * kp * 32 && tiles.len() >= (width - 1) * m * 16 + (r0 + mr) * 16);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::x86_64::avx512::gemm_microkernel_bf16 as mk;
        let a = a.as_ptr();
        let p = [panels.as_ptr(), panels[kp * 32 * (width - 1)..].as_ptr()];
        let t0 = tiles[r0 * 16..].as_mut_ptr();
        // SAFETY: `Avx512Bf16` proves AVX-512 F/BW/VL and BF16. The asserts give every range the
        // microkernel reads (a[r·lda + p] for r < mr, p < kp; kp·32 u16 of each of `width` panels) and
        // reads and writes (rows r0..r0 + mr of each of `width` tiles, m·16 floats apart). With width 1
        // only the first panel and tile are passed.
        unsafe {
            let t = [t0, t0.add(m * 16 * (width - 1))];
            macro_rules! go {
                ($($r:literal)*) => {
                    match (mr, width) {
                        $(($r, 2) => mk::<$r, 2>(kp, a, lda, p, t),)*
                        $(($r, _) => mk::<$r, 1>(kp, a, lda, [p[0]], [t[0]]),)*
                        _ => unreachable!("mr is in 1..=MR_BF16"),
                    }
                };
            }
            go!(1 2 3 4 5 6)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Avx512Bf16 token exists off x86-64");
}

/// Calls the AVX2 microkernel for `mr` rows after checking every range it will touch.
#[cfg(target_arch = "x86_64")]
fn avx2_microkernel(_tok: Avx2Fma, mr: usize, kc: usize, a: &[f32], lda: usize, panel: &[f32], tile: &mut [f32]) {
    assert!((1..=MR).contains(&mr));
    assert!(a.len() >= (mr - 1) * lda + kc, "activation rows out of range");
    assert!(panel.len() >= kc * 16 && tile.len() >= mr * 16);
    use crate::x86_64::avx2::gemm_microkernel as mk;
    let (a, p, t) = (a.as_ptr(), panel.as_ptr(), tile.as_mut_ptr());
    // SAFETY: holding `Avx2Fma` proves the CPU has AVX2 and FMA. The asserts above give every range the
    // microkernel reads (a[r·lda + p] for r < mr, p < kc; panel[0..kc·16]) and writes (tile[0..mr·16]).
    unsafe {
        match mr {
            1 => mk::<1>(kc, a, lda, p, t),
            2 => mk::<2>(kc, a, lda, p, t),
            3 => mk::<3>(kc, a, lda, p, t),
            4 => mk::<4>(kc, a, lda, p, t),
            5 => mk::<5>(kc, a, lda, p, t),
            _ => mk::<6>(kc, a, lda, p, t),
        }
    }
}

/// The AVX-512 microkernel for `mr` rows against one lane group's panel (`t1` absent) or two side by side
/// (`panels` holds both, `[2][kc][16]`), after checking every range it touches.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn avx512_microkernel(
    _tok: Avx512,
    mr: usize,
    kc: usize,
    a: &[f32],
    panels: &[f32],
    t0: &mut [f32],
    t1: Option<&mut [f32]>,
    from_zero: bool,
) {
    assert!((1..=MR_WIDE).contains(&mr));
    assert!(a.len() >= kc * MR_WIDE, "activation rows out of range");
    let two = t1.is_some();
    assert!(panels.len() >= kc * 16 * (1 + usize::from(two)) && t0.len() >= mr * 16);
    assert!(t1.as_ref().is_none_or(|t| t.len() >= mr * 16));
    use crate::x86_64::avx512::gemm_microkernel_f32 as mk;
    let (a, p0) = (a.as_ptr(), panels.as_ptr());
    let t0 = t0.as_mut_ptr();
    macro_rules! rows {
        ($p:literal, $ps:expr, $ts:expr) => {
            match mr {
                1 => mk::<1, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                2 => mk::<2, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                3 => mk::<3, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                4 => mk::<4, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                5 => mk::<5, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                6 => mk::<6, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                7 => mk::<7, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                8 => mk::<8, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                9 => mk::<9, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                10 => mk::<10, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                11 => mk::<11, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
                _ => mk::<12, $p, MR_WIDE>(kc, a, $ps, $ts, from_zero),
            }
        };
    }
    // SAFETY: holding `Avx512` proves the CPU has AVX-512F. The asserts above give every range the
    // microkernel reads (a[p·MR_WIDE + r] for r < mr ≤ MR_WIDE, p < kc; each panel's kc·16 floats, the
    // second at kc·16) and writes (mr rows of 16 floats of each tile).
    unsafe {
        match t1 {
            Some(t1) => rows!(2, [p0, p0.add(kc * 16)], [t0, t1.as_mut_ptr()]),
            None => rows!(1, [p0], [t0]),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
fn avx512_microkernel(
    _tok: Avx512,
    _mr: usize,
    _kc: usize,
    _a: &[f32],
    _panels: &[f32],
    _t0: &mut [f32],
    _t1: Option<&mut [f32]>,
    _from_zero: bool,
) {
    unreachable!("no Avx512 token exists off x86-64");
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_microkernel(_tok: Avx2Fma, mr: usize, kc: usize, a: &[f32], lda: usize, panel: &[f32], tile: &mut [f32]) {
    portable::gemm_microkernel(mr, kc, a, lda, panel, tile)
}

/// Where each lane of a lane-group tile lands in a row-major output `[M][N]`: lane `j` of lane group `lg`
/// is channel `channels[lg][j]`, dropped where that is `n` or more (a last block's padding). Built once per
/// layer (a decode scatters every call, and its lanes never change): a lane group whose lanes are two runs
/// of eight consecutive channels (every full tinygemm block's) is kept as the two runs' starts, so
/// [`scatter`] copies each as one slice; any other goes lane by lane.
#[derive(Clone, Debug)]
pub(crate) struct ScatterPlan {
    n: usize,
    lanes: Vec<LaneTarget>,
    /// Whether there is a quad of lane groups for each 64 channels and every lane group `lg`'s channels lie
    /// in `64·(lg/4)..64·(lg/4) + 64`, so the tiles of each four lane groups fill one 64-channel piece of
    /// an output row ([`ScatterPlan::quad_into`]).
    quads_in_place: bool,
}

/// Where one lane group's sixteen lanes go: [`ScatterPlan`]'s entry.
#[derive(Clone, Copy, Debug)]
enum LaneTarget {
    /// Lanes 0..8 are channels `starts[0]..starts[0] + 8`, lanes 8..16 `starts[1]..starts[1] + 8`, all
    /// below `n`.
    Runs([usize; 2]),
    /// Lane `j` is channel `channels[j]`, dropped at `n` or more.
    Lanes([u32; 16]),
}

impl ScatterPlan {
    /// The plan for lane groups whose lanes hold `channels` (in lane-group order), into `n` channels.
    pub(crate) fn new(channels: impl IntoIterator<Item = [u32; 16]>, n: usize) -> Self {
        let run = |h: &[u32]| h.windows(2).all(|w| w[0].checked_add(1) == Some(w[1])) && (h[7] as usize) < n;
        let lanes = channels
            .into_iter()
            .map(|map| {
                if run(&map[..8]) && run(&map[8..]) {
                    LaneTarget::Runs([map[0] as usize, map[8] as usize])
                } else {
                    LaneTarget::Lanes(map)
                }
            })
            .collect::<Vec<_>>();
        let in_piece = |lg: usize, c: usize| c / 64 == lg / 4;
        let quads_in_place = lanes.len().div_ceil(4) == n.div_ceil(64)
            && lanes.iter().enumerate().all(|(lg, t)| match t {
                LaneTarget::Runs([a, b]) => [*a, a + 7, *b, b + 7].iter().all(|&c| in_piece(lg, c)),
                LaneTarget::Lanes(map) => map.iter().map(|&c| c as usize).filter(|&c| c < n).all(|c| in_piece(lg, c)),
            });
        ScatterPlan { n, lanes, quads_in_place }
    }

    /// Lane groups `lg·16 + j` → channel `lg·16 + j`: a dense layer's.
    pub(crate) fn in_order(n: usize) -> Self {
        Self::new((0..n.div_ceil(16)).map(|lg| std::array::from_fn(|j| (lg * 16 + j) as u32)), n)
    }

    /// Whether [`ScatterPlan::quad_into`] may be used: each four lane groups' channels form one
    /// 64-channel piece of the output.
    pub(crate) fn quads_in_place(&self) -> bool {
        self.quads_in_place
    }

    /// Writes the one-row tiles of lane groups `4q..4q + 4` (`tiles`: `[4][16]`, fewer for the last) into
    /// `piece`, channels `64q..64q + piece.len()` of an output row, adding the bias: what [`scatter`]
    /// writes there at M = 1.
    ///
    /// # Panics
    /// Unless [`ScatterPlan::quads_in_place`], or if `piece` or `tiles` is shorter than the quad's lanes.
    pub(crate) fn quad_into(&self, q: usize, tiles: &[f32], bias: Option<&[f32]>, piece: &mut [f32]) {
        assert!(self.quads_in_place, "lane groups not in 64-channel pieces");
        let c0 = 64 * q;
        let quad = &self.lanes[4 * q..(4 * q + 4).min(self.lanes.len())];
        let tiles = &tiles[..quad.len() * 16];
        for (target, t) in quad.iter().zip(tiles.chunks_exact(16)) {
            write_lanes(target, t, self.n, bias, c0, piece);
        }
    }
}

/// One lane group's row of sixteen values `t` into `row` (channels `c0..c0 + row.len()` of an output
/// row of `n`), each plus its channel's bias (`+ 0.0` without one).
#[inline]
fn write_lanes(target: &LaneTarget, t: &[f32], n: usize, bias: Option<&[f32]>, c0: usize, row: &mut [f32]) {
    match target {
        LaneTarget::Runs(starts) => {
            for (half, &c) in starts.iter().enumerate() {
                let src = &t[8 * half..8 * half + 8];
                let dst = &mut row[c - c0..c - c0 + 8];
                match bias {
                    Some(b) => dst.iter_mut().zip(src).zip(&b[c..c + 8]).for_each(|((o, &v), &b)| *o = v + b),
                    None => dst.iter_mut().zip(src).for_each(|(o, &v)| *o = v + 0.0),
                }
            }
        }
        LaneTarget::Lanes(map) => {
            for (&v, &ch) in t.iter().zip(map) {
                let ch = ch as usize;
                if ch < n {
                    row[ch - c0] = v + bias.map_or(0.0, |b| b[ch]);
                }
            }
        }
    }
}

/// Writes lane-group tiles (`[lanes][m][16]`) into the row-major output `[M][N]` as `plan` maps them,
/// adding the bias: `out[r][ch] = tile[r][j] + bias[ch]`. From [`PARALLEL_SCATTER_FLOATS`] outputs, bands
/// of [`SCATTER_BAND_ROWS`] rows are split over the pool (a prefill's `M × N`; on one thread the scatter is
/// the serial part of a many-core prompt). Within a band each tile is read as one run of its rows, as the
/// serial order reads it.
pub(crate) fn scatter(tiles: &[f32], m: usize, plan: &ScatterPlan, bias: Option<&[f32]>, out: &mut [f32]) {
    let n = plan.n;
    if m == 0 || n == 0 {
        return;
    }
    let band = |(band, rows): (usize, &mut [f32])| {
        let r0 = band * SCATTER_BAND_ROWS;
        for (lg, target) in plan.lanes.iter().enumerate() {
            let tile = &tiles[(lg * m + r0) * 16..];
            for (row, t) in rows.chunks_exact_mut(n).zip(tile.chunks_exact(16)) {
                write_lanes(target, t, n, bias, 0, row);
            }
        }
    };
    let out = &mut out[..m * n];
    if m > SCATTER_BAND_ROWS && m * n >= PARALLEL_SCATTER_FLOATS {
        out.par_chunks_mut(SCATTER_BAND_ROWS * n).enumerate().for_each(band);
    } else {
        out.chunks_mut(SCATTER_BAND_ROWS * n).enumerate().for_each(band);
    }
}

/// From this many output values (and more than one band) [`scatter`] runs its bands in parallel; a
/// smaller output takes a microsecond or two on one thread, less than a hand-off.
const PARALLEL_SCATTER_FLOATS: usize = 1 << 16;

/// Rows per band of [`scatter`]: a tile's band is one 1 KiB run.
const SCATTER_BAND_ROWS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept tile buffer's old contents never reach a result: the GEMM over a buffer of NaNs left by an
    /// earlier product gives the bits it gives over zeros.
    #[test]
    fn a_kept_tile_buffer_of_old_values_gives_the_same_product() {
        let (m, k, lanes) = (21, 300, 11);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        // Each weight a function of its lane group, input channel and lane, whatever the panels' chunks.
        let produce = |lg: usize, k0: usize, k1: usize, panel: &mut [f32]| {
            for (i, p) in panel[..(k1 - k0) * 16].iter_mut().enumerate() {
                *p = ((lg * 7 + (k0 + i / 16) * 3 + i % 16) % 13) as f32 * 0.125 - 0.75;
            }
        };
        let len = lanes * m * 16;
        let loops = crate::isa::Avx2Fma::new().map_or(InnerLoops::Portable, InnerLoops::Avx2);
        let mut fresh = vec![0.0f32; len];
        panel_gemm(loops, None, &x, m, k, &mut fresh, &produce);
        keep_tiles(vec![f32::NAN; 2 * len]);
        let mut kept = take_tiles(len);
        assert!(kept.iter().all(|v| v.is_nan()), "the kept buffer comes back as it was left");
        panel_gemm(loops, None, &x, m, k, &mut kept, &produce);
        assert!(kept.iter().zip(&fresh).all(|(a, b)| a.to_bits() == b.to_bits()));
        // The AVX-512 order over NaN tiles and NaN packed rows (including the slots past the last row).
        match Avx512::new() {
            Some(wide) => {
                let mut tiles = vec![f32::NAN; len];
                keep_buffer(&PACKED_ROWS, vec![f32::NAN; m.div_ceil(MR_WIDE) * k * MR_WIDE]);
                panel_gemm(loops, Some(wide), &x, m, k, &mut tiles, &produce);
                assert!(tiles.iter().zip(&fresh).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
            None => {
                let msg = "skipped: the AVX-512 order of the kept-buffer check (no AVX-512F on this CPU)";
                eprintln!("{msg}");
                assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            }
        }
        // Larger than what is kept: a buffer of its own, the kept one left for the next product.
        keep_tiles(kept);
        assert!(take_tiles(KEEP_TILE_FLOATS + 1).iter().all(|&v| v == 0.0));
        assert_eq!(take_tiles(len).len(), len);
    }

    /// The scatter in bands, serial and parallel, writes what the definition says: each lane's value plus
    /// its channel's bias, lanes past `n` dropped, with a last band of fewer rows.
    #[test]
    fn scatter_writes_every_channel_its_lane_plus_bias_in_bands() {
        for (m, n) in [(5usize, 100usize), (37, 100), (5, 104), (37, 2000), (0, 100), (3, 0)] {
            let lanes = n.div_ceil(16);
            // Odd lane groups hold channels in a rotated order, even ones two runs of eight (as a full
            // tinygemm block's do); the last one's lanes past n are padding.
            let channels: Vec<[u32; 16]> = (0..lanes)
                .map(|lg| std::array::from_fn(|j| (lg * 16 + if lg % 2 == 1 { (j + lg) % 16 } else { j }) as u32))
                .collect();
            let tiles: Vec<f32> = (0..lanes * m * 16).map(|i| (i % 1013) as f32 * 0.5 - 200.0).collect();
            let bias: Vec<f32> = (0..n).map(|c| c as f32 * 0.25).collect();
            for bias in [None, Some(&bias[..])] {
                let mut want = vec![f32::NAN; m * n];
                for (lg, map) in channels.iter().enumerate() {
                    for r in 0..m {
                        for (j, &ch) in map.iter().enumerate() {
                            if (ch as usize) < n {
                                let b = bias.map_or(0.0, |b| b[ch as usize]);
                                want[r * n + ch as usize] = tiles[(lg * m + r) * 16 + j] + b;
                            }
                        }
                    }
                }
                assert_eq!(m * n >= PARALLEL_SCATTER_FLOATS, n == 2000, "both paths are run, with several bands");
                let mut got = vec![f32::NAN; m * n];
                scatter(&tiles, m, &ScatterPlan::new(channels.iter().copied(), n), bias, &mut got);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "M={m} N={n}");
            }
        }
    }
}
