//! The mapped reader: a file's header parsed once, each tensor's bytes in place in the mapping.

use std::fs::File;
use std::ops::Range;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError};

/// Why a file could not be read as safetensors. (Exhaustive: callers map each kind onto their own.)
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be mapped.
    Io(std::io::Error),
    /// The header is not a valid safetensors header (bad length, bad JSON, offsets out of range or
    /// overlapping, a dtype or shape that does not match its extent).
    Header(SafeTensorError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(_) => f.write_str("could not be mapped"),
            ReadError::Header(_) => f.write_str("is not a valid safetensors file"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            ReadError::Header(e) => Some(e),
        }
    }
}

/// One tensor of a [`MappedFile`], as its header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    /// The tensor's name.
    pub name: String,
    /// Its dtype as stored.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes' range in the file (the header parser checked it lies in the file and matches the shape).
    pub range: Range<usize>,
}

/// A safetensors file, mapped read-only, its header parsed once.
pub struct MappedFile {
    map: Mmap,
    /// The file's metadata when it was mapped (`fstat` of the descriptor mapped, not of a path).
    metadata: std::fs::Metadata,
    /// The tensors, in file order (by offset).
    entries: Vec<StoredEntry>,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile").field("len", &self.map.len()).field("tensors", &self.entries.len()).finish()
    }
}

impl MappedFile {
    /// Maps `file` and parses its header.
    pub fn open(file: &File) -> Result<Self, ReadError> {
        let metadata = file.metadata().map_err(ReadError::Io)?;
        // SAFETY: a read-only shared mapping; the files mapped here (checkpoints) are not modified while
        // they are read (as with any memory-mapped model file, modifying or truncating it underneath a
        // running process is outside what this program can defend against, and documented as unsupported).
        let map = unsafe { Mmap::map(file) }.map_err(ReadError::Io)?;
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(ReadError::Header)?;
        let data_start = 8 + header_len;
        let mut entries: Vec<StoredEntry> = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (start, end) = info.data_offsets;
                StoredEntry {
                    name,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    range: data_start + start..data_start + end,
                }
            })
            .collect();
        entries.sort_by_key(|e| (e.range.start, e.range.end));
        Ok(MappedFile { map, metadata, entries })
    }

    /// The whole file as mapped (header included): what a content hash of the file covers.
    pub fn bytes_all(&self) -> &[u8] {
        &self.map
    }

    /// The file's metadata when it was mapped (size, inode, times), from the descriptor that was mapped.
    pub fn metadata(&self) -> &std::fs::Metadata {
        &self.metadata
    }

    /// The tensors, in file order.
    pub fn entries(&self) -> &[StoredEntry] {
        &self.entries
    }

    /// The tensor named `name`, with its index in [`MappedFile::entries`].
    pub fn find(&self, name: &str) -> Option<(usize, &StoredEntry)> {
        self.entries.iter().enumerate().find(|(_, e)| e.name == name)
    }

    /// Tensor `i`'s bytes, in place.
    pub fn bytes(&self, i: usize) -> &[u8] {
        &self.map[self.entries[i].range.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{FileLayout, FileWriter, TensorEntry};

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("int4-safetensors-read-{name}-{}", std::process::id()))
    }

    /// What the writer wrote reads back in place, in file order, at odd offsets too (a header of odd
    /// length, which the writer never produces but other tools may).
    #[test]
    fn reads_back_what_was_written_and_odd_offsets() {
        let path = temp("rt");
        let entries = vec![
            TensorEntry { name: "b".into(), dtype: Dtype::U8, shape: vec![3] },
            TensorEntry { name: "f".into(), dtype: Dtype::F32, shape: vec![2] },
        ];
        let mut w = FileWriter::create(&path, FileLayout::new(&[], entries)).unwrap();
        w.write(0, 0, &[7, 8, 9]).unwrap();
        w.write(1, 0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        w.finish().unwrap();
        let m = MappedFile::open(&File::open(&path).unwrap()).unwrap();
        let names: Vec<&str> = m.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["f", "b"], "file order: the writer puts wider elements first");
        assert_eq!(m.bytes(m.find("b").unwrap().0), &[7, 8, 9]);
        assert_eq!(m.bytes(m.find("f").unwrap().0), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(m.find("missing").is_none());

        // An odd-length header: every tensor at an odd file offset.
        let header = br#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} "#;
        assert_eq!(header.len() % 2, 1);
        let mut raw = (header.len() as u64).to_le_bytes().to_vec();
        raw.extend_from_slice(header);
        raw.extend_from_slice(&1.5f32.to_le_bytes());
        std::fs::write(&path, &raw).unwrap();
        let m = MappedFile::open(&File::open(&path).unwrap()).unwrap();
        assert_eq!(m.entries()[0].range.start % 2, 1);
        assert_eq!(m.bytes(0), &1.5f32.to_le_bytes());
        std::fs::remove_file(&path).unwrap();
    }

    /// A truncated file, a header longer than the file and offsets past the end are header errors.
    #[test]
    fn bad_headers_are_errors() {
        let path = temp("bad");
        let header = br#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let mut raw = (header.len() as u64).to_le_bytes().to_vec();
        raw.extend_from_slice(header);
        raw.extend_from_slice(&[0; 4]);
        for bytes in [&raw[..], &raw[..5], &u64::MAX.to_le_bytes()[..], &[][..]] {
            std::fs::write(&path, bytes).unwrap();
            let e = MappedFile::open(&File::open(&path).unwrap()).unwrap_err();
            assert!(matches!(e, ReadError::Header(_)), "{e:?}");
            assert!(std::error::Error::source(&e).is_some());
        }
        std::fs::remove_file(&path).unwrap();
    }
}
