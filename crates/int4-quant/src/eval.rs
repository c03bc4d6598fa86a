//! Fidelity as a measurement anyone can repeat: perplexity and agreement of one path against a reference,
//! teacher-forced over a text.
//!
//! Why this exists: a faster path (4-bit weights, int8 activations, bf16) is only worth having if it stays
//! close to the model as shipped, and greedy text is a brittle way to see that (a 135M model has many
//! near-ties, so one flipped token changes everything after it). Teacher forcing asks every position the
//! same question of both models — given the true prefix, what comes next — so each position is scored on
//! its own, and the numbers add up over a text.
//!
//! How: the text (one file, or the `eval-*.txt` files of a directory, in name order) is tokenized with the
//! evaluated model's tokenizer, each file on its own, and cut into non-overlapping windows of `ctx` tokens
//! (the last window of a file may be shorter; a window of one token scores nothing and is dropped). Each
//! window runs as one prefill with every position's logits, in a fresh KV cache, through both models. The
//! first token of a window is context only; every later token is scored, so a window of `L` tokens scores
//! `L − 1` positions. No BOS token is added: the windows are the text's own tokens.
//!
//! Per scored position, in f64 with a max-shifted log-sum-exp (so no logit overflows):
//!
//! * the negative log-likelihood of the actual next token, for both models; perplexity is `exp` of its
//!   mean;
//! * whether each model's top-1 (the lowest id among equal maxima, as greedy decoding picks) is the actual
//!   next token;
//! * whether the two models' top-1 agree;
//! * `KL(ref ‖ path) = Σ p_ref · (log p_ref − log p_path)` in nats (clamped at 0 per position, as rounding
//!   can leave a sum of exactly-equal terms a few ulps below it).
//!
//! The reference and the evaluated model must share a vocabulary and tokenize the text the same way (checked:
//! the text is tokenized by both), or the comparison would be of different questions.
//!
//! The report ([`EvalReport`]) serialises as the `int4 eval --json` document, schema `int4-eval/1`:
//!
//! ```json
//! {
//!   "schema": "int4-eval/1",
//!   "path":      {"model": "DIR", "numerics": "w4a16 g32", "perplexity": 9.1, "mean_nll": 2.2, "top1_accuracy": 0.48},
//!   "reference": {"model": "DIR", "numerics": "f32",       "perplexity": 8.9, "mean_nll": 2.1, "top1_accuracy": 0.49},
//!   "top1_agreement": 0.91,
//!   "mean_kl_nats": 0.05,
//!   "tokens": 2400,
//!   "windows": 5,
//!   "ctx": 512,
//!   "text": ["data/text/eval-01.txt"]
//! }
//! ```
//!
//! `tokens` is the number of scored positions; `top1_accuracy` and `top1_agreement` are fractions in
//! `[0, 1]` (the table prints percentages); `numerics` names what actually ran (`f32`, `bf16`,
//! `w4a16 gN`, `wna16 gN`, `w4a8 gN`, followed by `, f16 KV` where the KV cache stores f16). Fields may be added under the same schema name; none will be
//! renamed or change meaning without a new one.

use std::fmt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use int4::{Engine, HeadBits, KvType, Model, Numerics, argmax};

/// The `schema` field of an [`EvalReport`].
pub const SCHEMA: &str = "int4-eval/1";

/// Where `int4 eval` looks for the evaluation text when `--text` is not given (relative to the current
/// directory: the repository's committed `eval-*.txt` files).
pub const DEFAULT_TEXT_DIR: &str = "data/text";

/// The most bytes read from one text file, for evaluation or for GPTQ's calibration (the repository's
/// texts are tens of KiB; a file over the cap is an error naming it, not a read without end).
pub const TEXT_CAP: u64 = 64 << 20;

/// Why an evaluation could not be run: what went wrong is its [`kind`](EvalError::kind).
#[derive(Debug)]
pub struct EvalError {
    kind: EvalErrorKind,
}

