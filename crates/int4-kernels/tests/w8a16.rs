//! W8A16 (int8 codes, a scale per 32 inputs, f32 activations): every kernel variant (portable, AVX2,
//! AVX-512; decode and prefill) bit for bit against the f32-order reference, on shapes with tails in N,
//! K and M, negative, zero and subnormal-f16 scales, codes −128 and 127, bias on and off; the output's
//! distance from the f64 value within the stated budget; thread-count invariance; dispatch under every
//! ISA cap; weights read in place from shared bytes; the embedding row; and errors, never panics, for bad
//! lengths and values.

mod common;

use std::sync::Arc;

use common::Rng;
use int4_kernels::budget::{magnitudes_w8a16, w8a16_bound};
use int4_kernels::bytes::SharedBytes;
use int4_kernels::choice::{self, BoundKernels, KernelChoice};
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::w8a16::{W8A16_PREFILL_FROM_ROWS, W8A16Linear, W8A16Weights};
use int4_kernels::{KernelError, KernelErrorKind, KernelId, reference};

/// Each ISA's decode and prefill kernels.
const KERNELS: [(KernelId, KernelId, &str); 3] = [
    (KernelId::W8a16DecodePortable, KernelId::W8a16PrefillPortable, "portable"),
    (KernelId::W8a16DecodeAvx2, KernelId::W8a16PrefillAvx2, "avx2+fma"),
    (KernelId::W8a16DecodeAvx512, KernelId::W8a16PrefillAvx512, "avx512"),
];

/// The shapes of the bit-exactness corpus: N and K with tails, M across the decode/prefill boundary and
/// the prefill tile's tails.
const NS: [usize; 5] = [1, 15, 17, 33, 100];
const KS: [usize; 3] = [32, 96, 576];
const MS: [usize; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 17];

/// The W8A16 kernels of each ISA this process can run, each bound three ways: decode for every row count,
/// prefill for every row count, and the default split. An ISA this CPU (or `INT4_ISA`/`INT4_DISABLE`)
/// lacks is reported as skipped (a failure under `INT4_TEST_EVERYTHING=1`).
fn runnable(test: &str) -> Vec<(&'static str, [BoundKernels; 3])> {
    let everything = std::env::var("INT4_TEST_EVERYTHING").is_ok_and(|v| v == "1");
    let caps = IsaCaps::process();
    let mut out = Vec::new();
    for (decode, prefill, name) in KERNELS {
        let bind = |prefill_from| KernelChoice { decode, prefill, prefill_from }.bind(caps);
        match (bind(usize::MAX), bind(0), bind(W8A16_PREFILL_FROM_ROWS)) {
            (Ok(d), Ok(p), Ok(both)) => out.push((name, [d, p, both])),
            (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
                let msg = format!("{test}: SKIPPED w8a16 variant {name} ({e})");
                assert!(!everything, "{msg}, and INT4_TEST_EVERYTHING=1 forbids skips");
                eprintln!("{msg}");
                common::record_skip(&msg);
            }
        }
    }
    assert!(!out.is_empty(), "{test}: no kernel variant ran");
    out
}

/// Scales like a GGUF file's (f16, widened) with every awkward case: negative, zero, negative zero, the
/// smallest f16 subnormals (normal in f32), the largest f16, and ordinary values.
fn scales(rng: &mut Rng, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let f16 = |bits: u16| half::f16::from_bits(bits).to_f32();
            match i % 11 {
                0 => f16(1),      // 2⁻²⁴, the smallest f16 subnormal
                1 => f16(0x8001), // −2⁻²⁴
                2 => f16(0x03ff), // the largest f16 subnormal
                3 => 0.0,
                4 => -0.0,
                5 => f16(0x7bff) / 1024.0, // 65504/1024: a large scale, kept finite in every sum
                _ => {
                    let d = half::f16::from_f32(0.002 + 0.02 * rng.normal().abs()).to_f32();
                    if rng.next_u64().is_multiple_of(2) { -d } else { d }
                }
            }
        })
        .collect()
}

