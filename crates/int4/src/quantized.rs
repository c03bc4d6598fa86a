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

use int4_cache::quant_config::NormalizedConfig;
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
            other => return Err(bad(format!("quant_method {other} is not supported"))),
        };
        Ok(Some(format))
    }

    /// The group size.
    pub fn group(&self) -> GroupSize {
        match self {
            QuantFormat::CpuInt4 { group } | QuantFormat::Gptq { group, .. } | QuantFormat::Awq { group, .. } => *group,
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
        }
    }

    /// Whether the checkpoint stores `prefix` quantized (its packed tensor is present).
    pub fn stores(&self, ckpt: &Checkpoint, prefix: &str) -> bool {
        match self {
            QuantFormat::CpuInt4 { .. } => ckpt.has(&format!("{prefix}.weight_packed")),
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
    }
}

/// `[G][N]` checkpoint zero points (`None`: symmetric) as [`IntegerZeros`] (`[N][G]`).
fn integer_zeros(zero_points_gn: Option<&[u8]>, n: usize, groups: usize) -> IntegerZeros {
    match zero_points_gn {
        None => IntegerZeros::Symmetric,
        Some(z) => IntegerZeros::PerGroup((0..n * groups).map(|i| z[(i % groups) * n + i / groups]).collect()),
    }
}
