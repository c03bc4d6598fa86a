//! Tiny Llama GGUF files written by a test: the runtime's GGUF intake is tested on files whose every value
//! the test knows.
//!
//! [`tiny_llama`] writes a two-layer Llama (hidden 64, four heads over two key/value heads, feed-forward
//! 128) with a byte-level GPT-2 tokenizer (three control tokens, the 256 byte characters, two merges) and a chat
//! template, each tensor in the ggml type the caller picks. Weights are drawn at random, quantized here
//! with llama.cpp's rules (Q4_0 `d = max/−8`, Q4_1 `d = (max − min)/15`, `m = min`, Q5_0 `d = max/−16`,
//! Q8_0 `d = amax/127`; scales rounded to f16 first), and the values a reader must find — each tensor
//! dequantized as ggml does, in Hugging Face row order — are returned beside the file. `q_proj`/`k_proj`
//! rows are written permuted as `convert_hf_to_gguf.py` writes them.

use std::path::{Path, PathBuf};

use crate::Rng;

/// ggml type ids used here.
pub mod ty {
    /// `F32`.
    pub const F32: u32 = 0;
    /// `F16`.
    pub const F16: u32 = 1;
    /// `Q4_0`.
    pub const Q4_0: u32 = 2;
    /// `Q4_1`.
    pub const Q4_1: u32 = 3;
    /// `Q5_0`.
    pub const Q5_0: u32 = 6;
    /// `Q8_0`.
    pub const Q8_0: u32 = 8;
    /// `BF16`.
    pub const BF16: u32 = 30;
}