/// What went wrong in an evaluation.
#[derive(Debug)]
#[non_exhaustive]
pub enum EvalErrorKind {
    /// The text path does not exist (`default`: it was the default, not a `--text` the user gave).
    TextNotFound {
        /// The path looked at.
        path: PathBuf,
        /// Whether it was [`DEFAULT_TEXT_DIR`].
        default: bool,
    },
    /// A directory with no `eval-*.txt` file in it.
    NoEvalFiles {
        /// The directory.
        dir: PathBuf,
    },
    /// A text file, or the directory holding them, could not be read (or a file is not UTF-8).
    ReadText {
        /// The file or directory.
        path: PathBuf,
        /// The error reading it.
        source: std::io::Error,
    },
    /// A text file that is not a regular file, is larger than [`TEXT_CAP`], or is not UTF-8.
    TextFile(int4_files::FileError),
    /// A text file holds no text (only whitespace, or nothing).
    EmptyText {
        /// The file.
        path: PathBuf,
    },
    /// The whole text is shorter than two tokens, so there is no next token to score.
    TooFewTokens {
        /// Tokens in the longest document.
        tokens: usize,
    },
    /// `ctx` below 2: a window of one token scores nothing.
    ContextTooSmall {
        /// The context asked for.
        ctx: usize,
    },
    /// `score_from` leaves no position of a `ctx`-token window to score.
    ScoreFromTooLarge {
        /// The first position asked for.
        score_from: usize,
        /// The window length.
        ctx: usize,
    },
    /// `ctx` beyond what a model was trained for (`max_position_embeddings`).
    ContextTooLarge {
        /// The context asked for.
        ctx: usize,
        /// The smaller of the two models' maxima.
        max: usize,
    },
    /// The two models' vocabularies differ in size.
    VocabMismatch {
        /// The evaluated model's vocabulary size.
        path: usize,
        /// The reference's.
        reference: usize,
    },
    /// The two tokenizers split the text differently.
    TokenizerMismatch {
        /// The document where they first differ.
        document: String,
        /// The first token index that differs.
        position: usize,
    },
    /// A reference that is not exact (f32 or bf16 weights): a 4-bit reference would measure nothing.
    InexactReference {
        /// What the reference runs ([`numerics_label`]).
        numerics: String,
    },
    /// A model produced a NaN or infinite logit.
    NonFiniteLogits {
        /// `path` or `reference`.
        model: &'static str,
        /// The window (0-based, over all documents).
        window: usize,
        /// The position in the window.
        position: usize,
    },
    /// Loading or running a model failed.
    Model(int4::Error),
}

