//! The Llama-family forward pass: RMSNorm, RoPE, grouped-query attention over a KV cache, SwiGLU MLP.
//!
//! q/k/v are fused into one matrix and gate/up into another, so each layer runs four linears. Activations
//! are f32 throughout; the linears run on whatever kernel [`Numerics`] selects. The embedding is tied to
//! the head when the checkpoint says so; on the 4-bit path the embedding lookup reads rows straight from
//! the head's packed layout, so no second copy of the table exists.

use int4_kernels::KernelId;
use rayon::prelude::*;

use crate::config::{Architecture, ModelConfig};
use crate::error::{Error, Result};
use crate::linear::{Linear, Numerics, SectionSource};
use crate::quantized::{QuantFormat, QuantLinear, read_linear};
use crate::weights::Checkpoint;

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

/// A loaded model.
pub struct Model {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    head: Linear,
    inv_freq: Vec<f64>,
    numerics: Numerics,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.cfg).field("numerics", &self.numerics).finish_non_exhaustive()
    }
}

/// Keys and values of every layer for the positions seen so far, sized for a context chosen up front.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    width: usize,
}

impl KvCache {
    /// Positions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every position (the allocation is kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        2 * self.k.len() * self.capacity * self.width * 4
    }
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * r * g;
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
    /// The weights `[n][k]` as f32, from the checkpoint.
    pub fn weights(&self, ckpt: &Checkpoint) -> Result<Vec<f32>> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for (tensor, rows) in &self.parts {
            w.extend(ckpt.f32(tensor, &[*rows, self.k])?);
        }
        Ok(w)
    }

    /// The layer from a quantized checkpoint, when the checkpoint stores it quantized (`None`: it is
    /// stored unquantized, as a GPTQ head usually is). Fused parts must all be quantized or none.
    pub fn quantized(&self, ckpt: &Checkpoint, format: Option<&QuantFormat>) -> Result<Option<QuantLinear>> {
        let Some(format) = format else { return Ok(None) };
        let prefixes: Vec<&str> = self.parts.iter().map(|(t, _)| t.strip_suffix(".weight").unwrap_or(t)).collect();
        let stored = prefixes.iter().filter(|p| format.stores(ckpt, p)).count();
        if stored == 0 {
            return Ok(None);
        }
        if stored != prefixes.len() {
            return Err(Error::new(
                &self.name,
                "some of the fused layers are quantized in the checkpoint and some are not",
            ));
        }
        let parts = prefixes
            .iter()
            .zip(&self.parts)
            .map(|(p, (_, rows))| read_linear(ckpt, p, *rows, self.k, format))
            .collect::<Result<Vec<_>>>()?;
        QuantLinear::stack(parts, &self.name).map(Some)
    }

    /// Whether the checkpoint stores every part of this layer quantized in `format`.
    pub fn quantized_in(&self, ckpt: &Checkpoint, format: &QuantFormat) -> bool {
        self.parts.iter().all(|(t, _)| format.stores(ckpt, t.strip_suffix(".weight").unwrap_or(t)))
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
        let done = std::sync::atomic::AtomicUsize::new(0);
        // Layers in parallel, each task holding one layer's f32 weights while it quantizes them.
        let packed: Vec<Vec<(String, Vec<u8>)>> = specs
            .par_iter()
            .map(|spec| {
                let sections = match spec.quantized(ckpt, format)? {
                    Some(q) => Linear::pack_codes(&spec.name, q, numerics),
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
        let plain: Vec<&str> = specs
            .iter()
            .filter(|s| s.parts.iter().all(|(t, _)| !f.stores(ckpt, t.strip_suffix(".weight").unwrap_or(t))))
            .map(|s| s.name.as_str())
            .collect();
        let how = format!("quantized at load (round to nearest, group {})", f.group().to_checkpoint());
        match plain.as_slice() {
            [] => Vec::new(),
            [one] => vec![format!("{one} is not quantized in the checkpoint: it is {how}")],
            many if many.len() == specs.len() => vec![format!(
                "none of the {} linear layers is quantized in the checkpoint, although its quantization_config says \
                 so: all are {how}",
                many.len()
            )],
            many => vec![format!(
                "{} linear layers ({}, …) are not quantized in the checkpoint: they are {how}",
                many.len(),
                many[..2].join(", ")
            )],
        }
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
        let linear = |spec: &LinearSpec| -> Result<Linear> {
            let bias = spec.bias(ckpt)?;
            if let (Some(get), true) = (packed, numerics.is_packed()) {
                return Linear::from_sections(&spec.name, spec.n, spec.k, bias, numerics, get);
            }
            match spec.quantized(ckpt, format)? {
                Some(q) => Linear::build_quantized(&spec.name, q, bias, numerics),
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
                qkv: linear(&s[0])?,
                q_norm,
                k_norm,
                o: linear(&s[1])?,
                mlp_norm: ckpt.f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up: linear(&s[2])?,
                down: linear(&s[3])?,
            });
        }
        let head = linear(specs.last().expect("the head is always listed"))?;
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

    /// A KV cache for `context` positions (not the model's maximum): fails with a clear error before
    /// allocating if that would not fit in `max_bytes`.
    pub fn kv_cache(&self, context: usize, max_bytes: usize) -> Result<KvCache> {
        let width = self.cfg.num_kv_heads * self.cfg.head_dim;
        let need = 2usize
            .checked_mul(self.cfg.num_layers)
            .and_then(|x| x.checked_mul(context))
            .and_then(|x| x.checked_mul(width * 4))
            .ok_or_else(|| Error::new("KV cache", "size overflows"))?;
        if need > max_bytes {
            return Err(Error::new(
                "KV cache",
                format!("{context} positions need {need} bytes, more than the {max_bytes} allowed"),
            ));
        }
        Ok(KvCache {
            k: (0..self.cfg.num_layers).map(|_| vec![0.0; context * width]).collect(),
            v: (0..self.cfg.num_layers).map(|_| vec![0.0; context * width]).collect(),
            len: 0,
            capacity: context,
            width,
        })
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

    fn embed_row(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let h = self.cfg.hidden_size;
        let t = token as usize;
        if t >= self.cfg.vocab_size {
            return Err(Error::new(
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
        self.forward_rows(tokens, &seq, &mut [cache], &rows)
    }

    /// One decode step for several sequences at once: `tokens[i]` continues the sequence in `caches[i]`.
    /// The linears run all sequences as one batch of rows (each weight byte read once for all of them);
    /// attention reads each sequence's own cache. Returns `[sequences][vocab]` logits. A row's result does
    /// not depend on the other rows while the batch stays below the prefill threshold.
    pub fn forward_batch(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Vec<f32>> {
        if tokens.len() != caches.len() {
            return Err(Error::new("batch", format!("{} tokens for {} sequences", tokens.len(), caches.len())));
        }
        let seq: Vec<usize> = (0..tokens.len()).collect();
        self.forward_rows(tokens, &seq, caches, &seq)
    }

    /// Runs rows `tokens`, row `i` belonging to the sequence in `caches[seq[i]]` at that cache's next
    /// position (rows of one sequence in order), and returns the logits of the rows in `out_rows`.
    fn forward_rows(
        &self,
        tokens: &[u32],
        seq: &[usize],
        caches: &mut [&mut KvCache],
        out_rows: &[usize],
    ) -> Result<Vec<f32>> {
        // The whole step runs on a pool worker: every layer's parallel loop then starts from inside the
        // pool (work-stealing, no sleep) instead of handing work from an outside thread and sleeping until
        // it is done, once per linear layer (about 200 times per token).
        if rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.forward_rows(tokens, seq, caches, out_rows));
        }
        let cfg = &self.cfg;
        let m = tokens.len();
        if m == 0 {
            return Err(Error::new("input", "no tokens to run"));
        }
        // Each row's position: its cache's length plus the rows of the same sequence before it.
        let mut next: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let mut pos = Vec::with_capacity(m);
        for &s in seq {
            pos.push(next[s]);
            next[s] += 1;
        }
        let width = cfg.num_kv_heads * cfg.head_dim;
        for (c, &end) in caches.iter().zip(&next) {
            if c.k.len() != cfg.num_layers || c.width != width {
                return Err(Error::new("KV cache", "was made for another model"));
            }
            if end > c.capacity {
                return Err(Error::new(
                    "context",
                    format!("{end} positions exceed the context of {} chosen for this session", c.capacity),
                ));
            }
        }
        let (h, hd, nh, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads);
        let qkv_n = (nh + 2 * nkv) * hd;
        let inter = cfg.intermediate_size;
        let mut x = vec![0.0f32; m * h];
        for (i, &t) in tokens.iter().enumerate() {
            self.embed_row(t, &mut x[i * h..(i + 1) * h])?;
        }
        let mut normed = vec![0.0f32; m * h];
        let mut qkv = vec![0.0f32; m * qkv_n];
        let mut attn = vec![0.0f32; m * nh * hd];
        let mut proj = vec![0.0f32; m * h];
        let mut gu = vec![0.0f32; m * 2 * inter];
        let mut act = vec![0.0f32; m * inter];
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / nkv;
        for (li, layer) in self.layers.iter().enumerate() {
            for i in 0..m {
                rms_norm(&x[i * h..(i + 1) * h], &layer.attn_norm, cfg.rms_norm_eps, &mut normed[i * h..(i + 1) * h]);
            }
            layer.qkv.forward(&normed, m, &mut qkv)?;
            for i in 0..m {
                let row = &mut qkv[i * qkv_n..(i + 1) * qkv_n];
                let (cache, p) = (&mut *caches[seq[i]], pos[i]);
                let pos = p as f64;
                for head in 0..nh + nkv {
                    let v = &mut row[head * hd..(head + 1) * hd];
                    let norm = if head < nh { &layer.q_norm } else { &layer.k_norm };
                    if let Some(w) = norm {
                        let tmp = v.to_vec();
                        rms_norm(&tmp, w, cfg.rms_norm_eps, v);
                    }
                    // Rotate pairs (j, j + hd/2), as Hugging Face's `rotate_half` does.
                    for (j, &f) in self.inv_freq.iter().enumerate() {
                        let (s, c) = (pos * f).sin_cos();
                        let (a, b) = (v[j], v[j + hd / 2]);
                        v[j] = (f64::from(a) * c - f64::from(b) * s) as f32;
                        v[j + hd / 2] = (f64::from(b) * c + f64::from(a) * s) as f32;
                    }
                }
                let kw = nkv * hd;
                cache.k[li][p * kw..(p + 1) * kw].copy_from_slice(&row[nh * hd..nh * hd + kw]);
                cache.v[li][p * kw..(p + 1) * kw].copy_from_slice(&row[nh * hd + kw..nh * hd + 2 * kw]);
            }
            let caches_now: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
            let kw = nkv * hd;
            let ops = int4_kernels::vector::VectorOps::new();
            // Heads in parallel; each computes every query row of the chunk for its head.
            let per_head: Vec<Vec<f32>> = (0..nh)
                .into_par_iter()
                .map(|head| {
                    let kvh = head / group;
                    let mut out = vec![0.0f32; m * hd];
                    let mut scores = vec![0.0f32; pos.iter().max().map_or(0, |p| p + 1)];
                    for i in 0..m {
                        let q = &qkv[i * qkv_n + head * hd..i * qkv_n + (head + 1) * hd];
                        let (kc, vc) = (&caches_now[seq[i]].k[li], &caches_now[seq[i]].v[li]);
                        let upto = pos[i] + 1;
                        let mut max = f32::NEG_INFINITY;
                        for (p, s) in scores[..upto].iter_mut().enumerate() {
                            let k = &kc[p * kw + kvh * hd..p * kw + (kvh + 1) * hd];
                            *s = ops.dot(q, k) * scale;
                            max = max.max(*s);
                        }
                        let mut sum = 0.0f32;
                        for s in &mut scores[..upto] {
                            *s = (*s - max).exp();
                            sum += *s;
                        }
                        let o = &mut out[i * hd..(i + 1) * hd];
                        for (p, &s) in scores[..upto].iter().enumerate() {
                            let v = &vc[p * kw + kvh * hd..p * kw + (kvh + 1) * hd];
                            ops.axpy(s / sum, v, o);
                        }
                    }
                    out
                })
                .collect();
            for (head, o) in per_head.iter().enumerate() {
                for i in 0..m {
                    attn[i * nh * hd + head * hd..i * nh * hd + (head + 1) * hd]
                        .copy_from_slice(&o[i * hd..(i + 1) * hd]);
                }
            }
            layer.o.forward(&attn, m, &mut proj)?;
            for (a, b) in x.iter_mut().zip(&proj) {
                *a += b;
            }
            for i in 0..m {
                rms_norm(&x[i * h..(i + 1) * h], &layer.mlp_norm, cfg.rms_norm_eps, &mut normed[i * h..(i + 1) * h]);
            }
            layer.gate_up.forward(&normed, m, &mut gu)?;
            for i in 0..m {
                let (g, u) = gu[i * 2 * inter..(i + 1) * 2 * inter].split_at(inter);
                for ((a, &gv), &uv) in act[i * inter..(i + 1) * inter].iter_mut().zip(g).zip(u) {
                    *a = gv / (1.0 + (-gv).exp()) * uv;
                }
            }
            layer.down.forward(&act, m, &mut proj)?;
            for (a, b) in x.iter_mut().zip(&proj) {
                *a += b;
            }
        }
        for (c, end) in caches.iter_mut().zip(next) {
            c.len = end;
        }
        let rows = out_rows;
        let mut hn = vec![0.0f32; rows.len() * h];
        for (j, &i) in rows.iter().enumerate() {
            rms_norm(&x[i * h..(i + 1) * h], &self.norm, cfg.rms_norm_eps, &mut hn[j * h..(j + 1) * h]);
        }
        let mut logits = vec![0.0f32; rows.len() * cfg.vocab_size];
        self.head.forward(&hn, rows.len(), &mut logits)?;
        Ok(logits)
    }
}
