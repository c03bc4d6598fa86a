//! Reading the linear layers of a quantized checkpoint (`cpu_int4`, GPTQ, AWQ) into codes and parameters.
//!
//! Every format becomes the same pair the rest of the runtime packs: codes `[N][K]` in `0..16` and
//! parameters `[N][G]` for `w = (q − 8)·s + z`. Integer zero points `z_int` become float zeros
//! `s·(8 − z_int)`, which with f16 or bf16 scales reproduces `(q − z_int)·s` exactly. GPTQ's act-order
//! (`desc_act`, a `g_idx` that is not `k / g`) is undone by permuting K so groups are contiguous; the layer
//! then permutes its activations the same way at run time.
//!
//! On-disk tensors per linear `<p>` (the weight's name without `.weight`):
//!
//! | method | tensors |
//! |---|---|
//! | `cpu_int4` | `<p>.weight_packed` u8 `[N][K/2]` (low nibble = even k), `<p>.weight_scale` and `<p>.weight_zero` `[N][G]` |
//! | `gptq` | `<p>.qweight` i32 `[K/8][N]`, `<p>.qzeros` i32 `[G][N/8]` (v1: zero − 1), `<p>.scales` `[G][N]`, `<p>.g_idx` i32 `[K]` (optional) |
//! | `awq` | `<p>.qweight` i32 `[K][N/8]` and `<p>.qzeros` i32 `[G][N/8]`, AWQ's nibble order, `<p>.scales` `[G][N]` |
//! | `gguf` | `<p>.weight` as the GGUF stores it: Q4_0, Q4_1 (4-bit, group 32), Q5_0, Q8_0 (8-bit codes, group 32) |
//!
//! A GGUF's types map without rounding anything: Q4_0 (`d·(q − 8)`) is `s = d`, `z = 0` with symmetric
//! integer zeros; Q4_1 (`d·q + m`) is `s = d`, `z = m + 8d` (one f32 addition: exact unless `m` and `8d`
//! are more than 24 binary orders apart, where `z` is within ½ ulp — [`Int8Codes`] counts nothing of that,
//! [`read_gguf_linear`] reports it); Q5_0 and Q8_0 become [`Int8Codes`]: codes `q − 16` and `q` with scale
//! `d`, run by the W8A16 kernels (or as two 4-bit planes on the W4A8 path).

use int4_cache::quant_config::NormalizedConfig;
use int4_gguf::GgmlType;
use int4_layout::convert::params_from_integer_zeros;
use int4_layout::gptq::{self, ZeroFormat};
use int4_layout::{Codes, GroupParams, GroupSize, rowmajor};
use int4_select::policy::CheckpointKind;
use serde_json::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::weights::Checkpoint;

/// A quantized checkpoint's format, from its normalised `quantization_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantFormat {
    /// `cpu_int4`: row-major nibbles with float scales and zeros.
    CpuInt4 {
        /// Group size.
        group: GroupSize,
    },
    /// GPTQ.
    Gptq {
        /// Group size.
        group: GroupSize,
        /// Symmetric (zero point 8 everywhere).
        sym: bool,
        /// `checkpoint_format`: `gptq` (v1, zero − 1 stored) or `gptq_v2`.
        zeros: ZeroFormat,
        /// Whether the head is quantized too.
        lm_head: bool,
    },
    /// AWQ (GEMM packing).
    Awq {
        /// Group size.
        group: GroupSize,
        /// Integer zero points stored (`zero_point: true`), else symmetric.
        zero_point: bool,
    },
    /// A GGUF's block-quantized tensors (group 32).
    Gguf {
        /// How the policy sees it: quantized at load (`Bf16`) when a decoder layer is stored unquantized,
        /// `EightBit` when every one is stored in more than 4 bits, else float zeros (any Q4_1 layer) as
        /// `cpu_int4`, else symmetric.
        kind: CheckpointKind,
    },
}

