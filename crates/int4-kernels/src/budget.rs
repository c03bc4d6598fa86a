//! Error budgets: how far a kernel's f32 output may be from the f64 reference, as a formula.
//!
//! A kernel's error comes from three places, each bounded by the standard floating-point model
//! (`fl(a ∘ b) = (a ∘ b)(1 + δ)`, `|δ| ≤ u`):
//!
//! * **rounding the weights** before the products (a kernel that rounds each dequantized weight to bf16
//!   for bf16 arithmetic: relative error `u_bf16 = 2⁻⁸`, bf16 having 8 significant bits; the AVX2 and
//!   portable kernels use the exact f32 weights);
//! * **rounding the activations** (f32 activations fed to a bf16 kernel: `u_bf16` again);
//! * **accumulating** in f32: a sum of K products, then the per-group scale and zero terms and the bias,
//!   each addition rounding once: at most `(K + 4)·u_f32` relative to the sum of magnitudes
//!   (`γ_{K+4}`, with `u_f32 = 2⁻²⁴`).
//!
//! The magnitudes summed are those of the terms the kernel actually adds. The prefill and the fallback
//! compute with `(q − 8)·s + z`: `μ[m][n] = Σ_k |x[m][k]|·(|(q − 8)·s| + |z|)` ([`magnitudes_w4`]). The
//! decode kernels factor the weight as `s·q + (z − 8s)` and sum `s·Σ x·q + (z − 8s)·Σ x`:
//! `μ = Σ_k |x|·(q·s + |z − 8s|)` ([`magnitudes_w4_decode`]). Either can exceed `Σ|x||w|` (the terms
//! cancel), so `|w|` alone would not bound them. The `vdpbf16ps` decode sums `xb·(128 + q)·s` and
//! `(z − 136·s)·Σ xb` over bf16-rounded activations `xb`: its budget ([`decode_bf16_bound`]) is the
//! activations' actual rounding error plus f32 accumulation of those larger magnitudes. The budget for
//! output `(m, n)` is otherwise
//!
//! ```text
//! (weight_rounding + activation_rounding + (K + 4)·u_f32)·μ[m][n] + u_f32·|bias[n]|
//! ```
//!
//! This is a worst-case bound (errors of one sign); typical errors are about `√K` times smaller. It is tight
//! enough to catch real mistakes: a scale that is one bf16 ulp off (a relative error of 2⁻⁷ for a scale
//! that is a power of two) in one group exceeds it, which the tests show. A one-f32-ulp error in one scale (2⁻²³ relative) is below any budget
//! that scales with K, and is not what these budgets are for: integer paths are checked bit for bit instead.

use int4_layout::{Codes, GroupParams};

/// Unit roundoff of f32 (half an ulp of 1.0).
pub const U_F32: f64 = 1.0 / (1u64 << 24) as f64;

/// Unit roundoff of bf16.
pub const U_BF16: f64 = 1.0 / (1u64 << 8) as f64;

/// The rounding steps a kernel takes, from which its budget follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Relative error of each weight before the products (0 when the kernel uses the f32 weight).
    pub weight_rounding: f64,
    /// Relative error of each activation before the products (0 when used as given).
    pub activation_rounding: f64,
}

impl Budget {
    /// Weights and activations used as given, f32 accumulation: every kernel in this build (bf16 dense
    /// weights are already bf16, so using them is exact too).
    pub const F32_ACCUMULATE: Budget = Budget { weight_rounding: 0.0, activation_rounding: 0.0 };
    /// Weights rounded to bf16 before bf16 products (`vdpbf16ps`-style kernels), f32 accumulation.
    pub const BF16_WEIGHTS: Budget = Budget { weight_rounding: U_BF16, activation_rounding: 0.0 };
    /// Weights and activations both rounded to bf16 (`tdpbf16ps` tiles fed f32 activations), f32
    /// accumulation. A product of two rounded values is off by `(1 + u)² − 1 = 2u + u²`; the `u²` is
    /// carried on the activation side.
    pub const BF16_BOTH: Budget = Budget { weight_rounding: U_BF16, activation_rounding: U_BF16 * (1.0 + U_BF16) };

