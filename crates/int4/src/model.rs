//! The Llama-family forward pass: RMSNorm, RoPE, grouped-query attention over a KV cache, SwiGLU MLP.
//!
//! q/k/v are fused into one matrix and gate/up into another, so each layer runs four linears. Activations
//! are f32 throughout; the linears run on whatever kernel [`Numerics`] selects. The embedding is tied to
//! the head when the checkpoint says so; on the 4-bit path the embedding lookup reads rows straight from
//! the head's packed layout, so no second copy of the table exists.

use int4_kernels::KernelId;
use int4_kernels::lines::LineAlignedF32;
use int4_kernels::vector::VectorOps;
use int4_select::KvType;
use rayon::prelude::*;
use std::ops::Range;

use crate::config::{Architecture, ModelConfig};
use crate::error::{Error, Result};
use crate::kv::{Heads, KvCache, Plane};
use crate::linear::{Linear, Numerics, SectionSource};
use crate::quantized::{QuantFormat, StoredLinear, gguf_stored_bits, gguf_wide, read_gguf_linear, read_linear};
use crate::weights::Checkpoint;
use int4_gguf::GgmlType;

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Linear,
    mlp_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
}

enum Embedding {
    /// A dense f32 table `[vocab][hidden]`.
    Dense(Vec<f32>),
    /// Rows decoded from the (tied) head's packed 4-bit layout.
    FromHead,
}

/// Which kernel ran a kind of layer in each phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerKernels {
    /// `qkv`, `o_proj`, `gate_up`, `down` or `lm_head`.
    pub layer: &'static str,
    /// Kernel at M = 1.
    pub decode: KernelId,
    /// Kernel for a long prompt.
    pub prefill: KernelId,
}

/// The kernels one linear layer dispatched to, as it recorded them (`None`: that phase has not run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched {
    /// `layers.<i>.qkv`, `layers.<i>.o_proj`, `layers.<i>.gate_up`, `layers.<i>.down` or `lm_head`.
    pub layer: String,
    /// The last decode-phase call's kernel.
    pub decode: Option<KernelId>,
    /// The last prefill-phase call's kernel.
    pub prefill: Option<KernelId>,
}

/// A loaded model.
pub struct Model {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Linear,
    inv_freq: Vec<f64>,
    numerics: Numerics,
    /// How the caches [`Model::kv_cache`] makes store keys and values.
    kv: KvType,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.cfg).field("numerics", &self.numerics).finish_non_exhaustive()
    }
}

/// A linear layer's place in a decoder layer, as a [`ForwardObserver`] sees it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearSlot {
    /// q/k/v, fused (input: the attention-normed residual).
    Qkv,
    /// `o_proj` (input: the attention output).
    O,
    /// gate/up, fused (input: the MLP-normed residual).
    GateUp,
    /// `down_proj` (input: the SwiGLU activation).
    Down,
    /// The head (input: the final-normed residual, of every row).
    Head,
}

/// What [`Model::forward_observed`] does with a decoder layer, as its observer decides.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerFlow {
    /// Run the layer.
    Run,
    /// Skip it (the residual stream passes through unchanged and its KV cache is not written).
    Skip,
    /// Stop the forward pass here; it returns no logits.
    Stop,
}

/// Watches the inputs of the linear layers during [`Model::forward_observed`].
///
/// Why: GPTQ (`int4_quant::gptq_method`) needs, per linear layer, the Hessian `Σ xᵀx` of its inputs over calibration
/// text, and it runs sequentially (layer `l` is quantized before layer `l + 1`'s inputs are seen). The hook
/// lets it see every linear input, replace the residual stream at a layer's start (to resume from states
/// it kept), skip the layers before and stop after the one it is working on, so each step costs one
/// decoder layer instead of a whole forward pass. [`Model::forward`] passes no observer and is unchanged.
#[doc(hidden)]
pub trait ForwardObserver {
    /// Called before decoder layer `layer` runs, and with `layer == num_layers` before the final norm,
    /// with the residual stream `[m][hidden]`, which it may overwrite.
    fn layer_start(&mut self, layer: usize, x: &mut [f32]) -> LayerFlow;
    /// The input `[m][k]` of linear `slot` of decoder layer `layer` (`num_layers` for the head).
    fn linear_input(&mut self, layer: usize, slot: LinearSlot, x: &[f32], m: usize);
}

#[inline]
fn observe(
    observer: &mut Option<&mut (dyn ForwardObserver + Send)>,
    layer: usize,
    slot: LinearSlot,
    x: &[f32],
    m: usize,
) {
    if let Some(obs) = observer.as_deref_mut() {
        obs.linear_input(layer, slot, x, m);
    }
}

/// Memory this process can still take: `MemAvailable`, lowered to the room left under a cgroup (v2)
/// memory limit when there is one. `None` where neither can be read (not Linux).
fn available_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    let mut available = kib.saturating_mul(1024);
    let cgroup = |name: &str| -> Option<usize> {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok()?.trim().parse().ok()
    };
    if let (Some(max), Some(current)) = (cgroup("memory.max"), cgroup("memory.current")) {
        available = available.min(max.saturating_sub(current));
    }
    Some(available)
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    VectorOps::new().rms_norm(x, w, eps, out);
}

/// `x += add` (when given), then `normed = rms_norm(x)`, row by row (`h` values a row); from
/// [`PARALLEL_ROW_OPS`] rows (a prompt, or a step of that many decode streams) in parallel. Each row's
/// values go through the same operations either way, so the bits do not depend on the split (and on a
/// many-core machine this is otherwise a serial part of every layer).
fn add_and_norm(x: &mut [f32], add: Option<&[f32]>, w: &[f32], eps: f32, normed: &mut [f32], h: usize) {
    let row = |(i, (x, normed)): (usize, (&mut [f32], &mut [f32]))| {
        if let Some(add) = add {
            add_into(x, &add[i * h..(i + 1) * h]);
        }
        rms_norm(x, w, eps, normed);
    };
    if x.len() / h >= PARALLEL_ROW_OPS {
        x.par_chunks_mut(h).zip(normed.par_chunks_mut(h)).enumerate().for_each(row);
    } else {
        x.chunks_mut(h).zip(normed.chunks_mut(h)).enumerate().for_each(row);
    }
}

/// `x += add`, rows in parallel from [`PARALLEL_ROW_OPS`] (as [`add_and_norm`]).
fn add_rows(x: &mut [f32], add: &[f32], h: usize) {
    if x.len() / h >= PARALLEL_ROW_OPS {
        x.par_chunks_mut(h).zip(add.par_chunks(h)).for_each(|(x, add)| add_into(x, add));
    } else {
        add_into(x, add);
    }
}

/// `x[i] += add[i]`.
fn add_into(x: &mut [f32], add: &[f32]) {
    for (a, b) in x.iter_mut().zip(add) {
        *a += b;
    }
}

/// RoPE's `(cos, sin)` of `pos·f` for every row's position and every frequency, `[row][freq]`: computed
/// once per forward call and shared by every head of every layer. These are the f64 values the rotation has
/// always used, so the rotated vectors are bit-identical to computing `sin_cos` per head.
fn rope_table(inv_freq: &[f64], pos: &[usize]) -> Vec<(f64, f64)> {
    let mut t = Vec::with_capacity(pos.len() * inv_freq.len());
    for &p in pos {
        let p = p as f64;
        t.extend(inv_freq.iter().map(|&f| {
            let (s, c) = (p * f).sin_cos();
            (c, s)
        }));
    }
    t
}

/// Rotates pairs `(j, j + hd/2)` of one head's vector by the angles in `cs` (one row of [`rope_table`]),
/// as Hugging Face's `rotate_half` does, in f64.
fn apply_rope(v: &mut [f32], cs: &[(f64, f64)]) {
    let half = v.len() / 2;
    for (j, &(c, s)) in cs.iter().enumerate() {
        let (a, b) = (v[j], v[j + half]);
        v[j] = (f64::from(a) * c - f64::from(b) * s) as f32;
        v[j + half] = (f64::from(b) * c + f64::from(a) * s) as f32;
    }
}

