//! The kernel crate's error type.

use std::fmt;

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
    /// The weights themselves were rejected by the layout crate.
    Layout(String),
    /// A path was forced that this process cannot run (the CPU lacks it, or `INT4_ISA`/`INT4_DISABLE`
    /// capped it away).
    Unavailable {
        /// The kernel asked for.
        kernel: &'static str,
        /// What is missing.
        missing: &'static str,
    },
}

impl KernelError {
    pub(crate) fn new(kind: KernelErrorKind) -> Self {
        KernelError { kind }
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
        KernelError::new(KernelErrorKind::Layout(e.to_string()))
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KernelErrorKind::Shape { what, expected, actual } => {
                write!(f, "{what} has {actual} elements, the shape needs {expected}")
            }
            KernelErrorKind::Layout(e) => write!(f, "weights rejected: {e}"),
            KernelErrorKind::Unavailable { kernel, missing } => {
                write!(f, "kernel {kernel} cannot run in this process: {missing}")
            }
        }
    }
}

impl std::error::Error for KernelError {}

pub(crate) fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), KernelError> {
    if expected != actual {
        return Err(KernelError::shape(what, expected, actual));
    }
    Ok(())
}
