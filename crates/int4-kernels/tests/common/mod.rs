//! The test runner shared by every kernel test: which ISA variants exist, which this machine can run,
//! and data that looks like real layers.
#![allow(dead_code)]

use int4_kernels::isa::{Avx2Fma, Avx512, IsaCaps, IsaLevel};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::{Codes, GroupParams, GroupSize};

/// An ISA variant a test runs its kernels on.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub level: IsaLevel,
    pub name: &'static str,
}

/// Every variant this build has kernels for, whether or not this machine can run them.
pub const VARIANTS: [Variant; 2] =
    [Variant { level: IsaLevel::Portable, name: "portable" }, Variant { level: IsaLevel::Avx2, name: "avx2+fma" }];

/// The W4A16 kernels' variants: those, plus the AVX-512 decode (its prefill is the AVX2 one).
pub const W4A16_VARIANTS: [Variant; 3] =
    [VARIANTS[0], VARIANTS[1], Variant { level: IsaLevel::Avx512, name: "avx512" }];

/// The variants of [`VARIANTS`] this process can run. A variant the machine lacks is printed as skipped;
/// with `INT4_TEST_EVERYTHING=1` a skip is a failure instead. Panics if nothing at all would run.
pub fn runnable_variants(test: &str) -> Vec<Variant> {
    runnable_variants_of(test, &VARIANTS)
}

/// [`runnable_variants`] over another list of variants.
pub fn runnable_variants_of(test: &str, variants: &[Variant]) -> Vec<Variant> {
    let caps = IsaCaps::process();
    let everything = std::env::var("INT4_TEST_EVERYTHING").is_ok_and(|v| v == "1");
    let mut out = Vec::new();
    for &v in variants {
        let ok = match v.level {
            IsaLevel::Portable => true,
            IsaLevel::Avx2 => Avx2Fma::with_caps(caps).is_some(),
            IsaLevel::Avx512 => Avx512::with_caps(caps).is_some(),
            _ => false,
        };
        if ok {
            out.push(v);
        } else {
            let cap = match (std::env::var("INT4_ISA"), std::env::var("INT4_DISABLE")) {
                (Err(_), Err(_)) => "this CPU lacks it".to_string(),
                (isa, dis) => {
                    format!("capped by INT4_ISA={} INT4_DISABLE={}", isa.unwrap_or_default(), dis.unwrap_or_default())
                }
            };
            let msg = format!("{test}: SKIPPED variant {} ({cap})", v.name);
            assert!(!everything, "{msg}, and INT4_TEST_EVERYTHING=1 forbids skips");
            eprintln!("{msg}");
            record_skip(&msg);
        }
    }
    assert!(!out.is_empty(), "{test}: no kernel variant ran");
    out
}

/// Reports a variant `test` could not run here: printed and recorded, or a failure under
/// `INT4_TEST_EVERYTHING=1`.
pub fn report_skip(test: &str, variant: &str) {
    let msg = format!("{test}: SKIPPED variant {variant} (this CPU or process lacks it)");
    assert!(
        !std::env::var("INT4_TEST_EVERYTHING").is_ok_and(|v| v == "1"),
        "{msg}, and INT4_TEST_EVERYTHING=1 forbids skips"
    );
    eprintln!("{msg}");
    record_skip(&msg);
}

/// Appends a skip to `target/tmp/int4-test-skips.txt`, which `cargo xtask ci` prints after the tests
/// (the test harness hides a passing test's output, and a skip must not go unheard).
pub fn record_skip(msg: &str) {
    use std::io::Write;
    let path = concat!(env!("CARGO_TARGET_TMPDIR"), "/int4-test-skips.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{msg}");
    }
}

/// Deterministic xorshift data.
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
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.unit() as f64).max(1e-12);
        let u2 = self.unit() as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    /// Activations that are exact bf16 values (what a bf16 model feeds the kernels), with a few outliers.
    pub fn activations(&mut self, m: usize, k: usize) -> Vec<f32> {
        (0..m * k)
            .map(|i| {
                let v = if i % 97 == 0 { self.normal() * 20.0 } else { self.normal() };
                half::bf16::from_f32(v).to_f32()
            })
            .collect()
    }
    /// Weights shaped like a trained layer: Gaussian with per-row spread and occasional outliers.
    pub fn weights(&mut self, n: usize, k: usize) -> Vec<f32> {
        let mut w = Vec::with_capacity(n * k);
        for _ in 0..n {
            let spread = 0.02 + self.unit() * 0.05;
            for _ in 0..k {
                let v = self.normal() * spread;
                w.push(if self.next_u64().is_multiple_of(300) { v * 10.0 } else { v });
            }
        }
        w
    }
}

/// A quantized layer like a real one, with every third group's scale negated (half of a real Q4_0 file's
/// blocks have a negative `d`: a kernel must not assume a sign).
pub fn layer(rng: &mut Rng, n: usize, k: usize, group: GroupSize) -> (Codes, GroupParams) {
    let w = rng.weights(n, k);
    let q = quantize_asymmetric(&w, n, k, group, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    let scales: Vec<f32> =
        q.params.scales().iter().enumerate().map(|(i, &s)| if i % 3 == 1 { -s } else { s }).collect();
    let params = GroupParams::new(n, k, group, scales, q.params.zeros().to_vec()).unwrap();
    (q.codes, params)
}

/// Asserts `|got − reference| ≤ bound(i)` for every output, reporting the worst ratio.
pub fn assert_within(what: &str, got: &[f32], reference: &[f64], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), reference.len(), "{what}: output length");
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &r)) in got.iter().zip(reference).enumerate() {
        let b = bound(i);
        let e = (f64::from(g) - r).abs();
        assert!(g.is_finite(), "{what}: output {i} is {g}");
        if e / b > worst.0 {
            worst = (e / b, i);
        }
        assert!(e <= b, "{what}: output {i}: got {g}, reference {r}, error {e:e} > budget {b:e}");
    }
}
