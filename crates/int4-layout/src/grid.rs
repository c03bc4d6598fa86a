//! Quantization grids: how a group of f32 weights becomes 4-bit codes plus a scale and a zero.
//!
//! Three grids cover the checkpoints this project reads and writes:
//!
//! * [`quantize_asymmetric`] — min/max with a float zero, PyTorch tinygemm's convention (`cpu_int4`):
//!   `scale = max(max − min, ε)/15`, `zero = min + 8·scale`, `q = clamp(round((w − min)/scale), 0, 15)`,
//!   decoded as `(q − 8)·scale + zero`.
//! * [`quantize_symmetric`] — GPTQ `sym: true`: `w = (q − 8)·scale`, zero 0.
//! * [`quantize_integer_zero`] — GPTQ `sym: false` and AWQ: `w = (q − z)·scale` with an integer zero point
//!   `z` in `0..=15`.
//!
//! Each takes a [`ScaleSearch`]: with [`ScaleSearch::Shrink`] a handful of narrower ranges are tried per
//! group and the one with the lowest squared error *as decoded* (by [`crate::dequantize`], after any
//! rounding the caller's [`ParamPrecision`] imposes on the stored scale and zero) is kept. Rounding is
//! ties-to-even everywhere. A partial last group (K not a multiple of g) is quantized over its own members.
//!
//! The grids live here, once: [`GroupGrid`] fits one group and codes and decodes values on it, and every
//! method that chooses codes goes through it — round to nearest ([`quantize`]) and GPTQ (`int4-quant`, one
//! column at a time) — so both produce the same grid for the same weights, and a checkpoint writer or a
//! kernel packer reads one type, [`QuantMatrix`], whichever made it.

use half::{bf16, f16};

use crate::codes::{Codes, GroupParams, GroupSize, check_shape, dequantize};
use crate::error::{LayoutErrorKind, Result, err};

/// Whether to search over narrower ranges per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleSearch {
    /// Plain min/max (round-to-nearest on the full range).
    Off,
    /// Try [`ASYMMETRIC_SHRINKS`] (or [`SYMMETRIC_FACTORS`]) and keep the lowest squared error.
    Shrink,
}

/// The precision the scale and zero will be stored in. Codes are chosen against the stored values, so
/// that what a checkpoint holds is what the search optimised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamPrecision {
    /// f32, this crate's packed form.
    F32,
    /// bf16 (PyTorch tinygemm's `qScaleAndZeros`, `cpu_int4` checkpoints that choose it).
    Bf16,
    /// f16 (GPTQ and AWQ `scales`).
    F16,
}

impl ParamPrecision {
    /// Rounds an f32 to this precision (round-to-nearest-even) and back.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            ParamPrecision::F32 => x,
            ParamPrecision::Bf16 => bf16::from_f32(x).to_f32(),
            ParamPrecision::F16 => f16::from_f32(x).to_f32(),
        }
    }
}

/// Range shrink factors for the asymmetric grids: the range is narrowed about its mid-point.
/// The first (1.0, the full range) wins ties.
pub const ASYMMETRIC_SHRINKS: [f32; 8] = [1.0, 0.98, 0.96, 0.94, 0.92, 0.90, 0.88, 0.85];

/// Scale factors for the symmetric grid, relative to the tightest scale that clips neither end
/// (`max(−min/8, max/7)`, see [`quantize_symmetric`]). The first (1.0) wins ties.
pub const SYMMETRIC_FACTORS: [f32; 8] = [1.0, 0.97, 0.94, 0.91, 0.88, 0.85, 0.82, 0.78];

/// The smallest range a group may have; a constant group gets this so its scale is never zero.
pub const MIN_RANGE: f32 = 1e-9;

/// Which grid a matrix is quantized on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GridKind {
    /// Min/max with a float zero (`cpu_int4`, tinygemm): `(q − 8)·s + z`.
    Asymmetric,
    /// Symmetric (GPTQ `sym: true`): `(q − 8)·s`.
    Symmetric,
    /// Integer zero point (GPTQ `sym: false`, AWQ): `(q − z)·s`.
    IntegerZero,
}

