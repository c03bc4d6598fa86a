//! The hardware tile unit: Intel AMX through `asm!` (the AMX intrinsics are not stable Rust).
//!
//! [`AmxTiles`] implements [`TileUnit`] with the real instructions. It can only be built from an
//! [`AmxInt8`] token, whose constructor checks the live CPU (see [`crate::x86_64::amx_probe`]), and it checks every
//! instruction's operands against the loaded configuration first ([`TileShapes`], the emulator's own
//! checks), so an instruction it executes can neither fault for want of a configuration nor touch memory
//! outside the slices it was given.
//!
//! Tile state lives in the thread's registers, so a unit is neither `Send` nor `Sync`: each thread builds
//! its own, loads its own configuration, and the unit releases the tiles when dropped.
//!
//! Tile numbers are part of an AMX instruction's encoding, so a run-time tile index becomes a `match` over
//! instructions. Loads, stores and zeroing take any of the eight tiles; the dot products take the roles
//! the W4A8 kernel gives them (accumulators in tiles 0–3, A in 4–5, B in 6–7) and report any other triple
//! as an error.

use std::marker::PhantomData;

use crate::isa::{AmxBf16, AmxInt8};
use crate::tile::{TileConfig, TileError, TileShapes, TileUnit};

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
