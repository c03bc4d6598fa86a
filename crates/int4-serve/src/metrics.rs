//! What `GET /metrics` reports, in Prometheus' text format: queue depth, running sequences, tokens in and
//! out, requests by outcome, and histograms of time to first token, inter-token latency and step time.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Latency buckets, seconds.
const BUCKETS: [f64; 14] = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A cumulative histogram of durations.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            if s <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", c.load(Ordering::Relaxed));
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    queued: AtomicU64,
    running: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    prefix_cache_prompts: AtomicU64,
    prefix_cache_bytes: AtomicU64,
    generated_tokens: AtomicU64,
    requests_ok: AtomicU64,
    requests_failed: AtomicU64,
    requests_rejected: AtomicU64,
    ttft: Histogram,
    itl: Histogram,
    step: Histogram,
}

impl Metrics {
    /// Sets the number of requests waiting.
    pub fn set_queued(&self, n: usize) {
        self.queued.store(n as u64, Ordering::Relaxed);
    }

    /// Sets the number of sequences running.
    pub fn set_running(&self, n: usize) {
        self.running.store(n as u64, Ordering::Relaxed);
    }

    /// Counts prompt tokens run.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts prompt positions copied from a kept or running sequence's cache instead of run.
    pub fn add_cached_prompt_tokens(&self, n: usize) {
        self.cached_prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Sets the prompt caches kept for later requests and their bytes.
    pub fn set_prefix_cache(&self, prompts: usize, bytes: usize) {
        self.prefix_cache_prompts.store(prompts as u64, Ordering::Relaxed);
        self.prefix_cache_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    /// Counts generated tokens.
    pub fn add_generated_tokens(&self, n: usize) {
        self.generated_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts a request by how it ended: served, failed (an error after it was accepted), or refused.
    pub fn count_request(&self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => &self.requests_ok,
            Outcome::Failed => &self.requests_failed,
            Outcome::Rejected => &self.requests_rejected,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Records a time to first token.
    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d);
    }

    /// Records an inter-token latency.
    pub fn observe_itl(&self, d: Duration) {
        self.itl.observe(d);
    }

    /// Records a scheduler step's time.
    pub fn observe_step(&self, d: Duration) {
        self.step.observe(d);
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", v.load(Ordering::Relaxed));
        };
        let counter = |out: &mut String, name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        };
        gauge(&mut out, "int4_queue_depth", "Requests waiting for admission.", &self.queued);
        gauge(&mut out, "int4_running_sequences", "Sequences running.", &self.running);
        counter(&mut out, "int4_prompt_tokens_total", "Prompt tokens run.", &self.prompt_tokens);
        counter(
            &mut out,
            "int4_prompt_tokens_cached_total",
            "Prompt tokens copied from a kept or running sequence's cache instead of run.",
            &self.cached_prompt_tokens,
        );
        gauge(
            &mut out,
            "int4_prefix_cache_prompts",
            "Prompt caches kept for later requests.",
            &self.prefix_cache_prompts,
        );
        gauge(&mut out, "int4_prefix_cache_bytes", "Bytes of the prompt caches kept.", &self.prefix_cache_bytes);
        counter(&mut out, "int4_generation_tokens_total", "Tokens generated.", &self.generated_tokens);
        let _ = writeln!(out, "# HELP int4_requests_total Requests by outcome.\n# TYPE int4_requests_total counter");
        for (label, v) in
            [("ok", &self.requests_ok), ("failed", &self.requests_failed), ("rejected", &self.requests_rejected)]
        {
            let _ = writeln!(out, "int4_requests_total{{outcome=\"{label}\"}} {}", v.load(Ordering::Relaxed));
        }
        self.ttft.render(&mut out, "int4_time_to_first_token_seconds", "Time from request to first token.");
        self.itl.render(&mut out, "int4_inter_token_latency_seconds", "Time between a sequence's tokens.");
        self.step.render(&mut out, "int4_step_seconds", "Time of a scheduler step.");
        out
    }
}

/// How a request ended, for [`Metrics::count_request`].
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// Served.
    Ok,
    /// Accepted, then failed.
    Failed,
    /// Refused (a bad request, a full queue).
    Rejected,
}
