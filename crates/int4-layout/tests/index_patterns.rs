//! Proofs by index pattern: for every layout, pack bit-planes of each code's `(n, k)` index and check that
//! the documented map (`locate`) finds every one of them, exhaustively over N in 16..192 (tails included)
//! and several K. The packers do not use `locate`, so each proof compares two independent readings of the
//! layout's documentation.

mod common;

use common::{PROOF_N, assert_index_pattern, index_plane, planes_for};
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{GroupSize, gptq, halves, rowmajor, w4a8};

const PROOF_K: [usize; 5] = [2, 8, 64, 130, 576];

fn planes<T>(n: usize, k: usize, pack: impl Fn(&int4_layout::Codes) -> T) -> Vec<T> {
    (0..planes_for(n, k)).map(|p| pack(&index_plane(n, k, p))).collect()
}

#[test]
fn row_major_map() {
    for n in PROOF_N {
        for k in PROOF_K {
            let packed = planes(n, k, |c| rowmajor::pack(c).unwrap());
            assert_index_pattern(n, k, |p, r, c| rowmajor::locate(r, c, k).read(&packed[p]), "row-major");
        }
    }
}

#[test]
fn split_halves_map() {
    for n in PROOF_N {
        for k in PROOF_K {
            let packed = planes(n, k, |c| halves::pack(c).unwrap());
            assert_index_pattern(n, k, |p, r, c| halves::locate(r, c, k).read(&packed[p]), "split halves");
        }
    }
}

#[test]
fn tinygemm_maps_for_both_block_widths() {
    for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
        for n in PROOF_N {
            for k in PROOF_K {
                let packed = planes(n, k, |c| tinygemm::pack(c, block).unwrap());
                assert_index_pattern(
                    n,
                    k,
                    |p, r, c| tinygemm::locate(block, r, c, n, k).read(&packed[p]),
                    &format!("tinygemm {block:?}"),
                );
                // The matrix view's own reader and unpacker agree with the map too.
                assert_index_pattern(
                    n,
                    k,
                    |p, r, c| TinygemmMatrix::new(&packed[p], n, k, block).unwrap().code(r, c),
                    "TinygemmMatrix::code",
                );
                let unpacked: Vec<_> =
                    packed.iter().map(|b| TinygemmMatrix::new(b, n, k, block).unwrap().unpack()).collect();
                assert_index_pattern(n, k, |p, r, c| unpacked[p].get(r, c), "TinygemmMatrix::unpack");
            }
        }
    }
}

/// The map in words, checked on its defining cases: byte d of a full block holds channels d and d+32
/// (N64) or d and d+16 (N32); a tail holds adjacent pairs; K is the middle axis.
#[test]
fn tinygemm_map_matches_its_description() {
    use int4_layout::NibbleLoc;
    let k = 10;
    // N = 80: one full 64-block (bytes 0..320) and a 16-channel tail (bytes 320..400).
    let loc = |n, kk| tinygemm::locate(TinygemmBlock::N64, n, kk, 80, k);
    assert_eq!(loc(0, 0), NibbleLoc { byte: 0, high: false });
    assert_eq!(loc(32, 0), NibbleLoc { byte: 0, high: true });
    assert_eq!(loc(31, 3), NibbleLoc { byte: 3 * 32 + 31, high: false });
    assert_eq!(loc(63, 3), NibbleLoc { byte: 3 * 32 + 31, high: true });
    assert_eq!(loc(64, 0), NibbleLoc { byte: 320, high: false });
    assert_eq!(loc(65, 0), NibbleLoc { byte: 320, high: true });
    assert_eq!(loc(79, 9), NibbleLoc { byte: 320 + 9 * 8 + 7, high: true });
    // N = 48 under N32: a full 32-block then a 16 tail.
    let loc32 = |n, kk| tinygemm::locate(TinygemmBlock::N32, n, kk, 48, k);
    assert_eq!(loc32(16, 2), NibbleLoc { byte: 2 * 16, high: true });
    assert_eq!(loc32(33, 1), NibbleLoc { byte: 32 * k / 2 + 8, high: true });
}

#[test]
fn gptq_qweight_map() {
    for n in PROOF_N {
        for k in [8, 64, 136, 576] {
            let packed = planes(n, k, |c| gptq::pack_qweight(c).unwrap());
            assert_index_pattern(n, k, |p, r, c| gptq::locate(r, c, n).read(&packed[p]), "GPTQ qweight");
            let unpacked: Vec<_> = packed.iter().map(|q| gptq::unpack_qweight(q, k, n).unwrap()).collect();
            assert_index_pattern(n, k, |p, r, c| unpacked[p].get(r, c), "GPTQ unpack");
        }
    }
}

