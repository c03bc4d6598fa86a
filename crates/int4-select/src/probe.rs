//! Building a [`CpuSnapshot`]: from the live CPU, or from recorded CPUID leaves (tests, other machines).
//!
//! Everything goes through `raw-cpuid`'s [`CpuIdReader`], so a recorded dump replays through exactly the
//! code that reads the live CPU. XCR0 and the AMX permission are inputs too, because a dump cannot record
//! what an OS enabled or granted.

use std::collections::HashMap;
use std::sync::OnceLock;

use raw_cpuid::{CpuId, CpuIdReader, CpuIdResult};

use crate::snapshot::{AmxPermission, Caches, CpuFeatures, CpuSnapshot, OsSupport, TileLimits};

/// Recorded CPUID leaves; any leaf not recorded reads as zeros (as a CPU reports an unsupported leaf).
#[derive(Clone, Debug, Default)]
pub struct RecordedCpuid {
    leaves: HashMap<(u32, u32), CpuIdResult>,
}

impl RecordedCpuid {
    /// From `(leaf, subleaf, eax, ebx, ecx, edx)` rows.
    pub fn new(rows: impl IntoIterator<Item = (u32, u32, u32, u32, u32, u32)>) -> Self {
        let leaves =
            rows.into_iter().map(|(l, s, eax, ebx, ecx, edx)| ((l, s), CpuIdResult { eax, ebx, ecx, edx })).collect();
        RecordedCpuid { leaves }
    }

    /// Parses the fixture format: `{"leaves": [{"leaf": "0x7", "subleaf": "0x0", "eax": "0x..", ...}]}`.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("CPUID dump is not JSON: {e}"))?;
        let leaves = v["leaves"].as_array().ok_or("CPUID dump has no \"leaves\" array")?;
        let hex = |x: &serde_json::Value, field: &str| -> Result<u32, String> {
            let s = x[field].as_str().ok_or(format!("leaf entry lacks \"{field}\""))?;
            u32::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("bad {field} {s:?}: {e}"))
        };
        let mut rows = Vec::new();
        for l in leaves {
            rows.push((
                hex(l, "leaf")?,
                hex(l, "subleaf")?,
                hex(l, "eax")?,
                hex(l, "ebx")?,
                hex(l, "ecx")?,
                hex(l, "edx")?,
            ));
        }
        Ok(RecordedCpuid::new(rows))
    }

    /// The XCR0 an OS that enables every user state the CPU supports would set (leaf 0xD, subleaf 0,
    /// EDX:EAX), or `None` when the CPU has no XSAVE (no leaf 0xD).
    pub fn xcr0_all_enabled(&self) -> Option<u64> {
        let r = self.leaves.get(&(0xD, 0))?;
        let osxsave = self.leaves.get(&(1, 0)).is_some_and(|l| l.ecx & (1 << 27) != 0);
        osxsave.then(|| (u64::from(r.edx) << 32) | u64::from(r.eax))
    }
}

impl CpuIdReader for RecordedCpuid {
    fn cpuid2(&self, eax: u32, ecx: u32) -> CpuIdResult {
        self.leaves.get(&(eax, ecx)).copied().unwrap_or(CpuIdResult { eax: 0, ebx: 0, ecx: 0, edx: 0 })
    }
}

