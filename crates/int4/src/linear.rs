//! A linear layer on the kernels the plan chose, bound to this process, with the kernel it ran per phase on
//! record.

use std::sync::atomic::{AtomicU8, Ordering};

use int4_kernels::bytes::SharedBytes;
use int4_kernels::choice::{self, BoundKernels};
use int4_kernels::dense::{DenseLinear, DenseWeights};
use int4_kernels::isa::IsaCaps;
use int4_kernels::portable::Wna16Linear;
use int4_kernels::w4a8::int8::{Int8Linear, Int8Weights};
use int4_kernels::w4a8::{ActivationScales, ParamTable, ParamType, TableBytes, W4A8Linear, W4A8Weights};
use int4_kernels::w4a16::{W4A16Config, W4A16Linear, W4A16Weights};
use int4_kernels::w8a16::{W8A16Linear, W8A16Weights};
use int4_kernels::{KernelId, LayerSpec};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::tinygemm::TinygemmBlock;
use int4_layout::{GroupParams, GroupSize, rowmajor};

use crate::error::{Error, Result, at};
use crate::quantized::{Int8Codes, IntegerZeros, QuantLinear, StoredLinear};

/// How a model's linear layers are run: the weights' form, and the kernels (chosen, and bound to this
/// process: holding a `Numerics` proves its kernels can run here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// Unquantized f32 weights: the correctness reference.
    F32 {
        /// The dense f32 kernels.
        kernels: BoundKernels,
    },
    /// Unquantized bf16 weights: the speed baseline.
    Bf16 {
        /// The dense bf16 kernels.
        kernels: BoundKernels,
    },
    /// 4-bit weights in a tinygemm layout, quantized on load (round-to-nearest, asymmetric grid).
    W4a16 {
        /// Channel block width of the packed layout.
        block: TinygemmBlock,
        /// Group size.
        group: GroupSize,
        /// Threshold and prefill source.
        config: W4A16Config,
        /// The W4A16 kernels.
        kernels: BoundKernels,
        /// The W8A16 kernels, for layers stored in 8 bits and an 8-bit head.
        eight: BoundKernels,
        /// Whether an unquantized head is held in 8 bits rather than 4.
        head: HeadBits,
    },
    /// 4-bit weights as row-major codes, the portable fallback.
    Wna16 {
        /// Group size.
        group: GroupSize,
        /// The portable kernel (which runs every row count).
        kernels: BoundKernels,
        /// The portable W8A16 kernels, for layers stored in 8 bits and an 8-bit head.
        eight: BoundKernels,
        /// Whether an unquantized head is held in 8 bits rather than 4.
        head: HeadBits,
    },
    /// 4-bit weights, activations quantized to int8. Integer zero points as the checkpoint holds them
    /// (GPTQ), float zeros as offsets (`cpu_int4`, or quantized on load: round to nearest on the same
    /// asymmetric float-zero grid as W4A16).
    W4a8 {
        /// Group size.
        group: GroupSize,
        /// The W4A8 kernels.
        kernels: BoundKernels,
        /// Activation scales per token or per group.
        activations: ActivationScales,
        /// Whether an unquantized head is held in 8 bits rather than 4.
        head: HeadBits,
    },
    /// 8-bit symmetric weights with an f32 scale per 32 inputs (a GGUF's Q8_0 and Q5_0 layers as stored;
    /// an unquantized head with [`HeadBits::Eight`] on llama.cpp's Q8_0 grid), f32 activations: the
    /// W4A16 path's 8-bit layers.
    W8a16 {
        /// The W8A16 kernels.
        kernels: BoundKernels,
    },
    /// 8-bit symmetric weights (groups of 32, `amax/127`: llama.cpp's Q8_0 grid) on the W4A8 kernels as
    /// two 4-bit planes, int8 activations: the W4A8 path's 8-bit layers and its head with
    /// [`HeadBits::Eight`].
    W8a8 {
        /// The W4A8 kernels the two planes run on.
        kernels: BoundKernels,
        /// Activation scales per token or per group.
        activations: ActivationScales,
    },
}

pub use int4_select::policy::HeadBits;

/// The group of [`Numerics::W8a8`] weights.
pub const INT8_GROUP: GroupSize = GroupSize::G32;

enum Imp {
    Dense(DenseLinear),
    W4a16(W4A16Linear),
    Wna16(Wna16Linear),
    W4a8(W4A8Linear),
    Int8(Int8Linear),
    W8a16(W8A16Linear),
}

/// `y = x·Wᵀ (+ bias)` with W `[n][k]`.
pub struct Linear {
    n: usize,
    k: usize,
    /// N rounded up to the packer's multiple of 16 (extra outputs are computed and dropped).
    n_padded: usize,
    /// GPTQ act-order: the kernels see input channel `perm[i]` at position `i`.
    perm: Option<Vec<u32>>,
    imp: Imp,
    /// Rows from which a call is the prefill phase (the kernels' `prefill_from`).
    prefill_from: usize,
    /// The kernel the last decode-phase and prefill-phase call dispatched to (an index into
    /// [`KernelId::ALL`], plus one; 0: none yet).
    dispatched: [AtomicU8; 2],
}

