//! W4A16 kernels against the scalar reference, on the shared shape corpus, for every ISA variant this
//! machine can run (each variant built directly, not only through dispatch).

mod common;

use common::{Rng, W4A16_VARIANTS, assert_within, layer, runnable_variants_of};
use int4_kernels::budget::{Budget, decode_bf16_bound, magnitudes_w4, magnitudes_w4_decode, magnitudes_w4_decode_bf16};
use int4_kernels::bytes::SharedBytes;
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::shapes::{TEST_GROUPS, TEST_K, TEST_M, TEST_N};
use int4_kernels::w4a16::{W4A16Config, W4A16Linear, W4A16Weights, lane_groups};
use int4_kernels::{KernelErrorKind, KernelId, reference};
use int4_layout::tinygemm::{TinygemmBlock, TinygemmMatrix};
use int4_layout::{GroupParams, GroupSize};

fn build(
    codes: &int4_layout::Codes,
    params: &GroupParams,
    block: TinygemmBlock,
    direct: bool,
    bias: Option<Vec<f32>>,
    level: IsaLevel,
) -> W4A16Linear {
    let weights = W4A16Weights::new(codes, params.clone(), block, direct).unwrap();
    let config = W4A16Config { direct_dequant: direct, ..W4A16Config::default() };
    // The process caps: `INT4_DISABLE=avx512bf16` then runs the AVX-512 variant with the f32-FMA prefill.
    W4A16Linear::forced(weights, bias, config, level, IsaCaps::process()).unwrap()
}

/// The prefill's error budget for `lin`'s prefill kernel: f32 accumulation of the exact weights, or, for
/// the `vdpbf16ps` GEMM, weights and activations rounded to bf16 (plus one smallest normal per product for
/// the denormals it flushes), as for the AMX-BF16 tiles below.
fn prefill_bound(lin: &W4A16Linear, k: usize, mu: f64, bias: f64) -> f64 {
    match lin.kernel_for(lin.config().dequant_threshold) {
        KernelId::W4a16PrefillDirectAvx512Bf16 | KernelId::W4a16PrefillHalvesAvx512Bf16 => {
            Budget::BF16_BOTH.bound(k, mu, bias) + k as f64 * f64::from(f32::MIN_POSITIVE)
        }
        _ => Budget::F32_ACCUMULATE.bound(k, mu, bias),
    }
}

/// The decode's error budget per output `i` (given that output's bias) for `lin`'s decode kernel: f32
/// accumulation of the exact products, or, for the `vdpbf16ps` decode, the activations' bf16 rounding as it
/// is plus f32 accumulation of its larger terms (`(128 + q)·s`; its tail blocks, on the f32 kernel, are
/// within this too). Per output `i` of `m × n`.
fn decode_budget(
    lin: &W4A16Linear,
    x: &[f32],
    m: usize,
    codes: &int4_layout::Codes,
    params: &GroupParams,
) -> impl Fn(usize, f64) -> f64 + use<> {
    let k = codes.k();
    let bf16 = lin.kernel_for(1) == KernelId::W4a16DecodeAvx512Bf16;
    let mu_d = magnitudes_w4_decode(x, m, codes, params);
    let (rounding, accumulated) =
        if bf16 { magnitudes_w4_decode_bf16(x, m, codes, params) } else { (Vec::new(), Vec::new()) };
    move |i: usize, bias: f64| {
        if bf16 {
            decode_bf16_bound(k, rounding[i], accumulated[i], bias)
        } else {
            Budget::F32_ACCUMULATE.bound(k, mu_d[i], bias)
        }
    }
}

/// Whether `lin`'s prefill rounds weights and activations to bf16.
fn bf16_prefill(lin: &W4A16Linear) -> bool {
    matches!(
        lin.kernel_for(lin.config().dequant_threshold),
        KernelId::W4a16PrefillDirectAvx512Bf16 | KernelId::W4a16PrefillHalvesAvx512Bf16
    )
}

