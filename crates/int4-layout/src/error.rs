//! The one error type of this crate.
//!
//! Every fallible function in `int4-layout` returns [`LayoutError`]. The kind says what was wrong in terms
//! of the caller's input (a shape, a length, a code value, a group size), so a loader can wrap it with the
//! file and tensor name it was reading.

use std::fmt;

/// An input that a grid, packer or decoder cannot accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError {
    kind: LayoutErrorKind,
}

/// What exactly was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutErrorKind {
    /// A matrix dimension was zero.
    EmptyShape {
        /// Output channels.
        n: usize,
        /// Input channels.
        k: usize,
    },
    /// K must be even for layouts that put two input channels' codes (or a K/2 split) in one byte.
    OddK {
        /// The offending K.
        k: usize,
    },
    /// K must be a multiple of this value (GPTQ packs eight K codes into one `i32`).
    KNotMultiple {
        /// The offending K.
        k: usize,
        /// The required multiple.
        multiple: usize,
    },
    /// N must be a multiple of this value (tinygemm packs channel blocks of at least 16; GPTQ zero words hold 8).
    NNotMultiple {
        /// The offending N.
        n: usize,
        /// The required multiple.
        multiple: usize,
    },
    /// A group size outside 32, 64, 128, 256 or per-channel.
    UnsupportedGroupSize {
        /// The size asked for.
        size: i64,
    },
    /// A buffer did not have the length its shape implies.
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A 4-bit code was 16 or more.
    CodeOutOfRange {
        /// Output channel.
        n: usize,
        /// Input channel.
        k: usize,
        /// The value found.
        value: u8,
    },
    /// A weight given to a quantizer was NaN or infinite.
    NonFiniteWeight {
        /// Output channel.
        n: usize,
        /// Input channel.
        k: usize,
    },
    /// A scale or zero was NaN or infinite.
    NonFiniteParam {
        /// Which parameter.
        what: &'static str,
        /// Output channel.
        n: usize,
        /// Group.
        group: usize,
    },
    /// An index (row, K range) lay outside the matrix.
    OutOfBounds {
        /// What was indexed.
        what: &'static str,
        /// The index or range end asked for.
        index: usize,
        /// The bound it must stay below (or at, for range ends).
        bound: usize,
    },
    /// GPTQ v1 stores zero-1 in a nibble, so it cannot store a zero point of 0.
    ZeroNotRepresentable {
        /// Group.
        group: usize,
        /// Output channel.
        n: usize,
    },
    /// A symmetric checkpoint's stored zeros were neither all 7 (v1) nor all 8 (v2).
    AmbiguousZeroFormat {
        /// The first stored zero value that is neither.
        value: u8,
    },
    /// A `g_idx` entry was negative or not a valid group.
    BadGroupIndex {
        /// Input channel.
        k: usize,
        /// The entry found.
        value: i64,
        /// The number of groups.
        groups: usize,
    },
    /// After sorting by `g_idx`, a group did not hold exactly its share of K.
    UnevenGroups {
        /// Group.
        group: usize,
        /// Members expected.
        expected: usize,
        /// Members found.
        actual: usize,
    },
    /// A chunk size for blocked repacking that is not a positive multiple of the block width.
    BadChunk {
        /// The chunk asked for.
        chunk: usize,
        /// The block width it must be a multiple of.
        block: usize,
    },
}

impl LayoutError {
    pub(crate) fn new(kind: LayoutErrorKind) -> Self {
        LayoutError { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &LayoutErrorKind {
        &self.kind
    }
}

impl From<LayoutErrorKind> for LayoutError {
    fn from(kind: LayoutErrorKind) -> Self {
        LayoutError::new(kind)
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LayoutErrorKind::*;
        match &self.kind {
            EmptyShape { n, k } => write!(f, "empty weight matrix: N = {n}, K = {k}"),
            OddK { k } => write!(f, "K = {k} is odd: two input channels share each byte, so K must be even"),
            KNotMultiple { k, multiple } => write!(f, "K = {k} is not a multiple of {multiple}"),
            NNotMultiple { n, multiple } => {
                write!(f, "N = {n} is not a multiple of {multiple} (pad the matrix with zero channels first)")
            }
            UnsupportedGroupSize { size } => {
                write!(f, "group size {size} is not supported: use 32, 64, 128, 256 or per-channel (-1)")
            }
            LengthMismatch { what, expected, actual } => {
                write!(f, "{what} has {actual} elements, its shape needs {expected}")
            }
            CodeOutOfRange { n, k, value } => {
                write!(f, "code {value} at (n = {n}, k = {k}) does not fit in 4 bits")
            }
            NonFiniteWeight { n, k } => write!(f, "weight at (n = {n}, k = {k}) is NaN or infinite"),
            NonFiniteParam { what, n, group } => {
                write!(f, "{what} at (n = {n}, group = {group}) is NaN or infinite")
            }
            OutOfBounds { what, index, bound } => write!(f, "{what} {index} is out of bounds ({bound})"),
            ZeroNotRepresentable { group, n } => write!(
                f,
                "zero point 0 at (group = {group}, n = {n}) cannot be stored in GPTQ v1 (it stores zero-1): use gptq_v2"
            ),
            AmbiguousZeroFormat { value } => {
                write!(f, "symmetric GPTQ zeros should all be 7 (v1) or all 8 (v2), found {value}")
            }
            BadGroupIndex { k, value, groups } => {
                write!(f, "g_idx[{k}] = {value} is not a group index below {groups}")
            }
            UnevenGroups { group, expected, actual } => {
                write!(f, "group {group} has {actual} input channels in g_idx, expected {expected}")
            }
            BadChunk { chunk, block } => {
                write!(f, "repack chunk of {chunk} rows is not a positive multiple of the {block}-channel block")
            }
        }
    }
}

impl std::error::Error for LayoutError {}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, LayoutError>;

pub(crate) fn err<T>(kind: LayoutErrorKind) -> Result<T> {
    Err(LayoutError::new(kind))
}
