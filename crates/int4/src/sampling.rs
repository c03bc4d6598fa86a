//! Choosing the next token: penalties, temperature, min-p, top-k, top-p and a seeded draw, with the
//! log-probabilities a caller asks for.
//!
//! The order is vLLM's: repetition, presence and frequency penalties on the logits; then temperature; then
//! min-p, top-k and top-p on the tempered distribution; then a draw. Temperature 0 is greedy: the penalised
//! logits' argmax, the lowest id winning a tie. Penalties follow vLLM and transformers: the repetition
//! penalty divides a positive logit (multiplies a negative one) of every token in the prompt or the
//! output; presence subtracts a constant from every token the output holds, frequency that many times
//! its count.
//!
//! Sampling never sorts the vocabulary. The tempered weights `exp((l − max)/T)` are computed in one
//! vectorised pass ([`VectorOps::softmax_exp`]); top-k keeps its `k` best in a heap; min-p is a threshold
//! on the weights; top-p sorts only the tokens whose weight is at least a cut-off, the cut-off lowered
//! until those tokens hold the nucleus's mass — which they must, as the nucleus takes the heaviest first.
//! The result is the nucleus a full sort gives. Log-probabilities are the model's own (the raw logits'
//! log-softmax, before penalties and temperature, as vLLM reports them), the top ones found with a heap.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use int4_kernels::vector::VectorOps;

use crate::error::{Error, Result};

/// The most `top_logprobs` a caller may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax; the lowest id wins a tie).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1.0: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of tokens in the prompt or the output by this
    /// (1.0: off; above 1 discourages repeats).
    pub repetition_penalty: f32,
    /// Subtract this from the logit of every token the output already holds (0: off), in [−2, 2].
    pub presence_penalty: f32,
    /// Subtract this times its count from the logit of every token the output holds (0: off), in [−2, 2].
    pub frequency_penalty: f32,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::greedy()
    }
}

impl SamplingParams {
    /// Greedy decoding, no penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }

    /// Whether any penalty is on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// An error naming the first value that cannot be sampled with: a temperature that is negative, NaN or
    /// infinite (NaN would pick the least likely token); `top_p` outside `(0, 1]`; `min_p` outside
    /// `[0, 1]`; a repetition penalty that is not a positive finite number; a presence or frequency penalty
    /// outside `[−2, 2]`.
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
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(Error::input(
                "min_p",
                format!("{} is not a fraction in [0, 1] (0 keeps every token)", self.min_p),
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(Error::input(
                "repetition_penalty",
                format!("{} is not a positive finite number (1 is off)", self.repetition_penalty),
            ));
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(Error::input(name, format!("{v} is outside [-2, 2] (0 is off)")));
            }
        }
        Ok(())
    }
}

/// Sampling values a request sets; each one it leaves `None` comes from the model's defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingOverrides {
    /// See [`SamplingParams::temperature`].
    pub temperature: Option<f32>,
    /// See [`SamplingParams::top_k`].
    pub top_k: Option<usize>,
    /// See [`SamplingParams::top_p`].
    pub top_p: Option<f32>,
    /// See [`SamplingParams::min_p`].
    pub min_p: Option<f32>,
    /// See [`SamplingParams::repetition_penalty`].
    pub repetition_penalty: Option<f32>,
    /// See [`SamplingParams::presence_penalty`].
    pub presence_penalty: Option<f32>,
    /// See [`SamplingParams::frequency_penalty`].
    pub frequency_penalty: Option<f32>,
    /// The seed (none: a fresh random one per request).
    pub seed: Option<u64>,
}

impl SamplingOverrides {
    /// `self`'s values where it has them, else `base`'s.
    pub fn or(self, base: SamplingOverrides) -> SamplingOverrides {
        SamplingOverrides {
            temperature: self.temperature.or(base.temperature),
            top_k: self.top_k.or(base.top_k),
            top_p: self.top_p.or(base.top_p),
            min_p: self.min_p.or(base.min_p),
            repetition_penalty: self.repetition_penalty.or(base.repetition_penalty),
            presence_penalty: self.presence_penalty.or(base.presence_penalty),
            frequency_penalty: self.frequency_penalty.or(base.frequency_penalty),
            seed: self.seed.or(base.seed),
        }
    }

