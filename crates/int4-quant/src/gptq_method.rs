//! GPTQ (Frantar et al., 2022): 4-bit quantization with second-order error compensation, for
//! `int4 quantize --method gptq`.
//!
//! Why: round to nearest (RTN) minimises each weight's own error, `‖W − Ŵ‖²`, but what a layer's
//! output suffers is `‖(W − Ŵ)X‖² = tr((W − Ŵ) H (W − Ŵ)ᵀ)` with `H = Σ xᵀx` over the layer's inputs.
//! When inputs are correlated (they always are in a transformer), the error of a column already
//! quantized can be compensated by nudging the columns not yet quantized. GPTQ does exactly that, one
//! input column `j` at a time, with the upper Cholesky factor `U` of `H⁻¹` (`H⁻¹ = UᵀU`):
//!
//! ```text
//! q_j  = quant(w_j)                        (codes against the group's parameters as stored)
//! e_j  = (w_j − dequant(q_j)) / U[j][j]
//! w_c -= e_j · U[j][c]        for c > j    (every row independently)
//! ```
//!
//! Each output row is solved independently of the others (the update only mixes columns of one row), so
//! rows run in parallel in fixed chunks and the result is bit-identical for any thread count. Columns are
//! processed in blocks of [`BLOCK`]: updates inside the block are applied at once, updates to the columns
//! after it are batched per block ("lazy batch", so each row of `U` is read once per chunk of rows), but
//! applied one source column at a time in column order, so every weight sees the same floating-point
//! operations in the same order as the plain column-by-column algorithm (the tests hold it to that).
//!
//! **Grids and stored scales.** Group parameters are chosen by the same grid as RTN
//! ([`int4_layout::grid::GroupGrid`], with the same scale search and the same rounding of stored scales and
//! zeros, [`int4_layout::grid::ParamPrecision`]) from the current, error-updated weights of the group when
//! its first column comes up; each later column's code is chosen against those parameters with the grid's
//! own rounding. So with
//! `H = I` (no correlations) GPTQ gives RTN's codes exactly. Groups of 32, 64 and 128 lie inside one block;
//! 256 and per-row groups start at a block boundary, where every earlier update has been applied.
//!
//! **Dampening and dead inputs.** `H + λI` with `λ = damp · mean(diag H)` (1% by default) keeps the
//! Cholesky factorisations well conditioned; an input channel that never fired (`H_ii = 0`) gets
//! `H_ii = 1` and its weights are set to 0 before quantization (they never affect the output).
//!
//! **No act-order.** Columns go in their natural order (`desc_act: false`, which the writers emit).
//!
//! **Calibration** (`calibrate`) is sequential: decoder layer `l` is quantized before the inputs of
//! layer `l + 1` are collected, through the already quantized layers, as in the paper. The model runs on
//! its f32 path through [`Model::forward_observed`], which keeps each sequence's residual stream between
//! layers, so each step runs one decoder layer (twice: once to collect the Hessians from the unquantized
//! layer, once with its quantized weights to move the stream on). Within a decoder layer the four linears
//! (`qkv`, `o_proj`, `gate_up`, `down`) take their Hessians from the same pass over the unquantized layer
//! (GPTQ's original, not "true-sequential", order). Layers sharing an input (q/k/v, gate/up) share one `H`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use int4_kernels::dense::{DenseLinear, DenseWeights};
use int4_kernels::isa::IsaCaps;
use int4_layout::grid::{self, GroupGrid};
pub use int4_layout::grid::{GridKind, GridSpec, QuantMatrix};
use int4_layout::{Codes, GroupParams, LayoutError};
use rayon::prelude::*;
use serde::Serialize;

use int4::{Checkpoint, ForwardObserver, LayerFlow, LinearSlot, Model, ModelConfig, Numerics, TextCodec, linear_specs};

/// Columns per block of the solver.
pub const BLOCK: usize = 128;

/// Rows per parallel task of the solver (each task reads `U` once per block for all of its rows).
const ROW_CHUNK: usize = 16;

/// Why GPTQ could not run: what went wrong is its [`kind`](GptqError::kind).
#[derive(Debug)]
pub struct GptqError {
    kind: GptqErrorKind,
}

