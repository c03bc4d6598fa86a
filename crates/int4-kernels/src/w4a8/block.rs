//! One 16-channel block's work, as every W4A8 kernel variant sees it, and the epilogue they share.
//!
//! A leaf module: the driver ([`crate::w4a8`]) builds blocks and the SIMD variants
//! (`crate::x86_64::w4a8`) consume them, so neither imports the other's module for the type.

use std::ops::Range;

use super::params::Params;

/// One 16-channel block's work, as every kernel variant sees it.
pub(crate) struct Block<'a> {
    /// The block's packed codes, `[k_padded/8][64]`.
    pub w: &'a [u8],
    /// Activations `[m][kp]`.
    pub x: &'a [i8],
    pub kp: usize,
    pub m: usize,
    /// `[m][groups]`.
    pub a_scales: &'a [f32],
    /// `[m][groups]`.
    pub sums: &'a [i32],
    pub groups: usize,
    /// Per group: padded K range.
    pub spans: &'a [Range<usize>],
    /// This block's scales, `[G][16]`, f32 or f16.
    pub w_scales: Params<'a>,
    /// This block's zero points, `[G][16]`; `None`: all 8.
    pub zeros: Option<&'a [u8]>,
    /// This block's float offsets, `[G][16]`, f32 or f16; `None`: all 0.
    pub offsets: Option<Params<'a>>,
}

impl Block<'_> {
    /// The epilogue of one row and group, shared by every variant: `out = fma(acc − z·Σx, a_s·w_s, out)`,
    /// then, with offsets, `out = fma(Σx, a_s·f, out)`.
    #[inline]
    pub fn finish(&self, r: usize, g: usize, acc: &[i32; 16], out: &mut [f32]) {
        let sum = self.sums[r * self.groups + g];
        let a_s = self.a_scales[r * self.groups + g];
        for c in 0..16 {
            let z = self.zeros.map_or(8, |z| i32::from(z[g * 16 + c]));
            let v = acc[c].wrapping_sub(z.wrapping_mul(sum));
            out[c] = (v as f32).mul_add(a_s * self.w_scales.get(g * 16 + c), out[c]);
            if let Some(f) = self.offsets {
                out[c] = (sum as f32).mul_add(a_s * f.get(g * 16 + c), out[c]);
            }
        }
    }
}
