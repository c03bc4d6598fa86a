//! W4A8: every kernel variant (portable, AVX2, AVX-512 VNNI, the AMX tiling on the tile emulator and on
//! hardware where present) bit-exact against the scalar reference, integer sums and the f32 epilogue
//! alike; symmetric, asymmetric integer and float zero points; activations scaled per token and per
//! group; tails in M, N and K; every group size; bias on and off;
//! thread-count invariance; clear errors for tile-configuration mistakes, bad weights and forced kernels
//! the CPU lacks; and the output's fidelity against the f64 reference on the dequantized weights.

mod common;

use common::Rng;
use int4_kernels::choice::{self, BoundKernels};
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::reference;
use int4_kernels::tile::{TileConfig, TileEmulator, TileError, TileUnit};
use int4_kernels::w4a8::{
    ActivationScales, ParamTable, ParamType, QuantizedActivations, TableBytes, W4A8Kernel, W4A8Linear, W4A8Weights,
    gemm, gemm_tiles, quantize_activations,
};
use int4_kernels::{KernelErrorKind, KernelId};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric, quantize_integer_zero, quantize_symmetric};
use int4_layout::{Codes, GroupSize};

fn transpose_gn<T: Copy>(v: &[T], n: usize, groups: usize) -> Vec<T> {
    (0..groups * n).map(|i| v[(i % n) * groups + i / n]).collect()
}

/// The hardware kernels this build has, by level.
const LEVELS: [(IsaLevel, &str); 4] = [
    (IsaLevel::Portable, "portable"),
    (IsaLevel::Avx2, "avx2"),
    (IsaLevel::Avx512, "avx512-vnni"),
    (IsaLevel::Amx, "amx"),
];

/// The W4A8 kernels this process can run; the rest are reported as skipped (a failure under
/// `INT4_TEST_EVERYTHING=1`).
fn runnable_kernels(test: &str) -> Vec<(BoundKernels, &'static str)> {
    let everything = std::env::var("INT4_TEST_EVERYTHING").is_ok_and(|v| v == "1");
    let mut out = Vec::new();
    for (level, name) in LEVELS {
        match choice::at_level(W4A8Kernel::spec(), level, IsaCaps::process()) {
            Ok(k) => out.push((k, name)),
            Err(e) => {
                let msg = format!("{test}: SKIPPED w4a8 variant {name} ({e})");
                assert!(!everything, "{msg}, and INT4_TEST_EVERYTHING=1 forbids skips");
                eprintln!("{msg}");
                common::record_skip(&msg);
            }
        }
    }
    out
}

/// The AMX-INT8 token, for running the tiling on the hardware tiles beside the emulator; where this process
/// has none, `test` reports the variant as skipped (a failure under `INT4_TEST_EVERYTHING=1`).
#[cfg(target_arch = "x86_64")]
fn hardware_tiles(test: &str) -> Option<int4_kernels::isa::AmxInt8> {
    let tok = int4_kernels::isa::AmxInt8::new();
    if tok.is_none() {
        common::report_skip(test, "amx (hardware tiles, every row count)");
    }
    tok
}

/// How a test layer's zero points are held.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Zeros {
    /// Symmetric: every zero point is 8.
    Symmetric,
    /// Asymmetric integer zero points (GPTQ `sym: false`).
    Integer,
    /// Float zeros (`cpu_int4`, GGUF Q4_1): zero point 8 plus a float offset.
    Float,
    /// Both an integer zero point and a float offset, which the format holds though no checkpoint kind
    /// makes it: every kernel's epilogue has the case.
    IntegerAndFloat,
}

const ZERO_KINDS: [Zeros; 4] = [Zeros::Symmetric, Zeros::Integer, Zeros::Float, Zeros::IntegerAndFloat];

/// A test layer: codes, `[G][N]` scales, integer zero points and float offsets.
struct Layer {
    codes: Codes,
    scales: Vec<f32>,
    zeros: Option<Vec<u8>>,
    offsets: Option<Vec<f32>>,
}

impl Layer {
    fn pack(&self, group: GroupSize) -> W4A8Weights {
        W4A8Weights::pack(&self.codes, &self.scales, self.zeros.as_deref(), self.offsets.as_deref(), group).unwrap()
    }

    /// The scalar reference for activations `a` and bias `b`.
    fn reference(&self, a: &QuantizedActivations, g_len: usize, bias: Option<&[f32]>) -> Vec<f32> {
        reference::w4a8(&reference::W4a8Operands {
            xq: &a.data,
            m: a.m,
            k_padded: a.k_padded,
            a_scales: &a.scales,
            codes: &self.codes,
            scales_gn: &self.scales,
            zero_points_gn: self.zeros.as_deref(),
            offsets_gn: self.offsets.as_deref(),
            g_len,
            bias,
        })
    }
}

/// A test layer of `zeros`' kind, with every third group's scale negated (half of a real Q4_0 file's blocks
/// have a negative `d`: a kernel must not assume a sign).
fn layer(rng: &mut Rng, n: usize, k: usize, group: GroupSize, zeros: Zeros) -> Layer {
    let mut layer = layer_of_positive_scales(rng, n, k, group, zeros);
    for (i, s) in layer.scales.iter_mut().enumerate() {
        if i % 3 == 1 {
            *s = -*s;
        }
    }
    layer
}

