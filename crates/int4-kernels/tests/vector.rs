//! The runtime's vector primitives (`int4_kernels::vector`), each variant (portable and AVX2 + FMA) against
//! an f64 reference: `exp` to its stated bound over the whole f32 range that matters (very negative inputs
//! give exactly 0, never NaN; overflow gives +∞; NaN stays NaN), on every slice length (the SIMD tails);
//! the softmax numerator and its sum; SiLU·up; RMSNorm; the maximum; and the strided GEMM on every tail of
//! M, N and K, with A read row-major and transposed.

mod common;

use int4_kernels::budget::U_F32;
use int4_kernels::isa::IsaCaps;
use int4_kernels::vector::{EXP_MAX, EXP_MAX_REL_ERROR, EXP_MIN, VectorOps, exp_portable};

/// The variants this process can run, with names.
fn variants() -> Vec<(VectorOps, &'static str)> {
    common::runnable_variants("vector")
        .into_iter()
        .map(|v| (VectorOps::with_caps(&IsaCaps::unrestricted().with_max_level(v.level)), v.name))
        .collect()
}

/// Checks one `exp` result against f64; returns its relative error (0 outside the normal range).
fn check_exp(x: f32, got: f32, name: &str) -> f64 {
    assert!(!got.is_nan() || x.is_nan(), "{name}: exp({x}) is NaN");
    if x.is_nan() {
        assert!(got.is_nan(), "{name}: exp(NaN) = {got}");
        return 0.0;
    }
    if x < EXP_MIN {
        assert_eq!(got, 0.0, "{name}: exp({x}) should flush to 0");
        return 0.0;
    }
    if x > EXP_MAX {
        assert_eq!(got, f32::INFINITY, "{name}: exp({x}) should be +inf");
        return 0.0;
    }
    let want = f64::from(x).exp();
    let err = (f64::from(got) - want).abs();
    if want < f64::from(f32::MIN_POSITIVE) {
        assert!(err <= 2f64.powi(-149), "{name}: exp({x}) = {got:e}, want {want:e} (subnormal result)");
        return 0.0;
    }
    let rel = err / want;
    assert!(rel <= EXP_MAX_REL_ERROR, "{name}: exp({x}) = {got:e}, want {want:e}, relative error {rel:e}");
    rel
}

#[test]
fn exp_is_within_its_bound_from_very_negative_to_overflow() {
    // A dense sweep over [−104, 89.5], every edge value, and inputs the softmax and SiLU meet.
    let mut xs: Vec<f32> = (0..=1_935_000).map(|i| -104.0 + i as f32 * 1e-4).collect();
    xs.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-30,
        -1e-30,
        EXP_MIN,
        EXP_MAX,
        f32::from_bits(EXP_MIN.to_bits() + 1),
        f32::from_bits(EXP_MIN.to_bits() - 1),
        f32::from_bits(EXP_MAX.to_bits() + 1),
        f32::from_bits(EXP_MAX.to_bits() - 1),
        -87.0,
        -88.0,
        -103.9,
        -1e4,
        -1e30,
        f32::MIN,
        f32::MAX,
        1e4,
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        std::f32::consts::LN_2 / 2.0,
        -std::f32::consts::LN_2 / 2.0,
    ]);
    // Every f32 in [−2, 2] with a stride, so the reduction's rounding boundaries are crossed many times.
    xs.extend((0..200_000u32).map(|i| f32::from_bits(0x3f80_0000 + i * 41) - 3.0));
    for (ops, name) in variants() {
        let mut got = xs.clone();
        ops.exp(&mut got);
        let worst = xs.iter().zip(&got).map(|(&x, &y)| check_exp(x, y, name)).fold(0.0, f64::max);
        println!("{name}: exp max relative error {worst:e} ({:.2} ulp)", worst * (1u64 << 23) as f64);
        // The scalar portable function, element by element.
        for &x in xs.iter().step_by(7) {
            check_exp(x, exp_portable(x), "exp_portable");
        }
        // The very negative inputs a masked softmax produces are exactly 0.
        let mut neg = vec![f32::NEG_INFINITY, -1e38, -1000.0, -88.0, -87.4];
        ops.exp(&mut neg);
        assert_eq!(neg, vec![0.0; 5], "{name}");
    }
}