impl QuantFormat {
    /// Reads the normalised config; `None` for an unquantized checkpoint.
    pub fn from_config(cfg: &NormalizedConfig) -> Result<Option<Self>> {
        let field = |k: &str| cfg.fields.get(k).cloned().unwrap_or(Value::Null);
        let bad = |what: String| Error::config("quantization_config", what);
        if cfg.method == "none" {
            return Ok(None);
        }
        let group =
            GroupSize::from_checkpoint(field("group_size").as_i64().unwrap_or(0)).map_err(|e| bad(e.to_string()))?;
        let format = match cfg.method.as_str() {
            "cpu_int4" => QuantFormat::CpuInt4 { group },
            "gptq" => {
                let zeros = match field("checkpoint_format").as_str() {
                    Some("gptq") => ZeroFormat::V1,
                    Some("gptq_v2") => ZeroFormat::V2,
                    other => return Err(bad(format!("checkpoint_format {other:?} is not supported (gptq, gptq_v2)"))),
                };
                QuantFormat::Gptq {
                    group,
                    sym: field("sym").as_bool().unwrap_or(true),
                    zeros,
                    lm_head: field("lm_head").as_bool().unwrap_or(false),
                }
            }
            "awq" => {
                if field("version").as_str() != Some("gemm") {
                    return Err(bad(format!("AWQ version {} is not supported (gemm)", field("version"))));
                }
                QuantFormat::Awq { group, zero_point: field("zero_point").as_bool().unwrap_or(true) }
            }
            "gguf" => {
                let float_zeros = field("float_zeros").as_bool().unwrap_or(false);
                let kind = if field("layers_quantized_at_load").as_bool().unwrap_or(false) {
                    // A decoder layer stored unquantized takes the load's 4-bit grid, as an unquantized checkpoint does.
                    CheckpointKind::Bf16
                } else if field("layers_in_eight_bits").as_bool().unwrap_or(false) {
                    CheckpointKind::EightBit
                } else if float_zeros {
                    CheckpointKind::CpuInt4
                } else {
                    CheckpointKind::GptqSym
                };
                QuantFormat::Gguf { kind }
            }
            other => return Err(bad(format!("quant_method {other} is not supported"))),
        };
        Ok(Some(format))
    }

    /// The group size.
    pub fn group(&self) -> GroupSize {
        match self {
            QuantFormat::CpuInt4 { group } | QuantFormat::Gptq { group, .. } | QuantFormat::Awq { group, .. } => *group,
            QuantFormat::Gguf { .. } => GroupSize::G32,
        }
    }

    /// The kind the path policy plans for.
    pub fn checkpoint_kind(&self) -> CheckpointKind {
        match self {
            QuantFormat::CpuInt4 { .. } => CheckpointKind::CpuInt4,
            QuantFormat::Gptq { sym: true, .. } | QuantFormat::Awq { zero_point: false, .. } => CheckpointKind::GptqSym,
            QuantFormat::Gptq { sym: false, .. } | QuantFormat::Awq { zero_point: true, .. } => {
                CheckpointKind::GptqAsym
            }
            QuantFormat::Gguf { kind } => *kind,
        }
    }

    /// Whether the checkpoint stores `prefix` quantized (its packed tensor is present).
    pub fn stores(&self, ckpt: &Checkpoint, prefix: &str) -> bool {
        match self {
            QuantFormat::CpuInt4 { .. } => ckpt.has(&format!("{prefix}.weight_packed")),
            QuantFormat::Gguf { .. } => ckpt
                .gguf()
                .and_then(|g| g.tensor(&format!("{prefix}.weight")))
                .is_some_and(|t| gguf_stored_bits(t.ggml_type).is_some()),
            _ => ckpt.has(&format!("{prefix}.qweight")),
        }
    }
}

/// Integer zero points, where the checkpoint has them: the W4A8 kernels compute with `q − z` in integers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntegerZeros {
    /// Float zeros only (`cpu_int4`).
    Absent,
    /// Symmetric: every zero point is 8.
    Symmetric,
    /// `[N][G]`, each below 16.
    PerGroup(Vec<u8>),
}