fn layer_of_positive_scales(rng: &mut Rng, n: usize, k: usize, group: GroupSize, zeros: Zeros) -> Layer {
    let w = rng.weights(n, k);
    let g = group.groups(k);
    match zeros {
        Zeros::Integer | Zeros::IntegerAndFloat => {
            let q = quantize_integer_zero(&w, n, k, group, ScaleSearch::Shrink, ParamPrecision::F16).unwrap();
            let offsets =
                (zeros == Zeros::IntegerAndFloat).then(|| (0..g * n).map(|_| 0.02 * rng.unit() - 0.01).collect());
            Layer {
                codes: q.codes.clone(),
                scales: transpose_gn(q.params.scales(), n, g),
                zeros: Some(transpose_gn(q.zero_points.as_deref().unwrap(), n, g)),
                offsets,
            }
        }
        Zeros::Symmetric => {
            let q = quantize_symmetric(&w, n, k, group, ScaleSearch::Shrink, ParamPrecision::F16).unwrap();
            Layer { codes: q.codes.clone(), scales: transpose_gn(q.params.scales(), n, g), zeros: None, offsets: None }
        }
        Zeros::Float => {
            let q = quantize_asymmetric(&w, n, k, group, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
            Layer {
                codes: q.codes.clone(),
                scales: transpose_gn(q.params.scales(), n, g),
                zeros: None,
                offsets: Some(transpose_gn(q.params.zeros(), n, g)),
            }
        }
    }
}

#[test]
fn every_kernel_is_bit_exact_against_the_reference() {
    let kernels = runnable_kernels("every_kernel_is_bit_exact_against_the_reference");
    #[cfg(target_arch = "x86_64")]
    let amx = hardware_tiles("every_kernel_is_bit_exact_against_the_reference");
    let mut rng = Rng::new(21);
    let mut cases = 0;
    for (n, k, group) in [
        (16, 64, GroupSize::G32),
        (48, 200, GroupSize::G32),
        (80, 576, GroupSize::G128),
        (144, 256, GroupSize::G64),
        (32, 520, GroupSize::G256),
        (16, 100, GroupSize::PerChannel),
        (576, 576, GroupSize::G64),
    ] {
        for zeros in ZERO_KINDS {
            let l = layer(&mut rng, n, k, group, zeros);
            let packed = l.pack(group);
            let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let ms: &[usize] = if n == 576 { &[1, 17, 512] } else { &[1, 2, 3, 4, 5, 16, 17, 40, 50, 64] };
            for &m in ms {
                let x = rng.activations(m, k);
                // Both activation granularities, alternating with M.
                let granularity = if m % 3 == 0 { ActivationScales::PerToken } else { ActivationScales::PerGroup };
                let a = quantize_activations(&x, m, &packed, granularity).unwrap();
                // Every row count with and without a bias: a kernel that sets its outputs from the bias
                // must also set them when there is none (the outputs start as NaN).
                for with_bias in [false, true] {
                    let b = with_bias.then_some(&bias[..]);
                    let want = l.reference(&a, group.len(k), b);
                    // The f32 epilogue against the same integer sums in f64: per group the sums are exact in
                    // i32 and f32 (|sum| < 2²⁴ here), then each term's product of scales and its fused
                    // multiply-add round once, so with t terms per group (1, or 2 with offsets) the error stays
                    // within (2·t·groups + 1)·u_f32 of the magnitudes added.
                    let groups = group.groups(k);
                    let g_len = group.len(k);
                    let terms = if l.offsets.is_some() { 2 } else { 1 };
                    for (i, &got) in want.iter().enumerate() {
                        let (r, c) = (i / n, i % n);
                        let (mut exact, mut mag) =
                            (b.map_or(0.0, |b| f64::from(b[c])), b.map_or(0.0, |b| f64::from(b[c]).abs()));
                        for g in 0..groups {
                            let z = i64::from(l.zeros.as_ref().map_or(8, |z| z[g * n + c]));
                            let span = g * g_len..((g + 1) * g_len).min(k);
                            let x = |kk: usize| i64::from(a.data[r * a.k_padded + kk]);
                            let sum: i64 = span.clone().map(|kk| x(kk) * (i64::from(l.codes.get(c, kk)) - z)).sum();
                            assert!(sum.abs() < 1 << 24, "a group sum this large would round in f32");
                            let a_s = f64::from(a.scales[r * groups + g]);
                            let mut term = sum as f64 * a_s * f64::from(l.scales[g * n + c]);
                            mag += term.abs();
                            if let Some(f) = &l.offsets {
                                let t = span.map(x).sum::<i64>() as f64 * a_s * f64::from(f[g * n + c]);
                                mag += t.abs();
                                term += t;
                            }
                            exact += term;
                        }
                        let budget = (2 * terms * groups + 1) as f64 * int4_kernels::budget::U_F32 * mag;
                        assert!(
                            (f64::from(got) - exact).abs() <= budget,
                            "N={n} K={k} {group:?} M={m} output {i}: {got} vs {exact} (budget {budget:e})"
                        );
                    }
                    let check = |what: &str, out: &[f32]| {
                        assert!(
                            out.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{what}: N={n} K={k} {group:?} {zeros:?} {granularity:?} M={m} bias={with_bias}: \
                         not bit-identical"
                        );
                    };
                    for &(kernel, name) in &kernels {
                        let mut out = vec![f32::NAN; m * n];
                        gemm(W4A8Kernel::for_rows(&kernel, a.m).unwrap(), &a, &packed, b, &mut out).unwrap();
                        check(name, &out);
                    }
                    let mut out = vec![f32::NAN; m * n];
                    gemm_tiles(&TileEmulator::new, &a, &packed, b, &mut out).unwrap();
                    check("tile emulator", &out);
                    // The hardware tiles at each of these row counts, below the dispatch threshold too.
                    #[cfg(target_arch = "x86_64")]
                    if let Some(tok) = amx {
                        let mut out = vec![f32::NAN; m * n];
                        gemm_tiles(&|| int4_kernels::AmxTiles::new(tok), &a, &packed, b, &mut out).unwrap();
                        check("hardware tiles", &out);
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, (6 * 10 + 3) * ZERO_KINDS.len() * 2);
}

/// The result does not depend on how many threads split N.
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(23);
    let (n, k, m) = (160, 384, 9);
    let packed = layer(&mut rng, n, k, GroupSize::G128, Zeros::Float).pack(GroupSize::G128);
    let x = rng.activations(m, k);
    for (kernel, name) in runnable_kernels("results_do_not_depend_on_the_thread_count") {
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let l = W4A8Linear::with_kernels(packed.clone(), None, kernel).unwrap();
                let mut out = vec![f32::NAN; m * n];
                l.forward(&x, m, &mut out).unwrap();
                out
            })
        };
        let one = run(1);
        assert!(one.iter().all(|v| v.is_finite()), "{name}: an output was left unwritten (NaN) or overflowed");
        for t in [2, 3, 7] {
            assert!(run(t).iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: {t} threads differ");
        }
    }
}

/// Decode rows of several sequences run in one call on the kernel one row runs, and each gets the bits it
/// gets alone — past the AMX threshold too, where a prefill call of as many rows takes the tiles — for
/// every zero kind and both activation granularities.
#[test]
fn decode_rows_in_one_call_get_the_bits_each_gets_alone() {
    let mut rng = Rng::new(29);
    let (n, k, group) = (96, 320, GroupSize::G64);
    for zeros in ZERO_KINDS {
        let packed = layer(&mut rng, n, k, group, zeros).pack(group);
        let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        for (kernel, name) in runnable_kernels("decode_rows_in_one_call_get_the_bits_each_gets_alone") {
            for granularity in [ActivationScales::PerGroup, ActivationScales::PerToken] {
                let l = W4A8Linear::with_kernels(packed.clone(), Some(bias.clone()), kernel)
                    .unwrap()
                    .with_activation_scales(granularity);
                for m in [2, 17, int4_kernels::w4a8::AMX_MIN_ROWS + 1] {
                    let x = rng.activations(m, k);
                    let mut together = vec![f32::NAN; m * n];
                    let ran = l.forward_decode(&x, m, &mut together).unwrap();
                    assert_eq!(ran, l.kernel_for(1), "{name}: decode rows run the one-row kernel");
                    for r in 0..m {
                        let mut alone = vec![f32::NAN; n];
                        l.forward(&x[r * k..(r + 1) * k], 1, &mut alone).unwrap();
                        assert!(
                            alone.iter().zip(&together[r * n..(r + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{name} {zeros:?} {granularity:?}: row {r} of {m} differs from the row alone"
                        );
                    }
                }
            }
        }
    }
}

/// Activation quantization: ties to even, ±127, zero rows, NaN, K padding with zeros, per-group sums;
/// one scale per row, or one per group.
#[test]
fn activations_quantize_per_token_with_one_rounding_rule() {
    let codes = Codes::new(16, 40, vec![0; 16 * 40]).unwrap();
    let w = W4A8Weights::pack(&codes, &[1.0; 2 * 16], None, None, GroupSize::G32).unwrap();
    assert_eq!((w.k_padded(), w.groups()), (64, 2));
    let per_token = ActivationScales::PerToken;
    let mut x = vec![0.0f32; 40];
    x[..8].copy_from_slice(&[127.0, -127.0, 0.5, 1.5, -0.5, 2.5, f32::NAN, 63.5]);
    x[35] = -3.0;
    let a = quantize_activations(&x, 1, &w, per_token).unwrap();
    assert_eq!(a.scales, vec![1.0, 1.0], "one scale per row, repeated per group");
    assert_eq!(&a.data[..8], &[127, -127, 0, 2, 0, 2, 0, 64]);
    assert_eq!(a.data[35], -3);
    assert!(a.data[40..].iter().all(|&b| b == 0), "padding is zero");
    assert_eq!(a.sums, vec![2 + 2 + 64, -3], "127 and -127 cancel; NaN counts as 0");
    let z = quantize_activations(&[0.0; 80], 2, &w, per_token).unwrap();
    assert!(z.data.iter().all(|&v| v == 0) && z.scales == vec![1.0; 4]);
    // Per group, the second group (k = 32..40) is scaled by its own maximum, 3: -3 becomes -127.
    let a = quantize_activations(&x, 1, &w, ActivationScales::PerGroup).unwrap();
    assert_eq!(a.scales, vec![1.0, 3.0 / 127.0]);
    assert_eq!(&a.data[..8], &[127, -127, 0, 2, 0, 2, 0, 64]);
    assert_eq!(a.data[35], -127);
    assert_eq!(a.sums, vec![68, -127]);
    // A scale that is not a power of two: every value lands on round(x/scale), clamped to ±127.
    let y: Vec<f32> = (0..40).map(|i| (i as f32 - 20.0) * 0.37).collect();
    for granularity in [per_token, ActivationScales::PerGroup] {
        let a = quantize_activations(&y, 1, &w, granularity).unwrap();
        for (i, &v) in y.iter().enumerate() {
            let g = i / 32;
            let amax = if granularity == per_token { 20.0f32 * 0.37 } else { [20.0f32 * 0.37, 19.0 * 0.37][g] };
            let s = amax / 127.0;
            assert_eq!(a.scales[g], s, "{granularity:?} group {g}");
            assert_eq!(i32::from(a.data[i]), (v / s).round_ties_even().clamp(-127.0, 127.0) as i32, "k = {i}");
        }
    }
    assert!(quantize_activations(&[1.0; 39], 1, &w, per_token).is_err());
}

/// Bad weights are refused with a clear error; a stored layer reads back identically.
#[test]
fn packing_checks_its_inputs_and_round_trips() {
    let codes = Codes::from_fn(32, 72, |r, k| ((r * 7 + k * 3) % 16) as u8).unwrap();
    let g = GroupSize::G32.groups(72);
    let scales: Vec<f32> = (0..g * 32).map(|i| 0.01 * (1 + i % 5) as f32).collect();
    let zeros: Vec<u8> = (0..g * 32).map(|i| (i % 16) as u8).collect();
    let offsets: Vec<f32> = (0..g * 32).map(|i| -0.05 * (i % 7) as f32).collect();
    let w = W4A8Weights::pack(&codes, &scales, Some(&zeros), Some(&offsets), GroupSize::G32).unwrap();
    for r in 0..32 {
        for kk in 0..72 {
            assert_eq!(w.code(r, kk), codes.get(r, kk));
        }
        let mut row = vec![0.0; 72];
        w.decode_row(r, &mut row).unwrap();
        for (kk, &v) in row.iter().enumerate() {
            let gi = kk / 32;
            let q = f32::from(codes.get(r, kk)) - f32::from(zeros[gi * 32 + r]);
            assert_eq!(v, q.mul_add(scales[gi * 32 + r], offsets[gi * 32 + r]));
        }
    }
    // Tenths are not f16 values: both tables are held in f32.
    assert_eq!((w.scales().ty(), w.offsets().map(ParamTable::ty)), (ParamType::F32, Some(ParamType::F32)));
    let back = W4A8Weights::from_parts(
        w.packed().clone(),
        w.scales().to_bytes(),
        w.zeros().cloned(),
        w.offsets().map(ParamTable::to_bytes),
        (32, 72, GroupSize::G32),
    )
    .unwrap();
    assert_eq!(back.packed()[..], w.packed()[..]);
    assert_eq!(back.scales(), w.scales());
    assert_eq!(back.offsets(), w.offsets());
    assert_eq!(
        (back.scales_gn(), back.zeros_gn(), back.offsets_gn()),
        (scales.clone(), Some(zeros.clone()), Some(offsets.clone()))
    );
    // The parameters come back in their channels and groups (stored in block order, read per channel).
    for r in 0..32 {
        for gi in 0..3 {
            assert_eq!(back.scale(gi, r), scales[gi * 32 + r]);
            assert_eq!(back.zero(gi, r), zeros[gi * 32 + r]);
            assert_eq!(back.offset(gi, r), offsets[gi * 32 + r]);
        }
    }

    let err = |r: Result<W4A8Weights, int4_kernels::KernelError>| r.unwrap_err().to_string();
    let odd = Codes::from_fn(24, 72, |_, _| 0).unwrap();
    let pack = |scales: &[f32], zeros: Option<&[u8]>, offsets: Option<&[f32]>| {
        W4A8Weights::pack(&codes, scales, zeros, offsets, GroupSize::G32)
    };
    assert!(err(W4A8Weights::pack(&odd, &vec![1.0; g * 24], None, None, GroupSize::G32)).contains("multiple of 16"));
    let mut bad_zero = zeros.clone();
    bad_zero[5] = 16;
    assert!(err(pack(&scales, Some(&bad_zero), None)).contains("zero point is 16"));
    assert!(err(pack(&scales[1..], None, None)).contains("scale"));
    assert!(err(pack(&scales, None, Some(&offsets[1..]))).contains("offsets"));
    let mut bad_offset = offsets.clone();
    bad_offset[3] = f32::NAN;
    assert!(err(pack(&scales, None, Some(&bad_offset))).contains("offsets must be finite"));
    assert!(
        err(W4A8Weights::from_parts(
            w.packed()[..100].to_vec().into(),
            w.scales().to_bytes(),
            None,
            None,
            (32, 72, GroupSize::G32)
        ))
        .contains("packed")
    );
    let short = TableBytes { ty: ParamType::F16, bytes: w.scales().to_bytes().bytes[..g * 32 * 2 + 2].to_vec().into() };
    let e = err(W4A8Weights::from_parts(w.packed().clone(), short, None, None, (32, 72, GroupSize::G32)));
    assert!(e.contains("scale bytes"), "{e}");
}

/// Tables whose every value is an f16 (GGUF's scales and offsets are) are held in 16 bits, read back as
/// stored, and give every kernel the bits the same layer gets from f32 tables of the same values: one
/// value in a table that f16 cannot hold keeps that table in f32.
#[test]
fn parameter_tables_of_f16_values_are_held_in_16_bits_with_the_same_results() {
    let mut rng = Rng::new(41);
    let (n, k, m) = (48, 160, 9);
    let codes = Codes::from_fn(n, k, |r, kk| ((r * 5 + kk * 11 + r * kk) % 16) as u8).unwrap();
    let g = GroupSize::G32.groups(k);
    let half = |v: f32| half::f16::from_f32(v).to_f32();
    let scales: Vec<f32> = (0..g * n).map(|_| half(0.001 + 0.05 * rng.unit())).collect();
    let zeros: Vec<u8> = (0..g * n).map(|i| (i * 7 % 16) as u8).collect();
    let offsets: Vec<f32> = (0..g * n).map(|_| half(0.4 * rng.unit() - 0.2)).collect();
    let x = rng.activations(m, k);
    for (zeros, offsets) in [(None, None), (Some(&zeros[..]), None), (None, Some(&offsets[..]))] {
        let w16 = W4A8Weights::pack(&codes, &scales, zeros, offsets, GroupSize::G32).unwrap();
        assert_eq!(w16.scales().ty(), ParamType::F16);
        assert_eq!(w16.offsets().map(ParamTable::ty), offsets.map(|_| ParamType::F16));
        // One scale f16 cannot hold keeps the scales in f32; the offsets stay f16.
        let mut wide = scales.clone();
        wide[7] = 0.1;
        let w32 = W4A8Weights::pack(&codes, &wide, zeros, offsets, GroupSize::G32).unwrap();
        assert_eq!(w32.scales().ty(), ParamType::F32);
        assert_eq!(w32.offsets().map(ParamTable::ty), offsets.map(|_| ParamType::F16));
        // The same values held in f32 throughout: read back from f32 sections.
        let f32_table = |t: &ParamTable| TableBytes {
            ty: ParamType::F32,
            bytes: t.to_f32_vec().iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into(),
        };
        let dims = (n, k, GroupSize::G32);
        let wf = W4A8Weights::from_parts(
            w16.packed().clone(),
            f32_table(w16.scales()),
            w16.zeros().cloned(),
            w16.offsets().map(f32_table),
            dims,
        )
        .unwrap();
        assert_eq!(wf.scales().ty(), ParamType::F32);
        let back = W4A8Weights::from_parts(
            w16.packed().clone(),
            w16.scales().to_bytes(),
            w16.zeros().cloned(),
            w16.offsets().map(ParamTable::to_bytes),
            dims,
        )
        .unwrap();
        assert_eq!(back.scales(), w16.scales());
        assert_eq!(back.scales_gn(), scales);
        assert_eq!(w16.resident_bytes() + g * n * 2 * (1 + usize::from(offsets.is_some())), wf.resident_bytes());
        let a = quantize_activations(&x, m, &w16, ActivationScales::PerGroup).unwrap();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (kernels, name) in runnable_kernels("parameter_tables_of_f16_values") {
            // Every row count up to m, so each rows-per-pass variant reads the f16 tables.
            for rows in 1..=m {
                let kernel = W4A8Kernel::for_rows(&kernels, rows).unwrap();
                let a = quantize_activations(&x[..rows * k], rows, &w16, ActivationScales::PerGroup).unwrap();
                let mut want = vec![f32::NAN; rows * n];
                gemm(kernel, &a, &wf, None, &mut want).unwrap();
                let mut got = vec![f32::NAN; rows * n];
                gemm(kernel, &a, &back, None, &mut got).unwrap();
                let what = format!("{name}, {rows} rows, zeros {}, offsets {}", zeros.is_some(), offsets.is_some());
                assert_eq!(bits(&got), bits(&want), "{what}");
                assert!(got.iter().all(|v| v.is_finite()) && got.iter().any(|&v| v != 0.0), "{what}");
            }
            // The AMX tiling, on the emulator, reads them too.
            let mut want = vec![f32::NAN; m * n];
            gemm_tiles(&TileEmulator::new, &a, &wf, None, &mut want).unwrap();
            let mut got = vec![f32::NAN; m * n];
            gemm_tiles(&TileEmulator::new, &a, &back, None, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want), "{name}: the AMX tiling on the emulator");
            assert!(got.iter().all(|v| v.is_finite()), "{name}: the AMX tiling left outputs unset");
        }
    }
}

/// A forced kernel the CPU lacks is a clear error, never SIGILL; the best kernel reports its name.
#[test]
fn a_forced_kernel_the_cpu_lacks_is_an_error() {
    let portable = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
    for level in [IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Amx] {
        let e = choice::at_level(W4A8Kernel::spec(), level, &portable).unwrap_err();
        assert!(matches!(e.kind(), KernelErrorKind::Unavailable { .. }), "{e}");
    }
    assert_eq!(choice::best(W4A8Kernel::spec(), &portable).unwrap().for_rows(1), KernelId::W4a8Portable);
    // The AMX kernel is only built from a live check of this CPU (under no cap, whatever the process's).
    let unrestricted = IsaCaps::unrestricted();
    let amx = choice::at_level(W4A8Kernel::spec(), IsaLevel::Amx, &unrestricted);
    assert_eq!(
        amx.is_ok(),
        int4_kernels::isa::Feature::AmxInt8.detected()
            && int4_kernels::isa::Avx512Vnni::with_caps(&unrestricted).is_some()
    );
    if let Ok(k) = amx {
        let from = int4_kernels::w4a8::AMX_MIN_ROWS;
        assert_eq!((k.for_rows(from - 1), k.for_rows(from)), (KernelId::W4a8Vnni, KernelId::W4a8Amx));
    }
}

/// The ISA matrix in one process: under each cap (portable; AVX2; AVX-512 without VNNI; AVX-512; no cap)
/// dispatch takes the fastest kernel that both the cap and the live CPU allow, never one above the cap,
/// and its layer output is bit-identical to the reference. On the emulated AVX-512 CPU this is where
/// "AVX-512 without VNNI" is shown to fall back to the AVX2 kernel.
#[test]
fn every_isa_cap_dispatches_to_the_best_kernel_it_allows_bit_exactly() {
    use int4_kernels::isa::Feature;
    let mut rng = Rng::new(43);
    // Enough rows for the AMX tiles, where the CPU has them: four passes of a full row tile, then eight rows.
    let (n, k, m, group) = (80, 200, int4_kernels::w4a8::AMX_MIN_ROWS + 8, GroupSize::G64);
    let l = layer(&mut rng, n, k, group, Zeros::Float);
    let packed = l.pack(group);
    let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let x = rng.activations(m, k);
    let a = quantize_activations(&x, m, &packed, ActivationScales::default()).unwrap();
    let want = l.reference(&a, 64, Some(&bias));
    let live = IsaCaps::unrestricted();
    let detected = |f: Feature| f.detected();
    let vnni = detected(Feature::Avx2) && detected(Feature::Avx512) && detected(Feature::Avx512Vnni);
    let amx = vnni && int4_kernels::isa::Feature::AmxInt8.detected();
    let matrix = [
        ("portable", live.with_max_level(IsaLevel::Portable), KernelId::W4a8Portable),
        ("avx2", live.with_max_level(IsaLevel::Avx2), KernelId::W4a8Avx2),
        ("avx512 without vnni", live.with_max_level(IsaLevel::Avx512).without(Feature::Avx512Vnni), KernelId::W4a8Avx2),
        ("avx512", live.with_max_level(IsaLevel::Avx512), KernelId::W4a8Vnni),
        ("no cap", live, KernelId::W4a8Amx),
    ];
    for (name, caps, ceiling) in matrix {
        // The fastest kernel at or below the cap's ceiling that this CPU has.
        let ladder = [KernelId::W4a8Amx, KernelId::W4a8Vnni, KernelId::W4a8Avx2, KernelId::W4a8Portable];
        let has = |id: KernelId| match id {
            KernelId::W4a8Amx => amx,
            KernelId::W4a8Vnni => vnni,
            KernelId::W4a8Avx2 => detected(Feature::Avx2) && detected(Feature::Fma),
            _ => true,
        };
        let expected = ladder.into_iter().skip_while(|&id| id != ceiling).find(|&id| has(id)).unwrap();
        let kernel = choice::best(W4A8Kernel::spec(), &caps).unwrap();
        assert_eq!(kernel.for_rows(m), expected, "cap {name}");
        let mut out = vec![f32::NAN; m * n];
        W4A8Linear::with_kernels(packed.clone(), Some(bias.clone()), kernel).unwrap().forward(&x, m, &mut out).unwrap();
        assert!(out.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "cap {name}: {expected:?} differs");
        eprintln!("cap {name}: {}", expected.name());
    }
}

/// Activations that do not fit the weights are an error on every kernel and on the AMX tiling over either
/// tile unit, never a panic: a row length, a data length, and scales for the wrong number of groups.
#[test]
fn activations_that_do_not_fit_are_errors_on_every_kernel() {
    let mut rng = Rng::new(41);
    let (n, k, group) = (32, 64, GroupSize::G32);
    let packed = layer(&mut rng, n, k, group, Zeros::Float).pack(group);
    let x = rng.activations(70, k);
    let good = quantize_activations(&x, 70, &packed, ActivationScales::PerGroup).unwrap();
    let mut bad = Vec::new();
    let mut a = good.clone();
    a.k_padded += 32;
    bad.push(("row length", a));
    let mut a = good.clone();
    a.data.pop();
    bad.push(("data", a));
    let mut a = good.clone();
    a.scales.push(1.0);
    a.sums.push(0);
    bad.push(("scales", a));
    for (what, a) in &bad {
        let mut out = vec![0.0f32; a.m * n];
        for (kernels, name) in runnable_kernels("activations_that_do_not_fit") {
            let kernel = W4A8Kernel::for_rows(&kernels, a.m).unwrap();
            assert!(gemm(kernel, a, &packed, None, &mut out).is_err(), "{name}: {what}");
        }
        assert!(gemm_tiles(&TileEmulator::new, a, &packed, None, &mut out).is_err(), "emulated tiles: {what}");
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = hardware_tiles("activations_that_do_not_fit") {
            let unit = || int4_kernels::AmxTiles::new(tok);
            assert!(gemm_tiles(&unit, a, &packed, None, &mut out).is_err(), "hardware tiles: {what}");
        }
    }
}

/// The hardware tile unit's TDPBUSD, TDPBSUD and TDPBSSD give the emulator's sums, which follow the
/// definitions (the test below), on full 16 × 64 tiles whose accumulators start near the i32 limits so
/// some sums wrap.
#[cfg(target_arch = "x86_64")]
#[test]
fn hardware_tile_dot_products_match_the_emulator() {
    let Some(tok) = hardware_tiles("hardware_tile_dot_products") else { return };
    let a: Vec<u8> = (0..16 * 64).map(|i| (i * 53 + 7) as u8).collect();
    let b: Vec<u8> = (0..16 * 64).map(|i| (i * 97 + 201) as u8).collect();
    let start: Vec<u8> = (0..16 * 16)
        .flat_map(|i: i32| [i32::MAX - 3 * i, i32::MIN + 5 * i, 7 * i - 900, -11 * i][i as usize % 4].to_le_bytes())
        .collect();
    let run = |unit: &mut dyn TileUnit, op: usize| {
        let cfg = TileConfig::new().with_tile(0, 16, 64).with_tile(4, 16, 64).with_tile(6, 16, 64);
        unit.load_config(&cfg).unwrap();
        unit.load(0, &start, 64).unwrap();
        unit.load(4, &a, 64).unwrap();
        unit.load(6, &b, 64).unwrap();
        match op {
            0 => unit.dpbusd(0, 4, 6).unwrap(),
            1 => unit.dpbsud(0, 4, 6).unwrap(),
            _ => unit.dpbssd(0, 4, 6).unwrap(),
        }
        let mut out = vec![0u8; 16 * 64];
        unit.store(0, &mut out, 64).unwrap();
        unit.release();
        out
    };
    for (op, name) in ["TDPBUSD", "TDPBSUD", "TDPBSSD"].into_iter().enumerate() {
        let want = run(&mut TileEmulator::new(), op);
        let got = run(&mut int4_kernels::AmxTiles::new(tok), op);
        assert_eq!(got, want, "{name}");
        assert_ne!(want, start, "{name} changed the accumulators");
    }
}

/// Tile-configuration mistakes give errors, never a wrong answer.
#[test]
fn tile_configuration_mistakes_are_errors() {
    let mut t = TileEmulator::new();
    assert_eq!(t.dpbusd(0, 1, 2), Err(TileError::NotConfigured));
    assert_eq!(t.zero(0), Err(TileError::NotConfigured));
    let bad_palette = TileConfig { palette: 2, ..TileConfig::new() };
    assert!(matches!(t.load_config(&bad_palette), Err(TileError::BadConfig(_))));
    assert!(matches!(t.load_config(&TileConfig::new().with_tile(0, 17, 64)), Err(TileError::BadConfig(_))));
    assert!(matches!(t.load_config(&TileConfig::new().with_tile(0, 4, 65)), Err(TileError::BadConfig(_))));
    // A configuration whose shapes do not fit TDPBUSD.
    t.load_config(&TileConfig::new().with_tile(0, 4, 64).with_tile(1, 4, 64).with_tile(2, 8, 64)).unwrap();
    assert!(matches!(t.dpbusd(0, 1, 2), Err(TileError::ShapeMismatch(_))));
    assert!(matches!(t.dpbsud(0, 1, 2), Err(TileError::ShapeMismatch(_))));
    assert!(matches!(t.dpbusd(0, 0, 2), Err(TileError::ShapeMismatch(_))));
    assert_eq!(t.zero(5), Err(TileError::BadTile(5)));
    assert_eq!(t.zero(9), Err(TileError::BadTile(9)));
    assert!(matches!(t.load(1, &[0u8; 100], 64), Err(TileError::OutOfBounds(_))));
    // After release, nothing runs until a configuration is loaded again.
    t.release();
    assert_eq!(t.load(0, &[0u8; 4096], 64), Err(TileError::NotConfigured));
    // The memory image of LDTILECFG.
    let img = TileConfig::new().with_tile(1, 16, 64).to_bytes();
    assert_eq!((img[0], img[18], img[19], img[49]), (1, 64, 0, 16));
}

/// The emulator's TDPBUSD, TDPBSUD and TDPBSSD against the instructions' definitions, with wrapping i32
/// accumulation.
#[test]
fn tile_dot_products_follow_their_definitions_and_wrap() {
    let a: Vec<u8> = (0..16).map(|i| (i * 17 + 3) as u8).collect();
    let b: Vec<u8> = (0..16).map(|i| (i * 29 + 200) as u8).collect();
    let start: Vec<u8> = [i32::MAX - 5, 7, -3, i32::MIN + 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    for (a_signed, b_signed) in [(false, true), (true, false), (true, true)] {
        let mut t = TileEmulator::new();
        t.load_config(&TileConfig::new().with_tile(0, 2, 8).with_tile(1, 2, 8).with_tile(2, 2, 8)).unwrap();
        t.load(0, &start, 8).unwrap();
        t.load(1, &a, 8).unwrap();
        t.load(2, &b, 8).unwrap();
        match (a_signed, b_signed) {
            (false, true) => t.dpbusd(0, 1, 2).unwrap(),
            (true, false) => t.dpbsud(0, 1, 2).unwrap(),
            _ => t.dpbssd(0, 1, 2).unwrap(),
        }
        let mut out = vec![0u8; 16];
        t.store(0, &mut out, 8).unwrap();
        let byte = |v: u8, signed: bool| if signed { i32::from(v as i8) } else { i32::from(v) };
        for m in 0..2 {
            for nn in 0..2 {
                let mut want = i32::from_le_bytes(start[m * 8 + 4 * nn..m * 8 + 4 * nn + 4].try_into().unwrap());
                for kk in 0..2 {
                    for i in 0..4 {
                        want = want.wrapping_add(
                            byte(a[m * 8 + 4 * kk + i], a_signed) * byte(b[kk * 8 + 4 * nn + i], b_signed),
                        );
                    }
                }
                let got = i32::from_le_bytes(out[m * 8 + 4 * nn..m * 8 + 4 * nn + 4].try_into().unwrap());
                assert_eq!(got, want, "signed A = {a_signed}, signed B = {b_signed}, m={m} n={nn}");
            }
        }
    }
}

/// The emulator's TDPBF16PS against Intel's definition: pairs of bf16 products added to the f32
/// accumulator in order, each sum rounded to f32, a denormal bf16 input read as zero.
#[test]
fn tile_bf16_dot_product_follows_its_definition() {
    let bf = |v: f32| half::bf16::from_f32(v).to_bits().to_le_bytes();
    let denormal = half::bf16::from_bits(0x0001); // the smallest positive bf16 denormal
    // A: 1 row of 4 bf16 (two K pairs); B: 2 rows (K pairs) × 2 columns of pairs.
    let a: Vec<u8> = [bf(1.5), bf(-2.0), bf(3.0), denormal.to_bits().to_le_bytes()].concat();
    let b: Vec<u8> = [bf(0.25), bf(4.0), bf(1.0), bf(-1.0), bf(0.5), bf(1e30), bf(2.0), bf(8.0)].concat();
    let start: Vec<u8> = [1.0f32, 1e-3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut t = TileEmulator::new();
    t.load_config(&TileConfig::new().with_tile(0, 1, 8).with_tile(1, 1, 8).with_tile(2, 2, 8)).unwrap();
    t.load(0, &start, 8).unwrap();
    t.load(1, &a, 8).unwrap();
    t.load(2, &b, 8).unwrap();
    t.dpbf16ps(0, 1, 2).unwrap();
    let mut out = [0u8; 8];
    t.store(0, &mut out, 8).unwrap();
    let got: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    // Column 0: 1 + 1.5·0.25 + (−2)·4 + 3·0.5 + denormal·1e30 (read as 0).
    let c0 = (((1.0f32 + 1.5 * 0.25) + -2.0 * 4.0) + 3.0 * 0.5) + 0.0;
    // Column 1: 1e-3 + 1.5·1 + (−2)·(−1) + 3·2 + denormal·8 (read as 0).
    let c1 = (((1e-3f32 + 1.5) + 2.0) + 6.0) + 0.0;
    assert_eq!(got, vec![c0, c1]);
    assert_ne!(denormal.to_f32() * 1e30, 0.0, "the denormal is not zero unless flushed");
}

/// Fidelity: W4A8 against the product of the same 4-bit weights with the unquantized activations (f64),
/// i.e. the cost of int8 activations alone, as SNR. Gaussian activations give about 42 dB per token (a
/// uniform 255-level grid over ±3.5σ); one outlier at 20σ per 97 values stretches the per-token scale and
/// costs about 13 dB (29 dB). Scales per group of 128 confine an outlier to its group and gain on both.
#[test]
fn int8_activations_cost_little_against_the_same_four_bit_weights() {
    let mut rng = Rng::new(22);
    let (n, k, m) = (576, 576, 8);
    let w = rng.weights(n, k);
    let q = quantize_integer_zero(&w, n, k, GroupSize::G128, ScaleSearch::Shrink, ParamPrecision::F16).unwrap();
    let g = GroupSize::G128.groups(k);
    let (scales, zps) = (transpose_gn(q.params.scales(), n, g), transpose_gn(q.zero_points.as_deref().unwrap(), n, g));
    let packed = W4A8Weights::pack(&q.codes, &scales, Some(&zps), None, GroupSize::G128).unwrap();
    let fz = q.params.clone();
    let gaussian: Vec<f32> = (0..m * k).map(|_| half::bf16::from_f32(rng.normal()).to_f32()).collect();
    let outliers = rng.activations(m, k);
    for (x, bar, what) in [(gaussian, 35.0, "Gaussian"), (outliers, 25.0, "with outliers")] {
        let exact = reference::w4a16(&x, m, &q.codes, &fz, None);
        let snr = |granularity| {
            let a = quantize_activations(&x, m, &packed, granularity).unwrap();
            let mut out = vec![f32::NAN; m * n];
            gemm(W4A8Kernel::Portable, &a, &packed, None, &mut out).unwrap();
            let signal: f64 = exact.iter().map(|v| v * v).sum();
            let noise: f64 = exact.iter().zip(&out).map(|(a, b)| (a - f64::from(*b)).powi(2)).sum();
            10.0 * (signal / noise).log10()
        };
        let (token, group) = (snr(ActivationScales::PerToken), snr(ActivationScales::PerGroup));
        println!("W4A8 output SNR, activations {what}: {token:.1} dB per token, {group:.1} dB per group of 128");
        assert!(token > bar, "{what}: SNR {token:.1} dB");
        assert!(group > token, "{what}: per-group scales ({group:.1} dB) lose to per-token ({token:.1} dB)");
    }
}

/// Every kernel runs `weights` (signed codes `q` `[N][K]`, scales `d` `[G][N]`) to the bits of one exact
/// integer sum and one multiply-add per group, within the f32 budget of the exact `Σ xq·q·a_s·d` (per-group
/// activation scales), with a bias, at each row count of `ms`.
#[allow(clippy::too_many_arguments)]
fn check_eight_bit_layer(
    weights: &int4_kernels::w4a8::int8::Int8Weights,
    q: &[i8],
    d: &[f32],
    n: usize,
    k: usize,
    group: GroupSize,
    ms: &[usize],
    kernels: &[(BoundKernels, &'static str)],
    rng: &mut Rng,
) {
    use int4_kernels::w4a8::int8::Int8Linear;
    #[cfg(target_arch = "x86_64")]
    let amx = hardware_tiles("check_eight_bit_layer");
    let (g_len, groups) = (group.len(k), group.groups(k));
    let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    for &m in ms {
        let x = rng.activations(m, k);
        let a = quantize_activations(&x, m, weights.lo(), ActivationScales::PerGroup).unwrap();
        // The documented arithmetic: per group the exact `Σ xq·q`, then `out = fma(sum, a_s·d, out)` in f32,
        // groups in K order from the bias.
        let mut want = vec![0.0f32; m * n];
        for (i, out) in want.iter_mut().enumerate() {
            let (r, c) = (i / n, i % n);
            let mut tot = bias[c];
            // Each group rounds twice (the scale product, the multiply-add into a total no larger than the
            // magnitudes summed): (2·groups + 1)·u of the magnitudes, against the exact value.
            let (mut exact, mut mag) = (f64::from(bias[c]), f64::from(bias[c]).abs());
            for g in 0..groups {
                let a_s = a.scales[r * groups + g];
                let sum: i64 = (g * g_len..((g + 1) * g_len).min(k))
                    .map(|kk| i64::from(a.data[r * a.k_padded + kk]) * i64::from(q[c * k + kk]))
                    .sum();
                let sum = i32::try_from(sum).expect("a group's sum fits in i32");
                tot = (sum as f32).mul_add(a_s * d[g * n + c], tot);
                let scale = f64::from(a_s) * f64::from(d[g * n + c]);
                exact += f64::from(sum) * scale;
                mag += f64::from(sum).abs() * scale.abs();
            }
            *out = tot;
            let budget = (2 * groups + 1) as f64 * mag * int4_kernels::budget::U_F32;
            assert!((f64::from(tot) - exact).abs() <= budget, "N={n} M={m} output {i}: {tot} vs {exact}");
        }
        // The AMX tiling, on the emulator (every machine), then every kernel this machine runs.
        let mut out = vec![f32::NAN; m * n];
        int4_kernels::w4a8::int8::gemm_tiles(&TileEmulator::new, &a, weights, Some(&bias), &mut out).unwrap();
        assert!(
            out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "AMX tiles (emulated): N={n} K={k} M={m}: not bit-identical"
        );
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = amx {
            let mut out = vec![f32::NAN; m * n];
            let unit = || int4_kernels::AmxTiles::new(tok);
            int4_kernels::w4a8::int8::gemm_tiles(&unit, &a, weights, Some(&bias), &mut out).unwrap();
            assert!(
                out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "AMX tiles (hardware): N={n} K={k} M={m}: not bit-identical"
            );
        }
        for &(kernel, name) in kernels {
            let l = Int8Linear::with_kernels(weights.clone(), Some(bias.clone()), kernel).unwrap();
            let mut out = vec![f32::NAN; m * n];
            l.forward(&x, m, &mut out).unwrap();
            assert!(
                out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: N={n} K={k} M={m}: not bit-identical"
            );
            // Decode rows in one call: the same bits, on the one-row kernel.
            let mut out = vec![f32::NAN; m * n];
            assert_eq!(l.forward_decode(&x, m, &mut out).unwrap(), l.kernel_for(1), "{name}");
            assert!(
                out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: N={n} K={k} M={m}: decode rows not bit-identical"
            );
        }
    }
}

/// 8-bit weights as two 4-bit planes: every kernel (and the AMX tiling, emulated and on hardware tiles)
/// gives the documented arithmetic's bits, one exact integer sum and one multiply-add per group, within
/// the f32 budget of the exact `Σ xq·q·a_s·s`; a Q8_0-style tensor (`d·q`, every group reaching ±127) is
/// found again exactly; the embedding lookup decodes `q·s`.
#[test]
fn eight_bit_weights_run_on_the_four_bit_kernels_exactly() {
    use int4_kernels::w4a8::int8::Int8Weights;
    let kernels = runnable_kernels("eight_bit_weights_run_on_the_four_bit_kernels_exactly");
    let mut rng = Rng::new(31);
    // Row counts cover each kernel's passes and remainders (VNNI 8 rows a pass, AVX2 4). The last shape is
    // a head-wide layer, 2¹⁶ + 16 outputs a row: thousands of blocks over many tasks, each storing its
    // blocks' tiles into their columns of every row (one row writes its output in place).
    for (n, k, group, ms) in [
        (16, 64, GroupSize::G32, &[1, 3, 5, 12, 17, 40][..]),
        (48, 200, GroupSize::G32, &[1, 3, 5, 12, 17, 40]),
        (144, 576, GroupSize::G128, &[1, 3, 17]),
        (65552, 32, GroupSize::G32, &[1, 2, 3]),
    ] {
        let (g_len, groups) = (group.len(k), group.groups(k));
        // Q8_0-style: f16 scales d, codes in -127..=127 with ±127 in every group.
        let d: Vec<f32> =
            (0..groups * n).map(|_| half::f16::from_f32(0.001 + 0.01 * rng.normal().abs()).to_f32()).collect();
        let mut q = vec![0i8; n * k];
        for row in 0..n {
            for kk in 0..k {
                q[row * k + kk] = if kk % g_len == 0 {
                    127 * if row % 2 == 0 { 1 } else { -1 }
                } else {
                    (rng.normal() * 40.0).round().clamp(-127.0, 127.0) as i8
                };
            }
        }
        let w: Vec<f32> = (0..n * k).map(|i| f32::from(q[i]) * d[(i % k / g_len) * n + i / k]).collect();
        let weights = Int8Weights::quantize(&w, n, k, group).unwrap();
        for row in 0..n {
            for kk in 0..k {
                assert_eq!(weights.code(row, kk), q[row * k + kk], "N={n} K={k}: code ({row}, {kk})");
            }
            let mut decoded = vec![0.0; k];
            weights.decode_row(row, &mut decoded).unwrap();
            assert!(decoded.iter().zip(&w[row * k..(row + 1) * k]).all(|(a, b)| a == b), "row {row} decodes q·d");
        }
        for (i, &di) in d.iter().enumerate() {
            assert_eq!(weights.lo().scale(i / n, i % n), di, "the scales are Q8_0's own");
        }
        check_eight_bit_layer(&weights, &q, &d, n, k, group, ms, &kernels, &mut rng);
    }
    // Bad input is an error, not a wrong answer.
    let err = |r: Result<Int8Weights, int4_kernels::KernelError>| r.unwrap_err().to_string();
    assert!(err(Int8Weights::pack(&[-128; 16 * 32], &[1.0; 16], 16, 32, GroupSize::G32)).contains("-128"));
    assert!(err(Int8Weights::quantize(&[f32::NAN; 16 * 32], 16, 32, GroupSize::G32)).contains("finite"));
    let ok = Int8Weights::pack(&[5; 16 * 32], &[0.5; 16], 16, 32, GroupSize::G32).unwrap();
    assert!(err(Int8Weights::from_planes(ok.lo().clone(), ok.hi().clone())).contains("8-bit pair"));
    assert!(Int8Weights::from_planes(ok.hi().clone(), ok.lo().clone()).is_ok());
}

/// A checkpoint's own 8-bit codes and scales (`Int8Weights::from_codes`, scales `[N][G]`) make the planes
/// `quantize` makes for the same grid, byte for byte.
#[test]
fn eight_bit_codes_from_a_checkpoint_make_the_planes_quantize_makes() {
    use int4_kernels::w4a8::int8::Int8Weights;
    let mut rng = Rng::new(37);
    for (n, k, group) in [(16, 64, GroupSize::G32), (48, 200, GroupSize::G32), (144, 576, GroupSize::G128)] {
        let groups = group.groups(k);
        let quantized = Int8Weights::quantize(&rng.weights(n, k), n, k, group).unwrap();
        let codes: Vec<i8> = (0..n * k).map(|i| quantized.code(i / k, i % k)).collect();
        let scales: Vec<f32> = (0..n * groups).map(|i| quantized.lo().scale(i % groups, i / groups)).collect();
        let given = Int8Weights::from_codes(&codes, &scales, n, k, group).unwrap();
        for (plane, a, b) in [("high", quantized.hi(), given.hi()), ("low", quantized.lo(), given.lo())] {
            let what = format!("N={n} K={k} {group:?}: the {plane} plane");
            assert_eq!((a.n(), a.k(), a.group_len(), a.groups()), (b.n(), b.k(), b.group_len(), b.groups()), "{what}");
            assert_eq!(&a.packed()[..], &b.packed()[..], "{what}'s codes");
            assert_eq!(a.scales(), b.scales(), "{what}'s scales");
            assert_eq!(a.zeros(), b.zeros(), "{what}'s zero points");
            assert_eq!(a.offsets(), b.offsets(), "{what}'s offsets");
        }
    }
}

/// Codes over the whole i8 range, −128 included, with negative (and zero) scales: the stored codes and
/// the decoded weights `d·q` come back exactly, and every kernel runs the layer to the bits of one exact
/// integer sum and one multiply-add per group, within the 8-bit path's budget of the exact sum. Bad input
/// is an error.
#[test]
fn eight_bit_codes_with_minus_128_and_negative_scales_run_exactly() {
    use int4_kernels::w4a8::int8::Int8Weights;
    let kernels = runnable_kernels("eight_bit_codes_with_minus_128_and_negative_scales_run_exactly");
    let mut rng = Rng::new(41);
    for (n, k, group) in [(16, 32, GroupSize::G32), (32, 96, GroupSize::G32), (48, 576, GroupSize::G32)] {
        let groups = group.groups(k);
        let mut q: Vec<i8> = (0..n * k).map(|_| rng.next_u64() as i8).collect();
        for row in 0..n {
            q[row * k + row % k] = i8::MIN;
            q[row * k + (row + 5) % k] = i8::MAX;
        }
        // `[N][G]`, as a GGUF file holds them: f16 values, half of them negative, some zero.
        let scales: Vec<f32> = (0..n * groups)
            .map(|i| match i % 7 {
                0 => 0.0,
                1 => half::f16::from_bits(0x8001).to_f32(),
                _ => {
                    let d = half::f16::from_f32(0.001 + 0.01 * rng.normal().abs()).to_f32();
                    if i % 2 == 0 { -d } else { d }
                }
            })
            .collect();
        let weights = Int8Weights::from_codes(&q, &scales, n, k, group).unwrap();
        let mut row = vec![f32::NAN; k];
        for r in 0..n {
            weights.decode_row(r, &mut row).unwrap();
            for (kk, &v) in row.iter().enumerate() {
                assert_eq!(weights.code(r, kk), q[r * k + kk], "N={n} K={k}: code ({r}, {kk})");
                let want = f32::from(q[r * k + kk]) * scales[r * groups + kk / group.len(k)];
                assert_eq!(v.to_bits(), want.to_bits(), "N={n} K={k}: weight ({r}, {kk}) is d·q");
            }
        }
        let d_gn: Vec<f32> = (0..groups * n).map(|i| scales[(i % n) * groups + i / n]).collect();
        check_eight_bit_layer(&weights, &q, &d_gn, n, k, group, &[1, 3, 17], &kernels, &mut rng);
    }
    let err = |r: Result<Int8Weights, int4_kernels::KernelError>| r.unwrap_err().to_string();
    let g32 = GroupSize::G32;
    assert!(err(Int8Weights::from_codes(&[0; 16 * 32], &[1.0; 15], 16, 32, g32)).contains("scales [N][G]"));
    assert!(err(Int8Weights::from_codes(&[0; 16 * 31], &[1.0; 16], 16, 32, g32)).contains("codes [N][K]"));
    assert!(err(Int8Weights::from_codes(&[0; 8 * 32], &[1.0; 8], 8, 32, g32)).contains("multiple of 16"));
    let mut bad = vec![1.0; 32];
    bad[17] = f32::INFINITY;
    assert!(err(Int8Weights::from_codes(&[0; 16 * 64], &bad, 16, 64, g32)).contains("row 8, group 1 is inf"));
    bad[17] = f32::MAX / 8.0;
    assert!(err(Int8Weights::from_codes(&[0; 16 * 64], &bad, 16, 64, g32)).contains("below f32::MAX/16"));
    assert!(err(Int8Weights::from_codes(&[], &[], usize::MAX / 8, 64, g32)).contains("overflow"));
}
