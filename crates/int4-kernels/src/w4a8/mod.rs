//! W4A8: 4-bit weights, activations quantized per token to int8, integer dot products.
//!
//! # What is computed
//!
//! * **Activations** ([`quantize_activations`]): `scale = amax/127` and `xq = round(x/scale)` (ties to
//!   even, clamped to ±127), kept signed, with one scale per token ([`ActivationScales::PerToken`]) or
//!   one per token and weight group ([`ActivationScales::PerGroup`], the default: finer, at no cost in
//!   the kernels, whose epilogue multiplies by a per-group scale product either way). Each row also
//!   records `Σ xq` per weight group.
//! * **Weights** ([`W4A8Weights::pack`]): the checkpoint's unsigned codes `q` in `0..16`, with the group
//!   scales `s`, integer zero points `z` (the constant 8 for symmetric checkpoints, the checkpoint's own
//!   for asymmetric ones) and, optionally, float offsets `f`: `w = s·(q − z) + f`. The offsets carry
//!   float zero points (a `cpu_int4` checkpoint, or GGUF Q4_1's `d·q + m`, which integer zero points
//!   cannot hold: there `z = 8` and `f` is the float zero).
//! * **Per group**: `acc = Σ xq·q − z·Σ xq`, which is `Σ xq·(q − z)` exactly, in i32. Then
//!   `out = fma(acc, a_scale[m][g]·s[g][n], out)` in f32 and, with offsets,
//!   `out = fma(Σ xq, a_scale[m][g]·f[g][n], out)`; groups in K order, starting from the bias.
//! * **8-bit weights** ([`int8`]): two 4-bit planes with the same geometry run as one layer whose codes
//!   are `u = 16·hi + lo` in `0..256`, with zero point 128 (in the same `z·Σ xq` term) and the low
//!   plane's scales, no offsets: the same per-group arithmetic on 8-bit codes.
//!
//! Keeping the codes unsigned makes them the unsigned operand of every x86 byte dot product (`vpmaddubsw`,
//! `vpdpbusd`, `tdpbsud` with A signed and B unsigned), and the activations the signed one. So no +128
//! offset and no compensation term are needed: the zero point's `z·Σ xq` is the only correction, applied
//! once per group, and symmetric and asymmetric checkpoints run the same kernel. No product can saturate
//! the 16-bit pair sums of `vpmaddubsw`: `|2·15·127| < 2¹⁵`. The AMX tiling, which has a signed-by-signed
//! product (`tdpbssd`), stores codes whose zero point is implicit (8, a pair's 128) less it, as signed
//! bytes, so its sums are `Σ xq·(q − z)` directly: the same integers, with the correction folded in.
//!
//! # Layout
//!
//! The codes and parameters are in the W4A8 block layout of [`int4_layout::w4a8`] (documented, mapped by
//! `locate` and proven by index patterns there): per 16 output channels and 8 input channels, 64 bytes, so
//! one 64-byte load is a VNNI pair of K quads for 16 channels (AVX-512: one register; AVX2: two), unpacked
//! with one AND and one shift; K padded with zero codes to the tile K block (padded activations are zero);
//! the group parameters stored per block, `[N/16][G][16]`, so a kernel streaming the blocks reads codes
//! and parameters as two sequential streams (docs/perf.md has what `[G][N]` order cost); a float table is
//! held in f16 when every value in it is one exactly ([`params`]), widened exactly in the kernels. The AMX
//! kernel expands one 16-channel block at a time into a byte tile buffer (the B tiles in VNNI order), so
//! the resident weights stay at 4 bits.
//!
//! # Kernels
//!
//! [`W4A8Kernel`]: portable Rust (any CPU), AVX2 (`vpmaddubsw`), AVX-512 VNNI (`vpdpbusd`), and AMX
//! (`tdpbsud`, or `tdpbssd` on codes stored less an implicit zero point; from [`AMX_MIN_ROWS`] rows, VNNI
//! below). The AMX tiling is written once over
//! [`crate::tile::TileUnit`], so the same code runs on the hardware (`AmxTiles`, in `x86_64::amx`) and, in
//! tests here, on the bit-exact [`crate::tile::TileEmulator`]. Every kernel computes the same integers and the same f32 operations in
//! the same order, so all of them agree with [`crate::reference::w4a8`] bit for bit (8-bit pairs, whose
//! codes that reference cannot hold, with the per-group arithmetic above, written out in the tests).

pub(crate) mod block;
pub mod int8;
pub mod params;
pub(crate) mod round;

use std::ops::Range;

use int4_layout::w4a8 as layout_w4a8;
use int4_layout::{Codes, GroupSize};
use rayon::prelude::*;

use crate::bytes::SharedBytes;
use crate::choice::{self, BoundKernel, BoundKernels, LayerSpec};
use crate::error::{KernelError, KernelErrorKind, check_len};
use crate::isa::{AmxInt8, Avx2Fma, Avx512Vnni, IsaCaps, IsaLevel};
use crate::kernel_id::KernelId;
use crate::tile::{TileConfig, TileError, TileUnit};
use block::{Block, BlockOut, GroupSpans, GroupSums, RowGroupTerms};
use params::Params;
pub use params::{ParamTable, ParamType, TableBytes};
use round::quantize_one;

pub use crate::choice::W4A8_AMX_MIN_ROWS as AMX_MIN_ROWS;

/// Bytes per 16 channels × 8 input channels ([`int4_layout::w4a8::CHUNK_BYTES`]).
const CHUNK: usize = layout_w4a8::CHUNK_BYTES;

/// How finely activations are scaled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ActivationScales {
    /// One scale per token (row).
    PerToken,
    /// One scale per token and weight group: an outlier costs precision only within its group.
    #[default]
    PerGroup,
}

impl ActivationScales {
    /// The name used in kernel tables and reports.
    pub fn name(self) -> &'static str {
        match self {
            ActivationScales::PerToken => "per-token",
            ActivationScales::PerGroup => "per-group",
        }
    }
}

/// int8 activations, K padded to the weights' block, with per-group scales and sums.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedActivations {
    /// Rows.
    pub m: usize,
    /// Row length after padding (padding is zero).
    pub k_padded: usize,
    /// `[m][k_padded]`.
    pub data: Vec<i8>,
    /// `[m][groups]`: each group's scale (`amax/127` over the group, or over the row when per token; 1 for
    /// all zeros).
    pub scales: Vec<f32>,
    /// `[m][groups]`: `Σ xq` over each weight group.
    pub sums: Vec<i32>,
}

