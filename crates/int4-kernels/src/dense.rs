//! Unquantized weights: the bf16 baseline path and the f32 path that is the reference for fidelity.
//!
//! Small M runs a GEMV (one fixed-order dot product per output, each weight row read once for all rows);
//! large M packs sixteen weight rows at a time into panels and runs the shared GEMM microkernel
//! (the private `gemm` module).

use half::bf16;

use rayon::prelude::*;

use crate::choice::{self, BoundKernel, BoundKernels, LayerSpec};
use crate::error::{KernelError, KernelErrorKind, check_len};
use crate::gemm::{self, InnerLoops};
use crate::isa::{Avx2Fma, IsaCaps};
use crate::kernel_id::KernelId;

pub use crate::choice::DENSE_GEMV_MAX_ROWS;

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
    kernels: BoundKernels,
}

impl DenseLinear {
    /// What `weights` are, for [`crate::choice::choose`].
    pub fn spec(weights: &DenseWeights) -> LayerSpec {
        LayerSpec::Dense { bf16: matches!(weights, DenseWeights::Bf16(_)) }
    }

    /// Builds the layer on the fastest kernels the process caps allow.
    pub fn new(n: usize, k: usize, weights: DenseWeights, bias: Option<Vec<f32>>) -> Result<Self, KernelError> {
        Self::with_caps(n, k, weights, bias, IsaCaps::process())
    }

    /// Builds the layer on the fastest kernels `caps` allows.
    pub fn with_caps(
        n: usize,
        k: usize,
        weights: DenseWeights,
        bias: Option<Vec<f32>>,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        let kernels = choice::best(Self::spec(&weights), caps)?;
        Self::with_kernels(n, k, weights, bias, kernels)
    }

    /// Builds the layer on `kernels`: dense kernels for these weights' type.
    pub fn with_kernels(
        n: usize,
        k: usize,
        weights: DenseWeights,
        bias: Option<Vec<f32>>,
        kernels: BoundKernels,
    ) -> Result<Self, KernelError> {
        let len = match &weights {
            DenseWeights::Bf16(w) => w.len(),
            DenseWeights::F32(w) => w.len(),
        };
        check_len("weights", n * k, len)?;
        if let Some(b) = &bias {
            check_len("bias", n, b.len())?;
        }
        let bf16 = matches!(weights, DenseWeights::Bf16(_));
        let ok: fn(KernelId) -> bool = if bf16 {
            |k| matches!(k, KernelId::DensePortable | KernelId::DenseBf16GemvAvx2 | KernelId::DenseBf16GemmAvx2)
        } else {
            |k| matches!(k, KernelId::DensePortable | KernelId::DenseF32GemvAvx2 | KernelId::DenseF32GemmAvx2)
        };
        kernels.expect_family(if bf16 { "dense bf16" } else { "dense f32" }, ok)?;
        Ok(DenseLinear { n, k, weights, bias, kernels })
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
        self.kernels.for_rows(m)
    }

    /// Bytes of weights streamed per GEMV call.
    pub fn weight_bytes(&self) -> usize {
        match &self.weights {
            DenseWeights::Bf16(w) => w.len() * 2,
            DenseWeights::F32(w) => w.len() * 4,
        }
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`: the GEMV below the kernels' prefill row count, the GEMM from it.
    /// Returns the kernel that ran.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let (n, k) = (self.n, self.k);
        check_len("activations", m * k, x.len())?;
        check_len("output", m * n, out.len())?;
        let kernel = self.kernels.bound_for_rows(m);
        if m == 0 {
            return Ok(kernel.id());
        }
        let loops = match kernel {
            BoundKernel::DensePortable => InnerLoops::Portable,
            BoundKernel::DenseBf16GemvAvx2(t)
            | BoundKernel::DenseBf16GemmAvx2(t)
            | BoundKernel::DenseF32GemvAvx2(t)
            | BoundKernel::DenseF32GemmAvx2(t) => InnerLoops::Avx2(t),
            other => {
                return Err(KernelError::new(KernelErrorKind::WrongFamily { kernel: other.id(), layer: "dense" }));
            }
        };
        if m < self.kernels.choice().prefill_from {
            self.gemv(loops, x, m, out)
        } else {
            self.gemm(loops, x, m, out)
        }
        Ok(kernel.id())
    }

    fn gemv(&self, loops: InnerLoops, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        // Output channels in parallel; each task computes all m rows for its channel.
        let cols: Vec<f32> = (0..n)
            .into_par_iter()
            .with_min_len((65536 / k).max(1))
            .flat_map_iter(|col| {
                let b = self.bias.as_ref().map_or(0.0, |b| b[col]);
                (0..m).map(move |r| self.dot(loops, &x[r * k..(r + 1) * k], col) + b)
            })
            .collect();
        for col in 0..n {
            for r in 0..m {
                out[r * n + col] = cols[col * m + r];
            }
        }
    }

    fn dot(&self, loops: InnerLoops, xr: &[f32], col: usize) -> f32 {
        let k = self.k;
        match (&self.weights, loops) {
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

    fn gemm(&self, loops: InnerLoops, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        let lanes = n.div_ceil(16);
        let mut tiles = gemm::take_tiles(lanes * m * 16);
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
        gemm::panel_gemm(loops, None, x, m, k, &mut tiles, &produce);
        gemm::scatter(&tiles, m, &gemm::ScatterPlan::in_order(n), self.bias.as_deref(), out);
        gemm::keep_tiles(tiles);
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
