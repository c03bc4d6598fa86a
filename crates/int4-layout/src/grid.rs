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

/// Codes plus float scale and zero: the asymmetric and symmetric grids.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    /// The codes.
    pub codes: Codes,
    /// Scales and float zeros.
    pub params: GroupParams,
}

/// Codes plus scale and integer zero point: the GPTQ `sym: false` / AWQ grid.
#[derive(Clone, Debug, PartialEq)]
pub struct IntZeroQuantized {
    /// The codes.
    pub codes: Codes,
    /// Scales, `[N][G]`.
    pub scales: Vec<f32>,
    /// Zero points in `0..=15`, `[N][G]`.
    pub zero_points: Vec<u8>,
    /// Group size.
    pub group: GroupSize,
}

impl IntZeroQuantized {
    /// The same weights as scale and float zero (`zero = scale·(8 − z)`).
    pub fn to_float_zero(&self) -> Result<GroupParams> {
        let zeros = self
            .scales
            .iter()
            .zip(&self.zero_points)
            .map(|(&s, &z)| crate::convert::integer_zero_to_float(s, z))
            .collect();
        GroupParams::new(self.codes.n(), self.codes.k(), self.group, self.scales.clone(), zeros)
    }
}

/// Quantizes `w` (`[N][K]`, row-major) on the asymmetric min/max grid with a float zero.
pub fn quantize_asymmetric(
    w: &[f32],
    n: usize,
    k: usize,
    group: GroupSize,
    search: ScaleSearch,
    precision: ParamPrecision,
) -> Result<Quantized> {
    check_input(w, n, k)?;
    let g_len = group.len(k);
    let groups = group.groups(k);
    let mut codes = vec![0u8; n * k];
    let mut scales = Vec::with_capacity(n * groups);
    let mut zeros = Vec::with_capacity(n * groups);
    let shrinks: &[f32] = match search {
        ScaleSearch::Off => &ASYMMETRIC_SHRINKS[..1],
        ScaleSearch::Shrink => &ASYMMETRIC_SHRINKS,
    };
    let mut trial = vec![0u8; g_len];
    for row in 0..n {
        for g in 0..groups {
            let k0 = g * g_len;
            let k1 = (k0 + g_len).min(k);
            let ws = &w[row * k + k0..row * k + k1];
            let (lo, hi) = min_max(ws);
            let span = (hi - lo).max(MIN_RANGE);
            let mut best = (f64::INFINITY, 0.0f32, 0.0f32);
            let out = &mut codes[row * k + k0..row * k + k1];
            for &f in shrinks {
                let scale = precision.round(span * f / 15.0);
                let low = lo + span * (1.0 - f) * 0.5;
                let zero = precision.round(low + 8.0 * scale);
                // Codes index the grid from its low end, `q = round((w − low)/scale)`. When the stored scale
                // and zero were rounded, the grid's low end is where they put it, `zero − 8·scale`.
                let origin = if precision == ParamPrecision::F32 { low } else { zero - 8.0 * scale };
                let trial = &mut trial[..ws.len()];
                let e = encode_float_zero(ws, scale, zero, |x| (x - origin) / scale, trial, shrinks.len() > 1);
                if e < best.0 {
                    best = (e, scale, zero);
                    out.copy_from_slice(trial);
                }
            }
            scales.push(best.1);
            zeros.push(best.2);
        }
    }
    Ok(Quantized { codes: Codes::new(n, k, codes)?, params: GroupParams::new(n, k, group, scales, zeros)? })
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
) -> Result<Quantized> {
    check_input(w, n, k)?;
    let g_len = group.len(k);
    let groups = group.groups(k);
    let mut codes = vec![0u8; n * k];
    let mut scales = Vec::with_capacity(n * groups);
    let factors: &[f32] = match search {
        ScaleSearch::Off => &SYMMETRIC_FACTORS[..1],
        ScaleSearch::Shrink => &SYMMETRIC_FACTORS,
    };
    let mut trial = vec![0u8; g_len];
    for row in 0..n {
        for g in 0..groups {
            let k0 = g * g_len;
            let k1 = (k0 + g_len).min(k);
            let ws = &w[row * k + k0..row * k + k1];
            let (lo, hi) = min_max(ws);
            let base = (-lo / 8.0).max(hi / 7.0).max(MIN_RANGE / 15.0);
            let mut best = (f64::INFINITY, 0.0f32);
            let out = &mut codes[row * k + k0..row * k + k1];
            for &f in factors {
                let scale = precision.round(base * f);
                let trial = &mut trial[..ws.len()];
                let e = encode_float_zero(ws, scale, 0.0, |x| round_even(x / scale) + 8.0, trial, factors.len() > 1);
                if e < best.0 {
                    best = (e, scale);
                    out.copy_from_slice(trial);
                }
            }
            scales.push(best.1);
        }
    }
    let zeros = vec![0.0; scales.len()];
    Ok(Quantized { codes: Codes::new(n, k, codes)?, params: GroupParams::new(n, k, group, scales, zeros)? })
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
) -> Result<IntZeroQuantized> {
    check_input(w, n, k)?;
    let g_len = group.len(k);
    let groups = group.groups(k);
    let mut codes = vec![0u8; n * k];
    let mut scales = Vec::with_capacity(n * groups);
    let mut zps = Vec::with_capacity(n * groups);
    let shrinks: &[f32] = match search {
        ScaleSearch::Off => &ASYMMETRIC_SHRINKS[..1],
        ScaleSearch::Shrink => &ASYMMETRIC_SHRINKS,
    };
    let mut trial = vec![0u8; g_len];
    for row in 0..n {
        for g in 0..groups {
            let k0 = g * g_len;
            let k1 = (k0 + g_len).min(k);
            let ws = &w[row * k + k0..row * k + k1];
            let (lo, hi) = min_max(ws);
            let (lo, hi) = (lo.min(0.0), hi.max(0.0));
            let span = (hi - lo).max(MIN_RANGE);
            let mut best = (f64::INFINITY, 0.0f32, 0u8);
            let out = &mut codes[row * k + k0..row * k + k1];
            for &f in shrinks {
                let scale = precision.round(span * f / 15.0);
                let low = lo + span * (1.0 - f) * 0.5;
                let z = round_even(-low / scale).clamp(0.0, 15.0) as u8;
                let trial = &mut trial[..ws.len()];
                let mut e = 0.0f64;
                for (c, &x) in trial.iter_mut().zip(ws) {
                    let q = (round_even(x / scale) + f32::from(z)).clamp(0.0, 15.0);
                    *c = q as u8;
                    let d = (q - f32::from(z)) * scale - x;
                    e += f64::from(d) * f64::from(d);
                }
                if e < best.0 {
                    best = (e, scale, z);
                    out.copy_from_slice(trial);
                }
            }
            scales.push(best.1);
            zps.push(best.2);
        }
    }
    Ok(IntZeroQuantized { codes: Codes::new(n, k, codes)?, scales, zero_points: zps, group })
}

/// Chooses codes for `ws` (`position` maps a weight to its unrounded grid position) and returns the squared
/// error of the weights decoded with the given scale and zero.
/// Codes of `ws` at `position(x)` on the grid, and their squared error (only worked out when `measure`: a
/// single trial needs no comparison, and the serial f64 sum would be most of its cost).
fn encode_float_zero(
    ws: &[f32],
    scale: f32,
    zero: f32,
    position: impl Fn(f32) -> f32,
    out: &mut [u8],
    measure: bool,
) -> f64 {
    if !measure {
        for (c, &x) in out.iter_mut().zip(ws) {
            *c = round_code(position(x));
        }
        return 0.0;
    }
    let mut e = 0.0f64;
    for (c, &x) in out.iter_mut().zip(ws) {
        let q = round_code(position(x));
        *c = q;
        let d = dequantize(q, scale, zero) - x;
        e += f64::from(d) * f64::from(d);
    }
    e
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
