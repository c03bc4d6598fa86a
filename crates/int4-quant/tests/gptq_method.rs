//! `int4 quantize --method gptq`: the GPTQ solver against a plain reference, its relation to round to
//! nearest, its determinism, an end-to-end export of the tiny model, and its errors.

use std::path::Path;

use int4::{Engine, LoadOptions, RunPath};
use int4_layout::GroupSize;
use int4_layout::grid::{self, ParamPrecision, ScaleSearch};
use int4_quant::export::{
    ExportFormat, Method, QuantizeError, QuantizeErrorKind, QuantizeOptions, quantize_checkpoint,
};
use int4_quant::gptq_method::{self, GptqErrorKind, GptqOptions, GridKind, GridSpec, Hessian, Prepared, QuantMatrix};
use int4_test_support::{TempDir, tiny_model, tiny_model_with};

struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
    fn normal(&mut self) -> f32 {
        (0..6).map(|_| self.uniform()).sum::<f32>() * std::f32::consts::SQRT_2
    }
}

/// Weights `[n][k]` and inputs `[m][k]` whose channels are strongly correlated (each input mixes a few
/// latent factors), as a transformer's are.
fn problem(n: usize, k: usize, m: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let w: Vec<f32> = (0..n * k).map(|_| 0.1 * rng.normal()).collect();
    let factors = 8;
    let mix: Vec<f32> = (0..factors * k).map(|_| rng.normal()).collect();
    let mut x = vec![0.0f32; m * k];
    for r in 0..m {
        let z: Vec<f32> = (0..factors).map(|_| rng.normal()).collect();
        for c in 0..k {
            let mut v = 0.1 * rng.normal();
            for f in 0..factors {
                v += z[f] * mix[f * k + c];
            }
            x[r * k + c] = v;
        }
    }
    (w, x)
}

fn hessian(x: &[f32], m: usize, k: usize) -> Vec<f64> {
    let mut h = Hessian::new(k);
    h.add(x, m);
    h.mean()
}

fn spec(kind: GridKind, group: GroupSize, search: ScaleSearch) -> GridSpec {
    let precision = if kind == GridKind::Asymmetric { ParamPrecision::F32 } else { ParamPrecision::F16 };
    GridSpec { kind, group, search, precision }
}

/// The plain algorithm, written for clarity: every column in order, its error pushed into every later
/// column of the row at once; a group's parameters from the grid on the row's current values of the group
/// (one row at a time); codes by the grid's own rule (`round_ties_even`, clamped).
#[allow(clippy::needless_range_loop)] // written as the algorithm reads, index by index
fn reference(w: &[f32], n: usize, k: usize, prep: &Prepared, g: GridSpec) -> QuantMatrix {
    assert_ne!(g.kind, GridKind::Asymmetric, "the reference covers the integer-zero-point grids");
    let (g_len, groups) = (g.group.len(k), g.group.groups(k));
    let mut w = w.to_vec();
    let mut codes = vec![0u8; n * k];
    let mut scales = vec![0.0f32; n * groups];
    let mut zeros = vec![0u8; n * groups];
    for r in 0..n {
        let row = &mut w[r * k..(r + 1) * k];
        for (c, v) in row.iter_mut().enumerate() {
            if prep.dead[c] {
                *v = 0.0;
            }
        }
        let (mut s, mut z) = (0.0f32, 0u8);
        for j in 0..k {
            if j % g_len == 0 {
                let vals = &row[j..(j + g_len).min(k)];
                (s, z) = match g.kind {
                    GridKind::Symmetric => {
                        let q =
                            grid::quantize_symmetric(vals, 1, vals.len(), GroupSize::PerChannel, g.search, g.precision)
                                .unwrap();
                        (q.params.scales()[0], 8)
                    }
                    _ => {
                        let q = grid::quantize_integer_zero(
                            vals,
                            1,
                            vals.len(),
                            GroupSize::PerChannel,
                            g.search,
                            g.precision,
                        )
                        .unwrap();
                        (q.params.scales()[0], q.zero_points.as_deref().unwrap()[0])
                    }
                };
                scales[r * groups + j / g_len] = s;
                zeros[r * groups + j / g_len] = z;
            }
            let x = row[j];
            let q = ((x / s).round_ties_even() + f32::from(z)).clamp(0.0, 15.0) as u8;
            codes[r * k + j] = q;
            let e = (x - (f32::from(q) - f32::from(z)) * s) / prep.u[j * k + j];
            for c in j + 1..k {
                row[c] -= e * prep.u[j * k + c];
            }
        }
    }
    QuantMatrix::with_zero_points(int4_layout::Codes::new(n, k, codes).unwrap(), g.group, scales, zeros).unwrap()
}