impl EvalError {
    pub(crate) fn new(kind: EvalErrorKind) -> Self {
        EvalError { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &EvalErrorKind {
        &self.kind
    }
}

impl From<EvalErrorKind> for EvalError {
    fn from(kind: EvalErrorKind) -> Self {
        EvalError::new(kind)
    }
}

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            EvalErrorKind::TextNotFound { path, default: true } => write!(
                f,
                "no evaluation text at {} (the default, relative to the current directory, for the \
                 repository's eval-*.txt files): pass --text FILE|DIR",
                path.display()
            ),
            EvalErrorKind::TextNotFound { path, default: false } => {
                write!(f, "--text {}: no such file or directory", path.display())
            }
            EvalErrorKind::NoEvalFiles { dir } => {
                write!(f, "--text {}: the directory has no eval-*.txt file (pass a file to use another)", dir.display())
            }
            EvalErrorKind::ReadText { path, source } => write!(f, "{}: {source}", path.display()),
            EvalErrorKind::TextFile(e) => write!(f, "{e}"),
            EvalErrorKind::EmptyText { path } => write!(f, "{}: the evaluation text is empty", path.display()),
            EvalErrorKind::TooFewTokens { tokens } => write!(
                f,
                "the evaluation text is too short: {tokens} token(s) at most per document, and at least 2 are \
                 needed to score a next token"
            ),
            EvalErrorKind::ScoreFromTooLarge { score_from, ctx } => write!(
                f,
                "--score-from {score_from}: a window of {ctx} tokens scores positions 0..{} only",
                ctx.saturating_sub(1)
            ),
            EvalErrorKind::ContextTooSmall { ctx } => {
                write!(f, "--ctx {ctx}: must be at least 2 (a window scores every token after its first)")
            }
            EvalErrorKind::ContextTooLarge { ctx, max } => {
                write!(f, "--ctx {ctx}: larger than the model's context ({max} positions)")
            }
            EvalErrorKind::VocabMismatch { path, reference } => write!(
                f,
                "the evaluated model's vocabulary ({path} ids) differs from the reference's ({reference}): \
                 compare models that share a tokenizer"
            ),
            EvalErrorKind::TokenizerMismatch { document, position } => write!(
                f,
                "{document}: the evaluated model and the reference tokenize the text differently (first at token \
                 {position}): compare models that share a tokenizer"
            ),
            EvalErrorKind::InexactReference { numerics } => {
                write!(f, "the reference runs {numerics}: it must be exact, bf16 or f32 with an f32 KV cache")
            }
            EvalErrorKind::NonFiniteLogits { model, window, position } => {
                write!(f, "the {model} model produced a non-finite logit (window {window}, position {position})")
            }
            EvalErrorKind::Model(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EvalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            EvalErrorKind::ReadText { source, .. } => Some(source),
            EvalErrorKind::TextFile(e) => Some(e),
            EvalErrorKind::Model(e) => Some(e),
            _ => None,
        }
    }
}

impl From<int4::Error> for EvalError {
    fn from(e: int4::Error) -> Self {
        EvalError::new(EvalErrorKind::Model(e))
    }
}

/// What ran, in words: `f32`, `bf16`, `w4a16 g32`, `wna16 g128`, `w4a8 g32 (per-group activation scales)`.
pub fn numerics_label(n: Numerics) -> String {
    let g = |g: int4::layout::GroupSize| match g.to_checkpoint() {
        -1 => "per-channel".to_string(),
        v => format!("g{v}"),
    };
    match n {
        Numerics::F32 { .. } => "f32".into(),
        Numerics::Bf16 { .. } => "bf16".into(),
        Numerics::W4a16 { group, head, .. } => {
            let head = if head == HeadBits::Eight { " (8-bit head)" } else { "" };
            format!("w4a16 {}{head}", g(group))
        }
        Numerics::Wna16 { group, head, .. } => {
            let head = if head == HeadBits::Eight { " (8-bit head)" } else { "" };
            format!("wna16 {}{head}", g(group))
        }
        Numerics::W4a8 { group, activations, head, .. } => {
            let head = if head == HeadBits::Eight { ", 8-bit head" } else { "" };
            format!("w4a8 {} ({} activation scales{head})", g(group), activations.name())
        }
        Numerics::W8a8 { activations, .. } => format!("w8a8 g32 ({} activation scales)", activations.name()),
        Numerics::W8a16 { .. } => "w8a16 g32".into(),
    }
}

/// What a model runs: [`numerics_label`], and `, f16 KV` where its KV cache stores f16.
fn run_label(model: &Model) -> String {
    match model.kv_type() {
        KvType::F32 => numerics_label(model.numerics()),
        kv => format!("{}, {kv} KV", numerics_label(model.numerics())),
    }
}

/// One text file to evaluate on.
#[derive(Clone, Debug)]
pub struct Document {
    /// Its path, as given (for reports and errors).
    pub name: String,
    /// Its text.
    pub text: String,
}

