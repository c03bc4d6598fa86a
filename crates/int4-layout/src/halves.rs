//! Split halves: the deinterleaved planes of the upstream system's `direct_dequant: false` path.
//!
//! `[N][K/2]` bytes. Byte `j` of row `n` holds `code[n][j]` in its low nibble and `code[n][j + K/2]` in its
//! high nibble: the low nibbles of a row are input channels `0..K/2` and the high nibbles `K/2..K`, each
//! plane contiguous, so a decoder needs no lane shuffle. K must be even.
//!
//! A group may straddle `K/2` (SmolLM2's `K = 576` at `g = 128`: group 2 covers `256..384`, across 288);
//! [`decode_k_range`] looks each input channel's group up by its true index, so that case decodes
//! correctly (the upstream decoder needed `K % 2g == 0` and did not check it).

use crate::NibbleLoc;
use crate::codes::{Codes, GroupParams};
use crate::error::Result;
use crate::rowmajor::{check_even_k, check_len};
use crate::{DequantTarget, check_params, check_range};

/// Where code `(n, k)` lives in split halves of a matrix with `k_total` input channels.
#[inline]
pub fn locate(n: usize, k: usize, k_total: usize) -> NibbleLoc {
    let half = k_total / 2;
    NibbleLoc { byte: n * half + k % half, high: k >= half }
}

/// Packs codes as split halves.
pub fn pack(codes: &Codes) -> Result<Vec<u8>> {
    check_even_k(codes.k())?;
    let half = codes.k() / 2;
    let mut out = Vec::with_capacity(codes.n() * half);
    for n in 0..codes.n() {
        let row = codes.row(n);
        out.extend((0..half).map(|j| row[j] | (row[j + half] << 4)));
    }
    Ok(out)
}

/// Unpacks split halves of an `n × k` matrix.
pub fn unpack(bytes: &[u8], n: usize, k: usize) -> Result<Codes> {
    check_len(bytes, n, k)?;
    let half = k / 2;
    let mut data = vec![0u8; n * k];
    for (src, dst) in bytes.chunks_exact(half).zip(data.chunks_exact_mut(k)) {
        for (j, &b) in src.iter().enumerate() {
            dst[j] = b & 0xF;
            dst[j + half] = b >> 4;
        }
    }
    Codes::new(n, k, data)
}

/// Dequantizes input channels `k_range` of every row into `out` (`[N][k_range.len()]`, row-major).
pub fn decode_k_range<T: DequantTarget>(
    bytes: &[u8],
    params: &GroupParams,
    k_range: std::ops::Range<usize>,
    out: &mut [T],
) -> Result<()> {
    let (n, k) = (params.n(), params.k());
    check_len(bytes, n, k)?;
    check_params(params, n, k)?;
    check_range(&k_range, k, n * k_range.len(), out.len())?;
    let half = k / 2;
    let width = k_range.len();
    for row in 0..n {
        let src = &bytes[row * half..(row + 1) * half];
        let dst = &mut out[row * width..(row + 1) * width];
        for (o, kk) in dst.iter_mut().zip(k_range.clone()) {
            let b = src[kk % half];
            let q = if kk >= half { b >> 4 } else { b & 0xF };
            *o = T::from_f32(params.weight(row, kk, q));
        }
    }
    Ok(())
}
