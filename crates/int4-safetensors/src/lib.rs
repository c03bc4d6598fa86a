//! Safetensors files, read and written by one module each: [`MappedFile`] maps a file and parses its
//! header once (the `safetensors` crate's parser), exposing each tensor's bytes in place; [`FileWriter`]
//! writes a file a tensor at a time, so a converter or an exporter never holds a whole model.
//!
//! Writing: a [`FileLayout`] fixes everything before any data is written: every tensor's dtype, shape and
//! offset, ordered by element size, largest first (stable within a size, as the `safetensors` crate's own
//! writer orders them), so each tensor starts aligned to its element size; and the JSON header, padded
//! with spaces to a multiple of 8 bytes so the data section starts 8-byte aligned. A [`FileWriter`] then
//! takes each tensor's bytes, in any order and in pieces, at their place.
//!
//! Reading: a [`MappedFile`] holds the mapping and the tensors' entries in file order. It does not assume
//! the data aligned (a header of odd length puts every tensor at an odd offset), so callers decode
//! values byte-wise; it does not decide which dtypes a caller accepts.
//!
//! ```
//! use int4_safetensors::{Dtype, FileLayout, FileWriter, MappedFile, TensorEntry};
//! let path = std::env::temp_dir().join(format!("doc-{}.safetensors", std::process::id()));
//! let layout = FileLayout::new(
//!     &[("format", "pt")],
//!     vec![TensorEntry { name: "w".into(), dtype: Dtype::F32, shape: vec![2, 2] }],
//! );
//! let mut w = FileWriter::create(&path, layout)?;
//! let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
//! w.write(0, 0, &bytes)?;
//! w.finish()?;
//! let file = MappedFile::open(&std::fs::File::open(&path)?).unwrap();
//! let (i, t) = file.find("w").unwrap();
//! assert_eq!((t.dtype, t.shape.as_slice()), (Dtype::F32, &[2, 2][..]));
//! assert_eq!(file.bytes(i), &bytes[..]);
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), std::io::Error>(())
//! ```
#![deny(missing_docs)]

mod read;
mod write;

pub use read::{MappedFile, ReadError, StoredEntry};
pub use safetensors::Dtype;
pub use write::{FileLayout, FileWriter, TensorEntry};
