//! PyTorch's tinygemm CPU layouts: the bytes `_convert_weight_to_int4pack_for_cpu` returns.
//!
//! PyTorch picks its packer at run time from the CPU capability, so there are two layouts, named here by
//! their channel block width ([`TinygemmBlock`]):
//!
//! * [`TinygemmBlock::N64`] — what PyTorch emits under an AVX-512 capability. Output channels are cut into
//!   blocks of 64; block `b` occupies bytes `[64b·K/2, 64(b+1)·K/2)` as `[K][32]`: for each input channel
//!   `k`, 32 bytes in which byte `d` holds channel `64b + d` in its low nibble and channel `64b + d + 32` in
//!   its high nibble. K is the middle axis, so any K range of a block is one contiguous byte range.
//! * [`TinygemmBlock::N32`] — what PyTorch emits under AVX2: blocks of 32 channels stored as `[K][16]`, byte
//!   `d` holding channel `32b + d` (low) and `32b + d + 16` (high).
//!
//! **The tail.** When N is not a multiple of the block width, the last block has `t = N mod width`
//! channels (16, 32 or 48 for N64; 16 for N32). PyTorch packs it as `[K][t/2]` with *adjacent pairs*:
//! byte `j` of input channel `k` holds channel `c0 + 2j` (low) and `c0 + 2j + 1` (high), where `c0` is the
//! tail's first channel. N = 16, 48, 80 (64 + 16) and 144 (2·64 + 16) all have such tails. N must be a
//! multiple of 16 and K even; [`crate::Codes::padded_n`] pads any other N with zero channels.
//!
//! [`locate`] is that map in code; every packer, unpacker and decoder here is built on it or proven
//! against it, and the tests prove it against bytes recorded from PyTorch itself.
//!
//! **Direct dequantization.** [`TinygemmMatrix::decode_k_range`] and [`TinygemmMatrix::decode_row`]
//! dequantize straight from the packed bytes (tails included), so prefill and embedding lookup never need a
//! row-major copy. [`supports_direct_dequant`] is true for every N this packer accepts.
//!
//! **Blocked repack.** [`pack_from_row_major_chunked`] converts a checkpoint's row-major nibbles in chunks
//! of whole channel blocks, so the transient is `chunk × K` bytes rather than the whole unpacked matrix;
//! blocks are independent, so the result is byte-identical to packing at once.

use std::ops::Range;

use crate::NibbleLoc;
use crate::codes::{Codes, GroupParams, check_shape, dequantize};
use crate::error::{LayoutErrorKind, Result, err};
use crate::rowmajor;
use crate::{DequantTarget, check_params, check_range};

/// N must be a multiple of this for the tinygemm packers (PyTorch's `PACK_N_ALIGN`).
pub const N_ALIGN: usize = 16;

/// The channel block width of a tinygemm layout, i.e. which PyTorch packer produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TinygemmBlock {
    /// 64-channel blocks, byte `d` = channel `d` | channel `d + 32`: PyTorch's AVX-512 packer.
    N64,
    /// 32-channel blocks, byte `d` = channel `d` | channel `d + 16`: PyTorch's AVX2 packer.
    N32,
}

impl TinygemmBlock {
    /// Channels per full block.
    #[inline]
    pub const fn width(self) -> usize {
        match self {
            TinygemmBlock::N64 => 64,
            TinygemmBlock::N32 => 32,
        }
    }
}

/// Whether [`TinygemmMatrix`]'s decoders are correct for a matrix with `n` output channels: exactly when
/// the packer accepts `n` (a positive multiple of 16), tails included.
pub fn supports_direct_dequant(n: usize) -> bool {
    n > 0 && n.is_multiple_of(N_ALIGN)
}

/// Where code `(n, k)` lives in a tinygemm buffer of an `n_total × k_total` matrix.
#[inline]
pub fn locate(block: TinygemmBlock, n: usize, k: usize, n_total: usize, k_total: usize) -> NibbleLoc {
    let width = block.width();
    let c0 = n - n % width;
    let nb = width.min(n_total - c0);
    let base = c0 * k_total / 2;
    let d = n - c0;
    if nb == width {
        let half = width / 2;
        NibbleLoc { byte: base + k * half + d % half, high: d >= half }
    } else {
        NibbleLoc { byte: base + k * (nb / 2) + d / 2, high: d % 2 == 1 }
    }
}

