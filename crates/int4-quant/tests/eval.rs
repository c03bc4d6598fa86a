//! `int4_quant::eval` end to end on the tiny random checkpoint the runtime tests share: the f32 path against an
//! f32 reference is identical (KL exactly 0, top-1 agreement 100%, the same perplexity, which matches a
//! straightforward recomputation), a 4-bit path is not (KL > 0), the report has the documented schema,
//! and each bad input gives its documented error.

use std::collections::HashMap;
use std::path::Path;

use int4::layout::GroupSize;
use int4::{Engine, KvType, LoadOptions, RunPath};
use int4_quant::eval::{EvalError, EvalErrorKind, EvalReport, evaluate, evaluate_from, read_text};
use int4_test_support::{Rng, TempDir, tiny_model};
use safetensors::tensor::{Dtype, TensorView};

fn load(dir: &Path, path: RunPath, group: GroupSize) -> Engine {
    Engine::load(dir, &LoadOptions { path, group_size: group, context: 64, cache: None, ..LoadOptions::default() })
        .unwrap()
}

/// `n` words of the tiny model's vocabulary (`w0` … `w95`), pseudo-random, eleven to a line.
fn words(n: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    (0..n)
        .map(|i| {
            let id = ((rng.normal().abs() * 40.0) as usize) % 96;
            format!("w{id}{}", if i % 11 == 10 { "\n" } else { " " })
        })
        .collect()
}

/// A fresh directory holding `files` (name, text).
fn text_dir(name: &str, files: &[(&str, String)]) -> TempDir {
    let dir = TempDir::new(&format!("eval-text-{name}"));
    for (f, t) in files {
        std::fs::write(dir.join(f), t).unwrap();
    }
    dir
}

