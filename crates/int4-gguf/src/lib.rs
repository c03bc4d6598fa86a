//! llama.cpp's GGUF files: a reader, and the conversion of a Llama GGUF into a Hugging Face model
//! directory.
//!
//! # Brief overview
//!
//! * [`GgufFile`] reads a GGUF (versions 2 and 3): every metadata value, the tensor table, and exact
//!   dequantization to f32 of the tensor types llama.cpp's Q4/Q8 files use. A GGUF is untrusted input:
//!   every count and length is checked against the file before anything is allocated, and bad input is a
//!   [`GgufError`] naming the file and the field, never a panic.
//! * [`gguf_to_hf`] writes a Hugging Face directory (f32 safetensors, `config.json`, a tokenizer rebuilt
//!   from the GGUF's vocabulary and merges, the chat template): how `cargo xtask fetch-model` prepares the
//!   default model, which is published only as a GGUF.
//!
//! This crate knows nothing of CPUs or kernels; the runtime (`int4`) reads GGUF files through it.
//!
//! ```no_run
//! use std::path::Path;
//!
//! let file = int4_gguf::GgufFile::open(Path::new("model.gguf"))?;
//! for t in file.tensors() {
//!     println!("{} {} {:?}", t.name, t.ggml_type, t.dims);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod file;
mod hf_dir;

pub use file::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, GgmlType, GgufError, GgufErrorKind, GgufFile, GgufValue, MAX_ARRAY_NESTING,
    MAX_DIMS, QuantBlocks, TensorInfo,
};
pub use hf_dir::{
    CONVERTER_VERSION, ConvertError, ConvertErrorKind, ConvertReport, ConvertedTensor, GgufModel, GgufTensor,
    gguf_to_hf, permute_qk, unpermute_qk,
};