    /// The budget for one output with `k` input channels, magnitude sum `mu` and bias `bias`.
    pub fn bound(&self, k: usize, mu: f64, bias: f64) -> f64 {
        let accumulate = (k as f64 + 4.0) * U_F32;
        (self.weight_rounding + self.activation_rounding + accumulate) * mu + U_F32 * bias.abs()
    }
}

/// `μ[m][n] = Σ_k |x[m][k]|·(|(q − 8)·s| + |z|)` for a 4-bit layer (see the module docs).
pub fn magnitudes_w4(x: &[f32], m: usize, codes: &Codes, params: &GroupParams) -> Vec<f64> {
    let (n, k) = (codes.n(), codes.k());
    let g_len = params.group_size().len(k);
    let mut out = vec![0.0f64; m * n];
    let mut mag = vec![0.0f64; k];
    for col in 0..n {
        for (kk, mk) in mag.iter_mut().enumerate() {
            let g = kk / g_len;
            let (s, z) = (params.scale(col, g), params.zero(col, g));
            *mk = f64::from(((f32::from(codes.get(col, kk)) - 8.0) * s).abs()) + f64::from(z.abs());
        }
        for row in 0..m {
            out[row * n + col] =
                x[row * k..(row + 1) * k].iter().zip(&mag).map(|(&a, &b)| f64::from(a.abs()) * b).sum();
        }
    }
    out
}

/// `μ[m][n] = Σ_k |x[m][k]|·(q·s + |z − 8s|)`: the magnitudes the decode kernels sum, which factor the
/// weight as `q·s + (z − 8s)` (`q` in 0..15) rather than `(q − 8)·s + z`.
pub fn magnitudes_w4_decode(x: &[f32], m: usize, codes: &Codes, params: &GroupParams) -> Vec<f64> {
    let (n, k) = (codes.n(), codes.k());
    let g_len = params.group_size().len(k);
    let mut out = vec![0.0f64; m * n];
    let mut mag = vec![0.0f64; k];
    for col in 0..n {
        for (kk, mk) in mag.iter_mut().enumerate() {
            let g = kk / g_len;
            let (s, z) = (f64::from(params.scale(col, g)), f64::from(params.zero(col, g)));
            *mk = f64::from(codes.get(col, kk)) * s.abs() + (z - 8.0 * s).abs();
        }
        for row in 0..m {
            out[row * n + col] =
                x[row * k..(row + 1) * k].iter().zip(&mag).map(|(&a, &b)| f64::from(a.abs()) * b).sum();
        }
    }
    out
}

/// The `vdpbf16ps` decode's two error sources per output, `(rounding, accumulated)`
/// ([`decode_bf16_bound`]). It rounds each activation to bf16 (`xb`) and sums `xb·(128 + q)·s` and
/// `(z − 136·s)·Σ xb`: the rounding changes the result by exactly `Σ (xb − x)·w`, so `rounding[m][n] =
/// Σ_k |xb − x|·|w|` (plus `|xb|·(128 + q)·|s|` where `xb` is a bf16 denormal, which the instruction
/// flushes), and the accumulated magnitudes are `Σ_k |xb|·((128 + q)·|s| + |z − 136·s|)`.
pub fn magnitudes_w4_decode_bf16(x: &[f32], m: usize, codes: &Codes, params: &GroupParams) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (codes.n(), codes.k());
    let g_len = params.group_size().len(k);
    let (mut rounding, mut accumulated) = (vec![0.0f64; m * n], vec![0.0f64; m * n]);
    for col in 0..n {
        for row in 0..m {
            let (mut r, mut a) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let g = kk / g_len;
                let (s, z) = (f64::from(params.scale(col, g)), f64::from(params.zero(col, g)));
                let q = f64::from(codes.get(col, kk));
                let xv = x[row * k + kk];
                let xb = half::bf16::from_f32(xv).to_f32();
                let w = f64::from(params.weight(col, kk, codes.get(col, kk)));
                let biased = (128.0 + q) * s.abs();
                r += (f64::from(xb) - f64::from(xv)).abs() * w.abs();
                if xb != 0.0 && xb.abs() < f32::MIN_POSITIVE {
                    r += f64::from(xb.abs()) * biased;
                }
                a += f64::from(xb.abs()) * (biased + (z - 136.0 * s).abs());
            }
            rounding[row * n + col] = r;
            accumulated[row * n + col] = a;
        }
    }
    (rounding, accumulated)
}

