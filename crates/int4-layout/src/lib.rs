//! 4-bit weight grids and packed layouts, with no knowledge of CPUs.
//!
//! A 4-bit linear layer is an `N × K` matrix of codes in `0..16` ([`Codes`]) plus a scale and zero per
//! output channel and group of input channels ([`GroupParams`]). This crate turns f32 weights into that
//! ([`grid`]), decodes it back by one rounding rule ([`dequantize`]), and moves it between every byte
//! arrangement the project meets:
//!
//! | layout | module | used by |
//! |---|---|---|
//! | row-major nibbles `[N][K/2]` | [`rowmajor`] | `cpu_int4` checkpoints |
//! | tinygemm `[N/64][K][32]` (and `[N/32][K][16]`) | [`tinygemm`] | the W4A16 kernels, prefill dequant, embedding lookup |
//! | split halves `[N][K/2]` | [`halves`] | the `direct_dequant: false` prefill |
//! | GPTQ `qweight`/`qzeros`/`scales`/`g_idx`, AWQ | [`gptq`] | GPTQ/AWQ checkpoints, the W4A8 repack |
//! | W4A8 blocks `[N/16][Kp/8][64]`, parameters `[N/16][G][16]` | [`w4a8`] | the W4A8 kernels (byte dot products) |
//!
//! [`convert`] maps integer zero points onto tinygemm's float zero. Each layout module documents its
//! index-to-byte map in words and exposes it as a `locate` function; the tests pack index patterns and check
//! that every nibble lands where that map says, and check the tinygemm layouts byte for byte against bytes
//! recorded from PyTorch.
//!
//! The crate has no unsafe code and no dependency on how (or whether) a CPU runs these layouts: tooling can
//! depend on it alone.
//!
//! ```
//! use int4_layout::{GroupSize, grid, tinygemm};
//! let (n, k) = (80, 576); // a 64-channel block plus a 16-channel tail; K has a partial last group
//! let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
//! let q = grid::quantize_asymmetric(&w, n, k, GroupSize::G128, grid::ScaleSearch::Shrink, grid::ParamPrecision::F32)?;
//! let packed = tinygemm::pack(&q.codes, tinygemm::TinygemmBlock::N64)?;
//! let m = tinygemm::TinygemmMatrix::new(&packed, n, k, tinygemm::TinygemmBlock::N64)?;
//! let mut row = vec![0.0f32; k];
//! m.decode_row(&q.params, 70, 0..k, &mut row)?; // an embedding lookup, straight from the packed bytes
//! assert_eq!(row[5], q.params.weight(70, 5, q.codes.get(70, 5)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod codes;
pub mod convert;
pub mod error;
pub mod gptq;
pub mod grid;
pub mod halves;
pub mod rowmajor;
pub mod tinygemm;
pub mod w4a8;

pub use codes::{Codes, GroupParams, GroupSize, dequantize};
pub use error::{LayoutError, LayoutErrorKind, Result};

use error::err;

/// Where one code lives in a byte-packed layout: a byte index and which nibble.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NibbleLoc {
    /// Index of the byte in the packed buffer.
    pub byte: usize,
    /// `true` for bits 4..8, `false` for bits 0..4.
    pub high: bool,
}

impl NibbleLoc {
    /// Reads the nibble from `bytes`.
    #[inline]
    pub fn read(self, bytes: &[u8]) -> u8 {
        let b = bytes[self.byte];
        if self.high { b >> 4 } else { b & 0xF }
    }
}

/// An element type decoders write: f32, or bf16 rounded to nearest-even from the f32 value.
pub trait DequantTarget: Copy {
    /// Converts the f32 weight.
    fn from_f32(x: f32) -> Self;
}

impl DequantTarget for f32 {
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl DequantTarget for half::bf16 {
    #[inline]
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

pub(crate) fn check_params(params: &GroupParams, n: usize, k: usize) -> Result<()> {
    if params.n() != n || params.k() != k {
        return err(LayoutErrorKind::LengthMismatch {
            what: "group parameters (N·K)",
            expected: n * k,
            actual: params.n() * params.k(),
        });
    }
    Ok(())
}

pub(crate) fn check_range(range: &std::ops::Range<usize>, k: usize, out_expected: usize, out_len: usize) -> Result<()> {
    if range.start > range.end || range.end > k {
        return err(LayoutErrorKind::OutOfBounds { what: "K range end", index: range.end, bound: k });
    }
    if out_len != out_expected {
        return err(LayoutErrorKind::LengthMismatch { what: "output", expected: out_expected, actual: out_len });
    }
    Ok(())
}
