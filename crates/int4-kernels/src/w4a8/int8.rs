//! 8-bit weights on the W4A8 kernels, as two 4-bit planes.
//!
//! Why: the layer 4 bits hurt most is usually the head (for a model with tied embeddings, the embedding
//! table too), and checkpoints that care ship it in 8 bits (llama.cpp's Q4 files keep it in Q8_0). Running
//! it through the W4A8 kernels rather than a kernel of its own keeps one set of tested SIMD and tile code.
//!
//! A signed code `q ∈ −128..=127` with scale `s` is stored as `u = q + 128 = 16·hi + lo`, `hi, lo ∈ 0..16`:
//! two W4A8 planes of the same geometry, `w = s·q = 16s·(hi − 8) + s·lo`, the high plane symmetric (zero
//! point 8) with scale `16s` (exact: a power-of-two multiple), the low plane with zero point 0 and scale
//! `s`. Each plane is a valid W4A8 layer on its own, which is how they are stored, loaded and checked.
//!
//! They run as one layer ([`Int8Linear`]): per group the exact `Σ xq·u` in i32 (products of at most
//! 255·127, so groups of up to 66,000 inputs fit), then the W4A8 epilogue with zero point 128 and scale `s`,
//! `out = fma(Σ xq·u − 128·Σ xq, a_s·s, out)`: one rounding of the scale product and one of the
//! multiply-add per group, as a 4-bit layer has. The AVX-512 VNNI and AMX kernels merge each weight's
//! two nibbles into one byte (`vpdpbusd` takes it unsigned, 0..=255; the AMX tiling stores `u − 128` as a
//! signed byte for `tdpbssd`), so a chunk costs one dot product per quad and row, as a 4-bit one does; AVX2, whose `vpmaddubsw` pair sums would saturate on
//! 8-bit codes, and the portable kernel sum the planes apart and take `16·Σ xq·hi + Σ xq·lo`, the same
//! integer. Decode (memory-bound) reads the same 8 bits per weight either way.
//!
//! The weights come from f32 ([`Int8Weights::quantize`], codes `−127..=127` on Q8_0's grid) or from a
//! checkpoint's stored codes and scales, taken exactly ([`Int8Weights::from_codes`], codes `−128..=127`).

use int4_layout::{Codes, GroupSize};

use crate::choice::{self, BoundKernels};
use crate::error::{KernelError, check_len};
use crate::isa::{IsaCaps, IsaLevel};
use crate::kernel_id::KernelId;
use crate::tile::TileUnit;
use crate::w4a8::{
    ActivationScales, QuantizedActivations, W4A8Kernel, W4A8Weights, gemm_planes, is_w4a8, quantize_activations,
    tiles_planes,
};

/// 8-bit symmetric weights as two 4-bit planes (module docs).
#[derive(Clone, Debug)]
pub struct Int8Weights {
    hi: W4A8Weights,
    lo: W4A8Weights,
}

impl Int8Weights {
    /// Quantizes `w` (`[n][k]`, n a multiple of 16) per group: `s = amax/127`, `q = round(w/s)` (ties to
    /// even; llama.cpp rounds ties away from zero, which only a weight exactly between two codes tells
    /// apart), llama.cpp's Q8_0 grid, so a Q8_0 tensor's exact dequantization is found again.
    /// Non-finite weights are an error.
    pub fn quantize(w: &[f32], n: usize, k: usize, group: GroupSize) -> Result<Self, KernelError> {
        check_len("8-bit weights", n * k, w.len())?;
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(KernelError::invalid(format!("weight {i} is {}: weights must be finite", w[i])));
        }
        let (g_len, groups) = (group.len(k), group.groups(k));
        let mut q = vec![0i8; n * k];
        let mut scales_gn = vec![0.0f32; groups * n];
        for row in 0..n {
            for g in 0..groups {
                let span = row * k + g * g_len..row * k + ((g + 1) * g_len).min(k);
                let amax = w[span.clone()].iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                scales_gn[g * n + row] = s;
                for (d, &v) in q[span.clone()].iter_mut().zip(&w[span]) {
                    *d = (v / s).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
            }
        }
        Self::pack(&q, &scales_gn, n, k, group)
    }

