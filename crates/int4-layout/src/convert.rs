//! Conversions between the grids: integer zero points (GPTQ, AWQ) into tinygemm's float zero.
//!
//! `(q − z)·s = (q − 8)·s + s·(8 − z)`, so an integer zero `z` becomes the float zero `s·(8 − z)`.
//!
//! **Exactness.** With [`crate::dequantize`]'s rounding (product, then sum), the converted weight equals
//! `(q − z)·s` rounded once exactly when `s` has at most 20 significant bits — every f16 or bf16 scale,
//! which is what GPTQ and AWQ checkpoints store: `(q − 8)·s`, `(8 − z)·s` and `(q − z)·s` are then all
//! exact in f32, so no step rounds. For an arbitrary f32 scale the float zero is `s·(8 − z)` correctly
//! rounded (within half an ulp), but the decoded weight goes through three roundings of half an ulp each
//! (the last on a value below `16·s`), so it is within two ulps of `8·s` (the grid's largest step
//! magnitude) of the exact `(q − z)·s`, and not always equal to the f32 product; the tests show both, and a
//! search over 20 000 random scales finds the worst case at that bound. Exactness for every f32 scale is not
//! to be had with any single-precision float zero, which is why the W4A8 path keeps integer zero points.

use crate::codes::{GroupParams, GroupSize};
use crate::error::{LayoutErrorKind, Result, err};

/// The tinygemm float zero for scale `s` and integer zero point `z`: `s·(8 − z)`.
#[inline]
pub fn integer_zero_to_float(scale: f32, z: u8) -> f32 {
    scale * (8.0 - f32::from(z))
}

/// Builds tinygemm parameters (`[N][G]`, float zeros) from GPTQ/AWQ-shaped `scales` and integer
/// `zero_points` (both `[G][N]`). `zero_points: None` means symmetric: every zero is 8, so every float
/// zero is 0.
pub fn params_from_integer_zeros(
    n: usize,
    k: usize,
    group: GroupSize,
    scales_gn: &[f32],
    zero_points_gn: Option<&[u8]>,
) -> Result<GroupParams> {
    let groups = group.groups(k);
    if scales_gn.len() != groups * n {
        return err(LayoutErrorKind::LengthMismatch { what: "scales", expected: groups * n, actual: scales_gn.len() });
    }
    if let Some(z) = zero_points_gn
        && z.len() != groups * n
    {
        return err(LayoutErrorKind::LengthMismatch { what: "zero points", expected: groups * n, actual: z.len() });
    }
    let mut scale = Vec::with_capacity(n * groups);
    let mut zero = Vec::with_capacity(n * groups);
    for row in 0..n {
        for g in 0..groups {
            let s = scales_gn[g * n + row];
            let z = zero_points_gn.map_or(8, |zp| zp[g * n + row]);
            scale.push(s);
            zero.push(integer_zero_to_float(s, z));
        }
    }
    GroupParams::new(n, k, group, scale, zero)
}
