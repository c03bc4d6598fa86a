//! Direct dequantization from the packed layouts, the predicate that says where it is right, blocked
//! repacking, split halves with a group straddling K/2, and padding N to a multiple of 16.

mod common;

use common::Rng;
use half::bf16;
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix, supports_direct_dequant};
use int4_layout::{Codes, GroupParams, GroupSize, LayoutErrorKind, halves, rowmajor};

/// The reference: each weight from its code and group by the crate's one rule, row-major `[N][k_range]`.
fn reference(codes: &Codes, params: &GroupParams, k_range: std::ops::Range<usize>) -> Vec<f32> {
    let mut out = Vec::new();
    for n in 0..codes.n() {
        for k in k_range.clone() {
            out.push(params.weight(n, k, codes.get(n, k)));
        }
    }
    out
}

fn random_params(rng: &mut Rng, n: usize, k: usize, group: GroupSize) -> GroupParams {
    let g = group.groups(k);
    let scale = (0..n * g).map(|_| 0.01 + rng.unit() * 0.1).collect();
    let zero = (0..n * g).map(|_| rng.normal() * 0.1).collect();
    GroupParams::new(n, k, group, scale, zero).unwrap()
}

/// The predicate is true exactly where the decoder is right: for every N from 1 to 320, either the
/// predicate holds and decoding (every K range shape below) matches the reference, or it does not hold and
/// the packer and the decoder refuse the shape with a clear error.
#[test]
fn supports_direct_dequant_is_true_exactly_where_the_decoder_is_right() {
    let mut rng = Rng::new(7);
    let k = 72; // two groups of 32 plus a partial group of 8
    let group = GroupSize::G32;
    let mut accepted = 0;
    for n in 1..=320 {
        let codes = rng.codes(n, k);
        let params = random_params(&mut rng, n, k, group);
        for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
            match tinygemm::pack(&codes, block) {
                Ok(packed) => {
                    assert!(supports_direct_dequant(n), "N={n} packs but the predicate says no");
                    let m = TinygemmMatrix::new(&packed, n, k, block).unwrap();
                    for range in [0..k, 0..1, 5..37, 31..33, 64..72, 71..72, 40..40] {
                        let mut out = vec![0.0f32; n * range.len()];
                        m.decode_k_range(&params, range.clone(), &mut out).unwrap();
                        assert_eq!(out, reference(&codes, &params, range.clone()), "{block:?} N={n} K range {range:?}");
                    }
                    accepted += 1;
                }
                Err(e) => {
                    assert!(!supports_direct_dequant(n), "N={n} is refused but the predicate says yes");
                    assert_eq!(e.kind(), &LayoutErrorKind::NNotMultiple { n, multiple: 16 });
                    let bytes = vec![0u8; n * k / 2];
                    assert!(TinygemmMatrix::new(&bytes, n, k, block).is_err());
                }
            }
        }
    }
    assert_eq!(accepted, 2 * 20, "N = 16, 32, ..., 320 under both block widths");
}

#[test]
fn single_rows_decode_for_every_n_class_to_f32_and_bf16() {
    let mut rng = Rng::new(11);
    let k = 576;
    for n in [16, 32, 48, 64, 80, 144, 192, 208] {
        let codes = rng.codes(n, k);
        let params = random_params(&mut rng, n, k, GroupSize::G128);
        for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
            let packed = tinygemm::pack(&codes, block).unwrap();
            let m = TinygemmMatrix::new(&packed, n, k, block).unwrap();
            for row in [0, 1, n / 2, n.saturating_sub(17), n - 2, n - 1] {
                let mut f = vec![0.0f32; k];
                m.decode_row(&params, row, 0..k, &mut f).unwrap();
                let want: Vec<f32> = (0..k).map(|kk| params.weight(row, kk, codes.get(row, kk))).collect();
                assert_eq!(f, want, "{block:?} N={n} row {row}");
                let mut b = vec![bf16::ZERO; 100];
                m.decode_row(&params, row, 250..350, &mut b).unwrap();
                let want_b: Vec<bf16> = want[250..350].iter().map(|&x| bf16::from_f32(x)).collect();
                assert_eq!(b, want_b, "{block:?} N={n} row {row} as bf16");
            }
            let mut out = vec![0.0f32; k];
            let e = m.decode_row(&params, n, 0..k, &mut out).unwrap_err();
            assert!(matches!(e.kind(), LayoutErrorKind::OutOfBounds { what: "row", .. }));
        }
    }
}

