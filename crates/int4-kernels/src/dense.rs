//! Unquantized weights: the bf16 baseline path and the f32 path that is the reference for fidelity.
//!
//! Small M runs a GEMV (one fixed-order dot product per output, each weight row read once for all rows);
//! large M packs sixteen weight rows at a time into panels and runs the shared GEMM microkernel
//! (the private `gemm` module).

use half::bf16;

use crate::error::{KernelError, check_len};
use crate::gemm::{self, InnerLoops};
use crate::isa::{Avx2Fma, IsaCaps};
use crate::kernel_id::KernelId;
use rayon::prelude::*;

/// The most rows the dense layer runs as a GEMV (more run the GEMM). The GEMV reads each weight row once
/// for all rows and converts bf16 in registers; the GEMM first widens the weights into f32 panels, which
/// at a few rows costs more than the products: on SmolLM2's bf16 path, batched decode of 4 sequences ran
/// at 51–52 tok/s on the GEMM and 168–193 on the GEMV, and of 16 at 157–165 against 169–203
/// (docs/perf.md).
pub const DENSE_GEMV_MAX_ROWS: usize = 16;

/// Dense weights `[N][K]`, row-major.
#[derive(Clone, Debug)]
pub enum DenseWeights {
    /// bf16 weights (the speed baseline).
    Bf16(Vec<bf16>),
    /// f32 weights (the correctness reference path).
    F32(Vec<f32>),
}

/// An unquantized linear layer.
#[derive(Clone, Debug)]
pub struct DenseLinear {
    n: usize,
    k: usize,
    weights: DenseWeights,
    bias: Option<Vec<f32>>,
    loops: InnerLoops,
}

impl DenseLinear {
    /// Builds the layer for the best ISA the process caps allow.
    pub fn new(n: usize, k: usize, weights: DenseWeights, bias: Option<Vec<f32>>) -> Result<Self, KernelError> {
        Self::with_caps(n, k, weights, bias, IsaCaps::process())
    }

