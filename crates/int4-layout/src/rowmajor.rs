//! Row-major nibbles: the portable checkpoint form (`cpu_int4`'s `weight_packed`).
//!
//! `[N][K/2]` bytes. Byte `j` of row `n` holds `code[n][2j]` in its low nibble and `code[n][2j + 1]` in its
//! high nibble, so a K range of a row is a contiguous byte range and tensor-parallel slicing along K is a
//! plain slice. K must be even.

use crate::NibbleLoc;
use crate::codes::{Codes, check_shape};
use crate::error::{LayoutErrorKind, Result, err};

/// Where code `(n, k)` lives in a row-major nibble buffer of a matrix with `k_total` input channels.
#[inline]
pub fn locate(n: usize, k: usize, k_total: usize) -> NibbleLoc {
    NibbleLoc { byte: n * (k_total / 2) + k / 2, high: k % 2 == 1 }
}

/// Packs codes as row-major nibbles.
pub fn pack(codes: &Codes) -> Result<Vec<u8>> {
    check_even_k(codes.k())?;
    Ok(codes.as_slice().chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect())
}

/// Unpacks row-major nibbles of an `n × k` matrix.
pub fn unpack(bytes: &[u8], n: usize, k: usize) -> Result<Codes> {
    check_len(bytes, n, k)?;
    let mut data = Vec::with_capacity(n * k);
    for &b in bytes {
        data.push(b & 0xF);
        data.push(b >> 4);
    }
    Codes::new(n, k, data)
}

/// Unpacks one row's nibbles (`k/2` bytes) into `out` (`k` codes).
#[inline]
pub fn unpack_row_into(row: &[u8], out: &mut [u8]) {
    for (pair, &b) in out.chunks_exact_mut(2).zip(row) {
        pair[0] = b & 0xF;
        pair[1] = b >> 4;
    }
}

pub(crate) fn check_even_k(k: usize) -> Result<()> {
    if !k.is_multiple_of(2) {
        return err(LayoutErrorKind::OddK { k });
    }
    Ok(())
}

pub(crate) fn check_len(bytes: &[u8], n: usize, k: usize) -> Result<()> {
    check_shape(n, k)?;
    check_even_k(k)?;
    if bytes.len() != n * k / 2 {
        return err(LayoutErrorKind::LengthMismatch {
            what: "packed nibbles",
            expected: n * k / 2,
            actual: bytes.len(),
        });
    }
    Ok(())
}
