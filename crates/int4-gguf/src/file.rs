//! A small reader for GGUF files (versions 2 and 3, little-endian), the checkpoint format of llama.cpp.
//!
//! The project's default model ships only as a GGUF, so we read it ourselves rather than depend on a C++
//! library: the header, every metadata value type (nested arrays included), the tensor table, and exact
//! dequantization to f32 of the types the runtime loads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K).
//! [`GgufFile::blocks`] hands out a block-quantized tensor's codes and per-block parameters as stored, so
//! the runtime packs them into its own layouts without a detour through f32 (and a test can check that a
//! layout reproduces the GGUF weights bit for bit).
//!
//! [`GgufFile::open`] maps the file read-only rather than reading it: a model's weights are paged in as
//! the runtime packs them, and a 7B file never becomes a 4 GB heap allocation. A GGUF is untrusted input: every
//! count and length is checked against the bytes that remain before anything is allocated for it, every
//! tensor's extent is checked against the file size at open, nesting of arrays is bounded, and bad input
//! is an error ([`GgufError`], naming the file and the field or tensor) — never a panic.
//!
//! Layout (all little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64` key/value count; the
//! key/values (`string` key, `u32` value type, value); the tensor infos (`string` name, `u32` n_dims,
//! `u64` dims, fastest-varying first, `u32` ggml type, `u64` offset into the data section); then the data
//! section, which starts at the next multiple of `general.alignment` (default 32). Strings are a `u64`
//! length and UTF-8 bytes.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// How deeply arrays may nest in metadata. GGUF allows any depth; real files use one level, and a bound
/// keeps a hostile file from exhausting the stack.
pub const MAX_ARRAY_NESTING: usize = 8;

/// Smallest encoded size of a key/value pair: key length (8), one key byte would not even be required,
/// value type (4), smallest value (1).
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// Smallest encoded size of a tensor info: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:literal, $size:literal;)*) => {
        /// A ggml tensor element type, with ggml's names and numeric ids.
        ///
        /// Every type ggml defines is known here (so the size of any tensor can be checked against the file);
        /// [`GgufFile::tensor_f32`] dequantizes only F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum GgmlType {
            $($(#[$doc])* $variant,)*
        }

        impl GgmlType {
            /// The type with ggml id `id`, if ggml defines one.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's numeric id of the type.
            pub fn id(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $id,)*
                }
            }

            /// ggml's name of the type (`"q4_1"`, `"f32"`…).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block (1 for the plain types).
            pub fn block_size(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $block,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $size,)*
                }
            }
        }
    };
}