/// A `Linear` under construction: every field but the record of what it dispatched.
struct Parts {
    n: usize,
    k: usize,
    n_padded: usize,
    perm: Option<Vec<u32>>,
    imp: Imp,
    prefill_from: usize,
}

impl From<Parts> for Linear {
    fn from(p: Parts) -> Self {
        let Parts { n, k, n_padded, perm, imp, prefill_from } = p;
        Linear { n, k, n_padded, perm, imp, prefill_from, dispatched: Default::default() }
    }
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear").field("n", &self.n).field("k", &self.k).finish_non_exhaustive()
    }
}

/// Where a packed layer's sections come from: a memory-mapped artifact, or bytes packed in this process.
pub type SectionSource<'a> = &'a dyn Fn(&str) -> Option<SharedBytes>;

impl Numerics {
    /// Unquantized f32 weights on the fastest dense kernels `caps` allows on this CPU.
    pub fn f32(caps: &IsaCaps) -> Self {
        Numerics::F32 { kernels: best_dense(false, caps) }
    }

    /// Unquantized bf16 weights on the fastest dense kernels `caps` allows on this CPU.
    pub fn bf16(caps: &IsaCaps) -> Self {
        Numerics::Bf16 { kernels: best_dense(true, caps) }
    }

    /// 4-bit row-major codes at `group` on the portable wna16 kernel (which runs on any CPU), the head in 4
    /// bits too.
    pub fn wna16(group: GroupSize) -> Self {
        let spec = LayerSpec::Wna16 { prefill_from: int4_kernels::w4a16::DEFAULT_DEQUANT_THRESHOLD };
        let kernels = choice::best(spec, &IsaCaps::unrestricted()).expect("the portable kernel binds on any CPU");
        Numerics::Wna16 { group, kernels, eight: portable_w8a16(), head: HeadBits::Four }
    }

    /// Whether the weights are quantized and packed (and so worth an artifact in the cache).
    pub fn is_packed(self) -> bool {
        matches!(
            self,
            Numerics::W4a16 { .. }
                | Numerics::Wna16 { .. }
                | Numerics::W4a8 { .. }
                | Numerics::W8a8 { .. }
                | Numerics::W8a16 { .. }
        )
    }

    /// The kernels the layers run (the wna16 fallback's one portable kernel included).
    pub fn kernels(self) -> BoundKernels {
        match self {
            Numerics::F32 { kernels }
            | Numerics::Bf16 { kernels }
            | Numerics::W4a16 { kernels, .. }
            | Numerics::W4a8 { kernels, .. }
            | Numerics::W8a8 { kernels, .. }
            | Numerics::W8a16 { kernels }
            | Numerics::Wna16 { kernels, .. } => kernels,
        }
    }

    /// The numerics of a head the checkpoint stores unquantized: 8 bits where the path asks for it, else
    /// the model's own.
    pub fn for_unquantized_head(self) -> Numerics {
        match self {
            Numerics::W4a8 { head: HeadBits::Eight, .. }
            | Numerics::W4a16 { head: HeadBits::Eight, .. }
            | Numerics::Wna16 { head: HeadBits::Eight, .. } => self.for_eight_bit(),
            other => other,
        }
    }

    /// The numerics of a layer stored in 8 bits: the W8A16 kernels on the W4A16 and portable paths, the two
    /// 4-bit planes on W4A8; the unquantized numerics run it dequantized.
    pub fn for_eight_bit(self) -> Numerics {
        match self {
            Numerics::W4a16 { eight, .. } | Numerics::Wna16 { eight, .. } => Numerics::W8a16 { kernels: eight },
            Numerics::W4a8 { kernels, activations, .. } => Numerics::W8a8 { kernels, activations },
            other => other,
        }
    }

    /// Whether these numerics hold 8-bit weights.
    pub fn is_eight_bit(self) -> bool {
        matches!(self, Numerics::W8a8 { .. } | Numerics::W8a16 { .. })
    }

    /// The head's bits on the packed paths that choose them.
    pub fn head_bits(self) -> HeadBits {
        match self {
            Numerics::W4a16 { head, .. } | Numerics::Wna16 { head, .. } | Numerics::W4a8 { head, .. } => head,
            _ => HeadBits::Four,
        }
    }
}

/// The portable W8A16 kernels, which bind on any CPU.
fn portable_w8a16() -> BoundKernels {
    let spec = LayerSpec::W8a16 { prefill_from: choice::W8A16_PREFILL_FROM_ROWS };
    choice::at_level(spec, int4_kernels::isa::IsaLevel::Portable, &IsaCaps::unrestricted())
        .expect("the portable kernels bind on any CPU")
}