/// One row's outputs while quantizing: index, codes, group scales and group sums.
type RowOut<'a> = (usize, ((&'a mut [i8], &'a mut [f32]), &'a mut [i32]));

/// The scale for values of largest magnitude `amax`: `amax/127`, or 1 when there is nothing to scale.
fn scale_for(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() { amax / 127.0 } else { 1.0 }
}

fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// Quantizes `x` (`[m][k]`, `k = w.k()`) for the weights `w`, scaled per token or per group.
pub fn quantize_activations(
    x: &[f32],
    m: usize,
    w: &W4A8Weights,
    granularity: ActivationScales,
) -> Result<QuantizedActivations, KernelError> {
    let (k, kp, groups) = (w.k, w.k_padded, w.groups);
    check_len("activations", m * k, x.len())?;
    let mut data = vec![0i8; m * kp];
    let mut scales = vec![0.0f32; m * groups];
    let mut sums = vec![0i32; m * groups];
    // AVX-512 and AVX2 run the same rule sixteen and eight values at a time, to the same bits (tested
    // against this one).
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = (crate::isa::Avx512::new(), crate::isa::Avx2Fma::new());
    let amax = |v: &[f32]| {
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = avx512 {
            return crate::x86_64::w4a8::amax_avx512(tok, v);
        } else if let Some(tok) = avx2 {
            return crate::x86_64::w4a8::amax_avx2(tok, v);
        }
        amax(v)
    };
    let quantize = |src: &[f32], s: f32, dst: &mut [i8]| -> i32 {
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = avx512 {
            return crate::x86_64::w4a8::quantize_avx512(tok, src, s, dst);
        } else if let Some(tok) = avx2 {
            return crate::x86_64::w4a8::quantize_avx2(tok, src, s, dst);
        }
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = quantize_one(v, s);
        }
        dst.iter().map(|&v| i32::from(v)).sum()
    };
    let quantize_row = |(r, ((q, scales), sums)): RowOut<'_>| {
        let row = &x[r * k..(r + 1) * k];
        let row_scale = (granularity == ActivationScales::PerToken).then(|| scale_for(amax(row)));
        for (g, (scale, sum)) in scales.iter_mut().zip(sums.iter_mut()).enumerate() {
            // The group's span within the unpadded row (the padding stays zero).
            let span = w.group_span(g);
            let span = span.start.min(k)..span.end.min(k);
            let src = &row[span.clone()];
            *scale = row_scale.unwrap_or_else(|| scale_for(amax(src)));
            *sum = quantize(src, *scale, &mut q[span]);
        }
    };
    let g1 = groups.max(1);
    let rows = data.par_chunks_mut(kp).zip(scales.par_chunks_mut(g1)).zip(sums.par_chunks_mut(g1));
    // Rows are independent; a decode step's few rows are not worth waking other threads for.
    if m >= 16 {
        rows.enumerate().for_each(quantize_row);
    } else {
        data.chunks_mut(kp).zip(scales.chunks_mut(g1)).zip(sums.chunks_mut(g1)).enumerate().for_each(quantize_row);
    }
    Ok(QuantizedActivations { m, k_padded: kp, data, scales, sums })
}

/// 4-bit weights for the W4A8 kernels (layout in the module docs).
#[derive(Clone, Debug)]
pub struct W4A8Weights {
    n: usize,
    k: usize,
    k_padded: usize,
    kb: usize,
    g_len: usize,
    groups: usize,
    /// `[N/16][k_padded/8][64]`.
    packed: SharedBytes,
    /// `[N/16][G][16]` (block order, see the module docs), f16 where exact ([`params`]).
    scales: ParamTable,
    /// `[N/16][G][16]`, each below 16; `None`: symmetric, every zero point is 8.
    zeros: Option<SharedBytes>,
    /// `[N/16][G][16]` float offsets (`w = s·(q − z) + f`), f16 where exact; `None`: every offset is 0.
    offsets: Option<ParamTable>,
}

impl W4A8Weights {
    /// Packs `codes` (`[N][K]`, N a multiple of 16) with `scales_gn` (`[G][N]`), integer zero points
    /// `zeros_gn` (`[G][N]`, each below 16; `None` for a symmetric checkpoint, where every zero is 8) and
    /// float offsets `offsets_gn` (`[G][N]`; `None`: 0): `w = s·(q − z) + f`.
    pub fn pack(
        codes: &Codes,
        scales_gn: &[f32],
        zeros_gn: Option<&[u8]>,
        offsets_gn: Option<&[f32]>,
        group: GroupSize,
    ) -> Result<Self, KernelError> {
        let (n, k) = (codes.n(), codes.k());
        Self::geometry(n, k, group)?;
        let packed = layout_w4a8::pack(codes, group)?;
        let groups = group.groups(k);
        check_len("W4A8 scales [G][N]", groups * n, scales_gn.len())?;
        if let Some(z) = zeros_gn {
            check_len("W4A8 zero points [G][N]", groups * n, z.len())?;
        }
        if let Some(f) = offsets_gn {
            check_len("W4A8 offsets [G][N]", groups * n, f.len())?;
        }
        let table = |v: &[f32]| -> Result<TableBytes, KernelError> {
            Ok(ParamTable::from_f32(layout_w4a8::to_block_order(v, n, groups)?).to_bytes())
        };
        let zeros = match zeros_gn {
            Some(z) => Some(layout_w4a8::to_block_order(z, n, groups)?.into()),
            None => None,
        };
        let offsets = offsets_gn.map(table).transpose()?;
        Self::from_parts(packed.into(), table(scales_gn)?, zeros, offsets, (n, k, group))
    }

    /// Builds the weights from stored parts ([`Self::packed`], [`Self::scales`], [`Self::zeros`],
    /// [`Self::offsets`]; parameters in block order `[N/16][G][16]`, each float table in the width it was
    /// stored in), read in place. Every length is checked, every zero point, and every offset is finite.
    pub fn from_parts(
        packed: SharedBytes,
        scales: TableBytes,
        zeros: Option<SharedBytes>,
        offsets: Option<TableBytes>,
        (n, k, group): (usize, usize, GroupSize),
    ) -> Result<Self, KernelError> {
        let (kp, kb) = Self::geometry(n, k, group)?;
        let (g_len, groups) = (group.len(k), group.groups(k));
        check_len("W4A8 packed bytes", n / 16 * kp / 8 * CHUNK, packed.len())?;
        check_len("W4A8 scale bytes", groups * n * scales.ty.bytes(), scales.bytes.len())?;
        if let Some(z) = &zeros {
            check_len("W4A8 zero points", groups * n, z.len())?;
            if let Some(bad) = z.iter().find(|&&z| z > 15) {
                return Err(KernelError::invalid(format!("a W4A8 zero point is {bad}; 4-bit zero points are 0..=15")));
            }
        }
        let scales = ParamTable::from_bytes(scales)?;
        let offsets = match offsets {
            Some(b) => {
                check_len("W4A8 offset bytes", groups * n * b.ty.bytes(), b.bytes.len())?;
                let f = ParamTable::from_bytes(b)?;
                if let Some(bad) = (0..f.len()).map(|i| f.get(i)).find(|v| !v.is_finite()) {
                    return Err(KernelError::invalid(format!("a W4A8 float offset is {bad}; offsets must be finite")));
                }
                Some(f)
            }
            None => None,
        };
        Ok(W4A8Weights { n, k, k_padded: kp, kb, g_len, groups, packed, scales, zeros, offsets })
    }