/// Reads features, caches and tile limits through any CPUID reader; XCR0 and the AMX permission are given.
pub fn snapshot_from<R: CpuIdReader>(
    reader: R,
    source: &str,
    xcr0: Option<u64>,
    amx_permission: AmxPermission,
) -> CpuSnapshot {
    let cpuid = CpuId::with_cpuid_reader(reader.clone());
    let fi = cpuid.get_feature_info();
    let ef = cpuid.get_extended_feature_info();
    let leaf7_1 = reader.cpuid2(7, 1);
    let max_leaf = reader.cpuid2(0, 0).eax;
    let cpu = CpuFeatures {
        sse42: fi.as_ref().is_some_and(|f| f.has_sse42()),
        avx: fi.as_ref().is_some_and(|f| f.has_avx()),
        fma: fi.as_ref().is_some_and(|f| f.has_fma()),
        f16c: fi.as_ref().is_some_and(|f| f.has_f16c()),
        osxsave: fi.as_ref().is_some_and(|f| f.has_oxsave()),
        avx2: ef.as_ref().is_some_and(|f| f.has_avx2()),
        avx512f: ef.as_ref().is_some_and(|f| f.has_avx512f()),
        avx512bw: ef.as_ref().is_some_and(|f| f.has_avx512bw()),
        avx512vl: ef.as_ref().is_some_and(|f| f.has_avx512vl()),
        avx512vnni: ef.as_ref().is_some_and(|f| f.has_avx512vnni()),
        amx_tile: ef.as_ref().is_some_and(|f| f.has_amx_tile()),
        amx_int8: ef.as_ref().is_some_and(|f| f.has_amx_int8()),
        amx_bf16: ef.as_ref().is_some_and(|f| f.has_amx_bf16()),
        // Leaf 7 subleaf 1, EAX: bit 4 AVX-VNNI, bit 5 AVX512-BF16 (only meaningful if leaf 7 exists).
        avx_vnni: max_leaf >= 7 && leaf7_1.eax & (1 << 4) != 0,
        avx512bf16: max_leaf >= 7 && leaf7_1.eax & (1 << 5) != 0,
    };
    let (family, model, stepping) = fi
        .as_ref()
        .map_or((0, 0, 0), |f| (u32::from(f.family_id()), u32::from(f.model_id()), u32::from(f.stepping_id())));
    let vendor = cpuid.get_vendor_info().map_or_else(|| "unknown".to_string(), |v| v.as_str().to_string());
    let model_name = cpuid.get_processor_brand_string().map_or_else(String::new, |b| b.as_str().trim().to_string());
    let mut caches = Caches::default();
    if let Some(params) = cpuid.get_cache_parameters() {
        for c in params {
            let size = (c.associativity() * c.physical_line_partitions() * c.coherency_line_size() * c.sets()) as u64;
            match (c.level(), c.cache_type()) {
                (1, raw_cpuid::CacheType::Data) => caches.l1d = Some(size),
                (2, _) => caches.l2 = Some(size),
                (3, _) => caches.l3 = Some(size),
                _ => {}
            }
        }
    }
    let tile_limits = (cpu.amx_tile && max_leaf >= 0x1E).then(|| {
        let p1 = reader.cpuid2(0x1D, 1);
        let t = reader.cpuid2(0x1E, 0);
        TileLimits {
            max_names: (p1.ebx >> 16) as u16,
            bytes_per_row: (p1.ebx & 0xFFFF) as u16,
            max_rows: (p1.ecx & 0xFFFF) as u16,
            tmul_max_k: (t.ebx & 0xFF) as u8,
            tmul_max_n: ((t.ebx >> 8) & 0xFFFF) as u16,
        }
    });
    CpuSnapshot {
        source: source.to_string(),
        arch: "x86_64".to_string(),
        vendor,
        model_name,
        family_model_stepping: (family, model, stepping),
        logical_cores: None,
        physical_cores: None,
        caches,
        cpu,
        os: OsSupport::from_xcr0(if cpu.osxsave { xcr0 } else { None }),
        amx_permission,
        tile_limits,
    }
}

/// The snapshot of a machine that is not x86-64 (no CPUID at all): every x86 feature off.
pub fn non_x86_snapshot(arch: &str, source: &str) -> CpuSnapshot {
    CpuSnapshot {
        source: source.to_string(),
        arch: arch.to_string(),
        vendor: "unknown".to_string(),
        model_name: String::new(),
        family_model_stepping: (0, 0, 0),
        logical_cores: None,
        physical_cores: None,
        caches: Caches::default(),
        cpu: CpuFeatures::default(),
        os: OsSupport::default(),
        amx_permission: AmxPermission::NotApplicable(format!("{arch} has no AMX")),
        tile_limits: None,
    }
}

