//! Shared inputs for the workspace's criterion benchmarks.
//!
//! The shapes here are the ones the project cares about: the upstream model's linears and the ones the
//! runtime executes for SmolLM2-135M (q/k/v and gate/up fused, and the tied 49152-row embedding/head).

pub mod chart;
pub mod model_shapes;
pub mod prompts;
pub mod synthetic;

pub use model_shapes::{ModelShape, SMOLLM2_135M, SPARK_SHAPED};

/// `(N, K)` of every weight matrix the benchmarks use.
pub const SHAPES: &[(usize, usize)] = &[
    (2048, 2048),
    (3072, 2048),
    (13312, 2048),
    (2048, 6656),
    (960, 576),
    (576, 576),
    (3072, 576),
    (576, 1536),
    (49152, 576),
];

/// Deterministic pseudo-random f32 weights in about ±1 (an xorshift stream), row-major `[N][K]`.
pub fn weights(n: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// This process's `RssAnon` and `RssFile` in bytes, from `/proc/self/status` (`None` off Linux).
pub fn rss_anon_and_file() -> Option<(u64, u64)> {
    rss_from_status("/proc/self/status")
}

/// Another process's `RssAnon` and `RssFile` in bytes, from `/proc/PID/status` (`None` off Linux or once
/// it has exited).
pub fn process_rss_anon_and_file(pid: u32) -> Option<(u64, u64)> {
    rss_from_status(&format!("/proc/{pid}/status"))
}

fn rss_from_status(path: &str) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(path).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
    };
    Some((field("RssAnon:")?, field("RssFile:")?))
}

/// Samples this process's `RssAnon` on a background thread until stopped, keeping the peak: how the
/// benchmarks report peak anonymous memory during a load, which `/proc` does not record (`VmHWM` counts
/// file-backed pages too).
#[derive(Debug)]
pub struct PeakRssAnon {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl PeakRssAnon {
    /// Starts sampling this process every `every`.
    pub fn start(every: std::time::Duration) -> Self {
        Self::start_for(None, every)
    }

    /// Starts sampling process `pid` (this one if `None`) every `every`.
    pub fn start_for(pid: Option<u32>, every: std::time::Duration) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0;
            loop {
                let rss = match pid {
                    Some(p) => process_rss_anon_and_file(p),
                    None => rss_anon_and_file(),
                };
                peak = peak.max(rss.map_or(0, |r| r.0));
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    return peak;
                }
                std::thread::sleep(every);
            }
        });
        PeakRssAnon { stop, handle }
    }

    /// Stops sampling and returns the peak in bytes (one last sample included).
    pub fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or(0)
    }
}

/// Whether `path` holds a model the runtime can open: a Hugging Face directory (with `config.json`) or a
/// GGUF (a `.gguf` file, or a directory holding one), as the runtime's `ModelDir` reads it.
pub fn is_model(path: &std::path::Path) -> bool {
    path.join("config.json").exists() || int4::ModelDir::open(path).is_ok_and(|m| m.gguf().is_some())
}

/// The model directory a benchmark binary runs on: `given` (its `--model DIR`), else the default model that
/// `cargo xtask fetch-model` prepares. With `synthetic`, `--model spark-shaped` (or `smollm2-shaped`) names
/// a synthetic model, generated under `target/bench/models/` on first use with the default model's
/// tokenizer. Exits with a message naming `tool` when there is no model.
/// A model is one [`is_model`] accepts.
pub fn model_dir_arg(given: Option<&str>, tool: &str, synthetic: bool) -> std::path::PathBuf {
    if let Some(shape) = given.and_then(synthetic::shape_named) {
        if !synthetic {
            eprintln!("{tool}: {} is a synthetic model (random weights); {tool} needs a real one", shape.name);
            std::process::exit(1);
        }
        let dir = synthetic::default_dir(&shape);
        let donor = int4::cache::dirs::default_model_dir();
        if let Err(e) = synthetic::write_model(&shape, &dir, donor.as_deref()) {
            eprintln!("{tool}: {e}");
            std::process::exit(1);
        }
        return dir;
    }
    let dir = given.map(std::path::PathBuf::from).or_else(int4::cache::dirs::default_model_dir);
    match dir {
        Some(d) if is_model(&d) => d,
        Some(d) => {
            eprintln!("{tool}: no model at {} (run `cargo xtask fetch-model`)", d.display());
            std::process::exit(1);
        }
        None => {
            eprintln!("{tool}: no model directory: pass --model DIR, or set INT4_MODEL_DIR or HOME");
            std::process::exit(1);
        }
    }
}