/// From this many rows a step prepares its query and key heads (normalised where the model does, rotated)
/// and writes its sequences' caches in parallel: sixteen decode rows' worth is a few percent of a step
/// (docs/perf.md); a handful of rows' is less than a hand-off to the other thread.
const PARALLEL_QK_ROWS: usize = 8;

/// The most bytes of one layer's stored keys and values a step requests ahead of its attention
/// ([`KvCache::prefetch_layer`], shared among the step's sequences): a quarter of the smallest L2 measured
/// (Zen 3's 512 KiB), so the lines stay there through the qkv product, and about 2,048 prefetch
/// instructions (one a line, one more where a head's span starts inside a line) on the thread that runs
/// the step. A prefetch holds a line-fill buffer until its line arrives, so those instructions take about
/// as long as the reads they save where the budget is large: past it, the hardware prefetcher carries
/// each head's stream on from its first lines. SmolLM2 holds 768 bytes a position in f16, so for one
/// sequence the budget covers its keys and values up to position 170, and the first 170 of each head
/// beyond; each of `n` sequences in a step gets `1/n` of it (docs/perf.md, "Decode attention waits on the
/// KV cache").
const KV_PREFETCH_BYTES: usize = 128 << 10;

/// From this many rows a step's row-wise work (residual adds, RMS norms, SiLU·up) runs over the pool:
/// a prompt's rows are a serial part of every layer on one thread, a few decode rows less than a hand-off.
const PARALLEL_ROW_OPS: usize = 16;

/// A run of at least this many query rows (one sequence, consecutive positions) takes the block path.
const ATTN_BLOCK_MIN_ROWS: usize = 4;
/// Below this many flops a layer's attention runs on the calling thread (on SmolLM2, a decode step in the
/// first 14 positions): a parallel hand-off costs more than it saves. The step runs on a pool worker
/// (`forward_rows`), so the hand-off is a work-stealing push, a few µs; at 2²¹ (the threshold while steps
/// ran from outside the pool) decode attention stayed on one thread up to position 910 while the other
/// core waited, and SmolLM2 tg128 ran 6–10% slower (W4A16 255–261 → 274–277 tok/s, W4A8 279–297 →
/// 303–308, `model-bench`, alternated).
const ATTN_PARALLEL_FLOPS: usize = 1 << 15;

/// The shapes attention needs.
#[derive(Clone, Copy)]
struct AttnShape {
    hd: usize,
    nh: usize,
    nkv: usize,
    qkv_n: usize,
    scale: f32,
}

/// Rows a linear layer runs together: in one call (a prompt chunk, or `forward_batch`'s rows), or, for
/// decode rows (one per sequence), each as it runs alone ([`Linear::forward_decode`]).
#[derive(Clone, Copy, Debug)]
struct RowGroup {
    start: usize,
    len: usize,
    decode: bool,
}

/// `out = x·Wᵀ` over `groups` of rows, each group in the calls its role takes.
fn run_linear(l: &Linear, x: &[f32], groups: &[RowGroup], out: &mut [f32]) -> Result<()> {
    let (k, n) = (l.k(), l.n());
    for g in groups {
        let (x, out) = (&x[g.start * k..(g.start + g.len) * k], &mut out[g.start * n..(g.start + g.len) * n]);
        if g.decode { l.forward_decode(x, g.len, out)? } else { l.forward(x, g.len, out)? }
    }
    Ok(())
}

/// One sequence's part of a [`Model::step`].
#[derive(Debug)]
pub struct StepEntry<'a> {
    /// Its next tokens: one to decode, or a chunk of its prompt.
    pub tokens: &'a [u32],
    /// Its KV cache, continued by them.
    pub cache: &'a mut KvCache,
}

/// Grouped-query attention of layer `li` for every row: `attn[i][h] = softmax(q·Kᵀ·scale)·V` over the keys
/// `0..=pos[i]` of row `i`'s sequence (whose cache already holds this call's keys and values).
///
/// Work is cut into tasks of (block of query rows, KV head): a block is up to `qb` consecutive rows of one
/// sequence at consecutive positions; each task handles the `nh/nkv` query heads sharing its KV head, so K
/// and V are read once for all of them. Tasks run in parallel when the layer's work is large, and each task
/// computes its rows alone, so results do not depend on the thread count.
///
/// A run of [`ATTN_BLOCK_MIN_ROWS`] rows or more (prefill) has each KV head's keys transposed once, shared
/// by its query blocks, which compute scores as a GEMM (`S = Q·Kᵀ`), the softmax numerators with the
/// vectorised `exp`, then `P·V` as a GEMM; shorter runs (decode) take a dot product per key and query head
/// (the group's query heads together, eight keys at a time, [`VectorOps::dots_heads`]) and the same `P·V`
/// GEMM over the group's heads.
///
/// Error budget (u = 2⁻²⁴; against exact arithmetic on the same q, K, V): a score is one FMA chain of `hd`
/// terms (`hd·u·Σ|q·k|`, as the dot product before); `exp((s − max)·scale)` adds two roundings of the
/// argument and [`int4_kernels::vector::EXP_MAX_REL_ERROR`] (2 ulp) of relative error; the normaliser is a
/// sum in eight f32 lanes (`n·u` relative); `P·V` is one FMA chain over the `n` keys (`n·u·Σp|v|`), scaled
/// by `1/Σ` once (two more roundings). Relative to the previous per-key `axpy` form (which normalised each
/// weight first) only the order of these roundings changed; the total stays within `(hd + 2n + 8)·u`
/// relative to `Σ|p·v|`, far below the 4-bit paths' own error and inside the f32 tests' tolerances.
#[allow(clippy::too_many_arguments)]
fn attention(
    ops: &VectorOps,
    shape: AttnShape,
    qkv: &[f32],
    seq: &[usize],
    pos: &[usize],
    caches: &[&KvCache],
    li: usize,
    attn: &mut [f32],
) {
    let AttnShape { hd, nh, nkv, .. } = shape;
    let m = seq.len();
    let group = nh / nkv;
    // Tasks (first row, rows, KV head, run), and runs (first row, keys its last row sees).
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < m {
        // A sequence's consecutive rows, in query blocks of 64 for a long run, smaller for a short one so
        // both threads get work: sized by that run alone, whatever else shares the step.
        let mut run = i + 1;
        while run < m && seq[run] == seq[i] && pos[run] == pos[run - 1] + 1 {
            run += 1;
        }
        let qb = ((run - i) / 8).clamp(16, 64);
        let run_id = runs.len();
        runs.push((i, if run - i >= ATTN_BLOCK_MIN_ROWS { pos[run - 1] + 1 } else { 0 }));
        while i < run {
            let j = (i + qb).min(run);
            tasks.extend((0..nkv).map(|kvh| (i, j - i, kvh, run_id)));
            i = j;
        }
    }
    // Longest first, each task a job of its own (below). A decode row deep into a long chat reads its keys
    // and values for ~60 µs a task, a short row for ~3 µs. The thread running the loop takes tasks from
    // the front, the long ones, while the other steals the far end, the short ones, a task at a time; in
    // halves of the list in the order the rows came, the long tasks could all fall in one thread's half
    // with the other thread waiting at the end. Each task computes its rows alone, so neither the order
    // nor the split changes a result.
    tasks.sort_by_key(|&(i0, r, ..)| std::cmp::Reverse(r * (pos[i0 + r - 1] + 1)));
    let flops: usize = tasks.iter().map(|&(i0, r, ..)| 4 * r * (pos[i0 + r - 1] + 1) * group * hd).sum();
    let parallel = flops >= ATTN_PARALLEL_FLOPS;
    // Each prefill run's keys, transposed once per KV head (`[hd][ld]`, ld the run's keys rounded up to
    // whole vectors) for all its query blocks, and, from a 16-bit cache, its values widened to f32
    // (`[keys][hd]`); both empty for decode runs.
    let prepare = |x: usize| -> (Vec<f32>, Vec<f32>) {
        let ((first, keys), kvh) = (runs[x / nkv], x % nkv);
        if keys == 0 {
            return (Vec::new(), Vec::new());
        }
        let cache = caches[seq[first]];
        let (kp, vp, heads, ld) = (&cache.k[li], &cache.v[li], cache.heads(), keys.next_multiple_of(8));
        let keys_f32;
        let kc = match kp.head_f32(heads, kvh) {
            Some(kc) => &kc[..keys * hd],
            None => {
                let mut wide = vec![0.0f32; keys * hd];
                kp.widen(ops, heads, kvh, 0, &mut wide);
                keys_f32 = wide;
                &keys_f32
            }
        };
        let mut kt = vec![0.0f32; hd * ld];
        for (j, key) in kc.chunks_exact(hd).enumerate() {
            for (d, &v) in key.iter().enumerate() {
                kt[d * ld + j] = v;
            }
        }
        let mut vw = Vec::new();
        if vp.head_f32(heads, kvh).is_none() {
            vw = vec![0.0f32; keys * hd];
            vp.widen(ops, heads, kvh, 0, &mut vw);
        }
        (kt, vw)
    };
    // Decode runs have nothing to prepare: no parallel loop for them.
    let prepared: Vec<(Vec<f32>, Vec<f32>)> = if parallel && runs.iter().any(|&(_, keys)| keys > 0) {
        (0..runs.len() * nkv).into_par_iter().map(prepare).collect()
    } else {
        (0..runs.len() * nkv).map(prepare).collect()
    };
    let run = |&(i0, r, kvh, run_id): &(usize, usize, usize, usize)| -> Vec<f32> {
        let cache = caches[seq[i0]];
        let (kt, vw) = &prepared[run_id * nkv + kvh];
        let keys_t = (kt.as_slice(), runs[run_id].1.next_multiple_of(8));
        attend_block(ops, shape, qkv, (&cache.k[li], &cache.v[li], cache.heads()), keys_t, vw, kvh, i0, r, pos[i0])
    };
    // A decode step's attention is one of its many short loops, on the thread team; a prompt's is one
    // long loop between the prefill kernels' loops on rayon, and stays there with them.
    let decode_only = runs.iter().all(|&(_, keys)| keys == 0);
    let outs: Vec<Vec<f32>> = match (parallel, decode_only) {
        (false, _) => tasks.iter().map(run).collect(),
        (true, true) => int4_team::map_each(&tasks, run),
        (true, false) => tasks.par_iter().with_max_len(1).map(run).collect(),
    };
    let gw = group * hd;
    for (&(i0, r, kvh, _), out) in tasks.iter().zip(&outs) {
        for t in 0..r {
            let dst = (i0 + t) * nh * hd + kvh * gw;
            attn[dst..dst + gw].copy_from_slice(&out[t * gw..(t + 1) * gw]);
        }
    }
}