/// Reads the evaluation text at `path`: a file, or a directory's `eval-*.txt` files in name order.
/// `None` means [`DEFAULT_TEXT_DIR`] (relative to the current directory).
pub fn read_text(path: Option<&Path>) -> Result<Vec<Document>, EvalError> {
    let default = path.is_none();
    let path = path.unwrap_or(Path::new(DEFAULT_TEXT_DIR));
    if !path.exists() {
        return Err(EvalErrorKind::TextNotFound { path: path.to_path_buf(), default }.into());
    }
    let files: Vec<PathBuf> = if path.is_dir() {
        let entries =
            std::fs::read_dir(path).map_err(|source| EvalErrorKind::ReadText { path: path.to_path_buf(), source })?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| EvalErrorKind::ReadText { path: path.to_path_buf(), source })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("eval-") && name.ends_with(".txt") && entry.path().is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(EvalErrorKind::NoEvalFiles { dir: path.to_path_buf() }.into());
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    files
        .into_iter()
        .map(|f| {
            let text = int4_files::read_text_capped(&f, TEXT_CAP).map_err(EvalErrorKind::TextFile)?;
            if text.trim().is_empty() {
                return Err(EvalErrorKind::EmptyText { path: f }.into());
            }
            Ok(Document { name: f.display().to_string(), text })
        })
        .collect()
}

/// The scores of one position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PositionScore {
    /// The reference's negative log-likelihood of the next token (nats).
    pub ref_nll: f64,
    /// The evaluated path's.
    pub path_nll: f64,
    /// The reference's top-1 is the next token.
    pub ref_correct: bool,
    /// The path's top-1 is the next token.
    pub path_correct: bool,
    /// The two top-1s are the same token.
    pub agree: bool,
    /// `KL(ref ‖ path)` in nats.
    pub kl: f64,
}

/// `log Σ exp(l)` in f64, shifted by the maximum so nothing overflows; NaN if a logit is NaN or infinite.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let m = logits.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(f64::from(b)));
    if !m.is_finite() || logits.iter().any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    m + logits.iter().map(|&v| (f64::from(v) - m).exp()).sum::<f64>().ln()
}

/// `log softmax(l)` in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let z = log_sum_exp(logits);
    logits.iter().map(|&v| f64::from(v) - z).collect()
}

/// `KL(p ‖ q)` in nats for the distributions `softmax(p_logits)` and `softmax(q_logits)` (0 for identical
/// logits, exactly), clamped at 0.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    kl_with(p_logits, log_sum_exp(p_logits), q_logits, log_sum_exp(q_logits))
}

fn kl_with(p: &[f32], zp: f64, q: &[f32], zq: f64) -> f64 {
    let kl: f64 = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| {
            let (la, lb) = (f64::from(a) - zp, f64::from(b) - zq);
            la.exp() * (la - lb)
        })
        .sum();
    kl.max(0.0)
}

/// The scores of one position: `reference` and `path` are the two models' logits there, `next` the actual
/// next token. `None` if either holds a NaN or infinite logit (or `next` is outside the vocabulary).
pub fn score_position(reference: &[f32], path: &[f32], next: u32) -> Option<PositionScore> {
    let (zr, zp) = (log_sum_exp(reference), log_sum_exp(path));
    let (t, n) = (next as usize, reference.len());
    if !zr.is_finite() || !zp.is_finite() || t >= n || path.len() != n {
        return None;
    }
    let (ar, ap) = (argmax(reference), argmax(path));
    Some(PositionScore {
        ref_nll: zr - f64::from(reference[t]),
        path_nll: zp - f64::from(path[t]),
        ref_correct: ar == next,
        path_correct: ap == next,
        agree: ar == ap,
        kl: kl_with(reference, zr, path, zp),
    })
}

/// Sums of [`PositionScore`]s, added in order (so the totals do not depend on the thread count).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Positions scored.
    pub positions: usize,
    /// Σ reference NLL.
    pub ref_nll: f64,
    /// Σ path NLL.
    pub path_nll: f64,
    /// Positions where the reference's top-1 is the next token.
    pub ref_correct: usize,
    /// Positions where the path's top-1 is the next token.
    pub path_correct: usize,
    /// Positions where the two top-1s agree.
    pub agree: usize,
    /// Σ KL(ref ‖ path).
    pub kl: f64,
}