impl IntegerZeros {
    /// `[N][G]` zero points, expanded (8s when symmetric); `None` when absent.
    pub fn per_group(&self, n: usize, groups: usize) -> Option<Vec<u8>> {
        match self {
            IntegerZeros::Absent => None,
            IntegerZeros::Symmetric => Some(vec![8; n * groups]),
            IntegerZeros::PerGroup(z) => Some(z.clone()),
        }
    }
}

/// One quantized linear read from a checkpoint: codes and parameters in the K order the kernels see, and
/// the K permutation the activations need (act-order), if any.
#[derive(Clone, Debug)]
pub struct QuantLinear {
    /// Codes `[N][K]`, K permuted if `perm` is set.
    pub codes: Codes,
    /// Parameters `[N][G]` for the permuted K.
    pub params: GroupParams,
    /// The integer zero points behind `params`' float zeros, when the checkpoint stores them.
    pub zeros: IntegerZeros,
    /// Position `i` takes input channel `perm[i]`.
    pub perm: Option<Vec<u32>>,
}

impl QuantLinear {
    /// The weights `[N][K]` in the checkpoint's own K order, dequantized (the f32 reference path).
    pub fn dequantized(&self) -> Vec<f32> {
        let (n, k) = (self.codes.n(), self.codes.k());
        let mut w = vec![0.0f32; n * k];
        for row in 0..n {
            for i in 0..k {
                let col = self.perm.as_ref().map_or(i, |p| p[i] as usize);
                w[row * k + col] = self.params.weight(row, i, self.codes.get(row, i));
            }
        }
        w
    }

    /// Stacks layers that share an input (q/k/v, gate/up) along N. Their act-order permutations must be
    /// equal (they are when the quantizer saw the same inputs, as GPTQ's do).
    pub fn stack(parts: Vec<QuantLinear>, name: &str) -> Result<QuantLinear> {
        let first = parts.first().ok_or_else(|| Error::checkpoint(name, "nothing to stack"))?;
        let (k, group, perm) = (first.codes.k(), first.params.group_size(), first.perm.clone());
        if parts.iter().any(|p| p.perm != perm || p.codes.k() != k || p.params.group_size() != group) {
            return Err(Error::checkpoint(
                name,
                "the fused layers' act-order permutations (g_idx) or group sizes differ: they cannot share one input",
            ));
        }
        let n: usize = parts.iter().map(|p| p.codes.n()).sum();
        let (mut codes, mut scale, mut zero) = (Vec::with_capacity(n * k), Vec::new(), Vec::new());
        for p in &parts {
            codes.extend_from_slice(p.codes.as_slice());
            scale.extend_from_slice(p.params.scales());
            zero.extend_from_slice(p.params.zeros());
        }
        let zeros = if parts.iter().all(|p| p.zeros == IntegerZeros::Symmetric) {
            IntegerZeros::Symmetric
        } else {
            let groups = group.groups(k);
            let each: Option<Vec<Vec<u8>>> = parts.iter().map(|p| p.zeros.per_group(p.codes.n(), groups)).collect();
            each.map_or(IntegerZeros::Absent, |z| IntegerZeros::PerGroup(z.concat()))
        };
        let err = |e: int4_layout::LayoutError| Error::new(name, ErrorKind::from(e));
        Ok(QuantLinear {
            codes: Codes::new(n, k, codes).map_err(err)?,
            params: GroupParams::new(n, k, group, scale, zero).map_err(err)?,
            zeros,
            perm,
        })
    }
}

/// Weights stored as int8 codes with an f32 scale per 32 inputs: `w = d·q` (GGUF Q8_0, and Q5_0 as
/// `q − 16`). Row-major `[N][K]` codes, `[N][K/32]` scales.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Codes {
    /// Output channels.
    pub n: usize,
    /// Input channels (a multiple of 32).
    pub k: usize,
    /// Codes `[N][K]`.
    pub codes: Vec<i8>,
    /// Scales `[N][K/32]`.
    pub scales: Vec<f32>,
}