/// The blocked, row-parallel solver gives exactly the plain algorithm's codes, scales and zero points:
/// groups inside blocks (32, 64), equal to them (128), across them (256 and per-row, K = 320 = 2.5 blocks),
/// a partial last group, N not a multiple of the row chunk, with and without search.
#[test]
fn solver_matches_plain_reference() {
    let (n, k, m) = (37, 320, 400);
    let (w, x) = problem(n, k, m, 11);
    let prep = gptq_method::prepare(&hessian(&x, m, k), k, 0.01, "test").unwrap();
    for kind in [GridKind::Symmetric, GridKind::IntegerZero] {
        for group in [GroupSize::G32, GroupSize::G64, GroupSize::G128, GroupSize::G256, GroupSize::PerChannel] {
            for search in [ScaleSearch::Off, ScaleSearch::Shrink] {
                let g = spec(kind, group, search);
                let got = gptq_method::solve(&w, n, k, &prep, g, "test").unwrap();
                let want = reference(&w, n, k, &prep, g);
                assert_eq!(got, want, "{kind:?} {group:?} {search:?}");
            }
        }
    }
}

/// With `H = I` there is nothing to compensate (`U` is diagonal): GPTQ is round to nearest, code for
/// code, on every grid (the asymmetric one included, with its f32 float zero).
#[test]
fn identity_hessian_gives_round_to_nearest() {
    let (n, k) = (24, 192);
    let (w, _) = problem(n, k, 1, 5);
    let mut h = vec![0.0f64; k * k];
    for i in 0..k {
        h[i * k + i] = 1.0;
    }
    let prep = gptq_method::prepare(&h, k, 0.01, "test").unwrap();
    for kind in [GridKind::Asymmetric, GridKind::Symmetric, GridKind::IntegerZero] {
        for group in [GroupSize::G32, GroupSize::G128, GroupSize::PerChannel] {
            for search in [ScaleSearch::Off, ScaleSearch::Shrink] {
                let g = spec(kind, group, search);
                let got = gptq_method::solve(&w, n, k, &prep, g, "test").unwrap();
                let rtn = gptq_method::rtn(&w, n, k, g).unwrap();
                assert_eq!(got, rtn, "{kind:?} {group:?} {search:?}");
            }
        }
    }
}

/// On correlated inputs GPTQ's output error `tr(ΔHΔᵀ)` is well below round to nearest's (at most 70% of
/// it on every grid; it is typically a third to a half), while its weight error is larger: it trades
/// weight error for output error.
#[test]
fn gptq_lowers_output_error_on_correlated_inputs() {
    let (n, k, m) = (64, 256, 1024);
    let (w, x) = problem(n, k, m, 3);
    let h = hessian(&x, m, k);
    let prep = gptq_method::prepare(&h, k, 0.01, "test").unwrap();
    for kind in [GridKind::Asymmetric, GridKind::Symmetric, GridKind::IntegerZero] {
        let g = spec(kind, GroupSize::G64, ScaleSearch::Shrink);
        let q = gptq_method::solve(&w, n, k, &prep, g, "test").unwrap();
        let r = gptq_method::rtn(&w, n, k, g).unwrap();
        let (eq, er) =
            (gptq_method::output_energy(&w, Some(&q), n, k, &h), gptq_method::output_energy(&w, Some(&r), n, k, &h));
        assert!(eq < 0.7 * er, "{kind:?}: GPTQ output error {eq:.4e} is not clearly below RTN's {er:.4e}");
        let werr =
            |l: &QuantMatrix| -> f64 { (0..n * k).map(|i| f64::from(w[i] - l.weight(i / k, i % k)).powi(2)).sum() };
        assert!(werr(&q) > werr(&r), "{kind:?}: GPTQ should give up some weight error");
        // The plain trace (in f64, no GEMM) agrees with output_energy.
        let d: Vec<f64> = (0..n * k).map(|i| f64::from(w[i] - q.weight(i / k, i % k))).collect();
        let mut t = 0.0f64;
        for row in d.chunks_exact(k) {
            for i in 0..k {
                for j in 0..k {
                    t += row[i] * h[i * k + j] * row[j];
                }
            }
        }
        assert!((t - eq).abs() <= 1e-3 * t, "{kind:?}: trace {t} vs output_energy {eq}");
    }
}

