//! A linear layer on whichever kernel the plan chose, with the kernel it runs per phase on record.

use int4_kernels::KernelId;
use int4_kernels::dense::{DenseLinear, DenseWeights};
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::portable::Wna16Linear;
use int4_kernels::w4a16::{W4A16Config, W4A16Linear, W4A16Weights};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::tinygemm::TinygemmBlock;
use int4_layout::{GroupParams, GroupSize};

use crate::error::{Error, Result};

/// How a model's linear layers are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// Unquantized f32 weights: the correctness reference.
    F32,
    /// Unquantized bf16 weights: the speed baseline.
    Bf16,
    /// 4-bit weights in a tinygemm layout, quantized on load (round-to-nearest, asymmetric grid).
    W4a16 {
        /// Channel block width of the packed layout.
        block: TinygemmBlock,
        /// Group size.
        group: GroupSize,
        /// Threshold and prefill source.
        config: W4A16Config,
        /// ISA the kernels run at.
        level: IsaLevel,
    },
    /// 4-bit weights as row-major codes, the portable fallback.
    Wna16 {
        /// Group size.
        group: GroupSize,
    },
}

enum Imp {
    Dense(DenseLinear),
    W4a16(W4A16Linear),
    Wna16(Wna16Linear),
}

/// `y = x·Wᵀ (+ bias)` with W `[n][k]`.
pub struct Linear {
    n: usize,
    k: usize,
    /// N rounded up to the packer's multiple of 16 (extra outputs are computed and dropped).
    n_padded: usize,
    imp: Imp,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear").field("n", &self.n).field("k", &self.k).finish_non_exhaustive()
    }
}

impl Linear {
    /// Builds the layer from f32 weights `[n][k]` by `numerics`. `name` is used in errors.
    pub fn build(
        name: &str,
        w: Vec<f32>,
        n: usize,
        k: usize,
        bias: Option<Vec<f32>>,
        numerics: Numerics,
    ) -> Result<Self> {
        let err = |e: &dyn std::fmt::Display| Error::new(name, e.to_string());
        let caps = IsaCaps::process();
        let (imp, n_padded) = match numerics {
            Numerics::F32 => (Imp::Dense(DenseLinear::new(n, k, DenseWeights::F32(w), bias).map_err(|e| err(&e))?), n),
            Numerics::Bf16 => {
                let wb = w.iter().map(|&x| half::bf16::from_f32(x)).collect();
                (Imp::Dense(DenseLinear::new(n, k, DenseWeights::Bf16(wb), bias).map_err(|e| err(&e))?), n)
            }
            Numerics::W4a16 { block, group, config, level } => {
                let q =
                    quantize_asymmetric(&w, n, k, group, ScaleSearch::Off, ParamPrecision::F32).map_err(|e| err(&e))?;
                drop(w);
                let (codes, params) = (q.codes.padded_n(16), q.params.padded_n(16));
                let np = codes.n();
                let bias = bias.map(|mut b| {
                    b.resize(np, 0.0);
                    b
                });
                let weights = W4A16Weights::new(&codes, params, block, config.direct_dequant).map_err(|e| err(&e))?;
                (Imp::W4a16(W4A16Linear::forced(weights, bias, config, level, caps).map_err(|e| err(&e))?), np)
            }
            Numerics::Wna16 { group } => {
                let q =
                    quantize_asymmetric(&w, n, k, group, ScaleSearch::Off, ParamPrecision::F32).map_err(|e| err(&e))?;
                (Imp::Wna16(Wna16Linear::from_codes(&q.codes, q.params, bias).map_err(|e| err(&e))?), n)
            }
        };
        Ok(Linear { n, k, n_padded, imp })
    }

    /// Output width.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The kernel that runs `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        match &self.imp {
            Imp::Dense(d) => d.kernel_for(m),
            Imp::W4a16(l) => l.kernel_for(m),
            Imp::Wna16(l) => l.kernel(),
        }
    }

    /// The packed 4-bit weights and their parameters, when this layer is W4A16 (for embedding lookups).
    pub fn w4a16(&self) -> Option<(&W4A16Weights, &GroupParams)> {
        match &self.imp {
            Imp::W4a16(l) => Some((l.weights(), l.weights().params())),
            _ => None,
        }
    }

    /// Bytes of weights this layer holds.
    pub fn weight_bytes(&self) -> usize {
        match &self.imp {
            Imp::Dense(d) => d.weight_bytes(),
            Imp::W4a16(l) => l.weights().resident_bytes(),
            Imp::Wna16(_) => self.n * self.k / 2 + self.n * self.k.div_ceil(32) * 8,
        }
    }

    /// `out[m][n] = x[m][k]·Wᵀ (+ bias)`.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        let run = |out: &mut [f32]| -> std::result::Result<(), int4_kernels::KernelError> {
            match &self.imp {
                Imp::Dense(d) => d.forward(x, m, out),
                Imp::W4a16(l) => l.forward(x, m, out),
                Imp::Wna16(l) => l.forward(x, m, out),
            }
        };
        if self.n_padded == self.n {
            run(out).map_err(|e| Error::new("linear", e.to_string()))
        } else {
            let mut wide = vec![0.0f32; m * self.n_padded];
            run(&mut wide).map_err(|e| Error::new("linear", e.to_string()))?;
            for r in 0..m {
                out[r * self.n..(r + 1) * self.n].copy_from_slice(&wide[r * self.n_padded..r * self.n_padded + self.n]);
            }
            Ok(())
        }
    }
}