    fn geometry(n: usize, k: usize, group: GroupSize) -> Result<(usize, usize), KernelError> {
        if n == 0 || !n.is_multiple_of(16) {
            return Err(KernelError::shape(
                "W4A8 output channels (a positive multiple of 16)",
                n.next_multiple_of(16).max(16),
                n,
            ));
        }
        if k == 0 {
            return Err(KernelError::shape("W4A8 input channels (at least 1)", 1, 0));
        }
        Ok((layout_w4a8::padded_k(group, k), layout_w4a8::k_block(group, k)))
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// K after padding to the tile block.
    pub fn k_padded(&self) -> usize {
        self.k_padded
    }

    /// The tile K block (32 or 64).
    pub fn k_block(&self) -> usize {
        self.kb
    }

    /// Group length in input channels.
    pub fn group_len(&self) -> usize {
        self.g_len
    }

    /// Groups along K.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Group `g`'s input channels in padded K (the last group takes the padding).
    pub fn group_span(&self, g: usize) -> Range<usize> {
        let start = g * self.g_len;
        let end = if g + 1 == self.groups { self.k_padded } else { (g + 1) * self.g_len };
        start..end
    }

    /// The packed codes.
    pub fn packed(&self) -> &SharedBytes {
        &self.packed
    }

    /// The scales in block order, `[N/16][G][16]` (module docs; [`Self::scale`] reads one).
    pub fn scales(&self) -> &ParamTable {
        &self.scales
    }

    /// The integer zero points in block order, `[N/16][G][16]`; `None` when symmetric (all 8).
    pub fn zeros(&self) -> Option<&SharedBytes> {
        self.zeros.as_ref()
    }

    /// The float offsets in block order, `[N/16][G][16]`; `None` when every offset is 0.
    pub fn offsets(&self) -> Option<&ParamTable> {
        self.offsets.as_ref()
    }

    /// Where group `g`'s parameter of output channel `col` lies in the block-order tables.
    fn param_index(&self, g: usize, col: usize) -> usize {
        layout_w4a8::param_index(self.groups, g, col)
    }

    /// The scale of group `g`, output channel `col`.
    pub fn scale(&self, g: usize, col: usize) -> f32 {
        self.scales.get(self.param_index(g, col))
    }

    /// The integer zero point of group `g`, output channel `col` (8 when symmetric).
    pub fn zero(&self, g: usize, col: usize) -> u8 {
        self.zeros.as_ref().map_or(8, |z| z[self.param_index(g, col)])
    }

    /// The float offset of group `g`, output channel `col` (0 without offsets).
    pub fn offset(&self, g: usize, col: usize) -> f32 {
        self.offsets.as_ref().map_or(0.0, |f| f.get(self.param_index(g, col)))
    }

    /// The scales as `[G][N]` (a copy, in the order [`Self::pack`] takes them).
    pub fn scales_gn(&self) -> Vec<f32> {
        (0..self.groups * self.n).map(|i| self.scale(i / self.n, i % self.n)).collect()
    }

    /// The integer zero points as `[G][N]` (a copy); `None` when symmetric.
    pub fn zeros_gn(&self) -> Option<Vec<u8>> {
        self.zeros.as_ref().map(|_| (0..self.groups * self.n).map(|i| self.zero(i / self.n, i % self.n)).collect())
    }

    /// The float offsets as `[G][N]` (a copy); `None` without offsets.
    pub fn offsets_gn(&self) -> Option<Vec<f32>> {
        self.offsets.as_ref().map(|_| (0..self.groups * self.n).map(|i| self.offset(i / self.n, i % self.n)).collect())
    }

    /// Code `(row, k)`.
    pub fn code(&self, row: usize, kk: usize) -> u8 {
        layout_w4a8::locate(row, kk, self.k_padded).read(&self.packed)
    }

    /// Row `row` of the weights, `(q − z)·s + f` (how a tied 4-bit head serves the embedding lookup).
    pub fn decode_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("decoded row", self.k, out.len())?;
        if row >= self.n {
            return Err(KernelError::shape("row index (below N)", self.n, row));
        }
        for (kk, o) in out.iter_mut().enumerate() {
            let g = kk / self.g_len;
            let w = i32::from(self.code(row, kk)) - i32::from(self.zero(g, row));
            *o = (w as f32).mul_add(self.scale(g, row), self.offset(g, row));
        }
        Ok(())
    }

    /// Bytes resident for these weights (codes, scales, zero points, offsets).
    pub fn resident_bytes(&self) -> usize {
        self.packed.len()
            + self.scales.resident_bytes()
            + self.zeros.as_ref().map_or(0, |z| z.len())
            + self.offsets.as_ref().map_or(0, ParamTable::resident_bytes)
    }

    fn block_bytes(&self, nb: usize) -> &[u8] {
        let len = self.k_padded / 8 * CHUNK;
        &self.packed[nb * len..(nb + 1) * len]
    }

    /// Block `nb`'s scales, zero points and offsets, each `[G][16]`.
    #[allow(clippy::type_complexity)]
    fn block_params(&self, nb: usize) -> (Params<'_>, Option<&[u8]>, Option<Params<'_>>) {
        let r = nb * self.groups * 16..(nb + 1) * self.groups * 16;
        let offsets = self.offsets.as_ref().map(|f| f.view().slice(r.clone()));
        (self.scales.view().slice(r.clone()), self.zeros.as_ref().map(|z| &z[r]), offsets)
    }
}