/// What kept GPTQ from running.
#[derive(Debug)]
#[non_exhaustive]
pub enum GptqErrorKind {
    /// `--method gptq` without calibration text.
    NoCalibration,
    /// The calibration path does not exist or cannot be read (or a file of it is not UTF-8).
    CalibrationUnreadable {
        /// The file or directory.
        path: PathBuf,
        /// The error reading it.
        source: std::io::Error,
    },
    /// A calibration file that is not a regular file, is larger than [`crate::eval::TEXT_CAP`], or is not
    /// UTF-8.
    CalibrationFile(int4_files::FileError),
    /// The calibration text is empty (no `.txt` files in a directory, or no tokens).
    CalibrationEmpty {
        /// The path.
        path: PathBuf,
        /// What was empty.
        message: String,
    },
    /// An option out of range (`damp`, sequence length).
    Options(String),
    /// A Hessian with a NaN or infinite entry (the model produced non-finite activations).
    NonFiniteHessian {
        /// The layer.
        layer: String,
        /// Row and column of the first bad entry.
        index: (usize, usize),
    },
    /// The dampened Hessian is not positive definite (raise `damp`).
    NotPositiveDefinite {
        /// The layer.
        layer: String,
        /// The dampening used.
        damp: f64,
    },
    /// The runtime failed: loading the tokenizer or tokenizing the calibration text, reading a target
    /// layer's weights from the checkpoint, or the calibration forward pass (the error names the file or
    /// tensor).
    Model(int4::Error),
    /// A grid refused a group.
    Layout {
        /// The layer.
        layer: String,
        /// The layout crate's error.
        source: LayoutError,
    },
}

impl GptqError {
    pub(crate) fn new(kind: GptqErrorKind) -> Self {
        GptqError { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &GptqErrorKind {
        &self.kind
    }

    /// The kind, taken out (for [`QuantizeError`](crate::QuantizeError)'s conversion).
    pub(crate) fn into_kind(self) -> GptqErrorKind {
        self.kind
    }
}

impl From<GptqErrorKind> for GptqError {
    fn from(kind: GptqErrorKind) -> Self {
        GptqError::new(kind)
    }
}

impl std::fmt::Display for GptqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            GptqErrorKind::NoCalibration => f.write_str(
                "--method gptq needs calibration text: pass --calib FILE (a text file, or a directory of .txt files)",
            ),
            GptqErrorKind::CalibrationUnreadable { path, source } => {
                write!(f, "calibration text {}: {source}", path.display())
            }
            GptqErrorKind::CalibrationFile(e) => write!(f, "calibration text {e}"),
            GptqErrorKind::CalibrationEmpty { path, message } => {
                write!(f, "calibration text {}: {message}; GPTQ needs some text to measure the inputs", path.display())
            }
            GptqErrorKind::Options(m) => f.write_str(m),
            GptqErrorKind::NonFiniteHessian { layer, index } => write!(
                f,
                "{layer}: the Hessian of its inputs has a NaN or infinite entry at {index:?} (the calibration forward \
                 pass overflowed)"
            ),
            GptqErrorKind::NotPositiveDefinite { layer, damp } => {
                write!(f, "{layer}: the dampened Hessian is not positive definite (damp {damp}); try a larger --damp")
            }
            GptqErrorKind::Model(e) => write!(f, "{e}"),
            GptqErrorKind::Layout { layer, source } => write!(f, "{layer}: {source}"),
        }
    }
}

impl std::error::Error for GptqError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            GptqErrorKind::CalibrationUnreadable { source, .. } => Some(source),
            GptqErrorKind::CalibrationFile(e) => Some(e),
            GptqErrorKind::Model(e) => Some(e),
            GptqErrorKind::Layout { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Round to nearest on the grid (the RTN writer's quantization): rows in parallel, in fixed blocks.
pub fn rtn(w: &[f32], n: usize, k: usize, grid: GridSpec) -> Result<QuantMatrix, LayoutError> {
    let rows = ((1 << 16) / k.max(1)).max(1);
    let parts = w
        .par_chunks(rows * k.max(1))
        .map(|c| grid::quantize(c, c.len() / k, k, grid))
        .collect::<Result<Vec<_>, LayoutError>>()?;
    debug_assert_eq!(parts.iter().map(QuantMatrix::n).sum::<usize>(), n);
    QuantMatrix::stack_rows(parts)
}

/// A Hessian `Σ xᵀx` (f64, `K × K`, full) over the rows seen.
#[derive(Clone, Debug)]
pub struct Hessian {
    /// Input channels.
    pub k: usize,
    /// `Σ xᵀx`, row-major.
    pub sum: Vec<f64>,
    /// Rows (tokens) added.
    pub rows: u64,
}

impl Hessian {
    /// An empty one.
    pub fn new(k: usize) -> Self {
        Hessian { k, sum: vec![0.0; k * k], rows: 0 }
    }

    /// Adds `m` rows `x` (`[m][k]`): `xᵀx` is computed in f32 by the dense GEMM kernel (rows of the
    /// transpose times each other; sums of at most `m` products) and added in f64.
    pub fn add(&mut self, x: &[f32], m: usize) {
        let k = self.k;
        if m == 0 || x.len() != m * k {
            return;
        }
        let mut xt = vec![0.0f32; k * m];
        for (i, row) in x.chunks_exact(k).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                xt[c * m + i] = v;
            }
        }
        let mut prod = vec![0.0f32; k * k];
        let dense = DenseLinear::new(k, m, DenseWeights::F32(xt.clone()), None);
        match dense.and_then(|d| d.forward(&xt, k, &mut prod)) {
            Ok(_) => {
                for (s, &p) in self.sum.iter_mut().zip(&prod) {
                    *s += f64::from(p);
                }
            }
            Err(_) => {
                // The kernel refuses only inconsistent lengths, which cannot happen here; fall back anyway.
                for row in x.chunks_exact(k) {
                    for (i, &a) in row.iter().enumerate() {
                        for (s, &b) in self.sum[i * k..(i + 1) * k].iter_mut().zip(row) {
                            *s += f64::from(a) * f64::from(b);
                        }
                    }
                }
            }
        }
        self.rows += m as u64;
    }

    /// `Σ xᵀx / rows`, symmetrised (the GEMM need not give `(i, j)` and `(j, i)` the same rounding).
    pub fn mean(&self) -> Vec<f64> {
        let k = self.k;
        let scale = 1.0 / (self.rows.max(1) as f64);
        let mut h = vec![0.0; k * k];
        for i in 0..k {
            for j in 0..k {
                h[i * k + j] = 0.5 * (self.sum[i * k + j] + self.sum[j * k + i]) * scale;
            }
        }
        h
    }
}