    /// Packs signed codes `q` (`[n][k]`, each in `−127..=127`) with scales `scales_gn` (`[G][N]`).
    pub fn pack(q: &[i8], scales_gn: &[f32], n: usize, k: usize, group: GroupSize) -> Result<Self, KernelError> {
        check_len("8-bit codes", n * k, q.len())?;
        if q.contains(&i8::MIN) {
            return Err(KernelError::invalid("an 8-bit code is -128; codes are -127..=127"));
        }
        Self::planes(q, scales_gn, n, k, group)
    }

    /// The weights from a checkpoint's own 8-bit grid, exactly: signed codes `codes` (`[n][k]`, every
    /// value in `−128..=127`, GGUF Q8_0's range) and per-group scales `scales` (`[n][G]`, one row of
    /// `G = ⌈k/group⌉` per output channel, as GGUF stores them and
    /// [`W8A16Weights`](crate::w8a16::W8A16Weights) takes them; each finite, as is 16 times it, the high
    /// plane's scale), so that the layer's weight is
    /// `scales[n][g]·codes[n][k]`. `n` must be a positive multiple of 16, as for [`Self::quantize`] (pad
    /// with zero codes). For the codes and scales [`Self::quantize`] found, the planes are the same bytes.
    ///
    /// Unlike [`Self::pack`], `−128` is taken: it is `u = 0`, both planes' code 0, `16s·(0 − 8) + s·0`.
    pub fn from_codes(codes: &[i8], scales: &[f32], n: usize, k: usize, group: GroupSize) -> Result<Self, KernelError> {
        let overflow = || KernelError::invalid(format!("8-bit weights of {n} × {k} codes overflow the address space"));
        check_len("8-bit codes [N][K]", n.checked_mul(k).ok_or_else(overflow)?, codes.len())?;
        let groups = group.groups(k);
        check_len("8-bit scales [N][G]", n.checked_mul(groups).ok_or_else(overflow)?, scales.len())?;
        // The high plane's scale is 16·d: it must be finite too.
        if let Some(i) = scales.iter().position(|d| !(16.0 * d).is_finite()) {
            return Err(KernelError::invalid(format!(
                "the scale of row {}, group {} is {}; scales must be finite, and below f32::MAX/16 in magnitude",
                i / groups,
                i % groups,
                scales[i]
            )));
        }
        let scales_gn: Vec<f32> = (0..groups * n).map(|i| scales[(i % n) * groups + i / n]).collect();
        Self::planes(codes, &scales_gn, n, k, group)
    }

    /// The two planes of signed codes `q` (`[n][k]`, any i8) with scales `scales_gn` (`[G][N]`).
    fn planes(q: &[i8], scales_gn: &[f32], n: usize, k: usize, group: GroupSize) -> Result<Self, KernelError> {
        let u = |i: usize| (i16::from(q[i]) + 128) as u8;
        let hi = Codes::from_fn(n, k, |r, c| u(r * k + c) >> 4)?;
        let lo = Codes::from_fn(n, k, |r, c| u(r * k + c) & 15)?;
        let hi_scales: Vec<f32> = scales_gn.iter().map(|s| 16.0 * s).collect();
        let zeros = vec![0u8; scales_gn.len()];
        Ok(Int8Weights {
            hi: W4A8Weights::pack(&hi, &hi_scales, None, None, group)?,
            lo: W4A8Weights::pack(&lo, scales_gn, Some(&zeros), None, group)?,
        })
    }

    /// The weights from their two stored planes, which must have the same geometry, zero points 8 (high)
    /// and 0 (low), no offsets, and high scales 16 times the low ones.
    pub fn from_planes(hi: W4A8Weights, lo: W4A8Weights) -> Result<Self, KernelError> {
        let geometry = |w: &W4A8Weights| (w.n(), w.k(), w.group_len(), w.groups());
        if geometry(&hi) != geometry(&lo) {
            return Err(KernelError::invalid("the two planes of 8-bit weights differ in shape"));
        }
        let low_zeros = lo.zeros().is_some_and(|z| z.iter().all(|&z| z == 0));
        let (hs, ls) = (hi.scales(), lo.scales());
        let paired = hs.len() == ls.len() && (0..hs.len()).all(|i| hs.get(i) == 16.0 * ls.get(i));
        if hi.zeros().is_some() || !low_zeros || hi.offsets().is_some() || lo.offsets().is_some() || !paired {
            return Err(KernelError::invalid("the planes are not an 8-bit pair (zero points 8 and 0, scales 16:1)"));
        }
        Ok(Int8Weights { hi, lo })
    }

    /// The high plane (`16s·(hi − 8)`).
    pub fn hi(&self) -> &W4A8Weights {
        &self.hi
    }