/// The portable kernel for one block.
fn block_portable(b: &Block, out: &mut BlockOut) {
    assert!(out.rows() >= b.m, "a block output of {} rows for {} activation rows", out.rows(), b.m);
    out.start(0..b.m);
    for r in 0..b.m {
        let x = &b.x[r * b.kp..(r + 1) * b.kp];
        for (g, span) in b.spans.iter().enumerate() {
            let mut acc = [0i32; 16];
            for j in span.start / 8..span.end / 8 {
                let chunk = &b.w[j * CHUNK..(j + 1) * CHUNK];
                let low = b.low.map(|l| &l[j * CHUNK..(j + 1) * CHUNK]);
                let (lo, hi) = (&x[8 * j..8 * j + 4], &x[8 * j + 4..8 * j + 8]);
                for (c, a) in acc.iter_mut().enumerate() {
                    for i in 0..4 {
                        let byte = chunk[4 * c + i];
                        // The chunk's two K quads: low nibbles first; of a pair, 16·hi + lo.
                        let (q0, q1) = match low {
                            None => (i32::from(byte & 15), i32::from(byte >> 4)),
                            Some(l) => {
                                let l = l[4 * c + i];
                                (
                                    i32::from(byte & 15) * 16 + i32::from(l & 15),
                                    i32::from(byte >> 4) * 16 + i32::from(l >> 4),
                                )
                            }
                        };
                        *a += q0 * i32::from(lo[i]) + q1 * i32::from(hi[i]);
                    }
                }
            }
            b.finish(r, g, &acc, out.row(r));
        }
    }
}

/// Which implementation runs the W4A8 product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum W4A8Kernel {
    /// Portable Rust, any CPU.
    Portable,
    /// AVX2 `vpmaddubsw`.
    Avx2(Avx2Fma),
    /// AVX-512 VNNI `vpdpbusd`.
    Vnni(Avx512Vnni),
    /// AMX tiles from [`AMX_MIN_ROWS`] rows, VNNI below.
    Amx(AmxInt8),
}

impl W4A8Kernel {
    /// What W4A8 layers are, for [`crate::choice::choose`]: one kernel family, whose AMX prefill takes
    /// over from [`AMX_MIN_ROWS`] rows.
    pub fn spec() -> LayerSpec {
        LayerSpec::W4a8 { prefill_from: AMX_MIN_ROWS }
    }

    /// The kernel that `kernels` run for `m` rows, with its token; an error unless they are W4A8 kernels.
    pub fn for_rows(kernels: &BoundKernels, m: usize) -> Result<Self, KernelError> {
        Ok(match kernels.bound_for_rows(m) {
            BoundKernel::W4a8Portable => W4A8Kernel::Portable,
            BoundKernel::W4a8Avx2(t) => W4A8Kernel::Avx2(t),
            BoundKernel::W4a8Vnni(t) => W4A8Kernel::Vnni(t),
            BoundKernel::W4a8Amx(t) => W4A8Kernel::Amx(t),
            other => {
                return Err(KernelError::new(KernelErrorKind::WrongFamily { kernel: other.id(), layer: "W4A8" }));
            }
        })
    }

    /// The kernel decode rows run: this one, except that the AMX binding runs its VNNI code (what one row
    /// runs), never tiles, however many decode rows share a call.
    pub fn for_decode(self) -> Self {
        match self {
            #[cfg(target_arch = "x86_64")]
            W4A8Kernel::Amx(t) => W4A8Kernel::Vnni(t.vnni()),
            other => other,
        }
    }

    /// The kernel that runs `m` rows.
    pub fn id_for(self, m: usize) -> KernelId {
        match self {
            W4A8Kernel::Portable => KernelId::W4a8Portable,
            W4A8Kernel::Avx2(_) => KernelId::W4a8Avx2,
            W4A8Kernel::Vnni(_) => KernelId::W4a8Vnni,
            W4A8Kernel::Amx(_) if m >= AMX_MIN_ROWS => KernelId::W4a8Amx,
            W4A8Kernel::Amx(_) => KernelId::W4a8Vnni,
        }
    }
}

/// Checks the operands shared by every entry point.
fn check_operands(
    a: &QuantizedActivations,
    w: &W4A8Weights,
    bias: Option<&[f32]>,
    out: &[f32],
) -> Result<(), KernelError> {
    check_len("activation row length", w.k_padded, a.k_padded)?;
    check_len("activations", a.m * w.k_padded, a.data.len())?;
    check_len("activation scales", a.m * w.groups, a.scales.len())?;
    check_len("activation group sums", a.m * w.groups, a.sums.len())?;
    check_len("output", a.m * w.n, out.len())?;
    if let Some(b) = bias {
        check_len("bias", w.n, b.len())?;
    }
    Ok(())
}

/// One block's kernel: sets the block's sixteen columns of every row in its [`BlockOut`], starting from the
/// bias (or zero).
type BlockKernel<'a> = dyn Fn(&Block, &mut BlockOut) -> Result<(), TileError> + Sync + 'a;

/// The weights one product runs against: a 4-bit layer, or both planes of an 8-bit one at once (each
/// weight's code `16·hi + lo`, [`Block::low`]; the planes as [`int8::Int8Weights`] checked them).
#[derive(Clone, Copy, Debug)]
enum Operand<'a> {
    Four(&'a W4A8Weights),
    Eight { hi: &'a W4A8Weights, lo: &'a W4A8Weights },
}

impl<'a> Operand<'a> {
    /// The weights whose geometry and scales the product uses: the layer, or the low plane (both planes
    /// have the same geometry; the low plane's scales are the 8-bit grid's).
    fn shape(self) -> &'a W4A8Weights {
        match self {
            Operand::Four(w) => w,
            Operand::Eight { lo, .. } => lo,
        }
    }

    /// Block `nb` of the weights, for activations `x` (`[m][kp]`) and their row terms.
    fn block<'b>(self, nb: usize, x: &'b [i8], m: usize, terms: &'b [RowGroupTerms], spans: GroupSpans<'b>) -> Block<'b>
    where
        'a: 'b,
    {
        let w = self.shape();
        let (w_scales, zeros, offsets) = w.block_params(nb);
        // A pair's zero point is 128 and it has no offsets (the low plane's zero points, all 0, are its own).
        let (codes, low, zeros, offsets) = match self {
            Operand::Four(w) => (w.block_bytes(nb), None, zeros, offsets),
            Operand::Eight { hi, lo } => (hi.block_bytes(nb), Some(lo.block_bytes(nb)), None, None),
        };
        Block { w: codes, low, x, kp: w.k_padded, m, terms, groups: w.groups, spans, w_scales, zeros, offsets }
    }
}