    /// The values, anything unset greedy and off, an unset seed drawn at random.
    pub fn resolve(self) -> SamplingParams {
        let g = SamplingParams::greedy();
        SamplingParams {
            temperature: self.temperature.unwrap_or(g.temperature),
            top_k: self.top_k.unwrap_or(g.top_k),
            top_p: self.top_p.unwrap_or(g.top_p),
            min_p: self.min_p.unwrap_or(g.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(g.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(g.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(g.frequency_penalty),
            seed: self.seed.unwrap_or_else(random_seed),
        }
    }
}

/// A model's generation defaults, as transformers reads `generation_config.json`: with `do_sample` true,
/// its `temperature` (else 1), `top_k` (else 50), `top_p` and `min_p`; without, greedy. Its
/// `repetition_penalty` applies either way, and `max_new_tokens` is the default token budget.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    /// The sampling values.
    pub sampling: SamplingOverrides,
    /// The default token budget.
    pub max_tokens: Option<usize>,
}

impl GenerationDefaults {
    /// The defaults `generation_config.json` (`config`) gives, and a warning for each value that cannot be
    /// used (it is left out: a model's sampling hint is not worth refusing the model over).
    pub fn from_generation_config(config: &serde_json::Value) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let mut float = |key: &str, ok: fn(f32) -> bool| -> Option<f32> {
            let v = config.get(key)?;
            match v.as_f64().map(|f| f as f32) {
                Some(f) if ok(f) => Some(f),
                _ => {
                    warnings.push(format!("generation_config.json: \"{key}\": {v} is not usable; it is ignored"));
                    None
                }
            }
        };
        let do_sample = config.get("do_sample").and_then(|v| v.as_bool()).unwrap_or(false);
        let mut s = SamplingOverrides {
            repetition_penalty: float("repetition_penalty", |f| f.is_finite() && f > 0.0),
            ..SamplingOverrides::default()
        };
        if do_sample {
            s.temperature = Some(float("temperature", |f| f.is_finite() && f >= 0.0).unwrap_or(1.0));
            s.top_p = float("top_p", |f| f > 0.0 && f <= 1.0);
            s.min_p = float("min_p", |f| (0.0..=1.0).contains(&f));
            s.top_k = match config.get("top_k") {
                None => Some(50),
                Some(v) => match v.as_u64() {
                    Some(k) => Some(k as usize),
                    None => {
                        warnings.push(format!("generation_config.json: \"top_k\": {v} is not usable; it is ignored"));
                        Some(50)
                    }
                },
            };
        } else {
            s.temperature = Some(0.0);
        }
        let max_tokens = config.get("max_new_tokens").and_then(|v| v.as_u64()).map(|n| n as usize);
        (GenerationDefaults { sampling: s, max_tokens }, warnings)
    }
}

/// The log-probabilities of one sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token's.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first (as many as asked for).
    pub top: Vec<(u32, f32)>,
}

