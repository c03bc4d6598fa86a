//! Vector primitives the runtime's forward pass uses outside the linear layers: a dot product, `y += a·x`,
//! a vectorised `exp` and the softmax, SiLU·up, RMSNorm, and a small strided GEMM for attention blocks, on
//! AVX2 + FMA where the process may use it and in portable Rust otherwise.
//!
//! **exp.** Both variants compute `exp(x)` the same way (Cephes' `expf`): `n = round(x·log₂e)`,
//! `r = x − n·ln2` (ln 2 split into a 9-bit head, so `n·ln2_hi` is exact, and a tail), a degree-7
//! polynomial for `eʳ` on `|r| ≤ ln2/2`, and `2ⁿ` built in the exponent field. The AVX2 variant fuses the
//! multiply-adds, the portable one rounds each step; they are not bit-identical to each other, and each is
//! held to [`EXP_MAX_REL_ERROR`] against f64 `exp`:
//!
//! * `x ∈ [EXP_MIN, EXP_MAX]`: relative error at most [`EXP_MAX_REL_ERROR`] (2 ulp; measured: 0.7 ulp),
//!   except where the result falls below 2⁻¹²⁶ (`x < −87.34`), where the product with `2ⁿ` is subnormal and
//!   the absolute error is at most 2⁻¹⁴⁹;
//! * `x < EXP_MIN` (−87.34, where `eˣ < 2⁻¹²⁶`) and `x = −∞`: exactly `0` (absolute error below 2⁻¹²⁶);
//! * `x > EXP_MAX` (127.5·ln 2 ≈ 88.38): `+∞` (the true value overflows f32 above 88.72);
//! * NaN: NaN. No finite or infinite input gives NaN.

use half::f16;

use crate::isa::{Avx2Fma, Avx512, IsaCaps};

/// Below this, [`VectorOps::exp`] returns 0: `ln(2⁻¹²⁶)`, where `eˣ` leaves f32's normal range.
pub const EXP_MIN: f32 = -87.336_54;
/// Above this, [`VectorOps::exp`] returns `+∞`: 127.5·ln 2, so that `2ⁿ` stays a normal number.
pub const EXP_MAX: f32 = 88.376_26;
/// The largest relative error of [`VectorOps::exp`] against the exact value, for `x ∈ [EXP_MIN, EXP_MAX]`
/// with a normal result: 2 ulp of f32 (2·2⁻²³). The tests measure 0.7 ulp (8.3·10⁻⁸) on both variants.
pub const EXP_MAX_REL_ERROR: f64 = 2.0 / (1u64 << 23) as f64;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits, so `n·LN2_HI` is exact for `|n| < 2¹⁵`.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial: `eʳ ≈ 1 + r + r²·(P5 + r·(P4 + r·(P3 + r·(P2 + r·(P1 + r·P0)))))`.
const P0: f32 = 1.987_569_2e-4;
const P1: f32 = 1.398_199_9e-3;
const P2: f32 = 8.333_452e-3;
const P3: f32 = 4.166_579_6e-2;
const P4: f32 = 1.666_666_5e-1;
const P5: f32 = 0.5; // Cephes writes 5.0000001e-1, which rounds to 0.5 in f32
/// 1.5·2²³: adding and subtracting it rounds an f32 of magnitude below 2²² to the nearest integer (ties to
/// even) without `roundss`, which the x86-64 baseline lacks.
const ROUND: f32 = 12_582_912.0;