impl Tally {
    /// Adds one position.
    pub fn push(&mut self, s: PositionScore) {
        self.positions += 1;
        self.ref_nll += s.ref_nll;
        self.path_nll += s.path_nll;
        self.ref_correct += usize::from(s.ref_correct);
        self.path_correct += usize::from(s.path_correct);
        self.agree += usize::from(s.agree);
        self.kl += s.kl;
    }

    fn frac(&self, n: usize) -> f64 {
        if self.positions == 0 { f64::NAN } else { n as f64 / self.positions as f64 }
    }

    fn mean(&self, s: f64) -> f64 {
        if self.positions == 0 { f64::NAN } else { s / self.positions as f64 }
    }

    /// `exp(mean NLL)` of the reference.
    pub fn ref_perplexity(&self) -> f64 {
        self.mean(self.ref_nll).exp()
    }

    /// `exp(mean NLL)` of the path.
    pub fn path_perplexity(&self) -> f64 {
        self.mean(self.path_nll).exp()
    }

    /// Fraction of positions where the two top-1s agree.
    pub fn top1_agreement(&self) -> f64 {
        self.frac(self.agree)
    }

    /// Mean KL(ref ‖ path) in nats.
    pub fn mean_kl(&self) -> f64 {
        self.mean(self.kl)
    }
}

/// One model's scores in an [`EvalReport`].
#[derive(Clone, Debug, Serialize)]
pub struct ModelScores {
    /// The model directory.
    pub model: PathBuf,
    /// What ran ([`numerics_label`]).
    pub numerics: String,
    /// `exp(mean_nll)`.
    pub perplexity: f64,
    /// Mean negative log-likelihood of the next token, nats.
    pub mean_nll: f64,
    /// Fraction of positions whose top-1 is the next token.
    pub top1_accuracy: f64,
}

/// The result of [`evaluate`]; serialises as the `int4-eval/1` document (see the module docs).
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// The evaluated path.
    pub path: ModelScores,
    /// The reference.
    pub reference: ModelScores,
    /// Fraction of positions where the path's top-1 is the reference's.
    pub top1_agreement: f64,
    /// Mean KL(reference ‖ path), nats.
    pub mean_kl_nats: f64,
    /// Positions scored.
    pub tokens: usize,
    /// Windows run.
    pub windows: usize,
    /// Tokens per window at most.
    pub ctx: usize,
    /// The first position scored in each window.
    pub score_from: usize,
    /// The documents, in order.
    pub text: Vec<String>,
}

impl EvalReport {
    /// The report as a small markdown table, with a line saying what was scored.
    pub fn markdown(&self) -> String {
        let pct = |f: f64| format!("{:.1}%", 100.0 * f);
        let mut s = String::new();
        s.push_str(
            "| model | numerics | perplexity | top-1 = next token | top-1 agreement | mean KL(ref ‖ path), nats |\n",
        );
        s.push_str("|---|---|---|---|---|---|\n");
        for (role, m, agree, kl) in [
            ("reference", &self.reference, "—".to_string(), "—".to_string()),
            ("evaluated", &self.path, pct(self.top1_agreement), format!("{:.4}", self.mean_kl_nats)),
        ] {
            s.push_str(&format!(
                "| {role} ({}) | {} | {:.3} | {} | {agree} | {kl} |\n",
                m.model.display(),
                m.numerics,
                m.perplexity,
                pct(m.top1_accuracy)
            ));
        }
        s.push_str(&format!(
            "\n{} tokens scored in {} windows of at most {} tokens{}, from {}\n",
            self.tokens,
            self.windows,
            self.ctx,
            if self.score_from > 0 { format!(" (from position {} of each)", self.score_from) } else { String::new() },
            self.text.join(", ")
        ));
        s
    }
}

/// Checks `ctx` on its own (before any model is loaded): at least 2.
pub fn check_ctx(ctx: usize) -> Result<(), EvalError> {
    if ctx < 2 { Err(EvalErrorKind::ContextTooSmall { ctx }.into()) } else { Ok(()) }
}