/// What the solver needs from a Hessian, computed once for every layer sharing it.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Input channels.
    pub k: usize,
    /// Upper Cholesky factor of `(H + λI)⁻¹` (dead channels set to 1 first), row-major, in f32.
    pub u: Vec<f32>,
    /// Input channels that never fired (`H_ii = 0`): their weights are zeroed.
    pub dead: Vec<bool>,
    /// `λ`.
    pub lambda: f64,
}

/// Dampens `h` (`K × K`, symmetric) and factors it: `U` upper with `(H + λI)⁻¹ = UᵀU`.
pub fn prepare(h: &[f64], k: usize, damp: f64, layer: &str) -> Result<Prepared, GptqError> {
    if h.len() != k * k {
        return Err(GptqErrorKind::Options(format!("{layer}: a Hessian of {} entries for K = {k}", h.len())).into());
    }
    if let Some(i) = h.iter().position(|v| !v.is_finite()) {
        return Err(GptqErrorKind::NonFiniteHessian { layer: layer.to_string(), index: (i / k, i % k) }.into());
    }
    let mut a = h.to_vec();
    let dead: Vec<bool> = (0..k).map(|i| a[i * k + i] == 0.0).collect();
    for (i, &d) in dead.iter().enumerate() {
        if d {
            a[i * k + i] = 1.0;
        }
    }
    let mean_diag = (0..k).map(|i| a[i * k + i]).sum::<f64>() / k as f64;
    let lambda = damp * mean_diag;
    for i in 0..k {
        a[i * k + i] += lambda;
    }
    let u = inverse_cholesky_upper(&a, k)
        .ok_or_else(|| GptqErrorKind::NotPositiveDefinite { layer: layer.to_string(), damp })?;
    Ok(Prepared { k, u: u.iter().map(|&v| v as f32).collect(), dead, lambda })
}

