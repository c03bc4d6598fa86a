//! The generation API `generate`, `chat` and the server share: a request in, a stream of token events
//! out, ending with why it finished and how many tokens it took.
//!
//! A [`GenerationRequest`] holds the prompt (text, token ids, or chat messages for the model's template),
//! sampling values that override the model's defaults, stop strings and token ids, a token budget, how
//! many log-probabilities to report, and a [`CancelToken`]. [`Engine::prepare`] turns it into a
//! [`Sequence`]: the prompt's ids, the sampling values resolved (request, then `generation_config.json`,
//! then greedy) and checked, and the state of one answer in progress. A sequence is driven one step at a
//! time by whoever owns the model — [`Engine::generate`] alone, a server's scheduler beside others: each
//! step hands it the logits of its last position, and it samples, decodes the token's text incrementally
//! (the tokenizer's `decode_stream`), holds back text that may be the start of a stop string, and says
//! whether to go on.
//!
//! Stop strings are matched on the decoded text across token boundaries and never emitted; the text
//! before one is. A sequence finishes on an end-of-sequence token (unless the request ignores them), a
//! stop token id, a stop string, its token budget, a full context, or cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::engine::{Engine, PREFILL_CHUNK};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::sampling::{MAX_TOP_LOGPROBS, Sampler, SamplingOverrides, TokenLogprobs};
use crate::text::{ChatOptions, TextStream};
use int4_template::Messages;

/// The most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 64;
/// The longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;

/// What to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Text, tokenized as it is (no special tokens added).
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// A conversation, rendered with the model's chat template.
    Chat {
        /// The messages.
        messages: Messages,
        /// Tools, the generation prompt and further template variables.
        options: ChatOptions,
    },
}

/// A flag a caller sets to stop a generation between two tokens (from any thread).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not cancelled.
    pub fn new() -> Self {
        CancelToken::default()
    }

    /// Asks the generation to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether it was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a token callback tells the generator: go on, or stop after this token. A callback returning `()`
/// always goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Keep generating.
    Continue,
    /// Stop after this token.
    Stop,
}

impl From<()> for Next {
    fn from((): ()) -> Self {
        Next::Continue
    }
}

/// One generation's request.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Sampling values over the model's defaults.
    pub sampling: SamplingOverrides,
    /// The most tokens to generate (none: the model's default, else as many as the context holds).
    pub max_tokens: Option<usize>,
    /// Stop before any of these texts (matched on the decoded output; not emitted).
    pub stop: Vec<String>,
    /// Stop after any of these tokens (emitted, as an end-of-sequence token is).
    pub stop_token_ids: Vec<u32>,
    /// Report each token's log-probability and this many of the most likely ones (0..=20).
    pub logprobs: Option<usize>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Stops the generation when cancelled.
    pub cancel: CancelToken,
}

impl GenerationRequest {
    /// A request for `prompt` with every other value at its default.
    pub fn new(prompt: Prompt) -> Self {
        GenerationRequest {
            prompt,
            sampling: SamplingOverrides::default(),
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            cancel: CancelToken::new(),
        }
    }

    /// A greedy request for `prompt`, at most `max_tokens` tokens, whatever the model's defaults.
    pub fn greedy(prompt: Prompt, max_tokens: usize) -> Self {
        let mut r = GenerationRequest::new(prompt);
        r.sampling.temperature = Some(0.0);
        r.max_tokens = Some(max_tokens);
        r
    }
}

/// Why a generation finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Eos,
    /// One of the request's stop token ids.
    StopToken(u32),
    /// One of the request's stop strings (not emitted).
    StopString(String),
    /// The token budget.
    MaxTokens,
    /// The session's context is full.
    ContextFull,
    /// The caller cancelled it.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's name for it: `stop` (an end token or stop string), `length` (a budget), `abort`.
    pub fn openai_name(&self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::StopToken(_) | FinishReason::StopString(_) => "stop",
            FinishReason::MaxTokens | FinishReason::ContextFull => "length",
            FinishReason::Cancelled => "abort",
        }
    }
}

/// Token counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (a final end-of-sequence token included).
    pub completion_tokens: usize,
}

/// One generated token, as the stream reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    /// The token.
    pub id: u32,
    /// The text released with it: its own, plus any held back before it, minus what may begin a stop
    /// string (released later, or never if it does). Empty for a special token.
    pub text: String,
    /// Its log-probabilities, if the request asked.
    pub logprobs: Option<TokenLogprobs>,
    /// Set on the last token: why the generation finished.
    pub finish: Option<FinishReason>,
}