/// The fastest dense kernels `caps` allows here. Binding what the live CPU's own features chose cannot
/// fail: every feature in the choice was checked on this CPU under these caps.
fn best_dense(bf16: bool, caps: &IsaCaps) -> BoundKernels {
    choice::best(LayerSpec::Dense { bf16 }, caps).expect("the live CPU's own choice binds")
}

/// The sections of 8-bit weights on the W4A8 kernels: the two planes and the low plane's scales (the high
/// plane's are 16 times those).
fn int8_sections(name: &str, q: &Int8Weights) -> Vec<(String, Vec<u8>)> {
    vec![
        (section(name, "int8_hi"), q.hi().packed().to_vec()),
        (section(name, "int8_lo"), q.lo().packed().to_vec()),
        table_section(name, "int8_scales", q.lo().scales()),
    ]
}

/// A W4A8 parameter table's section: `part` for an f32 table, `part_f16` for an f16 one, so the name
/// says how to read the bytes.
fn table_section(name: &str, part: &str, table: &ParamTable) -> (String, Vec<u8>) {
    let stored = table.to_bytes();
    let part = match stored.ty {
        ParamType::F32 => part.to_string(),
        ParamType::F16 => format!("{part}_f16"),
    };
    (section(name, &part), stored.bytes.to_vec())
}

/// The parameter table stored as `part` (f32) or `part_f16` (f16), if either is; both is an error (no
/// writer makes it, so the artifact is not one of ours).
fn read_table(name: &str, part: &str, get: SectionSource) -> Result<Option<TableBytes>> {
    let f32 = get(&section(name, part)).map(|bytes| TableBytes { ty: ParamType::F32, bytes });
    let f16 = get(&section(name, &format!("{part}_f16"))).map(|bytes| TableBytes { ty: ParamType::F16, bytes });
    match (f32, f16) {
        (Some(_), Some(_)) => {
            Err(Error::artifact(name, format!("the artifact holds \"{part}\" at both 32 and 16 bits")))
        }
        (a, b) => Ok(a.or(b)),
    }
}

/// Reads a stored act-order permutation, checking that it is one.
fn read_permutation(name: &str, bytes: &[u8], k: usize) -> Result<Vec<u32>> {
    let p: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut seen = vec![false; k];
    let valid =
        bytes.len() == 4 * k && p.iter().all(|&i| (i as usize) < k && !std::mem::replace(&mut seen[i as usize], true));
    if !valid {
        return Err(Error::artifact(
            name,
            format!("the stored input permutation is not a permutation of {k} channels"),
        ));
    }
    Ok(p)
}

/// A `[G][np]` table from per-channel values `at(row, g)` for the `n` real channels; the padded channels
/// `n..np` hold `pad`.
fn transpose_to_gn<T: Copy>(n: usize, np: usize, groups: usize, pad: T, at: impl Fn(usize, usize) -> T) -> Vec<T> {
    let mut out = vec![pad; groups * np];
    for row in 0..n {
        for g in 0..groups {
            out[g * np + row] = at(row, g);
        }
    }
    out
}

/// An artifact section's name: the layer's name and the part.
fn section(name: &str, part: &str) -> String {
    format!("{name}.{part}")
}

impl Linear {
    /// Builds the layer from f32 weights `[n][k]` by `numerics`. `name` is used in errors.
    pub fn build(
        name: &str,
        w: Vec<f32>,
        n: usize,
        k: usize,
        bias: Option<Vec<f32>>,
        numerics: Numerics,
    ) -> Result<Self> {
        let prefill_from = numerics.kernels().choice().prefill_from;
        let imp = match numerics {
            Numerics::F32 { kernels } => {
                Imp::Dense(DenseLinear::with_kernels(n, k, DenseWeights::F32(w), bias, kernels).map_err(at(name))?)
            }
            Numerics::Bf16 { kernels } => {
                let wb = w.iter().map(|&x| half::bf16::from_f32(x)).collect();
                Imp::Dense(DenseLinear::with_kernels(n, k, DenseWeights::Bf16(wb), bias, kernels).map_err(at(name))?)
            }
            Numerics::W4a16 { .. }
            | Numerics::Wna16 { .. }
            | Numerics::W4a8 { .. }
            | Numerics::W8a8 { .. }
            | Numerics::W8a16 { .. } => {
                let mut sections: Vec<(String, SharedBytes)> =
                    Self::pack(name, w, n, k, numerics)?.into_iter().map(|(s, b)| (s, b.into())).collect();
                let get = |s: &str| sections.iter().position(|(n, _)| n == s).map(|i| sections[i].1.clone());
                let layer = Self::from_sections(name, n, k, bias, numerics, &get)?;
                sections.clear();
                return Ok(layer);
            }
        };
        Ok(Parts { n, k, n_padded: n, perm: None, imp, prefill_from }.into())
    }