    /// The low plane (`s·lo`).
    pub fn lo(&self) -> &W4A8Weights {
        &self.lo
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.lo.n()
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.lo.k()
    }

    /// The signed code at `(row, k)`.
    pub fn code(&self, row: usize, kk: usize) -> i8 {
        (i16::from(self.hi.code(row, kk)) * 16 + i16::from(self.lo.code(row, kk)) - 128) as i8
    }

    /// Row `row` of the weights, `q·s` (one rounding), for a tied head's embedding lookup.
    pub fn decode_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        let (n, k) = (self.n(), self.k());
        check_len("decoded row", k, out.len())?;
        if row >= n {
            return Err(KernelError::shape("row index (below N)", n, row));
        }
        for (kk, o) in out.iter_mut().enumerate() {
            *o = f32::from(self.code(row, kk)) * self.lo.scale(kk / self.lo.group_len(), row);
        }
        Ok(())
    }

    /// Bytes resident (both planes).
    pub fn resident_bytes(&self) -> usize {
        self.hi.resident_bytes() + self.lo.resident_bytes()
    }
}

/// A linear layer with 8-bit weights on the W4A8 kernels (module docs): `out = x·Wᵀ + bias`, the
/// activations quantized once and both planes run in one pass.
#[derive(Debug)]
pub struct Int8Linear {
    weights: Int8Weights,
    bias: Option<Vec<f32>>,
    kernels: BoundKernels,
    activation_scales: ActivationScales,
}

impl Int8Linear {
    /// The layer on the kernels of exactly `level` ([`choice::at_level`]), or a clear error naming what is
    /// missing.
    pub fn forced(
        weights: Int8Weights,
        bias: Option<Vec<f32>>,
        level: IsaLevel,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        Self::with_kernels(weights, bias, choice::at_level(W4A8Kernel::spec(), level, caps)?)
    }

    /// The layer on `kernels` (W4A8 kernels, bound).
    pub fn with_kernels(
        weights: Int8Weights,
        bias: Option<Vec<f32>>,
        kernels: BoundKernels,
    ) -> Result<Self, KernelError> {
        if let Some(b) = &bias {
            check_len("bias", weights.n(), b.len())?;
        }
        kernels.expect_family("8-bit W4A8", is_w4a8)?;
        Ok(Int8Linear { weights, bias, kernels, activation_scales: ActivationScales::default() })
    }

    /// The layer with activations scaled at `granularity`.
    pub fn with_activation_scales(self, granularity: ActivationScales) -> Self {
        Int8Linear { activation_scales: granularity, ..self }
    }

    /// The weights.
    pub fn weights(&self) -> &Int8Weights {
        &self.weights
    }

    /// The kernel `forward` runs for `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        self.kernels.for_rows(m)
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`, with `x` quantized to int8. Returns the kernel that ran.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        self.run(W4A8Kernel::for_rows(&self.kernels, m)?, x, m, out)
    }

    /// `m` decode rows in one pass over both planes, on the kernel one row runs, each row getting the bits
    /// it gets alone (as [`crate::w4a8::W4A8Linear::forward_decode`]). Returns the kernel that ran.
    pub fn forward_decode(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        self.run(W4A8Kernel::for_rows(&self.kernels, 1)?.for_decode(), x, m, out)
    }

    fn run(&self, kernel: W4A8Kernel, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let a = quantize_activations(x, m, &self.weights.lo, self.activation_scales)?;
        gemm_planes(kernel, &a, (&self.weights.hi, &self.weights.lo), self.bias.as_deref(), out)?;
        Ok(kernel.id_for(m))
    }
}

/// `out = dequant(a)·Wᵀ (+ bias)` for 8-bit weights `w` on the AMX tiling over any tile unit, as
/// [`crate::w4a8::gemm_tiles`] runs a 4-bit layer (what an [`Int8Linear`] runs from
/// [`crate::w4a8::AMX_MIN_ROWS`] rows on AMX; on the bit-exact [`crate::tile::TileEmulator`] anywhere).
/// `a` is quantized for the low plane ([`Int8Weights::lo`]).
pub fn gemm_tiles<T: TileUnit + 'static>(
    new_unit: &(dyn Fn() -> T + Sync),
    a: &QuantizedActivations,
    w: &Int8Weights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    tiles_planes(new_unit, a, (&w.hi, &w.lo), bias, out)
}