/// A metadata value.
#[derive(Clone, Debug)]
pub enum Value {
    /// `uint32`.
    U32(u32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string`.
    Str(String),
    /// An array of strings.
    Strs(Vec<String>),
    /// An array of `int32`.
    I32s(Vec<i32>),
}

/// A GGUF (version 3, alignment 32) under construction.
#[derive(Clone, Debug, Default)]
pub struct Writer {
    kvs: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    /// Adds a metadata key.
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    /// Adds a tensor: GGUF dims (fastest first), ggml type id, encoded data.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ggml_type, data));
        self
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        const ALIGN: u64 = 32;
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            match v {
                Value::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Value::F32(x) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Value::Bool(x) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(u8::from(*x));
                }
                Value::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Value::Strs(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for s in items {
                        put_str(&mut out, s);
                    }
                }
                Value::I32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for x in items {
                        out.extend(x.to_le_bytes());
                    }
                }
            }
        }
        let mut offset = 0u64;
        for (name, dims, ggml_type, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ggml_type.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + data.len() as u64).div_ceil(ALIGN) * ALIGN;
        }
        for (_, _, _, data) in &self.tensors {
            out.resize((out.len() as u64).div_ceil(ALIGN) as usize * ALIGN as usize, 0);
            out.extend(data);
        }
        out
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }
}

fn f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// `values` (a multiple of 32) encoded as `ggml_type` with llama.cpp's rules, and what ggml dequantizes the
/// encoding to.
pub fn encode(values: &[f32], ggml_type: u32) -> (Vec<u8>, Vec<f32>) {
    let mut data = Vec::new();
    let mut deq = Vec::with_capacity(values.len());
    match ggml_type {
        ty::F32 => {
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            deq.extend_from_slice(values);
        }
        ty::F16 => {
            data.extend(values.iter().flat_map(|&v| f16_bytes(v)));
            deq.extend(values.iter().map(|&v| f16(v)));
        }
        ty::BF16 => {
            data.extend(values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()));
            deq.extend(values.iter().map(|&v| half::bf16::from_f32(v).to_f32()));
        }
        _ => {
            for b in values.chunks_exact(32) {
                let amax_signed = b.iter().fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                match ggml_type {
                    ty::Q4_0 | ty::Q5_0 => {
                        let (levels, mid) = if ggml_type == ty::Q4_0 { (-8.0, 8i32) } else { (-16.0, 16) };
                        let d = f16(amax_signed / levels);
                        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                        let q: Vec<i32> =
                            b.iter().map(|&v| ((v * inv + mid as f32 + 0.5) as i32).clamp(0, 2 * mid - 1)).collect();
                        data.extend(f16_bytes(d));
                        if ggml_type == ty::Q5_0 {
                            let qh: u32 = (0..32).map(|j| ((q[j] as u32 >> 4) & 1) << j).sum();
                            data.extend(qh.to_le_bytes());
                        }
                        data.extend((0..16).map(|j| (q[j] & 15) as u8 | (((q[j + 16] & 15) as u8) << 4)));
                        deq.extend(q.iter().map(|&q| (q - mid) as f32 * d));
                    }
                    ty::Q4_1 => {
                        let min = b.iter().fold(f32::INFINITY, |a, &v| a.min(v));
                        let max = b.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                        let (d, m) = (f16((max - min) / 15.0), f16(min));
                        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                        let q: Vec<u8> = b.iter().map(|&v| (((v - m) * inv + 0.5) as i32).clamp(0, 15) as u8).collect();
                        data.extend(f16_bytes(d));
                        data.extend(f16_bytes(m));
                        data.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
                        deq.extend(q.iter().map(|&q| f32::from(q) * d + m));
                    }
                    ty::Q8_0 => {
                        let d = f16(amax_signed.abs() / 127.0);
                        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                        let q: Vec<i8> = b.iter().map(|&v| (v * inv).round().clamp(-128.0, 127.0) as i8).collect();
                        data.extend(f16_bytes(d));
                        data.extend(q.iter().map(|&q| q as u8));
                        deq.extend(q.iter().map(|&q| f32::from(q) * d));
                    }
                    other => panic!("ggml type {other} is not written by this test writer"),
                }
            }
        }
    }
    (data, deq)
}

/// The tiny model's shape.
pub const HIDDEN: u64 = 64;
/// Attention heads.
pub const HEADS: u64 = 4;
/// Key/value heads.
pub const KV_HEADS: u64 = 2;
/// Head dimension.
pub const HEAD_DIM: u64 = 16;
/// Feed-forward width.
pub const FF: u64 = 128;
/// Decoder layers.
pub const LAYERS: u64 = 2;

/// GPT-2's byte → printable-character map.
pub fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> =
        ('!' as u32..='~' as u32).chain('¡' as u32..='¬' as u32).chain('®' as u32..='ÿ' as u32).collect();
    let mut map = vec!['\0'; 256];
    for &b in &printable {
        map[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            map[b as usize] = char::from_u32(256 + n).unwrap();
            n += 1;
        }
    }
    map
}

/// A tiny Llama GGUF on disk and what its tensors hold.
#[derive(Debug)]
pub struct TinyGguf {
    /// The file.
    pub path: PathBuf,
    /// Hugging Face name → (Hugging Face shape, values as ggml dequantizes them, in Hugging Face row order).
    pub expected: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl TinyGguf {
    /// The expected values of the tensor with Hugging Face name `hf_name`.
    pub fn values(&self, hf_name: &str) -> &[f32] {
        &self.expected.iter().find(|(n, _, _)| n == hf_name).unwrap().2
    }
}

/// Writes a tiny Llama GGUF as `dir/name`, each tensor in the type `type_of(hf_name)` gives (norms are
/// always F32); `tied`: no `output.weight`.
pub fn tiny_llama(dir: &Path, name: &str, tied: bool, type_of: impl Fn(&str) -> u32) -> TinyGguf {
    let mut w = Writer::default();
    let s = |x: &str| Value::Str(x.into());
    w.kv("general.architecture", s("llama"));
    w.kv("llama.embedding_length", Value::U32(HIDDEN as u32));
    w.kv("llama.feed_forward_length", Value::U32(FF as u32));
    w.kv("llama.block_count", Value::U32(LAYERS as u32));
    w.kv("llama.attention.head_count", Value::U32(HEADS as u32));
    w.kv("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32));
    w.kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.kv("llama.rope.freq_base", Value::F32(10000.0));
    w.kv("llama.context_length", Value::U32(512));
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut tokens: Vec<String> = specials.iter().map(|t| t.to_string()).collect();
    tokens.extend(byte_chars().iter().map(|c| c.to_string()));
    tokens.extend(["Ġt".to_string(), "he".to_string()]);
    let mut types = vec![3; specials.len()];
    types.resize(tokens.len(), 1);
    let vocab = tokens.len() as u64;
    w.kv("tokenizer.ggml.model", s("gpt2"));
    w.kv("tokenizer.ggml.pre", s("smollm"));
    w.kv("tokenizer.ggml.tokens", Value::Strs(tokens));
    w.kv("tokenizer.ggml.token_type", Value::I32s(types));
    w.kv("tokenizer.ggml.merges", Value::Strs(vec!["Ġ t".into(), "h e".into()]));
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.kv(
        "tokenizer.chat_template",
        s("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
           {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    );

    let mut rng = Rng(0x5eed_0000_0000_0001 ^ name.len() as u64);
    let mut expected = Vec::new();
    let mut add = |w: &mut Writer, gguf: &str, hf: &str, dims: &[u64], scale: f32, offset: f32, heads: Option<u64>| {
        let n = dims.iter().product::<u64>() as usize;
        let values: Vec<f32> = (0..n).map(|_| offset + scale * rng.normal()).collect();
        let t = if dims.len() == 1 { ty::F32 } else { type_of(hf) };
        let (mut data, deq) = encode(&values, t);
        if let Some(heads) = heads {
            // GGUF row h·hd + 2i + t holds Hugging Face row h·hd + t·hd/2 + i: permute whole rows of blocks.
            let (rows, row_bytes) = (dims[1] as usize, data.len() / dims[1] as usize);
            let hd = rows / heads as usize;
            let mut permuted = vec![0u8; data.len()];
            for h in 0..heads as usize {
                for t in 0..2 {
                    for i in 0..hd / 2 {
                        let (hf_row, gguf_row) = (h * hd + t * hd / 2 + i, h * hd + 2 * i + t);
                        permuted[gguf_row * row_bytes..][..row_bytes]
                            .copy_from_slice(&data[hf_row * row_bytes..][..row_bytes]);
                    }
                }
            }
            data = permuted;
        }
        w.tensor(gguf, dims, t, data);
        expected.push((hf.to_string(), dims.iter().rev().map(|&d| d as usize).collect(), deq));
    };
    let (h, q_out, kv_out) = (HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    add(&mut w, "token_embd.weight", "model.embed_tokens.weight", &[h, vocab], 0.5, 0.0, None);
    for i in 0..LAYERS {
        let b = |p: &str| format!("blk.{i}.{p}.weight");
        let l = |p: &str| format!("model.layers.{i}.{p}.weight");
        add(&mut w, &b("attn_norm"), &l("input_layernorm"), &[h], 0.1, 1.0, None);
        add(&mut w, &b("attn_q"), &l("self_attn.q_proj"), &[h, q_out], 0.15, 0.0, Some(HEADS));
        add(&mut w, &b("attn_k"), &l("self_attn.k_proj"), &[h, kv_out], 0.15, 0.0, Some(KV_HEADS));
        add(&mut w, &b("attn_v"), &l("self_attn.v_proj"), &[h, kv_out], 0.15, 0.0, None);
        add(&mut w, &b("attn_output"), &l("self_attn.o_proj"), &[q_out, h], 0.15, 0.0, None);
        add(&mut w, &b("ffn_gate"), &l("mlp.gate_proj"), &[h, FF], 0.15, 0.0, None);
        add(&mut w, &b("ffn_up"), &l("mlp.up_proj"), &[h, FF], 0.15, 0.0, None);
        add(&mut w, &b("ffn_down"), &l("mlp.down_proj"), &[FF, h], 0.1, 0.0, None);
        add(&mut w, &b("ffn_norm"), &l("post_attention_layernorm"), &[h], 0.1, 1.0, None);
    }
    add(&mut w, "output_norm.weight", "model.norm.weight", &[h], 0.1, 1.0, None);
    if !tied {
        add(&mut w, "output.weight", "lm_head.weight", &[h, vocab], 0.5, 0.0, None);
    }
    let path = dir.join(name);
    w.write(&path);
    TinyGguf { path, expected }
}