    /// Builds the layer from a checkpoint's stored 4- or 8-bit codes ([`StoredLinear`]): packed as they are
    /// (no requantization), dequantized for the dense numerics.
    pub fn build_stored(name: &str, q: StoredLinear, bias: Option<Vec<f32>>, numerics: Numerics) -> Result<Self> {
        match q {
            StoredLinear::Four(q) => Self::build_quantized(name, q, bias, numerics),
            StoredLinear::Eight(q) => {
                let (n, k) = (q.n, q.k);
                if !numerics.is_packed() {
                    return Self::build(name, q.dequantized(), n, k, bias, numerics);
                }
                let sections: Vec<(String, SharedBytes)> =
                    Self::pack_int8(name, q, numerics)?.into_iter().map(|(s, b)| (s, b.into())).collect();
                let get = |s: &str| sections.iter().find(|(n, _)| n == s).map(|(_, b)| b.clone());
                Self::from_sections(name, n, k, bias, numerics, &get)
            }
        }
    }

    /// Packs a checkpoint's stored codes for `numerics` ([`Linear::pack_codes`] or [`Linear::pack_int8`]).
    pub fn pack_stored(name: &str, q: StoredLinear, numerics: Numerics) -> Result<Vec<(String, Vec<u8>)>> {
        match q {
            StoredLinear::Four(q) => Self::pack_codes(name, q, numerics),
            StoredLinear::Eight(q) => Self::pack_int8(name, q, numerics),
        }
    }

    /// Packs 8-bit codes for [`Numerics::W8a16`] or [`Numerics::W8a8`]: the sections an artifact stores.
    pub fn pack_int8(name: &str, q: Int8Codes, numerics: Numerics) -> Result<Vec<(String, Vec<u8>)>> {
        let Int8Codes { n, k, codes, scales } = q;
        match numerics {
            Numerics::W8a16 { .. } => {
                let w = W8A16Weights::new(codes, scales, n, k).map_err(at(name))?;
                Ok(vec![
                    (section(name, "w8a16_codes"), w.codes_bytes().to_vec()),
                    (section(name, "w8a16_scales"), w.scales_le_bytes()),
                ])
            }
            Numerics::W8a8 { .. } => {
                // Padded channels are zero weights (scale 1, codes 0); their outputs are dropped.
                let np = n.next_multiple_of(16);
                let (mut codes, mut scales) = (codes, scales);
                codes.resize(np * k, 0);
                scales.resize(np * (k / 32), 1.0);
                let w = Int8Weights::from_codes(&codes, &scales, np, k, INT8_GROUP).map_err(at(name))?;
                Ok(int8_sections(name, &w))
            }
            _ => Err(Error::input(name, "8-bit codes are packed only for the 8-bit numerics")),
        }
    }

    /// Builds the layer from a quantized checkpoint's codes and parameters: packed as they are for the
    /// 4-bit numerics (no requantization), dequantized for the dense ones.
    pub fn build_quantized(name: &str, q: QuantLinear, bias: Option<Vec<f32>>, numerics: Numerics) -> Result<Self> {
        let (n, k) = (q.codes.n(), q.codes.k());
        if !numerics.is_packed() {
            return Self::build(name, q.dequantized(), n, k, bias, numerics);
        }
        let sections: Vec<(String, SharedBytes)> =
            Self::pack_codes(name, q, numerics)?.into_iter().map(|(s, b)| (s, b.into())).collect();
        let get = |s: &str| sections.iter().find(|(n, _)| n == s).map(|(_, b)| b.clone());
        Self::from_sections(name, n, k, bias, numerics, &get)
    }