/// The upper triangular `U` with `A⁻¹ = UᵀU` for a symmetric positive definite `A` (`None` if it is not).
///
/// With `P` the reversal permutation, the lower Cholesky factor of `PAP = LLᵀ` gives `A = RRᵀ` with
/// `R = PLP` upper, so `A⁻¹ = R⁻ᵀR⁻¹` and `U = R⁻¹ = P L⁻¹ P`: one factorisation and one triangular
/// inverse (whose column chunks are independent, so they run in parallel), instead of inverting `A` and
/// factoring the inverse.
pub fn inverse_cholesky_upper(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let r = |i: usize| k - 1 - i;
    // L of PAP, row-major, lower, by right-looking elimination: after column j is divided out, every later
    // row is updated (rows in parallel; each entry sees the same operations in the same order for any
    // number of threads).
    let mut l = vec![0.0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            l[i * k + j] = a[r(i) * k + r(j)];
        }
    }
    let mut col = vec![0.0f64; k];
    for j in 0..k {
        let d = l[j * k + j];
        if !(d > 0.0 && d.is_finite()) {
            return None;
        }
        let d = d.sqrt();
        col[j] = d;
        l[j * k + j] = d;
        for i in j + 1..k {
            col[i] = l[i * k + j] / d;
            l[i * k + j] = col[i];
        }
        let col = &col;
        l.par_chunks_mut(k).enumerate().skip(j + 1).with_min_len(16).for_each(|(i, row)| {
            let ci = col[i];
            for (x, &c) in row[j + 1..=i].iter_mut().zip(&col[j + 1..=i]) {
                *x -= ci * c;
            }
        });
    }
    // L⁻¹ by forward substitution, in independent chunks of columns (in parallel): row i of a chunk is
    // `(e_i − Σ_{t<i} L[i][t]·row t) / L[i][i]`, rows of the chunk accumulated in order, so reading L row
    // by row (contiguous) and the chunk's rows from cache.
    const CW: usize = 64;
    let chunks: Vec<(usize, usize, Vec<f64>)> = (0..k.div_ceil(CW))
        .into_par_iter()
        .map(|b| {
            let (c0, c1) = (b * CW, ((b + 1) * CW).min(k));
            let w = c1 - c0;
            let mut x = vec![0.0f64; k * w];
            let mut acc = vec![0.0f64; w];
            for i in c0..k {
                acc.iter_mut().for_each(|v| *v = 0.0);
                for t in c0..i {
                    let lt = l[i * k + t];
                    for (a, &v) in acc.iter_mut().zip(&x[t * w..(t + 1) * w]) {
                        *a += lt * v;
                    }
                }
                let d = l[i * k + i];
                for (c, &a) in acc.iter().enumerate() {
                    let e = if c0 + c == i { 1.0 } else { 0.0 };
                    x[i * w + c] = (e - a) / d;
                }
            }
            (c0, w, x)
        })
        .collect();
    // U[i][j] = L⁻¹[r(i)][r(j)], nonzero for j ≥ i.
    let mut u = vec![0.0f64; k * k];
    for (c0, w, x) in &chunks {
        for i in 0..k {
            for c in 0..*w {
                if c0 + c <= i {
                    u[r(i) * k + r(c0 + c)] = x[i * w + c];
                }
            }
        }
    }
    if u.iter().any(|v| !v.is_finite()) {
        return None;
    }
    Some(u)
}

/// Quantizes `w` (`[N][K]`) with GPTQ on `grid`, given the prepared Hessian. Rows run in parallel in
/// fixed chunks; the result does not depend on the number of threads.
///
/// `layer` names the layer in errors.
pub fn solve(
    w: &[f32],
    n: usize,
    k: usize,
    prep: &Prepared,
    grid: GridSpec,
    layer: &str,
) -> Result<QuantMatrix, GptqError> {
    if k == 0 || prep.k != k || w.len() != n * k || prep.u.len() != k * k || prep.dead.len() != k {
        return Err(GptqErrorKind::Options(format!(
            "{layer}: {} weights and a Hessian for K = {} do not make an {n} x {k} layer",
            w.len(),
            prep.k
        ))
        .into());
    }
    let chunks = w
        .par_chunks(ROW_CHUNK * k)
        .map(|c| solve_rows(c, c.len() / k, k, prep, grid))
        .collect::<Result<Vec<_>, LayoutError>>()
        .and_then(QuantMatrix::stack_rows)
        .map_err(|source| GptqErrorKind::Layout { layer: layer.to_string(), source })?;
    Ok(chunks)
}

