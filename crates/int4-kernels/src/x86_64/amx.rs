//! The hardware tile unit: Intel AMX through `asm!` (the AMX intrinsics are not stable Rust).
//!
//! [`AmxTiles`] implements [`TileUnit`] with the real instructions. It can only be built from an
//! [`AmxInt8`] token, whose constructor checks the live CPU (see [`crate::x86_64::amx_probe`]), and it checks every
//! instruction's operands against the loaded configuration first ([`TileShapes`], the emulator's own
//! checks), so an instruction it executes can neither fault for want of a configuration nor touch memory
//! outside the slices it was given.
//!
//! [`HardwarePass`] runs the W4A8 tiling's full 16-row passes on a unit's tiles with the instructions
//! written out, checked once per pass (the configuration, the panel) and once per block (the spans, the
//! codes) instead of one by one; the tests hold it to the reference bit for bit on AMX machines, as they
//! hold the generic pass run through [`TileUnit`] on the emulator.
//!
//! Tile state lives in the thread's registers, so a unit is neither `Send` nor `Sync`: each thread builds
//! its own, loads its own configuration, and the unit releases the tiles when dropped.
//!
//! Tile numbers are part of an AMX instruction's encoding, so a run-time tile index becomes a `match` over
//! instructions. Loads, stores and zeroing take any of the eight tiles; the dot products take the roles
//! the W4A8 kernel gives them (accumulators in tiles 0–3, A in 4–5, B in 6–7) and report any other triple
//! as an error.

use std::marker::PhantomData;
use std::ops::Range;

use crate::isa::{AmxBf16, AmxInt8};
use crate::tile::{TileConfig, TileError, TileShapes, TileUnit};
use crate::w4a8::block::{Block, GroupSums};

/// The hardware tile unit of the calling thread.
#[derive(Debug)]
pub struct AmxTiles {
    shapes: TileShapes,
    /// Which dot products the token proved: AMX-INT8, AMX-BF16.
    int8: bool,
    bf16: bool,
    /// Tile state belongs to one thread.
    _thread_bound: PhantomData<*const ()>,
}

impl AmxTiles {
    /// An unconfigured unit on the calling thread, for the integer dot products.
    pub fn new(_token: AmxInt8) -> Self {
        AmxTiles { shapes: TileShapes::default(), int8: true, bf16: false, _thread_bound: PhantomData }
    }

    /// An unconfigured unit on the calling thread, for `TDPBF16PS`.
    pub fn for_bf16(_token: AmxBf16) -> Self {
        AmxTiles { shapes: TileShapes::default(), int8: false, bf16: true, _thread_bound: PhantomData }
    }

    /// Checks that this unit's token covers `op` and that the tiles fit it, then executes it.
    #[inline(always)]
    fn dot(&self, op: Dot, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        let proved = if matches!(op, Dot::Bf16ps) { self.bf16 } else { self.int8 };
        if !proved {
            return Err(TileError::ShapeMismatch(format!(
                "{} needs a unit built from its own AMX token",
                op.mnemonic().to_uppercase()
            )));
        }
        self.shapes.check_dot(dst, a, b)?;
        dot_roles(op, dst, a, b)
    }
}

/// Runs `$body` with `$n` bound to the literal tile number `t` names (0–7), or returns `BadTile`.
macro_rules! with_tile {
    ($t:expr, |$n:ident| $body:expr) => {
        match $t {
            0 => with_tile!(@one 0, $n, $body),
            1 => with_tile!(@one 1, $n, $body),
            2 => with_tile!(@one 2, $n, $body),
            3 => with_tile!(@one 3, $n, $body),
            4 => with_tile!(@one 4, $n, $body),
            5 => with_tile!(@one 5, $n, $body),
            6 => with_tile!(@one 6, $n, $body),
            7 => with_tile!(@one 7, $n, $body),
            t => return Err(TileError::BadTile(t)),
        }
    };
    (@one $lit:literal, $n:ident, $body:expr) => {{
        macro_rules! $n {
            () => {
                stringify!($lit)
            };
        }
        $body
    }};
}

#[cfg(target_arch = "x86_64")]
impl TileUnit for AmxTiles {
    fn load_config(&mut self, cfg: &TileConfig) -> Result<(), TileError> {
        self.shapes.load(cfg)?;
        let image = cfg.to_bytes();
        // SAFETY: the token proves AMX-TILE is usable in this process (CPUID, XCR0, Linux permission);
        // `image` is a valid palette-1 configuration (validated above), 64 readable bytes.
        unsafe { std::arch::asm!("ldtilecfg [{0}]", in(reg) image.as_ptr(), options(nostack, readonly)) };
        Ok(())
    }