    /// Packs a quantized checkpoint's codes and parameters for `numerics`: the sections an artifact stores.
    pub fn pack_codes(name: &str, q: QuantLinear, numerics: Numerics) -> Result<Vec<(String, Vec<u8>)>> {
        let QuantLinear { codes, params, zeros, perm } = q;
        let mut out = match numerics {
            Numerics::F32 { .. } | Numerics::Bf16 { .. } => return Ok(Vec::new()),
            Numerics::W8a8 { .. } | Numerics::W8a16 { .. } => {
                return Err(Error::input(
                    name,
                    "8-bit weights are quantized from unquantized weights; this layer is stored in 4 bits",
                ));
            }
            Numerics::W4a16 { block, config, .. } => {
                let (codes, params) = (codes.padded_n(16), params.padded_n(16));
                let weights = W4A16Weights::new(&codes, params, block, config.direct_dequant).map_err(at(name))?;
                let mut out = vec![
                    (section(name, "tinygemm"), weights.packed().to_vec()),
                    (section(name, "lane_params"), weights.lane_params_le_bytes()),
                ];
                if let Some(h) = weights.halves() {
                    out.push((section(name, "halves"), h.to_vec()));
                }
                out
            }
            Numerics::Wna16 { .. } => vec![
                (section(name, "rowmajor"), rowmajor::pack(&codes).map_err(at(name))?),
                (section(name, "params"), params.to_le_bytes()),
            ],
            Numerics::W4a8 { group, .. } => {
                let (n, groups) = (codes.n(), params.groups());
                let np = n.next_multiple_of(16);
                let codes = codes.padded_n(16);
                // [N][G] → [G][N], padded channels with scale 0, zero point 8 and offset 0 (their outputs
                // are dropped).
                let scales_gn = transpose_to_gn(n, np, groups, 0.0, |row, g| params.scale(row, g));
                // Integer zero points ride in the i32 sums; float zeros (`w = s·(q − 8) + zero`, as
                // `cpu_int4` and the load-time grid hold them) become the kernels' float offsets.
                let (zeros_gn, offsets_gn) = match zeros.per_group(n, groups) {
                    Some(zeros_ng) => {
                        let zeros_gn = transpose_to_gn(n, np, groups, 8u8, |row, g| zeros_ng[row * groups + g]);
                        ((zeros != IntegerZeros::Symmetric).then_some(zeros_gn), None)
                    }
                    None => (None, Some(transpose_to_gn(n, np, groups, 0.0, |row, g| params.zero(row, g)))),
                };
                let w = W4A8Weights::pack(&codes, &scales_gn, zeros_gn.as_deref(), offsets_gn.as_deref(), group)
                    .map_err(at(name))?;
                let mut out =
                    vec![(section(name, "w4a8"), w.packed().to_vec()), table_section(name, "w4a8_scales", w.scales())];
                if let Some(z) = w.zeros() {
                    out.push((section(name, "w4a8_zeros"), z.to_vec()));
                }
                if let Some(f) = w.offsets() {
                    out.push(table_section(name, "w4a8_offsets", f));
                }
                out
            }
        };
        if let Some(p) = perm {
            out.push((section(name, "perm"), p.iter().flat_map(|v| v.to_le_bytes()).collect()));
        }
        Ok(out)
    }

    /// Quantizes `w` (`[n][k]`, round to nearest on the asymmetric grid with float zeros, the same grid
    /// for every 4-bit numerics) and packs it for `numerics`: the named byte sections an artifact stores
    /// for this layer. Empty for the unquantized numerics.
    pub fn pack(name: &str, w: Vec<f32>, n: usize, k: usize, numerics: Numerics) -> Result<Vec<(String, Vec<u8>)>> {
        match numerics {
            Numerics::F32 { .. } | Numerics::Bf16 { .. } => Ok(Vec::new()),
            Numerics::W4a16 { group, .. } | Numerics::Wna16 { group, .. } | Numerics::W4a8 { group, .. } => {
                let q =
                    quantize_asymmetric(&w, n, k, group, ScaleSearch::Off, ParamPrecision::F32).map_err(at(name))?;
                drop(w);
                let q = QuantLinear { codes: q.codes, params: q.params, zeros: IntegerZeros::Absent, perm: None };
                Self::pack_codes(name, q, numerics)
            }
            Numerics::W8a8 { .. } => {
                // Padded channels are zero weights (scale 1, codes 0); their outputs are dropped.
                let np = n.next_multiple_of(16);
                let mut w = w;
                w.resize(np * k, 0.0);
                let q = Int8Weights::quantize(&w, np, k, INT8_GROUP).map_err(at(name))?;
                Ok(int8_sections(name, &q))
            }
            Numerics::W8a16 { .. } => Self::pack_int8(name, Int8Codes::quantize(name, &w, n, k)?, numerics),
        }
    }