/// `exp(x)` in portable Rust, to the bound in the module documentation.
pub fn exp_portable(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5;
    let e = p * (r * r) + r + 1.0;
    // n ∈ [−126, 127]: the biased exponent is 1..=254, a normal power of two.
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The checks of every GEMM entry (`op` names it in the panic): C, A (`(len, a_row, a_col)`) and B (`(len,
/// ldb)`) long enough for the shape. Returns whether there is work to do (`m, n, k ≥ 1`); with `k` = 0
/// it has set C's outputs to the empty sum, zero, unless `add`.
fn gemm_operands(
    op: &str,
    add: bool,
    (m, n, k): (usize, usize, usize),
    (a_len, a_row, a_col): (usize, usize, usize),
    (b_len, ldb): (usize, usize),
    c: &mut [f32],
    ldc: usize,
) -> bool {
    if m == 0 || n == 0 {
        return false;
    }
    assert!(ldc >= n, "{op}: ldc {ldc} < n {n}");
    assert!((m - 1) * ldc + n <= c.len(), "{op}: C is too short");
    if k == 0 {
        if !add {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return false;
    }
    assert!((m - 1) * a_row + (k - 1) * a_col < a_len, "{op}: A is too short");
    assert!((k - 1) * ldb + n <= b_len, "{op}: B is too short");
    true
}

/// Rows of an f16 B that [`VectorOps::gemm_f16`] widens at a time where it does not widen in registers.
pub const GEMM_F16_WIDEN_ROWS: usize = 256;

/// A chosen implementation (picked once, then reused).
#[derive(Clone, Copy, Debug)]
pub struct VectorOps {
    tok: Option<Avx2Fma>,
    /// Where AVX-512 runs, the GEMM takes 16 columns per register and the softmax numerator 16 lanes (the
    /// same arithmetic per value, so the same bits).
    wide: Option<Avx512>,
    /// Whether F16C is usable beside AVX2 (checked on the live CPU): f16 widens eight at a time.
    f16c: bool,
}

impl Default for VectorOps {
    fn default() -> Self {
        VectorOps::new()
    }
}

impl VectorOps {
    /// The best implementation the process caps allow.
    pub fn new() -> Self {
        VectorOps::with_caps(IsaCaps::process())
    }

    /// The best implementation `caps` allows (tests use it to run the portable variant on an AVX2 CPU).
    pub fn with_caps(caps: &IsaCaps) -> Self {
        let tok = Avx2Fma::with_caps(caps);
        #[cfg(target_arch = "x86_64")]
        let f16c = tok.is_some() && std::arch::is_x86_feature_detected!("f16c");
        #[cfg(not(target_arch = "x86_64"))]
        let f16c = false;
        VectorOps { tok, wide: Avx512::with_caps(caps), f16c }
    }

    /// Whether the AVX2 + FMA variant runs.
    pub fn is_avx2(&self) -> bool {
        self.tok.is_some()
    }

    /// `out[j] = self.dot(q, &keys[j·stride..j·stride + q.len()])` for every `j < out.len()`, each bit for
    /// bit that dot product (attention's scores of one query against a run of cached keys). Panics if
    /// `keys` is too short.
    pub fn dots(&self, q: &[f32], keys: &[f32], stride: usize, out: &mut [f32]) {
        let (len, n) = (q.len(), out.len());
        if n == 0 {
            return;
        }
        assert!((n - 1) * stride + len <= keys.len(), "dots: the keys are too short");
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; the assert proves keys j < n readable for `len` floats at
            // j·stride, `q` holds `len` and `out` `n`.
            Some(_) => unsafe {
                crate::x86_64::avx2::dots_f32(q.as_ptr(), keys.as_ptr(), stride, len, n, out.as_mut_ptr())
            },
            _ => {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = self.dot(q, &keys[j * stride..j * stride + len]);
                }
            }
        }
    }

    /// `out[h·n + j] = self.dot(&qs[h·len..(h + 1)·len], &keys[j·stride..j·stride + len])` for the `heads`
    /// queries in `qs` (`len = qs.len() / heads`) and every key `j < n = out.len() / heads`: each bit for
    /// bit that dot product, as [`VectorOps::dots`] gives it per query. The query heads that share a KV
    /// head take its keys together (a block of keys at a time while it is in L1), so the keys are read once
    /// for all of them; with AVX-512 sixteen floats go through each FMA, in the same chains. Panics if `qs`
    /// or `out` is not a whole number of heads, or if `keys` is too short.
    pub fn dots_heads(&self, qs: &[f32], heads: usize, keys: &[f32], stride: usize, out: &mut [f32]) {
        assert!(
            heads > 0 && qs.len().is_multiple_of(heads) && out.len().is_multiple_of(heads),
            "dots_heads: not whole heads"
        );
        let (len, n) = (qs.len() / heads, out.len() / heads);
        if n == 0 || len == 0 {
            out.fill(0.0);
            return;
        }
        assert!((n - 1) * stride + len <= keys.len(), "dots_heads: the keys are too short");
        match (self.tok, self.wide) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512F, AVX2 and FMA; `qs` holds `heads·len` floats, the assert
            // proves keys j < n readable for `len` floats at j·stride, and `out` holds `heads·n`.
            (_, Some(_)) => unsafe {
                crate::x86_64::avx512::dots_heads_f32(
                    qs.as_ptr(),
                    heads,
                    keys.as_ptr(),
                    stride,
                    len,
                    n,
                    out.as_mut_ptr(),
                )
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; bounds as above.
            (Some(_), None) => unsafe {
                crate::x86_64::avx2::dots_heads_f32(qs.as_ptr(), heads, keys.as_ptr(), stride, len, n, out.as_mut_ptr())
            },
            _ => {
                for (q, o) in qs.chunks_exact(len).zip(out.chunks_exact_mut(n)) {
                    self.dots(q, keys, stride, o);
                }
            }
        }
    }

    /// [`Self::dots_heads`] against keys stored in f16: each score bit for bit what `dots_heads` gives
    /// against the keys widened to f32 ([`Self::widen_f16`]). With F16C (and AVX2 or AVX-512) the keys are
    /// widened in registers as they are read, so half the bytes are read and nothing is written; the
    /// portable path widens one key at a time. Panics as `dots_heads` does.
    pub fn dots_heads_f16(&self, qs: &[f32], heads: usize, keys: &[f16], stride: usize, out: &mut [f32]) {
        assert!(
            heads > 0 && qs.len().is_multiple_of(heads) && out.len().is_multiple_of(heads),
            "dots_heads_f16: not whole heads"
        );
        let (len, n) = (qs.len() / heads, out.len() / heads);
        if n == 0 || len == 0 {
            out.fill(0.0);
            return;
        }
        assert!((n - 1) * stride + len <= keys.len(), "dots_heads_f16: the keys are too short");
        let (q, k, o) = (qs.as_ptr(), keys.as_ptr().cast::<u16>(), out.as_mut_ptr());
        match (self.wide, self.f16c) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512F, AVX2 and FMA, and `f16c` that the live CPU has F16C; `qs`
            // holds `heads·len` floats, the assert proves keys j < n readable for `len` halves at j·stride,
            // and `out` holds `heads·n`.
            (Some(_), true) => unsafe { crate::x86_64::avx512::dots_heads_f16(q, heads, k, stride, len, n, o) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `f16c` is set only where the AVX2 token exists and the live CPU has F16C; bounds as
            // above.
            (None, true) => unsafe { crate::x86_64::avx2::dots_heads_f16(q, heads, k, stride, len, n, o) },
            _ => {
                let mut wide = vec![0.0f32; len];
                for j in 0..n {
                    self.widen_f16(&keys[j * stride..j * stride + len], &mut wide);
                    for (h, q) in qs.chunks_exact(len).enumerate() {
                        out[h * n + j] = self.dot(q, &wide);
                    }
                }
            }
        }
    }

    /// `dst[i] = src[i]` widened from f16, which is exact (every f16 is an f32): sixteen at a time with
    /// AVX-512, eight with F16C, one at a time in portable Rust, every variant the same bits (a NaN stays a
    /// NaN). A KV cache stored in f16 is read through it. Panics if the lengths differ.
    pub fn widen_f16(&self, src: &[f16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen_f16 of slices of different lengths");
        match (self.wide, self.f16c) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512F; both slices hold `src.len()` values.
            (Some(_), _) => unsafe { avx512::widen_f16(src.as_ptr().cast(), dst.as_mut_ptr(), src.len()) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `f16c` is set only where the AVX2 token exists and the live CPU reports F16C; both
            // slices hold `src.len()` values.
            (None, true) => unsafe { avx2::widen_f16(src.as_ptr().cast(), dst.as_mut_ptr(), src.len()) },
            _ => {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s.to_f32_const();
                }
            }
        }
    }

    /// `dst[i] = f16::from_f32(src[i])`, rounded to the nearest f16 (ties to even): sixteen at a time with
    /// AVX-512, eight with F16C (`vcvtps2ph`, round to nearest even), one at a time in portable Rust, every
    /// variant the same bits for every finite value and infinity (beyond the f16 range, ±infinity; a NaN
    /// stays a NaN). A KV cache stored in f16 is written through it. Panics if the lengths differ.
    pub fn narrow_f16(&self, src: &[f32], dst: &mut [f16]) {
        assert_eq!(src.len(), dst.len(), "narrow_f16 of slices of different lengths");
        match (self.wide, self.f16c) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512F; both slices hold `src.len()` values.
            (Some(_), _) => unsafe { avx512::narrow_f16(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `f16c` is set only where the AVX2 token exists and the live CPU reports F16C; both
            // slices hold `src.len()` values.
            (None, true) => unsafe { avx2::narrow_f16(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) },
            _ => {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = f16::from_f32(s);
                }
            }
        }
    }

    /// `Σ a[i]·b[i]` (panics if the lengths differ).
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot of slices of different lengths");
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; both slices hold `a.len()` floats.
            Some(_) => unsafe { crate::x86_64::avx2::dot_f32(a.as_ptr(), b.as_ptr(), a.len()) },
            _ => {
                // Eight independent partial sums, so the loop vectorises and pipelines without AVX2.
                let mut acc = [0.0f32; 8];
                let chunks = a.len() / 8;
                for c in 0..chunks {
                    for j in 0..8 {
                        acc[j] += a[c * 8 + j] * b[c * 8 + j];
                    }
                }
                let mut s: f32 = acc.iter().sum();
                for i in chunks * 8..a.len() {
                    s += a[i] * b[i];
                }
                s
            }
        }
    }

    /// `y[i] += alpha·x[i]` (panics if the lengths differ).
    pub fn axpy(&self, alpha: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy of slices of different lengths");
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `x` and `y` hold `x.len()` floats each.
            Some(_) => unsafe { crate::x86_64::avx2::axpy(alpha, x.as_ptr(), y.as_mut_ptr(), x.len()) },
            _ => {
                for (a, &b) in y.iter_mut().zip(x) {
                    *a += alpha * b;
                }
            }
        }
    }

    /// `x[i] = exp(x[i])`, to the bound in the module documentation.
    pub fn exp(&self, x: &mut [f32]) {
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `x` holds `x.len()` floats.
            Some(_) => unsafe { avx2::exp_inplace(x.as_mut_ptr(), x.len()) },
            _ => x.iter_mut().for_each(|v| *v = exp_portable(*v)),
        }
    }

    /// The largest element (`−∞` for an empty slice; NaNs are ignored unless all are NaN).
    pub fn max(&self, x: &[f32]) -> f32 {
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2; `x` holds `x.len()` floats.
            Some(_) => unsafe { avx2::max(x.as_ptr(), x.len()) },
            _ => {
                let mut acc = [f32::NEG_INFINITY; 8];
                let mut chunks = x.chunks_exact(8);
                for c in &mut chunks {
                    for j in 0..8 {
                        acc[j] = acc[j].max(c[j]);
                    }
                }
                chunks.remainder().iter().fold(acc.iter().copied().fold(f32::NEG_INFINITY, f32::max), |a, &b| a.max(b))
            }
        }
    }

    /// The softmax numerator: `x[i] = exp((x[i] − max)·scale)`, returning `Σ x[i]` (f32, summed in eight
    /// lanes). With `max` the slice's largest element and `scale > 0` every argument is `≤ 0`, so nothing
    /// overflows and the largest term is 1; a `−∞` element (a masked score) becomes 0.
    pub fn softmax_exp(&self, x: &mut [f32], max: f32, scale: f32) -> f32 {
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512F, AVX2 and FMA; `x` holds `x.len()` floats.
            Some(_) if self.wide.is_some() => unsafe { avx512::softmax_exp(x.as_mut_ptr(), x.len(), max, scale) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `x` holds `x.len()` floats.
            Some(_) => unsafe { avx2::softmax_exp(x.as_mut_ptr(), x.len(), max, scale) },
            _ => {
                let mut acc = [0.0f32; 8];
                for (i, v) in x.iter_mut().enumerate() {
                    *v = exp_portable((*v - max) * scale);
                    acc[i % 8] += *v;
                }
                acc.iter().sum()
            }
        }
    }

    /// `out[i] = gate[i] / (1 + exp(−gate[i])) · up[i]`: SiLU of the gate times the up projection (panics
    /// if the lengths differ).
    pub fn silu_mul(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        assert!(gate.len() == up.len() && up.len() == out.len(), "silu_mul of slices of different lengths");
        match self.tok {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the tokens prove AVX-512F, AVX2 and FMA; the three slices hold `out.len()` floats each.
            Some(_) if self.wide.is_some() => unsafe {
                avx512::silu_mul(gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), out.len())
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; the three slices hold `out.len()` floats each.
            Some(_) => unsafe { avx2::silu_mul(gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), out.len()) },
            _ => {
                for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                    *o = g / (1.0 + exp_portable(-g)) * u;
                }
            }
        }
    }

    /// RMSNorm: `out[i] = x[i]·r·w[i]` with `r = 1/√(Σx²/len + eps)` (panics if the lengths differ). The
    /// sum of squares is [`VectorOps::dot`]'s (f32, several chains).
    pub fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        assert!(x.len() == w.len() && w.len() == out.len(), "rms_norm of slices of different lengths");
        let ms = self.dot(x, x) / x.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        // `(x·r)·w`, two roundings, in either variant (the compiler vectorises this loop as it stands).
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
            *o = v * r * g;
        }
    }

    /// `x[i] *= a`.
    pub fn scale(&self, a: f32, x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v *= a);
    }

    /// A small GEMM over strided operands: `c[i·ldc + j] = Σ_p a[i·a_row + p·a_col] · b[p·ldb + j]` for
    /// `i < m`, `j < n`, `p < k` (C is overwritten; `k = 0` gives zeros). A may be any strided view (rows of
    /// a wider matrix, or a transposed one); B and C rows are contiguous. Each output is one FMA chain over
    /// `p` in order on AVX2 (error at most `k·u·Σ|a·b|`, u = 2⁻²⁴), a multiply-add chain in portable Rust
    /// (`2k·u·Σ|a·b|`). Panics if an operand is too short for its view.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        mnk: (usize, usize, usize),
        a: &[f32],
        a_row: usize,
        a_col: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        self.gemm_with::<false>(mnk, a, a_row, a_col, b, ldb, c, ldc);
    }

    /// [`VectorOps::gemm`] added to C: `c[i·ldc + j] += Σ_p a[i·a_row + p·a_col] · b[p·ldb + j]`, each
    /// output's FMA chain continuing from C's value. So a product cut along `k` into pieces, each added in
    /// order, is bit for bit the product in one call (on AVX2 and AVX-512; in portable Rust too, whose
    /// chain also runs in `p` order). Panics as [`VectorOps::gemm`] does.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_add(
        &self,
        mnk: (usize, usize, usize),
        a: &[f32],
        a_row: usize,
        a_col: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        self.gemm_with::<true>(mnk, a, a_row, a_col, b, ldb, c, ldc);
    }

    /// [`VectorOps::gemm`] against B stored as f16: `c[i·ldc + j] = Σ_p a[i·a_row + p·a_col] ·
    /// f32(b[p·ldb + j])`, bit for bit `gemm` against B widened to f32 (widening is exact and the chains
    /// are the same). AVX-512 widens B in registers as it loads it; elsewhere B is widened
    /// [`GEMM_F16_WIDEN_ROWS`] rows at a time into a buffer that stays in cache and added on with
    /// [`VectorOps::gemm_add`]. Panics as [`VectorOps::gemm`] does.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_f16(
        &self,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        a_row: usize,
        a_col: usize,
        b: &[f16],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        if !gemm_operands("gemm_f16", false, (m, n, k), (a.len(), a_row, a_col), (b.len(), ldb), c, ldc) {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.wide.is_some() {
            // SAFETY: the token proves AVX-512 F, AVX2 and FMA; `gemm_operands`' asserts prove every index the
            // kernel touches (`i·a_row + p·a_col`, f16 element `p·ldb + j`, `i·ldc + j` for i < m, j < n,
            // p < k) is in bounds, and `c` is a distinct mutable slice.
            unsafe {
                avx512::gemm::<false, true>(
                    m,
                    n,
                    k,
                    a.as_ptr(),
                    a_row,
                    a_col,
                    b.as_ptr().cast(),
                    ldb,
                    c.as_mut_ptr(),
                    ldc,
                )
            };
            return;
        }
        let rows = GEMM_F16_WIDEN_ROWS.min(k);
        let mut wide = vec![0.0f32; rows * n];
        for p0 in (0..k).step_by(rows) {
            let kb = (k - p0).min(rows);
            for p in 0..kb {
                self.widen_f16(&b[(p0 + p) * ldb..(p0 + p) * ldb + n], &mut wide[p * n..(p + 1) * n]);
            }
            let a = &a[p0 * a_col..];
            if p0 == 0 {
                self.gemm((m, n, kb), a, a_row, a_col, &wide[..kb * n], n, c, ldc);
            } else {
                self.gemm_add((m, n, kb), a, a_row, a_col, &wide[..kb * n], n, c, ldc);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_with<const ADD: bool>(
        &self,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        a_row: usize,
        a_col: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        if !gemm_operands("gemm", ADD, (m, n, k), (a.len(), a_row, a_col), (b.len(), ldb), c, ldc) {
            return;
        }
        match (self.tok, self.wide) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512 F, AVX2 and FMA; `gemm_operands`' asserts prove every index the kernel
            // touches (`i·a_row + p·a_col`, `p·ldb + j`, `i·ldc + j` for i < m, j < n, p < k) is in bounds,
            // and `c` is a distinct mutable slice.
            (_, Some(_)) => unsafe {
                avx512::gemm::<ADD, false>(
                    m,
                    n,
                    k,
                    a.as_ptr(),
                    a_row,
                    a_col,
                    b.as_ptr().cast(),
                    ldb,
                    c.as_mut_ptr(),
                    ldc,
                )
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `gemm_operands`' asserts prove every index the kernel touches
            // (`i·a_row + p·a_col`, `p·ldb + j`, `i·ldc + j` for i < m, j < n, p < k) is in bounds, and `c` is
            // a distinct mutable slice.
            (Some(_), None) => unsafe {
                avx2::gemm::<ADD>(m, n, k, a.as_ptr(), a_row, a_col, b.as_ptr(), ldb, c.as_mut_ptr(), ldc)
            },
            _ => {
                for i in 0..m {
                    let row = &mut c[i * ldc..i * ldc + n];
                    if !ADD {
                        row.fill(0.0);
                    }
                    for p in 0..k {
                        let av = a[i * a_row + p * a_col];
                        for (o, &bv) in row.iter_mut().zip(&b[p * ldb..p * ldb + n]) {
                            *o += av * bv;
                        }
                    }
                }
            }
        }
    }
}

/// The GEMM's outer loop, shared by its AVX2 and AVX-512 variants: blocks of up to six rows of A, each
/// handed to `$rows::<R, G…>` (`G…` the generic arguments in brackets) for its row count (an `unsafe fn`
/// with the variant's `rows` contract).
#[cfg(target_arch = "x86_64")]
macro_rules! in_six_row_blocks {
    ($rows:ident, [$($g:ident),*], $m:expr, $n:expr, $k:expr, $a:expr, $a_row:expr, $a_col:expr, $b:expr, $ldb:expr, $c:expr, $ldc:expr) => {{
        let (m, n, k, a_row, a_col, b, ldb, ldc) = ($m, $n, $k, $a_row, $a_col, $b, $ldb, $ldc);
        let mut i = 0;
        while i < m {
            let r = (m - i).min(6);
            // Rows i..i + r are within m; the offsets stay inside the caller's ranges.
            let (a, c) = ($a.add(i * a_row), $c.add(i * ldc));
            match r {
                6 => $rows::<6, $($g),*>(n, k, a, a_row, a_col, b, ldb, c, ldc),
                5 => $rows::<5, $($g),*>(n, k, a, a_row, a_col, b, ldb, c, ldc),
                4 => $rows::<4, $($g),*>(n, k, a, a_row, a_col, b, ldb, c, ldc),
                3 => $rows::<3, $($g),*>(n, k, a, a_row, a_col, b, ldb, c, ldc),
                2 => $rows::<2, $($g),*>(n, k, a, a_row, a_col, b, ldb, c, ldc),
                _ => $rows::<1, $($g),*>(n, k, a, a_row, a_col, b, ldb, c, ldc),
            }
            i += r;
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 + FMA variants. Every function is an `unsafe fn` with `#[target_feature(enable =
    //! "avx2,fma")]`: the CPU must have AVX2 and FMA (callers hold an [`Avx2Fma`](crate::isa::Avx2Fma)
    //! token) and the pointer ranges listed in its `# Safety` section must be valid; the safe wrappers in
    //! [`super::VectorOps`] check them with slice lengths.

    use std::arch::x86_64::*;

    use super::{EXP_MAX, EXP_MIN, LN2_HI, LN2_LO, LOG2E, P0, P1, P2, P3, P4, P5, ROUND};
    use crate::x86_64::avx2::hsum;

    /// `exp` of eight lanes, to the bound in the module documentation.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        // Clamp first (min/max return the second operand for a NaN lane: the clamp bound), fix up after.
        let xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_MAX)), _mm256_set1_ps(EXP_MIN));
        let round = _mm256_set1_ps(ROUND);
        let n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(LOG2E), round), round);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
        let e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        // n ∈ [−126, 127] after the clamp: a normal power of two.
        let pow = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
        let y = _mm256_mul_ps(e, _mm256_castsi256_ps(pow));
        // Ordered, non-signalling compares: false for NaN lanes.
        let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_MIN)), y);
        let y =
            _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(EXP_MAX)));
        _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    /// Loads `len < 8` floats into the low lanes, `fill` elsewhere.
    ///
    /// # Safety
    /// The CPU must support AVX2; `src` readable for `len ≤ 8` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_partial(src: *const f32, len: usize, fill: f32) -> __m256 {
        let mut buf = [fill; 8];
        // SAFETY: `len ≤ 8` readable floats at `src` (caller contract); `buf` holds 8.
        unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), len) };
        // SAFETY: `buf` holds 8 floats.
        unsafe { _mm256_loadu_ps(buf.as_ptr()) }
    }

    /// Stores the low `len < 8` lanes.
    ///
    /// # Safety
    /// The CPU must support AVX2; `dst` writable for `len ≤ 8` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_partial(dst: *mut f32, len: usize, v: __m256) {
        let mut buf = [0.0f32; 8];
        // SAFETY: `buf` holds 8 floats.
        unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), v) };
        // SAFETY: `len ≤ 8` writable floats at `dst` (caller contract).
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, len) };
    }

    /// `x[i] = exp(x[i])`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x` readable and writable for `len` floats.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_inplace(x: *mut f32, len: usize) {
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len.
            unsafe { _mm256_storeu_ps(x.add(i), exp8(_mm256_loadu_ps(x.add(i)))) };
            i += 8;
        }
        if i < len {
            // SAFETY: `len − i < 8` floats remain at `x + i`.
            unsafe { store_partial(x.add(i), len - i, exp8(load_partial(x.add(i), len - i, 0.0))) };
        }
    }

    /// The largest of `len` floats (`−∞` for none).
    ///
    /// # Safety
    /// The CPU must support AVX2; `x` readable for `len` floats.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn max(x: *const f32, len: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 2];
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: i + 16 <= len. `max(v, acc)` keeps `acc` for a NaN lane of `v`.
            unsafe {
                acc[0] = _mm256_max_ps(_mm256_loadu_ps(x.add(i)), acc[0]);
                acc[1] = _mm256_max_ps(_mm256_loadu_ps(x.add(i + 8)), acc[1]);
            }
            i += 16;
        }
        while i + 8 <= len {
            // SAFETY: i + 8 <= len.
            unsafe { acc[0] = _mm256_max_ps(_mm256_loadu_ps(x.add(i)), acc[0]) };
            i += 8;
        }
        if i < len {
            // SAFETY: `len − i < 8` floats remain at `x + i`.
            unsafe { acc[1] = _mm256_max_ps(load_partial(x.add(i), len - i, f32::NEG_INFINITY), acc[1]) };
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_max_ps(acc[0], acc[1])) };
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }

    /// `x[i] = exp((x[i] − max)·scale)`, returning the sum (eight lanes, then a fixed-order reduction).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x` readable and writable for `len` floats.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_exp(x: *mut f32, len: usize, max: f32, scale: f32) -> f32 {
        // SAFETY: the caller's contract, from the first element.
        unsafe { softmax_exp_from(x, len, max, scale, 0, _mm256_setzero_ps()) }
    }

    /// [`softmax_exp`] from element `i` on, its eight-lane sum continuing from `acc` (the sum of the eight
    /// lanes of elements `0..i`, `i` a multiple of 8).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x` readable and writable for `len` floats; `i ≤ len`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_exp_from(
        x: *mut f32,
        len: usize,
        max: f32,
        scale: f32,
        mut i: usize,
        mut acc: __m256,
    ) -> f32 {
        let (vm, vs) = (_mm256_set1_ps(max), _mm256_set1_ps(scale));
        while i + 8 <= len {
            // SAFETY: i + 8 <= len.
            unsafe {
                let e = exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), vm), vs));
                _mm256_storeu_ps(x.add(i), e);
                acc = _mm256_add_ps(acc, e);
            }
            i += 8;
        }
        if i < len {
            // SAFETY: `len − i < 8` floats remain at `x + i`; the padding lanes are −∞, whose exp is 0.
            unsafe {
                let v = load_partial(x.add(i), len - i, f32::NEG_INFINITY);
                let e = exp8(_mm256_mul_ps(_mm256_sub_ps(v, vm), vs));
                store_partial(x.add(i), len - i, e);
                acc = _mm256_add_ps(acc, e);
            }
        }
        hsum(acc)
    }

    /// `out = gate / (1 + exp(−gate)) · up`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn silu_mul8(g: __m256, u: __m256) -> __m256 {
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
    }

    /// `out[i] = gate[i] / (1 + exp(−gate[i])) · up[i]`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `gate` and `up` readable and `out` writable for `len` floats.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(gate: *const f32, up: *const f32, out: *mut f32, len: usize) {
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len.
            unsafe {
                _mm256_storeu_ps(out.add(i), silu_mul8(_mm256_loadu_ps(gate.add(i)), _mm256_loadu_ps(up.add(i))))
            };
            i += 8;
        }
        if i < len {
            // SAFETY: `len − i < 8` floats remain in each slice.
            unsafe {
                let (g, u) = (load_partial(gate.add(i), len - i, 0.0), load_partial(up.add(i), len - i, 0.0));
                store_partial(out.add(i), len - i, silu_mul8(g, u));
            }
        }
    }

    /// `dst[i]` = the f16 `src[i]` (raw bits) widened, eight at a time with F16C, the tail one at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; `src` readable and `dst` writable for `len` values.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn widen_f16(src: *const u16, dst: *mut f32, len: usize) {
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len.
            unsafe { _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(i).cast()))) };
            i += 8;
        }
        while i < len {
            // SAFETY: i < len.
            unsafe { *dst.add(i) = half::f16::from_bits(*src.add(i)).to_f32_const() };
            i += 1;
        }
    }

    /// `dst[i]` = `src[i]` rounded to f16 (raw bits, nearest even), eight at a time with F16C, the tail one
    /// at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; `src` readable and `dst` writable for `len` values.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn narrow_f16(src: *const f32, dst: *mut u16, len: usize) {
        let mut i = 0;
        while i + 8 <= len {
            // SAFETY: i + 8 <= len.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
                _mm_storeu_si128(dst.add(i).cast(), h);
            }
            i += 8;
        }
        while i < len {
            // SAFETY: i < len.
            unsafe { *dst.add(i) = half::f16::from_f32(*src.add(i)).to_bits() };
            i += 1;
        }
    }

    /// One `R × 8W` tile of C: `R` rows of A against `8W` columns of B, accumulated over `k` in registers
    /// (starting from C's values with `ADD`, from zero without).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `a[r·a_row + p·a_col]` readable for `r < R`, `p < k`; `b[p·ldb
    /// + j]` readable and `c[r·ldc + j]` readable and writable for `j < 8W`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const W: usize, const ADD: bool>(
        k: usize,
        a: *const f32,
        a_row: usize,
        a_col: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); W]; R];
        if ADD {
            for (r, row) in acc.iter_mut().enumerate() {
                for (w, v) in row.iter_mut().enumerate() {
                    // SAFETY: r < R, 8w + 8 <= 8W: C's tile is readable (caller contract).
                    *v = unsafe { _mm256_loadu_ps(c.add(r * ldc + 8 * w)) };
                }
            }
        }
        for p in 0..k {
            // SAFETY: p < k, so row p of B has 8W readable floats from `b` (caller contract).
            let bv: [__m256; W] = std::array::from_fn(|w| unsafe { _mm256_loadu_ps(b.add(p * ldb + 8 * w)) });
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: r < R and p < k (caller contract).
                let av = _mm256_set1_ps(unsafe { *a.add(r * a_row + p * a_col) });
                for (w, v) in row.iter_mut().enumerate() {
                    *v = _mm256_fmadd_ps(av, bv[w], *v);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (w, v) in row.iter().enumerate() {
                // SAFETY: r < R, 8w + 8 <= 8W (caller contract).
                unsafe { _mm256_storeu_ps(c.add(r * ldc + 8 * w), *v) };
            }
        }
    }

    /// Up to six rows of A against every column of B: tiles of 16 and 8 columns, then single columns.
    ///
    /// # Safety
    /// As [`gemm`], for `R` rows.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows<const R: usize, const ADD: bool>(
        n: usize,
        k: usize,
        a: *const f32,
        a_row: usize,
        a_col: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        let mut j = 0;
        while j + 16 <= n {
            // SAFETY: columns j..j + 16 are within n (the caller's bounds cover every j < n).
            unsafe { tile::<R, 2, ADD>(k, a, a_row, a_col, b.add(j), ldb, c.add(j), ldc) };
            j += 16;
        }
        if j + 8 <= n {
            // SAFETY: columns j..j + 8 are within n.
            unsafe { tile::<R, 1, ADD>(k, a, a_row, a_col, b.add(j), ldb, c.add(j), ldc) };
            j += 8;
        }
        while j < n {
            for r in 0..R {
                // SAFETY: r < R, j < n: C is readable there (caller contract).
                let mut s = if ADD { unsafe { *c.add(r * ldc + j) } } else { 0.0f32 };
                for p in 0..k {
                    // SAFETY: r < R, p < k, j < n: in bounds by the caller's contract.
                    unsafe { s = (*a.add(r * a_row + p * a_col)).mul_add(*b.add(p * ldb + j), s) };
                }
                // SAFETY: r < R, j < n.
                unsafe { *c.add(r * ldc + j) = s };
            }
            j += 1;
        }
    }

    /// `c[i·ldc + j] = Σ_p a[i·a_row + p·a_col]·b[p·ldb + j]` (with `ADD`, `c[i·ldc + j] + Σ…`, the FMA
    /// chains continuing from C), six rows at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `m, n, k ≥ 1`; `a` readable at every `i·a_row + p·a_col`, `b` at
    /// every `p·ldb + j` and `c` writable (and with `ADD` readable) at every `i·ldc + j` (i < m, j < n,
    /// p < k).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm<const ADD: bool>(
        m: usize,
        n: usize,
        k: usize,
        a: *const f32,
        a_row: usize,
        a_col: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        // SAFETY: the caller's contract is `rows`' for every block of up to six rows.
        unsafe { in_six_row_blocks!(rows, [ADD], m, n, k, a, a_row, a_col, b, ldb, c, ldc) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 GEMM and softmax numerator, each to the AVX2 variant's bits. The GEMM is
    //! [`super::avx2`]'s with 16 columns per register: each output is the same FMA chain over `p` in order.
    //! B is f32, or f16 (`F16`) widened in registers as it is loaded: `vcvtph2ps` is exact, so the chains,
    //! and the bits, are those against the widened values. Callers hold an [`Avx512`](crate::isa::Avx512)
    //! token.

    use std::arch::x86_64::*;

    use super::{EXP_MAX, EXP_MIN, LN2_HI, LN2_LO, LOG2E, P0, P1, P2, P3, P4, P5, ROUND};

    /// `exp` of sixteen lanes: [`super::avx2`]'s eight-lane `exp` instruction for instruction (the same
    /// clamp, fused multiply-adds, rounding, exponent field and fix-ups, as masks), so every lane gets the
    /// bits the AVX2 variant gives it.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let xc = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(EXP_MAX)), _mm512_set1_ps(EXP_MIN));
        let round = _mm512_set1_ps(ROUND);
        let n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(LOG2E), round), round);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_fmadd_ps(_mm512_set1_ps(P0), r, _mm512_set1_ps(P1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
        let e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
        let pow = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
        let y = _mm512_mul_ps(e, _mm512_castsi512_ps(pow));
        // Ordered, non-signalling compares: false for NaN lanes.
        let y = _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_MIN)), y);
        let y = _mm512_mask_mov_ps(
            y,
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_MAX)),
            _mm512_set1_ps(f32::INFINITY),
        );
        _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x)
    }

    /// [`super::avx2::softmax_exp`] sixteen values at a time, to its bits: each lane's `exp` is the AVX2
    /// one's ([`exp16`]), and the eight-lane sum takes each vector's low half, then its high half, the
    /// order in which the AVX2 loop adds the same values. The last fewer than sixteen go to the AVX2 loop,
    /// its sum continuing.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; `x` readable and writable for `len` floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn softmax_exp(x: *mut f32, len: usize, max: f32, scale: f32) -> f32 {
        let (vm, vs) = (_mm512_set1_ps(max), _mm512_set1_ps(scale));
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: i + 16 <= len.
            unsafe {
                let e = exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), vm), vs));
                _mm512_storeu_ps(x.add(i), e);
                acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
                acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))));
            }
            i += 16;
        }
        // SAFETY: the caller's contract; i ≤ len is a multiple of 8.
        unsafe { super::avx2::softmax_exp_from(x, len, max, scale, i, acc) }
    }

    /// [`super::avx2::silu_mul`] sixteen values at a time, to its bits: each lane's operations are the
    /// AVX2 one's (the `exp` of [`exp16`], then the same division and multiply). The last fewer than
    /// sixteen go to the AVX2 loop.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; `gate` and `up` readable and `out` writable for `len`
    /// floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn silu_mul(gate: *const f32, up: *const f32, out: *mut f32, len: usize) {
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: i + 16 <= len.
            unsafe {
                let (g, u) = (_mm512_loadu_ps(gate.add(i)), _mm512_loadu_ps(up.add(i)));
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
                _mm512_storeu_ps(out.add(i), _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0), e)), u));
            }
            i += 16;
        }
        // SAFETY: the caller's contract, from element i ≤ len on.
        unsafe { super::avx2::silu_mul(gate.add(i), up.add(i), out.add(i), len - i) }
    }

    /// `dst[i]` = the f16 `src[i]` (raw bits) widened, sixteen at a time, the tail one at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `src` readable and `dst` writable for `len` values.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn widen_f16(src: *const u16, dst: *mut f32, len: usize) {
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: i + 16 <= len.
            unsafe { _mm512_storeu_ps(dst.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i).cast()))) };
            i += 16;
        }
        while i < len {
            // SAFETY: i < len.
            unsafe { *dst.add(i) = half::f16::from_bits(*src.add(i)).to_f32_const() };
            i += 1;
        }
    }

    /// `dst[i]` = `src[i]` rounded to f16 (raw bits, nearest even), sixteen at a time, the tail one at a
    /// time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `src` readable and `dst` writable for `len` values.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn narrow_f16(src: *const f32, dst: *mut u16, len: usize) {
        let mut i = 0;
        while i + 16 <= len {
            // SAFETY: i + 16 <= len.
            unsafe {
                let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(src.add(i)));
                _mm256_storeu_si256(dst.add(i).cast(), h);
            }
            i += 16;
        }
        while i < len {
            // SAFETY: i < len.
            unsafe { *dst.add(i) = half::f16::from_f32(*src.add(i)).to_bits() };
            i += 1;
        }
    }

    /// B's element `i` counted from `b`: an f16 (raw bits) with `F16`, else an f32.
    #[inline]
    fn b_at<const F16: bool>(b: *const u8, i: usize) -> *const u8 {
        b.wrapping_add(i * if F16 { 2 } else { 4 })
    }

    /// Sixteen values of B at `b`, as f32: loaded, or with `F16` widened from f16.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `b` readable for sixteen elements of B's type.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_b<const F16: bool>(b: *const u8) -> __m512 {
        // SAFETY: the caller guarantees sixteen readable elements; both loads are unaligned.
        unsafe { if F16 { _mm512_cvtph_ps(_mm256_loadu_si256(b.cast())) } else { _mm512_loadu_ps(b.cast()) } }
    }

    /// Rows `0..R` of A against columns `0..16W` of B.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `a[r·a_row + p·a_col]` readable for `r < R`, `p < k`; `b[p·ldb + j]`
    /// (elements of B's type) readable and `c[r·ldc + j]` writable for `j < 16W`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const W: usize, const ADD: bool, const F16: bool>(
        k: usize,
        a: *const f32,
        a_row: usize,
        a_col: usize,
        b: *const u8,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); W]; R];
        if ADD {
            for (r, row) in acc.iter_mut().enumerate() {
                for (w, v) in row.iter_mut().enumerate() {
                    // SAFETY: r < R, 16w + 16 <= 16W: C's tile is readable (caller contract).
                    *v = unsafe { _mm512_loadu_ps(c.add(r * ldc + 16 * w)) };
                }
            }
        }
        for p in 0..k {
            let mut bv = [_mm512_setzero_ps(); W];
            for (w, v) in bv.iter_mut().enumerate() {
                // SAFETY: p < k, so row p of B has 16W readable elements from `b` (caller contract).
                *v = unsafe { load_b::<F16>(b_at::<F16>(b, p * ldb + 16 * w)) };
            }
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: r < R and p < k (caller contract).
                let av = _mm512_set1_ps(unsafe { *a.add(r * a_row + p * a_col) });
                for (w, v) in row.iter_mut().enumerate() {
                    *v = _mm512_fmadd_ps(av, bv[w], *v);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (w, v) in row.iter().enumerate() {
                // SAFETY: r < R, 16w + 16 <= 16W (caller contract).
                unsafe { _mm512_storeu_ps(c.add(r * ldc + 16 * w), *v) };
            }
        }
    }

    /// Up to six rows of A against every column of B: tiles of 64, 32 and 16 columns, the rest of f32 B
    /// on the AVX2 rows (8 columns, then single ones), of f16 B one column at a time (the same chains:
    /// an FMA per `p` in order).
    ///
    /// # Safety
    /// As [`gemm`], for `R` rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<const R: usize, const ADD: bool, const F16: bool>(
        n: usize,
        k: usize,
        a: *const f32,
        a_row: usize,
        a_col: usize,
        b: *const u8,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        let mut j = 0;
        while j + 64 <= n {
            // SAFETY: columns j..j + 64 are within n (the caller's bounds cover every j < n).
            unsafe { tile::<R, 4, ADD, F16>(k, a, a_row, a_col, b_at::<F16>(b, j), ldb, c.add(j), ldc) };
            j += 64;
        }
        if j + 32 <= n {
            // SAFETY: columns j..j + 32 are within n.
            unsafe { tile::<R, 2, ADD, F16>(k, a, a_row, a_col, b_at::<F16>(b, j), ldb, c.add(j), ldc) };
            j += 32;
        }
        if j + 16 <= n {
            // SAFETY: columns j..j + 16 are within n.
            unsafe { tile::<R, 1, ADD, F16>(k, a, a_row, a_col, b_at::<F16>(b, j), ldb, c.add(j), ldc) };
            j += 16;
        }
        if j < n && !F16 {
            // SAFETY: columns j..n are within the caller's bounds; AVX2 and FMA are enabled here; B is f32.
            unsafe {
                super::avx2::rows::<R, ADD>(n - j, k, a, a_row, a_col, b.cast::<f32>().add(j), ldb, c.add(j), ldc)
            };
            return;
        }
        while j < n {
            for r in 0..R {
                // SAFETY: r < R, j < n: C is readable there (caller contract).
                let mut s = if ADD { unsafe { *c.add(r * ldc + j) } } else { 0.0f32 };
                for p in 0..k {
                    // SAFETY: r < R, p < k, j < n: in bounds by the caller's contract; B is f16 here, and `b`
                    // (never offset by `b_at` on this path) is the caller's f16 pointer, so 2-aligned.
                    let bv = half::f16::from_bits(unsafe { *b.cast::<u16>().add(p * ldb + j) }).to_f32_const();
                    // SAFETY: as above.
                    s = unsafe { *a.add(r * a_row + p * a_col) }.mul_add(bv, s);
                }
                // SAFETY: r < R, j < n.
                unsafe { *c.add(r * ldc + j) = s };
            }
            j += 1;
        }
    }

    /// `c[i·ldc + j] = Σ_p a[i·a_row + p·a_col]·b[p·ldb + j]` (with `ADD`, continuing from C), six rows
    /// at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA; `m, n, k ≥ 1`; `a` readable at every
    /// `i·a_row + p·a_col`, `b` at every element `p·ldb + j` (f16 with `F16`, else f32) and `c` writable
    /// (and with `ADD` readable) at every `i·ldc + j` (i < m, j < n, p < k).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm<const ADD: bool, const F16: bool>(
        m: usize,
        n: usize,
        k: usize,
        a: *const f32,
        a_row: usize,
        a_col: usize,
        b: *const u8,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        // SAFETY: the caller's contract is `rows`' for every block of up to six rows.
        unsafe { in_six_row_blocks!(rows, [ADD, F16], m, n, k, a, a_row, a_col, b, ldb, c, ldc) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::IsaLevel;

    #[test]
    fn dot_and_axpy_match_plain_loops_on_every_length() {
        let ops = [VectorOps::new(), VectorOps { tok: None, wide: None, f16c: false }];
        for len in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 100] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            let mag: f64 = a.iter().zip(&b).map(|(x, y)| f64::from((x * y).abs())).sum();
            for op in &ops {
                let got = f64::from(op.dot(&a, &b));
                assert!((got - want).abs() <= (len as f64 + 4.0) * crate::budget::U_F32 * mag, "len {len}");
                let mut y = b.clone();
                op.axpy(0.5, &a, &mut y);
                for i in 0..len {
                    assert!((y[i] - (b[i] + 0.5 * a[i])).abs() <= 2.0 * f32::EPSILON * (b[i].abs() + a[i].abs()));
                }
            }
        }
    }

    /// `dots` gives every key the bits `dot` gives it, for head sizes with and without whole vectors and
    /// tails, key counts around the eight-key blocks, and strides wider than the head.
    #[test]
    fn dots_are_bit_for_bit_dot_per_key() {
        let ops = [VectorOps::new(), VectorOps { tok: None, wide: None, f16c: false }];
        for len in [1usize, 7, 8, 13, 32, 64, 70, 128] {
            for n in [0usize, 1, 7, 8, 9, 16, 23] {
                let stride = len + 5;
                let q: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
                let keys: Vec<f32> = (0..n * stride + len).map(|i| (i as f32 * 0.113).cos() * 1.7).collect();
                for op in &ops {
                    let mut out = vec![f32::NAN; n];
                    op.dots(&q, &keys, stride, &mut out);
                    for (j, o) in out.iter().enumerate() {
                        let want = op.dot(&q, &keys[j * stride..j * stride + len]);
                        assert_eq!(o.to_bits(), want.to_bits(), "len {len} n {n} key {j}");
                    }
                }
            }
        }
    }

    /// The AVX-512 softmax numerator gives every value and the sum the AVX2 variant's bits: lengths around
    /// the 16- and 8-value vectors and the partial tail, long rows, masked (−∞) scores, a NaN score, the
    /// edges of `exp`'s range (`EXP_MIN`, `EXP_MAX` and the floats either side, ±∞), and maxima and scales
    /// beyond what attention passes (the row's least value, ±∞, NaN; a zero or negative scale, for which the
    /// −∞ padding of a partial tail gives NaN lanes that both variants must add alike).
    #[test]
    fn softmax_exp_on_avx512_gives_the_avx2_bits() {
        let caps = IsaCaps::process();
        let (wide, narrow) = (VectorOps::new(), VectorOps::with_caps(&caps.with_max_level(IsaLevel::Avx2)));
        if wide.wide.is_none() || narrow.tok.is_none() {
            let msg = "softmax_exp_on_avx512: SKIPPED (no AVX-512 in this process: the CPU, or INT4_ISA, caps it)";
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            return eprintln!("{msg}");
        }
        assert!(narrow.wide.is_none(), "the AVX2 cap leaves AVX-512 off");
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let check = |x: &[f32], max: f32, scale: f32, what: &str| {
            let (mut a, mut b) = (x.to_vec(), x.to_vec());
            let (sa, sb) = (wide.softmax_exp(&mut a, max, scale), narrow.softmax_exp(&mut b, max, scale));
            let len = x.len();
            assert_eq!(bits(&a), bits(&b), "values, len {len}, {what}, max {max}, scale {scale}");
            assert_eq!(sa.to_bits(), sb.to_bits(), "sum, len {len}, {what}, max {max}, scale {scale}");
        };
        // With max 0 and scale 1 each argument is its value: `exp`'s clamps, flush to 0 and overflow to ∞.
        let below = |v: f32| f32::from_bits(v.to_bits() + 1); // one float further from zero, for v < 0
        let above = |v: f32| f32::from_bits(v.to_bits() + 1); // one float further from zero, for v > 0
        let edges = [EXP_MIN, below(EXP_MIN), EXP_MAX, above(EXP_MAX), f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for n in [4, edges.len()] {
            // The first four are finite (a finite sum); the rest add ±∞ and NaN.
            let row: Vec<f32> = (0..37).map(|i| edges[i % n]).collect();
            for len in [7usize, 8, 16, 23, 37] {
                check(&row[..len], 0.0, 1.0, "exp's edges");
            }
        }
        let lens = (0usize..=49).chain([63, 64, 65, 200, 513, 2457]);
        for len in lens {
            let base: Vec<f32> = (0..len).map(|i| ((i * 7919 % 1009) as f32 - 500.0) * 0.37).collect();
            let mut masked = base.clone();
            for i in (3..len).step_by(5) {
                masked[i] = f32::NEG_INFINITY;
            }
            let mut nan = base.clone();
            if len > 0 {
                nan[len / 2] = f32::NAN;
            }
            for (x, what) in [(&base, "plain"), (&masked, "masked"), (&nan, "a NaN")] {
                let max = narrow.max(x);
                // 0.125: SmolLM2's 1/√64; 2.0 and 40.0 push most arguments below `exp`'s range.
                for scale in [0.125f32, 2.0, 40.0, 0.0, -1.0] {
                    check(x, max, scale, what);
                }
                let least = x.iter().copied().fold(f32::INFINITY, f32::min);
                for max in [least, f32::NEG_INFINITY, f32::INFINITY, f32::NAN] {
                    check(x, max, 0.125, what);
                }
            }
        }
    }

    /// SiLU·up on AVX-512 gives the AVX2 bits on every length around the vector widths (tails in both
    /// loops), and at `exp`'s edges, infinities and NaN.
    #[test]
    fn silu_mul_on_avx512_gives_the_avx2_bits() {
        let caps = IsaCaps::process();
        let (wide, narrow) = (VectorOps::new(), VectorOps::with_caps(&caps.with_max_level(IsaLevel::Avx2)));
        if wide.wide.is_none() || narrow.tok.is_none() {
            let msg = "silu_mul_on_avx512: SKIPPED (no AVX-512 in this process: the CPU, or INT4_ISA, caps it)";
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            return eprintln!("{msg}");
        }
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let edges = [-EXP_MIN, -EXP_MAX, EXP_MIN, EXP_MAX, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for len in (0usize..=49).chain([63, 64, 65, 1536, 1537]) {
            let gate: Vec<f32> =
                (0..len)
                    .map(|i| {
                        if i % 11 == 5 {
                            edges[i / 11 % edges.len()]
                        } else {
                            ((i * 7919 % 1009) as f32 - 500.0) * 0.037
                        }
                    })
                    .collect();
            let up: Vec<f32> = (0..len).map(|i| ((i * 104_729 % 613) as f32 - 300.0) * 0.011).collect();
            let (mut a, mut b) = (vec![f32::NAN; len], vec![0.0; len]);
            wide.silu_mul(&gate, &up, &mut a);
            narrow.silu_mul(&gate, &up, &mut b);
            assert_eq!(bits(&a), bits(&b), "len {len}");
            // Against the portable rule, within exp's error: the vector paths compute what they should.
            for ((&g, &u), &got) in gate.iter().zip(&up).zip(&a) {
                let want = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u);
                assert_eq!(got.is_nan(), want.is_nan(), "len {len}: silu({g})·{u} = {got}, want {want}");
                if want.is_infinite() {
                    assert_eq!(f64::from(got), want, "len {len}: silu({g})·{u}");
                } else if want.is_finite() {
                    // exp's 2 ulp, and a rounding each for the sum, the division and the product.
                    assert!(
                        (f64::from(got) - want).abs() <= 1e-6 * want.abs() + 1e-37,
                        "len {len}: silu({g})·{u} = {got}, want {want}"
                    );
                }
            }
        }
    }

    /// `gemm_f16` gives every output the bits `gemm` gives against B widened, on every variant this CPU
    /// runs (AVX-512 widening in registers; AVX2 with F16C and portable widening blocks), for row counts
    /// around the six-row blocks, column counts with and without whole 64/32/16-column tiles and with
    /// tails, depths around the widening block, strides wider than the rows and A read transposed.
    #[test]
    fn gemm_against_f16_b_is_bit_for_bit_gemm_against_the_widened_b() {
        let caps = IsaCaps::process();
        let f16c = VectorOps::with_caps(&caps.with_max_level(crate::isa::IsaLevel::Avx2));
        let ops = [VectorOps::new(), f16c, VectorOps { tok: None, wide: None, f16c: false }];
        if ops[0].wide.is_none() {
            let msg = "gemm_against_f16_b: SKIPPED the AVX-512 variant (no AVX-512 here)";
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            eprintln!("{msg}");
        }
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        // n: a scalar tail alone, 8-column tails, the 16-, 32- and 64-column tiles, and 121 = 64 + 32 + 16 +
        // 8 + 1 for all of them at once.
        for m in [1usize, 2, 4, 6, 7] {
            for n in [1usize, 5, 24, 48, 64, 121] {
                for k in [0usize, 1, 3, GEMM_F16_WIDEN_ROWS - 1, GEMM_F16_WIDEN_ROWS, GEMM_F16_WIDEN_ROWS + 1, 600] {
                    let (ldb, ldc) = (n + 3, n + 1);
                    let b: Vec<f16> = (0..k * ldb + n).map(|i| f16::from_f32((i as f32 * 0.113).cos() * 1.7)).collect();
                    let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
                    let a: Vec<f32> = (0..m * k.max(1)).map(|i| (i as f32 * 0.37).sin()).collect();
                    // A as rows (`a_row` = k) and transposed (`a_col` = m).
                    for (a_row, a_col) in [(k.max(1), 1), (1, m)] {
                        for op in &ops {
                            let mut want = vec![f32::NAN; m * ldc];
                            op.gemm((m, n, k), &a, a_row, a_col, &wide, ldb, &mut want, ldc);
                            let mut got = vec![f32::NAN; m * ldc];
                            op.gemm_f16((m, n, k), &a, a_row, a_col, &b, ldb, &mut got, ldc);
                            for i in 0..m {
                                let row = i * ldc..i * ldc + n;
                                assert_eq!(
                                    bits(&got[row.clone()]),
                                    bits(&want[row]),
                                    "m {m} n {n} k {k} a_row {a_row} {op:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// `dots_heads_f16` gives every head and key the bits `dots_heads` gives against the same keys
    /// widened, on every variant this CPU runs (AVX-512 with F16C, AVX2 with F16C, portable), for head
    /// sizes with and without whole 32-value steps, eight-value steps and scalar tails, key counts around
    /// the eight-key blocks, and one to six heads (AVX-512 widens each key once for up to four, and holds the
    /// queries of a group of up to three heads of 64 values or two of 128 in registers).
    #[test]
    fn dots_heads_against_f16_keys_are_bit_for_bit_against_the_widened_keys() {
        let caps = IsaCaps::process();
        let f16c = VectorOps::with_caps(&caps.with_max_level(crate::isa::IsaLevel::Avx2));
        let ops = [VectorOps::new(), f16c, VectorOps { tok: None, wide: None, f16c: false }];
        if !ops[0].f16c {
            let msg = "dots_heads_against_f16_keys: SKIPPED the SIMD variants (no F16C here)";
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            eprintln!("{msg}");
        } else if ops[0].wide.is_none() {
            eprintln!("dots_heads_against_f16_keys: SKIPPED the AVX-512 variant (no AVX-512 here)");
        }
        for len in [1usize, 7, 8, 13, 16, 24, 32, 40, 64, 70, 128] {
            for n in [0usize, 1, 7, 8, 9, 16, 23] {
                for heads in 1..=6 {
                    let stride = heads * len + 3;
                    let qs: Vec<f32> = (0..heads * len).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
                    let keys: Vec<f16> =
                        (0..n * stride + len).map(|i| f16::from_f32((i as f32 * 0.113).cos() * 1.7)).collect();
                    let wide: Vec<f32> = keys.iter().map(|k| k.to_f32()).collect();
                    for op in &ops {
                        let mut want = vec![f32::NAN; heads * n];
                        op.dots_heads(&qs, heads, &wide, stride, &mut want);
                        let mut out = vec![f32::NAN; heads * n];
                        op.dots_heads_f16(&qs, heads, &keys, stride, &mut out);
                        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&out), bits(&want), "len {len} n {n} heads {heads} {op:?}");
                    }
                }
            }
        }
    }

    /// `dots_heads` gives every head and key the bits `dot` gives them, on every variant this CPU runs
    /// (AVX-512, AVX2 alone, portable), for head sizes with and without whole 32-float steps and tails,
    /// key counts around the eight-key blocks, and one to four heads.
    #[test]
    fn dots_heads_are_bit_for_bit_dot_per_head_and_key() {
        let caps = IsaCaps::process();
        let ops = [
            VectorOps::new(),
            VectorOps { tok: Avx2Fma::with_caps(caps), wide: None, f16c: false },
            VectorOps { tok: None, wide: None, f16c: false },
        ];
        for len in [1usize, 7, 8, 13, 16, 24, 32, 40, 64, 70, 128] {
            for n in [0usize, 1, 7, 8, 9, 16, 23] {
                for heads in 1..=4 {
                    let stride = heads * len + 3;
                    let qs: Vec<f32> = (0..heads * len).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
                    let keys: Vec<f32> = (0..n * stride + len).map(|i| (i as f32 * 0.113).cos() * 1.7).collect();
                    for op in &ops {
                        let mut out = vec![f32::NAN; heads * n];
                        op.dots_heads(&qs, heads, &keys, stride, &mut out);
                        for (i, o) in out.iter().enumerate() {
                            let (h, j) = (i / n, i % n);
                            let want = op.dot(&qs[h * len..(h + 1) * len], &keys[j * stride..j * stride + len]);
                            assert_eq!(o.to_bits(), want.to_bits(), "len {len} n {n} heads {heads} head {h} key {j}");
                        }
                    }
                }
            }
        }
    }

    /// `gemm_add` over pieces of `k`, added in order, is bit for bit one `gemm` over the whole of `k`, on
    /// every variant this CPU runs, for row counts around the six-row blocks and column counts that reach
    /// every tile width and the single-column tail.
    #[test]
    fn gemm_added_in_pieces_of_k_is_one_gemm() {
        let caps = IsaCaps::process();
        let ops = [
            VectorOps::new(),
            VectorOps { tok: Avx2Fma::with_caps(caps), wide: None, f16c: false },
            VectorOps { tok: None, wide: None, f16c: false },
        ];
        for (m, n, k) in [(1usize, 64usize, 300usize), (3, 64, 257), (7, 95, 40), (2, 13, 9), (6, 120, 33)] {
            let (a_row, ldb, ldc) = (k + 2, n + 5, n + 1);
            let a: Vec<f32> = (0..m * a_row).map(|i| (i as f32 * 0.29).sin()).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| (i as f32 * 0.071).cos() * 2.3).collect();
            for op in &ops {
                let mut want = vec![f32::NAN; m * ldc];
                op.gemm((m, n, k), &a, a_row, 1, &b, ldb, &mut want, ldc);
                let mut got = vec![0.0f32; m * ldc];
                for (p0, p1) in [(0, k / 3), (k / 3, k / 3), (k / 3, k - 5), (k - 5, k)] {
                    op.gemm_add((m, n, p1 - p0), &a[p0..], a_row, 1, &b[p0 * ldb..], ldb, &mut got, ldc);
                }
                for i in 0..m {
                    for j in 0..n {
                        let (g, w) = (got[i * ldc + j], want[i * ldc + j]);
                        assert_eq!(g.to_bits(), w.to_bits(), "m {m} n {n} k {k}: c[{i}][{j}] {g} against {w}");
                    }
                }
            }
        }
    }

    /// Every f16 bit pattern widens to the value `half` gives it (a NaN to a NaN) on every variant this
    /// CPU runs, at lengths that leave tails of each width.
    #[test]
    fn widen_f16_is_exact_for_every_bit_pattern() {
        let caps = IsaCaps::process();
        let f16c = VectorOps::with_caps(&caps.with_max_level(crate::isa::IsaLevel::Avx2));
        let ops = [VectorOps::new(), f16c, VectorOps { tok: None, wide: None, f16c: false }];
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for op in &ops {
            for len in [all.len(), 1, 7, 8, 15, 17, 33] {
                let src = &all[all.len() - len..];
                let mut dst = vec![0.5f32; len];
                op.widen_f16(src, &mut dst);
                for (s, d) in src.iter().zip(&dst) {
                    let want = s.to_f32_const();
                    assert!(
                        d.to_bits() == want.to_bits() || (d.is_nan() && want.is_nan()),
                        "{op:?}: {:#06x} widened to {d} ({:#010x}), want {want}",
                        s.to_bits(),
                        d.to_bits()
                    );
                }
            }
        }
    }

    /// Values round to f16 as `half` rounds them (a NaN to a NaN) on every variant this CPU runs: every
    /// f16 value, every midpoint between neighbours (ties to even) and the values either side of it,
    /// around the largest finite f16 (65504, and 65520, the tie to infinity), f32 subnormals, infinities,
    /// and f32 bit patterns spread over the whole range, at lengths that leave tails of each width.
    #[test]
    fn narrow_f16_rounds_as_half_does() {
        let caps = IsaCaps::process();
        let f16c = VectorOps::with_caps(&caps.with_max_level(crate::isa::IsaLevel::Avx2));
        let ops = [VectorOps::new(), f16c, VectorOps { tok: None, wide: None, f16c: false }];
        if !ops[0].f16c {
            let msg = "narrow_f16_rounds_as_half_does: SKIPPED the SIMD variants (no F16C here)";
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{msg}");
            eprintln!("{msg}");
        } else if ops[0].wide.is_none() {
            eprintln!("narrow_f16_rounds_as_half_does: SKIPPED the AVX-512 variant (no AVX-512 here)");
        }
        let mut values: Vec<f32> = Vec::new();
        for bits in 0..=u16::MAX {
            let (a, b) = (f16::from_bits(bits).to_f32(), f16::from_bits(bits.wrapping_add(1)).to_f32());
            values.push(a);
            if a.is_finite() && b.is_finite() && (a < 0.0) == (b < 0.0) {
                let mid = a + (b - a) / 2.0;
                values.extend([mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)]);
            }
        }
        values.extend([65504.0, 65519.0, 65520.0, 65521.0, 1e6, -65520.0, f32::INFINITY, f32::NEG_INFINITY]);
        values.extend([f32::from_bits(1), -f32::from_bits(1), f32::MIN_POSITIVE, f32::NAN, -f32::NAN]);
        values.extend((0..65_536u32).map(|i| f32::from_bits(i.wrapping_mul(65_537).wrapping_add(12_345))));
        for op in &ops {
            for len in [values.len(), 1, 7, 8, 15, 17, 33] {
                let src = &values[values.len() - len..];
                let mut dst = vec![f16::ONE; len];
                op.narrow_f16(src, &mut dst);
                for (s, d) in src.iter().zip(&dst) {
                    let want = f16::from_f32(*s);
                    assert!(
                        d.to_bits() == want.to_bits() || (d.is_nan() && want.is_nan()),
                        "{op:?}: {s:e} ({:#010x}) narrowed to {:#06x}, want {:#06x}",
                        s.to_bits(),
                        d.to_bits(),
                        want.to_bits()
                    );
                }
            }
        }
    }

    #[test]
    fn with_caps_portable_is_portable() {
        let caps = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
        assert!(!VectorOps::with_caps(&caps).is_avx2());
    }
}