#[test]
fn awq_map() {
    // AWQ packs [rows][N] along N; here rows play the role of K.
    for n in [8, 16, 48, 80, 144] {
        for rows in [1, 7, 64] {
            let planes_n = planes_for(n, rows);
            let packed: Vec<Vec<i32>> = (0..planes_n)
                .map(|p| {
                    let vals: Vec<u8> =
                        (0..rows * n).map(|i| ((i / n + (i % n) * rows) >> (4 * p)) as u8 & 0xF).collect();
                    gptq::pack_awq(&vals, rows, n).unwrap()
                })
                .collect();
            // Index (col, row) as n·rows + row so the helper's (n, k) is (column, row).
            assert_index_pattern(n, rows, |p, col, row| gptq::awq_locate(row, col, n).read(&packed[p]), "AWQ");
        }
    }
}

#[test]
fn gptq_qzeros_map_is_packed_along_n() {
    let (groups, n) = (3, 24);
    let zeros: Vec<u8> = (0..groups * n).map(|i| (i % 15) as u8 + 1).collect();
    let words = gptq::pack_qzeros(&zeros, groups, n, gptq::ZeroFormat::V2).unwrap();
    for g in 0..groups {
        for c in 0..n {
            let nib = (words[g * n / 8 + c / 8] as u32 >> (4 * (c % 8))) & 0xF;
            assert_eq!(nib as u8, zeros[g * n + c]);
        }
    }
}

#[test]
fn w4a8_block_map() {
    for group in [GroupSize::G32, GroupSize::G128, GroupSize::PerChannel] {
        for n in PROOF_N {
            for k in PROOF_K {
                let kp = w4a8::padded_k(group, k);
                let packed = planes(n, k, |c| w4a8::pack(c, group).unwrap());
                assert_index_pattern(n, k, |p, r, c| w4a8::locate(r, c, kp).read(&packed[p]), "W4A8 blocks");
                let unpacked: Vec<_> = packed.iter().map(|b| w4a8::unpack(b, n, k, group).unwrap()).collect();
                assert_index_pattern(n, k, |p, r, c| unpacked[p].get(r, c), "w4a8::unpack");
                // The padding is zero codes: every byte the map does not reach is 0.
                let mut reached = vec![0u8; packed[0].len()];
                for r in 0..n {
                    for c in 0..k {
                        let loc = w4a8::locate(r, c, kp);
                        reached[loc.byte] |= if loc.high { 0xF0 } else { 0x0F };
                    }
                }
                for plane in &packed {
                    assert!(plane.iter().zip(&reached).all(|(b, m)| b & !m == 0), "N={n} K={k}: padding not zero");
                }
            }
        }
    }
}

#[test]
fn w4a8_map_matches_its_description() {
    // Byte 4c + i of chunk j holds channel c's code for k = 8j + i (low) and k = 8j + 4 + i (high).
    let k = 16;
    let kp = w4a8::padded_k(GroupSize::G32, k);
    assert_eq!(kp, 32, "K is padded to the tile K block");
    for c in 0..16 {
        for i in 0..4 {
            assert_eq!(w4a8::locate(c, 8 + i, kp), int4_layout::NibbleLoc { byte: 64 + 4 * c + i, high: false });
            assert_eq!(w4a8::locate(c, 12 + i, kp), int4_layout::NibbleLoc { byte: 64 + 4 * c + i, high: true });
        }
    }
    // The second block of 16 channels starts after the first block's Kp/8 chunks.
    assert_eq!(w4a8::locate(16, 0, kp).byte, kp / 8 * 64);
}

#[test]
fn w4a8_parameters_in_block_order() {
    for n in PROOF_N {
        for groups in [1, 3, 18] {
            let gn: Vec<usize> = (0..groups * n).collect();
            let blocks = w4a8::to_block_order(&gn, n, groups).unwrap();
            for g in 0..groups {
                for col in 0..n {
                    assert_eq!(blocks[w4a8::param_index(groups, g, col)], g * n + col, "N={n} G={groups}");
                }
            }
            // A block's parameters for all its groups are contiguous: block nb spans nb·G·16 .. (nb+1)·G·16.
            for nb in 0..n / 16 {
                let span = &blocks[nb * groups * 16..(nb + 1) * groups * 16];
                assert!(span.iter().all(|&i| (i % n) / 16 == nb), "N={n} G={groups} block {nb}");
            }
            assert_eq!(w4a8::from_block_order(&blocks, n, groups).unwrap(), gn);
        }
    }
    assert!(w4a8::to_block_order(&[0u8; 24], 24, 1).is_err(), "N must be a multiple of 16");
}
