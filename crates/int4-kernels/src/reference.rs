//! The scalar reference: naive loops over unpacked codes, accumulated in f64.
//!
//! This is what every kernel is tested against, and it never changes to make a kernel pass. It is
//! deliberately separate from the portable fallback ([`crate::portable`]): the fallback is a kernel with its
//! own error budget, the reference is the definition. Weights come from [`int4_layout::dequantize`] (the
//! crate-wide rule); activations are taken as given (bf16 activations are converted to f32 exactly first).
//!
//! Where a kernel family defines its arithmetic as one f32 order that every variant follows (W4A8's
//! epilogue, [`w4a8`]; W8A16, [`w8a16`]), the reference is that order, checked bit for bit, and W8A16 has
//! an f64 twin ([`w8a16_f64`]) that bounds it.

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

/// The operands of the W4A8 reference, as plain tables.
#[derive(Clone, Copy, Debug)]
pub struct W4a8Operands<'a> {
    /// Quantized activations `[M][k_padded]` (padding ignored).
    pub xq: &'a [i8],
    /// Rows.
    pub m: usize,
    /// Activation row stride.
    pub k_padded: usize,
    /// Activation scales `[M][G]` (per token: the same value across a row).
    pub a_scales: &'a [f32],
    /// Unpacked codes `[N][K]`.
    pub codes: &'a Codes,
    /// Weight scales `[G][N]`.
    pub scales_gn: &'a [f32],
    /// Integer zero points `[G][N]`; `None`: every zero is 8.
    pub zero_points_gn: Option<&'a [u8]>,
    /// Float offsets `[G][N]` (`w = s·(q − z) + f`); `None`: every offset is 0.
    pub offsets_gn: Option<&'a [f32]>,
    /// Group length in input channels.
    pub g_len: usize,
    /// Bias `[N]`.
    pub bias: Option<&'a [f32]>,
}

/// The W4A8 reference, computed directly from unpacked codes: per weight group, the exact integer sum
/// `Σ xq·(q − z)` (i64, then checked to fit the kernels' i32), then
/// `out = fma(sum, a_scale[m][g]·w_scale[g][n], out)` in f32 and, with float offsets,
/// `out = fma(Σ xq, a_scale[m][g]·f[g][n], out)`, groups in K order, starting from the bias (the kernels'
/// documented arithmetic).
pub fn w4a8(o: &W4a8Operands) -> Vec<f32> {
    let (n, k, m) = (o.codes.n(), o.codes.k(), o.m);
    let groups = k.div_ceil(o.g_len);
    assert_eq!(o.a_scales.len(), m * groups, "activation scales must be [M][G]");
    let mut out = vec![0.0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let mut tot = o.bias.map_or(0.0, |b| b[col]);
            for g in 0..groups {
                let z = i64::from(o.zero_points_gn.map_or(8, |z| z[g * n + col]));
                let span = g * o.g_len..((g + 1) * o.g_len).min(k);
                let x = |kk: usize| i64::from(o.xq[r * o.k_padded + kk]);
                let sum: i64 = span.clone().map(|kk| x(kk) * (i64::from(o.codes.get(col, kk)) - z)).sum();
                let sum = i32::try_from(sum).expect("a W4A8 group sum fits in i32");
                let a_s = o.a_scales[r * groups + g];
                tot = (sum as f32).mul_add(a_s * o.scales_gn[g * n + col], tot);
                if let Some(f) = o.offsets_gn {
                    let xsum = i32::try_from(span.map(x).sum::<i64>()).expect("an activation group sum fits in i32");
                    tot = (xsum as f32).mul_add(a_s * f[g * n + col], tot);
                }
            }
            out[r * n + col] = tot;
        }
    }
    out
}

/// The W8A16 definition (`crate::w8a16`'s module docs): `y[m][n]` for codes `[N][K]`, scales `[N][K/32]`,
/// computed in exactly the documented f32 order — per output sixteen lanes, per group
/// `t = fma(q(16 + j), x(16 + j), q(j)·x(j))` and `acc[j] = fma(d, t, acc[j])`, then the pairwise tree
/// `8 + 8, 4 + 4, 2 + 2, 1 + 1` and the bias. Not f64: every kernel must give these bits, so this is
/// the order itself, written as naive loops. [`w8a16_f64`] is the exact value it approximates.
pub fn w8a16(x: &[f32], m: usize, codes: &[i8], scales: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Vec<f32> {
    assert!(k.is_multiple_of(32), "W8A16 rows are whole groups of 32");
    let groups = k / 32;
    assert_eq!(x.len(), m * k, "activations must be [M][K]");
    assert_eq!(codes.len(), n * k, "codes must be [N][K]");
    assert_eq!(scales.len(), n * groups, "scales must be [N][K/32]");
    let mut y = vec![0.0f32; m * n];
    for row in 0..m {
        for col in 0..n {
            let mut acc = [0.0f32; 16];
            for g in 0..groups {
                let d = scales[col * groups + g];
                for (j, a) in acc.iter_mut().enumerate() {
                    let (lo, hi) = (32 * g + j, 32 * g + 16 + j);
                    let q = |kk: usize| f32::from(codes[col * k + kk]);
                    let xv = |kk: usize| x[row * k + kk];
                    let t = q(hi).mul_add(xv(hi), q(lo) * xv(lo));
                    *a = d.mul_add(t, *a);
                }
            }
            for width in [8, 4, 2, 1] {
                for j in 0..width {
                    acc[j] += acc[j + width];
                }
            }
            y[row * n + col] = match bias {
                Some(b) => acc[0] + b[col],
                None => acc[0],
            };
        }
    }
    y
}

/// `y[m][n] = Σ_k x[m][k]·d[n][k/32]·q[n][k] + bias[n]` in f64 (each `d·q` exact, each product and sum
/// rounded to f64): what [`w8a16`] approximates, for the error budget [`crate::budget::w8a16_bound`].
pub fn w8a16_f64(
    x: &[f32],
    m: usize,
    codes: &[i8],
    scales: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Vec<f64> {
    assert!(k.is_multiple_of(32), "W8A16 rows are whole groups of 32");
    let groups = k / 32;
    assert_eq!(x.len(), m * k, "activations must be [M][K]");
    assert_eq!(codes.len(), n * k, "codes must be [N][K]");
    assert_eq!(scales.len(), n * groups, "scales must be [N][K/32]");
    let mut y = vec![0.0f64; m * n];
    for row in 0..m {
        for col in 0..n {
            let w = |kk: usize| f64::from(scales[col * groups + kk / 32]) * f64::from(codes[col * k + kk]);
            let sum: f64 = (0..k).map(|kk| f64::from(x[row * k + kk]) * w(kk)).sum();
            y[row * n + col] = sum + bias.map_or(0.0, |b| f64::from(b[col]));
        }
    }
    y
}
