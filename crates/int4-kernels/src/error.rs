//! The kernel crate's error type.

use std::fmt;

use crate::kernel_id::KernelId;

/// Why a kernel could not be built or run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelError {
    kind: KernelErrorKind,
}

/// What went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelErrorKind {
    /// A buffer's length does not match the shape it was given with.
    Shape {
        /// Which buffer.
        what: &'static str,
        /// Its expected length.
        expected: usize,
        /// Its actual length.
        actual: usize,
    },
    /// The layout crate refused the weights (kept whole: [`std::error::Error::source`] returns it).
    Layout(int4_layout::LayoutError),
    /// An argument the kernels cannot take: a byte range outside its buffer, a row out of range, a zero
    /// point above 15, a non-finite offset or weight, weights built without what the chosen kernel reads.
    /// The message names the value.
    InvalidInput(String),
    /// The tile unit refused an instruction (a configuration mistake; the hardware would fault).
    Tile(crate::tile::TileError),
    /// A kernel was chosen that this process cannot run (the CPU lacks it, or `INT4_ISA`/`INT4_DISABLE`
    /// capped it away).
    Unavailable {
        /// The kernel asked for.
        kernel: KernelId,
        /// What it needs ([`KernelId::needs`]).
        missing: &'static str,
    },
    /// A layer was given kernels of another layer type (a W4A8 kernel for a W4A16 layer, say).
    WrongFamily {
        /// The kernel given.
        kernel: KernelId,
        /// The layer type.
        layer: &'static str,
    },
}

impl KernelError {
    pub(crate) fn new(kind: KernelErrorKind) -> Self {
        KernelError { kind }
    }

    pub(crate) fn invalid(why: impl Into<String>) -> Self {
        KernelError::new(KernelErrorKind::InvalidInput(why.into()))
    }

    pub(crate) fn shape(what: &'static str, expected: usize, actual: usize) -> Self {
        KernelError::new(KernelErrorKind::Shape { what, expected, actual })
    }

    /// What went wrong.
    pub fn kind(&self) -> &KernelErrorKind {
        &self.kind
    }
}

impl From<int4_layout::LayoutError> for KernelError {
    fn from(e: int4_layout::LayoutError) -> Self {
        KernelError::new(KernelErrorKind::Layout(e))
    }
}

impl From<crate::tile::TileError> for KernelError {
    fn from(e: crate::tile::TileError) -> Self {
        KernelError::new(KernelErrorKind::Tile(e))
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KernelErrorKind::Shape { what, expected, actual } => {
                write!(f, "{what} has {actual} elements, the shape needs {expected}")
            }
            KernelErrorKind::Layout(e) => write!(f, "weights rejected: {e}"),
            KernelErrorKind::InvalidInput(why) => f.write_str(why),
            KernelErrorKind::Tile(e) => write!(f, "tile unit: {e}"),
            KernelErrorKind::Unavailable { kernel, missing } => {
                write!(f, "kernel {kernel} cannot run in this process: {missing}")
            }
            KernelErrorKind::WrongFamily { kernel, layer } => {
                write!(f, "kernel {kernel} does not run {layer} layers")
            }
        }
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            KernelErrorKind::Layout(e) => Some(e),
            KernelErrorKind::Tile(e) => Some(e),
            _ => None,
        }
    }
}

pub(crate) fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), KernelError> {
    if expected != actual {
        return Err(KernelError::shape(what, expected, actual));
    }
    Ok(())
}