/// The two channels (offsets within their block) that share byte `j` of each K line of a block of `nb`
/// channels: `(j, j + width/2)` in a full block, `(2j, 2j + 1)` in a tail.
#[inline]
fn pair_in_block(nb: usize, width: usize, j: usize) -> (usize, usize) {
    if nb == width { (j, j + width / 2) } else { (2 * j, 2 * j + 1) }
}

/// Checks that an `n × k` matrix can be packed: `n` a positive multiple of 16, `k` positive and even.
pub fn check_packable(n: usize, k: usize) -> Result<()> {
    check_shape(n, k)?;
    if !n.is_multiple_of(N_ALIGN) {
        return err(LayoutErrorKind::NNotMultiple { n, multiple: N_ALIGN });
    }
    rowmajor::check_even_k(k)
}

/// Packs codes into a tinygemm layout.
pub fn pack(codes: &Codes, block: TinygemmBlock) -> Result<Vec<u8>> {
    let (n, k) = (codes.n(), codes.k());
    check_packable(n, k)?;
    let mut out = vec![0u8; n * k / 2];
    pack_rows_into(codes.as_slice(), 0, n, k, block, &mut out);
    Ok(out)
}

/// Writes the blocks of channels `c0..c0 + rows.len()/k` (whole blocks, or the tail) into `out`, the whole
/// packed buffer. `rows` holds those channels' codes, row-major.
fn pack_rows_into(rows: &[u8], c0: usize, n_total: usize, k: usize, block: TinygemmBlock, out: &mut [u8]) {
    let width = block.width();
    let count = rows.len() / k;
    let mut start = 0;
    while start < count {
        let nb = width.min(n_total - (c0 + start));
        let dst = &mut out[(c0 + start) * k / 2..(c0 + start + nb) * k / 2];
        let src = &rows[start * k..(start + nb) * k];
        // Each output byte pairs two channels (lo, hi); walk one pair at a time so both source rows are read
        // contiguously and the writes stay inside this block's `K·nb/2` bytes.
        let line = nb / 2;
        for j in 0..line {
            let (lo, hi) = pair_in_block(nb, width, j);
            let (src_lo, src_hi) = (&src[lo * k..(lo + 1) * k], &src[hi * k..(hi + 1) * k]);
            for (kk, (&a, &b)) in src_lo.iter().zip(src_hi).enumerate() {
                dst[kk * line + j] = a | (b << 4);
            }
        }
        start += nb;
    }
}

/// Converts row-major nibbles (the checkpoint form, `[N][K/2]`) into a tinygemm layout, `chunk` channels
/// at a time, writing into `out` (`N·K/2` bytes, for example a memory-mapped cache file).
///
/// `chunk` must be a positive multiple of the block width; the transient is `chunk × K` bytes of unpacked
/// codes. The result is byte-identical to [`pack`] of the whole matrix for every chunk size.
pub fn pack_from_row_major_chunked(
    row_major: &[u8],
    n: usize,
    k: usize,
    block: TinygemmBlock,
    chunk: usize,
    out: &mut [u8],
) -> Result<()> {
    check_packable(n, k)?;
    rowmajor::check_len(row_major, n, k)?;
    if chunk == 0 || !chunk.is_multiple_of(block.width()) {
        return err(LayoutErrorKind::BadChunk { chunk, block: block.width() });
    }
    if out.len() != n * k / 2 {
        return err(LayoutErrorKind::LengthMismatch { what: "packed output", expected: n * k / 2, actual: out.len() });
    }
    let mut codes = vec![0u8; chunk.min(n) * k];
    let mut c0 = 0;
    while c0 < n {
        let rows = chunk.min(n - c0);
        let buf = &mut codes[..rows * k];
        for (r, dst) in buf.chunks_exact_mut(k).enumerate() {
            let src = &row_major[(c0 + r) * k / 2..(c0 + r + 1) * k / 2];
            rowmajor::unpack_row_into(src, dst);
        }
        pack_rows_into(buf, c0, n, k, block, out);
        c0 += rows;
    }
    Ok(())
}

/// A borrowed tinygemm buffer with its shape: the thing kernels and decoders read.
#[derive(Clone, Copy, Debug)]
pub struct TinygemmMatrix<'a> {
    bytes: &'a [u8],
    n: usize,
    k: usize,
    block: TinygemmBlock,
}