/// One attention task: rows `i0..i0 + r` (positions `p0..p0 + r`) and the query heads of KV head `kvh`.
/// `(kt, ld)` are the head's keys transposed (`[hd][ld]`, at least `p0 + r` keys) and `vw` its values
/// widened to f32 (`[keys][hd]`, from a 16-bit cache only) when `r` reaches [`ATTN_BLOCK_MIN_ROWS`].
/// Returns `[r][group·hd]`.
///
/// Decode from a 16-bit cache reads keys and values as they are stored: scores by
/// [`VectorOps::dots_heads_f16`], `P·V` by [`VectorOps::gemm_f16`] (with SIMD both widen in registers;
/// `gemm_f16` without AVX-512 widens 256 positions at a time into a buffer), each bit for bit its
/// operation against the widened values; so the result is what an f32 cache holding the same values
/// gives.
#[allow(clippy::too_many_arguments)]
fn attend_block(
    ops: &VectorOps,
    shape: AttnShape,
    qkv: &[f32],
    (kp, vp, heads): (&Plane, &Plane, Heads),
    (kt, kt_ld): (&[f32], usize),
    vw: &[f32],
    kvh: usize,
    i0: usize,
    r: usize,
    p0: usize,
) -> Vec<f32> {
    let AttnShape { hd, nh, nkv, qkv_n, scale } = shape;
    let group = nh / nkv;
    let gw = group * hd;
    // Row t sees keys 0..=p0 + t.
    let nk = p0 + r;
    let mut out = vec![0.0f32; r * gw];
    let mut inv = vec![0.0f32; r.max(group)];
    // This head's keys and values, `[position][hd]`, where the cache stores f32.
    let (kc, vc) = (kp.head_f32(heads, kvh), vp.head_f32(heads, kvh));
    // Scores: every one this task reads it writes first, so the buffer's old contents never matter.
    let mut scores = SCORES.take();
    if r >= ATTN_BLOCK_MIN_ROWS {
        let vb = vc.unwrap_or(vw);
        let ld = nk.next_multiple_of(8);
        let s = grow(&mut scores, r * ld);
        for g in 0..group {
            let h = kvh * group + g;
            ops.gemm((r, nk, hd), &qkv[i0 * qkv_n + h * hd..], qkv_n, 1, kt, kt_ld, s, ld);
            for (t, w) in inv.iter_mut().enumerate().take(r) {
                let row = &mut s[t * ld..t * ld + nk];
                let len = p0 + t + 1;
                let max = ops.max(&row[..len]);
                *w = 1.0 / ops.softmax_exp(&mut row[..len], max, scale);
                row[len..].fill(0.0);
            }
            ops.gemm((r, hd, nk), s, ld, 1, vb, hd, &mut out[g * hd..], gw);
            for (t, &w) in inv.iter().enumerate().take(r) {
                ops.scale(w, &mut out[t * gw + g * hd..t * gw + (g + 1) * hd]);
            }
        }
    } else {
        let s = grow(&mut scores, group * nk);
        let (k16, v16) = (kp.head_f16(heads, kvh), vp.head_f16(heads, kvh));
        for t in 0..r {
            let len = p0 + t + 1;
            let q0 = (i0 + t) * qkv_n + kvh * gw;
            let qs = &qkv[q0..q0 + gw];
            match (kc, k16) {
                (Some(kc), _) => ops.dots_heads(qs, group, &kc[..len * hd], hd, &mut s[..group * len]),
                (None, Some(k16)) => ops.dots_heads_f16(qs, group, &k16[..len * hd], hd, &mut s[..group * len]),
                (None, None) => unreachable!("a plane stores f32 or f16"),
            }
            for (g, w) in inv.iter_mut().enumerate().take(group) {
                let row = &mut s[g * len..(g + 1) * len];
                let max = ops.max(row);
                *w = 1.0 / ops.softmax_exp(row, max, scale);
            }
            let o = &mut out[t * gw..(t + 1) * gw];
            match (vc, v16) {
                (Some(vc), _) => ops.gemm((group, hd, len), s, len, 1, vc, hd, o, hd),
                (None, Some(v16)) => ops.gemm_f16((group, hd, len), s, len, 1, &v16[..len * hd], hd, o, hd),
                (None, None) => unreachable!("a plane stores f32 or f16"),
            }
            for (g, &w) in inv.iter().enumerate().take(group) {
                ops.scale(w, &mut o[g * hd..(g + 1) * hd]);
            }
        }
    }
    if scores.len() <= SCORES_KEEP_FLOATS {
        SCORES.set(scores);
    }
    out
}