/// Runs `per_block(block, block_out)` over every 16-channel block in parallel (threads split N, never K),
/// each writing its sixteen columns of `out[m][n]` in place ([`BlockOut`]).
fn run_blocks(
    a: &QuantizedActivations,
    op: Operand<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
    per_block: &BlockKernel<'_>,
) -> Result<(), KernelError> {
    let w = op.shape();
    check_operands(a, w, bias, out)?;
    let m = a.m;
    if m == 0 {
        return Ok(());
    }
    let spans: Vec<Range<usize>> = (0..w.groups).map(|g| w.group_span(g)).collect();
    let spans = GroupSpans::new(&spans, w.k_padded);
    let terms = RowGroupTerms::table(&a.scales, &a.sums);
    // Keep tasks to at least ~64 K weight bytes × rows so small layers are not drowned in scheduling.
    let min_blocks = (65536 / (w.k_padded * 8 * m).max(1)).max(1);
    // check_operands: a bias holds n values.
    let bias16 = |nb: usize| bias.map(|b| <&[f32; 16]>::try_from(&b[nb * 16..nb * 16 + 16]).expect("16 values"));
    let run = |nb: usize, mut block_out: BlockOut| per_block(&op.block(nb, &a.data, m, &terms, spans), &mut block_out);
    if m == 1 {
        // One row's outputs, `[N/16][16]`, are each block's tile.
        int4_team::try_for_each_chunk_mut(out, 16, min_blocks, |nb, tile| run(nb, BlockOut::tile(tile, bias16(nb))))
    } else {
        let columns = BlockColumns::new(out, m, w.n);
        (0..w.n / 16).into_par_iter().with_min_len(min_blocks).try_for_each(|nb| {
            // SAFETY: the parallel loop hands each block index `nb` to exactly one task.
            run(nb, unsafe { columns.block(nb, bias16(nb)) })
        })
    }
    .map_err(KernelError::from)
}

/// `out[m][n]` as the tasks of one product write it: each writes its blocks' sixteen columns of every
/// row, so no two tasks touch the same value, and nothing else reads `out` while they run (the borrow
/// is held for the product).
struct BlockColumns<'a> {
    out: *mut f32,
    m: usize,
    n: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: shared references reach `out` only through `block`, whose callers take disjoint columns (its
// contract), so tasks on other threads never touch the same value; the exclusive borrow of `out` outlives
// them.
unsafe impl Sync for BlockColumns<'_> {}

impl<'a> BlockColumns<'a> {
    fn new(out: &'a mut [f32], m: usize, n: usize) -> Self {
        assert_eq!(out.len(), m * n, "BlockColumns over an output that is not [m][n]");
        BlockColumns { out: out.as_mut_ptr(), m, n, _out: std::marker::PhantomData }
    }

    /// Block `nb`'s output: columns `nb·16 .. nb·16 + 16` of every row.
    ///
    /// # Safety
    /// While the result lives, no other result for the same `nb` may: each block's columns have one writer.
    unsafe fn block(&self, nb: usize, bias: Option<&'a [f32; 16]>) -> BlockOut<'a> {
        assert!((nb + 1) * 16 <= self.n, "block {nb} outside an output of {} columns", self.n);
        // SAFETY: `out` came from a slice, so it is aligned for f32; nb·16 + 16 ≤ n (asserted), so the
        // stride n is at least 16, and out holds m·n values (checked in `new`), so row r < m's sixteen
        // values at nb·16 + r·n lie within it, borrowed for 'a; no other task reaches them (the caller's
        // contract, and no block's columns overlap another's).
        unsafe { BlockOut::strided(self.out.add(nb * 16), self.n, self.m, bias) }
    }
}

/// `out[M][N] = dequant(a)·Wᵀ (+ bias)` on `kernel`.
pub fn gemm(
    kernel: W4A8Kernel,
    a: &QuantizedActivations,
    w: &W4A8Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    gemm_operand(kernel, a, Operand::Four(w), bias, out)
}

/// `out[M][N] = dequant(a)·Wᵀ (+ bias)` on `kernel` for the 8-bit weights whose planes are `hi` and `lo`
/// (an [`int8::Int8Weights`] pair), both planes in one pass ([`int8`]'s arithmetic). `a` is quantized for
/// either plane (they have the same geometry).
pub(crate) fn gemm_planes(
    kernel: W4A8Kernel,
    a: &QuantizedActivations,
    (hi, lo): (&W4A8Weights, &W4A8Weights),
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    gemm_operand(kernel, a, Operand::Eight { hi, lo }, bias, out)
}

/// [`gemm`] or [`gemm_planes`], as `op` says.
fn gemm_operand(
    kernel: W4A8Kernel,
    a: &QuantizedActivations,
    op: Operand<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    match kernel {
        W4A8Kernel::Portable => run_blocks(a, op, bias, out, &|b, t| {
            block_portable(b, t);
            Ok(())
        }),
        #[cfg(target_arch = "x86_64")]
        W4A8Kernel::Avx2(tok) => run_blocks(a, op, bias, out, &|b, t| {
            crate::x86_64::w4a8::block_avx2(tok, b, t);
            Ok(())
        }),
        #[cfg(target_arch = "x86_64")]
        W4A8Kernel::Vnni(tok) => run_blocks(a, op, bias, out, &|b, t| {
            crate::x86_64::w4a8::block_vnni(tok, b, t);
            Ok(())
        }),
        #[cfg(target_arch = "x86_64")]
        W4A8Kernel::Amx(tok) if a.m >= AMX_MIN_ROWS => {
            let epilogue = TileEpilogue::Avx512(tok.vnni());
            tiles_operand(&|| crate::x86_64::amx::AmxTiles::new(tok), epilogue, a, op, bias, out)
        }
        #[cfg(target_arch = "x86_64")]
        W4A8Kernel::Amx(tok) => gemm_operand(W4A8Kernel::Vnni(tok.vnni()), a, op, bias, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("x86 tokens cannot be constructed on other architectures"),
    }
}

/// The AMX tiling over any tile unit: `new_unit` makes one per task (tile state belongs to a thread). Each
/// task loads its own configuration before its first tile instruction and releases the tiles on every
/// exit path, so no kernel depends on another's tile state.
///
/// Per 16-channel block, the codes are expanded once into byte B tiles (`[K/4][16 × 4]`, VNNI order);
/// then per 16 rows (a row tile) and per group, `tdpbsud` accumulates `Σ xq·q` over the group's K blocks
/// in an i32 tile (`tdpbssd`, `Σ xq·(q − z)`, where the zero point is implicit), which the shared epilogue
/// turns into f32.
pub fn gemm_tiles<T: TileUnit + 'static>(
    new_unit: &(dyn Fn() -> T + Sync),
    a: &QuantizedActivations,
    w: &W4A8Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    tiles_operand(new_unit, TileEpilogue::live(), a, Operand::Four(w), bias, out)
}

/// [`gemm_tiles`] for the planes `hi` and `lo` of 8-bit weights, both in one pass (the AMX tiling of
/// [`gemm_planes`]).
pub(crate) fn tiles_planes<T: TileUnit + 'static>(
    new_unit: &(dyn Fn() -> T + Sync),
    a: &QuantizedActivations,
    (hi, lo): (&W4A8Weights, &W4A8Weights),
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    tiles_operand(new_unit, TileEpilogue::live(), a, Operand::Eight { hi, lo }, bias, out)
}

/// How the AMX tiling turns a group's i32 sums into f32: [`Block::finish`] row by row, or the same
/// arithmetic sixteen lanes at a time. The tiles' dot products take a group in one instruction per 64 inputs, so
/// a scalar epilogue would cost several times the products (docs/perf.md, "AMX on hardware").
#[derive(Clone, Copy, Debug)]
enum TileEpilogue {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512Vnni),
}