/// A seeded sampler for one sequence: its parameters, its random stream, and what the penalties need to
/// know of the tokens so far.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    /// Each output token's count (presence and frequency penalties).
    output_counts: HashMap<u32, u32>,
    /// Every token of the prompt and the output, once (repetition penalty).
    seen: HashMap<u32, ()>,
    ops: VectorOps,
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler for `params` (check them first with [`SamplingParams::check`]).
    pub fn new(params: SamplingParams) -> Self {
        Sampler {
            params,
            rng: SplitMix64(params.seed),
            output_counts: HashMap::new(),
            seen: HashMap::new(),
            ops: VectorOps::new(),
            weights: Vec::new(),
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Tells the sampler the prompt (for the repetition penalty).
    pub fn observe_prompt(&mut self, prompt: &[u32]) {
        if self.params.repetition_penalty != 1.0 {
            self.seen.extend(prompt.iter().map(|&t| (t, ())));
        }
    }

    /// Tells the sampler a token was output.
    fn observe_output(&mut self, token: u32) {
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token, ());
        }
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.output_counts.entry(token).or_insert(0) += 1;
        }
    }

    /// The next token from `logits` (changed in place by the penalties), and records it as output.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        let t = if self.params.temperature <= 0.0 { argmax(logits) } else { self.draw(logits) };
        self.observe_output(t);
        t
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in self.seen.keys() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.output_counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }

    /// A draw from the tempered, truncated distribution.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = self.params;
        let max = self.ops.max(logits);
        if !max.is_finite() {
            return argmax(logits);
        }
        let inv_t = 1.0 / p.temperature;
        // min-p: the most likely token has weight 1, so its threshold is min_p itself.
        let floor = p.min_p;
        let mut cand: Vec<(f32, u32)> = if p.top_k > 0 && p.top_k < logits.len() {
            // The k best by a heap, then weighed: the set is small, so it is sorted whole.
            let mut c: Vec<(f32, u32)> =
                top_k(logits, p.top_k).into_iter().map(|(l, i)| (exp_weight(l, max, inv_t), i)).collect();
            c.retain(|&(w, _)| w >= floor);
            if p.top_p < 1.0 {
                let total: f64 = c.iter().map(|&(w, _)| f64::from(w)).sum();
                nucleus(&mut c, total * f64::from(p.top_p));
            }
            c
        } else {
            self.weights.clear();
            self.weights.extend_from_slice(logits);
            let sum = self.ops.softmax_exp(&mut self.weights, max, inv_t);
            if p.top_p >= 1.0 {
                // Every token above the floor: draw straight from the weights, in id order.
                return self.draw_from_weights(floor).unwrap_or_else(|| argmax(logits));
            }
            let total: f64 = if floor > 0.0 {
                self.weights.iter().filter(|&&w| w >= floor).map(|&w| f64::from(w)).sum()
            } else {
                f64::from(sum)
            };
            let target = total * f64::from(p.top_p);
            // The nucleus takes the heaviest first, so once the tokens at or above a cut-off hold `target`
            // it lies among them: lower the cut-off until they do, then sort only those.
            let mut cut = 1e-3f32.max(floor);
            let mut c = Vec::new();
            loop {
                c.clear();
                c.extend(self.weights.iter().enumerate().filter(|&(_, &w)| w >= cut).map(|(i, &w)| (w, i as u32)));
                let held: f64 = c.iter().map(|&(w, _)| f64::from(w)).sum();
                if held >= target || cut <= floor {
                    break;
                }
                cut = if cut < 1e-30 { floor } else { (cut * 1e-3).max(floor) };
            }
            sort_desc(&mut c);
            nucleus(&mut c, target);
            c
        };
        if cand.is_empty() {
            cand.push((1.0, argmax(logits)));
        }
        let total: f64 = cand.iter().map(|&(w, _)| f64::from(w)).sum();
        let mut r = self.rng.unit() * total;
        for &(w, i) in &cand {
            let w = f64::from(w);
            if r < w {
                return i;
            }
            r -= w;
        }
        cand[cand.len() - 1].1
    }

    /// A draw from `self.weights`, every token at or above `floor` in id order (`None` if none is).
    fn draw_from_weights(&mut self, floor: f32) -> Option<u32> {
        let total: f64 = self.weights.iter().filter(|&&w| w >= floor).map(|&w| f64::from(w)).sum();
        let mut r = self.rng.unit() * total;
        let mut last = None;
        for (i, &w) in self.weights.iter().enumerate() {
            if w < floor || w == 0.0 {
                continue;
            }
            let w = f64::from(w);
            if r < w {
                return Some(i as u32);
            }
            r -= w;
            last = Some(i as u32);
        }
        last
    }

    /// The model's log-probability of `token` under the raw `logits`, and the `top` most likely tokens'.
    pub fn logprobs(&mut self, logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
        let max = self.ops.max(logits);
        self.weights.clear();
        self.weights.extend_from_slice(logits);
        let sum = self.ops.softmax_exp(&mut self.weights, max, 1.0);
        let log_z = max + sum.ln();
        let lp = |l: f32| l - log_z;
        TokenLogprobs {
            logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
            top: if top == 0 { Vec::new() } else { top_k(logits, top).into_iter().map(|(l, i)| (i, lp(l))).collect() },
        }
    }
}