/// A finished generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated ids (not the prompt; a final end-of-sequence token included).
    pub tokens: Vec<u32>,
    /// The generated text, as emitted (special tokens and a stop string left out).
    pub text: String,
    /// Why it finished.
    pub finish: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Prompt positions run (those the cache did not already hold).
    pub prefill_tokens: usize,
    /// Their processing time.
    pub prefill: Duration,
    /// Time for every token after the first.
    pub decode: Duration,
    /// The logits of the first generated position (for fidelity checks).
    pub first_logits: Vec<f32>,
}

/// One answer in progress: the prompt, the sampler, the text decoded so far and what ends it.
pub struct Sequence<'e> {
    prompt: Vec<u32>,
    sampler: Sampler,
    max_tokens: Option<usize>,
    stop: StopStrings,
    stop_token_ids: Vec<u32>,
    eos: Vec<u32>,
    logprobs: Option<usize>,
    decoder: TextStream<'e>,
    /// Ids at or above this have no token in the tokenizer: never sampled.
    vocab_limit: usize,
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    cancel: CancelToken,
}

impl std::fmt::Debug for Sequence<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequence")
            .field("prompt_tokens", &self.prompt.len())
            .field("tokens", &self.tokens.len())
            .field("finish", &self.finish)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// The request's prompt as ids, its sampling values resolved and checked, and its state.
    pub fn prepare(&self, req: GenerationRequest) -> Result<Sequence<'_>> {
        let params = req.sampling.or(self.defaults.sampling).resolve();
        params.check()?;
        if req.stop.len() > MAX_STOP_STRINGS {
            return Err(Error::input("stop", format!("{} stop strings; at most {MAX_STOP_STRINGS}", req.stop.len())));
        }
        for s in &req.stop {
            if s.is_empty() {
                return Err(Error::input("stop", "an empty stop string would stop before any text; give some text"));
            }
            if s.len() > MAX_STOP_BYTES {
                return Err(Error::input(
                    "stop",
                    format!("a stop string of {} bytes; at most {MAX_STOP_BYTES}", s.len()),
                ));
            }
        }
        if let Some(n) = req.logprobs
            && n > MAX_TOP_LOGPROBS
        {
            return Err(Error::input("top_logprobs", format!("{n}; at most {MAX_TOP_LOGPROBS}")));
        }
        let max_tokens = req.max_tokens.or(self.defaults.max_tokens);
        if max_tokens == Some(0) {
            return Err(Error::input("max_tokens", "0: give at least 1"));
        }
        let vocab = self.model.config().vocab_size;
        let prompt = match req.prompt {
            Prompt::Text(t) => self.text.encode(&t)?,
            Prompt::Ids(ids) => ids,
            Prompt::Chat { messages, options } => {
                if messages.is_empty() {
                    return Err(Error::input("messages", "is empty: nothing to answer"));
                }
                self.text.encode(&self.text.apply_chat_template(&messages, &options)?)?
            }
        };
        if prompt.is_empty() {
            return Err(Error::input("prompt", "is empty: nothing to continue"));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::input("prompt", format!("token id {bad} is outside the vocabulary ({vocab} tokens)")));
        }
        let mut sampler = Sampler::new(params);
        sampler.observe_prompt(&prompt);
        Ok(Sequence {
            prompt,
            sampler,
            max_tokens,
            stop: StopStrings::new(req.stop),
            stop_token_ids: req.stop_token_ids,
            eos: if req.ignore_eos { Vec::new() } else { self.model.config().eos_token_ids.clone() },
            logprobs: req.logprobs,
            decoder: self.text.stream(),
            vocab_limit: self.text.vocab_limit().min(vocab),
            tokens: Vec::new(),
            text: String::new(),
            finish: None,
            cancel: req.cancel,
        })
    }

    /// Runs `req` in a fresh cache; `on_event` sees each token as it comes and may return [`Next::Stop`]
    /// to end the generation there (a closure returning `()` never does).
    pub fn generate<R: Into<Next>>(
        &self,
        req: GenerationRequest,
        on_event: impl FnMut(&TokenEvent) -> R,
    ) -> Result<Generation> {
        let mut cache = self.new_cache()?;
        self.generate_in(&mut cache, req, on_event)
    }

    /// Runs `tokens` into `cache` in chunks of [`PREFILL_CHUNK`] positions and returns the last one's
    /// logits; an error, before running anything, when they do not fit (`prompt_len`: the whole prompt's
    /// length, for the message).
    fn prefill_into(&self, cache: &mut KvCache, tokens: &[u32], prompt_len: usize) -> Result<Vec<f32>> {
        if cache.len() + tokens.len() > cache.capacity() {
            return Err(Error::input(
                "prompt",
                format!("{prompt_len} tokens do not fit the context ({} positions)", cache.capacity()),
            ));
        }
        let mut logits = Vec::new();
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            logits = self.model.forward(chunk, cache, false)?;
        }
        Ok(logits)
    }

    /// As [`Engine::generate`], continuing in `cache`: the positions it holds that begin the prompt are
    /// kept and only the rest is run (a chat keeps its cache across turns); anything after them is
    /// forgotten first.
    pub fn generate_in<R: Into<Next>>(
        &self,
        cache: &mut KvCache,
        req: GenerationRequest,
        mut on_event: impl FnMut(&TokenEvent) -> R,
    ) -> Result<Generation> {
        let mut seq = self.prepare(req)?;
        let prompt = seq.prompt();
        // Keep the cached prefix, but always run at least the prompt's last position (its logits).
        let shared = cache.ids().iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        cache.truncate(shared);
        let new = &prompt[shared..];
        let prefill_tokens = new.len();
        let t = Instant::now();
        let mut logits = self.prefill_into(cache, new, prompt.len())?;
        let prefill = t.elapsed();
        let first_logits = logits.clone();
        let t = Instant::now();
        loop {
            let room = cache.len() < cache.capacity();
            let Some(event) = seq.advance(&mut logits, room)? else { break };
            let flow: Next = on_event(&event).into();
            if event.finish.is_some() {
                break;
            }
            if flow == Next::Stop {
                seq.finish = Some(FinishReason::Cancelled);
                break;
            }
            logits = self.model.forward(&[event.id], cache, false)?;
        }
        let decode = t.elapsed();
        Ok(seq.into_generation(prefill_tokens, prefill, decode, first_logits))
    }
}