/// GPTQ over `rows` rows (a chunk of the layer).
fn solve_rows(w: &[f32], rows: usize, k: usize, prep: &Prepared, grid: GridSpec) -> Result<QuantMatrix, LayoutError> {
    let (g_len, groups) = (grid.group.len(k), grid.group.groups(k));
    let u = &prep.u;
    let mut w = w.to_vec();
    for row in w.chunks_exact_mut(k) {
        for (v, &d) in row.iter_mut().zip(&prep.dead) {
            if d {
                *v = 0.0;
            }
        }
    }
    let mut codes = vec![0u8; rows * k];
    let mut scales = vec![0.0f32; rows * groups];
    let mut zeros = vec![0.0f32; rows * groups];
    let mut zero_points = vec![0u8; rows * groups];
    let mut cur: Vec<Option<GroupGrid>> = vec![None; rows];
    let mut err = vec![0.0f32; rows * BLOCK];
    let (mut group_codes, mut trial) = (vec![0u8; g_len], Vec::with_capacity(g_len));
    let mut i1 = 0;
    while i1 < k {
        let i2 = (i1 + BLOCK).min(k);
        for j in i1..i2 {
            if j % g_len == 0 {
                // A new group: parameters from the current (error-updated) values of its columns. A group that
                // runs past this block starts at the block's first column (see the module docs), so all of
                // its columns are current here.
                let g = j / g_len;
                let gl = g_len.min(k - j);
                debug_assert!(j + gl <= i2 || j == i1, "a group starting inside a block must end in it");
                for r in 0..rows {
                    // The grid's own fit on the group's current values (its codes are chosen column by
                    // column below, against the error-updated values).
                    let ws = &w[r * k + j..r * k + j + gl];
                    let fit =
                        GroupGrid::fit(grid.kind, ws, grid.search, grid.precision, &mut group_codes[..gl], &mut trial);
                    cur[r] = Some(fit);
                    scales[r * groups + g] = fit.scale();
                    match fit.zero_point() {
                        Some(zp) => {
                            zero_points[r * groups + g] = zp;
                            zeros[r * groups + g] = int4_layout::convert::integer_zero_to_float(fit.scale(), zp);
                        }
                        None => zeros[r * groups + g] = fit.float_zero().unwrap_or(0.0),
                    }
                }
            }
            let d = u[j * k + j];
            let urow = &u[j * k + j + 1..j * k + i2];
            for r in 0..rows {
                let x = w[r * k + j];
                let fit = cur[r].expect("every column lies in a group whose grid was fitted at its first column");
                let q = fit.code(x);
                codes[r * k + j] = q;
                let e = (x - fit.decode(q)) / d;
                err[r * BLOCK + (j - i1)] = e;
                for (v, &uu) in w[r * k + j + 1..r * k + i2].iter_mut().zip(urow) {
                    *v -= e * uu;
                }
            }
        }
        // The block's errors into every later column, one source column at a time in order.
        if i2 < k {
            for jj in i1..i2 {
                let urow = &u[jj * k + i2..(jj + 1) * k];
                for r in 0..rows {
                    let e = err[r * BLOCK + (jj - i1)];
                    for (v, &uu) in w[r * k + i2..(r + 1) * k].iter_mut().zip(urow) {
                        *v -= e * uu;
                    }
                }
            }
        }
        i1 = i2;
    }
    Ok(QuantMatrix {
        codes: Codes::new(rows, k, codes)?,
        params: GroupParams::new(rows, k, grid.group, scales, zeros)?,
        zero_points: (grid.kind != GridKind::Asymmetric).then_some(zero_points),
    })
}

/// `tr(D H Dᵀ)` for `D = W − Ŵ` (or `W` itself with `q = None`) and `H` (`K × K`): the summed squared
/// output error over the calibration rows the Hessian came from. `D·H` runs on the dense GEMM kernel in
/// f32; each row's dot with `D` is summed in f64, rows in order.
pub fn output_energy(w: &[f32], q: Option<&QuantMatrix>, n: usize, k: usize, h: &[f64]) -> f64 {
    let d: Vec<f32> = match q {
        Some(q) => w.iter().enumerate().map(|(i, &v)| v - q.weight(i / k, i % k)).collect(),
        None => w.to_vec(),
    };
    let hf: Vec<f32> = h.iter().map(|&v| v as f32).collect();
    let mut y = vec![0.0f32; n * k];
    let ok = DenseLinear::new(k, k, DenseWeights::F32(hf), None).and_then(|dl| dl.forward(&d, n, &mut y)).is_ok();
    if !ok {
        return f64::NAN;
    }
    let per_row: Vec<f64> = (0..n)
        .into_par_iter()
        .map(|r| {
            d[r * k..(r + 1) * k].iter().zip(&y[r * k..(r + 1) * k]).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum()
        })
        .collect();
    per_row.iter().sum()
}

/// `10·log10(tr(WHWᵀ) / tr(ΔHΔᵀ))`: the layer's output SNR over the calibration inputs.
pub fn output_snr_db(signal: f64, noise: f64) -> Option<f64> {
    (noise > 0.0 && signal.is_finite()).then(|| 10.0 * (signal / noise).log10())
}

/// GPTQ settings.
#[derive(Clone, Debug)]
pub struct GptqOptions {
    /// A text file, or a directory whose `.txt` files (except the held-out `eval-*.txt`) are read in name
    /// order.
    pub calib: Option<PathBuf>,
    /// Tokens per calibration sequence.
    pub seq_len: usize,
    /// At most this many calibration tokens (the text is cut there).
    pub max_tokens: usize,
    /// Dampening, as a fraction of the mean diagonal of `H`.
    pub damp: f64,
}

impl Default for GptqOptions {
    fn default() -> Self {
        GptqOptions { calib: None, seq_len: 512, max_tokens: 32_768, damp: 0.01 }
    }
}

/// What calibration used (in the report).
#[derive(Clone, Debug, Serialize)]
pub struct CalibrationReport {
    /// The text files read.
    pub files: Vec<PathBuf>,
    /// Tokens run through the model.
    pub tokens: usize,
    /// Sequences (each starts with an empty KV cache).
    pub sequences: usize,
    /// Tokens per sequence (the last may be shorter).
    pub seq_len: usize,
    /// Dampening fraction.
    pub damp: f64,
    /// Columns per solver block.
    pub block: usize,
    /// Layers quantized in order, each layer's inputs collected through the quantized layers before it.
    pub sequential: bool,
    /// Seconds spent (forward passes, Hessians and solving).
    pub seconds: f64,
}

