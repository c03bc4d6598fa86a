//! A W4A8 layer's float group parameters (scales, float offsets): each table held in f16 when every
//! value in it is one exactly, else in f32.
//!
//! A decode step reads every weight byte once, and at group 32 one f32 scale per channel is a fifth of the
//! bytes the group's codes take (16). GGUF's Q4_0, Q4_1 and Q8_0 store their scales in f16, so a table of
//! them loses nothing at 16 bits: the kernels widen each value back to the very f32 it was, and their
//! results keep every bit. A table with any value f16 cannot hold exactly (scales found at load in f32,
//! a Q4_1 zero `m + 8d`) stays in f32. Which width a table takes is decided by its values alone, here, so
//! every caller of [`ParamTable::from_f32`] gets the same answer for the same numbers.

use half::f16;

use crate::bytes::{Floats, Halves, SharedBytes};
use crate::error::KernelError;

/// The width a parameter table is stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamType {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (IEEE binary16), each widened exactly to the f32 it stands for.
    F16,
}

impl ParamType {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            ParamType::F32 => 4,
            ParamType::F16 => 2,
        }
    }

    /// The width's name: `f32` or `f16`.
    pub fn name(self) -> &'static str {
        match self {
            ParamType::F32 => "f32",
            ParamType::F16 => "f16",
        }
    }
}

/// A stored table: its width and its little-endian bytes (an artifact section, read in place).
#[derive(Clone, Debug, PartialEq)]
pub struct TableBytes {
    /// The width of each value.
    pub ty: ParamType,
    /// The values, little-endian.
    pub bytes: SharedBytes,
}

/// A table of f32 group parameters, held in f16 where that is exact (module docs).
#[derive(Clone, Debug)]
pub struct ParamTable(Repr);

#[derive(Clone, Debug)]
enum Repr {
    F32(Floats),
    F16(Halves),
}

/// Whether `v` is an f16 value exactly: the same bits after a round trip through f16.
fn exact_in_f16(v: f32) -> bool {
    f16::from_f32(v).to_f32().to_bits() == v.to_bits()
}

impl ParamTable {
    /// The table of `values`: f16 when every one is an f16 value exactly, else f32.
    pub fn from_f32(values: Vec<f32>) -> Self {
        if values.iter().all(|&v| exact_in_f16(v)) {
            let bits: Vec<u16> = values.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            ParamTable(Repr::F16(Halves::Owned(bits)))
        } else {
            ParamTable(Repr::F32(Floats::Owned(values)))
        }
    }

    /// The table stored in `stored`, read in place where aligned, at the width it was stored in (an f32
    /// table whose values would all fit f16 stays f32: the values, not the width, are what is checked).
    pub fn from_bytes(stored: TableBytes) -> Result<Self, KernelError> {
        Ok(ParamTable(match stored.ty {
            ParamType::F32 => Repr::F32(Floats::new(stored.bytes)?),
            ParamType::F16 => Repr::F16(Halves::new(stored.bytes)?),
        }))
    }

    /// The width the values are held in.
    pub fn ty(&self) -> ParamType {
        match self.0 {
            Repr::F32(_) => ParamType::F32,
            Repr::F16(_) => ParamType::F16,
        }
    }

    /// Values in the table.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::F32(v) => v.as_slice().len(),
            Repr::F16(v) => v.as_slice().len(),
        }
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes resident.
    pub fn resident_bytes(&self) -> usize {
        self.len() * self.ty().bytes()
    }

    /// Value `i`, as f32 (exact either way).
    pub fn get(&self, i: usize) -> f32 {
        self.view().get(i)
    }

    /// The table of `f(v)` for every value `v`: f16 when every result is an f16 value exactly, else f32
    /// (as [`Self::from_f32`], without a full f32 copy when the results fit).
    pub fn map(&self, f: impl Fn(f32) -> f32) -> Self {
        let mut bits = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let v = f(self.get(i));
            if !exact_in_f16(v) {
                return Self::from_f32((0..self.len()).map(|i| f(self.get(i))).collect());
            }
            bits.push(f16::from_f32(v).to_bits());
        }
        ParamTable(Repr::F16(Halves::Owned(bits)))
    }

    /// Every value, as f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }

    /// The table as it is stored: its width and little-endian bytes.
    pub fn to_bytes(&self) -> TableBytes {
        let bytes: Vec<u8> = match &self.0 {
            Repr::F32(v) => v.as_slice().iter().flat_map(|v| v.to_le_bytes()).collect(),
            Repr::F16(v) => v.as_slice().iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        TableBytes { ty: self.ty(), bytes: bytes.into() }
    }

    /// The whole table, as the kernels read it.
    pub(crate) fn view(&self) -> Params<'_> {
        match &self.0 {
            Repr::F32(v) => Params::F32(v.as_slice()),
            Repr::F16(v) => Params::F16(v.as_slice()),
        }
    }
}