    #[inline(always)]
    fn zero(&mut self, t: usize) -> Result<(), TileError> {
        self.shapes.shape(t)?;
        with_tile!(t, |tn| {
            // SAFETY: AMX is usable (token) and tile `t` is configured (checked above).
            unsafe { std::arch::asm!(concat!("tilezero tmm", tn!()), options(nostack, nomem)) }
        });
        Ok(())
    }

    #[inline(always)]
    fn load(&mut self, t: usize, base: &[u8], stride: usize) -> Result<(), TileError> {
        self.shapes.check_memory(t, base.len(), stride)?;
        let p = base.as_ptr();
        with_tile!(t, |tn| {
            // SAFETY: AMX is usable (token); tile `t` is configured, and its rows at `stride` lie inside
            // `base` (check_memory), so every byte the instruction reads is in bounds.
            unsafe {
                std::arch::asm!(
                    concat!("tileloadd tmm", tn!(), ", [{p} + {s}*1]"),
                    p = in(reg) p, s = in(reg) stride, options(nostack, readonly)
                )
            }
        });
        Ok(())
    }

    #[inline(always)]
    fn dpbusd(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(Dot::Busd, dst, a, b)
    }

    #[inline(always)]
    fn dpbsud(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(Dot::Bsud, dst, a, b)
    }

    #[inline(always)]
    fn dpbssd(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(Dot::Bssd, dst, a, b)
    }

    #[inline(always)]
    fn dpbf16ps(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(Dot::Bf16ps, dst, a, b)
    }

    #[inline(always)]
    fn store(&self, t: usize, base: &mut [u8], stride: usize) -> Result<(), TileError> {
        self.shapes.check_memory(t, base.len(), stride)?;
        let p = base.as_mut_ptr();
        with_tile!(t, |tn| {
            // SAFETY: AMX is usable (token); tile `t` is configured, and its rows at `stride` lie inside
            // `base` (check_memory), which is borrowed mutably, so every byte written is ours to write.
            unsafe {
                std::arch::asm!(
                    concat!("tilestored [{p} + {s}*1], tmm", tn!()),
                    p = in(reg) p, s = in(reg) stride, options(nostack)
                )
            }
        });
        Ok(())
    }

    fn release(&mut self) {
        if self.shapes.is_configured() {
            // SAFETY: AMX is usable (token); TILERELEASE returns the tiles to their initial state.
            unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
        }
        self.shapes.release();
    }
}

/// The tile dot products.
#[derive(Clone, Copy, Debug)]
enum Dot {
    /// `TDPBUSD`: u8 A, s8 B.
    Busd,
    /// `TDPBSUD`: s8 A, u8 B.
    Bsud,
    /// `TDPBSSD`: s8 A, s8 B.
    Bssd,
    /// `TDPBF16PS`: bf16 pairs into f32.
    Bf16ps,
}

impl Dot {
    fn mnemonic(self) -> &'static str {
        match self {
            Dot::Busd => "tdpbusd",
            Dot::Bsud => "tdpbsud",
            Dot::Bssd => "tdpbssd",
            Dot::Bf16ps => "tdpbf16ps",
        }
    }
}

/// Executes one dot product with the kernel's tile roles: accumulators 0–3, A 4–5, B 6–7.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn dot_roles(op: Dot, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
    macro_rules! dot {
        ($($d:literal $a:literal $b:literal),*) => {
            match (op, dst, a, b) {
                $(
                    (Dot::Busd, $d, $a, $b) => {
                        // SAFETY: AMX is usable (the caller holds a token) and the three tiles are
                        // configured with shapes the instruction accepts (check_dot).
                        unsafe { std::arch::asm!(concat!("tdpbusd tmm", $d, ", tmm", $a, ", tmm", $b), options(nostack, nomem)) }
                    }
                    (Dot::Bsud, $d, $a, $b) => {
                        // SAFETY: as for tdpbusd above.
                        unsafe { std::arch::asm!(concat!("tdpbsud tmm", $d, ", tmm", $a, ", tmm", $b), options(nostack, nomem)) }
                    }
                    (Dot::Bssd, $d, $a, $b) => {
                        // SAFETY: as for tdpbusd above.
                        unsafe { std::arch::asm!(concat!("tdpbssd tmm", $d, ", tmm", $a, ", tmm", $b), options(nostack, nomem)) }
                    }
                    (Dot::Bf16ps, $d, $a, $b) => {
                        // SAFETY: as for tdpbusd above; the unit was built from an AMX-BF16 token.
                        unsafe { std::arch::asm!(concat!("tdpbf16ps tmm", $d, ", tmm", $a, ", tmm", $b), options(nostack, nomem)) }
                    }
                )*
                _ => {
                    return Err(TileError::ShapeMismatch(format!(
                        "{} tmm{dst}, tmm{a}, tmm{b}: the hardware unit takes accumulators in tiles 0-3, A in 4-5 and B in 6-7",
                        op.mnemonic()
                    )))
                }
            }
        };
    }
    dot!(0 4 6, 0 4 7, 0 5 6, 0 5 7, 1 4 6, 1 4 7, 1 5 6, 1 5 7, 2 4 6, 2 4 7, 2 5 6, 2 5 7, 3 4 6, 3 4 7, 3 5 6, 3 5 7);
    Ok(())
}

