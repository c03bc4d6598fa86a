//! Weight bytes a layer reads without owning them outright.
//!
//! A packed layer's bytes come either from packing in this process (a `Vec<u8>`) or from a memory-mapped
//! artifact in the cache, where copying them out would double the memory a warm start costs and defeat
//! the point of mapping. [`SharedBytes`] is a range of any immutable buffer kept alive by an `Arc`, so a
//! layer holds its slice of one mapping that all layers share, zero-copy.

use std::ops::{Deref, Range};
use std::sync::Arc;

use crate::error::KernelError;

/// An immutable byte range of a shared buffer (an owned `Vec<u8>`, or a memory-mapped file).
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl SharedBytes {
    /// `range` of `owner`'s bytes, or an error if the range does not lie within them.
    pub fn slice_of(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Result<Self, KernelError> {
        let len = (*owner).as_ref().len();
        if range.start > range.end || range.end > len {
            return Err(KernelError::invalid(format!(
                "byte range {}..{} lies outside a buffer of {len} bytes",
                range.start, range.end
            )));
        }
        Ok(SharedBytes { owner, range })
    }

    /// Whether these bytes live in a buffer shared with others (a mapping) rather than one of their own.
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.owner) > 1 || self.range.len() != (*self.owner).as_ref().len()
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(v: Vec<u8>) -> Self {
        let range = 0..v.len();
        SharedBytes { owner: Arc::new(v), range }
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBytes").field("range", &self.range).finish_non_exhaustive()
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

/// f32 values read in place from shared bytes when aligned (on a little-endian host), else decoded into a
/// vector: how a layer holds the float tables of a mapped artifact (scales, offsets) without copying them.
#[derive(Clone, Debug)]
pub(crate) enum Floats {
    Mapped(SharedBytes),
    Owned(Vec<f32>),
}

impl Floats {
    /// The little-endian f32 values in `bytes` (a whole number of them).
    pub(crate) fn new(bytes: SharedBytes) -> Result<Self, KernelError> {
        if !bytes.len().is_multiple_of(4) {
            return Err(KernelError::shape("scale bytes", bytes.len().next_multiple_of(4), bytes.len()));
        }
        if cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, f32>(&bytes).is_ok() {
            Ok(Floats::Mapped(bytes))
        } else {
            Ok(Floats::Owned(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
        }
    }

    /// The values.
    pub(crate) fn as_slice(&self) -> &[f32] {
        match self {
            Floats::Mapped(b) => bytemuck::cast_slice(b),
            Floats::Owned(v) => v,
        }
    }
}

/// f16 values (as their bits) read in place from shared bytes when aligned (on a little-endian host), else
/// decoded into a vector: [`Floats`]' counterpart for tables held at 16 bits.
#[derive(Clone, Debug)]
pub(crate) enum Halves {
    Mapped(SharedBytes),
    Owned(Vec<u16>),
}

impl Halves {
    /// The little-endian f16 values in `bytes` (a whole number of them).
    pub(crate) fn new(bytes: SharedBytes) -> Result<Self, KernelError> {
        if !bytes.len().is_multiple_of(2) {
            return Err(KernelError::shape("f16 table bytes", bytes.len().next_multiple_of(2), bytes.len()));
        }
        if cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, u16>(&bytes).is_ok() {
            Ok(Halves::Mapped(bytes))
        } else {
            Ok(Halves::Owned(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()))
        }
    }

    /// The values' bits.
    pub(crate) fn as_slice(&self) -> &[u16] {
        match self {
            Halves::Mapped(b) => bytemuck::cast_slice(b),
            Halves::Owned(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_reads_its_range_and_refuses_one_outside_the_buffer() {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new((0u8..100).collect::<Vec<u8>>());
        let s = SharedBytes::slice_of(owner.clone(), 10..20).unwrap();
        assert_eq!(&*s, &(10u8..20).collect::<Vec<u8>>()[..]);
        assert!(s.is_shared());
        assert!(SharedBytes::slice_of(owner.clone(), 90..101).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 20..10;
        assert!(SharedBytes::slice_of(owner, backwards).is_err());
        let own = SharedBytes::from(vec![1u8, 2, 3]);
        assert!(!own.is_shared());
        assert_eq!(&*own, &[1, 2, 3]);
    }
}