/// Checks that `path` and `reference` can be compared with windows of `ctx` tokens: `ctx` within both
/// models' context, and the same vocabulary size.
pub fn check_models(path: &Model, reference: &Model, ctx: usize) -> Result<(), EvalError> {
    check_ctx(ctx)?;
    let max = path.config().max_position_embeddings.min(reference.config().max_position_embeddings);
    if ctx > max {
        return Err(EvalErrorKind::ContextTooLarge { ctx, max }.into());
    }
    let (vp, vr) = (path.config().vocab_size, reference.config().vocab_size);
    if vp != vr {
        return Err(EvalErrorKind::VocabMismatch { path: vp, reference: vr }.into());
    }
    Ok(())
}

/// Runs `window` through `model` as one prefill in a fresh KV cache of `window.len()` positions and returns
/// every position's logits, `[window.len()][vocab]`.
fn window_logits(model: &Model, window: &[u32]) -> Result<Vec<f32>, EvalError> {
    let mut cache = model.kv_cache(window.len(), usize::MAX)?;
    Ok(model.forward(window, &mut cache, true)?)
}

/// Teacher-forced comparison of `path` against `reference` over `docs` in windows of `ctx` tokens (see the
/// module docs); `progress(done, total)` is told after each window.
pub fn evaluate(
    path: &Engine,
    reference: &Engine,
    docs: &[Document],
    ctx: usize,
    progress: impl FnMut(usize, usize),
) -> Result<EvalReport, EvalError> {
    evaluate_from(path, reference, docs, ctx, 0, progress)
}

