//! The scheduler: one thread that owns the model and runs every request's sequence in steps.
//!
//! Requests arrive as [`Job`]s (token ids already, from the HTTP side) on a channel. A job waits in a
//! bounded queue until its KV cache — prompt plus `max_tokens` positions, allocated exactly — fits the
//! memory budget beside the running ones; then it runs. Each step runs, through [`int4::Model::step`], one
//! decode row for every sequence that is generating and, for sequences still reading their prompt,
//! prompt chunks of [`PREFILL_CHUNK`] positions (cut at the same boundaries [`int4::Engine::generate`]
//! cuts them), so running streams keep flowing while a long prompt is read. Prompt chunks are taken
//! shortest first up to [`PREFILL_CHUNK`] positions a step, so a short prompt is not kept waiting behind a
//! long one, and the longest-waiting prompt always gets its next chunk, so none waits forever: a step
//! reads at most twice [`PREFILL_CHUNK`] prompt positions. Every row runs the kernels it would alone, so a
//! request's output is the same bytes alone or beside others. Each sampled token goes back to its request
//! as an [`Update`]; a request whose receiver is gone (the client left) is dropped before the next step,
//! its cache freed.
//!
//! A finished sequence's prompt cache is kept, in whole chunks, for later prompts that begin the same way
//! (the private `prefix` module); a new sequence starts from a copy of the longest such prefix, kept or
//! running, and its usage reports those positions as `cached_tokens`.
//!
//! On shutdown the scheduler stops admitting, lets the running and queued sequences finish until the
//! deadline, then ends the rest with an error update.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use int4::{Engine, FinishReason, GenerationRequest, KvCache, Prompt, Sequence, StepEntry, TokenEvent, Usage};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;
use crate::prefix::{PrefixCache, Source, shareable, started_from};

/// The chunk a prompt is cut into, and the prompt positions a step takes shortest first (beside the
/// longest-waiting prompt's chunk).
pub use crate::prefix::PREFILL_CHUNK;

/// One sequence to run: its request (prompt as ids) and where its updates go.
#[derive(Debug)]
pub struct Job {
    /// The request.
    pub request: GenerationRequest,
    /// The prompt's length (the request's ids).
    pub prompt_len: usize,
    /// The positions its cache needs: prompt plus the token budget.
    pub positions: usize,
    /// Where its updates go; dropped by the HTTP side when the client leaves.
    pub updates: UnboundedSender<Update>,
    /// When the HTTP side received it.
    pub received: Instant,
    /// Set by the first token of any of its request's choices: the time to first token is observed once
    /// per request, not once per choice (`n`).
    pub request_answered: Arc<AtomicBool>,
}

/// A sequence's token counts, as a response's `usage` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Prompt and generated tokens.
    pub usage: Usage,
    /// Prompt positions copied from a kept or running sequence's cache instead of run.
    pub cached_prompt_tokens: usize,
}

impl Counts {
    /// Both counts summed (a request's choices).
    pub fn plus(self, other: Counts) -> Counts {
        Counts {
            usage: Usage {
                prompt_tokens: self.usage.prompt_tokens + other.usage.prompt_tokens,
                completion_tokens: self.usage.completion_tokens + other.usage.completion_tokens,
            },
            cached_prompt_tokens: self.cached_prompt_tokens + other.cached_prompt_tokens,
        }
    }
}

/// What a sequence tells its request.
#[derive(Debug)]
pub enum Update {
    /// A generated token (its event carries the finish reason on the last one).
    Token(TokenEvent),
    /// It finished, with its token counts (after its last token, or alone when cancelled).
    Done(FinishReason, Counts),
    /// It could not run or was ended by shutdown.
    Failed(String),
}

/// What the HTTP side sends.
#[derive(Debug)]
pub enum Command {
    /// Run a job.
    Run(Box<Job>),
    /// Stop admitting; finish what runs until `deadline`, then end the rest.
    Shutdown(Instant),
}

/// The state the HTTP side reads.
#[derive(Debug, Default)]
pub struct Shared {
    /// Jobs waiting for admission (and in the channel).
    pub queued: AtomicUsize,
    /// Set once shutdown began.
    pub draining: AtomicBool,
    /// Set when the scheduler has ended (every sequence finished or ended).
    pub stopped: AtomicBool,
}

/// The scheduler's limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of KV cache all running sequences and kept prompt caches may hold together.
    pub kv_budget: usize,
    /// Prompt caches kept for later requests (0: none kept).
    pub prefix_cache: usize,
}

struct Running<'e> {
    seq: Sequence<'e>,
    cache: KvCache,
    /// Prompt positions in its cache so far (run, or copied when it started).
    read: usize,
    /// Prompt positions copied when it started.
    cached: usize,
    /// The logits of the last position run, once the prompt is read.
    next: Option<u32>,
    updates: UnboundedSender<Update>,
    received: Instant,
    request_answered: Arc<AtomicBool>,
    last_token: Option<Instant>,
    bytes: usize,
}