impl Int8Codes {
    /// Quantizes `w` (`[n][k]`, `k` a multiple of 32) on llama.cpp's Q8_0 grid: per 32 inputs `d = amax/127`
    /// and `q = round(w·(1/d))` (ties away from zero, as llama.cpp rounds), with `d` kept in f32. `name` is
    /// used in errors.
    pub fn quantize(name: &str, w: &[f32], n: usize, k: usize) -> Result<Self> {
        if !k.is_multiple_of(32) || w.len() != n * k {
            return Err(Error::input(name, format!("8-bit weights need K a multiple of 32 and {n}×{k} values")));
        }
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(Error::checkpoint(name, format!("weight {i} is {}", w[i])));
        }
        let mut codes = Vec::with_capacity(w.len());
        let mut scales = Vec::with_capacity(w.len() / 32);
        for block in w.chunks_exact(32) {
            let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            scales.push(d);
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            codes.extend(block.iter().map(|&v| (v * inv).round().clamp(-127.0, 127.0) as i8));
        }
        Ok(Int8Codes { n, k, codes, scales })
    }

    /// The weights `[N][K]`, dequantized (`d·q`, as ggml computes them).
    pub fn dequantized(&self) -> Vec<f32> {
        self.codes.iter().enumerate().map(|(i, &q)| f32::from(q) * self.scales[i / 32]).collect()
    }
}

/// A linear layer as a quantized checkpoint stores it.
#[derive(Clone, Debug)]
pub enum StoredLinear {
    /// 4-bit codes and parameters.
    Four(QuantLinear),
    /// 8-bit codes (GGUF Q5_0 and Q8_0).
    Eight(Int8Codes),
}

impl StoredLinear {
    /// Stacks layers that share an input along N: all 4-bit ([`QuantLinear::stack`]), or all 8-bit, where
    /// a Q4_0 part (symmetric, `d·(q − 8)`) joins as 8-bit codes `q − 8` exactly. A Q4_1 part (float zeros)
    /// fused with 8-bit parts cannot share their kernels and is an error naming the layer.
    pub fn stack(parts: Vec<StoredLinear>, name: &str) -> Result<StoredLinear> {
        if parts.iter().all(|p| matches!(p, StoredLinear::Four(_))) {
            let four = parts.into_iter().filter_map(|p| if let StoredLinear::Four(q) = p { Some(q) } else { None });
            return QuantLinear::stack(four.collect(), name).map(StoredLinear::Four);
        }
        let k = match &parts[0] {
            StoredLinear::Four(q) => q.codes.k(),
            StoredLinear::Eight(q) => q.k,
        };
        let (mut n, mut codes, mut scales) = (0, Vec::new(), Vec::new());
        for p in parts {
            let eight = match p {
                StoredLinear::Eight(q) => q,
                StoredLinear::Four(q) if q.zeros == IntegerZeros::Symmetric && q.perm.is_none() => {
                    let (rows, groups) = (q.codes.n(), q.params.groups());
                    Int8Codes {
                        n: rows,
                        k: q.codes.k(),
                        codes: q.codes.as_slice().iter().map(|&c| c as i8 - 8).collect(),
                        scales: (0..rows * groups).map(|i| q.params.scale(i / groups, i % groups)).collect(),
                    }
                }
                StoredLinear::Four(_) => {
                    return Err(Error::checkpoint(
                        name,
                        "a layer stored with float zeros (Q4_1) is fused with 8-bit layers: they cannot share \
                         one input's kernels",
                    ));
                }
            };
            if eight.k != k {
                return Err(Error::checkpoint(name, "the fused layers' input widths differ"));
            }
            n += eight.n;
            codes.extend(eight.codes);
            scales.extend(eight.scales);
        }
        Ok(StoredLinear::Eight(Int8Codes { n, k, codes, scales }))
    }
}

