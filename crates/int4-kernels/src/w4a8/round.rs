//! The rounding rule by which every W4A8 variant quantizes an activation: a leaf, so the driver
//! ([`crate::w4a8`]) and the SIMD variants (`crate::x86_64::w4a8`) share it without importing each other.

/// `1.5·2²³`: adding and subtracting it rounds an f32 below 2²² in magnitude to an integer, ties to even.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;

/// Rounds `v` (|v| < 2²²) to the nearest integer, ties to even, with the same f32 additions on every
/// target (no dependence on SSE4.1's `roundps` or a libm call).
fn round_ties_even_small(v: f32) -> f32 {
    (v + ROUND_MAGIC) - ROUND_MAGIC
}

/// One activation `v` quantized by the scale `s`: `round_ties_even((v / s).clamp(−127, 127))`, a NaN to 0
/// (a NaN activation has no int8 value). The rule every variant follows.
#[inline]
pub(crate) fn quantize_one(v: f32, s: f32) -> i8 {
    round_ties_even_small((v / s).clamp(-127.0, 127.0)) as i8
}