impl TileEpilogue {
    /// The AVX-512 epilogue where this process may run it, else the scalar one: what the tiling takes over
    /// a unit given by the caller (the tile emulator in tests), so on an AVX-512 CPU the tests check the
    /// AVX-512 epilogue against the reference bit for bit. The hardware tiles take the AVX-512 one from
    /// their own token (AMX-INT8 implies VNNI).
    fn live() -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = Avx512Vnni::new() {
            return TileEpilogue::Avx512(tok);
        }
        TileEpilogue::Scalar
    }

    /// The epilogue of one pass over the rows `rows` (consecutive, at most 16): for each group in order,
    /// `steps.group(g)` stores the group's sums, `[rows.len()][16]` (`Σ xq·q`, or with `centered`
    /// `Σ xq·(q − z)`), and the epilogue adds them into the rows' outputs.
    fn run_pass<S: GroupSums>(
        self,
        b: &Block,
        rows: Range<usize>,
        centered: bool,
        out: &mut BlockOut,
        steps: &mut S,
    ) -> Result<(), TileError> {
        #[cfg(target_arch = "x86_64")]
        if let (TileEpilogue::Avx512(tok), 16) = (self, rows.len()) {
            return crate::x86_64::w4a8::finish_pass_avx512(tok, b, rows.start, centered, out, steps);
        }
        out.start(rows.clone());
        match self {
            #[cfg(target_arch = "x86_64")]
            TileEpilogue::Avx512(tok) => {
                for g in 0..b.spans.len() {
                    let sums = steps.group(g)?;
                    crate::x86_64::w4a8::finish_rows_avx512(tok, b, rows.clone(), g, sums, centered, out);
                }
                Ok(())
            }
            TileEpilogue::Scalar => {
                for g in 0..b.spans.len() {
                    let sums = steps.group(g)?;
                    for (row, acc) in rows.clone().zip(sums.chunks_exact(16)) {
                        let acc: &[i32; 16] = acc.try_into().expect("16 lanes");
                        let out = out.row(row);
                        if centered { b.finish_centered(row, g, acc, out) } else { b.finish(row, g, acc, out) }
                    }
                }
                Ok(())
            }
        }
    }
}

/// [`gemm_tiles`] or [`tiles_planes`], as `op` says.
fn tiles_operand<T: TileUnit + 'static>(
    new_unit: &(dyn Fn() -> T + Sync),
    epilogue: TileEpilogue,
    a: &QuantizedActivations,
    op: Operand<'_>,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    // The operands are checked before the activations are laid out (run_blocks checks them again).
    check_operands(a, op.shape(), bias, out)?;
    if a.m == 0 {
        return Ok(());
    }
    let kb = op.shape().kb;
    let panels = row_tile_panels(a, kb);
    run_blocks(a, op, bias, out, &|b, tile| {
        let mut unit = new_unit();
        let result = block_tiles(&mut unit, b, kb, &panels, epilogue, tile);
        // Released on every path, success or error: the next kernel loads its own configuration.
        unit.release();
        result
    })
}

/// The activations as the A operand of the tile dot products: per row tile (16 rows from `m0`, or the
/// rows left), per K block of `kb` bytes, the tile's rows one after another, `[rows][kb]` at
/// `m0·kp + (k0 / kb)·rows·kb`. A tile load then reads `rows × kb` consecutive bytes, the next group's
/// right after, where from `[m][kp]` it would touch a line per row every time (every block reads every
/// pass's activations again).
fn row_tile_panels(a: &QuantizedActivations, kb: usize) -> Vec<u8> {
    let (m, kp) = (a.m, a.k_padded);
    assert!(kb > 0 && kp.is_multiple_of(kb) && a.data.len() == m * kp, "activations of [m][kp] in K blocks of kb");
    let x: &[u8] = bytemuck::cast_slice(&a.data);
    let mut panels = vec![0u8; m * kp];
    panels.par_chunks_mut(16 * kp).zip(x.par_chunks(16 * kp)).for_each(|(panel, rows)| {
        let r = rows.len() / kp;
        for (j, dst) in panel.chunks_exact_mut(r * kb).enumerate() {
            for (row, dst) in dst.chunks_exact_mut(kb).enumerate() {
                dst.copy_from_slice(&rows[row * kp + j * kb..row * kp + (j + 1) * kb]);
            }
        }
    });
    panels
}