/// The first `len` floats of `buf`, which only ever grows (to exactly what a task needs): shrinking it
/// and growing it back would zero the regrown part, once a layer as the tasks' sizes alternate.
fn grow(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.reserve_exact(len - buf.len());
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// The most floats of a score buffer a thread keeps between [`attend_block`]'s tasks, for as long as the
/// thread lives (16 MiB: 64 query rows against 65,536 keys); a larger one is freed after its task.
const SCORES_KEEP_FLOATS: usize = 4 << 20;

thread_local! {
    /// [`attend_block`]'s scores, kept between the tasks one thread runs (a pool worker's, or the caller's
    /// on the serial path), so a long prompt's block does not allocate and zero a fresh buffer (19 rows ×
    /// 2,464 keys, 187 KB, for 153 new tokens after 2,304) for every task.
    static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod attention_tests {
    use super::*;
    use int4_kernels::isa::{IsaCaps, IsaLevel};

    /// Deterministic values in about ±3, varied enough that f16 rounding moves most of them.
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7919 + seed * 104_729) as f32 * 0.000_37).sin() * 3.0 + (i % 13) as f32 * 0.011).collect()
    }

    /// Attention over an f16 cache is bit for bit attention over an f32 cache holding the same rounded
    /// values: decode rows past several widened blocks (700 keys) and inside the first (4 keys), and a
    /// prefill run, in one call as a step batches them, for SmolLM2's shape and one with a head size off
    /// whole vectors, on every vector variant this CPU runs. An f32 cache of the unrounded values differs.
    #[test]
    fn a_16_bit_cache_attends_as_an_f32_cache_of_the_same_rounded_values() {
        let caps = IsaCaps::process();
        let variants = [
            VectorOps::new(),
            VectorOps::with_caps(&caps.with_max_level(IsaLevel::Avx2)),
            VectorOps::with_caps(&caps.with_max_level(IsaLevel::Portable)),
        ];
        for (hd, nh, nkv) in [(64usize, 9usize, 3usize), (24, 4, 2)] {
            let kw = nkv * hd;
            let qkv_n = (nh + 2 * nkv) * hd;
            let shape = AttnShape { hd, nh, nkv, qkv_n, scale: 1.0 / (hd as f32).sqrt() };
            // Rows: a decode row of sequence 0 at position 699, a prefill run of sequence 1 at 295..300,
            // a decode row of sequence 2 at position 3.
            let (seq, pos) = (vec![0, 1, 1, 1, 1, 1, 2], vec![699, 295, 296, 297, 298, 299, 3]);
            let lens = [700usize, 300, 4];
            let qkv = values(seq.len() * qkv_n, 1);
            let caches_of = |kv: KvType, round: bool| -> Vec<KvCache> {
                lens.iter()
                    .enumerate()
                    .map(|(c, &len)| {
                        let mut cache = KvCache::zeroed(1, len, nkv, hd, kv);
                        let heads = cache.heads();
                        for (plane, seed) in [(&mut cache.k[0], 10 + c), (&mut cache.v[0], 20 + c)] {
                            let mut x = values(len * kw, seed);
                            if round {
                                x.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
                            }
                            for (p, row) in x.chunks_exact(kw).enumerate() {
                                plane.write_position(&VectorOps::new(), heads, p, row);
                            }
                        }
                        cache
                    })
                    .collect()
            };
            let run = |ops: &VectorOps, caches: &[KvCache]| -> Vec<f32> {
                let refs: Vec<&KvCache> = caches.iter().collect();
                let mut out = vec![f32::NAN; seq.len() * nh * hd];
                attention(ops, shape, &qkv, &seq, &pos, &refs, 0, &mut out);
                out
            };
            let (half, rounded, exact) =
                (caches_of(KvType::F16, false), caches_of(KvType::F32, true), caches_of(KvType::F32, false));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for ops in &variants {
                let got = run(ops, &half);
                assert!(got.iter().all(|x| x.is_finite()), "hd {hd}: every output written");
                assert_eq!(bits(&got), bits(&run(ops, &rounded)), "hd {hd}, {ops:?}");
                assert_ne!(bits(&got), bits(&run(ops, &exact)), "hd {hd}: the f16 cache rounds");
            }
        }
    }
}

#[cfg(test)]
mod rope_tests {
    use super::*;

    /// The table-driven rotation gives the same bits as calling `sin_cos` for every head, as the forward
    /// pass did before the table (the loop below is that code).
    #[test]
    fn rope_from_the_table_is_bit_identical_to_per_head_sin_cos() {
        for (hd, theta) in [(64usize, 10_000.0f64), (128, 500_000.0), (16, 1_000_000.0)] {
            let inv_freq: Vec<f64> = (0..hd / 2).map(|i| theta.powf(-(2.0 * i as f64) / hd as f64)).collect();
            let pos: Vec<usize> = vec![0, 1, 2, 7, 100, 511, 4095, 131_071, 3, 3];
            let table = rope_table(&inv_freq, &pos);
            for (row, &p) in pos.iter().enumerate() {
                for head in 0..5 {
                    let v0: Vec<f32> =
                        (0..hd).map(|i| ((i * 7 + head * 13 + row) as f32 * 0.37).sin() * (1.0 + i as f32)).collect();
                    let mut want = v0.clone();
                    let pos = p as f64;
                    for (j, &f) in inv_freq.iter().enumerate() {
                        let (s, c) = (pos * f).sin_cos();
                        let (a, b) = (want[j], want[j + hd / 2]);
                        want[j] = (f64::from(a) * c - f64::from(b) * s) as f32;
                        want[j + hd / 2] = (f64::from(b) * c + f64::from(a) * s) as f32;
                    }
                    let mut got = v0;
                    apply_rope(&mut got, &table[row * hd / 2..(row + 1) * hd / 2]);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "hd {hd}, position {p}, head {head}");
                }
            }
        }
    }
}

/// One linear layer of the model: its name (also its artifact sections' prefix), its shape, and the
/// checkpoint tensors stacked, in order, to make its weights and bias.
#[derive(Clone, Debug)]
pub struct LinearSpec {
    /// `model.layers.{i}.self_attn.qkv`, …, `lm_head`.
    pub name: String,
    /// Output channels.
    pub n: usize,
    /// Input channels.
    pub k: usize,
    parts: Vec<(String, usize)>,
    bias: Option<Vec<(String, usize)>>,
}

