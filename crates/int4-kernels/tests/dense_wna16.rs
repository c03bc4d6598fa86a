//! The dense (bf16, f32) kernels and the wna16 fallback against the scalar reference.

mod common;

use common::{Rng, assert_within, layer, runnable_variants};
use half::bf16;
use int4_kernels::budget::{Budget, magnitudes_dense, magnitudes_w4};
use int4_kernels::dense::{DenseLinear, DenseWeights};
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::portable::Wna16Linear;
use int4_kernels::shapes::{TEST_GROUPS, TEST_K, TEST_M};
use int4_kernels::{KernelId, reference};

fn caps_for(level: IsaLevel) -> IsaCaps {
    IsaCaps::unrestricted().with_max_level(level)
}

#[test]
fn dense_bf16_and_f32_match_the_reference() {
    let variants = runnable_variants("dense");
    let mut rng = Rng::new(11);
    for &n in &[16usize, 50, 144, 576] {
        for &k in &TEST_K {
            let w = rng.weights(n, k);
            let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let wbf: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            for &m in &TEST_M[..7] {
                let x = rng.activations(m, k);
                for (weights, wf) in [(DenseWeights::F32(w.clone()), &w), (DenseWeights::Bf16(wb.clone()), &wbf)] {
                    let want = reference::dense(&x, m, wf, n, k, Some(&bias));
                    let mu = magnitudes_dense(&x, m, wf, n, k);
                    for v in &variants {
                        let lin = DenseLinear::with_caps(n, k, weights.clone(), Some(bias.clone()), &caps_for(v.level))
                            .unwrap();
                        let id = lin.kernel_for(m);
                        assert_eq!(id == KernelId::DensePortable, v.level == IsaLevel::Portable);
                        let mut out = vec![f32::NAN; m * n];
                        lin.forward(&x, m, &mut out).unwrap();
                        assert_within(&format!("{} {id} N={n} K={k} M={m}", v.name), &out, &want, |i| {
                            Budget::F32_ACCUMULATE.bound(k, mu[i], f64::from(bias[i % n]))
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn wna16_fallback_matches_the_reference() {
    let mut rng = Rng::new(12);
    for (i, &n) in [16usize, 48, 80, 144].iter().enumerate() {
        let k = TEST_K[i % 2];
        let group = TEST_GROUPS[i];
        let (codes, params) = layer(&mut rng, n, k, group);
        let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let lin = Wna16Linear::from_codes(&codes, params.clone(), Some(bias.clone())).unwrap();
        assert_eq!(lin.kernel(), KernelId::Wna16Portable);
        for &m in &TEST_M[..7] {
            let x = rng.activations(m, k);
            let want = reference::w4a16(&x, m, &codes, &params, Some(&bias));
            let mu = magnitudes_w4(&x, m, &codes, &params);
            let mut out = vec![0.0; m * n];
            lin.forward(&x, m, &mut out).unwrap();
            assert_within(&format!("wna16 N={n} K={k} M={m}"), &out, &want, |j| {
                Budget::F32_ACCUMULATE.bound(k, mu[j], f64::from(bias[j % n]))
            });
        }
    }
    // N that the tinygemm packers refuse runs here (row-major needs only K even).
    let (codes, params) = layer(&mut rng, 50, 64, int4_layout::GroupSize::G32);
    assert!(Wna16Linear::from_codes(&codes, params, None).is_ok());
}