/// The block's codes as the B operand of the tile dot products: K quad `r` is row `r` (64 bytes), channel
/// `c`'s four codes at bytes `4c..4c + 4`; of an 8-bit pair, `16·hi + lo`. Each packed chunk holds two
/// quads, its low nibbles and its high nibbles, so it expands into two rows. Where the zero point is
/// implicit ([`Block::implicit_zero`]) each code is stored less it, `q − 8` (a pair's `u − 128`), as a
/// signed byte for `tdpbssd`, so the sums come out as `Σ xq·(q − z)` and the epilogue has no zero-point
/// term to subtract; stored zero points keep the codes as they are, for `tdpbsud`.
fn expand_codes(b: &Block, expanded: &mut Vec<u8>) {
    assert!(
        b.w.len() >= b.kp / 8 * CHUNK && b.low.is_none_or(|l| l.len() >= b.w.len()),
        "a block holds kp/8 chunks of codes in each plane"
    );
    expanded.clear();
    expanded.resize(b.kp / 4 * CHUNK, 0);
    let rows = expanded.chunks_exact_mut(2 * CHUNK);
    // Subtracting the zero mod 256 (u − 128 is u ^ 0x80) gives the signed byte's bits.
    let zero = if !b.implicit_zero() {
        0u8
    } else if b.low.is_some() {
        128
    } else {
        8
    };
    match b.low {
        None => {
            for (pair, chunk) in rows.zip(b.w.chunks_exact(CHUNK)) {
                let (lo, hi) = pair.split_at_mut(CHUNK);
                for ((lo, hi), &byte) in lo.iter_mut().zip(hi).zip(chunk) {
                    (*lo, *hi) = ((byte & 15).wrapping_sub(zero), (byte >> 4).wrapping_sub(zero));
                }
            }
        }
        Some(low) => {
            for ((pair, chunk), low) in rows.zip(b.w.chunks_exact(CHUNK)).zip(low.chunks_exact(CHUNK)) {
                let (lo, hi) = pair.split_at_mut(CHUNK);
                for (((lo, hi), &byte), &l) in lo.iter_mut().zip(hi).zip(chunk).zip(low) {
                    (*lo, *hi) = (
                        ((byte & 15) << 4 | (l & 15)).wrapping_sub(zero),
                        ((byte >> 4) << 4 | (l >> 4)).wrapping_sub(zero),
                    );
                }
            }
        }
    }
}

thread_local! {
    /// A thread's expanded B operand, kept between blocks (`8·K` bytes × 2: 32 KiB at K = 2048).
    static EXPANDED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One row tile (up to 16 rows) per pass: activations in tile 4 (`rows × kb` bytes), codes in 6 and 7
/// (`kb/4 × 64` bytes, alternating by K block so a load need not wait for the dot product reading the
/// other), and i32 accumulators (`rows × 16`) in 0 for even groups and 2 for odd ones. The next group's
/// dot products are issued before a group's sums are stored, so the tiles compute while the epilogue,
/// which takes each group's sums as they are stored ([`TileEpilogue::run_pass`]), runs.
fn block_tiles<T: TileUnit + 'static>(
    unit: &mut T,
    b: &Block,
    kb: usize,
    panels: &[u8],
    epilogue: TileEpilogue,
    out: &mut BlockOut,
) -> Result<(), TileError> {
    let mut expanded = EXPANDED.take();
    expand_codes(b, &mut expanded);
    let result = block_tiles_expanded(unit, b, kb, panels, epilogue, &expanded, out);
    EXPANDED.set(expanded);
    result
}

fn block_tiles_expanded<T: TileUnit + 'static>(
    unit: &mut T,
    b: &Block,
    kb: usize,
    panels: &[u8],
    epilogue: TileEpilogue,
    expanded: &[u8],
    out: &mut BlockOut,
) -> Result<(), TileError> {
    // Codes stored less an implicit zero are signed (`expand_codes`).
    let centered = b.implicit_zero();
    let mut sums = [0i32; 256];
    #[cfg(target_arch = "x86_64")]
    let mut checked = None;
    let mut loaded = 0;
    for m0 in (0..b.m).step_by(16) {
        let r = 16.min(b.m - m0);
        if r != loaded {
            let cfg = TileConfig::new()
                .with_tile(0, r as u8, 64)
                .with_tile(2, r as u8, 64)
                .with_tile(4, r as u8, kb as u16)
                .with_tile(6, (kb / 4) as u8, 64)
                .with_tile(7, (kb / 4) as u8, 64);
            unit.load_config(&cfg)?;
            loaded = r;
        }
        #[cfg(target_arch = "x86_64")]
        if let (16, TileEpilogue::Avx512(tok), Some(tiles)) = (r, epilogue, hardware(unit)) {
            let checked = match &checked {
                Some(c) => c,
                None => checked.insert(crate::x86_64::amx::CheckedBlock::new(b, expanded, kb, centered)?),
            };
            let panel = &panels[m0 * b.kp..(m0 + 16) * b.kp];
            let mut pass = crate::x86_64::amx::HardwarePass::new(tiles, checked, panel, &mut sums)?;
            if !b.spans.is_empty() {
                pass.issue(0);
            }
            crate::x86_64::w4a8::finish_pass_avx512(tok, b, m0, centered, out, &mut pass)?;
            continue;
        }
        let mut pass =
            Pass { unit: &mut *unit, b, panels, expanded, kb, m0, r, centered, k_blocks: 0, sums: &mut sums };
        pass.issue(0)?;
        epilogue.run_pass(b, m0..m0 + r, centered, out, &mut pass)?;
    }
    Ok(())
}

/// The hardware tiles, where `unit` is them: the tiling then runs its full 16-row passes as a
/// [`HardwarePass`](crate::x86_64::amx::HardwarePass), checked once per pass rather than at every
/// instruction. Other units (the emulator) run every instruction through [`TileUnit`].
#[cfg(target_arch = "x86_64")]
fn hardware<T: TileUnit + 'static>(unit: &mut T) -> Option<&mut crate::x86_64::amx::AmxTiles> {
    (unit as &mut dyn std::any::Any).downcast_mut()
}

/// One pass of [`block_tiles_expanded`] on its tile unit: the block, its activations (as row tile panels,
/// [`row_tile_panels`]) and expanded codes, the K block, the pass's first row and row count, whether the
/// codes are centered, and how many K blocks have been issued (which alternates the B tile).
struct Pass<'a, T: TileUnit> {
    unit: &'a mut T,
    b: &'a Block<'a>,
    panels: &'a [u8],
    expanded: &'a [u8],
    kb: usize,
    m0: usize,
    r: usize,
    centered: bool,
    k_blocks: usize,
    /// Where the group's sums are stored, the block's for all its passes.
    sums: &'a mut [i32; 256],
}

impl<T: TileUnit> Pass<'_, T> {
    /// Group g's dot products into accumulator tile `2·(g % 2)`. Inlined, as is each tile instruction, so
    /// the AVX-512 epilogue's outputs stay in registers across it (a call would spill them all).
    #[inline(always)]
    fn issue(&mut self, g: usize) -> Result<(), TileError> {
        let (b, c) = (self.b, 2 * (g % 2));
        self.unit.zero(c)?;
        for k0 in b.spans[g].clone().step_by(self.kb) {
            let tb = 6 + self.k_blocks % 2;
            self.k_blocks += 1;
            self.unit.load(tb, &self.expanded[k0 / 4 * CHUNK..(k0 + self.kb) / 4 * CHUNK], 64)?;
            let a = self.m0 * b.kp + k0 / self.kb * self.r * self.kb;
            self.unit.load(4, &self.panels[a..a + self.r * self.kb], self.kb)?;
            if self.centered {
                self.unit.dpbssd(c, 4, tb)?;
            } else {
                self.unit.dpbsud(c, 4, tb)?;
            }
        }
        Ok(())
    }
}