fn eval_err(path: &Engine, reference: &Engine, dir: &Path, ctx: usize) -> EvalError {
    let docs = read_text(Some(dir)).unwrap();
    match evaluate(path, reference, &docs, ctx, |_, _| {}) {
        Ok(r) => panic!("evaluated without error: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn f32_against_f32_is_identical_and_matches_a_direct_computation() {
    let dir = tiny_model("eval-f32");
    let (a, b) = (load(&dir, RunPath::F32, GroupSize::G128), load(&dir, RunPath::F32, GroupSize::G128));
    // Two documents (in name order; `notes.txt` is not an eval file): 150 tokens in windows of 64 give
    // 64 + 64 + 22 tokens, 149 - 2 = 147 scored; 40 tokens give one window, 39 scored.
    let texts = text_dir(
        "f32",
        &[("eval-02.txt", words(40, 7)), ("eval-01.txt", words(150, 3)), ("notes.txt", "w1 w2".into())],
    );
    let docs = read_text(Some(&texts)).unwrap();
    assert_eq!(docs.len(), 2);
    assert!(docs[0].name.ends_with("eval-01.txt") && docs[1].name.ends_with("eval-02.txt"));
    let mut seen = Vec::new();
    let r = evaluate(&a, &b, &docs, 64, |done, total| seen.push((done, total))).unwrap();
    assert_eq!(seen, [(1, 4), (2, 4), (3, 4), (4, 4)]);
    assert_eq!((r.windows, r.tokens, r.ctx), (4, 147 + 39, 64));
    assert_eq!(r.mean_kl_nats, 0.0, "identical logits have KL 0 exactly");
    assert_eq!(r.top1_agreement, 1.0);
    assert_eq!(r.path.perplexity, r.reference.perplexity);
    assert_eq!(r.path.top1_accuracy, r.reference.top1_accuracy);
    assert_eq!((r.path.numerics.as_str(), r.reference.numerics.as_str()), ("f32", "f32"));

    // The same numbers from a plain f64 softmax over the model's own logits, window by window.
    let v = a.model.config().vocab_size;
    let (mut nll, mut correct, mut n) = (0.0f64, 0usize, 0usize);
    for d in &docs {
        let ids = a.text.encode(&d.text).unwrap();
        for w in ids.chunks(64) {
            let mut cache = a.model.kv_cache(64, 1 << 30).unwrap();
            let logits = a.model.forward(w, &mut cache, true).unwrap();
            for i in 0..w.len() - 1 {
                let row: Vec<f64> = logits[i * v..(i + 1) * v].iter().map(|&x| f64::from(x)).collect();
                let z: f64 = row.iter().map(|x| x.exp()).sum();
                let t = w[i + 1] as usize;
                nll -= (row[t].exp() / z).ln();
                let best = (0..v).fold(0, |b, j| if row[j] > row[b] { j } else { b });
                correct += usize::from(best == t);
                n += 1;
            }
        }
    }
    assert_eq!(n, r.tokens);
    let ppl = (nll / n as f64).exp();
    assert!((r.reference.perplexity / ppl - 1.0).abs() < 1e-9, "{} vs {ppl}", r.reference.perplexity);
    assert_eq!(r.reference.top1_accuracy, correct as f64 / n as f64);
    assert!(r.reference.perplexity.is_finite() && r.reference.perplexity > 1.0, "{}", r.reference.perplexity);
}

#[test]
fn a_quantized_path_differs_from_the_reference() {
    let dir = tiny_model("eval-q");
    let reference = load(&dir, RunPath::F32, GroupSize::G128);
    let texts = text_dir("q", &[("eval-01.txt", words(120, 11))]);
    let docs = read_text(Some(&texts)).unwrap();
    for (path, group, label) in [
        (RunPath::W4a16, GroupSize::G32, "w4a16 g32 (8-bit head), f16 KV"),
        (RunPath::W4a8, GroupSize::G32, "w4a8 g32 (per-group activation scales, 8-bit head), f16 KV"),
        (RunPath::Bf16, GroupSize::G128, "bf16, f16 KV"),
    ] {
        let e = load(&dir, path, group);
        let r = evaluate(&e, &reference, &docs, 48, |_, _| {}).unwrap();
        assert_eq!(r.path.numerics, label);
        assert!(r.mean_kl_nats > 0.0 && r.mean_kl_nats.is_finite(), "{label}: KL {}", r.mean_kl_nats);
        assert!((0.0..=1.0).contains(&r.top1_agreement));
        assert_ne!(r.path.perplexity, r.reference.perplexity, "{label}");
        assert_eq!((r.windows, r.tokens), (3, 117));
        check_schema(&r);
    }
}

/// A reference must be exact: a bf16 reference whose KV cache stores f16 (what speed priority gives the
/// bf16 path) is refused, and the same reference with an f32 cache is taken.
#[test]
fn a_reference_with_a_16_bit_kv_cache_is_refused() {
    let dir = tiny_model("eval-kv");
    let texts = text_dir("kv", &[("eval-01.txt", words(60, 5))]);
    let docs = read_text(Some(&texts)).unwrap();
    let path = load(&dir, RunPath::W4a16, GroupSize::G32);
    let half = load(&dir, RunPath::Bf16, GroupSize::G128);
    assert_eq!(half.model.kv_type(), KvType::F16);
    let e = evaluate(&path, &half, &docs, 48, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("the reference runs bf16, f16 KV") && e.contains("f32 KV cache"), "{e}");
    let opts = LoadOptions {
        path: RunPath::Bf16,
        group_size: GroupSize::G128,
        context: 64,
        cache: None,
        kv: Some(KvType::F32),
        ..LoadOptions::default()
    };
    let exact = Engine::load(&dir, &opts).unwrap();
    assert!(evaluate(&path, &exact, &docs, 48, |_, _| {}).is_ok());
}

/// The `--json` document: the documented keys, and nothing renamed.
fn check_schema(r: &EvalReport) {
    let v = serde_json::to_value(r).unwrap();
    assert_eq!(v["schema"], "int4-eval/1");
    for key in ["top1_agreement", "mean_kl_nats", "tokens", "windows", "ctx", "text"] {
        assert!(!v[key].is_null(), "missing {key}");
    }
    for side in ["path", "reference"] {
        for key in ["model", "numerics", "perplexity", "mean_nll", "top1_accuracy"] {
            assert!(!v[side][key].is_null(), "missing {side}.{key}");
        }
    }
    let md = r.markdown();
    assert!(md.contains("| evaluated (") && md.contains(&format!("{} tokens scored", r.tokens)), "{md}");
}

#[test]
fn bad_text_gives_its_error() {
    let missing = std::env::temp_dir().join(format!("int4-eval-none-{}", std::process::id()));
    let e = read_text(Some(&missing)).unwrap_err();
    assert!(matches!(e.kind(), EvalErrorKind::TextNotFound { default: false, .. }), "{e}");
    assert!(e.to_string().contains("--text"), "{e}");
    if !Path::new(int4_quant::eval::DEFAULT_TEXT_DIR).exists() {
        let e = read_text(None).unwrap_err();
        assert!(matches!(e.kind(), EvalErrorKind::TextNotFound { default: true, .. }), "{e}");
        assert!(e.to_string().contains("--text FILE|DIR"), "{e}");
    }
    let no_eval = text_dir("no-eval", &[("calibration-01.txt", words(20, 1))]);
    assert!(matches!(read_text(Some(&no_eval)).unwrap_err().kind(), EvalErrorKind::NoEvalFiles { .. }));
    let empty = text_dir("empty", &[("eval-01.txt", " \n\t".into())]);
    assert!(matches!(read_text(Some(&empty)).unwrap_err().kind(), EvalErrorKind::EmptyText { .. }));
    let binary = text_dir("binary", &[]);
    std::fs::write(binary.join("eval-01.txt"), [0xffu8, 0xfe, 0x00]).unwrap();
    let e = read_text(Some(&binary)).unwrap_err();
    assert!(matches!(e.kind(), EvalErrorKind::TextFile(_)) && e.to_string().contains("not UTF-8"), "{e}");
    // Not a regular file (`/dev/zero`): refused, never read without end.
    let e = read_text(Some(Path::new("/dev/zero"))).unwrap_err();
    assert!(matches!(e.kind(), EvalErrorKind::TextFile(_)) && e.to_string().contains("character device"), "{e}");

    let dir = tiny_model("eval-bad-text");
    let (a, b) = (load(&dir, RunPath::F32, GroupSize::G128), load(&dir, RunPath::F32, GroupSize::G128));
    let one = text_dir("one-token", &[("eval-01.txt", "w5\n".into())]);
    assert!(matches!(eval_err(&a, &b, &one, 16).kind(), EvalErrorKind::TooFewTokens { tokens: 1 }));
    // A file given directly is used whatever its name.
    let file = one.join("eval-01.txt");
    assert_eq!(read_text(Some(&file)).unwrap().len(), 1);
}

#[test]
fn bad_context_gives_its_error() {
    let dir = tiny_model("eval-bad-ctx");
    let (a, b) = (load(&dir, RunPath::F32, GroupSize::G128), load(&dir, RunPath::F32, GroupSize::G128));
    let texts = text_dir("ctx", &[("eval-01.txt", words(30, 5))]);
    assert!(matches!(eval_err(&a, &b, &texts, 0).kind(), EvalErrorKind::ContextTooSmall { ctx: 0 }));
    assert!(matches!(eval_err(&a, &b, &texts, 1).kind(), EvalErrorKind::ContextTooSmall { ctx: 1 }));
    let e = eval_err(&a, &b, &texts, 257);
    assert!(matches!(e.kind(), EvalErrorKind::ContextTooLarge { ctx: 257, max: 256 }), "{e}");
    assert!(e.to_string().contains("--ctx 257"), "{e}");
    // The model's whole context is allowed.
    let docs = read_text(Some(&texts)).unwrap();
    assert_eq!(evaluate(&a, &b, &docs, 256, |_, _| {}).unwrap().windows, 1);
    // Scoring from a position: only the positions from it on count, and one past the last is refused.
    let all = evaluate(&a, &b, &docs, 16, |_, _| {}).unwrap();
    let half = evaluate_from(&a, &b, &docs, 16, 8, |_, _| {}).unwrap();
    assert_eq!((all.windows, half.windows), (2, 2));
    assert_eq!((all.tokens, half.tokens, half.score_from), (15 + 13, 7 + 5, 8));
    let e = evaluate_from(&a, &b, &docs, 16, 15, |_, _| {}).unwrap_err();
    assert!(matches!(e.kind(), EvalErrorKind::ScoreFromTooLarge { score_from: 15, ctx: 16 }), "{e}");
    assert!(e.to_string().contains("--score-from 15"), "{e}");
}

#[test]
fn models_that_do_not_share_a_tokenizer_are_refused() {
    let dir = tiny_model("eval-tok-a");
    let a = load(&dir, RunPath::F32, GroupSize::G128);
    let texts = text_dir("tok", &[("eval-01.txt", words(30, 9))]);

    // The same weights, a tokenizer that maps every word one id further on.
    let permuted = tiny_model("eval-tok-b");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(permuted.join("tokenizer.json")).unwrap()).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..96).map(|i| (format!("w{i}"), ((i + 1) % 96).into())).collect();
    tok["model"]["vocab"] = vocab.into();
    std::fs::write(permuted.join("tokenizer.json"), tok.to_string()).unwrap();
    let b = load(&permuted, RunPath::F32, GroupSize::G128);
    let e = eval_err(&b, &a, &texts, 16);
    assert!(matches!(e.kind(), EvalErrorKind::TokenizerMismatch { position: 0, .. }), "{e}");

    // A vocabulary one id larger: the embedding (and tied head) padded with a row, the tokenizer unchanged.
    let padded = tiny_model("eval-vocab");
    pad_vocab(&padded);
    let c = load(&padded, RunPath::F32, GroupSize::G128);
    let e = eval_err(&c, &a, &texts, 16);
    assert!(matches!(e.kind(), EvalErrorKind::VocabMismatch { path: 97, reference: 96 }), "{e}");
}

/// Rewrites the tiny model in `dir` with a 97-row embedding and `vocab_size: 97`.
fn pad_vocab(dir: &Path) {
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let (mut shape, mut data) = (t.shape().to_vec(), t.data().to_vec());
            if name == "model.embed_tokens.weight" {
                shape[0] += 1;
                data.extend(std::iter::repeat_n(0u8, shape[1] * 4));
            }
            (name, shape, data)
        })
        .collect();
    owned.sort_by(|x, y| x.0.cmp(&y.0));
    let views: HashMap<String, TensorView<'_>> =
        owned.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &p).unwrap();
    let cfg = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c["vocab_size"] = 97.into();
    std::fs::write(cfg, c.to_string()).unwrap();
}