impl LinearSpec {
    /// Everything of this layer that packing reads, for the artifact key: name, shape, and the tensors
    /// stacked for its weights and bias with their rows.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({"name": self.name, "n": self.n, "k": self.k, "parts": self.parts, "bias": self.bias})
    }

    /// The weights `[n][k]` as f32, from the checkpoint.
    pub fn weights(&self, ckpt: &Checkpoint) -> Result<Vec<f32>> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for (tensor, rows) in &self.parts {
            w.extend(ckpt.f32(tensor, &[*rows, self.k])?);
        }
        Ok(w)
    }

    /// The layer from a quantized checkpoint, when the checkpoint stores it quantized (`None`: it is
    /// stored unquantized, as a GPTQ head usually is). Fused parts must all be quantized or none, except in
    /// a GGUF, where a fused layer whose parts cannot be packed together as stored (a type with no layout
    /// of its own, Q6_K; float-zero 4-bit parts beside 8-bit ones, as llama-quantize's K-quant mixes make)
    /// is `None` too: read exactly as f32 and quantized at load, at 8 bits where a part has more than 4.
    pub fn quantized(&self, ckpt: &Checkpoint, format: Option<&QuantFormat>) -> Result<Option<StoredLinear>> {
        let Some(format) = format else { return Ok(None) };
        if matches!(format, QuantFormat::Gguf { .. }) && !self.gguf_packs_as_stored(ckpt) {
            return Ok(None);
        }
        let prefixes: Vec<&str> = self.parts.iter().map(|(t, _)| t.strip_suffix(".weight").unwrap_or(t)).collect();
        let stored = prefixes.iter().filter(|p| format.stores(ckpt, p)).count();
        if stored == 0 {
            return Ok(None);
        }
        if stored != prefixes.len() {
            return Err(Error::checkpoint(
                &self.name,
                "some of the fused layers are quantized in the checkpoint and some are not",
            ));
        }
        let parts = prefixes
            .iter()
            .zip(&self.parts)
            .map(|(p, (_, rows))| match format {
                QuantFormat::Gguf { .. } => read_gguf_linear(ckpt, p, *rows, self.k),
                _ => read_linear(ckpt, p, *rows, self.k, format).map(StoredLinear::Four),
            })
            .collect::<Result<Vec<_>>>()?;
        StoredLinear::stack(parts, &self.name).map(Some)
    }

    /// For a GGUF: whether every part is stored in a form the runtime packs as it is, and the parts fit
    /// one layout together: all 4-bit (Q4_0, Q4_1, Q4_K), or all 8-bit (Q5_0, Q8_0, which a symmetric Q4_0
    /// part joins exactly as `q − 8`). Read from the tensors' types without reading their data.
    pub fn gguf_packs_as_stored(&self, ckpt: &Checkpoint) -> bool {
        let Some(gguf) = ckpt.gguf() else { return false };
        let types: Option<Vec<GgmlType>> =
            self.parts.iter().map(|(t, _)| gguf.tensor(t).map(|t| t.ggml_type)).collect();
        let Some(types) = types else { return false };
        let bits: Option<Vec<u8>> = types.iter().map(|&t| gguf_stored_bits(t)).collect();
        match bits {
            None => false,
            Some(bits) if bits.iter().all(|&b| b == 4) => true,
            Some(_) => types.iter().all(|&t| gguf_stored_bits(t) == Some(8) || t == GgmlType::Q4_0),
        }
    }

    /// Whether this layer runs at 8 bits because of how the checkpoint stores it: a GGUF's Q5_0 and Q8_0
    /// parts (which a fused Q4_0 part joins), or a part with more than 4 bits and no layout of its own
    /// (Q6_K: dequantized and held at 8 bits, never 4), which a fused 4-bit part then follows; read from
    /// the tensors' types without reading their data.
    pub fn stored_in_eight_bits(&self, ckpt: &Checkpoint, format: Option<&QuantFormat>) -> bool {
        let (Some(QuantFormat::Gguf { .. }), Some(gguf)) = (format, ckpt.gguf()) else { return false };
        self.parts.iter().any(|(t, _)| {
            gguf.tensor(t).is_some_and(|t| gguf_stored_bits(t.ggml_type) == Some(8) || gguf_wide(t.ggml_type))
        })
    }

    /// The numerics this layer runs with on a model run by `numerics`: 8-bit numerics for a layer stored in
    /// 8 bits, the head's own for an unquantized head, else the model's.
    pub fn numerics(
        &self,
        ckpt: &Checkpoint,
        format: Option<&QuantFormat>,
        numerics: Numerics,
        is_head: bool,
    ) -> Numerics {
        if self.stored_in_eight_bits(ckpt, format) {
            numerics.for_eight_bit()
        } else if is_head && !format.is_some_and(|f| self.quantized_in(ckpt, f)) {
            numerics.for_unquantized_head()
        } else {
            numerics
        }
    }

    /// Whether the checkpoint stores every part of this layer quantized in `format` (for a GGUF: in forms
    /// packed together as stored, [`LinearSpec::gguf_packs_as_stored`]).
    pub fn quantized_in(&self, ckpt: &Checkpoint, format: &QuantFormat) -> bool {
        match format {
            QuantFormat::Gguf { .. } => self.gguf_packs_as_stored(ckpt),
            _ => self.parts.iter().all(|(t, _)| format.stores(ckpt, t.strip_suffix(".weight").unwrap_or(t))),
        }
    }

    /// The checkpoint tensors stacked for the weights, with their rows.
    pub fn parts(&self) -> &[(String, usize)] {
        &self.parts
    }

    /// The dtype of the first part's unquantized tensor, if stored so.
    pub fn dtype(&self, ckpt: &Checkpoint) -> Option<String> {
        ckpt.dtype(&self.parts.first()?.0)
    }

    /// The bias, if the architecture has one here.
    pub fn bias(&self, ckpt: &Checkpoint) -> Result<Option<Vec<f32>>> {
        let Some(parts) = &self.bias else { return Ok(None) };
        let mut b = Vec::with_capacity(self.n);
        for (tensor, rows) in parts {
            b.extend(ckpt.f32(tensor, &[*rows])?);
        }
        Ok(Some(b))
    }
}

/// Whether the head shares the embedding's weights.
fn head_is_tied(cfg: &ModelConfig, ckpt: &Checkpoint) -> bool {
    // A head stored in any form (plain, GPTQ/AWQ `qweight`, `cpu_int4` `weight_packed`) is its own.
    let stored = ["lm_head.weight", "lm_head.qweight", "lm_head.weight_packed"].iter().any(|t| ckpt.has(t));
    cfg.tie_word_embeddings || !stored
}

/// Every linear layer of the model, in a fixed order: per decoder layer qkv (fused), o_proj, gate_up
/// (fused), down; then the head.
pub fn linear_specs(cfg: &ModelConfig, ckpt: &Checkpoint) -> Vec<LinearSpec> {
    let (h, hd, nh, nkv, inter) =
        (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size);
    let spec = |name: String, n, k, parts: Vec<(String, usize)>, bias| LinearSpec { name, n, k, parts, bias };
    let mut out = Vec::with_capacity(4 * cfg.num_layers + 1);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}");
        let attn = |t: &str, suffix: &str, rows: usize| (format!("{p}.self_attn.{t}_proj.{suffix}"), rows);
        let qkv =
            |suffix: &str| vec![attn("q", suffix, nh * hd), attn("k", suffix, nkv * hd), attn("v", suffix, nkv * hd)];
        let qkv_bias = (cfg.arch == Architecture::Qwen2).then(|| qkv("bias"));
        out.push(spec(format!("{p}.self_attn.qkv"), (nh + 2 * nkv) * hd, h, qkv("weight"), qkv_bias));
        out.push(spec(format!("{p}.self_attn.o_proj"), h, nh * hd, vec![attn("o", "weight", h)], None));
        let mlp = |t: &str, rows: usize| (format!("{p}.mlp.{t}_proj.weight"), rows);
        out.push(spec(format!("{p}.mlp.gate_up"), 2 * inter, h, vec![mlp("gate", inter), mlp("up", inter)], None));
        out.push(spec(format!("{p}.mlp.down_proj"), h, inter, vec![mlp("down", h)], None));
    }
    let head = if head_is_tied(cfg, ckpt) { "model.embed_tokens.weight" } else { "lm_head.weight" };
    out.push(spec("lm_head".into(), cfg.vocab_size, h, vec![(head.into(), cfg.vocab_size)], None));
    out
}

impl Model {
    /// Packs every linear layer for `numerics` — the checkpoint's own codes where it is quantized
    /// (`format`), else quantized here — into the sections of the model's artifact.
    pub fn pack(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        numerics: Numerics,
        format: Option<&QuantFormat>,
        progress: Option<&(dyn Fn(usize, usize) + Send + Sync)>,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        let specs = linear_specs(cfg, ckpt);
        let head = specs.len() - 1;
        let done = std::sync::atomic::AtomicUsize::new(0);
        // Layers in parallel, each task holding one layer's f32 weights while it quantizes them.
        let packed: Vec<Vec<(String, Vec<u8>)>> = specs
            .par_iter()
            .enumerate()
            .map(|(i, spec)| {
                let numerics = spec.numerics(ckpt, format, numerics, i == head);
                let sections = match spec.quantized(ckpt, format)? {
                    Some(q) => Linear::pack_stored(&spec.name, q, numerics),
                    None => Linear::pack(&spec.name, spec.weights(ckpt)?, spec.n, spec.k, numerics),
                };
                if let Some(report) = progress {
                    report(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1, specs.len());
                }
                sections
            })
            .collect::<Result<_>>()?;
        Ok(packed.into_iter().flatten().collect())
    }