/// One layer to quantize: its tensor and place in the model.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The layer's name (`….self_attn.q_proj`, `lm_head`).
    pub prefix: String,
    /// Its source tensor.
    pub source: String,
    pub n: usize,
    pub k: usize,
    /// The fused layer it belongs to (`….self_attn.qkv`, …, `lm_head`).
    pub group: String,
}

/// A layer quantized by GPTQ, with its output error and RTN's on the same Hessian.
#[derive(Clone, Debug)]
pub(crate) struct Solved {
    pub quant: QuantMatrix,
    pub output_snr_db: Option<f64>,
    pub rtn_output_snr_db: Option<f64>,
}

/// The calibration sequences: the text's tokens, `seq_len` at a time, at most `max_tokens` in all.
pub(crate) fn calibration_tokens(
    model_dir: &Path,
    opts: &GptqOptions,
) -> Result<(Vec<PathBuf>, Vec<Vec<u32>>), GptqError> {
    let path = opts.calib.as_ref().ok_or(GptqErrorKind::NoCalibration)?;
    if opts.seq_len < 2 {
        return Err(GptqErrorKind::Options(format!(
            "--calib-seq {}: a sequence needs at least 2 tokens",
            opts.seq_len
        ))
        .into());
    }
    if !(opts.damp.is_finite() && opts.damp >= 0.0) {
        return Err(GptqErrorKind::Options(format!("--damp {}: must be a finite fraction ≥ 0", opts.damp)).into());
    }
    if opts.max_tokens == 0 {
        return Err(GptqErrorKind::Options("--calib-tokens 0: GPTQ needs some calibration tokens".into()).into());
    }
    let unreadable = |source| GptqErrorKind::CalibrationUnreadable { path: path.clone(), source };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut f: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(unreadable)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            // `eval-*.txt` is the held-out text `int4 eval` reads, so `--calib data/text` never trains on it.
            .filter(|p| {
                p.is_file()
                    && p.extension().is_some_and(|x| x == "txt")
                    && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("eval-"))
            })
            .collect();
        f.sort();
        if f.is_empty() {
            return Err(GptqErrorKind::CalibrationEmpty {
                path: path.clone(),
                message: "the directory has no .txt file (other than eval-*.txt)".into(),
            }
            .into());
        }
        f
    } else {
        vec![path.clone()]
    };
    let codec = TextCodec::load(model_dir).map_err(GptqErrorKind::Model)?;
    let mut ids = Vec::new();
    let mut used = Vec::new();
    for f in &files {
        if ids.len() >= opts.max_tokens {
            break;
        }
        let text = int4_files::read_text_capped(f, crate::eval::TEXT_CAP).map_err(GptqErrorKind::CalibrationFile)?;
        if text.trim().is_empty() {
            continue;
        }
        let t = codec.encode(&text).map_err(GptqErrorKind::Model)?;
        ids.extend(t);
        used.push(f.clone());
    }
    ids.truncate(opts.max_tokens);
    if ids.is_empty() {
        return Err(
            GptqErrorKind::CalibrationEmpty { path: path.clone(), message: "the text has no tokens".into() }.into()
        );
    }
    let seqs = ids.chunks(opts.seq_len).map(<[u32]>::to_vec).collect();
    Ok((used, seqs))
}

/// The observer of one calibration step: resumes each sequence from its kept residual stream at
/// `layer`, collects the Hessians of the slots asked for, and keeps the stream at `layer + 1` if asked.
struct Step<'a> {
    layer: usize,
    /// The residual stream of the current sequence at `layer` (`None`: layer 0, from the embedding).
    resume: Option<&'a [f32]>,
    /// Where to keep the stream at `layer + 1`.
    keep: Option<&'a mut Vec<f32>>,
    hessians: &'a mut [(LinearSlot, Hessian)],
}

impl ForwardObserver for Step<'_> {
    fn layer_start(&mut self, layer: usize, x: &mut [f32]) -> LayerFlow {
        if layer < self.layer {
            LayerFlow::Skip
        } else if layer == self.layer {
            if let Some(r) = self.resume {
                x.copy_from_slice(r);
            }
            LayerFlow::Run
        } else {
            if let Some(k) = self.keep.as_deref_mut() {
                k.clear();
                k.extend_from_slice(x);
            }
            LayerFlow::Stop
        }
    }

    fn linear_input(&mut self, layer: usize, slot: LinearSlot, x: &[f32], m: usize) {
        if layer != self.layer {
            return;
        }
        if let Some((_, h)) = self.hessians.iter_mut().find(|(s, _)| *s == slot) {
            h.add(x, m);
        }
    }
}