    /// Builds a packed layer from the sections [`Linear::pack`] made, read in place (`get` returns each
    /// section's bytes, for example from a memory-mapped artifact). Every length is checked.
    pub fn from_sections(
        name: &str,
        n: usize,
        k: usize,
        bias: Option<Vec<f32>>,
        numerics: Numerics,
        get: SectionSource,
    ) -> Result<Self> {
        let need = |part: &str| {
            get(&section(name, part))
                .ok_or_else(|| Error::artifact(name, format!("the artifact has no section \"{part}\"")))
        };
        let prefill_from = numerics.kernels().choice().prefill_from;
        let perm = match get(&section(name, "perm")) {
            Some(b) => Some(read_permutation(name, &b, k)?),
            None => None,
        };
        let layer = match numerics {
            Numerics::F32 { .. } | Numerics::Bf16 { .. } => {
                return Err(Error::input(
                    name,
                    "unquantized layers are built from the checkpoint, not from packed sections",
                ));
            }
            Numerics::W4a16 { block, group, config, kernels, .. } => {
                let np = n.next_multiple_of(16);
                let halves = if config.direct_dequant { None } else { Some(need("halves")?) };
                let weights = W4A16Weights::from_packed_lane_params(
                    need("tinygemm")?,
                    need("lane_params")?,
                    (np, k, group),
                    block,
                    halves,
                )
                .map_err(at(name))?;
                let bias = bias.map(|mut b| {
                    b.resize(np, 0.0);
                    b
                });
                let imp = Imp::W4a16(W4A16Linear::new(weights, bias, config, kernels).map_err(at(name))?);
                Parts { n, k, n_padded: np, perm: None, imp, prefill_from }
            }
            Numerics::Wna16 { group, .. } => {
                let params = GroupParams::from_le_bytes(n, k, group, &need("params")?).map_err(at(name))?;
                let imp = Imp::Wna16(Wna16Linear::new(need("rowmajor")?, params, bias).map_err(at(name))?);
                Parts { n, k, n_padded: n, perm: None, imp, prefill_from }
            }
            Numerics::W4a8 { group, kernels, activations, .. } => {
                let np = n.next_multiple_of(16);
                let scales = read_table(name, "w4a8_scales", get)?.ok_or_else(|| {
                    Error::artifact(name, "the artifact has no section \"w4a8_scales\" (or \"w4a8_scales_f16\")")
                })?;
                let weights = W4A8Weights::from_parts(
                    need("w4a8")?,
                    scales,
                    get(&section(name, "w4a8_zeros")),
                    read_table(name, "w4a8_offsets", get)?,
                    (np, k, group),
                )
                .map_err(at(name))?;
                let bias = bias.map(|mut b| {
                    b.resize(np, 0.0);
                    b
                });
                let layer = W4A8Linear::with_kernels(weights, bias, kernels).map_err(at(name))?;
                let imp = Imp::W4a8(layer.with_activation_scales(activations));
                Parts { n, k, n_padded: np, perm: None, imp, prefill_from }
            }
            Numerics::W8a16 { kernels } => {
                let weights =
                    W8A16Weights::from_parts(need("w8a16_codes")?, need("w8a16_scales")?, n, k).map_err(at(name))?;
                let imp = Imp::W8a16(W8A16Linear::with_kernels(weights, bias, kernels).map_err(at(name))?);
                Parts { n, k, n_padded: n, perm: None, imp, prefill_from }
            }
            Numerics::W8a8 { kernels, activations } => {
                let np = n.next_multiple_of(16);
                let dims = (np, k, INT8_GROUP);
                let lo_scales = read_table(name, "int8_scales", get)?.ok_or_else(|| {
                    Error::artifact(name, "the artifact has no section \"int8_scales\" (or \"int8_scales_f16\")")
                })?;
                // The high plane's scales are 16 times the low plane's, each exact in f32 (a power of two),
                // and in f16 where it holds them.
                let lo_table = ParamTable::from_bytes(lo_scales.clone()).map_err(at(name))?;
                let hi_scales = lo_table.map(|s| 16.0 * s);
                let zeros: SharedBytes = vec![0u8; INT8_GROUP.groups(k) * np].into();
                let hi = W4A8Weights::from_parts(need("int8_hi")?, hi_scales.to_bytes(), None, None, dims);
                let lo = W4A8Weights::from_parts(need("int8_lo")?, lo_scales, Some(zeros), None, dims);
                let weights =
                    Int8Weights::from_planes(hi.map_err(at(name))?, lo.map_err(at(name))?).map_err(at(name))?;
                let bias = bias.map(|mut b| {
                    b.resize(np, 0.0);
                    b
                });
                let layer = Int8Linear::with_kernels(weights, bias, kernels).map_err(at(name))?;
                let imp = Imp::Int8(layer.with_activation_scales(activations));
                Parts { n, k, n_padded: np, perm: None, imp, prefill_from }
            }
        };
        Ok(Parts { perm, ..layer }.into())
    }

    /// Output width.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The kernel the last call of each phase dispatched to: `(decode, prefill)`, `None` for a phase that
    /// has not run. What ran, as the layer recorded it, not a prediction.
    pub fn dispatched(&self) -> (Option<KernelId>, Option<KernelId>) {
        let get = |slot: &AtomicU8| match slot.load(Ordering::Relaxed) {
            0 => None,
            i => KernelId::ALL.get(usize::from(i) - 1).copied(),
        };
        (get(&self.dispatched[0]), get(&self.dispatched[1]))
    }