    /// What loading `format` on `numerics` does that the user should know: a layer the quantized checkpoint
    /// left unquantized (usually the head) is quantized at load rather than left in 16 bits.
    pub fn load_notes(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        numerics: Numerics,
        format: Option<&QuantFormat>,
    ) -> Vec<String> {
        let (Some(f), true) = (format, numerics.is_packed()) else { return Vec::new() };
        let specs = linear_specs(cfg, ckpt);
        let not_stored = |s: &LinearSpec| match f {
            QuantFormat::Gguf { .. } => !s.gguf_packs_as_stored(ckpt),
            _ => s.parts.iter().all(|(t, _)| !f.stores(ckpt, t.strip_suffix(".weight").unwrap_or(t))),
        };
        let (wide, plain): (Vec<&LinearSpec>, Vec<&LinearSpec>) =
            specs.iter().filter(|s| not_stored(s)).partition(|s| s.stored_in_eight_bits(ckpt, format));
        let plain: Vec<&str> = plain.iter().map(|s| s.name.as_str()).collect();
        let mut notes = Vec::new();
        if let [first, ..] = wide.as_slice() {
            let types: Vec<String> = first.parts.iter().filter_map(|(t, _)| ckpt.dtype(t)).collect();
            notes.push(format!(
                "{} linear layers ({}{}, stored as {}) have parts with more than 4 bits that cannot be packed as \
                 stored together: they are read exactly and held at 8 bits, quantized at load on llama.cpp's \
                 Q8_0 grid",
                wide.len(),
                first.name,
                if wide.len() > 1 { ", …" } else { "" },
                types.join(" + "),
            ));
        }
        let how = format!("quantized at load (round to nearest, group {})", f.group().to_checkpoint());
        let head_how = if numerics.for_unquantized_head().is_eight_bit() {
            "quantized at load to 8 bits (amax/127 per 32, llama.cpp's Q8_0 grid)".to_string()
        } else {
            how.clone()
        };
        notes.extend(match plain.as_slice() {
            [] => None,
            [one] if *one == "lm_head" => Some(format!("lm_head is not quantized in the checkpoint: it is {head_how}")),
            [one] => Some(format!("{one} is not quantized in the checkpoint: it is {how}")),
            many if many.len() == specs.len() => Some(format!(
                "none of the {} linear layers is quantized in the checkpoint, although its quantization_config says \
                 so: all are {how}",
                many.len()
            )),
            many => Some(format!(
                "{} linear layers ({}, …) are not quantized in the checkpoint: they are {how}",
                many.len(),
                many[..2].join(", ")
            )),
        });
        notes
    }

