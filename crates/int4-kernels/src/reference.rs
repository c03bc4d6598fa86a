//! The scalar reference: naive loops over unpacked codes, accumulated in f64.
//!
//! This is what every kernel is tested against, and it never changes to make a kernel pass. It is
//! deliberately separate from the portable fallback ([`crate::portable`]): the fallback is a kernel with its
//! own error budget, the reference is the definition. Weights come from [`int4_layout::dequantize`] (the
//! crate-wide rule); activations are taken as given (bf16 activations are converted to f32 exactly first).

use int4_layout::{Codes, GroupParams};

/// `y[m][n] = Σ_k x[m][k]·w(n, k) + bias[n]` in f64, `x` row-major `[M][K]`, `y` row-major `[M][N]`.
pub fn w4a16(x: &[f32], m: usize, codes: &Codes, params: &GroupParams, bias: Option<&[f32]>) -> Vec<f64> {
    let (n, k) = (codes.n(), codes.k());
    assert_eq!(x.len(), m * k, "activations must be [M][K]");
    let mut w = vec![0.0f64; k];
    let mut y = vec![0.0f64; m * n];
    for col in 0..n {
        for (kk, wk) in w.iter_mut().enumerate() {
            *wk = f64::from(params.weight(col, kk, codes.get(col, kk)));
        }
        let b = bias.map_or(0.0, |b| f64::from(b[col]));
        for row in 0..m {
            let xr = &x[row * k..(row + 1) * k];
            y[row * n + col] = xr.iter().zip(&w).map(|(&a, &b)| f64::from(a) * b).sum::<f64>() + b;
        }
    }
    y
}

/// `y = x·Wᵀ + bias` in f64 for unquantized weights `w` (`[N][K]`, row-major, as f32).
pub fn dense(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Vec<f64> {
    assert_eq!(x.len(), m * k, "activations must be [M][K]");
    assert_eq!(w.len(), n * k, "weights must be [N][K]");
    let mut y = vec![0.0f64; m * n];
    for row in 0..m {
        let xr = &x[row * k..(row + 1) * k];
        for col in 0..n {
            let wr = &w[col * k..(col + 1) * k];
            let b = bias.map_or(0.0, |b| f64::from(b[col]));
            y[row * n + col] = xr.iter().zip(wr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() + b;
        }
    }
    y
}

/// The W4A8 reference, computed directly from unpacked codes: per weight group, the exact integer sum
/// `Σ xq·(q − z)` (i64, then checked to fit the kernels' i32), then `out = fma(sum, a_scale[m]·w_scale[g][n],
/// out)` in f32, groups in K order, starting from the bias (the kernels' documented arithmetic). `xq` is
/// `[M][k_padded]` (padding ignored), `scales_gn` and `zero_points_gn` `[G][N]` (`None`: every zero is 8).
#[allow(clippy::too_many_arguments)]
pub fn w4a8(
    xq: &[i8],
    m: usize,
    k_padded: usize,
    a_scales: &[f32],
    codes: &Codes,
    scales_gn: &[f32],
    zero_points_gn: Option<&[u8]>,
    g_len: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let (n, k) = (codes.n(), codes.k());
    let groups = k.div_ceil(g_len);
    let mut out = vec![0.0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let mut tot = bias.map_or(0.0, |b| b[col]);
            for g in 0..groups {
                let z = i64::from(zero_points_gn.map_or(8, |z| z[g * n + col]));
                let sum: i64 = (g * g_len..((g + 1) * g_len).min(k))
                    .map(|kk| i64::from(xq[r * k_padded + kk]) * (i64::from(codes.get(col, kk)) - z))
                    .sum();
                let sum = i32::try_from(sum).expect("a W4A8 group sum fits in i32");
                tot = (sum as f32).mul_add(a_scales[r] * scales_gn[g * n + col], tot);
            }
            out[r * n + col] = tot;
        }
    }
    out
}