    /// The kernel that runs `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        match &self.imp {
            Imp::Dense(d) => d.kernel_for(m),
            Imp::W4a16(l) => l.kernel_for(m),
            Imp::Wna16(l) => l.kernel(),
            Imp::W4a8(l) => l.kernel_for(m),
            Imp::Int8(l) => l.kernel_for(m),
            Imp::W8a16(l) => l.kernel_for(m),
        }
    }

    /// The packed 4-bit weights, when this layer is W4A16.
    pub fn w4a16(&self) -> Option<&W4A16Weights> {
        match &self.imp {
            Imp::W4a16(l) => Some(l.weights()),
            _ => None,
        }
    }

    /// Decodes row `row` of the weights (an output channel, `k` values) into `out`, when the layer is
    /// packed: how a tied 4-bit head serves the embedding lookup without a second copy of the table.
    pub fn decode_row(&self, row: usize, out: &mut [f32]) -> Option<Result<()>> {
        let res = match &self.imp {
            Imp::Dense(_) => return None,
            Imp::W4a16(l) => l.weights().decode_row(row, out).map_err(at("embedding")),
            Imp::W4a8(l) => l.weights().decode_row(row, out).map_err(at("embedding")),
            Imp::Int8(l) => l.weights().decode_row(row, out).map_err(at("embedding")),
            Imp::W8a16(l) => l.weights().row(row, out).map_err(at("embedding")),
            Imp::Wna16(l) => {
                let bytes = &l.row_major()[row * self.k / 2..(row + 1) * self.k / 2];
                let mut codes = vec![0u8; self.k];
                rowmajor::unpack_row_into(bytes, &mut codes);
                for (kk, (o, &q)) in out.iter_mut().zip(&codes).enumerate() {
                    *o = l.params().weight(row, kk, q);
                }
                Ok(())
            }
        };
        Some(res)
    }

    /// Bytes of weights this layer holds.
    pub fn weight_bytes(&self) -> usize {
        match &self.imp {
            Imp::Dense(d) => d.weight_bytes(),
            Imp::W4a16(l) => l.weights().resident_bytes(),
            Imp::Wna16(_) => self.n * self.k / 2 + self.n * self.k.div_ceil(32) * 8,
            Imp::W4a8(l) => l.weights().resident_bytes(),
            Imp::Int8(l) => l.weights().resident_bytes(),
            Imp::W8a16(l) => l.weights().bytes(),
        }
    }

    /// Bytes one decode step (M = 1) reads: what [`Linear::weight_bytes`] counts, less a prefill-only copy
    /// (the split halves of `direct_dequant: false`).
    pub fn decode_bytes(&self) -> usize {
        match &self.imp {
            Imp::W4a16(l) => l.weights().decode_bytes(),
            _ => self.weight_bytes(),
        }
    }

    /// Decode rows (one per sequence), each computed bit for bit as it is alone: W4A16 in one pass over
    /// the weights, each row on its one-row chains ([`W4A16Linear::decode_rows_exact`]); W4A8 and its 8-bit
    /// head in one pass on the kernel one row runs (integer sums, exact in any row blocking); W8A16, whose
    /// decode and prefill follow one arithmetic order, in one call; the others in calls of fewer rows than
    /// start their prefill phase (their decode kernels compute each row alike however many share a call).
    /// `Model::step`'s test holds every path to this.
    pub fn forward_decode(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        match &self.imp {
            Imp::W4a16(_) | Imp::W8a16(_) | Imp::W4a8(_) | Imp::Int8(_) => self.run(x, m, out, true),
            _ => {
                let per_call = self.prefill_from.saturating_sub(1).max(1);
                let mut s = 0;
                while s < m {
                    let r = per_call.min(m - s);
                    self.forward(&x[s * self.k..(s + r) * self.k], r, &mut out[s * self.n..(s + r) * self.n])?;
                    s += r;
                }
                Ok(())
            }
        }
    }

    /// `out[m][n] = x[m][k]·Wᵀ (+ bias)`.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
        self.run(x, m, out, false)
    }

    /// [`Linear::forward`]; with `decode_rows`, W4A16 and W4A8 run their decode kernels for any `m`.
    fn run(&self, x: &[f32], m: usize, out: &mut [f32], decode_rows: bool) -> Result<()> {
        let permuted;
        let x = match &self.perm {
            Some(p) if x.len() == m * self.k => {
                permuted =
                    x.chunks_exact(self.k).flat_map(|row| p.iter().map(|&i| row[i as usize])).collect::<Vec<f32>>();
                &permuted[..]
            }
            _ => x,
        };
        let run = |out: &mut [f32]| -> std::result::Result<KernelId, int4_kernels::KernelError> {
            match &self.imp {
                Imp::Dense(d) => d.forward(x, m, out),
                Imp::W4a16(l) if decode_rows => l.decode_rows_exact(x, m, out).map(|()| l.kernels().for_rows(1)),
                Imp::W4a16(l) => l.forward(x, m, out),
                Imp::Wna16(l) => l.forward(x, m, out),
                Imp::W4a8(l) if decode_rows => l.forward_decode(x, m, out),
                Imp::W4a8(l) => l.forward(x, m, out),
                Imp::Int8(l) if decode_rows => l.forward_decode(x, m, out),
                Imp::Int8(l) => l.forward(x, m, out),
                Imp::W8a16(l) => l.forward(x, m, out),
            }
        };
        let ran = if self.n_padded == self.n {
            run(out).map_err(at("linear"))?
        } else {
            let mut wide = vec![0.0f32; m * self.n_padded];
            let ran = run(&mut wide).map_err(at("linear"))?;
            for r in 0..m {
                out[r * self.n..(r + 1) * self.n].copy_from_slice(&wide[r * self.n_padded..r * self.n_padded + self.n]);
            }
            ran
        };
        let index = KernelId::ALL.iter().position(|&k| k == ran).map_or(0, |i| i + 1);
        self.dispatched[usize::from(m >= self.prefill_from && !decode_rows)].store(index as u8, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use int4_kernels::isa::IsaLevel;
    use int4_kernels::w4a8::W4A8Kernel;
    use int4_layout::Codes;

    use super::*;

    fn w4a8_numerics() -> Numerics {
        let kernels = choice::best(W4A8Kernel::spec(), &IsaCaps::unrestricted().with_max_level(IsaLevel::Portable))
            .expect("the portable W4A8 kernel binds anywhere");
        Numerics::W4a8 { group: GroupSize::G32, kernels, activations: ActivationScales::PerGroup, head: HeadBits::Four }
    }

    /// A layer whose scales and float zeros are all f16 values (a GGUF's) stores them as f16 sections and
    /// reads them back in place to the same outputs; an artifact holding a table at both widths is refused;
    /// scales found at load in f32 keep the f32 section.
    #[test]
    fn parameter_tables_are_stored_at_the_width_their_values_take() {
        let (n, k) = (32, 64);
        let codes = Codes::from_fn(n, k, |r, c| ((r * 3 + c * 5) % 16) as u8).unwrap();
        let groups = 2;
        let scale: Vec<f32> = (0..n * groups).map(|i| (1 + i % 7) as f32 / 256.0).collect();
        let zero: Vec<f32> = (0..n * groups).map(|i| (i % 5) as f32 / 64.0 - 0.03125).collect();
        let params = GroupParams::new(n, k, GroupSize::G32, scale, zero).unwrap();
        let q = QuantLinear { codes, params, zeros: IntegerZeros::Absent, perm: None };
        let numerics = w4a8_numerics();
        let sections = Linear::pack_codes("l", q.clone(), numerics).unwrap();
        let names: Vec<&str> = sections.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["l.w4a8", "l.w4a8_scales_f16", "l.w4a8_offsets_f16"]);
        let shared: Vec<(String, SharedBytes)> = sections.into_iter().map(|(s, b)| (s, b.into())).collect();
        let get = |s: &str| shared.iter().find(|(n, _)| n == s).map(|(_, b)| b.clone());
        let layer = Linear::from_sections("l", n, k, None, numerics, &get).unwrap();
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.3).sin()).collect();
        let mut got = vec![0.0f32; n];
        layer.forward(&x, 1, &mut got).unwrap();
        let mut want = vec![0.0f32; n];
        Linear::build_quantized("l", q, None, numerics).unwrap().forward(&x, 1, &mut want).unwrap();
        assert_eq!(got, want);
        assert!(got.iter().any(|&v| v != 0.0));

        for part in ["w4a8_scales", "w4a8_offsets"] {
            let both = |s: &str| if s == format!("l.{part}") { get(&format!("l.{part}_f16")) } else { get(s) };
            let e = Linear::from_sections("l", n, k, None, numerics, &both).unwrap_err().to_string();
            assert!(e.contains(&format!("\"{part}\" at both 32 and 16 bits")), "{e}");
        }

        // 8-bit codes with f16 scales (a GGUF's Q8_0) on W4A8: the low plane's scales as f16, refused at both.
        let (n8, k8) = (16, 64);
        let codes: Vec<i8> = (0..n8 * k8).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
        let scales: Vec<f32> = (0..n8 * 2).map(|i| (1 + i % 9) as f32 / 1024.0).collect();
        let eight = numerics.for_eight_bit();
        let q8 = Int8Codes { n: n8, k: k8, codes, scales };
        let sections = Linear::pack_int8("e", q8, eight).unwrap();
        let names: Vec<&str> = sections.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["e.int8_hi", "e.int8_lo", "e.int8_scales_f16"]);
        let shared: Vec<(String, SharedBytes)> = sections.into_iter().map(|(s, b)| (s, b.into())).collect();
        let get8 = |s: &str| shared.iter().find(|(n, _)| n == s).map(|(_, b)| b.clone());
        assert!(Linear::from_sections("e", n8, k8, None, eight, &get8).is_ok());
        let both = |s: &str| if s == "e.int8_scales" { get8("e.int8_scales_f16") } else { get8(s) };
        let e = Linear::from_sections("e", n8, k8, None, eight, &both).unwrap_err().to_string();
        assert!(e.contains("\"int8_scales\" at both 32 and 16 bits"), "{e}");

        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) as f32 * 0.001).sin() * 0.1).collect();
        let names: Vec<String> = Linear::pack("m", w, n, k, numerics).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(names, ["m.w4a8", "m.w4a8_scales", "m.w4a8_offsets"]);
    }
}
