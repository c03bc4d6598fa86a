//! W4A8: 4-bit weights, activations quantized per token to int8, integer dot products on AMX tiles.
//!
//! * **Activations** ([`quantize_activations`]): per token, `scale = amax/127`, `xq = round(x/scale)`
//!   (ties to even, clamped to ±127), stored as `u8 = xq + 128` for the u8 × s8 dot product.
//! * **Weights** ([`W4A8Weights::pack`]): codes minus their zero point (8 for symmetric checkpoints, the
//!   checkpoint's own for asymmetric ones), `w8 = q − z` in −15..15, repacked per 16 output channels and K
//!   block into the VNNI order a `TDPBUSD` B tile wants, with a per-column compensation `comp = Σ w8` per
//!   block and f32 scales per group.
//! * **Per K block**: `acc = Σ u8·w8 − 128·comp` (= `Σ xq·w8`, exact in i32), then
//!   `out += acc · a_scale[m] · w_scale[group, n]` in f32, blocks in K order.
//!
//! The repacked B tiles hold one byte per weight (`w8`), twice the 4-bit footprint: expanding 4-bit blocks
//! into a tile buffer per K block at run time, as vLLM's kernel does, is the step that keeps the memory
//! saving and is not done yet.
//!
//! [`gemm`] runs that over any [`tile::TileUnit`]: it loads its own tile configuration before its first tile
//! instruction (never assuming another kernel's) and releases the tiles on every exit path. Tested bit for
//! bit against [`crate::reference::w4a8`] through the [`tile::TileEmulator`].

pub mod tile;

use int4_layout::{Codes, GroupSize};

use crate::error::{KernelError, check_len};
use tile::{TileConfig, TileError, TileUnit};

/// Per-token int8 activations, stored with a +128 offset, K padded to the weights' block.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedActivations {
    /// Rows.
    pub m: usize,
    /// Row length after padding (padding holds 128, that is 0).
    pub k_padded: usize,
    /// `[m][k_padded]` bytes, `xq + 128`.
    pub data: Vec<u8>,
    /// Per-row scale (`amax/127`).
    pub scales: Vec<f32>,
}

/// Quantizes `x` (`[m][k]`) per row, padding each row to a multiple of `k_block`.
pub fn quantize_activations(
    x: &[f32],
    m: usize,
    k: usize,
    k_block: usize,
) -> Result<QuantizedActivations, KernelError> {
    check_len("activations", m * k, x.len())?;
    let kp = k.next_multiple_of(k_block.max(1));
    let mut data = vec![128u8; m * kp];
    let mut scales = Vec::with_capacity(m);
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let amax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
        for (d, &v) in data[r * kp..r * kp + k].iter_mut().zip(row) {
            let q = (v / scale).round_ties_even().clamp(-127.0, 127.0) as i32;
            *d = (q + 128) as u8;
        }
        scales.push(scale);
    }
    Ok(QuantizedActivations { m, k_padded: kp, data, scales })
}

/// Weights repacked for the tile kernel.
#[derive(Clone, Debug)]
pub struct W4A8Weights {
    n: usize,
    k: usize,
    k_padded: usize,
    kb: usize,
    g_len: usize,
    /// `[N/16][K/kb][kb/4][64]`: B tiles in VNNI order.
    b: Vec<u8>,
    /// `[N/16][K/kb][16]`.
    comp: Vec<i32>,
    /// `[G][N]`.
    scales: Vec<f32>,
}

