//! Tokenizer and chat template of a model directory.
//!
//! `tokenizer.json` through the `tokenizers` crate; the chat template from `chat_template.jinja` if the
//! directory has one, else the `chat_template` key of `tokenizer_config.json`, rendered as transformers
//! renders it (`int4_template`) over the messages, the tools and every named special token of
//! `tokenizer_config.json`.
//!
//! A tokenizer is data from the model's author, so it is bounded before use: a normalizer chain that could
//! make text more than [`MAX_NORMALIZER_GROWTH`] times longer (a `Replace` whose content is longer than its
//! pattern, repeated in a `Sequence`) is refused at load, and an id the tokenizer has no token for is an
//! error when decoded, never silently dropped.

use std::path::Path;

use int4_template::{ChatInput, ChatTemplate, Clock, Limits, Messages, TemplateError, Value};

use crate::error::{Error, Result};
use crate::model_dir::{ModelDir, TEMPLATE_CAP, TOKENIZER_CAP};

/// The most a tokenizer's normalizers may multiply the length of a text by.
pub const MAX_NORMALIZER_GROWTH: f64 = 16.0;

/// The special tokens transformers passes to a chat template by name (`special_tokens_map`).
const NAMED_SPECIAL_TOKENS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// What a chat render takes besides the messages.
#[derive(Clone, Debug)]
pub struct ChatOptions {
    /// Tool definitions (a JSON list, as the OpenAI API sends them).
    pub tools: Option<Value>,
    /// End with the assistant's turn opened (default true: the model is to answer).
    pub add_generation_prompt: bool,
    /// Further template variables (`enable_thinking`, ...), as `chat_template_kwargs` gives them.
    pub extra: Vec<(String, Value)>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { tools: None, add_generation_prompt: true, extra: Vec::new() }
    }
}

/// The model's tokenizer and chat template.
pub struct TextCodec {
    tokenizer: tokenizers::Tokenizer,
    chat_template: Option<String>,
    special_tokens: Vec<(String, String)>,
    /// The tokenizer's token count, added tokens included, counted once: the tokenizer counts them by
    /// building a map of its whole vocabulary (49,152 strings for the default model), milliseconds that a
    /// server would otherwise spend twice on every request, once on its scheduler thread between steps.
    vocab_limit: usize,
}

impl std::fmt::Debug for TextCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextCodec").field("has_chat_template", &self.chat_template.is_some()).finish_non_exhaustive()
    }
}

fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

/// How many times longer a text can get through the normalizer `n` (a bound). A `Replace` counts its
/// content over its pattern's length (its content's length plus one for a regex or an empty pattern, which
/// may match one character or none); BERT's normaliser may space out every character. The Unicode
/// compatibility forms, SentencePiece's precompiled map and case mapping expand some characters several
/// times (NFKD U+FDFA into 18): on a user's text that is a constant, so alone they count 1, but after a
/// `Replace` (even one character for one: it can put such a character in) or any step that can grow the
/// text they multiply what it made, so there they count 18 (3 for case mapping). A `Sequence` multiplies
/// its members', in order.
fn normalizer_growth(n: &serde_json::Value) -> f64 {
    chain_growth(std::slice::from_ref(n), &mut false)
}

/// The growth of `steps` applied in order; `grown` says whether an earlier step can grow the text.
fn chain_growth(steps: &[serde_json::Value], grown: &mut bool) -> f64 {
    let chars = |v: Option<&serde_json::Value>| v.and_then(|s| s.as_str()).map_or(0, |s| s.chars().count()) as f64;
    let mut total = 1.0;
    for n in steps {
        let factor = match n.get("type").and_then(|t| t.as_str()) {
            Some("Sequence") => {
                let members = n.get("normalizers").and_then(|v| v.as_array()).map_or(&[][..], Vec::as_slice);
                chain_growth(members, grown)
            }
            Some("Replace") => {
                let content = chars(n.get("content"));
                match n.get("pattern").and_then(|p| p.get("String")) {
                    Some(p) if chars(Some(p)) > 0.0 => (content / chars(Some(p))).max(1.0),
                    _ => content + 1.0,
                }
            }
            Some("BertNormalizer") => 3.0,
            Some("NFKC" | "NFKD" | "NFC" | "NFD" | "Precompiled") if *grown => 18.0,
            Some("Lowercase" | "Uppercase") if *grown => 3.0,
            _ => 1.0,
        };
        if factor > 1.0 || n.get("type").and_then(|t| t.as_str()) == Some("Replace") {
            *grown = true;
        }
        total *= factor;
    }
    total
}