#[test]
fn exp_tails_match_the_full_vector_path() {
    for (ops, name) in variants() {
        for len in 0..40 {
            let xs: Vec<f32> = (0..len).map(|i| (i as f32 * 0.731).sin() * 30.0 - 5.0).collect();
            let mut got = xs.clone();
            ops.exp(&mut got);
            for (&x, &y) in xs.iter().zip(&got) {
                check_exp(x, y, name);
                // The same lane computation whatever the position: compare with a full-length call.
                let mut one = vec![x; 8];
                ops.exp(&mut one);
                assert_eq!(y.to_bits(), one[0].to_bits(), "{name}: len {len}, x {x}");
            }
        }
    }
}

#[test]
fn softmax_exp_matches_f64_and_masks_to_zero() {
    for (ops, name) in variants() {
        for len in [1usize, 2, 7, 8, 9, 15, 16, 17, 64, 100, 513] {
            let mut x: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.9).collect();
            if len > 3 {
                x[1] = f32::NEG_INFINITY; // a masked score
            }
            let scale = 0.125;
            let max = ops.max(&x);
            assert_eq!(max, x.iter().copied().fold(f32::NEG_INFINITY, f32::max), "{name}: max, len {len}");
            let want: Vec<f64> =
                x.iter().map(|&v| ((f64::from(v) - f64::from(max)) * f64::from(scale)).exp()).collect();
            let mut got = x.clone();
            let sum = ops.softmax_exp(&mut got, max, scale);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                // The argument's two roundings (subtract, scale) move it by at most u·|arg| each.
                if w == 0.0 {
                    assert_eq!(g, 0.0, "{name}: len {len}, i {i}");
                    continue;
                }
                let arg = ((f64::from(x[i]) - f64::from(max)) * f64::from(scale)).abs();
                let tol = (EXP_MAX_REL_ERROR + 3.0 * U_F32 * (1.0 + arg)) * w + 2f64.powi(-126);
                assert!((f64::from(g) - w).abs() <= tol, "{name}: len {len}, i {i}: {g} vs {w}");
                assert!(!g.is_nan());
            }
            if len > 3 {
                assert_eq!(got[1], 0.0, "{name}: a −∞ score gives exactly 0");
            }
            let want_sum: f64 = want.iter().sum();
            let tol = (len as f64 + 8.0) * (EXP_MAX_REL_ERROR + U_F32 * 400.0) * want_sum;
            assert!((f64::from(sum) - want_sum).abs() <= tol, "{name}: sum {sum} vs {want_sum}");
            assert!(sum >= 1.0 - 1e-6, "{name}: the largest term is 1");
        }
    }
}

#[test]
fn silu_mul_and_rms_norm_match_f64() {
    for (ops, name) in variants() {
        for len in [0usize, 1, 5, 8, 13, 16, 100, 1536] {
            let g: Vec<f32> = (0..len).map(|i| ((i * 53 % 211) as f32 - 105.0) * 0.2).collect();
            let mut g = g;
            if len > 4 {
                g[0] = -100.0; // exp(100) overflows: silu is −0, not NaN
                g[1] = 100.0;
                g[2] = -1e30;
            }
            let u: Vec<f32> = (0..len).map(|i| (i as f32 * 0.3).cos()).collect();
            let mut out = vec![f32::NAN; len];
            ops.silu_mul(&g, &u, &mut out);
            for i in 0..len {
                let (gv, uv) = (f64::from(g[i]), f64::from(u[i]));
                let want = gv / (1.0 + (-gv).exp()) * uv;
                let tol = (EXP_MAX_REL_ERROR + 4.0 * U_F32) * want.abs() + 1e-30;
                assert!(!out[i].is_nan(), "{name}: silu({}) is NaN", g[i]);
                assert!(
                    (f64::from(out[i]) - want).abs() <= tol,
                    "{name}: silu({})·{} = {} vs {want}",
                    g[i],
                    u[i],
                    out[i]
                );
            }
            if len == 0 {
                continue;
            }
            let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.77).sin() * 3.0).collect();
            let w: Vec<f32> = (0..len).map(|i| 1.0 + (i as f32 * 0.13).cos() * 0.5).collect();
            let eps = 1e-5;
            let mut out = vec![0.0; len];
            ops.rms_norm(&x, &w, eps, &mut out);
            let ms: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / len as f64;
            let r = 1.0 / (ms + f64::from(eps)).sqrt();
            for i in 0..len {
                let want = f64::from(x[i]) * r * f64::from(w[i]);
                let tol = (len as f64 + 12.0) * U_F32 * want.abs() + 1e-30;
                assert!((f64::from(out[i]) - want).abs() <= tol, "{name}: rms_norm len {len} i {i}");
            }
        }
    }
}

