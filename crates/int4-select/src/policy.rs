//! The policy: a pure function from (snapshot, checkpoint kind, priority, overrides) to a [`Plan`].
//!
//! Candidate paths are tried fastest first; each one the machine, the checkpoint, the priority, a cap or
//! this build cannot honour is recorded with the reason, so `int4 probe` can say why a faster path was not
//! taken. The ladder (see `docs/policy.md` for the measurements behind it):
//!
//! 1. `w4a8-amx` — speed priority where the W4A8 rule allows it, AMX-INT8 usable (CPUID, XCR0,
//!    permission): AMX tiles for prefill, AVX-512 VNNI for decode (AMX does not help M = 1).
//! 2. `w4a16-amx-bf16` — AMX-BF16 tiles for the W4A16 prefill.
//! 3. `w4a8-vnni` — speed priority where the W4A8 rule allows it, AVX-512 VNNI.
//! 4. `w4a16-avx512` — AVX-512 F/BW/VL: the AVX-512 decode GEMV over 64-channel tinygemm blocks, and a
//!    `vdpbf16ps` decode and prefill where the CPU has AVX512-BF16 (f32 FMA where it does not).
//! 5. `w4a8-avx2` — speed priority where the W4A8 rule allows it, AVX2 (`vpmaddubsw`).
//! 6. `w4a16-avx2` — AVX2 + FMA: decode GEMV and dequantizing FMA prefill.
//! 7. `wna16-portable` — anything, including other architectures.
//!
//! A rung decides *whether* a family of kernels may run here (and says why not); the kernels themselves
//! come from [`int4_kernels::choice::choose`] on the snapshot's features under the caps, the same function
//! the layers call on the live CPU, so the plan names the kernels a layer will bind. Rung 2 prefills on
//! AMX-BF16 tiles and decodes with the best W4A16 decode the CPU has (`direct_dequant: false` keeps the
//! split-halves prefill).
//!
//! The W4A8 rule (`w4a8_gate`): speed priority takes W4A8 only where it keeps the model as well as W4A16
//! at the same grid and head (mean KL from the unquantized model within 10%), decided statically from the
//! grid: per-group activation scales at any group, per-token ones only from group 128 up, and never for a
//! checkpoint quantized at load at group 32 with an 8-bit head, where W4A16 keeps nearly all of the model
//! and int8 activations would be most of the error. docs/policy.md has the measurements. Forced
//! (`--path w4a8`), W4A8 takes any checkpoint: float zeros run as the kernels' float offsets, and an
//! unquantized checkpoint is quantized at load on the same float-zero grid as W4A16.
//!
//! The KV cache's type ([`kv_type`]) is the policy's too: f16 with speed priority, f32 with fidelity
//! priority and on the f32 reference path (docs/policy.md, "The KV cache's type").

use int4_kernels::KernelId;
use int4_kernels::choice::{KernelChoice, LayerSpec, choose};
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::w4a8::ActivationScales;
use int4_layout::GroupSize;
use int4_layout::tinygemm::TinygemmBlock;
use serde::{Deserialize, Serialize};

use crate::snapshot::{AmxPermission, CpuSnapshot};

/// What kind of checkpoint is being loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// Unquantized (bf16/f16/f32): quantized at load on the runtime's grid (`Overrides::group`,
    /// `Overrides::head_bits`) for the path the plan takes, or run as it is on the bf16 and f32 paths.
    Bf16,
    /// `cpu_int4`: float scales and zeros.
    CpuInt4,
    /// GPTQ `sym: true` (zero point 8).
    GptqSym,
    /// GPTQ `sym: false` (integer zero points).
    GptqAsym,
    /// Decoder layers all stored in more than 4 bits (a GGUF's Q8_0, Q5_0, Q6_K): they run on the 8-bit
    /// kernels of the path taken.
    EightBit,
}