impl Drop for AmxTiles {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        self.release();
    }
}

/// One full 16-row pass of the W4A8 tiling ([`crate::w4a8`]'s `block_tiles`) on the hardware tiles, its
/// operands and the loaded configuration checked once when it is built rather than at every instruction:
/// a group of 32 inputs is only a few tile instructions, and checking each one (its shapes, bounds and a
/// `match` to its encoding) cost about as much as the instruction (docs/perf.md, "The AMX pass checks its
/// tiles once"). The tiles and their roles are the generic pass's: accumulators 0 (even groups) and 2
/// (odd), activations 4, codes 6 and 7 alternating by K block.
pub(crate) struct HardwarePass<'a> {
    block: &'a CheckedBlock<'a>,
    /// The pass's activations, `[kp/kb][16][kb]` (16 rows of the row tile panels).
    panel: &'a [u8],
    k_blocks: usize,
    sums: &'a mut [i32; 256],
    /// Held so nothing else touches the tiles while the pass runs.
    _tiles: &'a mut AmxTiles,
}

/// A block's operands checked once for all its [`HardwarePass`]es: every group span lies within the
/// padded K in whole K blocks of `kb`, and the expanded codes, `[kp/4][64]`, cover the padded K.
pub(crate) struct CheckedBlock<'a> {
    b: &'a Block<'a>,
    expanded: &'a [u8],
    kb: usize,
    centered: bool,
}

impl<'a> CheckedBlock<'a> {
    /// `b` with its `expanded` codes, in K blocks of `kb`; `centered`: codes stored less their implicit
    /// zero (signed, for `tdpbssd`).
    ///
    /// # Errors
    /// A `kb` the tiles cannot take, a span off the K blocks or past the padded K, or codes too short.
    pub(crate) fn new(b: &'a Block<'a>, expanded: &'a [u8], kb: usize, centered: bool) -> Result<Self, TileError> {
        let aligned = |s: &Range<usize>| s.start.is_multiple_of(kb) && s.end.is_multiple_of(kb) && s.end <= b.kp;
        if !(kb == 32 || kb == 64) || !b.spans.iter().all(aligned) || expanded.len() < b.kp / 4 * 64 {
            return Err(TileError::OutOfBounds(format!(
                "a block over padded K {} in K blocks of {kb} (32 or 64) with {} code bytes (it needs {})",
                b.kp,
                expanded.len(),
                b.kp / 4 * 64
            )));
        }
        Ok(CheckedBlock { b, expanded, kb, centered })
    }
}

impl<'a> HardwarePass<'a> {
    /// The pass over `panel`, the activations of 16 rows, for `block`, on `tiles` as loaded. Every
    /// instruction it will execute is checked here and in `block`: the tiles' shapes against the
    /// configuration, and every load against its slice.
    ///
    /// # Errors
    /// A configuration other than the tiling's for 16 rows and the block's K block, a unit without
    /// AMX-INT8, or a panel too short for the block's padded K.
    pub(crate) fn new(
        tiles: &'a mut AmxTiles,
        block: &'a CheckedBlock<'a>,
        panel: &'a [u8],
        sums: &'a mut [i32; 256],
    ) -> Result<Self, TileError> {
        if !tiles.int8 {
            return Err(TileError::ShapeMismatch("the W4A8 pass needs a unit built from an AMX-INT8 token".into()));
        }
        let kb = block.kb;
        let want = [(0, 16, 64), (2, 16, 64), (4, 16, kb), (6, kb / 4, 64), (7, kb / 4, 64)];
        for (t, rows, colsb) in want {
            if tiles.shapes.shape(t)? != (rows, colsb) {
                return Err(TileError::ShapeMismatch(format!(
                    "tile {t} is not configured as the W4A8 pass's {rows} rows × {colsb} bytes"
                )));
            }
        }
        if panel.len() < 16 * block.b.kp {
            return Err(TileError::OutOfBounds(format!(
                "a 16-row pass over padded K {} needs {} activation bytes, got {}",
                block.b.kp,
                16 * block.b.kp,
                panel.len()
            )));
        }
        Ok(HardwarePass { block, panel, k_blocks: 0, sums, _tiles: tiles })
    }

