//! GPTQ/AWQ conventions (v1 and v2 zeros, act-order, AWQ's interleave) and their conversion into the
//! tinygemm float-zero form.

mod common;

use common::Rng;
use half::{bf16, f16};
use int4_layout::convert::{integer_zero_to_float, params_from_integer_zeros};
use int4_layout::gptq::{self, ZeroFormat};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_integer_zero};
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{Codes, GroupSize, LayoutErrorKind, dequantize};

#[test]
fn symmetric_v1_stores_sevens_and_v2_stores_eights() {
    let zeros = vec![8u8; 2 * 16];
    let v1 = gptq::pack_qzeros(&zeros, 2, 16, ZeroFormat::V1).unwrap();
    let v2 = gptq::pack_qzeros(&zeros, 2, 16, ZeroFormat::V2).unwrap();
    assert!(v1.iter().all(|&w| w == 0x7777_7777));
    assert!(v2.iter().all(|&w| w as u32 == 0x8888_8888));
    assert_eq!(gptq::detect_symmetric_zero_format(&v1).unwrap(), ZeroFormat::V1);
    assert_eq!(gptq::detect_symmetric_zero_format(&v2).unwrap(), ZeroFormat::V2);
    assert_eq!(gptq::unpack_qzeros(&v1, 2, 16, ZeroFormat::V1).unwrap(), zeros);
    assert_eq!(gptq::unpack_qzeros(&v2, 2, 16, ZeroFormat::V2).unwrap(), zeros);
    // Upstream's bug: 8s labelled v1 read back as 9.
    assert!(gptq::unpack_qzeros(&v2, 2, 16, ZeroFormat::V1).unwrap().iter().all(|&z| z == 9));
    let mixed = vec![0x7777_7777, 0x8888_8888u32 as i32];
    assert_eq!(
        gptq::detect_symmetric_zero_format(&mixed).unwrap_err().kind(),
        &LayoutErrorKind::AmbiguousZeroFormat { value: 8 }
    );
    assert_eq!(
        gptq::detect_symmetric_zero_format(&[0x7777_7776]).unwrap_err().kind(),
        &LayoutErrorKind::AmbiguousZeroFormat { value: 6 }
    );
    assert_eq!(ZeroFormat::from_checkpoint_format("gptq"), Some(ZeroFormat::V1));
    assert_eq!(ZeroFormat::from_checkpoint_format("gptq_v2"), Some(ZeroFormat::V2));
    assert_eq!(ZeroFormat::from_checkpoint_format("marlin"), None);
}

#[test]
fn asymmetric_zeros_round_trip_in_v2_and_v1_refuses_a_zero_of_zero() {
    let mut rng = Rng::new(1);
    let (groups, n) = (5, 24);
    let zeros: Vec<u8> = (0..groups * n).map(|_| rng.below(16) as u8).collect();
    let v2 = gptq::pack_qzeros(&zeros, groups, n, ZeroFormat::V2).unwrap();
    assert_eq!(gptq::unpack_qzeros(&v2, groups, n, ZeroFormat::V2).unwrap(), zeros);
    let first_zero = zeros.iter().position(|&z| z == 0).unwrap();
    let e = gptq::pack_qzeros(&zeros, groups, n, ZeroFormat::V1).unwrap_err();
    assert_eq!(e.kind(), &LayoutErrorKind::ZeroNotRepresentable { group: first_zero / n, n: first_zero % n });
    let nonzero: Vec<u8> = zeros.iter().map(|&z| z.max(1)).collect();
    let v1 = gptq::pack_qzeros(&nonzero, groups, n, ZeroFormat::V1).unwrap();
    assert_eq!(gptq::unpack_qzeros(&v1, groups, n, ZeroFormat::V1).unwrap(), nonzero);
}