/// The AMX-BF16 prefill's tiling on the tile emulator (hardware, where an AMX-BF16 host runs this, through
/// the same code): within the budget of bf16 weights and activations with f32 accumulation, plus one
/// smallest normal per product for the flushed denormals, on tails in N and K (K not a multiple of the
/// group or of the 32-channel tile block), M from 1 to past one 16-row tile, both block widths, bias on and
/// off. Tile instructions in the emulator follow Intel's documented order, so the result is also checked
/// against a dot product done the same way in plain Rust, bit for bit.
#[test]
fn amx_bf16_prefill_tiling_is_within_its_budget_on_the_tile_emulator() {
    use int4_kernels::tile::TileEmulator;
    let mut rng = Rng::new(31);
    let mut cases = 0;
    for (n, k, group, block) in [
        (16, 64, GroupSize::G32, TinygemmBlock::N32),
        (48, 200, GroupSize::G64, TinygemmBlock::N32),
        (80, 576, GroupSize::G128, TinygemmBlock::N64),
        (144, 256, GroupSize::G256, TinygemmBlock::N64),
        (64, 100, GroupSize::PerChannel, TinygemmBlock::N64),
    ] {
        let (codes, params) = layer(&mut rng, n, k, group);
        for (m, with_bias) in [(1, true), (3, false), (17, true), (40, false)] {
            let bias: Option<Vec<f32>> = with_bias.then(|| (0..n).map(|_| rng.normal()).collect());
            let lin = build(&codes, &params, block, true, bias.clone(), IsaLevel::Portable);
            let x = rng.activations(m, k);
            let mut out = vec![f32::NAN; m * n];
            lin.prefill_tiles(&TileEmulator::new, &x, m, &mut out).unwrap();
            let want = reference::w4a16(&x, m, &codes, &params, bias.as_deref());
            let mu = magnitudes_w4(&x, m, &codes, &params);
            let b = |i: usize| bias.as_ref().map_or(0.0, |b| f64::from(b[i % n]));
            let what = format!("amx-bf16 N={n} K={k} M={m} {group:?} {block:?} bias={with_bias}");
            assert_within(&what, &out, &want, |i| {
                Budget::BF16_BOTH.bound(k, mu[i], b(i)) + k as f64 * f64::from(f32::MIN_POSITIVE)
            });
            // On an AMX-BF16 host the hardware runs the same tiling (held to the budget: its rounding is
            // documented, not verified here); elsewhere that variant is reported as skipped.
            #[cfg(target_arch = "x86_64")]
            match int4_kernels::isa::AmxBf16::new() {
                Some(tok) => {
                    let mut hw = vec![f32::NAN; m * n];
                    let unit = || int4_kernels::AmxTiles::for_bf16(tok);
                    lin.prefill_tiles(&unit, &x, m, &mut hw).unwrap();
                    assert_within(&format!("hardware {what}"), &hw, &want, |i| {
                        Budget::BF16_BOTH.bound(k, mu[i], b(i)) + k as f64 * f64::from(f32::MIN_POSITIVE)
                    });
                }
                None if cases == 0 => common::report_skip("amx_bf16_prefill", "amx-bf16 (hardware tiles)"),
                None => {}
            }
            // The same arithmetic written out: bf16 operands, products and sums in f32 in K order.
            let bf = |v: f32| half::bf16::from_f32(v).to_f32();
            for (i, &got) in out.iter().enumerate() {
                let (r, c) = (i / n, i % n);
                let mut acc = 0.0f32;
                for kk in 0..k {
                    acc += bf(x[r * k + kk]) * bf(params.weight(c, kk, codes.get(c, kk)));
                }
                let acc = acc + bias.as_ref().map_or(0.0, |b| b[c]);
                assert_eq!(got.to_bits(), acc.to_bits(), "{what}: output {i}");
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 20);
}

/// Every (N, K, M) of the corpus, cycling group sizes, bias on and off and both block widths; decode,
/// direct-dequant prefill and split-halves prefill each run directly and must stay within their budgets.
#[test]
fn w4a16_kernels_match_the_reference_on_the_shape_corpus() {
    let variants = runnable_variants_of("w4a16 corpus", &W4A16_VARIANTS);
    let mut rng = Rng::new(1);
    let mut cases = 0;
    for (ni, &n) in TEST_N.iter().enumerate() {
        for (ki, &k) in TEST_K.iter().enumerate() {
            let group = TEST_GROUPS[(ni + ki) % TEST_GROUPS.len()];
            let (codes, params) = layer(&mut rng, n, k, group);
            let bias: Option<Vec<f32>> = ((ni + ki) % 2 == 0).then(|| (0..n).map(|_| rng.normal()).collect());
            let block = if (ni + ki) % 2 == 0 { TinygemmBlock::N64 } else { TinygemmBlock::N32 };
            if n % block.width() != 0 && n < 16 {
                continue;
            }
            for &m in &TEST_M {
                // The largest reference (2048 x 576 x 512) once is enough.
                if n == 2048 && m == 512 && ki == 1 {
                    continue;
                }
                let x = rng.activations(m, k);
                let want = reference::w4a16(&x, m, &codes, &params, bias.as_deref());
                let mu = magnitudes_w4(&x, m, &codes, &params);
                let b = |i: usize| bias.as_ref().map_or(0.0, |b| f64::from(b[i % n]));
                for v in &variants {
                    let what = format!("{} N={n} K={k} M={m} {group:?} {block:?} bias={}", v.name, bias.is_some());
                    let lin = build(&codes, &params, block, false, bias.clone(), v.level);
                    let mut out = vec![f32::NAN; m * n];
                    lin.decode(&x, m, &mut out).unwrap();
                    let decode_bound = decode_budget(&lin, &x, m, &codes, &params);
                    assert_within(&format!("decode {} {what}", lin.kernel_for(1)), &out, &want, |i| {
                        decode_bound(i, b(i))
                    });
                    lin.prefill(&x, m, &mut out).unwrap();
                    assert_within(&format!("prefill (halves) {what}"), &out, &want, |i| {
                        prefill_bound(&lin, k, mu[i], b(i))
                    });
                    let direct = build(&codes, &params, block, true, bias.clone(), v.level);
                    let mut out2 = vec![f32::NAN; m * n];
                    direct.prefill(&x, m, &mut out2).unwrap();
                    // Both prefill producers make the same panels (the same f32 weights), so their
                    // outputs are identical, not merely close.
                    assert_eq!(out, out2, "direct and halves prefill differ: {what}");
                    cases += 1;
                }
            }
        }
    }
    assert!(cases >= 90 * variants.len(), "ran {cases} cases");
}

/// Every group size on a K that none divides, for both block widths, decode and prefill.
#[test]
fn every_group_size_with_a_partial_last_group() {
    let variants = runnable_variants_of("w4a16 group sizes", &W4A16_VARIANTS);
    let mut rng = Rng::new(2);
    let (n, k, m) = (80, 200, 5);
    for group in TEST_GROUPS.into_iter().chain([GroupSize::PerChannel]) {
        let (codes, params) = layer(&mut rng, n, k, group);
        let x = rng.activations(m, k);
        let want = reference::w4a16(&x, m, &codes, &params, None);
        let mu = magnitudes_w4(&x, m, &codes, &params);
        for v in &variants {
            for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
                let lin = build(&codes, &params, block, true, None, v.level);
                let mut out = vec![0.0; m * n];
                lin.decode(&x, m, &mut out).unwrap();
                let decode_bound = decode_budget(&lin, &x, m, &codes, &params);
                assert_within(&format!("{} decode {group:?} {block:?}", v.name), &out, &want, |i| decode_bound(i, 0.0));
                lin.prefill(&x, m, &mut out).unwrap();
                assert_within(&format!("{} prefill {group:?} {block:?}", v.name), &out, &want, |i| {
                    prefill_bound(&lin, k, mu[i], 0.0)
                });
            }
        }
    }
}

/// The fused deinterleave: the prefill's panels are exactly the layout crate's direct decode.
/// Checked through outputs: with one-hot activations, prefill output (m, n) is the weight at (n, k_m).
#[test]
fn prefill_panels_are_the_direct_decode_bit_for_bit() {
    let variants = runnable_variants_of("w4a16 panels", &W4A16_VARIANTS);
    let mut rng = Rng::new(3);
    for (n, block) in [(144, TinygemmBlock::N64), (48, TinygemmBlock::N32), (80, TinygemmBlock::N32)] {
        let k = 576;
        let (codes, params) = layer(&mut rng, n, k, GroupSize::G128);
        let packed = int4_layout::tinygemm::pack(&codes, block).unwrap();
        let mut dec = vec![0.0f32; n * k];
        TinygemmMatrix::new(&packed, n, k, block).unwrap().decode_k_range(&params, 0..k, &mut dec).unwrap();
        // Rows of x are one-hot at k = 0, 1, 255, 256, 257, 575 (panel and group boundaries).
        let ks = [0usize, 1, 255, 256, 257, 575];
        let mut x = vec![0.0f32; ks.len() * k];
        for (r, &kk) in ks.iter().enumerate() {
            x[r * k + kk] = 1.0;
        }
        for v in &variants {
            let lin = build(&codes, &params, block, true, None, v.level);
            let mut out = vec![0.0; ks.len() * n];
            lin.prefill(&x, ks.len(), &mut out).unwrap();
            // The bf16 GEMM sees the same panels rounded to bf16 (and multiplies them by an exact 1.0).
            let round = |w: f32| if bf16_prefill(&lin) { half::bf16::from_f32(w).to_f32() } else { w };
            for (r, &kk) in ks.iter().enumerate() {
                for c in 0..n {
                    let want = round(dec[c * k + kk]);
                    assert_eq!(out[r * n + c], want, "{} {block:?} N={n} (n={c}, k={kk})", v.name);
                }
            }
        }
    }
}

#[test]
fn decode_and_prefill_agree_at_the_threshold() {
    let variants = runnable_variants_of("w4a16 threshold", &W4A16_VARIANTS);
    let mut rng = Rng::new(4);
    let (n, k) = (576, 576);
    let (codes, params) = layer(&mut rng, n, k, GroupSize::G128);
    for v in &variants {
        let lin = build(&codes, &params, TinygemmBlock::N64, true, None, v.level);
        let t = lin.config().dequant_threshold;
        assert!(t >= 2);
        let avx512_prefill = if int4_kernels::isa::Avx512Bf16::with_caps(IsaCaps::process()).is_some() {
            KernelId::W4a16PrefillDirectAvx512Bf16
        } else {
            KernelId::W4a16PrefillDirectAvx512
        };
        let avx512_decode = if int4_kernels::isa::Avx512Bf16::with_caps(IsaCaps::process()).is_some() {
            KernelId::W4a16DecodeAvx512Bf16
        } else {
            KernelId::W4a16DecodeAvx512
        };
        let (decode, prefill) = match v.level {
            IsaLevel::Avx512 => (avx512_decode, avx512_prefill),
            IsaLevel::Avx2 => (KernelId::W4a16DecodeAvx2, KernelId::W4a16PrefillDirectAvx2),
            _ => (KernelId::W4a16DecodePortable, KernelId::W4a16PrefillPortable),
        };
        assert_eq!(lin.kernel_for(t - 1), decode);
        assert_eq!(lin.kernel_for(t), prefill);
        // M = t − 1 goes to decode and M = t to prefill; the same rows through both paths agree within
        // the sum of the two budgets.
        let x = rng.activations(t, k);
        let mu = magnitudes_w4(&x, t, &codes, &params);
        let decode_bound = decode_budget(&lin, &x, t, &codes, &params);
        let mut below = vec![0.0; (t - 1) * n];
        lin.forward(&x[..(t - 1) * k], t - 1, &mut below).unwrap();
        let mut at = vec![0.0; t * n];
        lin.forward(&x, t, &mut at).unwrap();
        for i in 0..(t - 1) * n {
            let b = decode_bound(i, 0.0) + prefill_bound(&lin, k, mu[i], 0.0);
            assert!((f64::from(below[i]) - f64::from(at[i])).abs() <= b, "{} output {i}", v.name);
        }
    }
}

/// Threads split N, never K: one thread and two give the same bits, for decode and prefill.
#[test]
fn results_are_bit_identical_for_any_thread_count() {
    let variants = runnable_variants_of("w4a16 threads", &W4A16_VARIANTS);
    let mut rng = Rng::new(5);
    let (n, k) = (2048, 576);
    let (codes, params) = layer(&mut rng, n, k, GroupSize::G128);
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let pool2 = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let pool3 = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    for v in &variants {
        let lin = build(&codes, &params, TinygemmBlock::N64, true, None, v.level);
        for m in [1, 3, 17] {
            let x = rng.activations(m, k);
            let run = |pool: &rayon::ThreadPool, prefill: bool| {
                let mut out = vec![0.0; m * n];
                pool.install(|| if prefill { lin.prefill(&x, m, &mut out) } else { lin.decode(&x, m, &mut out) })
                    .unwrap();
                out
            };
            for prefill in [false, true] {
                let one = run(&pool1, prefill);
                assert!(
                    one == run(&pool2, prefill) && one == run(&pool3, prefill),
                    "{} m={m} prefill={prefill}",
                    v.name
                );
            }
        }
    }
}

/// The budgets are tight enough to matter: a scale one bf16 ulp off in a single group breaks them, for
/// decode (five groups) and prefill (one group spanning K), and the bf16-weights budget (which allows a
/// 2⁻⁸ error per weight) still catches it when the group spans K. The layer is built so nothing can hide the
/// error: codes 8..15 (`q − 8 ≥ 0`), zero 0, positive activations, and scales of 2⁻⁶ so that one bf16 ulp
/// is a relative error of 2⁻⁷ and every weight is exact in bf16.
/// The layer of [`the_budget_catches_a_scale_one_bf16_ulp_off`]: codes, correct parameters, the same with
/// group 0 of channel 0's scale one bf16 ulp high, and one row of activations.
fn scale_off_by_one_bf16_ulp(
    rng: &mut Rng,
    n: usize,
    k: usize,
    group: GroupSize,
) -> (int4_layout::Codes, GroupParams, GroupParams, Vec<f32>) {
    let codes = int4_layout::Codes::from_fn(n, k, |_, _| 8 + (rng.next_u64() % 8) as u8).unwrap();
    let g = group.groups(k);
    let scale = 1.0f32 / 64.0;
    let params = GroupParams::new(n, k, group, vec![scale; n * g], vec![0.0; n * g]).unwrap();
    let mut scales = params.scales().to_vec();
    scales[0] = half::bf16::from_bits(half::bf16::from_f32(scale).to_bits() + 1).to_f32();
    let bad = GroupParams::new(n, k, group, scales, params.zeros().to_vec()).unwrap();
    let x: Vec<f32> = (0..k).map(|_| half::bf16::from_f32(0.5 + rng.unit()).to_f32()).collect();
    (codes, params, bad, x)
}

#[test]
fn the_budget_catches_a_scale_one_bf16_ulp_off() {
    let variants = runnable_variants_of("w4a16 budget sensitivity", &W4A16_VARIANTS);
    let mut rng = Rng::new(6);
    for (k, group, budget, prefill) in [
        (576, GroupSize::G128, Budget::F32_ACCUMULATE, false),
        (576, GroupSize::G128, Budget::F32_ACCUMULATE, true),
        (128, GroupSize::PerChannel, Budget::BF16_WEIGHTS, true),
    ] {
        let n = 16;
        let (codes, params, bad, x) = scale_off_by_one_bf16_ulp(&mut rng, n, k, group);
        let g = group.groups(k);
        let mu =
            if prefill { magnitudes_w4(&x, 1, &codes, &params) } else { magnitudes_w4_decode(&x, 1, &codes, &params) };
        let want = reference::w4a16(&x, 1, &codes, &params, None);
        for v in &variants {
            let correct = build(&codes, &params, TinygemmBlock::N64, true, None, v.level);
            let broken = build(&codes, &bad, TinygemmBlock::N64, true, None, v.level);
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            if prefill {
                correct.prefill(&x, 1, &mut a).unwrap();
                broken.prefill(&x, 1, &mut b).unwrap();
            } else {
                correct.decode(&x, 1, &mut a).unwrap();
                broken.decode(&x, 1, &mut b).unwrap();
            }
            assert_within(&format!("{} correct", v.name), &a, &want, |i| budget.bound(k, mu[i], 0.0));
            let err = (f64::from(b[0]) - want[0]).abs();
            assert!(err > budget.bound(k, mu[0], 0.0), "{}: the broken scale (groups={g}) went unnoticed", v.name);
        }
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    let mut rng = Rng::new(7);
    let (codes, params) = layer(&mut rng, 64, 64, GroupSize::G32);
    let w = W4A16Weights::new(&codes, params.clone(), TinygemmBlock::N64, true).unwrap();
    let e = W4A16Linear::forced(
        w.clone(),
        Some(vec![0.0; 63]),
        W4A16Config::default(),
        IsaLevel::Portable,
        &IsaCaps::unrestricted(),
    );
    assert!(matches!(e.unwrap_err().kind(), KernelErrorKind::Shape { what: "bias", .. }));
    let lin =
        W4A16Linear::forced(w.clone(), None, W4A16Config::default(), IsaLevel::Portable, &IsaCaps::unrestricted())
            .unwrap();
    let mut out = vec![0.0; 64];
    assert!(matches!(
        lin.forward(&[0.0; 63], 1, &mut out).unwrap_err().kind(),
        KernelErrorKind::Shape { what: "activations", .. }
    ));
    assert!(matches!(
        lin.forward(&[0.0; 64], 1, &mut out[..10]).unwrap_err().kind(),
        KernelErrorKind::Shape { what: "output", .. }
    ));
    // The halves path without halves.
    let cfg = W4A16Config { direct_dequant: false, ..W4A16Config::default() };
    assert!(W4A16Linear::forced(w.clone(), None, cfg, IsaLevel::Portable, &IsaCaps::unrestricted()).is_err());
    // A forced path the process cannot run is an error naming what is missing, never SIGILL.
    let capped = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
    let e = W4A16Linear::forced(w.clone(), None, W4A16Config::default(), IsaLevel::Avx2, &capped).unwrap_err();
    assert!(e.to_string().contains("AVX2"), "{e}");
    let no_avx512 = IsaCaps::unrestricted().with_max_level(IsaLevel::Avx2);
    let e = W4A16Linear::forced(w, None, W4A16Config::default(), IsaLevel::Avx512, &no_avx512).unwrap_err();
    // The error names the decode that level would run (the bf16 one on 64-channel blocks).
    assert!(
        matches!(
            e.kind(),
            KernelErrorKind::Unavailable { kernel: KernelId::W4a16DecodeAvx512 | KernelId::W4a16DecodeAvx512Bf16, .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("AVX-512"), "{e}");
    // Shapes the layout cannot pack.
    let (c50, p50) = layer(&mut rng, 50, 64, GroupSize::G32);
    assert!(W4A16Weights::new(&c50, p50, TinygemmBlock::N64, true).is_err());
}

/// Lane groups cover every channel exactly once, for every N class and both block widths.
#[test]
fn lane_groups_partition_the_channels() {
    for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
        for n in (16..=320).step_by(16) {
            let mut seen = vec![0u8; n];
            for lg in lane_groups(block, n, 8) {
                for c in lg.channels {
                    seen[c as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{block:?} N={n}");
        }
    }
}

/// Only the lane-ordered parameters are kept, so everything read back from them must be exact: the
/// canonical parameters, each row's decode (the tied embedding's lookup) against the layout crate's own
/// decoder, and a layer rebuilt zero-copy from its exported bytes, which must compute the same bits (also
/// from bytes that are not 4-byte aligned, which are decoded into a copy instead).
#[test]
fn lane_parameters_read_back_exactly_and_rebuild_zero_copy() {
    let mut rng = Rng::new(11);
    for (n, k, group, block) in [
        (16, 64, GroupSize::G32, TinygemmBlock::N64),
        (48, 200, GroupSize::G64, TinygemmBlock::N64),
        (80, 96, GroupSize::G32, TinygemmBlock::N32),
        (144, 130, GroupSize::G128, TinygemmBlock::N64),
        (144, 256, GroupSize::PerChannel, TinygemmBlock::N32),
    ] {
        let (codes, params) = layer(&mut rng, n, k, group);
        let w = W4A16Weights::new(&codes, params.clone(), block, true).unwrap();
        let back = w.params();
        assert_eq!(back.scales(), params.scales(), "N={n} K={k}");
        assert_eq!(back.zeros(), params.zeros(), "N={n} K={k}");
        let m = TinygemmMatrix::new(w.packed(), n, k, block).unwrap();
        let (mut got, mut want) = (vec![0.0f32; k], vec![0.0f32; k]);
        for row in 0..n {
            w.decode_row(row, &mut got).unwrap();
            m.decode_row(&params, row, 0..k, &mut want).unwrap();
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        assert!(w.decode_row(n, &mut got).is_err());
        let lane = w.lane_params_le_bytes();
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&lane);
        let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = std::sync::Arc::new(shifted);
        let misaligned = SharedBytes::slice_of(owner, 1..lane.len() + 1).unwrap();
        let x = rng.activations(3, k);
        let run = |w: W4A16Weights| {
            let lin =
                W4A16Linear::forced(w, None, W4A16Config::default(), IsaLevel::Portable, &IsaCaps::unrestricted())
                    .unwrap();
            let mut out = vec![0.0f32; 3 * n];
            lin.forward(&x, 3, &mut out).unwrap();
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let packed = || SharedBytes::from(w.packed().to_vec());
        let zero_copy =
            W4A16Weights::from_packed_lane_params(packed(), lane.clone().into(), (n, k, group), block, None);
        let copied = W4A16Weights::from_packed_lane_params(packed(), misaligned, (n, k, group), block, None);
        let want = run(w.clone());
        assert_eq!(run(zero_copy.unwrap()), want);
        assert_eq!(run(copied.unwrap()), want);
        let short = SharedBytes::from(lane[..lane.len() - 4].to_vec());
        assert!(W4A16Weights::from_packed_lane_params(packed(), short, (n, k, group), block, None).is_err());
    }
}

/// The `vdpbf16ps` decode on activations that are not bf16 values (the decode's inputs are f32 in the
/// runtime): within its budget, whose rounding term is the activations' own rounding error; and that
/// budget still catches a scale one bf16 ulp off in one group. Reported as skipped without AVX512-BF16.
#[test]
fn the_bf16_decode_is_within_its_budget_on_f32_activations() {
    if int4_kernels::isa::Avx512Bf16::with_caps(IsaCaps::process()).is_none() {
        common::report_skip("the_bf16_decode_is_within_its_budget_on_f32_activations", "avx512bf16 decode");
        return;
    }
    let mut rng = Rng::new(9);
    for (n, k, group, m) in
        [(64, 576, GroupSize::G32, 1), (144, 200, GroupSize::G64, 3), (192, 1536, GroupSize::G128, 4)]
    {
        let (codes, params) = layer(&mut rng, n, k, group);
        let x: Vec<f32> = (0..m * k).map(|i| rng.normal() * if i % 97 == 0 { 20.0 } else { 1.0 }).collect();
        assert!(x.iter().any(|&v| half::bf16::from_f32(v).to_f32() != v));
        let lin = build(&codes, &params, TinygemmBlock::N64, true, None, IsaLevel::Avx512);
        assert_eq!(lin.kernel_for(1), KernelId::W4a16DecodeAvx512Bf16);
        let want = reference::w4a16(&x, m, &codes, &params, None);
        let mut out = vec![f32::NAN; m * n];
        lin.decode(&x, m, &mut out).unwrap();
        let bound = decode_budget(&lin, &x, m, &codes, &params);
        assert_within(&format!("bf16 decode N={n} K={k} M={m} {group:?}"), &out, &want, |i| bound(i, 0.0));
    }
    // Sensitivity, as in `the_budget_catches_a_scale_one_bf16_ulp_off`, on a full 64-channel block. This
    // budget sums `(128 + q)·s + |z − 136·s|` per term, about 80 times `|w|` for this layer, so the broken
    // group must be a large share of K (one of two) for a 2⁻⁷ error to stand out of it.
    let (n, k, group) = (64, 256, GroupSize::G128);
    let (codes, params, bad, x) = scale_off_by_one_bf16_ulp(&mut rng, n, k, group);
    let want = reference::w4a16(&x, 1, &codes, &params, None);
    let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
    let correct = build(&codes, &params, TinygemmBlock::N64, true, None, IsaLevel::Avx512);
    correct.decode(&x, 1, &mut a).unwrap();
    build(&codes, &bad, TinygemmBlock::N64, true, None, IsaLevel::Avx512).decode(&x, 1, &mut b).unwrap();
    let bound = decode_budget(&correct, &x, 1, &codes, &params);
    assert_within("bf16 decode, correct scales", &a, &want, |i| bound(i, 0.0));
    assert!((f64::from(b[0]) - want[0]).abs() > bound(0, 0.0), "the broken scale went unnoticed");
}

/// The `vdpbf16ps` decode pairs its codes with `vpermb` where the CPU has AVX512-VBMI and with widening
/// loads and `vpermt2w` where it has not (Cooper Lake): the same bf16 pairs in the same order, so both
/// give the same bits, on N with and without a 64-channel tail, K with a partial group, and
/// every decode row count. Reported as skipped without AVX512-BF16 and VBMI.
#[test]
fn the_bf16_decode_gives_the_same_bits_with_and_without_vbmi() {
    use int4_kernels::isa::{Avx512Bf16, Feature};
    let caps = IsaCaps::process();
    if Avx512Bf16::with_caps(caps).and_then(Avx512Bf16::vbmi).is_none() {
        common::report_skip("the_bf16_decode_gives_the_same_bits_with_and_without_vbmi", "avx512bf16 + avx512vbmi");
        return;
    }
    let without = (*caps).without(Feature::Avx512Vbmi);
    assert!(Avx512Bf16::with_caps(&without).is_some_and(|t| t.vbmi().is_none()));
    let mut rng = Rng::new(10);
    for (n, k, group) in [(64, 576, GroupSize::G32), (144, 200, GroupSize::G64), (2048, 1090, GroupSize::G128)] {
        let (codes, params) = layer(&mut rng, n, k, group);
        let make = |caps: &IsaCaps| {
            let weights = W4A16Weights::new(&codes, params.clone(), TinygemmBlock::N64, true).unwrap();
            W4A16Linear::forced(weights, None, W4A16Config::default(), IsaLevel::Avx512, caps).unwrap()
        };
        let (vbmi, plain) = (make(caps), make(&without));
        assert_eq!(vbmi.kernel_for(1), KernelId::W4a16DecodeAvx512Bf16);
        assert_eq!(plain.kernel_for(1), KernelId::W4a16DecodeAvx512Bf16);
        for m in 1..=5 {
            let x = rng.activations(m, k);
            let (mut a, mut b) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            vbmi.decode(&x, m, &mut a).unwrap();
            plain.decode(&x, m, &mut b).unwrap();
            let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "N={n} K={k} M={m} {group:?}: the VBMI and the vpermt2w pairing differ");
        }
    }
}

/// `decode_rows_exact` gives each of `m` rows the bits one-row `decode` gives it alone, on every decode
/// variant this machine runs (the AVX-512 one with and without BF16), both block widths, with N and K tails,
/// every group size and 1 to 17 rows: what lets a step of many sequences decode in one pass over the weights
/// and still give each sequence exactly what it gets alone. On AVX2 and portable the multi-row `decode` is
/// held to the same (each row keeps one chain per lane in any pass); on AVX-512 it is not (it splits a
/// row's sums over fewer accumulator chains the more rows share a pass).
#[test]
fn the_row_exact_decode_gives_every_row_its_one_row_bits() {
    use int4_kernels::isa::Feature;
    let mut rng = Rng::new(31);
    let caps = IsaCaps::process();
    let mut levels: Vec<(String, IsaCaps, IsaLevel)> =
        common::runnable_variants_of("the_row_exact_decode_gives_every_row_its_one_row_bits", &common::W4A16_VARIANTS)
            .into_iter()
            .map(|v| (v.name.to_string(), *caps, v.level))
            .collect();
    if levels.iter().any(|(_, _, l)| *l == IsaLevel::Avx512) && caps.allows(Feature::Avx512Bf16) {
        levels.push(("avx512 without bf16".into(), caps.without(Feature::Avx512Bf16), IsaLevel::Avx512));
    }
    // Both block widths (the AVX2 policy packs 32-channel blocks), so that a task's lane groups run four, two
    // or one side by side, with N tails: 144, 208 and 80 end in a lone 16-channel lane group; 96 in a
    // 32-channel tail (N64: two lane groups of their own stride); 112 in a 48-channel tail (N64: a run of
    // three) or a task of two blocks' lane groups and a 16-channel tail (N32: strides 16, 16, 8).
    let shapes = [
        (64, 576, GroupSize::G32),
        (144, 200, GroupSize::G64),
        (208, 1090, GroupSize::G128),
        (80, 96, GroupSize::G32),
        (96, 160, GroupSize::G32),
        (112, 320, GroupSize::G64),
    ];
    for ((n, k, group), block) in shapes.into_iter().flat_map(|s| [(s, TinygemmBlock::N64), (s, TinygemmBlock::N32)]) {
        let (codes, params) = layer(&mut rng, n, k, group);
        for (name, caps, level) in &levels {
            let weights = W4A16Weights::new(&codes, params.clone(), block, true).unwrap();
            let lin = W4A16Linear::forced(weights, None, W4A16Config::default(), *level, caps).unwrap();
            for m in [1, 2, 3, 4, 5, 9, 17] {
                let x = rng.activations(m, k);
                let mut together = vec![f32::NAN; m * n];
                lin.decode_rows_exact(&x, m, &mut together).unwrap();
                let mut plain = vec![f32::NAN; m * n];
                lin.decode(&x, m, &mut plain).unwrap();
                for r in 0..m {
                    let mut alone = vec![f32::NAN; n];
                    lin.decode(&x[r * k..(r + 1) * k], 1, &mut alone).unwrap();
                    let row = r * n..(r + 1) * n;
                    let same = |got: &[f32]| alone.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same(&together[row.clone()]),
                        "{name}: N={n} K={k} {group:?} {block:?} M={m}: row {r} differs from its one-row decode"
                    );
                    assert!(
                        *level == IsaLevel::Avx512 || same(&plain[row]),
                        "{name}: N={n} K={k} {group:?} {block:?} M={m}: the multi-row decode's row {r} differs"
                    );
                }
            }
        }
    }
}

/// The AVX-512 f32 prefill (CPUs with AVX-512 but no AVX512-BF16) gives the AVX2 prefill's bits: the same
/// panels, and each output the same fused multiply-add chain over K, two lane groups per call on 512-bit
/// registers. Both panel sources (direct and split halves), every row count the AVX-512 kernel's blocks of
/// twelve leave last (and tails past multiples of six), N (an odd number of lane groups, so a pair and a
/// single) and K (below one 128-channel panel, exactly two, and past a 128- and a 256-channel panel),
/// every group size. The row counts come in no order, so a call reuses tile and packed-row buffers that
/// a larger call left, and a product that read old sums would differ. Runs wherever the CPU has AVX-512
/// (with BF16 taken away from the caps where it has it).
#[test]
fn the_avx512_f32_prefill_gives_the_avx2_prefills_bits() {
    use int4_kernels::isa::Feature;
    let caps = IsaCaps::process();
    let runnable = common::runnable_variants_of("the_avx512_f32_prefill", &common::W4A16_VARIANTS);
    if !runnable.iter().any(|v| v.level == IsaLevel::Avx512) {
        return;
    }
    let no_bf16 = caps.without(Feature::Avx512Bf16);
    let mut rng = Rng::new(41);
    let shapes = [
        (48, 300, GroupSize::G32),
        (144, 576, GroupSize::G64),
        (208, 1090, GroupSize::G128),
        (80, 96, GroupSize::G32),
        (96, 256, GroupSize::G128),
    ];
    for (n, k, group) in shapes {
        let (codes, params) = layer(&mut rng, n, k, group);
        for direct in [true, false] {
            let config = W4A16Config { direct_dequant: direct, ..W4A16Config::default() };
            let at = |level: IsaLevel, caps: &IsaCaps| {
                let weights = W4A16Weights::new(&codes, params.clone(), TinygemmBlock::N64, direct).unwrap();
                W4A16Linear::forced(weights, None, config, level, caps).unwrap()
            };
            let wide = at(IsaLevel::Avx512, &no_bf16);
            let narrow = at(IsaLevel::Avx2, caps);
            let want = if direct { KernelId::W4a16PrefillDirectAvx512 } else { KernelId::W4a16PrefillHalvesAvx512 };
            assert_eq!(wide.kernel_for(512), want);
            for m in [40, 1, 25, 5, 13, 7, 16, 12, 2, 23, 3, 6, 8, 9, 10, 11] {
                let x = rng.activations(m, k);
                let (mut a, mut b) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                wide.prefill(&x, m, &mut a).unwrap();
                narrow.prefill(&x, m, &mut b).unwrap();
                let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "N={n} K={k} {group:?} M={m} direct={direct}: the AVX-512 f32 prefill differs from AVX2");
            }
        }
    }
}