/// Codes over the whole i8 range, with −128 and 127 in every row (where the row has room for both).
fn codes(rng: &mut Rng, n: usize, k: usize) -> Vec<i8> {
    let mut q: Vec<i8> = (0..n * k).map(|_| rng.next_u64() as i8).collect();
    for row in 0..n {
        q[row * k + row % k] = i8::MIN;
        q[row * k + (row + 7) % k] = i8::MAX;
    }
    q
}

/// Activations: full-precision f32 (so the products round) for even seeds, bf16 values with outliers (what
/// a bf16 model feeds) for odd ones.
fn activations(rng: &mut Rng, m: usize, k: usize, full: bool) -> Vec<f32> {
    if full { (0..m * k).map(|_| rng.normal() * 3.0).collect() } else { rng.activations(m, k) }
}

fn bits_equal(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!(
            "{what}: output {i} is {:e} ({:#010x}), the reference {:e} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Every kernel, decode and prefill, gives the reference's bits on every shape of the corpus.
#[test]
fn every_kernel_matches_the_f32_order_reference_bit_for_bit() {
    let kernels = runnable("every_kernel_matches_the_f32_order_reference_bit_for_bit");
    let mut rng = Rng::new(7);
    let mut cases = 0;
    for n in NS {
        for k in KS {
            let (q, d) = (codes(&mut rng, n, k), scales(&mut rng, n * k / 32));
            let weights = W8A16Weights::new(q.clone(), d.clone(), n, k).unwrap();
            let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            for m in MS {
                let x = activations(&mut rng, m, k, (n + k + m) % 2 == 0);
                for b in [None, Some(&bias)] {
                    let want = reference::w8a16(&x, m, &q, &d, n, k, b.map(|b| b.as_slice()));
                    for &(name, bound) in &kernels {
                        for (phase, kernels) in ["decode", "prefill", "default"].into_iter().zip(bound) {
                            let l = W8A16Linear::with_kernels(weights.clone(), b.cloned(), kernels).unwrap();
                            let mut out = vec![f32::NAN; m * n];
                            let ran = l.forward(&x, m, &mut out).unwrap();
                            assert_eq!(ran, kernels.for_rows(m));
                            let what = format!("{name} {phase} ({ran}) N={n} K={k} M={m} bias={}", b.is_some());
                            bits_equal(&what, &out, &want);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, NS.len() * KS.len() * MS.len() * 2 * 3 * kernels.len());
}

/// The f32 order stays within `γ_{G+7}·μ + u·|bias|` of the f64 value (`budget::w8a16_bound`), and the
/// budget is not vacuous: one group's scale 1/16 off breaks it.
#[test]
fn the_output_is_within_the_f64_budget() {
    let mut rng = Rng::new(19);
    let mut worst = 0.0f64;
    let shapes = NS.iter().flat_map(|&n| KS.iter().map(move |&k| (n, k, 5))).chain([(64, 4096, 3), (48, 11264, 2)]);
    for (n, k, m) in shapes {
        let (q, d) = (codes(&mut rng, n, k), scales(&mut rng, n * k / 32));
        let bias: Vec<f32> = (0..n).map(|_| rng.normal() * 4.0).collect();
        let x = activations(&mut rng, m, k, true);
        let got = reference::w8a16(&x, m, &q, &d, n, k, Some(&bias));
        let exact = reference::w8a16_f64(&x, m, &q, &d, n, k, Some(&bias));
        let mu = magnitudes_w8a16(&x, m, &q, &d, n, k);
        for i in 0..m * n {
            let budget = w8a16_bound(k, mu[i], f64::from(bias[i % n]));
            let err = (f64::from(got[i]) - exact[i]).abs();
            assert!(
                err <= budget,
                "N={n} K={k} M={m} output {i}: {} vs {}, error {err:e} > {budget:e}",
                got[i],
                exact[i]
            );
            worst = worst.max(err / budget);
        }
        // Output (0, row) with the scale of its largest group 1/16 off is outside the budget.
        let (row, groups) = (n / 2, k / 32);
        let group_sum = |g: usize| -> f64 {
            let t: f64 = (32 * g..32 * g + 32).map(|kk| f64::from(x[kk]) * f64::from(q[row * k + kk])).sum();
            (f64::from(d[row * groups + g]) * t).abs()
        };
        let g = (0..groups).max_by(|&a, &b| group_sum(a).total_cmp(&group_sum(b))).unwrap();
        let mut wrong = d.clone();
        wrong[row * groups + g] *= 1.0 + 1.0 / 16.0;
        let off = reference::w8a16(&x, m, &q, &wrong, n, k, Some(&bias));
        let err = (f64::from(off[row]) - exact[row]).abs();
        let budget = w8a16_bound(k, mu[row], f64::from(bias[row]));
        assert!(err > budget, "N={n} K={k}: a scale 1/16 off stays within the budget ({err:e} <= {budget:e})");
    }
    println!("W8A16: worst error {worst:.4} of the budget");
}

/// The result does not depend on how many threads split N.
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(23);
    let (n, k) = (301, 384);
    let weights = W8A16Weights::new(codes(&mut rng, n, k), scales(&mut rng, n * k / 32), n, k).unwrap();
    let bias: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    for (name, bound) in runnable("results_do_not_depend_on_the_thread_count") {
        for m in [1, 3, 9] {
            let x = activations(&mut rng, m, k, true);
            let run = |threads: usize, kernels: BoundKernels| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    let l = W8A16Linear::with_kernels(weights.clone(), Some(bias.clone()), kernels).unwrap();
                    let mut out = vec![0.0; m * n];
                    l.forward(&x, m, &mut out).unwrap();
                    out
                })
            };
            for kernels in bound {
                let one = run(1, kernels);
                for t in [2, 3, 7] {
                    bits_equal(&format!("{name} {} M={m}, {t} threads", kernels.for_rows(m)), &run(t, kernels), &one);
                }
            }
        }
    }
}

/// Under each cap (portable; AVX2; no cap) the layer takes the widest kernels the cap and the live CPU
/// allow, never one above the cap, and its output is the reference's, bit for bit.
#[test]
fn every_isa_cap_dispatches_to_the_best_kernel_it_allows_bit_exactly() {
    use int4_kernels::isa::{Avx2Fma, Avx512, Feature};
    let mut rng = Rng::new(43);
    let (n, k) = (70, 160);
    let (q, d) = (codes(&mut rng, n, k), scales(&mut rng, n * k / 32));
    let weights = W8A16Weights::new(q.clone(), d.clone(), n, k).unwrap();
    let live = IsaCaps::unrestricted();
    let matrix = [
        ("portable", live.with_max_level(IsaLevel::Portable), IsaLevel::Portable),
        ("avx2", live.with_max_level(IsaLevel::Avx2), IsaLevel::Avx2),
        ("avx512 without fma", live.without(Feature::Fma), IsaLevel::Portable),
        ("no cap", live, IsaLevel::Avx512),
    ];
    for (name, caps, ceiling) in matrix {
        let level = if ceiling >= IsaLevel::Avx512 && Avx512::with_caps(&caps).is_some() {
            IsaLevel::Avx512
        } else if ceiling >= IsaLevel::Avx2 && Avx2Fma::with_caps(&caps).is_some() {
            IsaLevel::Avx2
        } else {
            IsaLevel::Portable
        };
        if level < ceiling {
            common::report_skip("every_isa_cap_dispatches_to_the_best_kernel_it_allows_bit_exactly", name);
        }
        let l = W8A16Linear::new(weights.clone(), None, &caps).unwrap();
        for m in [1, W8A16_PREFILL_FROM_ROWS - 1, W8A16_PREFILL_FROM_ROWS, 13] {
            let id = l.kernel_for(m);
            assert_eq!(id.level(), level, "cap {name}: {id} for M={m}");
            assert_eq!(id, choice::choose(int4_kernels::FeatureSet::live(&caps), W8A16Linear::spec()).for_rows(m));
            let x = activations(&mut rng, m, k, true);
            let mut out = vec![f32::NAN; m * n];
            assert_eq!(l.forward(&x, m, &mut out).unwrap(), id);
            bits_equal(&format!("cap {name}: {id} M={m}"), &out, &reference::w8a16(&x, m, &q, &d, n, k, None));
        }
    }
}

/// Weights built from shared bytes (a mapped artifact's sections, at any offset) are read in place and
/// equal the owned ones; what they store reads back to the same weights.
#[test]
fn weights_read_in_place_from_shared_bytes_and_round_trip() {
    let mut rng = Rng::new(5);
    let (n, k) = (33, 96);
    let (q, d) = (codes(&mut rng, n, k), scales(&mut rng, n * k / 32));
    let owned = W8A16Weights::new(q.clone(), d.clone(), n, k).unwrap();
    assert_eq!(owned.codes(), &q[..]);
    assert_eq!(owned.scales(), &d[..]);
    assert_eq!((owned.n(), owned.k(), owned.groups()), (n, k, 3));
    assert_eq!(owned.bytes(), n * k + n * 3 * 4);
    let (code_bytes, scale_bytes) = (owned.codes_bytes().to_vec(), owned.scales_le_bytes());
    assert_eq!(scale_bytes.len(), n * 3 * 4);
    // One buffer holding both sections, the scales at an aligned offset and at a misaligned one.
    for pad in [0usize, 1, 3] {
        let mut file = vec![0xAAu8; 5];
        file.extend_from_slice(&code_bytes);
        let scales_at = file.len().next_multiple_of(4) + pad;
        file.resize(scales_at, 0x55);
        file.extend_from_slice(&scale_bytes);
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(file);
        let codes = SharedBytes::slice_of(owner.clone(), 5..5 + n * k).unwrap();
        let scales = SharedBytes::slice_of(owner.clone(), scales_at..scales_at + scale_bytes.len()).unwrap();
        let mapped = W8A16Weights::from_parts(codes, scales, n, k).unwrap();
        assert!(mapped.codes_bytes().is_shared(), "the codes are the buffer's own bytes");
        assert_eq!(mapped.codes(), owned.codes());
        assert_eq!(mapped.scales(), owned.scales(), "scales at offset {scales_at}");
        assert_eq!(mapped.scales_le_bytes(), scale_bytes);
        let x = activations(&mut rng, 2, k, true);
        let (mut a, mut b) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
        let caps = IsaCaps::process();
        W8A16Linear::new(owned.clone(), None, caps).unwrap().forward(&x, 2, &mut a).unwrap();
        W8A16Linear::new(mapped, None, caps).unwrap().forward(&x, 2, &mut b).unwrap();
        bits_equal("mapped weights", &b, &a);
    }
}

/// A row dequantizes to `d·q`, one f32 multiply per weight (the tied head's embedding lookup).
#[test]
fn a_row_dequantizes_to_d_times_q() {
    let mut rng = Rng::new(3);
    let (n, k) = (17, 576);
    let (q, d) = (codes(&mut rng, n, k), scales(&mut rng, n * k / 32));
    let w = W8A16Weights::new(q.clone(), d.clone(), n, k).unwrap();
    let mut row = vec![f32::NAN; k];
    for r in 0..n {
        w.row(r, &mut row).unwrap();
        for (kk, &v) in row.iter().enumerate() {
            let want = d[r * (k / 32) + kk / 32] * f32::from(q[r * k + kk]);
            assert_eq!(v.to_bits(), want.to_bits(), "row {r}, input {kk}");
            // The product of an f16-derived scale and an 8-bit code is exact in f32.
            assert_eq!(f64::from(v), f64::from(d[r * (k / 32) + kk / 32]) * f64::from(q[r * k + kk]));
        }
    }
    let e = w.row(n, &mut row).unwrap_err();
    assert!(matches!(e.kind(), KernelErrorKind::Shape { .. }), "{e}");
    let e = w.row(0, &mut row[..k - 1]).unwrap_err();
    assert!(matches!(e.kind(), KernelErrorKind::Shape { what: "dequantized W8A16 row", .. }), "{e}");
}

/// Bad lengths and values are errors, never panics and never a wrong answer.
#[test]
fn bad_lengths_and_values_are_errors() {
    let err = |r: Result<W8A16Weights, KernelError>| r.unwrap_err();
    let shape = |e: KernelError, what: &str| {
        assert!(matches!(e.kind(), KernelErrorKind::Shape { what: w, .. } if w.contains(what)), "{what}: {e}");
    };
    shape(err(W8A16Weights::new(vec![0; 64], vec![1.0; 2], 2, 31)), "multiple of 32");
    shape(err(W8A16Weights::new(vec![], vec![], 1, 0)), "multiple of 32");
    shape(err(W8A16Weights::new(vec![], vec![], 0, 32)), "output channels");
    shape(err(W8A16Weights::new(vec![0; 63], vec![1.0; 2], 2, 32)), "codes");
    shape(err(W8A16Weights::new(vec![0; 64], vec![1.0; 3], 2, 32)), "scales");
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = err(W8A16Weights::new(vec![0; 128], vec![1.0, 1.0, 1.0, bad], 2, 64));
        assert!(e.to_string().contains("row 1, group 1") && e.to_string().contains("finite"), "{e}");
        let scales: Vec<u8> = [1.0f32, bad].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(err(W8A16Weights::from_parts(vec![0; 64].into(), scales.into(), 1, 64)).to_string().contains("finite"));
    }
    // Stored parts of the wrong length, or scales that are not whole f32s.
    shape(err(W8A16Weights::from_parts(vec![0; 63].into(), vec![0; 8].into(), 1, 64)), "code bytes");
    shape(err(W8A16Weights::from_parts(vec![0; 64].into(), vec![0; 7].into(), 1, 64)), "scale bytes");
    // A shape whose size overflows is an error, not a panic.
    let e = err(W8A16Weights::from_parts(vec![].into(), vec![].into(), usize::MAX / 16, 64));
    assert!(matches!(e.kind(), KernelErrorKind::InvalidInput(_)), "{e}");

    let w = W8A16Weights::new(vec![1; 3 * 64], vec![0.5; 6], 3, 64).unwrap();
    let caps = IsaCaps::process();
    shape(W8A16Linear::new(w.clone(), Some(vec![0.0; 2]), caps).unwrap_err(), "bias");
    let e = W8A16Linear::new(w.clone(), Some(vec![0.0, f32::NAN, 0.0]), caps).unwrap_err();
    assert!(e.to_string().contains("bias 1 is NaN"), "{e}");
    let l = W8A16Linear::new(w.clone(), Some(vec![1.0; 3]), caps).unwrap();
    let mut out = vec![0.0; 6];
    shape(l.forward(&[0.0; 127], 2, &mut out).unwrap_err(), "activations");
    shape(l.forward(&[0.0; 128], 2, &mut out[..5]).unwrap_err(), "output");
    assert!(l.forward(&[], usize::MAX, &mut out).is_err(), "an overflowing row count is an error");
    // Zero rows is a call that does nothing.
    assert_eq!(l.forward(&[], 0, &mut []).unwrap(), l.kernel_for(0));
    // 1·0.5·64 + 1 per output.
    assert_eq!(l.forward(&[1.0; 128], 2, &mut out).unwrap(), l.kernel_for(2));
    assert!(out.iter().all(|&v| v == 33.0), "{out:?}");
    // Kernels of another family are refused.
    let w4a8 = choice::best(int4_kernels::w4a8::W4A8Kernel::spec(), caps).unwrap();
    let e = W8A16Linear::with_kernels(w, None, w4a8).unwrap_err();
    assert!(matches!(e.kind(), KernelErrorKind::WrongFamily { layer: "W8A16", .. }), "{e}");
}

/// A kernel the CPU (or the caps) cannot run is an error naming it, never SIGILL and never a fallback.
#[test]
fn a_kernel_the_process_cannot_run_is_an_error() {
    let portable = IsaCaps::unrestricted().with_max_level(IsaLevel::Portable);
    for (decode, prefill, _) in &KERNELS[1..] {
        let e = KernelChoice { decode: *decode, prefill: *prefill, prefill_from: 4 }.bind(&portable).unwrap_err();
        assert!(matches!(e.kind(), KernelErrorKind::Unavailable { kernel, .. } if kernel == decode), "{e}");
    }
    for level in [IsaLevel::Avx2, IsaLevel::Avx512] {
        let e = choice::at_level(W8A16Linear::spec(), level, &portable).unwrap_err();
        assert!(matches!(e.kind(), KernelErrorKind::Unavailable { .. }), "{e}");
    }
    let w = W8A16Weights::new(vec![0; 32], vec![1.0], 1, 32).unwrap();
    let l = W8A16Linear::forced(w, None, IsaLevel::Portable, &portable).unwrap();
    assert_eq!((l.kernel_for(1), l.kernel_for(64)), (KernelId::W8a16DecodePortable, KernelId::W8a16PrefillPortable));
}
