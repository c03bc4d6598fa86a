//! The panel GEMM driver shared by the W4A16 prefill and the dense GEMM.
//!
//! Output channels are processed in *lane groups* of sixteen, [`LANES_PER_TASK`] lane groups per rayon task
//! (threads split N, never K). For each K chunk of [`KC`] input channels, a producer writes each lane
//! group's panel `[kc][16]` of f32 weights (dequantized from the packed layout, or copied from dense
//! weights); then a microkernel multiplies [`MR`] activation rows at a time against every panel in turn,
//! accumulating into each lane group's tile `[M][16]`. K chunks are visited in order, so each output's sum
//! has the same order whatever the thread count.

use rayon::prelude::*;

use crate::isa::Avx2Fma;
use crate::portable;

/// Input channels per panel.
pub const KC: usize = 256;
/// Activation rows per microkernel call.
pub const MR: usize = 6;
/// Lane groups per task: their panels (128 KiB at most) stay in L2 while each block of activation rows
/// sweeps across them.
pub const LANES_PER_TASK: usize = 8;

/// Writes lane group `lg`'s panel `[k1 − k0][16]` for input channels `k0..k1`: `(lg, k0, k1, panel)`.
pub(crate) type PanelProducer<'a> = dyn Fn(usize, usize, usize, &mut [f32]) + Sync + 'a;

/// Which implementation runs the inner loops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Engine {
    Avx2(Avx2Fma),
    Portable,
}

/// Fills `tiles` (`[lanes][m][16]`, zeroed by the caller) with `Σ_k x[r][k]·panel_lg[k][j]`, where
/// `produce(lg, k0, k1, panel)` writes lane group `lg`'s panel for input channels `k0..k1`.
pub(crate) fn panel_gemm(
    engine: Engine,
    x: &[f32],
    m: usize,
    k: usize,
    tiles: &mut [f32],
    produce: &PanelProducer<'_>,
) {
    assert_eq!(x.len(), m * k);
    assert_eq!(tiles.len() % (m * 16), 0);
    tiles.par_chunks_mut(m * 16 * LANES_PER_TASK).enumerate().for_each(|(task, tiles)| {
        let lg0 = task * LANES_PER_TASK;
        let lanes = tiles.len() / (m * 16);
        let mut panels = vec![0.0f32; lanes * KC.min(k) * 16];
        let mut k0 = 0;
        while k0 < k {
            let k1 = (k0 + KC).min(k);
            let kc = k1 - k0;
            for (l, panel) in panels.chunks_exact_mut(kc * 16).take(lanes).enumerate() {
                produce(lg0 + l, k0, k1, panel);
            }
            // Each block of MR activation rows (a few KiB, in L1) is used against every panel of the task
            // before moving on, so activations are read once per task rather than once per lane group.
            let mut r0 = 0;
            while r0 < m {
                let mr = MR.min(m - r0);
                let a = &x[r0 * k + k0..];
                for (l, panel) in panels.chunks_exact(kc * 16).take(lanes).enumerate() {
                    let t = &mut tiles[l * m * 16 + r0 * 16..l * m * 16 + (r0 + mr) * 16];
                    match engine {
                        Engine::Avx2(tok) => avx2_microkernel(tok, mr, kc, a, k, panel, t),
                        Engine::Portable => portable::gemm_microkernel(mr, kc, a, k, panel, t),
                    }
                }
                r0 += mr;
            }
            k0 = k1;
        }
    });
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

#[cfg(not(target_arch = "x86_64"))]
fn avx2_microkernel(_tok: Avx2Fma, mr: usize, kc: usize, a: &[f32], lda: usize, panel: &[f32], tile: &mut [f32]) {
    portable::gemm_microkernel(mr, kc, a, lda, panel, tile)
}

/// Writes lane-group tiles into the row-major output `[M][N]`, adding the bias: `out[r][ch] = tile[r][j] +
/// bias[ch]` for each lane `j` whose channel `ch = channels[lg][j]` is below `n`.
pub(crate) fn scatter(
    tiles: &[f32],
    m: usize,
    channels: &[[u32; 16]],
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    for (lg, map) in channels.iter().enumerate() {
        let tile = &tiles[lg * m * 16..(lg + 1) * m * 16];
        for r in 0..m {
            let row = &mut out[r * n..(r + 1) * n];
            for (j, &ch) in map.iter().enumerate() {
                let ch = ch as usize;
                if ch < n {
                    row[ch] = tile[r * 16 + j] + bias.map_or(0.0, |b| b[ch]);
                }
            }
        }
    }
}