/// Asks Linux for the AMX tile data state, once per process; later calls return the first outcome.
///
/// Call it early, before worker threads exist: the kernel refuses the request if any existing thread's
/// signal stack is too small for the tile state. Every failure is "no AMX" with the reason recorded,
/// never a crash. `cpu_has_amx` and `os_has_amx` come from CPUID and XCR0; without them nothing is asked.
pub fn request_amx_permission(cpu_has_amx: bool, os_has_amx: bool) -> AmxPermission {
    static OUTCOME: OnceLock<AmxPermission> = OnceLock::new();
    OUTCOME
        .get_or_init(|| {
            if !cpu_has_amx {
                return AmxPermission::NotApplicable("CPUID reports no AMX-TILE".into());
            }
            if !os_has_amx {
                return AmxPermission::NotApplicable("XCR0 does not enable TILECFG/TILEDATA (bits 17, 18)".into());
            }
            request_linux()
        })
        .clone()
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_linux() -> AmxPermission {
    use int4_kernels::os::{
        ARCH_GET_XCOMP_PERM, ARCH_GET_XCOMP_SUPP, XFEATURE_XTILEDATA, arch_prctl_get, arch_prctl_request,
    };
    let bit = 1u64 << XFEATURE_XTILEDATA;
    match arch_prctl_get(ARCH_GET_XCOMP_SUPP) {
        Err(e) => return AmxPermission::Refused(format!("ARCH_GET_XCOMP_SUPP failed (errno {e})")),
        Ok(s) if s & bit == 0 => return AmxPermission::Refused("the kernel does not support XTILEDATA".into()),
        Ok(_) => {}
    }
    if let Err(e) = arch_prctl_request(XFEATURE_XTILEDATA) {
        return AmxPermission::Refused(format!("ARCH_REQ_XCOMP_PERM(18) failed (errno {e})"));
    }
    match arch_prctl_get(ARCH_GET_XCOMP_PERM) {
        Ok(p) if p & bit != 0 => AmxPermission::Granted,
        Ok(_) => AmxPermission::Refused("ARCH_GET_XCOMP_PERM does not show XTILEDATA after the request".into()),
        Err(e) => AmxPermission::Refused(format!("ARCH_GET_XCOMP_PERM failed (errno {e})")),
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_linux() -> AmxPermission {
    AmxPermission::NotApplicable("AMX permission is only requested on Linux".into())
}

/// Probes the machine this process runs on (requesting the AMX permission if the CPU and OS have AMX).
pub fn live() -> CpuSnapshot {
    #[cfg(target_arch = "x86_64")]
    {
        let reader = raw_cpuid::CpuIdReaderNative;
        // Read only where CPUID reports OSXSAVE (`int4_kernels::os` checks it on the live CPU).
        let xcr0 = int4_kernels::os::xcr0();
        let pre = snapshot_from(reader, "live", xcr0, AmxPermission::NotApplicable(String::new()));
        let perm = request_amx_permission(pre.cpu.amx_tile, pre.os.amx_state);
        let mut snap = CpuSnapshot { amx_permission: perm, ..pre };
        snap.logical_cores = std::thread::available_parallelism().ok().map(|n| n.get());
        snap.physical_cores = physical_cores();
        snap
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut s = non_x86_snapshot(std::env::consts::ARCH, "live");
        s.logical_cores = std::thread::available_parallelism().ok().map(|n| n.get());
        s
    }
}

/// Distinct (package, core) pairs in sysfs, where readable.
fn physical_cores() -> Option<usize> {
    let mut seen = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("cpu") || !name[3..].chars().all(|c| c.is_ascii_digit()) || name.len() == 3 {
            continue;
        }
        let topo = entry.path().join("topology");
        let pkg = std::fs::read_to_string(topo.join("physical_package_id")).ok()?;
        let core = std::fs::read_to_string(topo.join("core_id")).ok()?;
        seen.insert((pkg.trim().to_string(), core.trim().to_string()));
    }
    (!seen.is_empty()).then_some(seen.len())
}
