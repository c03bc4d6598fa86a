//! The quantization grids: codes on the grid, extremes kept, search never worse and sometimes better,
//! partial last groups, stored-precision parameters, and clear errors on bad weights.

mod common;

use common::{Rng, snr_db};
use half::{bf16, f16};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric, quantize_integer_zero, quantize_symmetric};
use int4_layout::{GroupSize, LayoutErrorKind};

fn decode_all(q: &int4_layout::grid::QuantMatrix) -> Vec<f32> {
    let (n, k) = (q.codes.n(), q.codes.k());
    (0..n * k).map(|i| q.params.weight(i / k, i % k, q.codes.get(i / k, i % k))).collect()
}

fn sq_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum()
}

#[test]
fn asymmetric_grid_follows_the_tinygemm_convention() {
    let mut rng = Rng::new(1);
    let (n, k) = (16, 256);
    let w = rng.weights(n, k);
    let q = quantize_asymmetric(&w, n, k, GroupSize::G64, ScaleSearch::Off, ParamPrecision::F32).unwrap();
    assert_eq!(q.params.groups(), 4);
    for row in 0..n {
        for g in 0..4 {
            let ws = &w[row * k + g * 64..row * k + g * 64 + 64];
            let lo = ws.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = ws.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let scale = (hi - lo) / 15.0;
            assert_eq!(q.params.scale(row, g), scale);
            assert_eq!(q.params.zero(row, g), lo + 8.0 * scale);
            for (j, &x) in ws.iter().enumerate() {
                let code = q.codes.get(row, g * 64 + j);
                assert_eq!(f32::from(code), ((x - lo) / scale).round_ties_even().clamp(0.0, 15.0));
            }
            // The group's extremes come back (up to the f32 roundings of the zero and the decode).
            let tol = 4.0 * f32::EPSILON * lo.abs().max(hi.abs());
            let deq: Vec<f32> =
                (0..64).map(|j| q.params.weight(row, g * 64 + j, q.codes.get(row, g * 64 + j))).collect();
            let (dlo, dhi) = deq.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
            assert!((dlo - lo).abs() <= tol && (dhi - hi).abs() <= tol, "row {row} group {g}");
        }
    }
}

#[test]
fn scale_search_is_never_worse_per_group_and_helps_on_outliers() {
    let mut rng = Rng::new(2);
    let (n, k) = (64, 512);
    let mut w = rng.weights(n, k);
    for i in (0..n * k).step_by(97) {
        w[i] *= 6.0;
    }
    for precision in [ParamPrecision::F32, ParamPrecision::Bf16] {
        let off = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, precision).unwrap();
        let on = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Shrink, precision).unwrap();
        let (d_off, d_on) = (decode_all(&off), decode_all(&on));
        for row in 0..n {
            for g in 0..4 {
                let r = row * k + g * 128..row * k + g * 128 + 128;
                assert!(sq_err(&w[r.clone()], &d_on[r.clone()]) <= sq_err(&w[r.clone()], &d_off[r]));
            }
        }
        let (s_off, s_on) = (snr_db(&w, &d_off), snr_db(&w, &d_on));
        assert!(s_on > s_off + 0.3, "{precision:?}: search {s_on:.2} dB vs none {s_off:.2} dB");
    }
    let sym_off = quantize_symmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
    let sym_on = quantize_symmetric(&w, n, k, GroupSize::G128, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    assert!(snr_db(&w, &decode_all(&sym_on)) > snr_db(&w, &decode_all(&sym_off)) + 0.3);
}