impl CheckpointKind {
    /// Every kind, for tables.
    pub const ALL: [CheckpointKind; 5] = [
        CheckpointKind::Bf16,
        CheckpointKind::CpuInt4,
        CheckpointKind::GptqSym,
        CheckpointKind::GptqAsym,
        CheckpointKind::EightBit,
    ];

    /// Whether the weights arrive unquantized and are quantized at load on the runtime's grid.
    pub fn quantized_at_load(self) -> bool {
        self == CheckpointKind::Bf16
    }
}

/// How many bits the packed paths give a head the checkpoint stores unquantized (a head a quantized
/// checkpoint stores runs as stored, and the policy is told the bits it is stored in).
/// The default, 8 bits, is measured in docs/quantize.md: on the default model the 4-bit head is most of
/// what separates a 4-bit run from the f32 one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeadBits {
    /// 4 bits, like every other linear layer: the smallest and fastest.
    Four,
    /// 8 bits (llama.cpp's Q8_0 grid; for a tied head, the embedding too). Costs one byte per weight,
    /// which on a small model with a large vocabulary is a sizeable share of a decode step's reads.
    #[default]
    Eight,
}

impl HeadBits {
    /// The number of bits.
    pub fn bits(self) -> u32 {
        match self {
            HeadBits::Four => 4,
            HeadBits::Eight => 8,
        }
    }

    /// 4 or 8 bits; `None` for any other count.
    pub fn from_bits(bits: u32) -> Option<Self> {
        match bits {
            4 => Some(HeadBits::Four),
            8 => Some(HeadBits::Eight),
            _ => None,
        }
    }
}

/// What the user cares about more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Fastest path.
    Speed,
    /// Most faithful 4-bit path (never int8 activations).
    Fidelity,
}

/// Which numerics to run: the policy's choice, or a path the user forces. The one type for this noun, in
/// the library, the command line (`--path`, `--ref`) and `int4 eval`; parsed from and printed as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunPath {
    /// What the policy picks for this machine and checkpoint.
    Auto,
    /// 4-bit weights, tinygemm kernels, bf16 (or f32) activations.
    W4a16,
    /// 4-bit weights, the portable fallback over row-major codes.
    Wna16,
    /// 4-bit weights, int8 activations (fastest, less faithful).
    W4a8,
    /// Unquantized weights as bf16.
    Bf16,
    /// Unquantized weights as f32 (the reference).
    F32,
}

impl RunPath {
    /// Every path, in the order `--help` lists them.
    pub const ALL: [RunPath; 6] =
        [RunPath::Auto, RunPath::W4a16, RunPath::Wna16, RunPath::W4a8, RunPath::Bf16, RunPath::F32];

    /// The name it is parsed from and printed as.
    pub fn name(self) -> &'static str {
        match self {
            RunPath::Auto => "auto",
            RunPath::W4a16 => "w4a16",
            RunPath::Wna16 => "wna16",
            RunPath::W4a8 => "w4a8",
            RunPath::Bf16 => "bf16",
            RunPath::F32 => "f32",
        }
    }

    /// Whether the path runs the weights unquantized (a reference for fidelity).
    pub fn is_exact(self) -> bool {
        matches!(self, RunPath::Bf16 | RunPath::F32)
    }
}