impl Engine {
    /// Generates for several requests at once: each prompt is prefilled on its own, then every sequence
    /// still running decodes in one batch per step (the linears read their weights once per step for all
    /// of them). `on_event(i, event)` sees request `i`'s tokens as they come. With greedy sampling each
    /// sequence's tokens are those [`Engine::generate`] gives it alone, while the batch stays below the
    /// prefill threshold.
    pub fn generate_batch(
        &self,
        requests: Vec<GenerationRequest>,
        mut on_event: impl FnMut(usize, &TokenEvent),
    ) -> Result<Vec<Generation>> {
        let mut seqs = requests.into_iter().map(|r| self.prepare(r)).collect::<Result<Vec<_>>>()?;
        let n = seqs.len();
        let mut caches = (0..n).map(|_| self.new_cache()).collect::<Result<Vec<_>>>()?;
        let mut logits = Vec::with_capacity(n);
        let mut prefill = Vec::with_capacity(n);
        for (seq, cache) in seqs.iter().zip(&mut caches) {
            let t = Instant::now();
            logits.push(self.prefill_into(cache, seq.prompt(), seq.prompt().len())?);
            prefill.push(t.elapsed());
        }
        let first_logits = logits.clone();
        let vocab = self.model.config().vocab_size;
        let mut running: Vec<usize> = (0..n).collect();
        let t = Instant::now();
        while !running.is_empty() {
            let mut next_ids = Vec::with_capacity(running.len());
            let mut still = Vec::with_capacity(running.len());
            for &i in &running {
                let room = caches[i].len() < caches[i].capacity();
                if let Some(event) = seqs[i].advance(&mut logits[i], room)? {
                    on_event(i, &event);
                    if event.finish.is_none() {
                        next_ids.push(event.id);
                        still.push(i);
                    }
                }
            }
            running = still;
            if running.is_empty() {
                break;
            }
            let mut batch: Vec<&mut KvCache> = Vec::with_capacity(running.len());
            let mut rest: &mut [KvCache] = &mut caches;
            let mut base = 0;
            for &i in &running {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - base);
                let (first, tail) = tail.split_first_mut().expect("running indices are in range");
                batch.push(first);
                rest = tail;
                base = i + 1;
            }
            let step = self.model.forward_batch(&next_ids, &mut batch)?;
            for (j, &i) in running.iter().enumerate() {
                logits[i] = step[j * vocab..(j + 1) * vocab].to_vec();
            }
        }
        let decode = t.elapsed();
        Ok(seqs
            .into_iter()
            .zip(prefill)
            .zip(first_logits)
            .map(|((s, p), l)| {
                let n = s.prompt().len();
                s.into_generation(n, p, decode, l)
            })
            .collect())
    }
}