/// Upstream's 4-bit usefulness bar: weight SNR above 19 dB on Gaussian weights at g64.
#[test]
fn four_bit_error_is_small_enough_to_be_useful() {
    let mut rng = Rng::new(3);
    let (n, k) = (256, 1024);
    let w: Vec<f32> = (0..n * k).map(|_| rng.normal()).collect();
    let q = quantize_asymmetric(&w, n, k, GroupSize::G64, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    let snr = snr_db(&w, &decode_all(&q));
    assert!(snr > 19.0, "SNR {snr:.2} dB");
}

#[test]
fn symmetric_grid_without_search_clips_neither_end() {
    let mut rng = Rng::new(4);
    let (n, k) = (32, 256);
    let w = rng.weights(n, k);
    let q = quantize_symmetric(&w, n, k, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).unwrap();
    let d = decode_all(&q);
    for i in 0..n * k {
        let s = q.params.scale(i / k, (i % k) / 32);
        assert_eq!(q.params.zero(i / k, (i % k) / 32), 0.0);
        assert!((d[i] - w[i]).abs() <= 0.5 * s * (1.0 + 1e-5), "weight {i} clipped: {} -> {}", w[i], d[i]);
    }
}

#[test]
fn integer_zero_grid_represents_zero_exactly_and_stays_in_range() {
    let mut rng = Rng::new(5);
    let (n, k) = (16, 192);
    let mut w = rng.weights(n, k);
    // An all-positive first group: the range is widened to include 0, so its zero point is 0.
    for x in &mut w[..64] {
        *x = x.abs() + 0.5;
    }
    for i in (0..n * k).step_by(13).filter(|&i| i >= 64) {
        w[i] = 0.0;
    }
    for search in [ScaleSearch::Off, ScaleSearch::Shrink] {
        let q = quantize_integer_zero(&w, n, k, GroupSize::G64, search, ParamPrecision::F16).unwrap();
        assert!(q.zero_points.as_deref().unwrap().iter().all(|&z| z <= 15));
        assert!(q.params.scales().iter().all(|&s| f16::from_f32(s).to_f32() == s), "scales must be stored f16 values");
        assert_eq!(q.zero_points.as_deref().unwrap()[0], 0);
        for i in (0..n * k).step_by(13).filter(|&i| i >= 64) {
            let (row, g) = (i / k, (i % k) / 64);
            let z = q.zero_points.as_deref().unwrap()[row * 3 + g];
            let s = q.params.scales()[row * 3 + g];
            assert_eq!((f32::from(q.codes.get(row, i % k)) - f32::from(z)) * s, 0.0, "{search:?} weight {i}");
        }
    }
}

/// SmolLM2's K = 576 at g = 128: five groups, the last of 64, each quantized over its own members, exactly
/// as if that last group were a matrix of its own.
#[test]
fn a_partial_last_group_is_quantized_over_its_own_members() {
    let mut rng = Rng::new(6);
    let (n, k) = (16, 576);
    let w = rng.weights(n, k);
    let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    assert_eq!(q.params.groups(), 5);
    let tail: Vec<f32> = (0..n).flat_map(|r| w[r * k + 512..(r + 1) * k].to_vec()).collect();
    let t = quantize_asymmetric(&tail, n, 64, GroupSize::PerChannel, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    for r in 0..n {
        assert_eq!(q.params.scale(r, 4), t.params.scale(r, 0));
        assert_eq!(q.params.zero(r, 4), t.params.zero(r, 0));
        assert_eq!(&q.codes.row(r)[512..], t.codes.row(r));
    }
}

/// Codes are chosen against the parameters as stored: with bf16 storage the scale and zero are bf16
/// values, and no code could be moved to reduce that weight's error.
#[test]
fn codes_are_chosen_against_the_stored_parameters() {
    let mut rng = Rng::new(7);
    let (n, k) = (16, 128);
    let w = rng.weights(n, k);
    let q = quantize_asymmetric(&w, n, k, GroupSize::G32, ScaleSearch::Shrink, ParamPrecision::Bf16).unwrap();
    for (&s, &z) in q.params.scales().iter().zip(q.params.zeros()) {
        assert_eq!(bf16::from_f32(s).to_f32(), s);
        assert_eq!(bf16::from_f32(z).to_f32(), z);
    }
    for (i, &x) in w.iter().enumerate() {
        let (row, kk) = (i / k, i % k);
        let code = q.codes.get(row, kk);
        let err = |c: u8| (q.params.weight(row, kk, c) - x).abs();
        for other in [code.saturating_sub(1), (code + 1).min(15)] {
            assert!(err(code) <= err(other) * (1.0 + 1e-6) + 1e-7, "weight {i}: code {code} vs {other}");
        }
    }
}

#[test]
fn bad_weights_and_shapes_are_errors() {
    let mut w = vec![0.5f32; 64];
    w[37] = f32::NAN;
    let e = quantize_asymmetric(&w, 2, 32, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).unwrap_err();
    assert_eq!(e.kind(), &LayoutErrorKind::NonFiniteWeight { n: 1, k: 5 });
    w[37] = f32::INFINITY;
    assert!(quantize_symmetric(&w, 2, 32, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).is_err());
    assert!(quantize_integer_zero(&w, 2, 32, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).is_err());
    let e = quantize_asymmetric(&w[..10], 2, 32, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).unwrap_err();
    assert!(matches!(e.kind(), LayoutErrorKind::LengthMismatch { .. }));
    assert!(quantize_asymmetric(&[], 0, 32, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).is_err());
    assert_eq!(
        GroupSize::from_checkpoint(100).unwrap_err().kind(),
        &LayoutErrorKind::UnsupportedGroupSize { size: 100 }
    );
    assert_eq!(GroupSize::from_checkpoint(-1).unwrap(), GroupSize::PerChannel);
    assert_eq!(GroupSize::G128.to_checkpoint(), 128);
    assert_eq!(GroupSize::PerChannel.to_checkpoint(), -1);
}

/// A constant group (max = min) gets the minimum range rather than a zero scale, and decodes to its value.
#[test]
fn a_constant_group_decodes_to_its_value() {
    let w = vec![0.25f32; 64];
    let q = quantize_asymmetric(&w, 1, 64, GroupSize::G64, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    assert!(q.params.scale(0, 0) > 0.0);
    assert!(decode_all(&q).iter().all(|&x| (x - 0.25).abs() < 1e-7));
}