    /// Group g's dot products into its accumulator (0 for even groups, 2 for odd). Inlined, so the
    /// epilogue's outputs stay in registers across it.
    #[inline(always)]
    pub(crate) fn issue(&mut self, g: usize) {
        /// One K block: loads B tile `$tb` from `$w` and A tile 4 from `$a` (rows `$kb` apart), and runs
        /// `$dot` into accumulator `$c`.
        macro_rules! k_block {
            ($dot:literal, $c:literal, $tb:literal, $a:expr, $w:expr, $kb:expr) => {
                // SAFETY: AMX-INT8 is usable (the unit's token) and tiles c, 4 and tb are configured as
                // named (checked in `HardwarePass::new`); the A load reads 16 rows of kb bytes at kb apart
                // from `16·k0`, below `16·kp` ≤ the panel's length (`HardwarePass::new`), and the B load
                // kb/4 rows of 64 bytes from `16·k0` (`k0/4·64`), below `kp/4·64` ≤ the codes' length, as
                // every span lies within kp in whole K blocks (`CheckedBlock::new`).
                unsafe {
                    std::arch::asm!(
                        concat!("tileloadd tmm", $tb, ", [{w} + {s64}*1]"),
                        "tileloadd tmm4, [{a} + {kb}*1]",
                        concat!($dot, " tmm", $c, ", tmm4, tmm", $tb),
                        w = in(reg) $w, a = in(reg) $a, kb = in(reg) $kb, s64 = in(reg) 64usize,
                        options(nostack, readonly)
                    )
                }
            };
        }
        let even = g.is_multiple_of(2);
        if even {
            // SAFETY: AMX is usable and tile 0 configured (`new`).
            unsafe { std::arch::asm!("tilezero tmm0", options(nostack, nomem)) };
        } else {
            // SAFETY: as above, tile 2.
            unsafe { std::arch::asm!("tilezero tmm2", options(nostack, nomem)) };
        }
        let CheckedBlock { b, expanded, kb, centered } = *self.block;
        let (panel, codes) = (self.panel.as_ptr(), expanded.as_ptr());
        for k0 in b.spans[g].clone().step_by(kb) {
            let (a, w) = (panel.wrapping_add(16 * k0), codes.wrapping_add(16 * k0));
            let first_b = self.k_blocks.is_multiple_of(2);
            self.k_blocks += 1;
            match (centered, even, first_b) {
                (true, true, true) => k_block!("tdpbssd", "0", "6", a, w, kb),
                (true, true, false) => k_block!("tdpbssd", "0", "7", a, w, kb),
                (true, false, true) => k_block!("tdpbssd", "2", "6", a, w, kb),
                (true, false, false) => k_block!("tdpbssd", "2", "7", a, w, kb),
                (false, true, true) => k_block!("tdpbsud", "0", "6", a, w, kb),
                (false, true, false) => k_block!("tdpbsud", "0", "7", a, w, kb),
                (false, false, true) => k_block!("tdpbsud", "2", "6", a, w, kb),
                (false, false, false) => k_block!("tdpbsud", "2", "7", a, w, kb),
            }
        }
    }
}