#[test]
fn decoders_reject_mismatched_inputs() {
    let mut rng = Rng::new(3);
    let (n, k) = (64, 64);
    let codes = rng.codes(n, k);
    let params = random_params(&mut rng, n, k, GroupSize::G32);
    let packed = tinygemm::pack(&codes, TinygemmBlock::N64).unwrap();
    let m = TinygemmMatrix::new(&packed, n, k, TinygemmBlock::N64).unwrap();
    let mut short = vec![0.0f32; n * 4 - 1];
    assert!(matches!(
        m.decode_k_range(&params, 0..4, &mut short).unwrap_err().kind(),
        LayoutErrorKind::LengthMismatch { .. }
    ));
    let mut out = vec![0.0f32; n * 4];
    assert!(matches!(
        m.decode_k_range(&params, 62..66, &mut out).unwrap_err().kind(),
        LayoutErrorKind::OutOfBounds { .. }
    ));
    let other = random_params(&mut rng, n, 128, GroupSize::G32);
    assert!(m.decode_k_range(&other, 0..4, &mut out).is_err());
    assert!(TinygemmMatrix::new(&packed[1..], n, k, TinygemmBlock::N64).is_err());
    assert!(matches!(
        TinygemmMatrix::new(&packed, n, 63, TinygemmBlock::N64).unwrap_err().kind(),
        LayoutErrorKind::OddK { k: 63 }
    ));
}

/// SmolLM2's K = 576 at g = 128: group 2 covers 256..384 and straddles K/2 = 288. The split-halves decoder
/// must look groups up by true input channel (the upstream one needed K % 2g == 0).
#[test]
fn split_halves_decode_with_a_group_straddling_the_middle() {
    let mut rng = Rng::new(5);
    let (n, k) = (48, 576);
    let w = rng.weights(n, k);
    let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Shrink, ParamPrecision::F32).unwrap();
    assert_ne!(q.params.scale(0, 2), q.params.scale(0, 3), "the straddling group must differ from its neighbour");
    let sh = halves::pack(&q.codes).unwrap();
    for range in [0..k, 280..300, 287..289, 500..576] {
        let mut out = vec![0.0f32; n * range.len()];
        halves::decode_k_range(&sh, &q.params, range.clone(), &mut out).unwrap();
        assert_eq!(out, reference(&q.codes, &q.params, range.clone()), "range {range:?}");
    }
    // And the tinygemm direct path gives the same weights bit for bit.
    let packed = tinygemm::pack(&q.codes, TinygemmBlock::N64).unwrap();
    let m = TinygemmMatrix::new(&packed, n, k, TinygemmBlock::N64).unwrap();
    let (mut a, mut b) = (vec![bf16::ZERO; n * k], vec![bf16::ZERO; n * k]);
    m.decode_k_range(&q.params, 0..k, &mut a).unwrap();
    halves::decode_k_range(&sh, &q.params, 0..k, &mut b).unwrap();
    assert_eq!(a, b);
}

/// Blocked repack at chunk boundaries: N = 2·chunk + 64, a ragged last chunk that is a 16-channel tail,
/// N below one chunk, N equal to one chunk, and the default 2048-row chunk with N = 2·2048 + 64.
#[test]
fn blocked_repack_is_byte_identical_at_chunk_boundaries() {
    let mut rng = Rng::new(9);
    let cases: [(usize, usize, usize); 7] = [
        (128, 2 * 128 + 64, 24),
        (128, 2 * 128 + 16, 24),
        (128, 2 * 128 + 48, 6),
        (128, 48, 24),
        (128, 128, 8),
        (64, 64 * 5 + 32, 10),
        (2048, 2 * 2048 + 64, 4),
    ];
    for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
        for (chunk, n, k) in cases {
            let codes = rng.codes(n, k);
            let whole = tinygemm::pack(&codes, block).unwrap();
            let rm = rowmajor::pack(&codes).unwrap();
            let mut out = vec![0xAAu8; n * k / 2];
            tinygemm::pack_from_row_major_chunked(&rm, n, k, block, chunk, &mut out).unwrap();
            assert!(out == whole, "{block:?} chunk {chunk} N={n} K={k}");
        }
    }
    let rm = vec![0u8; 64 * 4];
    let mut out = vec![0u8; 64 * 4];
    for bad in [0, 100, 16] {
        let e = tinygemm::pack_from_row_major_chunked(&rm, 64, 8, TinygemmBlock::N64, bad, &mut out).unwrap_err();
        assert_eq!(e.kind(), &LayoutErrorKind::BadChunk { chunk: bad, block: 64 });
    }
}

/// N not a multiple of 16: padding with zero-code, zero-scale channels packs, and the padded channels
/// decode to exactly 0 while the real ones are unchanged.
#[test]
fn padding_n_packs_any_n_and_decodes_the_real_channels_unchanged() {
    let mut rng = Rng::new(13);
    let k = 64;
    for n in [1, 7, 15, 17, 50, 100] {
        let codes = rng.codes(n, k);
        let params = random_params(&mut rng, n, k, GroupSize::G64);
        assert!(tinygemm::pack(&codes, TinygemmBlock::N64).is_err());
        let (pc, pp) = (codes.padded_n(16), params.padded_n(16));
        let np = pc.n();
        assert_eq!(np, n.next_multiple_of(16));
        let packed = tinygemm::pack(&pc, TinygemmBlock::N64).unwrap();
        let m = TinygemmMatrix::new(&packed, np, k, TinygemmBlock::N64).unwrap();
        let mut out = vec![f32::NAN; np * k];
        m.decode_k_range(&pp, 0..k, &mut out).unwrap();
        assert_eq!(&out[..n * k], &reference(&codes, &params, 0..k)[..]);
        assert!(out[n * k..].iter().all(|&x| x == 0.0));
    }
}