impl<'e> Sequence<'e> {
    /// The prompt's ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The ids generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Why it finished, once it has.
    pub fn finish(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// Token counts so far.
    pub fn usage(&self) -> Usage {
        Usage { prompt_tokens: self.prompt.len(), completion_tokens: self.tokens.len() }
    }

    /// One step: from the logits of the last position run (`room`: whether the cache can take another),
    /// the next token and its event — the token to run next unless the event carries a finish reason.
    /// `None` once finished (or if cancelled before this token: the finish reason says so).
    pub fn advance(&mut self, logits: &mut [f32], room: bool) -> Result<Option<TokenEvent>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if self.cancel.is_cancelled() {
            self.finish = Some(FinishReason::Cancelled);
            return Ok(None);
        }
        // Ids the tokenizer has no token for (a vocabulary padded past it) are never chosen.
        if self.vocab_limit < logits.len() {
            logits[self.vocab_limit..].fill(f32::NEG_INFINITY);
        }
        let logprobs = self.logprobs.map(|top| (top, logits.to_vec()));
        let id = self.sampler.sample(logits);
        let logprobs = logprobs.map(|(top, raw)| self.sampler.logprobs(&raw, id, top));
        self.tokens.push(id);
        let piece = self.decoder.step(id)?;
        let (mut text, hit) = self.stop.push(&piece);
        let finish = if let Some(s) = hit {
            Some(FinishReason::StopString(s))
        } else if self.eos.contains(&id) {
            Some(FinishReason::Eos)
        } else if self.stop_token_ids.contains(&id) {
            Some(FinishReason::StopToken(id))
        } else if self.max_tokens.is_some_and(|m| self.tokens.len() >= m) {
            Some(FinishReason::MaxTokens)
        } else if !room {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        if finish.is_some() && !matches!(finish, Some(FinishReason::StopString(_))) {
            text.push_str(&self.stop.flush());
        }
        self.text.push_str(&text);
        self.finish = finish.clone();
        Ok(Some(TokenEvent { id, text, logprobs, finish }))
    }

    /// Ends it as cancelled (its held-back text is dropped).
    pub fn cancel(&mut self) {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
        }
    }

    /// The finished generation.
    pub fn into_generation(
        self,
        prefill_tokens: usize,
        prefill: Duration,
        decode: Duration,
        first_logits: Vec<f32>,
    ) -> Generation {
        let usage = self.usage();
        Generation {
            tokens: self.tokens,
            text: self.text,
            finish: self.finish.unwrap_or(FinishReason::Cancelled),
            usage,
            prefill_tokens,
            prefill,
            decode,
            first_logits,
        }
    }
}

/// Stop strings matched across token boundaries: text that might begin one is held back until it
/// cannot.
#[derive(Clone, Debug, Default)]
struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    fn new(stops: Vec<String>) -> Self {
        StopStrings { stops, held: String::new() }
    }

    /// Adds `text`; returns what may be released, and the stop string if one now appears (the text
    /// before it is released, the rest dropped).
    fn push(&mut self, text: &str) -> (String, Option<String>) {
        if self.stops.is_empty() {
            return (text.to_string(), None);
        }
        self.held.push_str(text);
        let first =
            self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|i| (i, s))).min_by_key(|(i, _)| *i);
        if let Some((i, s)) = first {
            let out = self.held[..i].to_string();
            let s = s.clone();
            self.held.clear();
            return (out, Some(s));
        }
        // Hold the longest tail that some stop string begins with.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, None)
    }

    /// Releases what is held.
    fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_across_pieces_are_held_then_dropped_or_released() {
        let mut s = StopStrings::new(vec!["</end>".into(), "ab".into()]);
        assert_eq!(s.push("hello </"), ("hello ".into(), None));
        assert_eq!(s.push("en"), (String::new(), None));
        assert_eq!(s.push("d> tail"), (String::new(), Some("</end>".into())));
        let mut s = StopStrings::new(vec!["</end>".into()]);
        assert_eq!(s.push("x </e"), ("x ".into(), None));
        assert_eq!(s.push("nx"), ("</enx".into(), None));
        assert_eq!(s.push("é</"), ("é".into(), None));
        assert_eq!(s.flush(), "</");
        let mut s = StopStrings::new(vec!["ab".into(), "b".into()]);
        assert_eq!(s.push("xab"), ("x".into(), Some("ab".into())));
    }
}
