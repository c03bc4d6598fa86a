//! The W4A8 block layout: 4-bit codes arranged for byte dot products (`vpmaddubsw`, `vpdpbusd`,
//! `tdpbsud`), and group parameters stored beside them per block.
//!
//! **Codes.** Output channels go in blocks of 16 ([`BLOCK_CHANNELS`]; N a multiple of 16), input
//! channels in chunks of 8, and each block's chunks follow each other: `[N/16][Kp/8][64]` bytes, with K
//! padded with zero codes to `Kp`, a multiple of the tile K block ([`k_block`]: 32 for groups of 32, else
//! 64). Within a chunk, byte `4c + i` holds channel `c`'s code for `k = 8j + i` in its low nibble and for
//! `k = 8j + 4 + i` in its high nibble (`i` in `0..4`): one 64-byte load is a VNNI pair of K quads for 16
//! channels, unpacked with one AND and one shift ([`locate`]).
//!
//! **Group parameters** (scales, integer zero points, float offsets) in block order, `[N/16][G][16]`: a
//! block's parameters for all its groups are contiguous, so a kernel streaming the blocks reads them as
//! one sequential stream beside the codes ([`param_index`]). Checkpoints and packers hold them as
//! `[G][N]`; [`to_block_order`] and [`from_block_order`] convert.

use crate::NibbleLoc;
use crate::codes::{Codes, GroupSize, check_shape};
use crate::error::{LayoutErrorKind, Result, err};

/// Output channels per block.
pub const BLOCK_CHANNELS: usize = 16;
/// Input channels per chunk.
pub const CHUNK_INPUTS: usize = 8;
/// Bytes per chunk: 16 channels × 8 input channels × 4 bits.
pub const CHUNK_BYTES: usize = 64;

/// The tile K block for a group size on `k` input channels: a block never straddles two groups (32 for
/// groups of 32, else 64).
pub fn k_block(group: GroupSize, k: usize) -> usize {
    if group == GroupSize::PerChannel { 64 } else { group.len(k).min(64) }
}

/// K padded to the tile K block: the length of each block's rows of codes.
pub fn padded_k(group: GroupSize, k: usize) -> usize {
    k.next_multiple_of(k_block(group, k))
}

/// Where code `(n, k)` lives in the packed codes of a matrix whose padded K is `k_padded`.
#[inline]
pub fn locate(n: usize, k: usize, k_padded: usize) -> NibbleLoc {
    let (block, c) = (n / BLOCK_CHANNELS, n % BLOCK_CHANNELS);
    let (chunk, within) = (k / CHUNK_INPUTS, k % CHUNK_INPUTS);
    let chunks = k_padded / CHUNK_INPUTS;
    NibbleLoc { byte: (block * chunks + chunk) * CHUNK_BYTES + 4 * c + within % 4, high: within >= 4 }
}

/// Where group `g`'s parameter of output channel `col` lies in a block-order table of `groups` groups.
#[inline]
pub fn param_index(groups: usize, g: usize, col: usize) -> usize {
    ((col / BLOCK_CHANNELS) * groups + g) * BLOCK_CHANNELS + col % BLOCK_CHANNELS
}

fn check_n(n: usize) -> Result<()> {
    if !n.is_multiple_of(BLOCK_CHANNELS) {
        return err(LayoutErrorKind::NNotMultiple { n, multiple: BLOCK_CHANNELS });
    }
    Ok(())
}

/// Packs `codes` (N a multiple of 16) for `group`: `[N/16][Kp/8][64]` bytes, K padded with zero codes.
pub fn pack(codes: &Codes, group: GroupSize) -> Result<Vec<u8>> {
    let (n, k) = (codes.n(), codes.k());
    check_n(n)?;
    let kp = padded_k(group, k);
    let chunks = kp / CHUNK_INPUTS;
    let mut packed = vec![0u8; n / BLOCK_CHANNELS * chunks * CHUNK_BYTES];
    for (nb, block) in packed.chunks_exact_mut(chunks * CHUNK_BYTES).enumerate() {
        for c in 0..BLOCK_CHANNELS {
            for (kk, &q) in codes.row(nb * BLOCK_CHANNELS + c).iter().enumerate() {
                let (j, within) = (kk / CHUNK_INPUTS, kk % CHUNK_INPUTS);
                let byte = &mut block[j * CHUNK_BYTES + 4 * c + within % 4];
                *byte |= if within < 4 { q & 15 } else { (q & 15) << 4 };
            }
        }
    }
    Ok(packed)
}

/// Unpacks the codes of an `n × k` matrix packed for `group` (the padding dropped).
pub fn unpack(bytes: &[u8], n: usize, k: usize, group: GroupSize) -> Result<Codes> {
    check_shape(n, k)?;
    check_n(n)?;
    let kp = padded_k(group, k);
    let expected = n / BLOCK_CHANNELS * kp / CHUNK_INPUTS * CHUNK_BYTES;
    if bytes.len() != expected {
        return err(LayoutErrorKind::LengthMismatch { what: "W4A8 packed codes", expected, actual: bytes.len() });
    }
    Codes::from_fn(n, k, |r, c| locate(r, c, kp).read(bytes))
}

/// `[G][N]` → block order `[N/16][G][16]` (N a multiple of 16).
pub fn to_block_order<T: Copy>(gn: &[T], n: usize, groups: usize) -> Result<Vec<T>> {
    check_n(n)?;
    if gn.len() != groups * n {
        return err(LayoutErrorKind::LengthMismatch {
            what: "[G][N] parameters",
            expected: groups * n,
            actual: gn.len(),
        });
    }
    let mut out = Vec::with_capacity(gn.len());
    for nb in 0..n / BLOCK_CHANNELS {
        for g in 0..groups {
            out.extend_from_slice(&gn[g * n + nb * BLOCK_CHANNELS..g * n + (nb + 1) * BLOCK_CHANNELS]);
        }
    }
    Ok(out)
}

/// Block order `[N/16][G][16]` → `[G][N]`.
pub fn from_block_order<T: Copy>(blocks: &[T], n: usize, groups: usize) -> Result<Vec<T>> {
    check_n(n)?;
    if blocks.len() != groups * n {
        return err(LayoutErrorKind::LengthMismatch {
            what: "block-order parameters",
            expected: groups * n,
            actual: blocks.len(),
        });
    }
    Ok((0..groups * n).map(|i| blocks[param_index(groups, i / n, i % n)]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tile_k_block_never_straddles_a_group() {
        assert_eq!(k_block(GroupSize::G32, 576), 32);
        assert_eq!(k_block(GroupSize::G128, 576), 64);
        assert_eq!(k_block(GroupSize::PerChannel, 576), 64);
        assert_eq!(padded_k(GroupSize::G32, 40), 64);
        assert_eq!(padded_k(GroupSize::G128, 576), 576);
        assert_eq!(padded_k(GroupSize::G128, 130), 192);
    }
}