impl<'a> TinygemmMatrix<'a> {
    /// Wraps `bytes` as the tinygemm layout of an `n × k` matrix; checks the shape and the length.
    pub fn new(bytes: &'a [u8], n: usize, k: usize, block: TinygemmBlock) -> Result<Self> {
        check_packable(n, k)?;
        if bytes.len() != n * k / 2 {
            return err(LayoutErrorKind::LengthMismatch {
                what: "tinygemm buffer",
                expected: n * k / 2,
                actual: bytes.len(),
            });
        }
        Ok(TinygemmMatrix { bytes, n, k, block })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The block width.
    pub fn block(&self) -> TinygemmBlock {
        self.block
    }

    /// The packed bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The code at `(n, k)`. Panics if out of bounds.
    #[inline]
    pub fn code(&self, n: usize, k: usize) -> u8 {
        assert!(n < self.n && k < self.k, "code ({n}, {k}) outside {}x{}", self.n, self.k);
        let loc = locate(self.block, n, k, self.n, self.k);
        loc.read(self.bytes)
    }

    /// Unpacks every code.
    pub fn unpack(&self) -> Codes {
        let (n, k) = (self.n, self.k);
        let mut data = vec![0u8; n * k];
        let width = self.block.width();
        let mut c0 = 0;
        while c0 < n {
            let nb = width.min(n - c0);
            let src = &self.bytes[c0 * k / 2..(c0 + nb) * k / 2];
            let dst = &mut data[c0 * k..(c0 + nb) * k];
            let line = nb / 2;
            for j in 0..line {
                let (lo, hi) = pair_in_block(nb, width, j);
                for kk in 0..k {
                    let b = src[kk * line + j];
                    dst[lo * k + kk] = b & 0xF;
                    dst[hi * k + kk] = b >> 4;
                }
            }
            c0 += nb;
        }
        Codes::new(n, k, data).expect("shape was checked at construction and nibbles are below 16")
    }

    /// Dequantizes input channels `k_range` of every output channel into `out` (`[N][k_range.len()]`,
    /// row-major), straight from the packed bytes: one pass over each block's contiguous K range.
    pub fn decode_k_range<T: DequantTarget>(
        &self,
        params: &GroupParams,
        k_range: Range<usize>,
        out: &mut [T],
    ) -> Result<()> {
        check_params(params, self.n, self.k)?;
        check_range(&k_range, self.k, self.n * k_range.len(), out.len())?;
        let (n, k) = (self.n, self.k);
        let width = self.block.width();
        let w = k_range.len();
        let g_len = params.group_size().len(k);
        let mut c0 = 0;
        while c0 < n {
            let nb = width.min(n - c0);
            let block = &self.bytes[c0 * k / 2..(c0 + nb) * k / 2];
            let line = nb / 2;
            for j in 0..line {
                let (lo, hi) = pair_in_block(nb, width, j);
                for (d, high) in [(lo, false), (hi, true)] {
                    let row = c0 + d;
                    let dst = &mut out[row * w..(row + 1) * w];
                    // One group at a time, so the scale and zero are looked up once per segment.
                    let mut kk = k_range.start;
                    while kk < k_range.end {
                        let g = kk / g_len;
                        let seg_end = ((g + 1) * g_len).min(k_range.end);
                        let (scale, zero) = (params.scale(row, g), params.zero(row, g));
                        for x in kk..seg_end {
                            let b = block[x * line + j];
                            let q = if high { b >> 4 } else { b & 0xF };
                            dst[x - k_range.start] = T::from_f32(dequantize(q, scale, zero));
                        }
                        kk = seg_end;
                    }
                }
            }
            c0 += nb;
        }
        Ok(())
    }

    /// Dequantizes input channels `k_range` of output channel `row` into `out` (an embedding lookup).
    pub fn decode_row<T: DequantTarget>(
        &self,
        params: &GroupParams,
        row: usize,
        k_range: Range<usize>,
        out: &mut [T],
    ) -> Result<()> {
        check_params(params, self.n, self.k)?;
        if row >= self.n {
            return err(LayoutErrorKind::OutOfBounds { what: "row", index: row, bound: self.n });
        }
        check_range(&k_range, self.k, k_range.len(), out.len())?;
        for (o, kk) in out.iter_mut().zip(k_range) {
            let loc = locate(self.block, row, kk, self.n, self.k);
            *o = T::from_f32(params.weight(row, kk, loc.read(self.bytes)));
        }
        Ok(())
    }
}
