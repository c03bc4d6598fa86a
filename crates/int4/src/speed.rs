//! The timed runs of a model's speed, as llama-bench times them, so `int4 bench` and the benchmark
//! binaries measure the same thing the same way.
//!
//! * **pp N** — a prompt of N token ids (`10, 11, …`, wrapping within the vocabulary) through a fresh KV cache in one forward call, logits
//!   for the last position only (llama-bench's prompt test);
//! * **tg N** — N tokens decoded one at a time after a one-token prompt in a fresh cache, each the greedy
//!   choice of the last (llama-bench feeds a token back the same way; the argmax costs microseconds);
//! * **pp N + tg M** — both in one cache, timed together (llama-bench's `-pg`).
//!
//! Each returns the wall time of the timed part only (the cache's allocation and the one-token prompt of
//! tg are outside it).

use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::error::Result;
use crate::sampling::argmax;

/// The first token id of a timed prompt (ids count up from it).
const FIRST_ID: u32 = 10;

/// The time to process a prompt of `n` tokens (pp N).
pub fn prompt_time(engine: &Engine, n: usize) -> Result<Duration> {
    let mut cache = engine.new_cache()?;
    let prompt = prompt_ids(engine, n);
    let t = Instant::now();
    engine.model.forward(&prompt, &mut cache, false)?;
    Ok(t.elapsed())
}

/// The time to generate `n` tokens one at a time after a one-token prompt (tg N).
pub fn generation_time(engine: &Engine, n: usize) -> Result<Duration> {
    let mut cache = engine.new_cache()?;
    let logits = engine.model.forward(&prompt_ids(engine, 1), &mut cache, false)?;
    let t = Instant::now();
    generate(engine, &mut cache, logits, n)?;
    Ok(t.elapsed())
}

/// The time to process a prompt of `pp` tokens and then generate `tg` (llama-bench's `-pg pp,tg`).
pub fn prompt_and_generation_time(engine: &Engine, pp: usize, tg: usize) -> Result<Duration> {
    let mut cache = engine.new_cache()?;
    let prompt = prompt_ids(engine, pp);
    let t = Instant::now();
    let logits = engine.model.forward(&prompt, &mut cache, false)?;
    generate(engine, &mut cache, logits, tg)?;
    Ok(t.elapsed())
}

/// `10, 11, …`, wrapping within the vocabulary.
fn prompt_ids(engine: &Engine, n: usize) -> Vec<u32> {
    let vocab = engine.model.config().vocab_size.max(1) as u32;
    let (first, span) = if vocab > FIRST_ID { (FIRST_ID, vocab - FIRST_ID) } else { (0, vocab) };
    (0..n as u32).map(|i| first + i % span).collect()
}

fn generate(engine: &Engine, cache: &mut crate::kv::KvCache, mut logits: Vec<f32>, n: usize) -> Result<()> {
    for _ in 0..n {
        logits = engine.model.forward(&[argmax(&logits)], cache, false)?;
    }
    Ok(())
}
