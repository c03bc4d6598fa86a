//! One small packed block per layout, pinned as a snapshot so that any change to a layout shows in review.
//! The codes are `(n·K + k) mod 16`, so each nibble in the dump names its position.

use int4_layout::tinygemm::{self, TinygemmBlock};
use int4_layout::{Codes, gptq, halves, rowmajor};
use std::fmt::Write;

fn pattern(n: usize, k: usize) -> Codes {
    Codes::from_fn(n, k, |r, c| ((r * 3 + c * 5) % 16) as u8).unwrap()
}

fn dump(bytes: &[u8], per_line: usize) -> String {
    let mut s = String::new();
    for line in bytes.chunks(per_line) {
        for b in line {
            write!(s, "{b:02x} ").unwrap();
        }
        s.pop();
        s.push('\n');
    }
    s
}

fn dump_words(words: &[i32], per_line: usize) -> String {
    let mut s = String::new();
    for line in words.chunks(per_line) {
        for w in line {
            write!(s, "{:08x} ", *w as u32).unwrap();
        }
        s.pop();
        s.push('\n');
    }
    s
}

#[test]
fn row_major_block() {
    insta::assert_snapshot!(dump(&rowmajor::pack(&pattern(4, 8)).unwrap(), 4));
}

#[test]
fn split_halves_block() {
    insta::assert_snapshot!(dump(&halves::pack(&pattern(4, 8)).unwrap(), 4));
}

#[test]
fn tinygemm64_block_and_tail() {
    // N = 80, K = 2: one 64-channel block ([K][32]) then a 16-channel tail ([K][8], adjacent pairs).
    insta::assert_snapshot!(dump(&tinygemm::pack(&pattern(80, 2), TinygemmBlock::N64).unwrap(), 32));
}

#[test]
fn tinygemm32_block_and_tail() {
    // N = 48, K = 2: one 32-channel block ([K][16]) then a 16-channel tail ([K][8]).
    insta::assert_snapshot!(dump(&tinygemm::pack(&pattern(48, 2), TinygemmBlock::N32).unwrap(), 16));
}

#[test]
fn gptq_qweight_block() {
    insta::assert_snapshot!(dump_words(&gptq::pack_qweight(&pattern(4, 16)).unwrap(), 4));
}

#[test]
fn awq_qweight_block() {
    let p = pattern(16, 2);
    let kn: Vec<u8> = (0..2 * 16).map(|i| p.get(i % 16, i / 16)).collect();
    insta::assert_snapshot!(dump_words(&gptq::pack_awq(&kn, 2, 16).unwrap(), 2));
}