impl TextCodec {
    /// Loads `tokenizer.json` and the chat template from the model directory `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_in(&ModelDir::open(dir)?)
    }

    /// Loads `tokenizer.json` and the chat template of `model`: `chat_template.jinja` if it has one, else
    /// the `chat_template` key of `tokenizer_config.json`.
    pub fn load_in(model: &ModelDir) -> Result<Self> {
        let tj = match model.gguf() {
            Some(g) => format!("{} (its tokenizer)", g.file().path().display()),
            None => model.path().join("tokenizer.json").display().to_string(),
        };
        let bytes = model
            .read("tokenizer.json", TOKENIZER_CAP)?
            .ok_or_else(|| Error::config(&tj, "is missing: the model has no tokenizer"))?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| Error::tokenizer(&tj, e))?;
        // The JSON read again for its normalizer alone, to bound what it can do; the rest (a vocabulary of
        // up to millions of entries) is skipped, not built.
        #[derive(serde::Deserialize)]
        struct NormalizerOnly {
            normalizer: Option<serde_json::Value>,
        }
        let json: NormalizerOnly = serde_json::from_slice(&bytes).map_err(crate::error::at(&tj))?;
        let growth = json.normalizer.as_ref().map_or(1.0, normalizer_growth);
        if growth > MAX_NORMALIZER_GROWTH {
            return Err(Error::config(
                &tj,
                format!(
                    "its normalizers can make a text {growth:.0} times longer (at most {MAX_NORMALIZER_GROWTH} is \
                     accepted): a prompt would run memory away"
                ),
            ));
        }
        drop(bytes);
        let cfg = model.read_json("tokenizer_config.json")?;
        let chat_template = match model.read_text("chat_template.jinja", TEMPLATE_CAP)? {
            Some(t) => Some(t),
            None => cfg.as_ref().and_then(|c| c.get("chat_template")).and_then(|t| t.as_str()).map(str::to_string),
        };
        let special_tokens = NAMED_SPECIAL_TOKENS
            .iter()
            .filter_map(|name| Some((name.to_string(), token_string(cfg.as_ref()?.get(*name))?)))
            .collect();
        let vocab_limit = tokenizer.get_vocab_size(true);
        Ok(TextCodec { tokenizer, chat_template, special_tokens, vocab_limit })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| Error::tokenizer("tokenizer", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        self.tokenizer.decode(ids, false).map_err(|e| Error::tokenizer("tokenizer", e))
    }

    /// Text of `ids` for people to read: special tokens (`<|im_end|>`, ...) left out.
    pub fn decode_for_display(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        self.tokenizer.decode(ids, true).map_err(|e| Error::tokenizer("tokenizer", e))
    }

    /// An error for the first id the tokenizer has no token for (it would decode as nothing).
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| self.tokenizer.id_to_token(id).is_none()) {
            Some(id) => Err(Error::input(
                "tokenizer",
                format!(
                    "id {id} has no token in tokenizer.json ({} tokens): the model's vocabulary is larger than its \
                     tokenizer's",
                    self.vocab_limit
                ),
            )),
            None => Ok(()),
        }
    }

    /// Renders the chat template over `messages` as transformers' `apply_chat_template` does. On Linux the
    /// template runs in a child process with 256 MiB of address space beyond the caller's and 2 s (an
    /// error names the budget it ran out of); everywhere its steps are bounded by fuel and its output is
    /// at most [`TEMPLATE_OUTPUT_CAP`] bytes.
    pub fn apply_chat_template(&self, messages: &Messages, opts: &ChatOptions) -> Result<String> {
        let tpl = self.chat_template.as_ref().ok_or_else(|| Error::config("chat template", "the model has none"))?;
        #[cfg(target_os = "linux")]
        {
            use crate::sandbox::{Outcome, run_bounded};
            let bounded =
                run_bounded(TEMPLATE_BUDGET, || self.render(tpl, messages, opts).ok().map(String::into_bytes))
                    .map_err(crate::error::at("chat template"))?;
            let refused = |what: String| Error::template(TemplateError::Bounded(what));
            match bounded {
                Outcome::Done(bytes) => {
                    String::from_utf8(bytes).map_err(|_| refused("it rendered text that is not UTF-8".into()))
                }
                // The render failed within its budget: run it here for the error itself.
                Outcome::Failed => self.render(tpl, messages, opts),
                Outcome::Panicked => Err(refused("the chat template's renderer panicked on it; it is refused".into())),
                Outcome::OutOfMemory => Err(refused(format!(
                    "the chat template needs more than {} MiB to render; it is refused",
                    TEMPLATE_BUDGET.memory >> 20
                ))),
                Outcome::OutOfTime => Err(refused(format!(
                    "the chat template did not finish rendering in {} s; it is refused",
                    TEMPLATE_BUDGET.time.as_secs_f32()
                ))),
            }
        }
        #[cfg(not(target_os = "linux"))]
        self.render(tpl, messages, opts)
    }

    /// The template rendered in this process.
    fn render(&self, tpl: &str, messages: &Messages, opts: &ChatOptions) -> Result<String> {
        let limits = Limits { output_bytes: TEMPLATE_OUTPUT_CAP, ..Limits::default() };
        let template = ChatTemplate::new(tpl, Clock::System, limits).map_err(Error::template)?;
        let input = ChatInput {
            messages,
            tools: opts.tools.as_ref(),
            add_generation_prompt: opts.add_generation_prompt,
            special_tokens: &self.special_tokens,
            extra: &opts.extra,
        };
        template.render(&input).map_err(Error::template)
    }

    /// An incremental decoder: each token's text as it comes, special tokens left out (the tokenizer's
    /// `decode_stream`, which holds back bytes until they complete a character).
    pub fn stream(&self) -> TextStream<'_> {
        TextStream { inner: self.tokenizer.decode_stream(true), codec: self }
    }

    /// One past the largest id the tokenizer has a token for.
    pub fn vocab_limit(&self) -> usize {
        self.vocab_limit
    }

    /// The text of token `id` alone (special tokens kept), for reporting it beside its log-probability.
    pub fn token_text(&self, id: u32) -> Result<String> {
        self.decode(&[id])
    }

    /// Whether the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }
}

/// Decodes a stream of tokens to text incrementally (see [`TextCodec::stream`]).
pub struct TextStream<'a> {
    inner: tokenizers::DecodeStream<
        'a,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
    codec: &'a TextCodec,
}

impl std::fmt::Debug for TextStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextStream").finish_non_exhaustive()
    }
}

impl TextStream<'_> {
    /// The text `id` completes (empty while it ends inside a character, or for a special token).
    pub fn step(&mut self, id: u32) -> Result<String> {
        self.codec.check_ids(&[id])?;
        Ok(self.inner.step(id).map_err(|e| Error::tokenizer("tokenizer", e))?.unwrap_or_default())
    }
}

/// What a chat template may use: memory beyond the process's own, and time.
#[cfg(target_os = "linux")]
const TEMPLATE_BUDGET: crate::sandbox::Budget =
    crate::sandbox::Budget { memory: 256 << 20, time: std::time::Duration::from_secs(2) };

/// The longest text a chat template may render.
pub const TEMPLATE_OUTPUT_CAP: usize = 16 << 20;