/// Hessian, factorisation and solver give the same bits on 1 and 2 threads.
#[test]
fn deterministic_across_thread_counts() {
    let (n, k, m) = (72, 256, 300);
    let (w, x) = problem(n, k, m, 9);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let h = hessian(&x, m, k);
            let prep = gptq_method::prepare(&h, k, 0.01, "test").unwrap();
            let q = gptq_method::solve(
                &w,
                n,
                k,
                &prep,
                spec(GridKind::IntegerZero, GroupSize::G32, ScaleSearch::Shrink),
                "t",
            )
            .unwrap();
            let e = gptq_method::output_energy(&w, Some(&q), n, k, &h);
            (h, prep.u, q, e.to_bits())
        })
    };
    let (a, b) = (run(1), run(2));
    assert!(a.0 == b.0, "Hessian differs");
    assert!(a.1 == b.1, "U differs");
    assert!(a.2 == b.2, "codes differ");
    assert_eq!(a.3, b.3, "output error differs");
}

fn scratch(name: &str) -> TempDir {
    TempDir::unmade(&format!("gptq-{name}"))
}

/// Calibration text for the tiny model's word-level tokenizer (`w0` … `w95`).
fn calib_file(name: &str, words: usize) -> TempDir {
    let path = TempDir::unmade(&format!("gptq-{name}.txt"));
    let mut rng = Rng(77);
    let text: Vec<String> = (0..words).map(|_| format!("w{}", ((rng.uniform() + 0.5) * 95.0) as usize % 96)).collect();
    std::fs::write(&path, text.join(" ")).unwrap();
    path
}

fn gptq_opts(format: ExportFormat, asym: bool, calib: Option<&Path>) -> QuantizeOptions {
    QuantizeOptions {
        method: Method::Gptq,
        gptq: GptqOptions { calib: calib.map(Path::to_path_buf), seq_len: 64, max_tokens: 1000, damp: 0.01 },
        asym,
        group: GroupSize::G32,
        ..QuantizeOptions::new(format)
    }
}

/// The tiny model exported with GPTQ in each format loads and runs through the engine (f32 path on the
/// decoded weights, and the 4-bit paths on the codes as stored); the report says gptq, the calibration
/// (sequential, 1000 tokens in 16 sequences), and every layer's output SNR, which beats RTN's on the
/// same Hessian overall.
#[test]
fn tiny_model_export_loads_and_runs() {
    let src = tiny_model("gptq-e2e");
    let calib = calib_file("e2e", 1500);
    for (format, asym, name) in
        [(ExportFormat::Gptq, false, "sym"), (ExportFormat::Gptq, true, "asym"), (ExportFormat::CpuInt4, false, "cpu")]
    {
        let out = scratch(name);
        let report = quantize_checkpoint(&src, &out, &gptq_opts(format, asym, Some(&calib)), None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.method, "gptq");
        let c = report.calibration.as_ref().expect("calibration report");
        assert_eq!((c.tokens, c.sequences, c.seq_len), (1000, 16, 64));
        assert!(c.sequential && c.damp == 0.01);
        assert_eq!(report.tensors.len(), 2 * 7 + 1, "every linear and the head");
        let (mut gain, mut layers) = (0.0, 0);
        for t in &report.tensors {
            assert_eq!(t.method, "gptq");
            let (o, r) = (t.output_snr_db.expect("output SNR"), t.rtn_output_snr_db.expect("RTN output SNR"));
            assert!(o.is_finite() && r.is_finite(), "{}", t.name);
            gain += o - r;
            layers += 1;
        }
        assert!(gain / f64::from(layers) > 0.5, "{name}: GPTQ's mean output-SNR gain over RTN is {gain}/{layers} dB");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("quantization_report.json")).unwrap()).unwrap();
        assert_eq!(json["method"], "gptq");
        assert_eq!(json["calibration"]["tokens"], 1000);
        assert!(json["tensors"][0]["output_snr_db"].is_number());

        let mut paths = vec![RunPath::F32, RunPath::W4a16];
        if format == ExportFormat::Gptq {
            paths.push(RunPath::W4a8);
        }
        for path in paths {
            let e = Engine::load(&out, &LoadOptions { path, cache: None, ..LoadOptions::default() })
                .unwrap_or_else(|e| panic!("{name} {path:?}: {e}"));
            let mut cache = e.new_cache().unwrap();
            let logits = e.model.forward(&[1, 17, 33, 5, 90, 44], &mut cache, false).unwrap();
            assert!(logits.iter().all(|v| v.is_finite()), "{name} {path:?}");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    let _ = std::fs::remove_file(&calib);
}