/// Act-order: `g_idx` scatters groups across K; the permutation makes them contiguous, and the permuted
/// activations against the permuted codes give the same integer dot products.
#[test]
fn act_order_permutation_preserves_every_dot_product() {
    let mut rng = Rng::new(2);
    let (n, k, group) = (16, 320, GroupSize::G64); // five groups of 64
    let mut order: Vec<usize> = (0..k).collect();
    for i in (1..k).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut g_idx = vec![0i32; k];
    for (pos, &kk) in order.iter().enumerate() {
        g_idx[kk] = (pos / 64) as i32;
    }
    let perm = gptq::act_order_permutation(&g_idx, k, group).unwrap().expect("scattered groups need a permutation");
    for (i, &p) in perm.iter().enumerate() {
        assert_eq!(g_idx[p as usize] as usize, i / 64, "position {i} is in the wrong group");
    }
    let codes = rng.codes(n, k);
    let permuted = gptq::permute_k(&codes, &perm).unwrap();
    let x: Vec<i64> = (0..k).map(|_| rng.below(255) as i64 - 127).collect();
    let xp: Vec<i64> = perm.iter().map(|&p| x[p as usize]).collect();
    for r in 0..n {
        let a: i64 = (0..k).map(|kk| x[kk] * i64::from(codes.get(r, kk))).sum();
        let b: i64 = (0..k).map(|i| xp[i] * i64::from(permuted.get(r, i))).sum();
        assert_eq!(a, b);
    }
    assert_eq!(gptq::act_order_permutation(&gptq::default_g_idx(k, group), k, group).unwrap(), None);
    // A partial last group: K = 576 at g = 128.
    assert_eq!(
        gptq::act_order_permutation(&gptq::default_g_idx(576, GroupSize::G128), 576, GroupSize::G128).unwrap(),
        None
    );
    let mut bad = g_idx.clone();
    bad[3] = 5;
    assert!(matches!(
        gptq::act_order_permutation(&bad, k, group).unwrap_err().kind(),
        LayoutErrorKind::BadGroupIndex { k: 3, .. }
    ));
    bad[3] = -1;
    assert!(gptq::act_order_permutation(&bad, k, group).is_err());
    let mut uneven = g_idx;
    let victim = uneven.iter().position(|&g| g == 0).unwrap();
    uneven[victim] = 1;
    assert_eq!(
        gptq::act_order_permutation(&uneven, k, group).unwrap_err().kind(),
        &LayoutErrorKind::UnevenGroups { group: 0, expected: 64, actual: 63 }
    );
}

#[test]
fn awq_interleave_is_0_2_4_6_1_3_5_7() {
    let vals: Vec<u8> = (0..8).collect();
    let w = gptq::pack_awq(&vals, 1, 8).unwrap();
    // Nibble i holds column AWQ_ORDER[i]: 0,2,4,6,1,3,5,7 from the least significant nibble up.
    assert_eq!(w, vec![0x7531_6420]);
    assert_eq!(gptq::unpack_awq(&w, 1, 8).unwrap(), vals);
}

/// Integer zero → float zero: exact for f16 and bf16 scales (what GPTQ and AWQ store), for every code and
/// zero point.
#[test]
fn integer_zero_conversion_is_exact_for_f16_and_bf16_scales() {
    let mut rng = Rng::new(3);
    for _ in 0..2000 {
        let raw = (rng.normal() * 0.05) * if rng.below(2) == 0 { 1.0 } else { 1e-3 };
        for s in [f16::from_f32(raw).to_f32(), bf16::from_f32(raw).to_f32()] {
            for z in 0..=15u8 {
                let zero = integer_zero_to_float(s, z);
                for q in 0..=15u8 {
                    let exact = (f32::from(q) - f32::from(z)) * s;
                    assert_eq!(dequantize(q, s, zero), exact, "s={s:e} z={z} q={q}");
                }
            }
        }
    }
}

/// For arbitrary f32 scales: the float zero is `s·(8 − z)` correctly rounded (within half an ulp), and a
/// decoded weight is within two ulps of 8·s (the grid's largest step magnitude) of the exact `(q − z)·s`
/// (three roundings of half an ulp each, the last on a value below 16·s). It is not always the f32 product
/// `(q − z)·s`: the test finds such cases, as the module documentation says.
#[test]
fn integer_zero_conversion_is_within_two_ulps_of_the_grid_for_f32_scales() {
    let mut rng = Rng::new(4);
    let mut inexact = 0;
    let mut worst = 0.0f64;
    for _ in 0..20000 {
        let s = (rng.unit() + 0.01) * 0.1;
        let ulp8 = {
            let m = 8.0 * s;
            f64::from(f32::from_bits(m.to_bits() + 1) - m)
        };
        for z in 0..=15u8 {
            let zero = integer_zero_to_float(s, z);
            let zero_exact = f64::from(s) * f64::from(8 - i32::from(z));
            let zero_ulp = f64::from(f32::from_bits(zero.abs().to_bits() + 1) - zero.abs());
            assert!((f64::from(zero) - zero_exact).abs() <= 0.5 * zero_ulp, "zero for s={s:e} z={z}");
            for q in 0..=15u8 {
                let exact = f64::from(f32::from(q) - f32::from(z)) * f64::from(s);
                let got = f64::from(dequantize(q, s, zero));
                worst = worst.max((got - exact).abs() / ulp8);
                assert!((got - exact).abs() <= 2.0 * ulp8, "s={s:e} z={z} q={q}: {got} vs {exact}");
                inexact += usize::from(got != f64::from((f32::from(q) - f32::from(z)) * s));
            }
        }
    }
    assert!(inexact > 0, "arbitrary f32 scales should sometimes round differently from the f32 product");
    println!("worst error: {worst:.3} ulps of 8s; {inexact} decoded weights differ from the f32 product");
}