    /// Loads the checkpoint's weights into layers run by `numerics`. For packed numerics, `packed` gives
    /// the sections [`Model::pack`] made (from the artifact cache, read in place); without it each layer
    /// is packed here: from the checkpoint's own codes where `format` says it is quantized, else
    /// quantized on the spot. Dense numerics on a quantized checkpoint run its dequantized weights.
    pub fn load(
        cfg: ModelConfig,
        ckpt: &Checkpoint,
        numerics: Numerics,
        packed: Option<SectionSource>,
        format: Option<&QuantFormat>,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let linear = |spec: &LinearSpec, is_head: bool| -> Result<Linear> {
            let bias = spec.bias(ckpt)?;
            // A layer stored in 8 bits, or a head the checkpoint leaves unquantized (an 8-bit head), may
            // take its own numerics.
            let numerics = spec.numerics(ckpt, format, numerics, is_head);
            if let (Some(get), true) = (packed, numerics.is_packed()) {
                return Linear::from_sections(&spec.name, spec.n, spec.k, bias, numerics, get);
            }
            match spec.quantized(ckpt, format)? {
                Some(q) => Linear::build_stored(&spec.name, q, bias, numerics),
                None => Linear::build(&spec.name, spec.weights(ckpt)?, spec.n, spec.k, bias, numerics),
            }
        };
        let specs = linear_specs(&cfg, ckpt);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, s) in specs.chunks_exact(4).enumerate() {
            let p = format!("model.layers.{i}");
            let (q_norm, k_norm) = if cfg.arch == Architecture::Qwen3 {
                (
                    Some(ckpt.f32(&format!("{p}.self_attn.q_norm.weight"), &[cfg.head_dim])?),
                    Some(ckpt.f32(&format!("{p}.self_attn.k_norm.weight"), &[cfg.head_dim])?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                attn_norm: ckpt.f32(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv: linear(&s[0], false)?,
                q_norm,
                k_norm,
                o: linear(&s[1], false)?,
                mlp_norm: ckpt.f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up: linear(&s[2], false)?,
                down: linear(&s[3], false)?,
            });
        }
        let head = linear(specs.last().expect("the head is always listed"), true)?;
        // A tied packed head serves the embedding lookup from its own rows: no second copy of the table.
        let embed = if head_is_tied(&cfg, ckpt) && numerics.is_packed() {
            Embedding::FromHead
        } else {
            Embedding::Dense(ckpt.f32("model.embed_tokens.weight", &[cfg.vocab_size, h])?)
        };
        Ok(Model {
            norm: ckpt.f32("model.norm.weight", &[h])?,
            inv_freq: cfg.rope_inv_freq(),
            cfg,
            embed,
            layers,
            head,
            numerics,
            kv: KvType::F32,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// How the linears run.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// How the caches [`Model::kv_cache`] makes store keys and values (f32 unless set).
    pub fn kv_type(&self) -> KvType {
        self.kv
    }

    /// Makes the caches [`Model::kv_cache`] makes from now on store `kv` (the engine sets what the policy
    /// or the user chose).
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.kv = kv;
    }

    /// The bytes a KV cache of `positions` positions takes.
    pub fn kv_cache_bytes(&self, positions: usize) -> usize {
        let width = self.cfg.num_kv_heads * self.cfg.head_dim;
        [self.cfg.num_layers, positions, width, self.kv.bytes()].iter().fold(2usize, |acc, &x| acc.saturating_mul(x))
    }

    /// A KV cache for `context` positions (not the model's maximum): fails with a clear error before
    /// allocating if that would not fit in `max_bytes`.
    pub fn kv_cache(&self, context: usize, max_bytes: usize) -> Result<KvCache> {
        let width = self.cfg.num_kv_heads * self.cfg.head_dim;
        let need = 2usize
            .checked_mul(self.cfg.num_layers)
            .and_then(|x| x.checked_mul(context))
            .and_then(|x| x.checked_mul(width * self.kv.bytes()))
            .ok_or_else(|| Error::input("KV cache", "size overflows"))?;
        if need > max_bytes {
            return Err(Error::input(
                "KV cache",
                format!("{context} positions need {need} bytes, more than the {max_bytes} allowed"),
            ));
        }
        // The allocation below is lazy (zeroed pages), so a cache larger than memory would not fail here
        // but get the process killed once filled: refuse it while that is still a clear error.
        if let Some(available) = available_memory()
            && need > available
        {
            return Err(Error::input(
                "KV cache",
                format!(
                    "{context} positions need {need} bytes, more than the {available} bytes of memory available \
                     (choose a shorter context)"
                ),
            ));
        }
        Ok(KvCache::zeroed(self.cfg.num_layers, context, self.cfg.num_kv_heads, self.cfg.head_dim, self.kv))
    }

    /// The kernels each kind of layer runs in decode (M = 1) and prefill (M = `prefill_m`).
    pub fn kernels(&self, prefill_m: usize) -> Vec<LayerKernels> {
        let l = &self.layers[0];
        [("qkv", &l.qkv), ("o_proj", &l.o), ("gate_up", &l.gate_up), ("down", &l.down), ("lm_head", &self.head)]
            .into_iter()
            .map(|(name, lin)| LayerKernels {
                layer: name,
                decode: lin.kernel_for(1),
                prefill: lin.kernel_for(prefill_m),
            })
            .collect()
    }

    /// What every linear layer dispatched to in each phase, as the layers recorded it when they ran.
    pub fn dispatched(&self) -> Vec<Dispatched> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            for (name, lin) in [("qkv", &l.qkv), ("o_proj", &l.o), ("gate_up", &l.gate_up), ("down", &l.down)] {
                let (decode, prefill) = lin.dispatched();
                out.push(Dispatched { layer: format!("layers.{i}.{name}"), decode, prefill });
            }
        }
        let (decode, prefill) = self.head.dispatched();
        out.push(Dispatched { layer: "lm_head".into(), decode, prefill });
        out
    }

    /// Bytes of weights held by the linears and the embedding.
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.weight_bytes() + l.o.weight_bytes() + l.gate_up.weight_bytes() + l.down.weight_bytes())
            .sum();
        let embed = match &self.embed {
            Embedding::Dense(t) => t.len() * 4,
            Embedding::FromHead => 0,
        };
        layers + embed + self.head.weight_bytes()
    }

    /// Bytes of weights one decode step reads: every linear once (less prefill-only copies) and the head;
    /// the embedding lookup reads one row, which is not counted.
    pub fn decode_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.decode_bytes() + l.o.decode_bytes() + l.gate_up.decode_bytes() + l.down.decode_bytes())
            .sum();
        layers + self.head.decode_bytes()
    }

    fn embed_row(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let h = self.cfg.hidden_size;
        let t = token as usize;
        if t >= self.cfg.vocab_size {
            return Err(Error::input(
                "input",
                format!("token id {token} is outside the vocabulary ({})", self.cfg.vocab_size),
            ));
        }
        match &self.embed {
            Embedding::Dense(table) => out.copy_from_slice(&table[t * h..(t + 1) * h]),
            Embedding::FromHead => {
                self.head.decode_row(t, out).expect("FromHead is only built over a packed head")?;
            }
        }
        Ok(())
    }

    /// Runs `tokens` (positions `cache.len()..`) through the model, appending to the cache, and returns the
    /// logits of the last token (`all_logits`: of every token, `[tokens][vocab]`).
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, all_logits: bool) -> Result<Vec<f32>> {
        let seq = vec![0; tokens.len()];
        let rows: Vec<usize> =
            if all_logits { (0..tokens.len()).collect() } else { vec![tokens.len().saturating_sub(1)] };
        let groups = [RowGroup { start: 0, len: tokens.len(), decode: tokens.len() == 1 }];
        self.forward_rows(tokens, &seq, &mut [cache], &rows, &groups, None)
    }

    /// [`Model::forward`] with an observer that sees every linear layer's input and steers which decoder
    /// layers run (see [`ForwardObserver`]); returns the last row's logits, or nothing if it stopped early.
    #[doc(hidden)]
    pub fn forward_observed(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        observer: &mut (dyn ForwardObserver + Send),
    ) -> Result<Vec<f32>> {
        let seq = vec![0; tokens.len()];
        let rows = vec![tokens.len().saturating_sub(1)];
        let groups = [RowGroup { start: 0, len: tokens.len(), decode: tokens.len() == 1 }];
        self.forward_rows(tokens, &seq, &mut [cache], &rows, &groups, Some(observer))
    }

    /// Replaces the weights of linear `slot` of decoder layer `layer` (`num_layers` or any layer for
    /// [`LinearSlot::Head`]) with `w` (`[n][k]`, the fused layer's rows in the checkpoint's order), run by
    /// the model's numerics (GPTQ swaps in each layer's quantized weights as it goes).
    #[doc(hidden)]
    pub fn set_linear(&mut self, layer: usize, slot: LinearSlot, w: Vec<f32>, bias: Option<Vec<f32>>) -> Result<()> {
        let numerics = self.numerics;
        let target = match slot {
            LinearSlot::Head => &mut self.head,
            _ => {
                let l = self
                    .layers
                    .get_mut(layer)
                    .ok_or_else(|| Error::input("set_linear", format!("no decoder layer {layer}")))?;
                match slot {
                    LinearSlot::Qkv => &mut l.qkv,
                    LinearSlot::O => &mut l.o,
                    LinearSlot::GateUp => &mut l.gate_up,
                    _ => &mut l.down,
                }
            }
        };
        let (n, k) = (target.n(), target.k());
        if w.len() != n * k {
            return Err(Error::input("set_linear", format!("{} weights for a {n} x {k} layer", w.len())));
        }
        *target = Linear::build(&format!("{layer}.{slot:?}"), w, n, k, bias, numerics)?;
        Ok(())
    }

    /// One decode step for several sequences at once: `tokens[i]` continues the sequence in `caches[i]`.
    /// The linears run all sequences as one batch of rows (each weight byte read once for all of them);
    /// attention reads each sequence's own cache. Returns `[sequences][vocab]` logits. A row's result does
    /// not depend on the other rows while the batch stays below the prefill threshold.
    pub fn forward_batch(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Vec<f32>> {
        if tokens.len() != caches.len() {
            return Err(Error::input("batch", format!("{} tokens for {} sequences", tokens.len(), caches.len())));
        }
        let seq: Vec<usize> = (0..tokens.len()).collect();
        // One call per layer for every row: the weights are read once per step (at the prefill threshold
        // the prefill kernels run); `Model::step` is the call whose rows get the bits they get alone.
        let groups = [RowGroup { start: 0, len: tokens.len(), decode: false }];
        self.forward_rows(tokens, &seq, caches, &seq, &groups, None)
    }

    /// One step of several sequences: each entry's tokens continue its cache — one token to decode, or a
    /// chunk of its prompt — and the logits of each entry's last row come back, `[entries][vocab]` in
    /// entry order. Every row runs the kernels it would run alone: a one-token entry the decode kernels
    /// (decode rows share a call up to the rows the decode kernel takes), a chunk the kernels its own
    /// length picks, whatever else shares the step; so an entry's logits are those of
    /// [`Model::forward`] on its tokens alone, bit for bit.
    pub fn step(&self, entries: &mut [StepEntry<'_>]) -> Result<Vec<f32>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        if entries.iter().any(|e| e.tokens.is_empty()) {
            return Err(Error::input("step", "an entry with no tokens"));
        }
        // Decode rows first, together; then each chunk.
        let order: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].tokens.len() == 1)
            .chain((0..entries.len()).filter(|&i| entries[i].tokens.len() > 1))
            .collect();
        let (mut tokens, mut seq, mut groups, mut last) = (Vec::new(), Vec::new(), Vec::new(), vec![0; entries.len()]);
        let singles = entries.iter().filter(|e| e.tokens.len() == 1).count();
        if singles > 0 {
            groups.push(RowGroup { start: 0, len: singles, decode: true });
        }
        for (slot, &i) in order.iter().enumerate() {
            let t = entries[i].tokens;
            if t.len() > 1 {
                groups.push(RowGroup { start: tokens.len(), len: t.len(), decode: false });
            }
            tokens.extend_from_slice(t);
            seq.extend(std::iter::repeat_n(slot, t.len()));
            last[i] = tokens.len() - 1;
        }
        let mut caches: Vec<&mut KvCache> = Vec::with_capacity(entries.len());
        let mut by_slot: Vec<Option<&mut KvCache>> = entries.iter_mut().map(|e| Some(&mut *e.cache)).collect();
        for &i in &order {
            caches.push(by_slot[i].take().expect("each entry once"));
        }
        self.forward_rows(&tokens, &seq, &mut caches, &last, &groups, None)
    }

    /// Runs rows `tokens`, row `i` belonging to the sequence in `caches[seq[i]]` at that cache's next
    /// position (each sequence's rows consecutive and in order; an error otherwise), and returns the logits
    /// of the rows in `out_rows`.
    fn forward_rows(
        &self,
        tokens: &[u32],
        seq: &[usize],
        caches: &mut [&mut KvCache],
        out_rows: &[usize],
        groups: &[RowGroup],
        mut observer: Option<&mut (dyn ForwardObserver + Send)>,
    ) -> Result<Vec<f32>> {
        // The whole step runs on a pool worker: every layer's parallel loop then starts from inside the
        // pool (work-stealing, no sleep) instead of handing work from an outside thread and sleeping until
        // it is done, once per linear layer (about 200 times per token).
        if rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.forward_rows(tokens, seq, caches, out_rows, groups, observer));
        }
        let cfg = &self.cfg;
        let m = tokens.len();
        if m == 0 {
            return Err(Error::input("input", "no tokens to run"));
        }
        // Each row's position: its cache's length plus the rows of the same sequence before it.
        let mut next: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let mut pos = Vec::with_capacity(m);
        for &s in seq {
            pos.push(next[s]);
            next[s] += 1;
        }
        for (c, &end) in caches.iter().zip(&next) {
            let heads = c.heads();
            if c.k.len() != cfg.num_layers || (heads.count, heads.dim) != (cfg.num_kv_heads, cfg.head_dim) {
                return Err(Error::input("KV cache", "was made for another model"));
            }
            if end > c.capacity() {
                return Err(Error::input(
                    "context",
                    format!("{end} positions exceed the context of {} chosen for this session", c.capacity()),
                ));
            }
        }
        let (h, hd, nh, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads);
        let qkv_n = (nh + 2 * nkv) * hd;
        let inter = cfg.intermediate_size;
        // The products' inputs and outputs start on a cache line (`LineAlignedF32`'s docs say why).
        let buffer = LineAlignedF32::zeroed;
        let mut x = buffer(m * h);
        for (i, &t) in tokens.iter().enumerate() {
            self.embed_row(t, &mut x[i * h..(i + 1) * h])?;
        }
        let mut normed = buffer(m * h);
        let mut qkv = buffer(m * qkv_n);
        let mut attn = buffer(m * nh * hd);
        let mut proj = buffer(m * h);
        let mut gu = buffer(m * 2 * inter);
        let mut act = buffer(m * inter);
        let ops = VectorOps::new();
        let shape = AttnShape { hd, nh, nkv, qkv_n, scale: 1.0 / (hd as f32).sqrt() };
        // cos/sin of every row's position, once for all heads and layers.
        let rope = rope_table(&self.inv_freq, &pos);
        let half = self.inv_freq.len();
        // Each cache's rows: every sequence's rows are consecutive (every caller gives them so).
        let mut seq_rows: Vec<Range<usize>> = vec![0..0; caches.len()];
        for (i, &s) in seq.iter().enumerate() {
            let r = &mut seq_rows[s];
            *r = if r.start == r.end { i..i + 1 } else { r.start..i + 1 };
        }
        if seq_rows.iter().map(|r| r.len()).sum::<usize>() != m {
            return Err(Error::input("step", "a sequence's rows are not consecutive"));
        }
        for (li, layer) in self.layers.iter().enumerate() {
            if let Some(obs) = observer.as_deref_mut() {
                match obs.layer_start(li, &mut x) {
                    LayerFlow::Run => {}
                    LayerFlow::Skip => continue,
                    LayerFlow::Stop => return Ok(Vec::new()),
                }
            }
            // The layer's stored keys and values, last read a step ago and since pushed out of the caches by
            // every weight of the model, are requested now and arrive while the qkv product runs.
            for c in caches.iter() {
                c.prefetch_layer(li, KV_PREFETCH_BYTES / caches.len().max(1));
            }
            add_and_norm(&mut x, None, &layer.attn_norm, cfg.rms_norm_eps, &mut normed, h);
            observe(&mut observer, li, LinearSlot::Qkv, &normed, m);
            run_linear(&layer.qkv, &normed, groups, &mut qkv)?;
            // Each row's query and key heads normalised (where the model does) and rotated: rows are
            // independent, so several rows' run in parallel.
            let rotate = |tmp: &mut Vec<f32>, (i, row): (usize, &mut [f32])| {
                let cs = &rope[i * half..(i + 1) * half];
                for head in 0..nh + nkv {
                    let v = &mut row[head * hd..(head + 1) * hd];
                    let norm = if head < nh { &layer.q_norm } else { &layer.k_norm };
                    if let Some(w) = norm {
                        tmp.clear();
                        tmp.extend_from_slice(v);
                        ops.rms_norm(tmp, w, cfg.rms_norm_eps, v);
                    }
                    apply_rope(v, cs);
                }
            };
            if m >= PARALLEL_QK_ROWS {
                qkv.par_chunks_mut(qkv_n).enumerate().for_each_init(Vec::new, rotate);
            } else {
                let mut tmp = Vec::new();
                qkv.chunks_mut(qkv_n).enumerate().for_each(|row| rotate(&mut tmp, row));
            }
            // Then each row's keys and values into its sequence's cache: each sequence's rows in order,
            // sequences in parallel (each has a cache of its own).
            let store = |(cache, rows): (&mut KvCache, &Range<usize>)| {
                let (kw, heads) = (nkv * hd, cache.heads());
                for i in rows.clone() {
                    let row = &qkv[i * qkv_n..(i + 1) * qkv_n];
                    cache.k[li].write_position(&ops, heads, pos[i], &row[nh * hd..nh * hd + kw]);
                    cache.v[li].write_position(&ops, heads, pos[i], &row[nh * hd + kw..nh * hd + 2 * kw]);
                }
            };
            let writes = caches.iter_mut().map(|c| &mut **c).zip(&seq_rows);
            if seq_rows.len() > 1 && m >= PARALLEL_QK_ROWS {
                writes.collect::<Vec<_>>().into_par_iter().for_each(store);
            } else {
                writes.for_each(store);
            }
            let caches_now: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
            attention(&ops, shape, &qkv, seq, &pos, &caches_now, li, &mut attn);
            observe(&mut observer, li, LinearSlot::O, &attn, m);
            run_linear(&layer.o, &attn, groups, &mut proj)?;
            add_and_norm(&mut x, Some(&proj), &layer.mlp_norm, cfg.rms_norm_eps, &mut normed, h);
            observe(&mut observer, li, LinearSlot::GateUp, &normed, m);
            run_linear(&layer.gate_up, &normed, groups, &mut gu)?;
            // SiLU(gate)·up, rows in parallel for a long prompt.
            let silu = |(a, gu): (&mut [f32], &[f32])| {
                let (g, u) = gu.split_at(inter);
                ops.silu_mul(g, u, a);
            };
            if m >= PARALLEL_ROW_OPS {
                act.par_chunks_mut(inter).zip(gu.par_chunks(2 * inter)).for_each(silu);
            } else {
                act.chunks_mut(inter).zip(gu.chunks(2 * inter)).for_each(silu);
            }
            observe(&mut observer, li, LinearSlot::Down, &act, m);
            run_linear(&layer.down, &act, groups, &mut proj)?;
            add_rows(&mut x, &proj, h);
        }
        if let Some(obs) = observer {
            if obs.layer_start(cfg.num_layers, &mut x) != LayerFlow::Run {
                return Ok(Vec::new());
            }
            let mut all = vec![0.0f32; m * h];
            for i in 0..m {
                rms_norm(&x[i * h..(i + 1) * h], &self.norm, cfg.rms_norm_eps, &mut all[i * h..(i + 1) * h]);
            }
            obs.linear_input(cfg.num_layers, LinearSlot::Head, &all, m);
        }
        for (&t, &s) in tokens.iter().zip(seq) {
            caches[s].ids.push(t);
        }
        for (c, end) in caches.iter_mut().zip(next) {
            c.len = end;
        }
        let rows = out_rows;
        let mut hn = buffer(rows.len() * h);
        for (j, &i) in rows.iter().enumerate() {
            rms_norm(&x[i * h..(i + 1) * h], &self.norm, cfg.rms_norm_eps, &mut hn[j * h..(j + 1) * h]);
        }
        let mut logits = vec![0.0f32; rows.len() * cfg.vocab_size];
        // The head's rows: every row of a prompt (for evaluation) in one call, as the prompt's own layers
        // ran; otherwise one row per sequence, each as its sequence's last row alone would run.
        let decode = groups.iter().all(|g| g.decode) || rows.len() < m;
        run_linear(&self.head, &hn, &[RowGroup { start: 0, len: rows.len(), decode }], &mut logits)?;
        Ok(logits)
    }
}