/// Everything that decides how a matrix is quantized: the grid, the group size, the scale search and the
/// precision its parameters are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GridSpec {
    /// Which grid.
    pub kind: GridKind,
    /// Input channels per group.
    pub group: GroupSize,
    /// Scale search per group.
    pub search: ScaleSearch,
    /// The precision scales and zeros are stored in (codes are chosen against the stored values).
    pub precision: ParamPrecision,
}

/// One group's grid, chosen from its weights by [`GroupGrid::fit`]: it codes any value and decodes any code
/// exactly as the grid functions do, so a method that picks codes one column at a time (GPTQ) gets the
/// grid's own codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupGrid {
    kind: GridKind,
    scale: f32,
    /// The float zero (asymmetric), or the integer zero point as f32 (8 when symmetric).
    zero: f32,
    /// Asymmetric: the grid's low end, from which codes count.
    origin: f32,
}

impl GroupGrid {
    /// Fits the grid to one group's weights `ws` (all finite): with [`ScaleSearch::Shrink`] each candidate
    /// range is tried and the one with the lowest squared error, as decoded after `precision`'s rounding,
    /// is kept (the first wins ties). Writes the group's codes to `codes` (`ws.len()` of them); `trial`
    /// is scratch space.
    pub fn fit(
        kind: GridKind,
        ws: &[f32],
        search: ScaleSearch,
        precision: ParamPrecision,
        codes: &mut [u8],
        trial: &mut Vec<u8>,
    ) -> GroupGrid {
        trial.resize(ws.len(), 0);
        let trial = &mut trial[..ws.len()];
        let (lo, hi) = min_max(ws);
        let mut best: Option<(f64, GroupGrid)> = None;
        let mut consider = |grid: GroupGrid, measure: bool, trial: &mut [u8], codes: &mut [u8]| {
            let e = grid.encode(ws, trial, measure);
            if best.as_ref().is_none_or(|(b, _)| e < *b) {
                best = Some((e, grid));
                codes.copy_from_slice(trial);
            }
        };
        match kind {
            GridKind::Asymmetric => {
                let shrinks: &[f32] = match search {
                    ScaleSearch::Off => &ASYMMETRIC_SHRINKS[..1],
                    ScaleSearch::Shrink => &ASYMMETRIC_SHRINKS,
                };
                let span = (hi - lo).max(MIN_RANGE);
                for &f in shrinks {
                    let scale = precision.round(span * f / 15.0);
                    let low = lo + span * (1.0 - f) * 0.5;
                    let zero = precision.round(low + 8.0 * scale);
                    // Codes index the grid from its low end, `q = round((w − low)/scale)`. When the stored
                    // scale and zero were rounded, the grid's low end is where they put it, `zero − 8·scale`.
                    let origin = if precision == ParamPrecision::F32 { low } else { zero - 8.0 * scale };
                    consider(GroupGrid { kind, scale, zero, origin }, shrinks.len() > 1, trial, codes);
                }
            }
            GridKind::Symmetric => {
                let factors: &[f32] = match search {
                    ScaleSearch::Off => &SYMMETRIC_FACTORS[..1],
                    ScaleSearch::Shrink => &SYMMETRIC_FACTORS,
                };
                let base = (-lo / 8.0).max(hi / 7.0).max(MIN_RANGE / 15.0);
                for &f in factors {
                    let scale = precision.round(base * f);
                    consider(GroupGrid { kind, scale, zero: 8.0, origin: 0.0 }, factors.len() > 1, trial, codes);
                }
            }
            GridKind::IntegerZero => {
                let shrinks: &[f32] = match search {
                    ScaleSearch::Off => &ASYMMETRIC_SHRINKS[..1],
                    ScaleSearch::Shrink => &ASYMMETRIC_SHRINKS,
                };
                // As GPTQ does, the range always includes 0, so the zero point lies in 0..=15 and a weight of
                // exactly 0 is representable.
                let (lo, hi) = (lo.min(0.0), hi.max(0.0));
                let span = (hi - lo).max(MIN_RANGE);
                for &f in shrinks {
                    let scale = precision.round(span * f / 15.0);
                    let low = lo + span * (1.0 - f) * 0.5;
                    let z = round_even(-low / scale).clamp(0.0, 15.0);
                    consider(GroupGrid { kind, scale, zero: z, origin: 0.0 }, true, trial, codes);
                }
            }
        }
        best.map(|(_, g)| g).expect("every grid tries at least one range")
    }

