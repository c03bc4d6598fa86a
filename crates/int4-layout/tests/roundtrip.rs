//! Round trips: every byte value through every byte layout, and proptest over random shapes and codes.

mod common;

use common::Rng;
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{Codes, gptq, halves, rowmajor};
use proptest::prelude::*;

/// A buffer holding every byte value once unpacks to codes that pack back to the same buffer, for every
/// byte-packed layout.
#[test]
fn all_256_byte_values_round_trip() {
    let bytes: Vec<u8> = (0..=255u8).collect();
    // 256 bytes = 512 codes: shapes chosen so each layout's buffer is exactly 256 bytes.
    let rm = rowmajor::unpack(&bytes, 16, 32).unwrap();
    assert_eq!(rowmajor::pack(&rm).unwrap(), bytes);
    let sh = halves::unpack(&bytes, 16, 32).unwrap();
    assert_eq!(halves::pack(&sh).unwrap(), bytes);
    for (block, n, k) in [(TinygemmBlock::N64, 64, 8), (TinygemmBlock::N32, 32, 16), (TinygemmBlock::N64, 16, 32)] {
        let codes = TinygemmMatrix::new(&bytes, n, k, block).unwrap().unpack();
        assert_eq!(tinygemm::pack(&codes, block).unwrap(), bytes, "{block:?} N={n}");
    }
}

#[test]
fn every_nibble_value_in_every_word_position_round_trips_through_gptq_and_awq() {
    // Words whose 8 nibbles run through all 16 values at every position.
    let words: Vec<i32> =
        (0..16u32).map(|v| (0..8).fold(0u32, |w, i| w | (((v + i) % 16) << (4 * i))) as i32).collect();
    // qweight [K/8, N] with K = 16, N = 8.
    let codes = gptq::unpack_qweight(&words, 16, 8).unwrap();
    assert_eq!(gptq::pack_qweight(&codes).unwrap(), words);
    let vals = gptq::unpack_awq(&words, 2, 64).unwrap();
    assert_eq!(gptq::pack_awq(&vals, 2, 64).unwrap(), words);
    for format in [gptq::ZeroFormat::V1, gptq::ZeroFormat::V2] {
        let zeros = gptq::unpack_qzeros(&words, 2, 64, format).unwrap();
        if format == gptq::ZeroFormat::V2 {
            assert_eq!(gptq::pack_qzeros(&zeros, 2, 64, format).unwrap(), words);
        } else {
            // v1 reads a stored 15 as 16, which cannot be written back; all others round-trip.
            assert!(zeros.contains(&16));
        }
    }
}

fn shape() -> impl Strategy<Value = (usize, usize, u64)> {
    (1usize..14, 1usize..48, any::<u64>()).prop_map(|(n16, k2, seed)| (n16 * 16, k2 * 2, seed))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn byte_layouts_round_trip((n, k, seed) in shape()) {
        let codes = Rng::new(seed).codes(n, k);
        prop_assert_eq!(rowmajor::unpack(&rowmajor::pack(&codes).unwrap(), n, k).unwrap(), codes.clone());
        prop_assert_eq!(halves::unpack(&halves::pack(&codes).unwrap(), n, k).unwrap(), codes.clone());
        for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
            let packed = tinygemm::pack(&codes, block).unwrap();
            prop_assert_eq!(TinygemmMatrix::new(&packed, n, k, block).unwrap().unpack(), codes.clone());
            // Packing from row-major nibbles in chunks gives the same bytes for any chunk of whole blocks.
            let rm = rowmajor::pack(&codes).unwrap();
            let chunk = block.width() * (1 + (seed as usize % 3));
            let mut out = vec![0u8; n * k / 2];
            tinygemm::pack_from_row_major_chunked(&rm, n, k, block, chunk, &mut out).unwrap();
            prop_assert_eq!(out, packed);
        }
    }

    #[test]
    fn word_layouts_round_trip(n8 in 1usize..20, k8 in 1usize..20, seed in any::<u64>()) {
        let (n, k) = (n8 * 8, k8 * 8);
        let codes: Codes = Rng::new(seed).codes(n, k);
        prop_assert_eq!(gptq::unpack_qweight(&gptq::pack_qweight(&codes).unwrap(), k, n).unwrap(), codes.clone());
        let kn: Vec<u8> = (0..k * n).map(|i| codes.get(i % n, i / n)).collect();
        let awq = gptq::pack_awq(&kn, k, n).unwrap();
        prop_assert_eq!(gptq::unpack_awq_qweight(&awq, k, n).unwrap(), codes);
    }
}

/// Parameters survive the artifact byte form bit for bit (negative zero and subnormals included), and a
/// wrong length or a non-finite value is refused.
#[test]
fn group_params_round_trip_through_bytes() {
    use int4_layout::{GroupParams, GroupSize};
    let (n, k) = (48, 200);
    let g = GroupSize::G64.groups(k);
    let scale: Vec<f32> = (0..n * g).map(|i| if i == 3 { f32::MIN_POSITIVE / 4.0 } else { i as f32 * 0.37 }).collect();
    let zero: Vec<f32> = (0..n * g).map(|i| if i == 5 { -0.0 } else { -(i as f32) * 1.5 }).collect();
    let p = GroupParams::new(n, k, GroupSize::G64, scale, zero).unwrap();
    let bytes = p.to_le_bytes();
    let back = GroupParams::from_le_bytes(n, k, GroupSize::G64, &bytes).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(back.scales()), bits(p.scales()));
    assert_eq!(bits(back.zeros()), bits(p.zeros()));
    assert!(GroupParams::from_le_bytes(n, k, GroupSize::G64, &bytes[..bytes.len() - 4]).is_err());
    let mut nan = bytes.clone();
    nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(GroupParams::from_le_bytes(n, k, GroupSize::G64, &nan).is_err());
}
