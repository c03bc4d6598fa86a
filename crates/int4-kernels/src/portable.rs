//! Portable Rust kernels: no intrinsics, no target features, so they run on any architecture.
//!
//! * [`Wna16Linear`] — the wna16 fallback: W4A16 computed straight from row-major nibbles (the portable
//!   checkpoint form, and what GPTQ/AWQ codes become after a load-time transpose). It exists so nothing is
//!   ever unrunnable; it is not meant to be chosen where a SIMD kernel runs.
//! * The scalar counterparts of the AVX2 inner loops (lane-group decode, panel dequantization, the GEMM
//!   microkernel, dot products), used when the ISA is capped to portable or the CPU lacks AVX2.
//!
//! These are kernels with error budgets of their own, checked against [`crate::reference`], which is the
//! definition; they are not the reference.

use int4_layout::{Codes, GroupParams, dequantize, rowmajor};
use rayon::prelude::*;

use crate::bytes::SharedBytes;
use crate::error::{KernelError, check_len};
use crate::kernel_id::KernelId;

/// W4A16 decode for one lane group (the arithmetic of [`crate::x86_64::avx2::decode_lanes`], one row at a
/// time, so a row's bits do not depend on `mr`): `bytes` starts at the lane group's offset, `sz` at its
/// `[G][32]` parameters, `tile` is `[mr][16]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_lane_group(
    mr: usize,
    x: &[f32],
    ldx: usize,
    xs: &[f32],
    bytes: &[u8],
    stride: usize,
    sz: &[f32],
    k: usize,
    g_len: usize,
    tile: &mut [f32],
) {
    let groups = k.div_ceil(g_len);
    for r in 0..mr {
        let xr = &x[r * ldx..r * ldx + k];
        let mut tot = [0.0f32; 16];
        for g in 0..groups {
            let mut acc = [0.0f32; 16];
            for kk in g * g_len..((g + 1) * g_len).min(k) {
                let b = &bytes[kk * stride..kk * stride + 8];
                for j in 0..8 {
                    acc[j] += xr[kk] * f32::from(b[j] & 0xF);
                    acc[j + 8] += xr[kk] * f32::from(b[j] >> 4);
                }
            }
            let p = &sz[g * 32..g * 32 + 32];
            for j in 0..16 {
                // s·Σ x·q + (z − 8s)·Σ x, the same factoring as the AVX2 kernel.
                tot[j] += p[j] * acc[j] + (p[16 + j] - 8.0 * p[j]) * xs[r * groups + g];
            }
        }
        tile[r * 16..r * 16 + 16].copy_from_slice(&tot);
    }
}

/// Panel dequantization for one lane group (see [`crate::x86_64::avx2::dequant_panel`]); produces the same
/// bits as the AVX2 version: the exact f32 weights.
pub(crate) fn dequant_panel(
    bytes: &[u8],
    stride: usize,
    sz: &[f32],
    k0: usize,
    k1: usize,
    g_len: usize,
    panel: &mut [f32],
) {
    for kk in k0..k1 {
        let g = kk / g_len;
        let p = &sz[g * 32..g * 32 + 32];
        let b = &bytes[kk * stride..kk * stride + 8];
        let dst = &mut panel[(kk - k0) * 16..(kk - k0) * 16 + 16];
        for j in 0..8 {
            dst[j] = dequantize(b[j] & 0xF, p[j], p[16 + j]);
            dst[j + 8] = dequantize(b[j] >> 4, p[8 + j], p[24 + j]);
        }
    }
}

/// The GEMM microkernel: `tile[r][j] += Σ_p a[r·lda + p]·panel[p][j]`.
pub(crate) fn gemm_microkernel(mr: usize, kc: usize, a: &[f32], lda: usize, panel: &[f32], tile: &mut [f32]) {
    for r in 0..mr {
        let ar = &a[r * lda..r * lda + kc];
        let t = &mut tile[r * 16..r * 16 + 16];
        for (p, &av) in ar.iter().enumerate() {
            let b = &panel[p * 16..p * 16 + 16];
            for j in 0..16 {
                t[j] += av * b[j];
            }
        }
    }
}