    /// The code of `x` on this grid.
    #[inline]
    pub fn code(&self, x: f32) -> u8 {
        match self.kind {
            GridKind::Asymmetric => round_code((x - self.origin) / self.scale),
            GridKind::Symmetric => round_code(round_even(x / self.scale) + 8.0),
            GridKind::IntegerZero => (round_even(x / self.scale) + self.zero).clamp(0.0, 15.0) as u8,
        }
    }

    /// The weight code `q` stands for on this grid.
    #[inline]
    pub fn decode(&self, q: u8) -> f32 {
        match self.kind {
            GridKind::Asymmetric => dequantize(q, self.scale, self.zero),
            GridKind::Symmetric | GridKind::IntegerZero => (f32::from(q) - self.zero) * self.scale,
        }
    }

    /// The scale, as stored.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The float zero of the asymmetric grid; `None` on the others.
    pub fn float_zero(&self) -> Option<f32> {
        (self.kind == GridKind::Asymmetric).then_some(self.zero)
    }

    /// The integer zero point (8 on the symmetric grid); `None` on the asymmetric grid.
    pub fn zero_point(&self) -> Option<u8> {
        (self.kind != GridKind::Asymmetric).then_some(self.zero as u8)
    }

    /// Codes `ws` into `out` and returns the squared error as decoded (only worked out when `measure`: a
    /// single candidate needs no comparison, and the serial f64 sum would be most of its cost).
    fn encode(&self, ws: &[f32], out: &mut [u8], measure: bool) -> f64 {
        if !measure {
            for (c, &x) in out.iter_mut().zip(ws) {
                *c = self.code(x);
            }
            return 0.0;
        }
        let mut e = 0.0f64;
        for (c, &x) in out.iter_mut().zip(ws) {
            let q = self.code(x);
            *c = q;
            let d = self.decode(q) - x;
            e += f64::from(d) * f64::from(d);
        }
        e
    }
}

/// A quantized matrix: codes `[N][K]`, and per output channel and group a scale and a zero. What the grids
/// produce, GPTQ solves, and the checkpoint writers and the runtime's packers read.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantMatrix {
    /// The codes.
    pub codes: Codes,
    /// Scales and zeros in the form every kernel decodes, `(q − 8)·s + z` (an integer zero point `zp` as
    /// `z = s·(8 − zp)`, exact when the scale is an f16 or bf16 value).
    pub params: GroupParams,
    /// The integer zero points, `[N][G]` in `0..=15`, when the grid has them (8 everywhere on the symmetric
    /// grid); `None` on the asymmetric grid, whose zeros are floats.
    pub zero_points: Option<Vec<u8>>,
}

impl QuantMatrix {
    /// A matrix on an integer-zero grid from its stored form: scales and zero points, `[N][G]`.
    pub fn with_zero_points(codes: Codes, group: GroupSize, scales: Vec<f32>, zero_points: Vec<u8>) -> Result<Self> {
        let zeros =
            scales.iter().zip(&zero_points).map(|(&s, &z)| crate::convert::integer_zero_to_float(s, z)).collect();
        let params = GroupParams::new(codes.n(), codes.k(), group, scales, zeros)?;
        if zero_points.len() != params.scales().len() {
            return err(LayoutErrorKind::LengthMismatch {
                what: "zero points",
                expected: params.scales().len(),
                actual: zero_points.len(),
            });
        }
        Ok(QuantMatrix { codes, params, zero_points: Some(zero_points) })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.codes.n()
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.codes.k()
    }