/// The bits a GGUF type's codes keep when the runtime packs them as stored: 4 for Q4_0, Q4_1 and Q4_K (the
/// 4-bit layouts at group 32), 8 for Q5_0 and Q8_0 ([`Int8Codes`]); `None` for a type read as f32 (the
/// unquantized types, and Q6_K, whose scale per 16 elements no group-32 layout holds: it is quantized at
/// load to 8 bits, see [`gguf_wide`]).
pub fn gguf_stored_bits(t: GgmlType) -> Option<u8> {
    match t {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => Some(4),
        GgmlType::Q5_0 | GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

/// Whether a GGUF type holds more than 4 bits per weight without a layout the runtime packs it in as stored
/// (Q6_K): such a layer is dequantized and held at 8 bits, never requantized to 4.
pub fn gguf_wide(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q6_K)
}

/// Reads linear `prefix` (`<prefix>.weight`, `n × k`) of a GGUF checkpoint as its blocks store it.
pub fn read_gguf_linear(ckpt: &Checkpoint, prefix: &str, n: usize, k: usize) -> Result<StoredLinear> {
    let name = format!("{prefix}.weight");
    let gguf = ckpt.gguf().ok_or_else(|| Error::checkpoint(&name, "the checkpoint is not a GGUF"))?;
    let t = gguf.tensor(&name).ok_or_else(|| Error::checkpoint(&name, "tensor is missing from the GGUF"))?;
    if t.shape != [n, k] {
        return Err(Error::checkpoint(&name, format!("shape {:?}, expected [{n}, {k}]", t.shape)));
    }
    let ctx = format!("{name} (in {})", gguf.file().path().display());
    let b = gguf.blocks(&name).map_err(crate::error::at(&ctx))?;
    let groups = k / 32;
    if let Some(i) = b.d.iter().chain(b.m.iter().flatten()).position(|x| !x.is_finite()) {
        return Err(Error::checkpoint(ctx, format!("block parameter {i} is not finite")));
    }
    let err = |e: int4_layout::LayoutError| Error::new(&name, ErrorKind::from(e));
    Ok(match t.ggml_type {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => {
            let codes = Codes::new(n, k, b.codes.iter().map(|&q| q as u8).collect()).map_err(err)?;
            let (zero, zeros) = match &b.m {
                // d·q + m = d·(q − 8) + (m + 8d).
                Some(m) => (b.d.iter().zip(m).map(|(&d, &m)| m + 8.0 * d).collect(), IntegerZeros::Absent),
                None => (vec![0.0; n * groups], IntegerZeros::Symmetric),
            };
            let params = GroupParams::new(n, k, GroupSize::G32, b.d, zero).map_err(err)?;
            StoredLinear::Four(QuantLinear { codes, params, zeros, perm: None })
        }
        _ => StoredLinear::Eight(Int8Codes { n, k, codes: b.codes, scales: b.d }),
    })
}

/// How many of a Q4_1 tensor's blocks have a zero `m + 8d` that f32 cannot hold exactly (their weights
/// are then within ½ ulp of that zero of ggml's `d·q + m`; every other weight is exact).
pub fn inexact_q4_1_zeros(d: &[f32], m: &[f32]) -> usize {
    d.iter().zip(m).filter(|&(&d, &m)| f64::from(m + 8.0 * d) != f64::from(m) + 8.0 * f64::from(d)).count()
}

/// Reads the quantized linear `prefix` of shape `n × k`.
pub fn read_linear(ckpt: &Checkpoint, prefix: &str, n: usize, k: usize, format: &QuantFormat) -> Result<QuantLinear> {
    let err = |e: int4_layout::LayoutError| Error::new(prefix, ErrorKind::from(e));
    let group = format.group();
    let groups = group.groups(k);
    let t = |suffix: &str| format!("{prefix}.{suffix}");
    match format {
        QuantFormat::CpuInt4 { .. } => {
            if !k.is_multiple_of(2) {
                return Err(Error::checkpoint(
                    prefix,
                    format!("K = {k} is odd: cpu_int4 packs pairs of input channels"),
                ));
            }
            let packed = ckpt.u8(&t("weight_packed"), &[n, k / 2])?;
            let codes = rowmajor::unpack(&packed, n, k).map_err(err)?;
            let scale = ckpt.f32(&t("weight_scale"), &[n, groups])?;
            let zero = ckpt.f32(&t("weight_zero"), &[n, groups])?;
            Ok(QuantLinear {
                codes,
                params: GroupParams::new(n, k, group, scale, zero).map_err(err)?,
                zeros: IntegerZeros::Absent,
                perm: None,
            })
        }
        QuantFormat::Gptq { sym, zeros, .. } => {
            if !k.is_multiple_of(8) || !n.is_multiple_of(8) {
                return Err(Error::checkpoint(
                    prefix,
                    format!("GPTQ packs 8 codes per word: N = {n} and K = {k} must be multiples of 8"),
                ));
            }
            let qweight = ckpt.i32(&t("qweight"), &[k / 8, n])?;
            let qzeros = ckpt.i32(&t("qzeros"), &[groups, n / 8])?;
            let scales = ckpt.f32(&t("scales"), &[groups, n])?;
            let codes = gptq::unpack_qweight(&qweight, k, n).map_err(err)?;
            let zero_points = if *sym {
                // Symmetric checkpoints are written by tools that disagree about v1 and v2: the stored
                // values (all 7 or all 8) say which, whatever checkpoint_format claims.
                gptq::detect_symmetric_zero_format(&qzeros).map_err(err)?;
                None
            } else {
                Some(gptq::unpack_qzeros(&qzeros, groups, n, *zeros).map_err(err)?)
            };
            let zp = zero_points.as_deref();
            if let Some(z) = zp.and_then(|z| z.iter().find(|&&z| z > 15)) {
                return Err(Error::checkpoint(
                    prefix,
                    format!("a zero point reads as {z}: a v1 checkpoint that stored zero 0"),
                ));
            }
            let params = params_from_integer_zeros(n, k, group, &scales, zp).map_err(err)?;
            let zeros = integer_zeros(zp, n, groups);
            let g_idx = if ckpt.has(&t("g_idx")) { Some(ckpt.i32(&t("g_idx"), &[k])?) } else { None };
            let perm = match &g_idx {
                Some(g) => gptq::act_order_permutation(g, k, group).map_err(err)?,
                None => None,
            };
            let codes = match &perm {
                Some(p) => gptq::permute_k(&codes, p).map_err(err)?,
                None => codes,
            };
            Ok(QuantLinear { codes, params, zeros, perm })
        }
        QuantFormat::Awq { zero_point, .. } => {
            if !n.is_multiple_of(8) {
                return Err(Error::checkpoint(
                    prefix,
                    format!("AWQ packs 8 columns per word: N = {n} must be a multiple of 8"),
                ));
            }
            let qweight = ckpt.i32(&t("qweight"), &[k, n / 8])?;
            let scales = ckpt.f32(&t("scales"), &[groups, n])?;
            let codes = gptq::unpack_awq_qweight(&qweight, k, n).map_err(err)?;
            let zero_points = if *zero_point {
                let qzeros = ckpt.i32(&t("qzeros"), &[groups, n / 8])?;
                Some(gptq::unpack_awq(&qzeros, groups, n).map_err(err)?)
            } else {
                None
            };
            let params = params_from_integer_zeros(n, k, group, &scales, zero_points.as_deref()).map_err(err)?;
            let zeros = integer_zeros(zero_points.as_deref(), n, groups);
            Ok(QuantLinear { codes, params, zeros, perm: None })
        }
        QuantFormat::Gguf { .. } => match read_gguf_linear(ckpt, prefix, n, k)? {
            StoredLinear::Four(q) => Ok(q),
            StoredLinear::Eight(_) => Err(Error::checkpoint(prefix, "is stored in 8 bits (Q5_0 or Q8_0), not 4")),
        },
    }
}

/// `[G][N]` checkpoint zero points (`None`: symmetric) as [`IntegerZeros`] (`[N][G]`).
fn integer_zeros(zero_points_gn: Option<&[u8]>, n: usize, groups: usize) -> IntegerZeros {
    match zero_points_gn {
        None => IntegerZeros::Symmetric,
        Some(z) => IntegerZeros::PerGroup((0..n * groups).map(|i| z[(i % groups) * n + i / groups]).collect()),
    }
}
