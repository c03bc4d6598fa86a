//! Helpers shared by the layout tests: index patterns, deterministic pseudo-random data.
#![allow(dead_code)]

use int4_layout::Codes;

/// The N values every layout is proven on: full blocks, 16/32/48 tails, several blocks plus a tail.
pub const PROOF_N: [usize; 9] = [16, 32, 48, 64, 80, 96, 128, 144, 192];

/// Bit-plane `plane` of the index pattern: code `(n, k)` is nibble `plane` of `n·K + k`. Packing every plane
/// and reading each nibble back identifies, for every location, exactly which `(n, k)` landed there.
pub fn index_plane(n: usize, k: usize, plane: usize) -> Codes {
    Codes::from_fn(n, k, |r, c| ((r * k + c) >> (4 * plane)) as u8).unwrap()
}

/// How many 4-bit planes it takes to spell every index of an `n × k` matrix.
pub fn planes_for(n: usize, k: usize) -> usize {
    let bits = usize::BITS - (n * k - 1).leading_zeros();
    (bits as usize).div_ceil(4).max(1)
}

/// Asserts that `read(plane, n, k)` gives back nibble `plane` of `n·K + k` for every `(n, k)`: the
/// documented map sends every code where the packer put it, and (since every index is distinct) no two
/// codes to one place.
pub fn assert_index_pattern(n: usize, k: usize, mut read: impl FnMut(usize, usize, usize) -> u8, what: &str) {
    let planes = planes_for(n, k);
    for r in 0..n {
        for c in 0..k {
            let mut idx = 0usize;
            for p in 0..planes {
                idx |= usize::from(read(p, r, c)) << (4 * p);
            }
            assert_eq!(idx, r * k + c, "{what}: N={n} K={k}: the nibble mapped to (n={r}, k={c}) holds index {idx}");
        }
    }
}

/// A small xorshift generator, so tests are deterministic without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.unit() as f64).max(1e-12);
        let u2 = self.unit() as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    pub fn codes(&mut self, n: usize, k: usize) -> Codes {
        Codes::from_fn(n, k, |_, _| self.below(16) as u8).unwrap()
    }
    /// Weights shaped like a real layer: Gaussian, with a few outliers.
    pub fn weights(&mut self, n: usize, k: usize) -> Vec<f32> {
        (0..n * k).map(|_| if self.below(200) == 0 { self.normal() * 8.0 } else { self.normal() }).collect()
    }
}

pub fn snr_db(reference: &[f32], approx: &[f32]) -> f64 {
    let signal: f64 = reference.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let noise: f64 = reference.iter().zip(approx).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum();
    10.0 * (signal / noise).log10()
}
