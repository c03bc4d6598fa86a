//! Choosing the next token: greedy, or temperature / top-k / top-p with a seed.

use crate::error::{Error, Result};

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// 0 means greedy (argmax; the lowest id wins a tie).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1.0: all).
    pub top_p: f32,
    /// Seed of the random stream.
    pub seed: u64,
}

impl SamplingConfig {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingConfig { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }

    /// An error naming the value, unless the temperature is 0 or a positive finite number and `top_p`
    /// lies in `(0, 1]` (a NaN temperature would pick the least likely token; a `top_p` outside the range
    /// keeps nothing or means nothing).
    pub fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::input(
                "temperature",
                format!("{} is not a temperature: give 0 (greedy) or a positive finite number", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::input(
                "top_p",
                format!("{} is not a probability mass in (0, 1] (1 keeps every token)", self.top_p),
            ));
        }
        Ok(())
    }
}

/// A seeded sampler.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplingConfig,
    state: u64,
}

impl Sampler {
    /// A sampler for `cfg`.
    pub fn new(cfg: SamplingConfig) -> Self {
        Sampler { cfg, state: cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 }
    }

    fn next_unit(&mut self) -> f64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.cfg.top_k > 0 {
            idx.truncate(self.cfg.top_k);
        }
        let t = f64::from(self.cfg.temperature);
        let max = f64::from(logits[idx[0]]);
        let mut probs: Vec<f64> = idx.iter().map(|&i| ((f64::from(logits[i]) - max) / t).exp()).collect();
        let total: f64 = probs.iter().sum();
        for p in &mut probs {
            *p /= total;
        }
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|&p| {
                acc += p;
                acc >= f64::from(self.cfg.top_p)
            });
            let keep = keep.map_or(probs.len(), |k| k + 1);
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f64 = probs.iter().sum();
            for p in &mut probs {
                *p /= total;
            }
        }
        let mut r = self.next_unit();
        for (p, &i) in probs.iter().zip(&idx) {
            if r < *p {
                return i as u32;
            }
            r -= p;
        }
        idx[idx.len() - 1] as u32
    }
}

/// The index of the largest logit (the lowest index on a tie).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The two largest logits' gap (for reporting near-ties).
pub fn top2_gap(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}