impl PartialEq for ParamTable {
    /// Tables are equal when they hold the same bits at the same width.
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Repr::F32(a), Repr::F32(b)) => {
                a.as_slice().iter().map(|v| v.to_bits()).eq(b.as_slice().iter().map(|v| v.to_bits()))
            }
            (Repr::F16(a), Repr::F16(b)) => a.as_slice() == b.as_slice(),
            _ => false,
        }
    }
}

/// A borrowed run of a parameter table, as the kernels read it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Params<'a> {
    F32(&'a [f32]),
    /// f16 bits.
    F16(&'a [u16]),
}

impl<'a> Params<'a> {
    /// Values in the run.
    pub fn len(self) -> usize {
        match self {
            Params::F32(v) => v.len(),
            Params::F16(v) => v.len(),
        }
    }

    /// Value `i`, as f32.
    #[inline]
    pub fn get(self, i: usize) -> f32 {
        match self {
            Params::F32(v) => v[i],
            Params::F16(v) => f16::from_bits(v[i]).to_f32(),
        }
    }

    /// Values `range`.
    pub fn slice(self, range: std::ops::Range<usize>) -> Params<'a> {
        match self {
            Params::F32(v) => Params::F32(&v[range]),
            Params::F16(v) => Params::F16(&v[range]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_f16_only_when_every_value_is_one_exactly() {
        let halves = [0.5, -0.0, 65504.0, 6.0e-8, 1.0e-3f32];
        let h16 = halves.iter().map(|&v| f16::from_f32(v).to_f32()).collect::<Vec<_>>();
        let t = ParamTable::from_f32(h16.clone());
        assert_eq!(t.ty(), ParamType::F16);
        assert_eq!(
            t.to_f32_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            h16.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(t.resident_bytes(), 10);
        for odd in [1.0e-3f32, 65520.0, 1.0 + f32::EPSILON, f32::from_bits(0x7fc0_0001), 1.0e-9] {
            let mut v = h16.clone();
            v.push(odd);
            assert_eq!(ParamTable::from_f32(v).ty(), ParamType::F32, "{odd}");
        }
    }

    #[test]
    fn a_mapped_table_keeps_f16_only_while_every_result_fits() {
        let t = ParamTable::from_f32(vec![0.5, -2.0, 3000.0]);
        let sixteen = t.map(|v| 16.0 * v);
        assert_eq!((sixteen.ty(), sixteen.to_f32_vec()), (ParamType::F16, vec![8.0, -32.0, 48000.0]));
        // 64 × 3000 is past f16's largest finite value: the whole table is f32.
        let wide = t.map(|v| 64.0 * v);
        assert_eq!((wide.ty(), wide.to_f32_vec()), (ParamType::F32, vec![32.0, -128.0, 192000.0]));
    }

    #[test]
    fn a_stored_table_reads_back_as_it_was_written_aligned_or_not() {
        for values in [vec![0.25f32, -3.0, 1024.0], vec![0.1f32, 7.0, -2.5]] {
            let t = ParamTable::from_f32(values.clone());
            let stored = t.to_bytes();
            assert_eq!(stored.bytes.len(), values.len() * stored.ty.bytes());
            assert_eq!(ParamTable::from_bytes(stored.clone()).unwrap(), t);
            // One byte in, so the values are not aligned in their buffer.
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&stored.bytes);
            let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = std::sync::Arc::new(shifted);
            let len = stored.bytes.len();
            let bytes = SharedBytes::slice_of(owner, 1..1 + len).unwrap();
            let back = ParamTable::from_bytes(TableBytes { ty: stored.ty, bytes }).unwrap();
            assert_eq!(back.to_f32_vec(), values);
        }
        let odd = TableBytes { ty: ParamType::F16, bytes: vec![0u8; 3].into() };
        assert!(ParamTable::from_bytes(odd).is_err());
    }
}