/// `exp((l − max)·inv_t)`.
fn exp_weight(l: f32, max: f32, inv_t: f32) -> f32 {
    int4_kernels::vector::exp_portable((l - max) * inv_t)
}

/// Heaviest first; the lower id first among equals.
fn sort_desc(c: &mut [(f32, u32)]) {
    c.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
}

/// Keeps the shortest prefix of `c` (sorted heaviest first) whose weight reaches `target`.
fn nucleus(c: &mut Vec<(f32, u32)>, target: f64) {
    let mut acc = 0.0f64;
    let keep = c
        .iter()
        .position(|&(w, _)| {
            acc += f64::from(w);
            acc >= target
        })
        .map_or(c.len(), |k| k + 1);
    c.truncate(keep);
}

/// A logit and its id, ordered so that a max-heap's top is the *least* wanted: the smallest logit, the
/// highest id among equals.
#[derive(Clone, Copy, PartialEq)]
struct Worst(f32, u32);

impl Eq for Worst {}

impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(self.1.cmp(&other.1))
    }
}

/// The `k` largest logits with their ids, largest first (the lower id first among equals; NaNs are never
/// taken). A small `k` of a large vocabulary finds, by vectorised counting passes, a distance below the
/// largest logit within which at least `k` (and not many more) lie, takes those and selects among them;
/// otherwise one pass with a heap of `k`.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(f32, u32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let max = VectorOps::new().max(logits);
    if k * 64 <= logits.len() && max.is_finite() {
        // Widen the distance below the largest until at least k lie within it, then narrow it (a few
        // halvings) while more than 4k do; then take those, and select the k among them.
        let at_least = |t: f32| count_at_least(logits, t);
        let (mut inside, mut outside) = (0.0f32, 1.0f32);
        while at_least(max - outside) < k {
            inside = outside;
            outside *= 4.0;
            if outside > 1e30 {
                break;
            }
        }
        if outside <= 1e30 {
            for _ in 0..6 {
                let mid = (inside + outside) / 2.0;
                match at_least(max - mid) {
                    n if n < k => inside = mid,
                    n if n > 4 * k => outside = mid,
                    _ => {
                        outside = mid;
                        break;
                    }
                }
            }
            let floor = max - outside;
            let mut c: Vec<(f32, u32)> =
                logits.iter().enumerate().filter(|&(_, &l)| l >= floor).map(|(i, &l)| (l, i as u32)).collect();
            if c.len() > k {
                c.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                c.truncate(k);
            }
            sort_desc(&mut c);
            return c;
        }
    }
    let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if heap.len() < k {
            heap.push(Worst(l, i as u32));
        } else if let Some(w) = heap.peek()
            && Worst(l, i as u32) < *w
        {
            heap.pop();
            heap.push(Worst(l, i as u32));
        }
    }
    let mut out: Vec<(f32, u32)> = heap.into_iter().map(|Worst(l, i)| (l, i)).collect();
    sort_desc(&mut out);
    out
}

/// How many of `x` are at least `t` (NaN never is), in sixteen lanes of counts the compiler vectorises.
fn count_at_least(x: &[f32], t: f32) -> usize {
    let mut lanes = [0u32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (n, &v) in lanes.iter_mut().zip(c) {
            *n += u32::from(v >= t);
        }
    }
    let tail = chunks.remainder().iter().filter(|&&v| v >= t).count();
    lanes.iter().map(|&n| n as usize).sum::<usize>() + tail
}

/// SplitMix64: a small, well-mixed stream, fully determined by its seed.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A seed for a request that gave none: different in every call.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// The index of the largest logit (the lowest index on a tie; NaNs are passed over, and all NaN is 0):
/// the maximum by a vectorised pass, then its first position.
pub fn argmax(logits: &[f32]) -> u32 {
    let max = VectorOps::new().max(logits);
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
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