ggml_types! {
    /// 32-bit float.
    F32 = 0, "f32", 1, 4;
    /// IEEE half.
    F16 = 1, "f16", 1, 2;
    /// Blocks of 32: f16 scale `d`, 16 bytes of 4-bit codes; `w = (q - 8) * d`.
    Q4_0 = 2, "q4_0", 32, 18;
    /// Blocks of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit codes; `w = q * d + m`.
    Q4_1 = 3, "q4_1", 32, 20;
    /// Blocks of 32: f16 scale `d`, 32 fifth bits, 16 bytes of low nibbles; `w = (q - 16) * d`.
    Q5_0 = 6, "q5_0", 32, 22;
    /// Blocks of 32, 5-bit, with a minimum.
    Q5_1 = 7, "q5_1", 32, 24;
    /// Blocks of 32: f16 scale `d`, 32 signed bytes; `w = q * d`.
    Q8_0 = 8, "q8_0", 32, 34;
    /// Blocks of 32, 8-bit, with a sum (activations).
    Q8_1 = 9, "q8_1", 32, 36;
    /// K-quant, 2-bit.
    Q2_K = 10, "q2_K", 256, 84;
    /// K-quant, 3-bit.
    Q3_K = 11, "q3_K", 256, 110;
    /// K-quant, 4-bit.
    Q4_K = 12, "q4_K", 256, 144;
    /// K-quant, 5-bit.
    Q5_K = 13, "q5_K", 256, 176;
    /// K-quant, 6-bit.
    Q6_K = 14, "q6_K", 256, 210;
    /// K-quant, 8-bit (activations).
    Q8_K = 15, "q8_K", 256, 292;
    /// I-quant.
    IQ2_XXS = 16, "iq2_xxs", 256, 66;
    /// I-quant.
    IQ2_XS = 17, "iq2_xs", 256, 74;
    /// I-quant.
    IQ3_XXS = 18, "iq3_xxs", 256, 98;
    /// I-quant.
    IQ1_S = 19, "iq1_s", 256, 50;
    /// I-quant, non-linear 4-bit.
    IQ4_NL = 20, "iq4_nl", 32, 18;
    /// I-quant.
    IQ3_S = 21, "iq3_s", 256, 110;
    /// I-quant.
    IQ2_S = 22, "iq2_s", 256, 82;
    /// I-quant.
    IQ4_XS = 23, "iq4_xs", 256, 136;
    /// 8-bit integer.
    I8 = 24, "i8", 1, 1;
    /// 16-bit integer.
    I16 = 25, "i16", 1, 2;
    /// 32-bit integer.
    I32 = 26, "i32", 1, 4;
    /// 64-bit integer.
    I64 = 27, "i64", 1, 8;
    /// 64-bit float.
    F64 = 28, "f64", 1, 8;
    /// I-quant.
    IQ1_M = 29, "iq1_m", 256, 56;
    /// bfloat16.
    BF16 = 30, "bf16", 1, 2;
    /// Ternary.
    TQ1_0 = 34, "tq1_0", 256, 54;
    /// Ternary.
    TQ2_0 = 35, "tq2_0", 256, 66;
    /// Microscaling FP4.
    MXFP4 = 39, "mxfp4", 32, 17;
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8` (type 0).
    U8(u8),
    /// `int8` (type 1).
    I8(i8),
    /// `uint16` (type 2).
    U16(u16),
    /// `int16` (type 3).
    I16(i16),
    /// `uint32` (type 4).
    U32(u32),
    /// `int32` (type 5).
    I32(i32),
    /// `float32` (type 6).
    F32(f32),
    /// `bool` (type 7).
    Bool(bool),
    /// `string` (type 8).
    String(String),
    /// `array` (type 9): elements all of one type (arrays may nest).
    Array(Vec<GgufValue>),
    /// `uint64` (type 10).
    U64(u64),
    /// `int64` (type 11).
    I64(i64),
    /// `float64` (type 12).
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer: any integer type that holds a value ≥ 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer: any integer type whose value fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float: either float type, or an integer type of at most 32 bits (exact in f64).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of the value's type (`"uint32"`, `"array"`…), for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "uint8",
            GgufValue::I8(_) => "int8",
            GgufValue::U16(_) => "uint16",
            GgufValue::I16(_) => "int16",
            GgufValue::U32(_) => "uint32",
            GgufValue::I32(_) => "int32",
            GgufValue::F32(_) => "float32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "uint64",
            GgufValue::I64(_) => "int64",
            GgufValue::F64(_) => "float64",
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (`"blk.0.attn_q.weight"`).
    pub name: String,
    /// The dimensions in GGUF order: `dims[0]` is the fastest-varying (contiguous) axis. A Hugging Face
    /// `[out, in]` weight is `[in, out]` here.
    pub dims: Vec<u64>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// Where the data starts, relative to the data section (see [`GgufFile::data_offset`]).
    pub offset: u64,
}

impl TensorInfo {
    /// The number of elements (1 for a tensor of no dimensions).
    pub fn n_elements(&self) -> u64 {
        // For a tensor of an opened file the product was checked at open; saturate for any other.
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// The size of the data in bytes.
    pub fn n_bytes(&self) -> u64 {
        (self.n_elements() / self.ggml_type.block_size()).saturating_mul(self.ggml_type.type_size())
    }
}

/// Why a GGUF file could not be read, or a tensor could not be produced.
#[derive(Debug)]
pub struct GgufError {
    path: PathBuf,
    kind: GgufErrorKind,
    field: String,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum GgufErrorKind {
    /// The file could not be read.
    Io(std::io::Error),
    /// The path is not a regular file (a directory, a FIFO, a device), or could not be opened.
    File(int4_files::FileError),
    /// The file ends before the field does.
    Truncated {
        /// Where the field starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
    },
    /// The file does not start with `GGUF`.
    BadMagic([u8; 4]),
    /// A version other than 2 or 3.
    UnsupportedVersion(u32),
    /// A big-endian GGUF (the version field reads byte-swapped).
    BigEndian,
    /// A count or length larger than the rest of the file could hold.
    LengthTooLarge {
        /// The length the file claims.
        len: u64,
        /// The most the remaining bytes could hold.
        max: u64,
    },
    /// A string that is not UTF-8.
    InvalidUtf8,
    /// A metadata value type GGUF does not define.
    UnknownValueType(u32),
    /// A tensor type ggml does not define.
    UnknownGgmlType(u32),
    /// Arrays nested deeper than [`MAX_ARRAY_NESTING`].
    NestingTooDeep,
    /// A metadata key that appears twice.
    DuplicateKey,
    /// A tensor name that appears twice.
    DuplicateTensor,
    /// A structurally invalid field (the text says how).
    Malformed(String),
    /// A tensor whose data would lie (partly) past the end of the file.
    OutOfBounds {
        /// First byte of the data, from the start of the file.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// The file's size.
        file_len: u64,
    },
    /// A tensor of a type this reader cannot dequantize.
    UnsupportedType(GgmlType),
    /// A tensor of a type other than the one an accessor needs.
    WrongType {
        /// The type the accessor needs.
        expected: GgmlType,
        /// The tensor's type.
        found: GgmlType,
    },
    /// No tensor of that name.
    NoSuchTensor,
}

impl GgufError {
    fn new(path: &Path, kind: GgufErrorKind, field: impl Into<String>) -> Self {
        GgufError { path: path.to_path_buf(), kind, field: field.into() }
    }

    /// What went wrong.
    pub fn kind(&self) -> &GgufErrorKind {
        &self.kind
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The field or tensor concerned (`"tensor count"`, `"value of general.name"`, `"blk.0.attn_q.weight"`).
    pub fn field(&self) -> &str {
        &self.field
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path.display())?;
        match &self.kind {
            GgufErrorKind::Io(e) => write!(f, "cannot read the file: {e}")?,
            GgufErrorKind::File(e) => write!(f, "{}", e.kind())?,
            GgufErrorKind::Truncated { offset, needed } => {
                write!(f, "file truncated: {needed} byte(s) needed at offset {offset}")?
            }
            GgufErrorKind::BadMagic(m) => write!(f, "not a GGUF file: magic {m:02x?}, expected \"GGUF\"")?,
            GgufErrorKind::UnsupportedVersion(v) => write!(f, "unsupported GGUF version {v} (2 and 3 are read)")?,
            GgufErrorKind::BigEndian => write!(f, "big-endian GGUF files are not supported")?,
            GgufErrorKind::LengthTooLarge { len, max } => {
                write!(f, "length {len} is larger than the rest of the file can hold (at most {max})")?
            }
            GgufErrorKind::InvalidUtf8 => write!(f, "string is not valid UTF-8")?,
            GgufErrorKind::UnknownValueType(t) => write!(f, "unknown metadata value type {t}")?,
            GgufErrorKind::UnknownGgmlType(t) => write!(f, "unknown ggml tensor type {t}")?,
            GgufErrorKind::NestingTooDeep => write!(f, "arrays nested deeper than {MAX_ARRAY_NESTING} levels")?,
            GgufErrorKind::DuplicateKey => write!(f, "duplicate metadata key")?,
            GgufErrorKind::DuplicateTensor => write!(f, "duplicate tensor name")?,
            GgufErrorKind::Malformed(m) => write!(f, "{m}")?,
            GgufErrorKind::OutOfBounds { start, end, file_len } => {
                write!(f, "tensor data [{start}, {end}) lies past the end of the file ({file_len} bytes)")?
            }
            GgufErrorKind::UnsupportedType(t) => {
                write!(f, "ggml type {t} is not supported (f32, f16, bf16, q4_0, q4_1, q5_0, q8_0, q4_K, q6_K are)")?
            }
            GgufErrorKind::WrongType { expected, found } => write!(f, "tensor is {found}, not {expected}")?,
            GgufErrorKind::NoSuchTensor => write!(f, "no such tensor")?,
        }
        write!(f, " ({})", self.field)
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            GgufErrorKind::Io(e) => Some(e),
            GgufErrorKind::File(e) => Some(e),
            _ => None,
        }
    }
}

/// A file's bytes: mapped from the file, or held in memory.
enum Bytes {
    Mapped { map: Mmap, metadata: std::fs::Metadata },
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, .. } => map,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file, its bytes mapped from the file or held in memory.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Maps and parses the GGUF file at `path`, checking every tensor's extent against the file size.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        // A regular file only: a FIFO or a device (`/dev/zero`) would block or never end.
        let file = int4_files::open_regular(path).map_err(|e| GgufError::new(path, GgufErrorKind::File(e), "open"))?;
        let metadata = file.metadata().map_err(|e| GgufError::new(path, GgufErrorKind::Io(e), "stat"))?;
        if metadata.len() == 0 {
            // An empty file cannot be mapped; say what it is instead.
            return GgufFile::parse(path.to_path_buf(), Bytes::Owned(Vec::new()));
        }
        // SAFETY: a read-only shared mapping of a file checked to be a regular file; every read through the
        // slice stays within the length the mapping was made with. The bytes are those of the file while it
        // is mapped: a model file modified or truncated underneath the process is outside what a mapped
        // reader can defend against (documented as unsupported; once the runtime's `Checkpoint` holds the
        // mapping, its SIGBUS report names the file if a read faults).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::new(path, GgufErrorKind::Io(e), "map"))?;
        GgufFile::parse(path.to_path_buf(), Bytes::Mapped { map, metadata })
    }

    /// Parses a GGUF held in memory; `path` is only used in error messages.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::parse(path.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<GgufFile, GgufError> {
        let parsed = Parser { path: &path, buf: &bytes, pos: 0 }.parse()?;
        let tensor_index = parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            bytes,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            tensor_index,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            path,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file, as mapped or held: what a content identity of the file hashes.
    pub fn bytes_all(&self) -> &[u8] {
        &self.bytes
    }

    /// The metadata (size, inode, times) of the descriptor that was mapped; `None` for a file parsed from
    /// memory.
    pub fn file_metadata(&self) -> Option<&std::fs::Metadata> {
        match &self.bytes {
            Bytes::Mapped { metadata, .. } => Some(metadata),
            Bytes::Owned(_) => None,
        }
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data-section alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts, from the start of the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The metadata value of `key`, if present.
    pub fn metadata(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Every metadata key/value, in file order.
    pub fn metadata_entries(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn find(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::new(&self.path, GgufErrorKind::NoSuchTensor, name))
    }

    /// The raw bytes of tensor `name`, in its ggml encoding.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let t = self.find(name)?;
        Ok(self.data_of(t))
    }

    fn data_of(&self, t: &TensorInfo) -> &[u8] {
        // Both bounds were checked against the file length at open, so they fit usize and the slice.
        let start = (self.data_offset + t.offset) as usize;
        &self.bytes[start..start + t.n_bytes() as usize]
    }

    /// Tensor `name` dequantized to f32, element for element as ggml's reference dequantizers compute it
    /// (scales widened from f16 to f32, then `q * d`, plus `m` for Q4_1; Q4_K and Q6_K with their
    /// sub-block scales in ggml's order of operations). Elements are in GGUF order (`dims[0]` fastest).
    /// Types other than F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K are an error.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self.find(name)?;
        let data = self.data_of(t);
        let n = t.n_elements() as usize;
        let out: Vec<f32> = match t.ggml_type {
            GgmlType::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            GgmlType::F16 => data.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            GgmlType::BF16 => data.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            GgmlType::Q6_K => data.chunks_exact(Q6_K_BYTES).flat_map(q6_k_block).collect(),
            _ => {
                let blocks = self.blocks(name)?;
                let mut out = Vec::with_capacity(n);
                for (b, codes) in blocks.codes.chunks_exact(BLOCK).enumerate() {
                    let d = blocks.d[b];
                    match (&blocks.m, blocks.ggml_type) {
                        (Some(m), _) => out.extend(codes.iter().map(|&q| f32::from(q) * d + m[b])),
                        (None, GgmlType::Q4_0) => out.extend(codes.iter().map(|&q| f32::from(q - 8) * d)),
                        (None, _) => out.extend(codes.iter().map(|&q| f32::from(q) * d)),
                    }
                }
                out
            }
        };
        debug_assert_eq!(out.len(), n);
        Ok(out)
    }

    /// The content of block-quantized tensor `name` (Q4_0, Q4_1, Q5_0, Q8_0 or Q4_K) as stored: one code
    /// per element in GGUF order and each block's parameters widened to f32 (block `b` covers elements
    /// `32 b .. 32 b + 32`; a Q4_K super-block of 256 is eight such blocks, each with its own `d·sc` and
    /// `−dmin·m`). See [`QuantBlocks`] for what the codes mean per type.
    pub fn blocks(&self, name: &str) -> Result<QuantBlocks, GgufError> {
        let t = self.find(name)?;
        let data = self.data_of(t);
        let ty = t.ggml_type;
        let n_blocks = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => data.len() / ty.type_size() as usize,
            GgmlType::Q4_K => return Ok(q4_k_blocks(data)),
            other => return Err(GgufError::new(&self.path, GgufErrorKind::UnsupportedType(other), name)),
        };
        let half = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let mut codes = Vec::with_capacity(n_blocks * BLOCK);
        let mut d = Vec::with_capacity(n_blocks);
        let mut m = (ty == GgmlType::Q4_1).then(|| Vec::with_capacity(n_blocks));
        for b in data.chunks_exact(ty.type_size() as usize) {
            d.push(half(b, 0));
            match ty {
                GgmlType::Q4_0 => nibbles(&b[2..18], &mut codes),
                GgmlType::Q4_1 => {
                    if let Some(m) = m.as_mut() {
                        m.push(half(b, 2));
                    }
                    nibbles(&b[4..20], &mut codes);
                }
                GgmlType::Q5_0 => {
                    // Bit j of `qh` is the fifth bit of element j.
                    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                    let fifth = |j: usize| ((qh >> j) & 1) as i8 * 16;
                    let start = codes.len();
                    nibbles(&b[6..22], &mut codes);
                    for (j, c) in codes[start..].iter_mut().enumerate() {
                        *c = (*c | fifth(j)) - 16;
                    }
                }
                _ => codes.extend(b[2..34].iter().map(|&q| q as i8)),
            }
        }
        Ok(QuantBlocks { ggml_type: ty, codes, d, m })
    }

    /// The raw content of Q4_1 tensor `name`: one code (0..=15) per element in GGUF order, and each block's
    /// scale `d` and minimum `m` widened to f32 (block `b` covers elements `32 b .. 32 b + 32`). Element `i`
    /// dequantizes to `codes[i] as f32 * d[i / 32] + m[i / 32]`, which is what [`GgufFile::tensor_f32`] returns.
    #[allow(clippy::type_complexity)]
    pub fn q4_1_blocks(&self, name: &str) -> Result<(Vec<u8>, Vec<f32>, Vec<f32>), GgufError> {
        let t = self.find(name)?;
        if t.ggml_type != GgmlType::Q4_1 {
            let kind = GgufErrorKind::WrongType { expected: GgmlType::Q4_1, found: t.ggml_type };
            return Err(GgufError::new(&self.path, kind, name));
        }
        let QuantBlocks { codes, d, m, .. } = self.blocks(name)?;
        Ok((codes.into_iter().map(|q| q as u8).collect(), d, m.unwrap_or_default()))
    }
}

/// Elements per block of the block-quantized types [`GgufFile::blocks`] reads.
const BLOCK: usize = 32;

/// Appends the 32 four-bit codes of 16 packed bytes: element `j` is the low nibble of byte `j` for
/// `j < 16` and the high nibble of byte `j − 16` after.
fn nibbles(qs: &[u8], codes: &mut Vec<i8>) {
    codes.extend(qs.iter().map(|&q| (q & 0x0F) as i8));
    codes.extend(qs.iter().map(|&q| (q >> 4) as i8));
}

/// Bytes of a Q4_K super-block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128 of nibbles.
const Q4_K_BYTES: usize = 144;
/// Bytes of a Q6_K super-block: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, f16 `d`.
const Q6_K_BYTES: usize = 210;

/// The 6-bit scale and min of sub-block `j` (0..8) of a K-quant super-block's 12 packed bytes (ggml's
/// `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// A Q4_K tensor's data as 32-element blocks: element `d1·q − m1` with `d1 = d·sc`, `m1 = dmin·m` (each one
/// exact f32 product of an f16 and a 6-bit integer), as ggml's `dequantize_row_q4_K` computes it, so
/// `m = −m1` (`d1·q + (−m1)` rounds as `d1·q − m1` does).
fn q4_k_blocks(data: &[u8]) -> QuantBlocks {
    let supers = data.len() / Q4_K_BYTES;
    let (mut codes, mut d, mut m) =
        (Vec::with_capacity(supers * 256), Vec::with_capacity(supers * 8), Vec::with_capacity(supers * 8));
    for b in data.chunks_exact(Q4_K_BYTES) {
        let half = |at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let (dd, dmin, scales, qs) = (half(0), half(2), &b[4..16], &b[16..144]);
        for (chunk, q) in qs.chunks_exact(32).enumerate() {
            for (sub, shift) in [(2 * chunk, 0), (2 * chunk + 1, 4)] {
                let (sc, mn) = scale_min_k4(sub, scales);
                d.push(dd * f32::from(sc));
                m.push(-(dmin * f32::from(mn)));
                codes.extend(q.iter().map(|&byte| ((byte >> shift) & 0xF) as i8));
            }
        }
    }
    QuantBlocks { ggml_type: GgmlType::Q4_K, codes, d, m: Some(m) }
}

/// One Q6_K super-block dequantized as ggml's `dequantize_row_q6_K` computes it: `(d·sc)·(q − 32)`, left to
/// right in f32, `sc` an int8 scale per 16 elements.
fn q6_k_block(b: &[u8]) -> Vec<f32> {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16::from_le_bytes([b[208], b[209]]).to_f32();
    let mut y = vec![0.0f32; 256];
    for half in 0..2 {
        let (ql, qh, sc, y) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..], &mut y[128 * half..]);
        for l in 0..32 {
            let is = l / 16;
            let q = |low: u8, shift: u32| (i32::from(low) | ((i32::from(qh[l] >> shift) & 3) << 4)) - 32;
            let scale = |i: usize| d * f32::from(sc[i] as i8);
            y[l] = scale(is) * q(ql[l] & 0xF, 0) as f32;
            y[l + 32] = scale(is + 2) * q(ql[l + 32] & 0xF, 2) as f32;
            y[l + 64] = scale(is + 4) * q(ql[l] >> 4, 4) as f32;
            y[l + 96] = scale(is + 6) * q(ql[l + 32] >> 4, 6) as f32;
        }
    }
    y
}