impl GroupSums for HardwarePass<'_> {
    /// Issues the next group's dot products (group 0's are issued before the pass), then stores group
    /// g's sums, so the tiles compute while the epilogue finishes this group.
    #[inline(always)]
    fn group(&mut self, g: usize) -> Result<&[i32; 256], TileError> {
        if g + 1 < self.block.b.spans.len() {
            self.issue(g + 1);
        }
        let p = self.sums.as_mut_ptr();
        if g.is_multiple_of(2) {
            // SAFETY: AMX is usable and tile 0 is 16 rows × 64 bytes (`new`): the store writes 16 rows 64
            // bytes apart, the 1024 bytes of `sums`, borrowed mutably.
            unsafe {
                std::arch::asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) p, s = in(reg) 64usize, options(nostack))
            };
        } else {
            // SAFETY: as above, tile 2.
            unsafe {
                std::arch::asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) p, s = in(reg) 64usize, options(nostack))
            };
        }
        Ok(self.sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::{AmxBf16, AmxInt8};
    use crate::w4a8::block::{GroupSpans, RowGroupTerms};
    use crate::w4a8::params::ParamTable;

    /// `f` of a 16-row block over padded K 128 in groups of `group`.
    fn with_block<R>(group: usize, f: impl FnOnce(&Block) -> R) -> R {
        let (kp, m) = (128, 16);
        let groups = kp / group;
        let w = vec![0x21u8; kp / 8 * 64];
        let x = vec![1i8; m * kp];
        let terms = RowGroupTerms::table(&vec![0.5; m * groups], &vec![m as i32; m * groups]);
        let scales = ParamTable::from_f32(vec![1.0; groups * 16]);
        let spans: Vec<_> = (0..groups).map(|g| g * group..(g + 1) * group).collect();
        let block = Block {
            w: &w,
            low: None,
            x: &x,
            kp,
            m,
            terms: &terms,
            groups,
            spans: GroupSpans::new(&spans, kp),
            w_scales: scales.view(),
            zeros: None,
            offsets: None,
        };
        f(&block)
    }

    /// The checks a hardware pass relies on refuse every block it could not run within bounds: a K block
    /// the tiles cannot take, spans off the K blocks, codes shorter than the padded K; they take the blocks
    /// the tiling makes.
    #[test]
    fn a_block_the_hardware_passes_cannot_run_is_refused() {
        let expanded = vec![0u8; 128 / 4 * 64];
        with_block(32, |b| {
            assert!(CheckedBlock::new(b, &expanded, 32, true).is_ok());
            // Groups of 32 do not fill K blocks of 64.
            assert!(matches!(CheckedBlock::new(b, &expanded, 64, true), Err(TileError::OutOfBounds(_))));
            for kb in [0, 16, 48, 128] {
                assert!(CheckedBlock::new(b, &expanded, kb, true).is_err(), "K block {kb}");
            }
            let short = &expanded[..expanded.len() - 1];
            assert!(matches!(CheckedBlock::new(b, short, 32, true), Err(TileError::OutOfBounds(_))));
        });
        with_block(128, |b| {
            assert!(CheckedBlock::new(b, &expanded, 64, false).is_ok());
            assert!(CheckedBlock::new(b, &expanded, 32, false).is_ok());
        });
    }

    /// A hardware pass refuses tiles configured other than as the tiling's sixteen-row pass, a unit
    /// without AMX-INT8, and a panel shorter than sixteen rows of the padded K.
    #[test]
    fn a_hardware_pass_refuses_tiles_or_a_panel_it_was_not_checked_for() {
        let Some(tok) = AmxInt8::new() else {
            assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "no AMX-INT8 to test");
            return eprintln!("a_hardware_pass_refuses_tiles_or_a_panel_it_was_not_checked_for: SKIPPED (no AMX-INT8)");
        };
        let expanded = vec![0u8; 128 / 4 * 64];
        let panel = vec![0u8; 16 * 128];
        let config = |rows: u8, kb: u16| {
            TileConfig::new()
                .with_tile(0, rows, 64)
                .with_tile(2, rows, 64)
                .with_tile(4, rows, kb)
                .with_tile(6, (kb / 4) as u8, 64)
                .with_tile(7, (kb / 4) as u8, 64)
        };
        with_block(32, |b| {
            let block = CheckedBlock::new(b, &expanded, 32, true).unwrap();
            let mut sums = [0i32; 256];
            let mut tiles = AmxTiles::new(tok);
            assert!(HardwarePass::new(&mut tiles, &block, &panel, &mut sums).is_err(), "unconfigured");
            tiles.load_config(&config(16, 32)).unwrap();
            assert!(HardwarePass::new(&mut tiles, &block, &panel, &mut sums).is_ok());
            let short = &panel[..panel.len() - 1];
            assert!(matches!(HardwarePass::new(&mut tiles, &block, short, &mut sums), Err(TileError::OutOfBounds(_))));
            for (rows, kb) in [(8, 32), (16, 64)] {
                tiles.load_config(&config(rows, kb)).unwrap();
                let refused = HardwarePass::new(&mut tiles, &block, &panel, &mut sums);
                assert!(matches!(refused, Err(TileError::ShapeMismatch(_))), "{rows} rows, K block {kb}");
            }
            tiles.release();
            if let Some(bf16) = AmxBf16::new() {
                let mut tiles = AmxTiles::for_bf16(bf16);
                tiles.load_config(&config(16, 32)).unwrap();
                assert!(HardwarePass::new(&mut tiles, &block, &panel, &mut sums).is_err(), "a BF16 unit");
                tiles.release();
            }
        });
    }
}