impl Running<'_> {
    /// Prompt positions its cache holds.
    fn prompt_read(&self) -> usize {
        self.read.min(self.seq.prompt().len())
    }

    fn counts(&self) -> Counts {
        Counts { usage: self.seq.usage(), cached_prompt_tokens: self.cached }
    }
}

/// Keeps what a finished (or abandoned) sequence's prompt read, within the budget the running ones leave.
fn keep(kept: &mut PrefixCache, r: Running<'_>, running: &[Running<'_>], limits: Limits) {
    let room = limits.kv_budget.saturating_sub(running.iter().map(|r| r.bytes).sum());
    let read = r.prompt_read();
    kept.keep(r.cache, read, room);
}

/// Runs the scheduler on this thread until shutdown ends it or the channel closes.
pub fn run(engine: &Engine, commands: Receiver<Command>, shared: Arc<Shared>, metrics: Arc<Metrics>, limits: Limits) {
    let model = &engine.model;
    let mut waiting: VecDeque<Box<Job>> = VecDeque::new();
    let mut running: Vec<Running<'_>> = Vec::new();
    let mut kept = PrefixCache::new(limits.prefix_cache);
    let mut deadline: Option<Instant> = None;
    let mut open = true;
    loop {
        // Take what arrived: block only when nothing runs.
        loop {
            let cmd = if running.is_empty() && waiting.is_empty() && deadline.is_none() {
                match commands.recv_timeout(Duration::from_millis(200)) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            } else {
                commands.try_recv().ok()
            };
            match cmd {
                Some(Command::Run(job)) => waiting.push_back(job),
                Some(Command::Shutdown(at)) => {
                    deadline = Some(at);
                    shared.draining.store(true, Ordering::SeqCst);
                }
                None => break,
            }
        }
        if let Some(at) = deadline
            && Instant::now() >= at
        {
            for r in running.drain(..) {
                let _ = r.updates.send(Update::Failed("the server shut down before this request finished".into()));
            }
            for j in waiting.drain(..) {
                let _ = j.updates.send(Update::Failed("the server shut down before this request ran".into()));
            }
            shared.queued.store(0, Ordering::SeqCst);
            break;
        }
        if deadline.is_some() && running.is_empty() && waiting.is_empty() {
            break;
        }
        if !open && running.is_empty() && waiting.is_empty() {
            break;
        }
        // Drop requests whose clients left (keeping what their prompts read).
        let mut i = 0;
        while i < running.len() {
            if running[i].updates.is_closed() {
                let r = running.remove(i);
                keep(&mut kept, r, &running, limits);
            } else {
                i += 1;
            }
        }
        waiting.retain(|j| {
            let keep = !j.updates.is_closed();
            if !keep {
                shared.queued.fetch_sub(1, Ordering::SeqCst);
            }
            keep
        });
        // Admit in order while the budget holds, kept prompt caches giving way (least recently used first,
        // the one the job would start from last) only when that lets the job in.
        let mut running_held: usize = running.iter().map(|r| r.bytes).sum();
        while let Some(job) = waiting.front() {
            let bytes = model.kv_cache_bytes(job.positions);
            if !running.is_empty() && running_held + bytes > limits.kv_budget {
                break;
            }
            if let Prompt::Ids(ids) = &job.request.prompt
                && let Some((Source::Kept(i), _)) = kept.best(ids, std::iter::empty())
            {
                kept.take_use(i);
            }
            while running_held + kept.bytes() + bytes > limits.kv_budget && kept.evict_one().is_some() {}
            let job = waiting.pop_front().expect("front exists");
            shared.queued.fetch_sub(1, Ordering::SeqCst);
            let seq = match engine.prepare(job.request) {
                Ok(seq) => seq,
                Err(e) => {
                    let _ = job.updates.send(Update::Failed(e.to_string()));
                    continue;
                }
            };
            // With no prompt caches kept, nothing is shared, not even from running sequences.
            let sharing = limits.prefix_cache > 0;
            let running_caches = running.iter().filter(|_| sharing).map(|r| (&r.cache, shareable(r.prompt_read())));
            let from = match kept.best(seq.prompt(), running_caches) {
                Some((Source::Kept(i), n)) => Some((kept.take_use(i), n)),
                Some((Source::Running(i), n)) => Some((&running[i].cache, n)),
                None => None,
            };
            let cached = from.map_or(0, |(_, n)| n);
            let cache = match started_from(model, job.positions, limits.kv_budget.max(bytes), from) {
                Ok(c) => c,
                Err(e) => {
                    let _ = job.updates.send(Update::Failed(e.to_string()));
                    continue;
                }
            };
            metrics.add_cached_prompt_tokens(cached);
            running_held += bytes;
            running.push(Running {
                seq,
                cache,
                read: cached,
                cached,
                next: None,
                updates: job.updates,
                received: job.received,
                request_answered: job.request_answered,
                last_token: None,
                bytes,
            });
        }
        metrics.set_prefix_cache(kept.len(), kept.bytes());
        metrics.set_running(running.len());
        metrics.set_queued(shared.queued.load(Ordering::SeqCst));
        if running.is_empty() {
            continue;
        }
        // The step: a decode row per generating sequence; prompt chunks (whole ones, at the boundaries
        // `Engine::generate` uses: every PREFILL_CHUNK positions from the start), the longest-waiting
        // prompt's (sequences run in admission order) and then the others shortest first within
        // PREFILL_CHUNK positions.
        let mut decode: Vec<usize> = Vec::new();
        let mut chunks: Vec<(usize, usize, usize, usize)> = Vec::new(); // (index, start, len, prompt left)
        for (i, r) in running.iter().enumerate() {
            if r.next.is_some() {
                decode.push(i);
            } else {
                let len = r.seq.prompt().len();
                let chunk_end = ((r.read / PREFILL_CHUNK) + 1) * PREFILL_CHUNK;
                chunks.push((i, r.read, chunk_end.min(len) - r.read, len - r.read));
            }
        }
        let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (running index, start, len) of prompt
        if let Some((&(i, start, take, _), rest)) = chunks.split_first() {
            plan.push((i, start, take));
            let mut rest = rest.to_vec();
            rest.sort_by_key(|&(i, _, _, left)| (left, i));
            let mut budget = PREFILL_CHUNK;
            for (i, start, take, _) in rest {
                if take <= budget {
                    plan.push((i, start, take));
                    budget -= take;
                }
            }
        }
        let tokens: Vec<(usize, Vec<u32>)> = decode
            .iter()
            .map(|&i| (i, vec![running[i].next.expect("decoding")]))
            .chain(plan.iter().map(|&(i, s, n)| (i, running[i].seq.prompt()[s..s + n].to_vec())))
            .collect();
        let t = Instant::now();
        let result = {
            let mut caches: Vec<Option<&mut KvCache>> = running.iter_mut().map(|r| Some(&mut r.cache)).collect();
            let mut entries: Vec<StepEntry<'_>> = tokens
                .iter()
                .map(|(i, t)| StepEntry { tokens: t, cache: caches[*i].take().expect("one entry per sequence") })
                .collect();
            model.step(&mut entries)
        };
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                for r in running.drain(..) {
                    let _ = r.updates.send(Update::Failed(format!("the model step failed: {e}")));
                }
                continue;
            }
        };
        let step_time = t.elapsed();
        let vocab = model.config().vocab_size;
        let mut finished: Vec<usize> = Vec::new();
        for (j, (i, t)) in tokens.iter().enumerate() {
            let r = &mut running[*i];
            if r.next.is_none() {
                r.read += t.len();
                metrics.add_prompt_tokens(t.len());
                if r.read < r.seq.prompt().len() {
                    continue;
                }
            }
            let mut l = logits[j * vocab..(j + 1) * vocab].to_vec();
            let room = r.cache.len() < r.cache.capacity();
            match r.seq.advance(&mut l, room) {
                Ok(Some(event)) => {
                    let now = Instant::now();
                    match r.last_token {
                        None if !r.request_answered.swap(true, Ordering::Relaxed) => {
                            metrics.observe_ttft(now - r.received)
                        }
                        None => {}
                        Some(prev) => metrics.observe_itl(now - prev),
                    }
                    r.last_token = Some(now);
                    metrics.add_generated_tokens(1);
                    let done = event.finish.clone();
                    r.next = Some(event.id);
                    if r.updates.send(Update::Token(event)).is_err() {
                        finished.push(*i);
                        continue;
                    }
                    if let Some(reason) = done {
                        let _ = r.updates.send(Update::Done(reason, r.counts()));
                        finished.push(*i);
                    }
                }
                Ok(None) => {
                    let reason = r.seq.finish().cloned().unwrap_or(FinishReason::Cancelled);
                    let _ = r.updates.send(Update::Done(reason, r.counts()));
                    finished.push(*i);
                }
                Err(e) => {
                    let _ = r.updates.send(Update::Failed(e.to_string()));
                    finished.push(*i);
                }
            }
        }
        metrics.observe_step(step_time);
        finished.sort_unstable();
        // `remove`, not `swap_remove`: `running` stays in admission order.
        for i in finished.into_iter().rev() {
            let r = running.remove(i);
            keep(&mut kept, r, &running, limits);
        }
        metrics.set_prefix_cache(kept.len(), kept.bytes());
        metrics.set_running(running.len());
    }
    shared.stopped.store(true, Ordering::SeqCst);
}