/// The export's error, which must be a GPTQ error (see [`gptq_kind`]).
fn gptq_err(r: Result<int4_quant::export::QuantizeReport, QuantizeError>) -> QuantizeError {
    match r {
        Err(e) if matches!(e.kind(), QuantizeErrorKind::Gptq(_)) => e,
        Err(e) => panic!("not a GPTQ error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

/// What went wrong in a GPTQ error returned by the export.
fn gptq_kind(e: &QuantizeError) -> &GptqErrorKind {
    match e.kind() {
        QuantizeErrorKind::Gptq(g) => g.kind(),
        _ => panic!("not a GPTQ error: {e}"),
    }
}

/// Bad input is a typed error that names the problem, and leaves nothing at the output.
#[test]
fn bad_input_is_a_typed_error() {
    let src = tiny_model("gptq-bad");
    let out = scratch("bad");
    let run = |o: &QuantizeOptions| quantize_checkpoint(&src, &out, o, None);

    let e = gptq_err(run(&gptq_opts(ExportFormat::Gptq, false, None)));
    assert!(matches!(gptq_kind(&e), GptqErrorKind::NoCalibration), "{e}");
    assert!(e.to_string().contains("--calib"), "{e}");

    let missing = std::env::temp_dir().join("int4-gptq-no-such-file.txt");
    let e = gptq_err(run(&gptq_opts(ExportFormat::Gptq, false, Some(&missing))));
    assert!(matches!(gptq_kind(&e), GptqErrorKind::CalibrationUnreadable { .. }), "{e}");
    assert!(e.to_string().contains("int4-gptq-no-such-file.txt"), "{e}");
    // Not a regular file: refused, never read without end.
    let e = gptq_err(run(&gptq_opts(ExportFormat::Gptq, false, Some(Path::new("/dev/zero")))));
    assert!(matches!(gptq_kind(&e), GptqErrorKind::CalibrationFile(_)), "{e}");
    assert!(e.to_string().contains("character device"), "{e}");

    let empty = TempDir::unmade("gptq-empty.txt");
    std::fs::write(&empty, "  \n\n ").unwrap();
    let e = gptq_err(run(&gptq_opts(ExportFormat::Gptq, false, Some(&empty))));
    assert!(matches!(gptq_kind(&e), GptqErrorKind::CalibrationEmpty { .. }), "{e}");

    let empty_dir = scratch("empty-dir");
    std::fs::create_dir_all(&empty_dir).unwrap();
    std::fs::write(empty_dir.join("notes.md"), "w1 w2").unwrap();
    let e = gptq_err(run(&gptq_opts(ExportFormat::Gptq, false, Some(&empty_dir))));
    assert!(matches!(gptq_kind(&e), GptqErrorKind::CalibrationEmpty { .. }), "{e}");

    let calib = calib_file("bad", 300);
    let bad_damp = QuantizeOptions {
        gptq: GptqOptions { damp: f64::NAN, ..gptq_opts(ExportFormat::Gptq, false, Some(&calib)).gptq },
        ..gptq_opts(ExportFormat::Gptq, false, Some(&calib))
    };
    assert!(matches!(gptq_kind(&gptq_err(run(&bad_damp))), GptqErrorKind::Options(_)));
    assert!(!out.exists(), "an error left {}", out.display());

    // Activations that overflow f32: the gate projection scaled by 1e20 makes the down projection's inputs
    // (and so their Hessian) infinite.
    let huge = tiny_model_with("gptq-huge", |name, w| {
        if name.ends_with("layers.0.mlp.gate_proj.weight") { w.iter().map(|v| v * 1e20).collect() } else { w }
    });
    let e = gptq_err(quantize_checkpoint(&huge, &out, &gptq_opts(ExportFormat::Gptq, false, Some(&calib)), None));
    match gptq_kind(&e) {
        GptqErrorKind::NonFiniteHessian { layer, .. } => assert!(layer.contains("layers.0"), "{e}"),
        _ => panic!("not a non-finite Hessian: {e}"),
    }
    assert!(!out.exists(), "an error left {}", out.display());
    for f in [&empty, &calib] {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_dir_all(&empty_dir);
}