    /// Weight `(row, col)` as the grid decodes it: `(q − zp)·s` with an integer zero point, else
    /// `(q − 8)·s + z`.
    #[inline]
    pub fn weight(&self, row: usize, col: usize) -> f32 {
        let q = self.codes.get(row, col);
        match &self.zero_points {
            Some(zp) => {
                let k = self.k();
                let g = col / self.params.group_size().len(k);
                let zp = zp[row * self.params.groups() + g];
                (f32::from(q) - f32::from(zp)) * self.params.scale(row, g)
            }
            None => self.params.weight(row, col, q),
        }
    }

    /// Every weight decoded as the grid decodes it, `[N][K]`.
    pub fn dequantized(&self) -> Vec<f32> {
        let k = self.k();
        (0..self.n() * k).map(|i| self.weight(i / k, i % k)).collect()
    }

    /// The rows of `parts` (each a block of rows of one matrix, on one grid), stacked in order.
    pub fn stack_rows(parts: Vec<QuantMatrix>) -> Result<QuantMatrix> {
        let Some(first) = parts.first() else { return err(LayoutErrorKind::EmptyShape { n: 0, k: 0 }) };
        let (k, group, integer) = (first.k(), first.params.group_size(), first.zero_points.is_some());
        let n = parts.iter().map(QuantMatrix::n).sum();
        let (mut codes, mut scales, mut zeros, mut zps) =
            (Vec::with_capacity(n * k), Vec::new(), Vec::new(), Vec::new());
        for p in parts {
            if p.k() != k || p.params.group_size() != group || p.zero_points.is_some() != integer {
                return err(LayoutErrorKind::LengthMismatch { what: "stacked rows' K", expected: k, actual: p.k() });
            }
            codes.extend_from_slice(p.codes.as_slice());
            scales.extend_from_slice(p.params.scales());
            zeros.extend_from_slice(p.params.zeros());
            zps.extend(p.zero_points.unwrap_or_default());
        }
        Ok(QuantMatrix {
            codes: Codes::new(n, k, codes)?,
            params: GroupParams::new(n, k, group, scales, zeros)?,
            zero_points: integer.then_some(zps),
        })
    }
}

/// Quantizes `w` (`[N][K]`, row-major) per `spec`, group by group ([`GroupGrid::fit`]).
pub fn quantize(w: &[f32], n: usize, k: usize, spec: GridSpec) -> Result<QuantMatrix> {
    check_input(w, n, k)?;
    let (g_len, groups) = (spec.group.len(k), spec.group.groups(k));
    let mut codes = vec![0u8; n * k];
    let mut scales = Vec::with_capacity(n * groups);
    let mut zeros = Vec::with_capacity(n * groups);
    let mut zero_points = Vec::new();
    let mut trial = Vec::with_capacity(g_len);
    for row in 0..n {
        for g in 0..groups {
            let k0 = g * g_len;
            let k1 = (k0 + g_len).min(k);
            let out = &mut codes[row * k + k0..row * k + k1];
            let ws = &w[row * k + k0..row * k + k1];
            let grid = GroupGrid::fit(spec.kind, ws, spec.search, spec.precision, out, &mut trial);
            scales.push(grid.scale());
            match grid.zero_point() {
                Some(zp) => {
                    zeros.push(crate::convert::integer_zero_to_float(grid.scale(), zp));
                    zero_points.push(zp);
                }
                None => zeros.push(grid.float_zero().unwrap_or(0.0)),
            }
        }
    }
    Ok(QuantMatrix {
        codes: Codes::new(n, k, codes)?,
        params: GroupParams::new(n, k, spec.group, scales, zeros)?,
        zero_points: (spec.kind != GridKind::Asymmetric).then_some(zero_points),
    })
}

/// Quantizes `w` (`[N][K]`, row-major) on the asymmetric min/max grid with a float zero.
pub fn quantize_asymmetric(
    w: &[f32],
    n: usize,
    k: usize,
    group: GroupSize,
    search: ScaleSearch,
    precision: ParamPrecision,
) -> Result<QuantMatrix> {
    quantize(w, n, k, GridSpec { kind: GridKind::Asymmetric, group, search, precision })
}