impl W4A8Weights {
    /// Repacks `codes` (`[N][K]`, N a multiple of 16) with `scales` (`[G][N]`) and integer zero points
    /// (`[G][N]`, `None` for a symmetric checkpoint: every zero is 8).
    pub fn pack(
        codes: &Codes,
        scales: &[f32],
        zero_points: Option<&[u8]>,
        group: GroupSize,
    ) -> Result<Self, KernelError> {
        let (n, k) = (codes.n(), codes.k());
        if n % 16 != 0 {
            return Err(KernelError::shape("W4A8 output channels (a multiple of 16)", n.next_multiple_of(16), n));
        }
        let g_len = group.len(k);
        let groups = group.groups(k);
        check_len("scales", groups * n, scales.len())?;
        if let Some(z) = zero_points {
            check_len("zero points", groups * n, z.len())?;
        }
        // A K block never straddles two groups: 32 for g32, 64 otherwise (one group spans all of K when
        // per-channel, so any block fits).
        let kb = if group == GroupSize::PerChannel { 64 } else { g_len.min(64) };
        let kp = k.next_multiple_of(kb);
        let kblocks = kp / kb;
        let mut b = vec![0u8; n / 16 * kblocks * kb * 16];
        let mut comp = vec![0i32; n / 16 * kblocks * 16];
        for nb in 0..n / 16 {
            for blk in 0..kblocks {
                let tile = &mut b[(nb * kblocks + blk) * kb * 16..(nb * kblocks + blk + 1) * kb * 16];
                for c in 0..16 {
                    let col = nb * 16 + c;
                    let mut sum = 0i32;
                    for i in 0..kb {
                        let kk = blk * kb + i;
                        let w8 = if kk < k {
                            let g = kk / g_len;
                            let z = zero_points.map_or(8, |z| z[g * n + col]);
                            i32::from(codes.get(col, kk)) - i32::from(z)
                        } else {
                            0
                        };
                        sum += w8;
                        // VNNI: row i/4 of the B tile, bytes 4c..4c+4 hold K values 4(i/4)..4(i/4)+4.
                        tile[(i / 4) * 64 + 4 * c + i % 4] = w8 as i8 as u8;
                    }
                    comp[(nb * kblocks + blk) * 16 + c] = sum;
                }
            }
        }
        Ok(W4A8Weights { n, k, k_padded: kp, kb, g_len, b, comp, scales: scales.to_vec() })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The K block (and the activations' padding multiple).
    pub fn k_block(&self) -> usize {
        self.kb
    }
}

/// `out[M][N] = dequant(xq)·W'ᵀ (+ bias)` on a tile unit, as described in the module docs.
pub fn gemm<T: TileUnit>(
    unit: &mut T,
    a: &QuantizedActivations,
    w: &W4A8Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len("activation row length", w.k_padded, a.k_padded)?;
    check_len("output", a.m * w.n, out.len())?;
    if let Some(b) = bias {
        check_len("bias", w.n, b.len())?;
    }
    let result = gemm_tiles(unit, a, w, bias, out);
    // Released on every path, success or error: the next kernel loads its own configuration.
    unit.release();
    result.map_err(|e| KernelError::new(crate::error::KernelErrorKind::Layout(format!("tile unit: {e}"))))
}

fn gemm_tiles<T: TileUnit>(
    unit: &mut T,
    a: &QuantizedActivations,
    w: &W4A8Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), TileError> {
    let (n, kb, kp) = (w.n, w.kb, w.k_padded);
    let kblocks = kp / kb;
    let mut acc = [0u8; 16 * 64];
    let mut m0 = 0;
    while m0 < a.m {
        let mr = 16.min(a.m - m0);
        // C: mr × 16 i32; A: mr × kb bytes; B: kb/4 rows × 64 bytes (16 columns × 4 K values).
        let cfg = TileConfig::new().with_tile(0, mr as u8, 64).with_tile(1, mr as u8, kb as u16).with_tile(
            2,
            (kb / 4) as u8,
            64,
        );
        unit.load_config(&cfg)?;
        for nb in 0..n / 16 {
            let mut tot = [[0.0f32; 16]; 16];
            for (r, row) in tot.iter_mut().enumerate().take(mr) {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = bias.map_or(0.0, |b| b[nb * 16 + c]);
                }
                let _ = r;
            }
            for blk in 0..kblocks {
                unit.zero(0)?;
                unit.load(1, &a.data[m0 * kp + blk * kb..], kp)?;
                unit.load(2, &w.b[(nb * kblocks + blk) * kb * 16..(nb * kblocks + blk + 1) * kb * 16], 64)?;
                unit.dpbusd(0, 1, 2)?;
                unit.store(0, &mut acc, 64)?;
                let g = (blk * kb) / w.g_len;
                for (r, row) in tot.iter_mut().enumerate().take(mr) {
                    for (c, v) in row.iter_mut().enumerate() {
                        let raw =
                            i32::from_le_bytes(acc[r * 64 + 4 * c..r * 64 + 4 * c + 4].try_into().expect("4 bytes"));
                        let x = raw.wrapping_sub(128i32.wrapping_mul(w.comp[(nb * kblocks + blk) * 16 + c]));
                        *v += x as f32 * a.scales[m0 + r] * w.scales[g * n + nb * 16 + c];
                    }
                }
            }
            for (r, row) in tot.iter().enumerate().take(mr) {
                out[(m0 + r) * n + nb * 16..(m0 + r) * n + nb * 16 + 16].copy_from_slice(row);
            }
        }
        m0 += mr;
    }
    Ok(())
}
