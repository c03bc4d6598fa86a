//! The policy: a pure function from (snapshot, checkpoint kind, priority, overrides) to a [`Plan`].
//!
//! Candidate paths are tried fastest first; each one the machine, the checkpoint, the priority, a cap or
//! this build cannot honour is recorded with the reason, so `int4 probe` can say why a faster path was not
//! taken. The ladder (see `docs/policy.md` for the measurements behind it):
//!
//! 1. `w4a8-amx` — GPTQ checkpoints, speed priority, AMX-INT8 usable (CPUID, XCR0, permission): AMX tiles for
//!    prefill, AVX-512 VNNI for decode (AMX does not help M = 1).
//! 2. `w4a16-amx-bf16` — AMX-BF16 tiles for the W4A16 prefill.
//! 3. `w4a8-vnni` — GPTQ checkpoints, speed priority, AVX-512 VNNI.
//! 4. `w4a16-avx512` — AVX-512 F/BW/VL: the AVX-512 decode GEMV over 64-channel tinygemm blocks, and a
//!    `vdpbf16ps` decode and prefill where the CPU has AVX512-BF16 (f32 FMA where it does not).
//! 5. `w4a8-avx2` — GPTQ checkpoints, speed priority, AVX2 (`vpmaddubsw`).
//! 6. `w4a16-avx2` — AVX2 + FMA: decode GEMV and dequantizing FMA prefill.
//! 7. `wna16-portable` — anything, including other architectures.
//!
//! Rung 2 decodes with the AVX2 kernel and prefills
//! on AMX-BF16 tiles (`direct_dequant: false` keeps the AVX2 split-halves prefill). Automatically, W4A8 is
//! chosen for GPTQ checkpoints (integer zero points): a `cpu_int4` checkpoint is a W4A16 export and stays
//! W4A16. Forced (`--path w4a8`), W4A8 takes any checkpoint: `cpu_int4`'s float zeros run as the kernels'
//! float offsets, and an unquantized checkpoint is quantized at load on the same float-zero grid as W4A16.

use int4_kernels::KernelId;
use int4_kernels::isa::IsaLevel;
use serde::{Deserialize, Serialize};

use crate::snapshot::{AmxPermission, CpuSnapshot};

/// What kind of checkpoint is being loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// Unquantized (bf16/f16/f32); quantized to W4A16 at load unless the bf16 path is asked for.
    Bf16,
    /// `cpu_int4`: float scales and zeros.
    CpuInt4,
    /// GPTQ `sym: true` (zero point 8).
    GptqSym,
    /// GPTQ `sym: false` (integer zero points).
    GptqAsym,
}

impl CheckpointKind {
    /// Every kind, for tables.
    pub const ALL: [CheckpointKind; 4] =
        [CheckpointKind::Bf16, CheckpointKind::CpuInt4, CheckpointKind::GptqSym, CheckpointKind::GptqAsym];

    fn integer_zeros(self) -> bool {
        matches!(self, CheckpointKind::GptqSym | CheckpointKind::GptqAsym)
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

/// A path the user may force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathChoice {
    /// Let the policy choose.
    Auto,
    /// 4-bit weights, bf16 activations.
    W4a16,
    /// 4-bit weights, int8 activations.
    W4a8,
    /// The portable fallback.
    Wna16,
    /// Unquantized bf16 weights.
    Bf16,
}

/// User and checkpoint overrides. Precedence for `dequant_threshold` and `direct_dequant`: the checkpoint's
/// key, then the plan's measured value, then the crate default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// A forced path.
    pub path: PathChoice,
    /// An ISA cap (`INT4_ISA`).
    pub isa_cap: Option<IsaLevel>,
    /// The checkpoint's `dequant_threshold`, if it has one.
    pub dequant_threshold: Option<usize>,
    /// The checkpoint's `direct_dequant`, if it has one.
    pub direct_dequant: Option<bool>,
}

impl Default for Overrides {
    fn default() -> Self {
        Overrides { path: PathChoice::Auto, isa_cap: None, dequant_threshold: None, direct_dequant: None }
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
}

/// One phase's kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelPlan {
    /// The kernel's name ([`KernelId::name`]).
    pub kernel: String,
    /// The ISA level it needs.
    pub isa: IsaLevel,
}

/// A path that was not taken, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The path's name.
    pub path: String,
    /// Why not.
    pub why: String,
}

/// The policy's decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The path's name (a rung of the ladder).
    pub path: String,
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

/// A forced path this machine or build cannot run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// The path asked for.
    pub path: String,
    /// What is missing.
    pub missing: String,
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "path {} cannot run here: {}", self.path, self.missing)
    }
}

impl std::error::Error for PolicyError {}

