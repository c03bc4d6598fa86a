//! Vector primitives the runtime's attention uses: a dot product and `y += a·x`, on AVX2 + FMA where the
//! process may use it and in portable Rust otherwise.

use crate::isa::{Avx2Fma, IsaCaps};

/// A chosen implementation (picked once, then reused).
#[derive(Clone, Copy, Debug)]
pub struct VectorOps {
    tok: Option<Avx2Fma>,
}

impl Default for VectorOps {
    fn default() -> Self {
        VectorOps::new()
    }
}

impl VectorOps {
    /// The best implementation the process caps allow.
    pub fn new() -> Self {
        VectorOps { tok: Avx2Fma::with_caps(IsaCaps::process()) }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_plain_loops_on_every_length() {
        let ops = [VectorOps::new(), VectorOps { tok: None }];
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
}
