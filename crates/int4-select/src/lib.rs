//! Hardware probe and path policy: which 4-bit path a device should take, why every faster path was
//! rejected, and a guarantee that the choice cannot raise SIGILL.
//!
//! * [`probe`] builds a [`CpuSnapshot`] from CPUID (through `raw-cpuid`), XCR0 and Linux's AMX permission —
//!   from the live CPU, or from recorded CPUID dumps of real CPUs (the tests' fixtures).
//! * [`policy::plan`] is a pure function of a snapshot, the checkpoint kind, the priority and the user's
//!   overrides: the kernel per phase, the layout to pack, `dequant_threshold`, and the rejections.
//! * [`snapshot_for_policy`] is the live probe, or the snapshot named by `INT4_CPU_PROFILE`: an override
//!   changes decisions only. Kernels are built through `int4-kernels`' capability tokens, which check the
//!   live CPU themselves, so a fake profile can make a plan that fails to build with a clear error, never one
//!   that executes an instruction the CPU lacks.
//!
//! The crate has no unsafe code: XCR0 and Linux's AMX permission are read through `int4_kernels::os`, the
//! one module that reads them for the kernels' capability tokens too.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod policy;
pub mod probe;
pub mod snapshot;

pub use policy::{
    CheckpointKind, HeadBits, KvType, Overrides, Plan, PolicyError, Priority, RunPath, Rung, kv_type, plan,
};
pub use snapshot::{AmxPermission, CpuSnapshot, Usable};

/// A CPU profile (`INT4_CPU_PROFILE`) that could not be loaded.
#[derive(Debug)]
pub struct ProfileError {
    path: String,
    kind: ProfileErrorKind,
}

/// Why a profile could not be loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProfileErrorKind {
    /// The file could not be read: missing, not a regular file, or over [`PROFILE_CAP`].
    File(int4_files::FileError),
    /// The file is not a snapshot as `int4 probe --json` writes it.
    Json(serde_json::Error),
}

impl ProfileError {
    /// The profile's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What went wrong.
    pub fn kind(&self) -> &ProfileErrorKind {
        &self.kind
    }
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            ProfileErrorKind::File(e) => write!(f, "CPU profile {}: {}", self.path, e.kind()),
            ProfileErrorKind::Json(e) => write!(f, "CPU profile {}: {e}", self.path),
        }
    }
}

impl std::error::Error for ProfileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ProfileErrorKind::File(e) => Some(e),
            ProfileErrorKind::Json(e) => Some(e),
        }
    }
}

/// The most bytes read from a CPU profile (a snapshot is a few KiB).
pub const PROFILE_CAP: u64 = 4 << 20;

/// Loads a snapshot saved as JSON (for example by `int4 probe --json`): a regular file of at most
/// [`PROFILE_CAP`] bytes.
pub fn load_profile(path: &str) -> Result<CpuSnapshot, ProfileError> {
    let err = |kind| ProfileError { path: path.into(), kind };
    let text = int4_files::read_text_capped(std::path::Path::new(path), PROFILE_CAP)
        .map_err(|e| err(ProfileErrorKind::File(e)))?;
    let mut snap: CpuSnapshot = serde_json::from_str(&text).map_err(|e| err(ProfileErrorKind::Json(e)))?;
    snap.source = format!("override:{path}");
    Ok(snap)
}

/// The snapshot the policy should use: `INT4_CPU_PROFILE` if set, else the live probe.
pub fn snapshot_for_policy() -> Result<CpuSnapshot, ProfileError> {
    match std::env::var("INT4_CPU_PROFILE") {
        Ok(path) if !path.is_empty() => load_profile(&path),
        _ => Ok(probe::live()),
    }
}