/// Quantizes `w` on the symmetric grid `w = (q − 8)·scale` (GPTQ `sym: true`).
///
/// The base scale is the tightest one that clips neither end: `max(−min/8, max/7, ε)`, so the most
/// negative weight can land on code 0 (−8·scale) and the most positive on code 15 (+7·scale). Search tries
/// [`SYMMETRIC_FACTORS`] of it. (Upstream's grid used `amax·f/8` and always clipped the positive end.)
pub fn quantize_symmetric(
    w: &[f32],
    n: usize,
    k: usize,
    group: GroupSize,
    search: ScaleSearch,
    precision: ParamPrecision,
) -> Result<QuantMatrix> {
    quantize(w, n, k, GridSpec { kind: GridKind::Symmetric, group, search, precision })
}

/// Quantizes `w` on the integer-zero-point grid `w = (q − z)·scale` (GPTQ `sym: false`, AWQ).
///
/// As GPTQ does, the range always includes 0 (`min ≤ 0 ≤ max`), so `z = round(−min/scale)` lies in
/// `0..=15` and a weight of exactly 0 is representable. Search narrows the range about its mid-point.
pub fn quantize_integer_zero(
    w: &[f32],
    n: usize,
    k: usize,
    group: GroupSize,
    search: ScaleSearch,
    precision: ParamPrecision,
) -> Result<QuantMatrix> {
    quantize(w, n, k, GridSpec { kind: GridKind::IntegerZero, group, search, precision })
}

/// `x` clamped to `0..=15` and rounded to the nearest integer, ties to even: the same value as
/// `x.clamp(0.0, 15.0).round_ties_even() as u8` (clamping to integer bounds commutes with rounding), but
/// by adding and subtracting 1.5·2²³, which rounds in the FPU's default mode (nearest, ties to even) with
/// plain SSE2 instead of a call to `rintf` on CPUs where the baseline target lacks `roundss`.
#[inline]
fn round_code(x: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0;
    let c = x.clamp(0.0, 15.0);
    ((c + MAGIC) - MAGIC) as u8
}

/// `v.round_ties_even()` for the grid's positions, by the same add-and-subtract as [`round_code`]. Positions
/// beyond ±2²² (never reached by a code: every caller clamps to 0..=15 afterwards) are clamped first so the
/// trick stays exact; below that bound the result equals `round_ties_even` (up to the sign of a zero).
#[inline]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    const BOUND: f32 = 4_194_304.0;
    (v.clamp(-BOUND, BOUND) + MAGIC) - MAGIC
}

fn min_max(ws: &[f32]) -> (f32, f32) {
    ws.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

fn check_input(w: &[f32], n: usize, k: usize) -> Result<()> {
    check_shape(n, k)?;
    if w.len() != n * k {
        return err(LayoutErrorKind::LengthMismatch { what: "weights", expected: n * k, actual: w.len() });
    }
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return err(LayoutErrorKind::NonFiniteWeight { n: i / k, k: i % k });
    }
    Ok(())
}

#[cfg(test)]
mod round_code_tests {
    use super::{round_code, round_even};

    /// The add-and-subtract rounding equals `round_ties_even` on every half-step in and around the code
    /// range, on values just beside each tie, and on extremes.
    #[test]
    fn round_even_matches_round_ties_even() {
        let mut x = -70.0f32;
        while x <= 70.0 {
            for v in [x, x.next_up(), x.next_down()] {
                assert_eq!(round_even(v), v.round_ties_even(), "{v:e}");
            }
            x += 0.25;
        }
        assert_eq!(round_even(1e30), 4_194_304.0);
        assert_eq!(round_even(-1e30), -4_194_304.0);
    }

    #[test]
    fn round_code_matches_round_ties_even() {
        let mut xs: Vec<f32> = (-80..=200).map(|i| i as f32 * 0.25).collect();
        for t in -4..=40 {
            let tie = t as f32 * 0.5;
            xs.extend([tie.next_down(), tie.next_up()]);
        }
        xs.extend([f32::MAX, f32::MIN, 1e-30, -1e-30, 0.0, -0.0, 7.499_999_5, 8.500_001]);
        for x in xs {
            assert_eq!(round_code(x), x.clamp(0.0, 15.0).round_ties_even() as u8, "{x:e}");
        }
    }
}
