//! Bounded mutation fuzzing on the stable toolchain, shared by the runtime's loader fuzz targets
//! (`int4`'s `tests/fuzz_loaders.rs`) and the GGUF reader's (`int4-gguf`'s tests): proptest picks a few
//! edits of a valid input — flipped bytes, a truncation, a hostile little-endian u64 — mostly in the first
//! 4 KiB, where headers live. `INT4_FUZZ_CASES` sets the cases per target (default 48).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

pub fn cases() -> u32 {
    std::env::var("INT4_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
}

/// One edit of a byte buffer.
#[derive(Clone, Debug)]
pub enum Edit {
    Flip(usize, u8),
    Truncate(usize),
    /// A little-endian u64 written at an offset: hostile lengths and offsets.
    Word(usize, u64),
}

pub fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(p, x)| Edit::Flip(p, x)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), prop_oneof![Just(u64::MAX), Just(1 << 40), Just(0), any::<u64>()])
            .prop_map(|(p, v)| Edit::Word(p, v)),
    ];
    prop::collection::vec(edit, 1..4)
}

/// Applies edits, positions taken modulo the length; most land in the first 4 KiB (headers), where a
/// parser is most exposed.
pub fn apply(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for e in edits {
        if b.is_empty() {
            break;
        }
        let at = |p: usize, len: usize| if !p.is_multiple_of(4) { p % len.min(4096) } else { p % len };
        match *e {
            Edit::Flip(p, x) => {
                let i = at(p, b.len());
                b[i] ^= x;
            }
            Edit::Truncate(p) => b.truncate(p % b.len()),
            Edit::Word(p, v) => {
                let i = at(p, b.len());
                for (j, byte) in v.to_le_bytes().iter().enumerate() {
                    if let Some(slot) = b.get_mut(i + j) {
                        *slot = *byte;
                    }
                }
            }
        }
    }
    b
}

pub fn run(name: &str, strategy: impl Strategy<Value = Vec<Edit>>, check: impl Fn(&[Edit]) -> Result<(), String>) {
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let n = std::cell::Cell::new(0u32);
    let r = runner.run(&strategy, |e| {
        n.set(n.get() + 1);
        check(&e).map_err(TestCaseError::fail)
    });
    eprintln!("fuzz {name}: {} mutated loads", n.get());
    if let Err(e) = r {
        panic!("fuzz {name}: {e}");
    }
}