impl std::fmt::Display for RunPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A path name that is not one of [`RunPath::ALL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPath(pub String);

impl std::fmt::Display for UnknownPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = RunPath::ALL.iter().map(|p| p.name()).collect();
        write!(f, "unknown path {:?} (one of {})", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownPath {}

impl std::str::FromStr for RunPath {
    type Err = UnknownPath;

    fn from_str(s: &str) -> Result<Self, UnknownPath> {
        RunPath::ALL.into_iter().find(|p| p.name() == s.trim()).ok_or_else(|| UnknownPath(s.to_string()))
    }
}

/// How a KV cache stores the keys and values attention reads back at every later position.
///
/// At long contexts those reads are most of a decode step's memory traffic (on SmolLM2, 45 KiB a position
/// in f32: a 2,500-token sequence reads more KV than weights), so their width is a speed choice with a
/// fidelity price, and [`kv_type`] makes it by the priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    /// f32: exactly the values the layers computed.
    F32,
    /// IEEE half precision, rounded to nearest (llama.cpp's default cache type): half the bytes, each
    /// value kept to 11 significant bits (relative error at most 2⁻¹¹); a value beyond ±65504, infinities
    /// included, is stored as ±65504.
    F16,
}

impl KvType {
    /// Every type, in `--kv`'s order.
    pub const ALL: [KvType; 2] = [KvType::F32, KvType::F16];

    /// The name `--kv` takes and `int4 info` prints.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }

    /// Bytes one stored value takes.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A KV cache type name that is not one of [`KvType::ALL`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownKvType(pub String);

impl std::fmt::Display for UnknownKvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown KV cache type {:?}: expected f32 or f16", self.0)
    }
}

impl std::error::Error for UnknownKvType {}

impl std::str::FromStr for KvType {
    type Err = UnknownKvType;

    fn from_str(s: &str) -> Result<Self, UnknownKvType> {
        KvType::ALL.into_iter().find(|t| t.name() == s.trim()).ok_or_else(|| UnknownKvType(s.to_string()))
    }
}

/// The KV cache type for `priority` on `path`: f16 for speed (half the bytes attention reads; docs/policy.md
/// measures what it costs in KL), f32 for fidelity and on the f32 reference path, which exists to give the
/// unrounded model.
pub fn kv_type(priority: Priority, path: RunPath) -> KvType {
    match (priority, path) {
        (Priority::Fidelity, _) | (_, RunPath::F32) => KvType::F32,
        (Priority::Speed, _) => KvType::F16,
    }
}

/// User and checkpoint overrides, and the grid the load will run the 4-bit layers on (what the W4A8 rule
/// reads). Precedence for `dequant_threshold` and `direct_dequant`: the checkpoint's key, then the plan's
/// measured value, then the crate default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrides {
    /// A forced path.
    pub path: RunPath,
    /// What the process may use (`INT4_ISA`, `INT4_DISABLE`): the plan takes nothing it forbids.
    pub caps: IsaCaps,
    /// The checkpoint's `dequant_threshold`, if it has one.
    pub dequant_threshold: Option<usize>,
    /// The checkpoint's `direct_dequant`, if it has one.
    pub direct_dequant: Option<bool>,
    /// Input channels per scale and zero: the checkpoint's, or the load's for an unquantized checkpoint.
    pub group: GroupSize,
    /// The bits a head the checkpoint stores unquantized is quantized to at load (the rule reads it only
    /// for checkpoints quantized at load; a quantized checkpoint's head runs as stored).
    pub head_bits: HeadBits,
    /// How finely W4A8 would scale the activations.
    pub activation_scales: ActivationScales,
}

impl Default for Overrides {
    /// No override, under no cap, on the runtime's load defaults (group 32, an 8-bit head, per-group
    /// activation scales).
    fn default() -> Self {
        Overrides {
            path: RunPath::Auto,
            caps: IsaCaps::unrestricted(),
            dequant_threshold: None,
            direct_dequant: None,
            group: GroupSize::G32,
            head_bits: HeadBits::Eight,
            activation_scales: ActivationScales::PerGroup,
        }
    }
}

/// The packed form a plan's kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackedLayout {
    /// tinygemm, 64-channel blocks (PyTorch's AVX-512 packer).
    Tinygemm64,
    /// tinygemm, 32-channel blocks (PyTorch's AVX2 packer).
    Tinygemm32,
    /// Row-major nibbles.
    RowMajor,
    /// Unquantized bf16.
    Bf16,
    /// 4-bit codes in VNNI quad pairs per 16 channels, integer zero points (the W4A8 kernels).
    W4a8Vnni,
    /// Unquantized f32.
    F32,
}

/// One phase's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelPlan {
    /// The kernel (serialised as its name).
    pub kernel: KernelId,
    /// The ISA level it needs.
    pub isa: IsaLevel,
}

impl KernelPlan {
    fn of(kernel: KernelId) -> Self {
        KernelPlan { kernel, isa: kernel.level() }
    }
}

/// A rung of the ladder: a kernel family at an ISA level (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rung {
    /// W4A8 on AMX tiles, VNNI for decode.
    #[serde(rename = "w4a8-amx")]
    W4a8Amx,
    /// W4A16 prefill on AMX-BF16 tiles.
    #[serde(rename = "w4a16-amx-bf16")]
    W4a16AmxBf16,
    /// W4A8 on AVX-512 VNNI.
    #[serde(rename = "w4a8-vnni")]
    W4a8Vnni,
    /// W4A16 on AVX-512 (with AVX512-BF16 where present).
    #[serde(rename = "w4a16-avx512")]
    W4a16Avx512,
    /// W4A8 on AVX2.
    #[serde(rename = "w4a8-avx2")]
    W4a8Avx2,
    /// W4A16 on AVX2 + FMA.
    #[serde(rename = "w4a16-avx2")]
    W4a16Avx2,
    /// W4A8's portable kernels (forced paths only).
    #[serde(rename = "w4a8-portable")]
    W4a8Portable,
    /// W4A16's portable kernels (forced paths only).
    #[serde(rename = "w4a16-portable")]
    W4a16Portable,
    /// The portable wna16 fallback.
    #[serde(rename = "wna16-portable")]
    Wna16Portable,
    /// Unquantized weights as bf16, on the dense kernels.
    #[serde(rename = "bf16")]
    Bf16,
    /// Unquantized weights as f32, on the dense kernels.
    #[serde(rename = "f32")]
    F32,
}

impl Rung {
    /// The rung's name.
    pub fn name(self) -> &'static str {
        match self {
            Rung::W4a8Amx => "w4a8-amx",
            Rung::W4a16AmxBf16 => "w4a16-amx-bf16",
            Rung::W4a8Vnni => "w4a8-vnni",
            Rung::W4a16Avx512 => "w4a16-avx512",
            Rung::W4a8Avx2 => "w4a8-avx2",
            Rung::W4a16Avx2 => "w4a16-avx2",
            Rung::W4a8Portable => "w4a8-portable",
            Rung::W4a16Portable => "w4a16-portable",
            Rung::Wna16Portable => "wna16-portable",
            Rung::Bf16 => "bf16",
            Rung::F32 => "f32",
        }
    }
}

impl std::fmt::Display for Rung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A path that was not taken, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The rung.
    pub path: Rung,
    /// Why not.
    pub why: String,
}

/// The policy's decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The rung of the ladder taken.
    pub path: Rung,
    /// Kernel for decode (M below the threshold).
    pub decode: KernelPlan,
    /// Kernel for prefill (M at or above the threshold).
    pub prefill: KernelPlan,
    /// The layout to pack.
    pub layout: PackedLayout,
    /// Rows at or above which prefill runs.
    pub dequant_threshold: usize,
    /// Whether the prefill dequantizes from the packed layout (no second copy).
    pub direct_dequant: bool,
    /// Faster paths not taken.
    pub rejected: Vec<Rejection>,
}

impl Plan {
    /// The kernels as a choice a layer binds ([`KernelChoice::bind`]).
    pub fn kernels(&self) -> KernelChoice {
        KernelChoice { decode: self.decode.kernel, prefill: self.prefill.kernel, prefill_from: self.dequant_threshold }
    }
}

/// A forced path this machine or build cannot run: every rung of it, each with why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    path: RunPath,
    rejected: Vec<Rejection>,
}

impl PolicyError {
    /// The path asked for.
    pub fn path(&self) -> RunPath {
        self.path
    }

    /// Every rung of it that was tried, and why it cannot run.
    pub fn rejected(&self) -> &[Rejection] {
        &self.rejected
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why: Vec<String> = self.rejected.iter().map(|r| format!("{}: {}", r.path, r.why)).collect();
        write!(f, "path {} cannot run here: {}", self.path, why.join("; "))
    }
}

impl std::error::Error for PolicyError {}

/// The kernels a rung runs: its family, the layout it packs and the ISA level it stands for.
#[derive(Clone, Copy)]
enum Family {
    W4a16(TinygemmBlock),
    W4a8,
    Wna16,
}

struct Step {
    rung: Rung,
    /// `Err(reason)` when this machine, or (for a W4A8 rung) the W4A8 rule's verdict, rules the rung out.
    check: fn(&CpuSnapshot, &Result<(), String>) -> Result<(), String>,
    level: IsaLevel,
    family: Family,
    /// Taken only when its path is forced: the portable kernels of a SIMD layout, so `--path w4a16|w4a8`
    /// still runs its numerics (slowly, bit-identical for W4A8) on a CPU or under a cap without AVX2,
    /// while the automatic choice falls back to `wna16-portable`.
    forced_only: bool,
}

impl Step {
    fn is_w4a8(&self) -> bool {
        matches!(self.family, Family::W4a8)
    }

    fn layout(&self) -> PackedLayout {
        match self.family {
            Family::W4a16(TinygemmBlock::N64) => PackedLayout::Tinygemm64,
            Family::W4a16(TinygemmBlock::N32) => PackedLayout::Tinygemm32,
            Family::W4a8 => PackedLayout::W4a8Vnni,
            Family::Wna16 => PackedLayout::RowMajor,
        }
    }

    fn spec(&self, direct_dequant: bool, threshold: usize) -> LayerSpec {
        match self.family {
            Family::W4a16(block) => LayerSpec::W4a16 { block, direct_dequant, prefill_from: threshold },
            // The AMX kernel raises it to a full tile of rows ([`choose`]).
            Family::W4a8 => LayerSpec::W4a8 { prefill_from: threshold },
            Family::Wna16 => LayerSpec::Wna16 { prefill_from: threshold },
        }
    }
}

fn amx_reason(s: &CpuSnapshot, need_int8: bool) -> Result<(), String> {
    let c = &s.cpu;
    if s.arch != "x86_64" {
        return Err(format!("{} has no AMX", s.arch));
    }
    if !c.amx_tile || (need_int8 && !c.amx_int8) || (!need_int8 && !c.amx_bf16) {
        return Err(format!("CPU lacks AMX-TILE/{}", if need_int8 { "AMX-INT8" } else { "AMX-BF16" }));
    }
    if !s.os.amx_state {
        return Err("AMX present but the OS has not enabled the tile state in XCR0 (bits 17, 18)".into());
    }
    if let AmxPermission::Refused(why) | AmxPermission::NotApplicable(why) = &s.amx_permission {
        return Err(format!("AMX present but the tile-data permission was not granted: {why}"));
    }
    if !s.usable().avx512 {
        return Err("AMX present but AVX-512 is not usable (needed beside the tiles)".into());
    }
    Ok(())
}

fn avx512_reason(s: &CpuSnapshot) -> Result<(), String> {
    let c = &s.cpu;
    if !(c.avx512f && c.avx512bw && c.avx512vl) {
        return Err("CPU lacks AVX-512 F/BW/VL".into());
    }
    if !s.os.avx512_state {
        return Err(format!(
            "AVX-512 present but the OS has not enabled its state in XCR0 ({})",
            s.os.xcr0.map_or("unreadable".into(), |x| format!("{x:#x}"))
        ));
    }
    if !s.usable().avx2_fma {
        return Err("AVX2/FMA not usable".into());
    }
    Ok(())
}

/// Whether speed priority takes W4A8 for this checkpoint and grid: only where it keeps the model as well as
/// W4A16 does, "as well" meaning a mean KL from the unquantized model on the committed eval text within
/// 10% of W4A16's at the same group and head. The rule is static, a function of the grid alone; the
/// measurements behind each branch are in docs/policy.md ("W4A8 by evidence"). Float and integer zeros
/// measured alike (both run exactly on the W4A8 kernels), so the zero type does not enter.
fn w4a8_gate(kind: CheckpointKind, prio: Priority, o: &Overrides) -> Result<(), String> {
    if prio == Priority::Fidelity {
        return Err("priority is fidelity: int8 activations cost accuracy".into());
    }
    if kind == CheckpointKind::EightBit {
        return Err("its layers are stored in 8 bits, close enough to the model that int8 activations would be \
                    most of the error (a Q8_0 file's KL from its original is 3.6x W4A16's, docs/policy.md); \
                    --path w4a8 forces it"
            .into());
    }
    if kind.quantized_at_load() && o.group == GroupSize::G32 && o.head_bits == HeadBits::Eight {
        return Err("quantized at load at group 32 with an 8-bit head, W4A16 keeps nearly all of the model and \
                    int8 activations would be most of the error (on the default model W4A8's KL is 32x W4A16's, \
                    docs/policy.md); --path w4a8 forces it"
            .into());
    }
    let coarse = matches!(o.group, GroupSize::G128 | GroupSize::G256 | GroupSize::PerChannel);
    if o.activation_scales == ActivationScales::PerToken && !coarse {
        return Err(format!(
            "per-token activation scales at group {} move W4A8 11-54% further from the model than W4A16 \
             (docs/policy.md); per-group scales, the default, stay within 5%",
            o.group.to_checkpoint()
        ));
    }
    Ok(())
}

fn avx2_reason(s: &CpuSnapshot) -> Result<(), String> {
    if s.arch != "x86_64" {
        return Err(format!("{} is not x86-64", s.arch));
    }
    if !(s.cpu.avx2 && s.cpu.fma) {
        return Err("CPU lacks AVX2/FMA".into());
    }
    if !s.os.avx_state { Err("AVX present but the OS has not enabled its state in XCR0".into()) } else { Ok(()) }
}

const LADDER: [Step; 9] = [
    Step {
        rung: Rung::W4a8Amx,
        check: |s, w4a8| {
            w4a8.clone()?;
            amx_reason(s, true)?;
            if !s.cpu.avx512vnni { Err("CPU lacks AVX-512 VNNI for the decode kernel".into()) } else { Ok(()) }
        },
        level: IsaLevel::Amx,
        family: Family::W4a8,
        forced_only: false,
    },
    Step {
        rung: Rung::W4a16AmxBf16,
        check: |s, _| amx_reason(s, false),
        level: IsaLevel::Amx,
        family: Family::W4a16(TinygemmBlock::N64),
        forced_only: false,
    },
    Step {
        rung: Rung::W4a8Vnni,
        check: |s, w4a8| {
            w4a8.clone()?;
            avx512_reason(s)?;
            if !s.cpu.avx512vnni { Err("CPU lacks AVX-512 VNNI".into()) } else { Ok(()) }
        },
        level: IsaLevel::Avx512,
        family: Family::W4a8,
        forced_only: false,
    },
    Step {
        rung: Rung::W4a16Avx512,
        check: |s, _| avx512_reason(s),
        level: IsaLevel::Avx512,
        family: Family::W4a16(TinygemmBlock::N64),
        forced_only: false,
    },
    Step {
        rung: Rung::W4a8Avx2,
        check: |s, w4a8| {
            w4a8.clone()?;
            avx2_reason(s)
        },
        level: IsaLevel::Avx2,
        family: Family::W4a8,
        forced_only: false,
    },
    Step {
        rung: Rung::W4a16Avx2,
        check: |s, _| avx2_reason(s),
        level: IsaLevel::Avx2,
        family: Family::W4a16(TinygemmBlock::N32),
        forced_only: false,
    },
    Step {
        rung: Rung::W4a8Portable,
        check: |_, w4a8| w4a8.clone(),
        level: IsaLevel::Portable,
        family: Family::W4a8,
        forced_only: true,
    },
    Step {
        rung: Rung::W4a16Portable,
        check: |_, _| Ok(()),
        level: IsaLevel::Portable,
        family: Family::W4a16(TinygemmBlock::N32),
        forced_only: true,
    },
    Step {
        rung: Rung::Wna16Portable,
        check: |_, _| Ok(()),
        level: IsaLevel::Portable,
        family: Family::Wna16,
        forced_only: false,
    },
];

/// The plan for this machine, checkpoint and priority, under the overrides' caps and forced path and for
/// the grid they name (which W4A8's rule reads: `Overrides::default()` is the runtime's load defaults).
pub fn plan(s: &CpuSnapshot, kind: CheckpointKind, priority: Priority, o: &Overrides) -> Result<Plan, PolicyError> {
    let default_threshold = int4_kernels::w4a16::DEFAULT_DEQUANT_THRESHOLD;
    let threshold = o.dequant_threshold.unwrap_or(default_threshold);
    let direct = o.direct_dequant.unwrap_or(true);
    // What the kernels may use: the snapshot's features that the caps allow.
    let features = s.features().allowed_by(&o.caps);
    let mut rejected = Vec::new();
    // Forcing W4A8 overrides the priority and the rule, and takes any checkpoint: float zeros (cpu_int4,
    // GGUF Q4_1, or an unquantized checkpoint quantized at load on the float-zero grid) run as the
    // kernels' float offsets.
    let w4a8 = if o.path == RunPath::W4a8 { Ok(()) } else { w4a8_gate(kind, priority, o) };

    if o.path.is_exact() {
        let (rung, layout, bf16) = match o.path {
            RunPath::Bf16 => (Rung::Bf16, PackedLayout::Bf16, true),
            _ => (Rung::F32, PackedLayout::F32, false),
        };
        let c = choose(features, LayerSpec::Dense { bf16 });
        return Ok(Plan {
            path: rung,
            decode: KernelPlan::of(c.decode),
            prefill: KernelPlan::of(c.prefill),
            layout,
            dequant_threshold: c.prefill_from,
            direct_dequant: true,
            rejected,
        });
    }

    for step in &LADDER {
        let forced_out = match o.path {
            RunPath::W4a8 => !step.is_w4a8(),
            RunPath::W4a16 => step.is_w4a8() || step.rung == Rung::Wna16Portable,
            RunPath::Wna16 => step.rung != Rung::Wna16Portable,
            _ => step.forced_only,
        };
        if forced_out {
            continue;
        }
        let choice = choose(features.capped(step.level), step.spec(direct, threshold));
        let why = if let Err(why) = (step.check)(s, &w4a8) {
            Some(why)
        } else if step.level > o.caps.max_level() {
            Some(format!("capped by INT4_ISA={}", o.caps.max_level().name()))
        } else if choice.level() < step.level {
            // The CPU has the rung's features, but a cap took one of them away.
            let ideal = choose(s.features().capped(step.level), step.spec(direct, threshold));
            let lost = if ideal.decode.level() == step.level { ideal.decode } else { ideal.prefill };
            Some(format!("{lost} needs {}", lost.needs()))
        } else {
            None
        };
        match why {
            Some(why) => rejected.push(Rejection { path: step.rung, why }),
            None => {
                return Ok(Plan {
                    path: step.rung,
                    decode: KernelPlan::of(choice.decode),
                    prefill: KernelPlan::of(choice.prefill),
                    layout: step.layout(),
                    dequant_threshold: choice.prefill_from,
                    direct_dequant: direct,
                    rejected,
                });
            }
        }
    }
    Err(PolicyError { path: o.path, rejected })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_as_they_print() {
        for p in RunPath::ALL {
            assert_eq!(p.name().parse::<RunPath>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        let e = "int3".parse::<RunPath>().unwrap_err();
        assert!(e.to_string().contains("\"int3\"") && e.to_string().contains("w4a16"), "{e}");
        assert!(RunPath::F32.is_exact() && RunPath::Bf16.is_exact() && !RunPath::W4a16.is_exact());
    }
}