/// Runs sequential GPTQ over the model: returns every target layer quantized (by its prefix), with the
/// calibration report. `progress(done, total)` is told after each decoder layer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn calibrate(
    files: Vec<PathBuf>,
    seqs: &[Vec<u32>],
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
    targets: &[Target],
    grid: GridSpec,
    opts: &GptqOptions,
    progress: Option<&dyn Fn(usize, usize)>,
) -> Result<(HashMap<String, Solved>, CalibrationReport), GptqError> {
    let started = Instant::now();
    let mut model =
        Model::load(cfg.clone(), ckpt, Numerics::f32(IsaCaps::process()), None, None).map_err(GptqErrorKind::Model)?;
    let specs = linear_specs(cfg, ckpt);
    let mut cache = model.kv_cache(opts.seq_len, usize::MAX).map_err(GptqErrorKind::Model)?;
    let slots = [LinearSlot::Qkv, LinearSlot::O, LinearSlot::GateUp, LinearSlot::Down];
    let mut resid: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    let mut solved = HashMap::new();
    let n_layers = cfg.num_layers;
    for layer in 0..=n_layers {
        let in_layer: Vec<(LinearSlot, &str)> = if layer == n_layers {
            vec![(LinearSlot::Head, "lm_head")]
        } else {
            slots.iter().map(|&s| (s, specs[layer * 4 + slot_index(s)].name.as_str())).collect()
        };
        let wanted: Vec<(LinearSlot, &str)> =
            in_layer.into_iter().filter(|(_, g)| targets.iter().any(|t| t.group == *g)).collect();
        if !wanted.is_empty() {
            let mut hessians: Vec<(LinearSlot, Hessian)> = wanted
                .iter()
                .map(|&(s, g)| (s, Hessian::new(targets.iter().find(|t| t.group == g).map_or(0, |t| t.k))))
                .collect();
            for (s, toks) in seqs.iter().enumerate() {
                cache.clear();
                let mut step = Step {
                    layer,
                    resume: (layer > 0).then(|| resid[s].as_slice()),
                    keep: None,
                    hessians: &mut hessians,
                };
                model.forward_observed(toks, &mut cache, &mut step).map_err(GptqErrorKind::Model)?;
            }
            // Factor each shared Hessian once, in parallel, then solve its layers.
            let prepared = hessians
                .par_iter()
                .zip(&wanted)
                .map(|((_, h), &(_, g))| {
                    let mean = h.mean();
                    prepare(&mean, h.k, opts.damp, g).map(|p| (mean, p))
                })
                .collect::<Result<Vec<_>, GptqError>>()?;
            for ((slot, group), (mean, prep)) in wanted.iter().zip(&prepared) {
                let mut fused = Vec::new();
                for t in targets.iter().filter(|t| t.group == *group) {
                    let w = ckpt.f32(&t.source, &[t.n, t.k]).map_err(GptqErrorKind::Model)?;
                    let layout = |e: LayoutError| GptqErrorKind::Layout { layer: t.prefix.clone(), source: e };
                    let quant = solve(&w, t.n, t.k, prep, grid, &t.prefix)?;
                    let base = rtn(&w, t.n, t.k, grid).map_err(layout)?;
                    let signal = output_energy(&w, None, t.n, t.k, mean);
                    let noise = output_energy(&w, Some(&quant), t.n, t.k, mean);
                    let noise_rtn = output_energy(&w, Some(&base), t.n, t.k, mean);
                    if *slot != LinearSlot::Head {
                        fused.extend(quant.dequantized());
                    }
                    solved.insert(
                        t.prefix.clone(),
                        Solved {
                            quant,
                            output_snr_db: output_snr_db(signal, noise),
                            rtn_output_snr_db: output_snr_db(signal, noise_rtn),
                        },
                    );
                }
                if *slot != LinearSlot::Head {
                    let spec = &specs[layer * 4 + slot_index(*slot)];
                    let bias = spec.bias(ckpt).map_err(GptqErrorKind::Model)?;
                    model.set_linear(layer, *slot, fused, bias).map_err(GptqErrorKind::Model)?;
                }
            }
        }
        // Move every sequence's stream on through the (now quantized) layer, if anything after it is left.
        let later = targets.iter().any(|t| t.group == "lm_head")
            || specs[((layer + 1) * 4).min(specs.len())..].iter().any(|s| targets.iter().any(|t| t.group == s.name));
        if layer < n_layers && later {
            for (s, toks) in seqs.iter().enumerate() {
                cache.clear();
                let old = std::mem::take(&mut resid[s]);
                let mut new = Vec::new();
                let mut step =
                    Step { layer, resume: (layer > 0).then_some(&old[..]), keep: Some(&mut new), hessians: &mut [] };
                model.forward_observed(toks, &mut cache, &mut step).map_err(GptqErrorKind::Model)?;
                resid[s] = new;
            }
        }
        if let Some(p) = progress {
            p(layer + 1, n_layers + 1);
        }
    }
    let tokens = seqs.iter().map(Vec::len).sum();
    let report = CalibrationReport {
        files,
        tokens,
        sequences: seqs.len(),
        seq_len: opts.seq_len,
        damp: opts.damp,
        block: BLOCK,
        sequential: true,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok((solved, report))
}

fn slot_index(s: LinearSlot) -> usize {
    match s {
        LinearSlot::Qkv => 0,
        LinearSlot::O => 1,
        LinearSlot::GateUp => 2,
        LinearSlot::Down | LinearSlot::Head => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use int4_layout::GroupSize;
    use int4_layout::grid::{ParamPrecision, ScaleSearch};

    fn spd(k: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) - 0.5
        };
        let m = 2 * k;
        let x: Vec<f64> = (0..m * k).map(|_| next()).collect();
        let mut h = vec![0.0; k * k];
        for r in 0..m {
            for i in 0..k {
                for j in 0..k {
                    h[i * k + j] += x[r * k + i] * x[r * k + j];
                }
            }
        }
        h
    }

    /// `UᵀU` is the inverse of `A`: `A·UᵀU = I` to rounding, and `U` is upper triangular.
    #[test]
    fn inverse_cholesky_is_the_inverse() {
        for k in [1, 3, 17, 64] {
            let a = spd(k, k as u64);
            let u = inverse_cholesky_upper(&a, k).unwrap();
            for i in 0..k {
                for j in 0..i {
                    assert_eq!(u[i * k + j], 0.0, "U is not upper at ({i}, {j})");
                }
            }
            let mut inv = vec![0.0; k * k];
            for i in 0..k {
                for j in 0..k {
                    inv[i * k + j] = (0..k).map(|t| u[t * k + i] * u[t * k + j]).sum();
                }
            }
            for i in 0..k {
                for j in 0..k {
                    let v: f64 = (0..k).map(|t| a[i * k + t] * inv[t * k + j]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((v - want).abs() < 1e-8, "k {k}: (A·A⁻¹)[{i}][{j}] = {v}");
                }
            }
        }
    }

    #[test]
    fn not_positive_definite_is_an_error() {
        let a = vec![1.0, 2.0, 2.0, 1.0];
        assert!(inverse_cholesky_upper(&a, 2).is_none());
        let e = prepare(&[1.0, 2.0, 2.0, 1.0], 2, 0.0, "x").unwrap_err();
        assert!(matches!(e.kind(), GptqErrorKind::NotPositiveDefinite { .. }), "{e}");
        let e = prepare(&[1.0, f64::NAN, f64::NAN, 1.0], 2, 0.01, "x").unwrap_err();
        assert!(matches!(e.kind(), GptqErrorKind::NonFiniteHessian { index: (0, 1), .. }), "{e}");
    }

    /// A dead input channel's weights are zeroed and do not disturb the solver.
    #[test]
    fn dead_columns_are_zeroed() {
        let k = 32;
        let mut h = spd(k, 7);
        for j in 0..k {
            h[5 * k + j] = 0.0;
            h[j * k + 5] = 0.0;
        }
        let prep = prepare(&h, k, 0.01, "x").unwrap();
        assert!(prep.dead[5] && prep.dead.iter().filter(|&&d| d).count() == 1);
        let w: Vec<f32> = (0..4 * k).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.01).collect();
        let grid = GridSpec {
            kind: GridKind::IntegerZero,
            group: GroupSize::G32,
            search: ScaleSearch::Off,
            precision: ParamPrecision::F16,
        };
        let q = solve(&w, 4, k, &prep, grid, "x").unwrap();
        for r in 0..4 {
            assert_eq!(q.weight(r, 5), 0.0, "row {r}: a dead column decodes to 0 on the integer-zero grid");
        }
    }

    /// The Hessian's GEMM path equals the plain sum.
    #[test]
    fn hessian_matches_plain_sum() {
        let (m, k) = (37, 24);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 25.0).collect();
        let mut h = Hessian::new(k);
        h.add(&x, m);
        h.add(&x[..5 * k], 5);
        let mean = h.mean();
        for i in 0..k {
            for j in 0..k {
                let mut s = 0.0f64;
                for r in 0..m {
                    s += f64::from(x[r * k + i]) * f64::from(x[r * k + j]);
                }
                for r in 0..5 {
                    s += f64::from(x[r * k + i]) * f64::from(x[r * k + j]);
                }
                let want = s / (m + 5) as f64;
                assert!((mean[i * k + j] - want).abs() <= 1e-5 * (1.0 + want.abs()), "({i}, {j})");
            }
        }
    }
}