/// [`evaluate`], scoring only the positions from `score_from` on in each window (each still sees the
/// whole window before it). `llama-perplexity` scores from `ctx/2`: with that, the two tools' figures
/// cover the same positions of the same windows.
pub fn evaluate_from(
    path: &Engine,
    reference: &Engine,
    docs: &[Document],
    ctx: usize,
    score_from: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalReport, EvalError> {
    check_models(&path.model, &reference.model, ctx)?;
    if !matches!(reference.model.numerics(), Numerics::F32 { .. } | Numerics::Bf16 { .. })
        || reference.model.kv_type() != KvType::F32
    {
        return Err(EvalErrorKind::InexactReference { numerics: run_label(&reference.model) }.into());
    }
    if score_from + 1 >= ctx {
        return Err(EvalErrorKind::ScoreFromTooLarge { score_from, ctx }.into());
    }
    let mut windows: Vec<Vec<u32>> = Vec::new();
    let mut longest = 0;
    for d in docs {
        let ids = path.text.encode(&d.text)?;
        let ref_ids = reference.text.encode(&d.text)?;
        if ids != ref_ids {
            let position = ids.iter().zip(&ref_ids).position(|(a, b)| a != b).unwrap_or(ids.len().min(ref_ids.len()));
            return Err(EvalErrorKind::TokenizerMismatch { document: d.name.clone(), position }.into());
        }
        longest = longest.max(ids.len());
        windows.extend(ids.chunks(ctx).filter(|w| w.len() >= 2).map(<[u32]>::to_vec));
    }
    if windows.is_empty() {
        return Err(EvalErrorKind::TooFewTokens { tokens: longest }.into());
    }
    let vocab = path.model.config().vocab_size;
    let mut tally = Tally::default();
    for (w, window) in windows.iter().enumerate() {
        let r = window_logits(&reference.model, window)?;
        let p = window_logits(&path.model, window)?;
        let scores: Vec<Result<PositionScore, EvalError>> = (score_from.min(window.len() - 1)..window.len() - 1)
            .into_par_iter()
            .map(|i| {
                let (rr, pr) = (&r[i * vocab..(i + 1) * vocab], &p[i * vocab..(i + 1) * vocab]);
                score_position(rr, pr, window[i + 1]).ok_or_else(|| {
                    EvalError::new(EvalErrorKind::NonFiniteLogits {
                        model: if rr.iter().all(|v| v.is_finite()) { "path" } else { "reference" },
                        window: w,
                        position: i,
                    })
                })
            })
            .collect();
        for s in scores {
            tally.push(s?);
        }
        progress(w + 1, windows.len());
    }
    let scores = |e: &Engine, nll: f64, correct: usize| ModelScores {
        model: e.dir.clone(),
        numerics: run_label(&e.model),
        perplexity: tally.mean(nll).exp(),
        mean_nll: tally.mean(nll),
        top1_accuracy: tally.frac(correct),
    };
    Ok(EvalReport {
        schema: SCHEMA,
        path: scores(path, tally.path_nll, tally.path_correct),
        reference: scores(reference, tally.ref_nll, tally.ref_correct),
        top1_agreement: tally.top1_agreement(),
        mean_kl_nats: tally.mean_kl(),
        tokens: tally.positions,
        windows: windows.len(),
        ctx,
        score_from,
        text: docs.iter().map(|d| d.name.clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_perplexity_v() {
        for v in [2usize, 7, 96, 49152] {
            let l = vec![3.25f32; v];
            let s = score_position(&l, &l, 1).unwrap();
            assert!((s.path_nll - (v as f64).ln()).abs() < 1e-12);
            let mut t = Tally::default();
            t.push(s);
            t.push(s);
            assert!((t.path_perplexity() / v as f64 - 1.0).abs() < 1e-12, "{} vs {v}", t.path_perplexity());
            assert_eq!(t.mean_kl(), 0.0);
            assert_eq!(t.top1_agreement(), 1.0);
        }
    }

    #[test]
    fn log_softmax_matches_the_formula_and_survives_large_logits() {
        let l = [1.0f32, -2.0, 0.5, 3.0];
        let z: f64 = l.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
        for (a, &v) in log_softmax(&l).iter().zip(&l) {
            assert!((a - (f64::from(v) - z)).abs() < 1e-14);
        }
        // Shifting every logit changes nothing; 1e30 would overflow a naive exp.
        let big: Vec<f32> = l.iter().map(|v| v + 1e4).collect();
        for (a, b) in log_softmax(&big).iter().zip(log_softmax(&l)) {
            assert!((a - b).abs() < 1e-9, "{a} {b}");
        }
        assert!(log_softmax(&[1e30, 0.0])[0].abs() < 1e-12);
        assert!(log_sum_exp(&[0.0, f32::NAN]).is_nan());
        assert!(log_sum_exp(&[0.0, f32::INFINITY]).is_nan());
    }

    #[test]
    fn a_known_two_token_case() {
        // p = softmax(0, ln 3) = (1/4, 3/4); q = softmax(0, 0) = (1/2, 1/2).
        let p = [0.0f32, 3f32.ln()];
        let q = [0.0f32, 0.0];
        let want = 0.25 * (0.25f64 / 0.5).ln() + 0.75 * (0.75f64 / 0.5).ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-7, "{}", kl_divergence(&p, &q));
        let s = score_position(&p, &q, 0).unwrap();
        assert!((s.ref_nll - 4f64.ln()).abs() < 1e-7);
        assert!((s.path_nll - 2f64.ln()).abs() < 1e-12);
        assert!(!s.ref_correct && s.path_correct && !s.agree);
        assert_eq!(kl_divergence(&p, &p), 0.0);
    }

    #[test]
    fn bad_positions_are_none() {
        assert!(score_position(&[0.0, f32::NAN], &[0.0, 0.0], 0).is_none());
        assert!(score_position(&[0.0, 0.0], &[0.0, 0.0], 2).is_none());
        assert!(score_position(&[0.0, 0.0], &[0.0], 0).is_none());
    }

    #[test]
    fn contexts_are_checked() {
        assert!(matches!(check_ctx(0).unwrap_err().kind(), EvalErrorKind::ContextTooSmall { ctx: 0 }));
        assert!(matches!(check_ctx(1).unwrap_err().kind(), EvalErrorKind::ContextTooSmall { ctx: 1 }));
        assert!(check_ctx(2).is_ok());
    }
}