/// The `vdpbf16ps` decode's budget for one output: the activations' rounding as it is
/// (`rounding`, from [`magnitudes_w4_decode_bf16`]), then f32 accumulation of the `accumulated` magnitudes.
pub fn decode_bf16_bound(k: usize, rounding: f64, accumulated: f64, bias: f64) -> f64 {
    rounding * (1.0 + U_F32) + Budget::F32_ACCUMULATE.bound(k, accumulated, bias)
}

/// `μ[m][n] = Σ_k |x[m][k]|·|w[n][k]|` for unquantized weights.
pub fn magnitudes_dense(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for row in 0..m {
        for col in 0..n {
            out[row * n + col] = x[row * k..(row + 1) * k]
                .iter()
                .zip(&w[col * k..(col + 1) * k])
                .map(|(&a, &b)| f64::from(a.abs()) * f64::from(b.abs()))
                .sum();
        }
    }
    out
}

/// `μ[m][n] = Σ_k |x[m][k]·d[n][k/32]·q[n][k]|` for W8A16 weights (codes `[N][K]`, scales `[N][K/32]`).
pub fn magnitudes_w8a16(x: &[f32], m: usize, codes: &[i8], scales: &[f32], n: usize, k: usize) -> Vec<f64> {
    let groups = k / 32;
    let mut out = vec![0.0f64; m * n];
    for row in 0..m {
        for col in 0..n {
            out[row * n + col] = (0..k)
                .map(|kk| {
                    let w = f64::from(scales[col * groups + kk / 32]) * f64::from(codes[col * k + kk]);
                    (f64::from(x[row * k + kk]) * w).abs()
                })
                .sum();
        }
    }
    out
}

/// `γ_n = n·u/(1 − n·u)`: the relative error of `n` chained roundings with unit roundoff `u`.
fn gamma(n: usize, u: f64) -> f64 {
    let nu = n as f64 * u;
    nu / (1.0 - nu)
}

/// How far a W8A16 output (`crate::w8a16`'s order) may be from the f64 reference
/// ([`crate::reference::w8a16_f64`]), for `k` input channels, magnitudes `mu` ([`magnitudes_w8a16`]) and
/// bias `bias`.
///
/// Each term `x·d·q` is rounded at most `G + 7` times on its way to the output (`G = K/32`): its product
/// `q·x` (the lanes' first half), the inner `fma` that makes `t`, the group's `fma` into its lane and
/// every later group's (at most `G`), four tree additions and the bias addition; the bias is rounded once.
/// So the kernels are within `γ_{G+7}·μ + u·|bias|` of the exact sum (`u = 2⁻²⁴`), under the standard model
/// the whole module assumes: no product or FMA result lands among the subnormals (below 2⁻¹²⁶ without being
/// 0). The f64 reference rounds each of its `K` products and `K` additions (`d·q` itself is exact: 24 + 8
/// bits): `γ_{2K+1}` in f64 of `μ + |bias|` covers that too.
pub fn w8a16_bound(k: usize, mu: f64, bias: f64) -> f64 {
    let reference = gamma(2 * k + 1, f64::EPSILON / 2.0) * (mu + bias.abs());
    gamma(k / 32 + 7, U_F32) * mu + U_F32 * bias.abs() + reference
}