#[test]
fn gemm_matches_f64_on_every_tail_and_stride() {
    for (ops, name) in variants() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 64, 130),
            (3, 7, 5),
            (5, 17, 64),
            (6, 16, 64),
            (7, 24, 9),
            (13, 33, 64),
            (64, 200, 64),
            (12, 64, 512),
            (4, 0, 3),
            (2, 5, 0),
        ] {
            for transposed in [false, true] {
                // A is m × k, stored row-major with a wider row, or transposed (column-major) with padding.
                let (a_row, a_col, a_len) =
                    if transposed { (1, m + 3, (m + 3) * k.max(1)) } else { (k + 5, 1, m * (k + 5)) };
                let a: Vec<f32> = (0..a_len).map(|i| ((i * 31 % 97) as f32 - 48.0) / 17.0).collect();
                let ldb = n + 3;
                let b: Vec<f32> = (0..k.max(1) * ldb).map(|i| ((i * 19 % 89) as f32 - 44.0) / 13.0).collect();
                let ldc = n + 2;
                let mut c = vec![f32::NAN; m * ldc];
                ops.gemm((m, n, k), &a, a_row, a_col, &b, ldb, &mut c, ldc);
                for i in 0..m {
                    for j in 0..n {
                        let (mut want, mut mag) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let t = f64::from(a[i * a_row + p * a_col]) * f64::from(b[p * ldb + j]);
                            want += t;
                            mag += t.abs();
                        }
                        let got = f64::from(c[i * ldc + j]);
                        let tol = 2.0 * (k as f64 + 2.0) * U_F32 * mag;
                        assert!(
                            (got - want).abs() <= tol,
                            "{name}: {m}×{n}×{k} (transposed A: {transposed}) [{i}][{j}]: {got} vs {want}"
                        );
                    }
                    // Padding columns of C are left alone.
                    for j in n..ldc {
                        assert!(c[i * ldc + j].is_nan(), "{name}: gemm wrote outside its columns");
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "B is too short")]
fn gemm_rejects_a_short_operand() {
    let ops = VectorOps::new();
    let mut c = vec![0.0; 4];
    ops.gemm((2, 2, 3), &[0.0; 6], 3, 1, &[0.0; 5], 2, &mut c, 2);
}

/// The AVX-512 GEMM (16 columns per register) gives the AVX2 one's bits: each output is the same FMA chain
/// over `p`, whatever the register width. Shapes cover every column tile (64, 32, 16, 8) and single columns.
#[test]
fn gemm_gives_the_same_bits_at_every_vector_width() {
    let vector: Vec<(VectorOps, &str)> = variants().into_iter().filter(|(ops, _)| ops.is_avx2()).collect();
    for &(m, n, k) in &[(1, 64, 130), (5, 17, 64), (7, 125, 9), (13, 200, 64), (3, 64, 2500), (6, 121, 33)] {
        let (a_row, a_col) = (1, m + 3);
        let a: Vec<f32> = (0..(m + 3) * k).map(|i| ((i * 31 % 97) as f32 - 48.0) / 17.0).collect();
        let ldb = n + 3;
        let b: Vec<f32> = (0..k * ldb).map(|i| ((i * 19 % 89) as f32 - 44.0) / 13.0).collect();
        let results: Vec<Vec<u32>> = vector
            .iter()
            .map(|(ops, _)| {
                let mut c = vec![f32::NAN; m * n];
                ops.gemm((m, n, k), &a, a_row, a_col, &b, ldb, &mut c, n);
                c.iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        for (r, (_, name)) in results.iter().zip(&vector).skip(1) {
            assert!(r == &results[0], "{name} differs from {} on {m}×{n}×{k}", vector[0].1);
        }
    }
}