struct Rung {
    name: &'static str,
    /// `Err(reason)` when this machine/checkpoint/priority rules the rung out.
    check: fn(&CpuSnapshot, CheckpointKind, Priority) -> Result<(), String>,
    level: IsaLevel,
    /// `None` when this build has no kernels for the rung.
    kernels: Option<(KernelId, KernelId, PackedLayout)>,
    is_w4a8: bool,
    /// Taken only when its path is forced: the portable kernels of a SIMD layout, so `--path w4a16|w4a8`
    /// still runs its numerics (slowly, bit-identical for W4A8) on a CPU or under a cap without AVX2,
    /// while the automatic choice falls back to `wna16-portable`.
    forced_only: bool,
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

fn w4a8_gate(kind: CheckpointKind, prio: Priority) -> Result<(), String> {
    if prio == Priority::Fidelity {
        return Err("priority is fidelity: int8 activations cost accuracy".into());
    }
    if !kind.integer_zeros() {
        return Err(match kind {
            CheckpointKind::CpuInt4 => {
                "cpu_int4 is a W4A16 export, kept on W4A16 unless forced (`--path w4a8` runs its float zeros as offsets)"
                    .into()
            }
            _ => "W4A8 needs integer zero points: a GPTQ checkpoint, or `--path w4a8` to quantize at load".into(),
        });
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

const LADDER: [Rung; 9] = [
    Rung {
        name: "w4a8-amx",
        check: |s, k, p| {
            w4a8_gate(k, p)?;
            amx_reason(s, true)?;
            if !s.cpu.avx512vnni { Err("CPU lacks AVX-512 VNNI for the decode kernel".into()) } else { Ok(()) }
        },
        level: IsaLevel::Amx,
        kernels: Some((KernelId::W4a8Vnni, KernelId::W4a8Amx, PackedLayout::W4a8Vnni)),
        is_w4a8: true,
        forced_only: false,
    },
    Rung {
        name: "w4a16-amx-bf16",
        check: |s, _, _| amx_reason(s, false),
        level: IsaLevel::Amx,
        kernels: Some((KernelId::W4a16DecodeAvx2, KernelId::W4a16PrefillAmxBf16, PackedLayout::Tinygemm32)),
        is_w4a8: false,
        forced_only: false,
    },
    Rung {
        name: "w4a8-vnni",
        check: |s, k, p| {
            w4a8_gate(k, p)?;
            avx512_reason(s)?;
            if !s.cpu.avx512vnni { Err("CPU lacks AVX-512 VNNI".into()) } else { Ok(()) }
        },
        level: IsaLevel::Avx512,
        kernels: Some((KernelId::W4a8Vnni, KernelId::W4a8Vnni, PackedLayout::W4a8Vnni)),
        is_w4a8: true,
        forced_only: false,
    },
    Rung {
        name: "w4a16-avx512",
        check: |s, _, _| avx512_reason(s),
        level: IsaLevel::Avx512,
        kernels: Some((
            KernelId::W4a16DecodeAvx512Bf16,
            KernelId::W4a16PrefillDirectAvx512Bf16,
            PackedLayout::Tinygemm64,
        )),
        is_w4a8: false,
        forced_only: false,
    },
    Rung {
        name: "w4a8-avx2",
        check: |s, k, p| {
            w4a8_gate(k, p)?;
            avx2_reason(s)
        },
        level: IsaLevel::Avx2,
        kernels: Some((KernelId::W4a8Avx2, KernelId::W4a8Avx2, PackedLayout::W4a8Vnni)),
        is_w4a8: true,
        forced_only: false,
    },
    Rung {
        name: "w4a16-avx2",
        check: |s, _, _| avx2_reason(s),
        level: IsaLevel::Avx2,
        kernels: Some((KernelId::W4a16DecodeAvx2, KernelId::W4a16PrefillDirectAvx2, PackedLayout::Tinygemm32)),
        is_w4a8: false,
        forced_only: false,
    },
    Rung {
        name: "w4a8-portable",
        check: |_, k, p| w4a8_gate(k, p),
        level: IsaLevel::Portable,
        kernels: Some((KernelId::W4a8Portable, KernelId::W4a8Portable, PackedLayout::W4a8Vnni)),
        is_w4a8: true,
        forced_only: true,
    },
    Rung {
        name: "w4a16-portable",
        check: |_, _, _| Ok(()),
        level: IsaLevel::Portable,
        kernels: Some((KernelId::W4a16DecodePortable, KernelId::W4a16PrefillPortable, PackedLayout::Tinygemm32)),
        is_w4a8: false,
        forced_only: true,
    },
    Rung {
        name: "wna16-portable",
        check: |_, _, _| Ok(()),
        level: IsaLevel::Portable,
        kernels: Some((KernelId::Wna16Portable, KernelId::Wna16Portable, PackedLayout::RowMajor)),
        is_w4a8: false,
        forced_only: false,
    },
];

/// The prefill kernel a rung runs: its direct kernel, or the split-halves one with `direct_dequant: false`;
/// the AVX-512 rung's `vdpbf16ps` GEMM needs AVX512-BF16 and falls back to the f32-FMA GEMM without it.
fn prefill_kernel(rung_prefill: KernelId, direct: bool, s: &CpuSnapshot) -> KernelId {
    let prefill = match rung_prefill {
        KernelId::W4a16PrefillDirectAvx512Bf16 if !s.cpu.avx512bf16 => KernelId::W4a16PrefillDirectAvx2,
        k => k,
    };
    match (prefill, direct) {
        (KernelId::W4a16PrefillDirectAvx2, false) => KernelId::W4a16PrefillHalvesAvx2,
        (KernelId::W4a16PrefillDirectAvx512Bf16, false) => KernelId::W4a16PrefillHalvesAvx512Bf16,
        (k, _) => k,
    }
}

/// The decode kernel a rung runs: the AVX-512 rung's `vdpbf16ps` decode needs AVX512-BF16 and keeps the
/// f32-FMA AVX-512 decode without it.
fn decode_kernel(rung_decode: KernelId, s: &CpuSnapshot) -> KernelId {
    match rung_decode {
        KernelId::W4a16DecodeAvx512Bf16 if !s.cpu.avx512bf16 => KernelId::W4a16DecodeAvx512,
        k => k,
    }
}

/// The plan for this machine, checkpoint and priority.
pub fn plan(s: &CpuSnapshot, kind: CheckpointKind, priority: Priority, o: &Overrides) -> Result<Plan, PolicyError> {
    let default_threshold = int4_kernels::w4a16::DEFAULT_DEQUANT_THRESHOLD;
    let threshold = o.dequant_threshold.unwrap_or(default_threshold);
    let direct = o.direct_dequant.unwrap_or(true);
    let mut rejected = Vec::new();

    if o.path == PathChoice::Bf16 {
        let avx2 = avx2_reason(s).is_ok() && o.isa_cap.is_none_or(|c| c >= IsaLevel::Avx2);
        let (id, level) = if avx2 {
            (KernelId::DenseBf16GemmAvx2, IsaLevel::Avx2)
        } else {
            (KernelId::DensePortable, IsaLevel::Portable)
        };
        let decode = if avx2 { KernelId::DenseBf16GemvAvx2 } else { KernelId::DensePortable };
        return Ok(Plan {
            path: "bf16".into(),
            decode: KernelPlan { kernel: decode.name().into(), isa: level },
            prefill: KernelPlan { kernel: id.name().into(), isa: level },
            layout: PackedLayout::Bf16,
            dequant_threshold: int4_kernels::dense::DENSE_GEMV_MAX_ROWS + 1,
            direct_dequant: true,
            rejected,
        });
    }

    for rung in &LADDER {
        let forced_out = match o.path {
            PathChoice::W4a8 => !rung.is_w4a8,
            PathChoice::W4a16 => rung.is_w4a8 || rung.name == "wna16-portable",
            PathChoice::Wna16 => rung.name != "wna16-portable",
            _ => rung.forced_only,
        };
        if forced_out {
            continue;
        }
        // Forcing W4A8 overrides the priority and takes any checkpoint: float zeros (cpu_int4, or an
        // unquantized checkpoint quantized at load on the float-zero grid) run as the kernels' float offsets.
        let (kind, priority) = match (o.path, kind) {
            (PathChoice::W4a8, CheckpointKind::Bf16 | CheckpointKind::CpuInt4) => {
                (CheckpointKind::GptqAsym, Priority::Speed)
            }
            (PathChoice::W4a8, _) => (kind, Priority::Speed),
            _ => (kind, priority),
        };
        let why = if let Err(why) = (rung.check)(s, kind, priority) {
            Some(why)
        } else if o.isa_cap.is_some_and(|cap| rung.level > cap) {
            Some(format!("capped by INT4_ISA={}", o.isa_cap.map_or("", |c| c.name())))
        } else if rung.kernels.is_none() {
            Some("this build has no kernels for it yet".into())
        } else {
            None
        };
        match (why, rung.kernels) {
            (Some(why), _) => rejected.push(Rejection { path: rung.name.into(), why }),
            (None, Some((decode, prefill, layout))) => {
                return Ok(Plan {
                    path: rung.name.into(),
                    decode: KernelPlan { kernel: decode_kernel(decode, s).name().into(), isa: rung.level },
                    prefill: KernelPlan { kernel: prefill_kernel(prefill, direct, s).name().into(), isa: rung.level },
                    layout,
                    dequant_threshold: threshold,
                    direct_dequant: direct,
                    rejected,
                });
            }
            (None, None) => unreachable!("a rung without kernels is rejected above"),
        }
    }
    let forced = match o.path {
        PathChoice::W4a8 => "w4a8",
        PathChoice::W4a16 => "w4a16",
        PathChoice::Wna16 => "wna16",
        _ => "auto",
    };
    Err(PolicyError {
        path: forced.into(),
        missing: rejected.iter().map(|r| format!("{}: {}", r.path, r.why)).collect::<Vec<_>>().join("; "),
    })
}