/// The wna16 fallback: a 4-bit layer as row-major nibbles plus f32 scales and zeros, computed by plain
/// loops (per output channel, per group: `s·Σ x·(q − 8) + z·Σ x`, f32 accumulation).
#[derive(Clone, Debug)]
pub struct Wna16Linear {
    n: usize,
    k: usize,
    row_major: SharedBytes,
    params: GroupParams,
    bias: Option<Vec<f32>>,
}

impl Wna16Linear {
    /// Builds the layer from row-major nibbles (`[N][K/2]`, K even) and parameters. The bytes may be a
    /// section of a memory-mapped artifact, read in place.
    pub fn new(row_major: SharedBytes, params: GroupParams, bias: Option<Vec<f32>>) -> Result<Self, KernelError> {
        let (n, k) = (params.n(), params.k());
        if !k.is_multiple_of(2) {
            return Err(KernelError::invalid(format!("row-major nibbles need an even K, got {k}")));
        }
        check_len("row-major nibbles", n * k / 2, row_major.len())?;
        if let Some(b) = &bias {
            check_len("bias", n, b.len())?;
        }
        Ok(Wna16Linear { n, k, row_major, params, bias })
    }

    /// Builds the layer from unpacked codes.
    pub fn from_codes(codes: &Codes, params: GroupParams, bias: Option<Vec<f32>>) -> Result<Self, KernelError> {
        Self::new(rowmajor::pack(codes)?.into(), params, bias)
    }

    /// The row-major nibbles (`[N][K/2]`).
    pub fn row_major(&self) -> &[u8] {
        &self.row_major
    }

    /// The parameters.
    pub fn params(&self) -> &GroupParams {
        &self.params
    }

    /// Which kernel this is.
    pub fn kernel(&self) -> KernelId {
        KernelId::Wna16Portable
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let (n, k) = (self.n, self.k);
        check_len("activations", m * k, x.len())?;
        check_len("output", m * n, out.len())?;
        let g_len = self.params.group_size().len(k);
        let groups = self.params.groups();
        let xs = group_sums(x, m, k, g_len);
        // Columns in parallel: each task owns whole output channels and writes them into a column buffer.
        let cols: Vec<f32> = (0..n)
            .into_par_iter()
            .with_min_len(16)
            .flat_map_iter(|col| {
                let row = &self.row_major[col * k / 2..(col + 1) * k / 2];
                let mut codes = vec![0u8; k];
                rowmajor::unpack_row_into(row, &mut codes);
                let b = self.bias.as_ref().map_or(0.0, |b| b[col]);
                (0..m)
                    .map(|r| {
                        let xr = &x[r * k..(r + 1) * k];
                        let mut tot = 0.0f32;
                        for g in 0..groups {
                            let range = g * g_len..((g + 1) * g_len).min(k);
                            let mut acc = 0.0f32;
                            for kk in range {
                                acc += xr[kk] * (f32::from(codes[kk]) - 8.0);
                            }
                            tot += self.params.scale(col, g) * acc + self.params.zero(col, g) * xs[r * groups + g];
                        }
                        tot + b
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        for col in 0..n {
            for r in 0..m {
                out[r * n + col] = cols[col * m + r];
            }
        }
        Ok(KernelId::Wna16Portable)
    }
}

/// `xs[r][g] = Σ_{k∈g} x[r][k]`, summed in K order in f32.
pub(crate) fn group_sums(x: &[f32], m: usize, k: usize, g_len: usize) -> Vec<f32> {
    let groups = k.div_ceil(g_len);
    let mut xs = Vec::with_capacity(m * groups);
    for r in 0..m {
        for g in 0..groups {
            xs.push(x[r * k + g * g_len..r * k + ((g + 1) * g_len).min(k)].iter().sum());
        }
    }
    xs
}