/// A GPTQ v2 asymmetric checkpoint, end to end: quantize with f16 scales, write qweight/qzeros, read them
/// back, convert to tinygemm's form and decode from the packed layout: every weight is exactly
/// `(q − z)·s`.
#[test]
fn gptq_checkpoint_to_tinygemm_decodes_exactly() {
    let mut rng = Rng::new(5);
    let (n, k) = (80, 576);
    let w = rng.weights(n, k);
    let q = quantize_integer_zero(&w, n, k, GroupSize::G128, ScaleSearch::Shrink, ParamPrecision::F16).unwrap();
    let groups = GroupSize::G128.groups(k);
    let zeros_gn: Vec<u8> =
        (0..groups * n).map(|i| q.zero_points.as_deref().unwrap()[(i % n) * groups + i / n]).collect();
    let scales_gn: Vec<f32> = (0..groups * n).map(|i| q.params.scales()[(i % n) * groups + i / n]).collect();
    let qweight = gptq::pack_qweight(&q.codes).unwrap();
    let qzeros = gptq::pack_qzeros(&zeros_gn, groups, n, ZeroFormat::V2).unwrap();

    let codes: Codes = gptq::unpack_qweight(&qweight, k, n).unwrap();
    let zp = gptq::unpack_qzeros(&qzeros, groups, n, ZeroFormat::V2).unwrap();
    let params = params_from_integer_zeros(n, k, GroupSize::G128, &scales_gn, Some(&zp)).unwrap();
    assert_eq!(params, q.params.clone());
    let packed = tinygemm::pack(&codes, TinygemmBlock::N64).unwrap();
    let m = TinygemmMatrix::new(&packed, n, k, TinygemmBlock::N64).unwrap();
    let mut out = vec![0.0f32; n * k];
    m.decode_k_range(&params, 0..k, &mut out).unwrap();
    for row in 0..n {
        for kk in 0..k {
            let g = kk / 128;
            let exact = (f32::from(q.codes.get(row, kk))
                - f32::from(q.zero_points.as_deref().unwrap()[row * groups + g]))
                * q.params.scales()[row * groups + g];
            assert_eq!(out[row * k + kk], exact, "({row}, {kk})");
        }
    }
    // Symmetric: no zero tensor, every float zero is 0.
    let sym = params_from_integer_zeros(n, k, GroupSize::G128, &scales_gn, None).unwrap();
    assert!(sym.zeros().iter().all(|&z| z == 0.0));
    assert!(params_from_integer_zeros(n, k, GroupSize::G128, &scales_gn[1..], None).is_err());
}

#[test]
fn word_layouts_reject_bad_shapes() {
    let codes = Rng::new(6).codes(16, 12);
    assert_eq!(gptq::pack_qweight(&codes).unwrap_err().kind(), &LayoutErrorKind::KNotMultiple { k: 12, multiple: 8 });
    assert!(matches!(
        gptq::unpack_qweight(&[0; 3], 16, 16).unwrap_err().kind(),
        LayoutErrorKind::LengthMismatch { .. }
    ));
    assert_eq!(
        gptq::pack_qzeros(&[8; 12], 1, 12, ZeroFormat::V2).unwrap_err().kind(),
        &LayoutErrorKind::NNotMultiple { n: 12, multiple: 8 }
    );
    assert!(gptq::pack_awq(&[16; 8], 1, 8).is_err());
    assert!(gptq::pack_qzeros(&[16; 8], 1, 8, ZeroFormat::V2).is_err());
}