/// A block-quantized tensor's content as stored (see [`GgufFile::blocks`]).
///
/// | type | `codes` | weight |
/// |---|---|---|
/// | Q4_0 | `0..=15` | `d·(q − 8)` |
/// | Q4_1 | `0..=15` | `d·q + m` |
/// | Q5_0 | `−16..=15` (the stored 5-bit value minus 16) | `d·q` |
/// | Q8_0 | `−128..=127` | `d·q` |
/// | Q4_K | `0..=15` | `d·q + m`, per 32 elements: `d` = the super-block's `d` × the sub-block's 6-bit scale, `m` = −(`dmin` × its 6-bit min) |
#[derive(Clone, Debug, PartialEq)]
pub struct QuantBlocks {
    /// The tensor's type.
    pub ggml_type: GgmlType,
    /// One code per element, in GGUF order.
    pub codes: Vec<i8>,
    /// Each block's scale, widened from f16.
    pub d: Vec<f32>,
    /// Each block's minimum (Q4_1 and Q4_K only; for Q4_1 widened from f16).
    pub m: Option<Vec<f32>>,
}

struct Parsed {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked cursor over the file's bytes.
struct Parser<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, kind: GgufErrorKind, field: impl Into<String>) -> GgufError {
        GgufError::new(self.path, kind, field)
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err(GgufErrorKind::Truncated { offset: self.pos as u64, needed: n }, field()));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A count of items each at least `min_bytes` long: refused before any allocation if the rest of the
    /// file could not hold that many.
    fn count(&mut self, min_bytes: u64, field: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let len = self.u64(field)?;
        let max = self.remaining() / min_bytes;
        if len > max {
            return Err(self.err(GgufErrorKind::LengthTooLarge { len, max }, field()));
        }
        Ok(len)
    }

    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String, GgufError> {
        let start = self.pos;
        let len = self.count(1, field)?;
        let bytes = self.take(len, field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => {
                self.pos = start;
                Err(self.err(GgufErrorKind::InvalidUtf8, field()))
            }
        }
    }

    fn parse(mut self) -> Result<Parsed, GgufError> {
        let magic: [u8; 4] = self.array(&|| "magic".into())?;
        if magic != GGUF_MAGIC {
            return Err(self.err(GgufErrorKind::BadMagic(magic), "magic"));
        }
        let version = self.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            let kind = if matches!(version.swap_bytes(), 2 | 3) {
                GgufErrorKind::BigEndian
            } else {
                GgufErrorKind::UnsupportedVersion(version)
            };
            return Err(self.err(kind, "version"));
        }
        let n_tensors = self.u64(&|| "tensor count".into())?;
        let n_kv = self.u64(&|| "metadata count".into())?;
        // The counts are checked once the header is read: each entry needs some minimum of bytes.
        if n_kv > self.remaining() / MIN_KV_BYTES {
            let max = self.remaining() / MIN_KV_BYTES;
            return Err(self.err(GgufErrorKind::LengthTooLarge { len: n_kv, max }, "metadata count"));
        }
        if n_tensors > self.remaining() / MIN_TENSOR_INFO_BYTES {
            let max = self.remaining() / MIN_TENSOR_INFO_BYTES;
            return Err(self.err(GgufErrorKind::LengthTooLarge { len: n_tensors, max }, "tensor count"));
        }

        let mut metadata: Vec<(String, GgufValue)> = Vec::with_capacity(n_kv as usize);
        let mut seen_keys: HashMap<String, ()> = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = self.string(&|| format!("metadata key #{i}"))?;
            let vfield = || format!("value of {key}");
            let ty = self.u32(&|| format!("type of {key}"))?;
            let value = self.value(ty, 0, &vfield)?;
            if seen_keys.insert(key.clone(), ()).is_some() {
                return Err(self.err(GgufErrorKind::DuplicateKey, key));
            }
            metadata.push((key, value));
        }

        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
        let mut seen_names: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = self.string(&|| format!("name of tensor #{i}"))?;
            let n_dims = self.u32(&|| format!("n_dims of {name}"))?;
            if n_dims as usize > MAX_DIMS {
                let m = format!("{n_dims} dimensions (at most {MAX_DIMS})");
                return Err(self.err(GgufErrorKind::Malformed(m), name));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(self.u64(&|| format!("dims[{d}] of {name}"))?);
            }
            let ty = self.u32(&|| format!("type of {name}"))?;
            let ggml_type = GgmlType::from_id(ty).ok_or_else(|| self.err(GgufErrorKind::UnknownGgmlType(ty), &name))?;
            let offset = self.u64(&|| format!("offset of {name}"))?;
            if seen_names.insert(name.clone(), ()).is_some() {
                return Err(self.err(GgufErrorKind::DuplicateTensor, name));
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset });
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    let m = format!("alignment must be a power of two, got {v:?}");
                    return Err(self.err(GgufErrorKind::Malformed(m), "general.alignment"));
                }
            },
        };
        let header_end = self.pos as u64;
        let data_offset = header_end.div_ceil(alignment) * alignment;
        let file_len = self.buf.len() as u64;
        // As llama.cpp lays a file out and requires it: each tensor right after the one before, aligned. A
        // tensor whose type (so size) disagrees with its data moves every offset after it; two tensors never
        // share bytes.
        let mut expected = 0u64;
        for t in &tensors {
            self.check_tensor(t, alignment, data_offset, file_len)?;
            if t.offset != expected {
                let m = format!(
                    "data starts at offset {}, where the tensors before it end at {expected}: its type or size \
                     disagrees with the file's layout",
                    t.offset
                );
                return Err(self.err(GgufErrorKind::Malformed(m), &t.name));
            }
            // Bounded by the file length (checked above), so neither addition overflows.
            expected = (t.offset + t.n_bytes()).div_ceil(alignment) * alignment;
        }
        Ok(Parsed { version, metadata, tensors, alignment, data_offset })
    }

    fn check_tensor(&self, t: &TensorInfo, alignment: u64, data_offset: u64, file_len: u64) -> Result<(), GgufError> {
        let malformed = |m: String| self.err(GgufErrorKind::Malformed(m), &t.name);
        let n = t.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let Some(n) = n.filter(|&n| n <= i64::MAX as u64) else {
            return Err(malformed(format!("dims {:?} overflow the element count", t.dims)));
        };
        let block = t.ggml_type.block_size();
        let first = t.dims.first().copied().unwrap_or(1);
        if !first.is_multiple_of(block) {
            return Err(malformed(format!(
                "dims[0] = {first} is not a multiple of the {} block size {block}",
                t.ggml_type
            )));
        }
        if !t.offset.is_multiple_of(alignment) {
            return Err(malformed(format!("offset {} is not a multiple of the alignment {alignment}", t.offset)));
        }
        let n_bytes = (n / block).checked_mul(t.ggml_type.type_size());
        let start = data_offset.checked_add(t.offset);
        let end = start.zip(n_bytes).and_then(|(s, b)| s.checked_add(b));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => Ok(()),
            _ => {
                let start = start.unwrap_or(u64::MAX);
                let end = end.unwrap_or(u64::MAX);
                Err(self.err(GgufErrorKind::OutOfBounds { start, end, file_len }, &t.name))
            }
        }
    }

    fn value(&mut self, ty: u32, depth: usize, field: &dyn Fn() -> String) -> Result<GgufValue, GgufError> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(field)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(field)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(field)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(field)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(field)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(field)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(field)?)),
            7 => GgufValue::Bool(self.array::<1>(field)?[0] != 0),
            8 => GgufValue::String(self.string(field)?),
            9 => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(self.err(GgufErrorKind::NestingTooDeep, field()));
                }
                let elem = self.u32(field)?;
                let min =
                    min_value_bytes(elem).ok_or_else(|| self.err(GgufErrorKind::UnknownValueType(elem), field()))?;
                let len = self.count(min, field)?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem, depth + 1, field)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(u64::from_le_bytes(self.array(field)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(field)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(field)?)),
            other => return Err(self.err(GgufErrorKind::UnknownValueType(other), field())),
        })
    }
}

/// The smallest encoding of a value of type `ty` (a string: its length; an array: element type and count).
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}