    /// Builds the layer for the best ISA `caps` allows.
    pub fn with_caps(
        n: usize,
        k: usize,
        weights: DenseWeights,
        bias: Option<Vec<f32>>,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        let len = match &weights {
            DenseWeights::Bf16(w) => w.len(),
            DenseWeights::F32(w) => w.len(),
        };
        check_len("weights", n * k, len)?;
        if let Some(b) = &bias {
            check_len("bias", n, b.len())?;
        }
        let loops = Avx2Fma::with_caps(caps).map_or(InnerLoops::Portable, InnerLoops::Avx2);
        Ok(DenseLinear { n, k, weights, bias, loops })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The kernel `forward` runs for `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        let gemv = m <= DENSE_GEMV_MAX_ROWS;
        match (self.loops, &self.weights, gemv) {
            (InnerLoops::Portable, _, _) => KernelId::DensePortable,
            (InnerLoops::Avx2(_), DenseWeights::Bf16(_), true) => KernelId::DenseBf16GemvAvx2,
            (InnerLoops::Avx2(_), DenseWeights::Bf16(_), false) => KernelId::DenseBf16GemmAvx2,
            (InnerLoops::Avx2(_), DenseWeights::F32(_), true) => KernelId::DenseF32GemvAvx2,
            (InnerLoops::Avx2(_), DenseWeights::F32(_), false) => KernelId::DenseF32GemmAvx2,
        }
    }

    /// Bytes of weights streamed per GEMV call.
    pub fn weight_bytes(&self) -> usize {
        match &self.weights {
            DenseWeights::Bf16(w) => w.len() * 2,
            DenseWeights::F32(w) => w.len() * 4,
        }
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        let (n, k) = (self.n, self.k);
        check_len("activations", m * k, x.len())?;
        check_len("output", m * n, out.len())?;
        if m == 0 {
            return Ok(());
        }
        if m <= DENSE_GEMV_MAX_ROWS {
            self.gemv(x, m, out)
        } else {
            self.gemm(x, m, out)
        }
        Ok(())
    }

    fn gemv(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        // Output channels in parallel; each task computes all m rows for its channel.
        let cols: Vec<f32> = (0..n)
            .into_par_iter()
            .with_min_len((65536 / k).max(1))
            .flat_map_iter(|col| {
                let b = self.bias.as_ref().map_or(0.0, |b| b[col]);
                (0..m).map(move |r| self.dot(&x[r * k..(r + 1) * k], col) + b)
            })
            .collect();
        for col in 0..n {
            for r in 0..m {
                out[r * n + col] = cols[col * m + r];
            }
        }
    }

    fn dot(&self, xr: &[f32], col: usize) -> f32 {
        let k = self.k;
        match (&self.weights, self.loops) {
            (DenseWeights::F32(w), InnerLoops::Avx2(tok)) => dot_f32_avx2(tok, xr, &w[col * k..(col + 1) * k]),
            (DenseWeights::Bf16(w), InnerLoops::Avx2(tok)) => dot_bf16_avx2(tok, xr, &w[col * k..(col + 1) * k]),
            (DenseWeights::F32(w), InnerLoops::Portable) => {
                xr.iter().zip(&w[col * k..(col + 1) * k]).map(|(a, b)| a * b).sum()
            }
            (DenseWeights::Bf16(w), InnerLoops::Portable) => {
                xr.iter().zip(&w[col * k..(col + 1) * k]).map(|(a, b)| a * b.to_f32()).sum()
            }
        }
    }

    fn gemm(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        let lanes = n.div_ceil(16);
        let mut tiles = vec![0.0f32; lanes * m * 16];
        // The weights' type is matched once per panel, not per element: at a few rows the panels, not the
        // microkernel, are most of the work.
        let produce = |lg: usize, k0: usize, k1: usize, panel: &mut [f32]| {
            for j in 0..16 {
                let c = lg * 16 + j;
                let lane = panel.iter_mut().skip(j).step_by(16).take(k1 - k0);
                match &self.weights {
                    _ if c >= n => lane.for_each(|p| *p = 0.0),
                    DenseWeights::F32(w) => lane.zip(&w[c * k + k0..c * k + k1]).for_each(|(p, v)| *p = *v),
                    DenseWeights::Bf16(w) => lane.zip(&w[c * k + k0..c * k + k1]).for_each(|(p, v)| *p = v.to_f32()),
                }
            }
        };
        gemm::panel_gemm(self.loops, x, m, k, &mut tiles, &produce);
        let channels: Vec<[u32; 16]> = (0..lanes).map(|lg| std::array::from_fn(|j| (lg * 16 + j) as u32)).collect();
        gemm::scatter(&tiles, m, &channels, n, self.bias.as_deref(), out);
    }
}

#[cfg(target_arch = "x86_64")]
fn dot_f32_avx2(_tok: Avx2Fma, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    // SAFETY: `Avx2Fma` proves AVX2 and FMA; both slices hold `a.len()` floats.
    unsafe { crate::x86_64::avx2::dot_f32(a.as_ptr(), b.as_ptr(), a.len()) }
}

#[cfg(target_arch = "x86_64")]
fn dot_bf16_avx2(_tok: Avx2Fma, a: &[f32], b: &[bf16]) -> f32 {
    assert_eq!(a.len(), b.len());
    // SAFETY: `Avx2Fma` proves AVX2 and FMA; `b` holds `a.len()` bf16, which are `u16`-sized and
    // `u16`-aligned (`bf16` is `repr(transparent)` over `u16`).
    unsafe { crate::x86_64::avx2::dot_bf16(a.as_ptr(), b.as_ptr().cast::<u16>(), a.len()) }
}

#[cfg(not(target_arch = "x86_64"))]
fn dot_f32_avx2(_tok: Avx2Fma, a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(not(target_arch = "x86_64"))]
fn dot_bf16_avx2(_tok: Avx2Fma, a: &[f32], b: &[bf16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}