impl<T: TileUnit> GroupSums for Pass<'_, T> {
    /// Issues the next group's dot products (group 0's were issued before the pass), then stores group
    /// g's sums, so the tiles compute while the epilogue finishes this group.
    #[inline(always)]
    fn group(&mut self, g: usize) -> Result<&[i32; 256], TileError> {
        if g + 1 < self.b.spans.len() {
            self.issue(g + 1)?;
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.sums[..]);
        self.unit.store(2 * (g % 2), &mut bytes[..self.r * 64], 64)?;
        Ok(self.sums)
    }
}

/// A W4A8 linear layer: quantizes its f32 input to int8 and runs the chosen kernel.
#[derive(Debug)]
pub struct W4A8Linear {
    weights: W4A8Weights,
    bias: Option<Vec<f32>>,
    kernels: BoundKernels,
    activation_scales: ActivationScales,
}

/// Whether `k` is a W4A8 kernel.
pub(crate) fn is_w4a8(k: KernelId) -> bool {
    matches!(k, KernelId::W4a8Portable | KernelId::W4a8Avx2 | KernelId::W4a8Vnni | KernelId::W4a8Amx)
}

impl W4A8Linear {
    /// The layer on the fastest kernels `caps` allows.
    pub fn new(weights: W4A8Weights, bias: Option<Vec<f32>>, caps: &IsaCaps) -> Result<Self, KernelError> {
        Self::with_kernels(weights, bias, choice::best(W4A8Kernel::spec(), caps)?)
    }

    /// The layer on the kernels of exactly `level` ([`choice::at_level`]), or a clear error naming what is
    /// missing.
    pub fn forced(
        weights: W4A8Weights,
        bias: Option<Vec<f32>>,
        level: IsaLevel,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        Self::with_kernels(weights, bias, choice::at_level(W4A8Kernel::spec(), level, caps)?)
    }

    /// The layer on `kernels` (a [`KernelChoice`](crate::choice::KernelChoice) of W4A8 kernels, bound).
    pub fn with_kernels(
        weights: W4A8Weights,
        bias: Option<Vec<f32>>,
        kernels: BoundKernels,
    ) -> Result<Self, KernelError> {
        if let Some(b) = &bias {
            check_len("bias", weights.n, b.len())?;
        }
        kernels.expect_family("W4A8", is_w4a8)?;
        Ok(W4A8Linear { weights, bias, kernels, activation_scales: ActivationScales::default() })
    }

    /// The layer with activations scaled at `granularity`.
    pub fn with_activation_scales(self, granularity: ActivationScales) -> Self {
        W4A8Linear { activation_scales: granularity, ..self }
    }

    /// How this layer scales its activations.
    pub fn activation_scales(&self) -> ActivationScales {
        self.activation_scales
    }

    /// The weights.
    pub fn weights(&self) -> &W4A8Weights {
        &self.weights
    }

    /// The kernel `forward` runs for `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        self.kernels.for_rows(m)
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`, with `x` quantized to int8. Returns the kernel that ran.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let kernel = W4A8Kernel::for_rows(&self.kernels, m)?;
        let a = quantize_activations(x, m, &self.weights, self.activation_scales)?;
        gemm(kernel, &a, &self.weights, self.bias.as_deref(), out)?;
        Ok(kernel.id_for(m))
    }

    /// `m` decode rows (one per sequence) in one pass over the weights, on the kernel one row runs, each
    /// row getting the bits it gets alone: a row's activations are quantized on their own, its integer
    /// sums are exact however rows are blocked, and its epilogue is its own. Returns the kernel that ran.
    pub fn forward_decode(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let kernel = W4A8Kernel::for_rows(&self.kernels, 1)?.for_decode();
        let a = quantize_activations(x, m, &self.weights, self.activation_scales)?;
        gemm(kernel, &a, &self.weights, self.bias.as_deref(), out)?;
        Ok(kernel.id_for(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tile::TileEmulator;

    /// The tiling's two epilogues give the same bits as the portable kernel, whichever one
    /// [`TileEpilogue::live`] would take here: the scalar one runs on every machine, the AVX-512 one where
    /// the process has VNNI. Rows 40 and 50 end in a partial row tile (8 and 2 rows) after full ones, which
    /// takes a configuration change and the epilogue of fewer rows; offsets and integer zeros both appear.
    #[test]
    fn both_tile_epilogues_match_the_portable_kernel() {
        let (n, k, group) = (48, 200, GroupSize::G64);
        let groups = group.groups(k);
        let codes = Codes::from_fn(n, k, |r, c| ((r * 7 + c * 3) % 16) as u8).unwrap();
        let scales: Vec<f32> = (0..groups * n).map(|i| 0.01 + (i % 13) as f32 * 1e-3).collect();
        let zeros: Vec<u8> = (0..groups * n).map(|i| (i % 16) as u8).collect();
        let offsets: Vec<f32> = (0..groups * n).map(|i| (i % 5) as f32 * 0.01 - 0.02).collect();
        for (zeros, offsets) in [(Some(&zeros[..]), None), (None, Some(&offsets[..]))] {
            let w = W4A8Weights::pack(&codes, &scales, zeros, offsets, group).unwrap();
            let bias: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
            for (m, bias) in [(40, None), (50, None), (40, Some(&bias[..])), (50, Some(&bias[..]))] {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                let a = quantize_activations(&x, m, &w, ActivationScales::PerGroup).unwrap();
                let mut want = vec![f32::NAN; m * n];
                gemm(W4A8Kernel::Portable, &a, &w, bias, &mut want).unwrap();
                #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
                let mut epilogues = vec![("scalar", TileEpilogue::Scalar)];
                #[cfg(target_arch = "x86_64")]
                if let Some(tok) = Avx512Vnni::new() {
                    epilogues.push(("avx512", TileEpilogue::Avx512(tok)));
                }
                for (name, epilogue) in epilogues {
                    let mut got = vec![f32::NAN; m * n];
                    tiles_operand(&TileEmulator::new, epilogue, &a, Operand::Four(&w), bias, &mut got).unwrap();
                    assert!(
                        got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                        "{name} epilogue, M = {m}, zeros {}, bias {}: not the portable kernel's bits",
                        zeros.is_some(),
                        bias.is_some()
                    );
                    assert!(got.iter().all(|v| v.is_finite()), "{name} epilogue, M = {m}: outputs left unset");
                }
            }
        }
    }
}
