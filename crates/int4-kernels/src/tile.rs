//! A small interface over Intel AMX's integer tile instructions, and a software emulator of them.
//!
//! The W4A8 tiling ([`crate::w4a8`]) and the W4A16 AMX-BF16 prefill ([`crate::w4a16`]) are written once
//! over [`TileUnit`]. The emulator implements the
//! documented semantics of palette 1 exactly — eight tile registers of at most 16 rows × 64 bytes, a
//! configuration that must be loaded before any tile instruction, `TDPBUSD`'s u8 × s8 products (and
//! `TDPBSUD`'s s8 × u8, `TDPBSSD`'s s8 × s8) summed in fours into wrapping i32 accumulators, with B in the
//! VNNI layout (each 4-byte group of a B row holds four
//! consecutive K values of one output column) — and reports a configuration mistake as an error where the
//! hardware would fault (`#UD`) or silently compute on the wrong shape. So the whole kernel is tested here,
//! bit for bit, on a machine without AMX.
//!
//! The hardware implementation ([`crate::AmxTiles`], in `x86_64::amx`: `ldtilecfg`/`tileloadd`/the dot
//! products/`tilestored`/`tilerelease` through `asm!`) can only be constructed through a capability token that checks CPUID,
//! XCR0 and Linux's tile permission, and performs the same operand checks as the emulator
//! ([`TileShapes`]) before every instruction, so a mistake is an error on either unit.

use std::fmt;

/// Tile registers in palette 1.
pub const TILES: usize = 8;
/// Rows per tile in palette 1.
pub const MAX_ROWS: usize = 16;
/// Bytes per tile row in palette 1.
pub const MAX_COLSB: usize = 64;

/// A tile configuration (the 64-byte operand of `LDTILECFG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Palette; only 1 is supported.
    pub palette: u8,
    /// Bytes per row of each tile (0: unused).
    pub colsb: [u16; TILES],
    /// Rows of each tile (0: unused).
    pub rows: [u8; TILES],
}

impl TileConfig {
    /// A palette-1 configuration with every tile unused.
    pub fn new() -> Self {
        TileConfig { palette: 1, colsb: [0; TILES], rows: [0; TILES] }
    }

    /// The same with tile `t` shaped `rows × colsb`.
    pub fn with_tile(mut self, t: usize, rows: u8, colsb: u16) -> Self {
        self.rows[t] = rows;
        self.colsb[t] = colsb;
        self
    }

    /// The 64-byte memory image `LDTILECFG` reads: palette at byte 0, `colsb` as u16 at bytes 16..32,
    /// `rows` at bytes 48..56.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0] = self.palette;
        for t in 0..TILES {
            b[16 + 2 * t..18 + 2 * t].copy_from_slice(&self.colsb[t].to_le_bytes());
            b[48 + t] = self.rows[t];
        }
        b
    }

    fn validate(&self) -> Result<(), TileError> {
        if self.palette != 1 {
            return Err(TileError::BadConfig(format!("palette {} (only palette 1 is supported)", self.palette)));
        }
        for t in 0..TILES {
            let (r, c) = (usize::from(self.rows[t]), usize::from(self.colsb[t]));
            if r > MAX_ROWS || c > MAX_COLSB || (r == 0) != (c == 0) {
                return Err(TileError::BadConfig(format!(
                    "tile {t}: {r} rows × {c} bytes exceeds palette 1 or is half-set"
                )));
            }
        }
        Ok(())
    }
}

impl Default for TileConfig {
    fn default() -> Self {
        TileConfig::new()
    }
}

/// A tile instruction that cannot execute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TileError {
    /// No configuration is loaded (hardware: `#UD`, the SIGILL upstream hit).
    NotConfigured,
    /// The configuration itself is invalid.
    BadConfig(String),
    /// A tile index is out of range or names an unconfigured tile.
    BadTile(usize),
    /// The operands' shapes do not fit the instruction.
    ShapeMismatch(String),
    /// A memory operand is too short for the tile.
    OutOfBounds(String),
}

impl fmt::Display for TileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TileError::NotConfigured => write!(f, "tile instruction with no tile configuration loaded"),
            TileError::BadConfig(m) => write!(f, "invalid tile configuration: {m}"),
            TileError::BadTile(t) => write!(f, "tile {t} is out of range or not configured"),
            TileError::ShapeMismatch(m) => write!(f, "tile shapes do not fit: {m}"),
            TileError::OutOfBounds(m) => write!(f, "memory operand too short: {m}"),
        }
    }
}

impl std::error::Error for TileError {}

/// The tile instructions the W4A8 kernel uses.
pub trait TileUnit {
    /// `LDTILECFG`: loads a configuration (zeroing every tile).
    fn load_config(&mut self, cfg: &TileConfig) -> Result<(), TileError>;
    /// `TILEZERO t`.
    fn zero(&mut self, t: usize) -> Result<(), TileError>;
    /// `TILELOADD t, [base + row·stride]`.
    fn load(&mut self, t: usize, base: &[u8], stride: usize) -> Result<(), TileError>;
    /// `TDPBUSD dst, a, b`: `dst.i32[m][n] += Σ_{k, i<4} u8(a[m][4k+i])·s8(b[k][4n+i])`, wrapping.
    fn dpbusd(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError>;
    /// `TDPBSUD dst, a, b`: `dst.i32[m][n] += Σ_{k, i<4} s8(a[m][4k+i])·u8(b[k][4n+i])`, wrapping. The W4A8
    /// kernel's instruction: signed int8 activations in A, unsigned 4-bit codes in B.
    fn dpbsud(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError>;
    /// `TDPBSSD dst, a, b`: `dst.i32[m][n] += Σ_{k, i<4} s8(a[m][4k+i])·s8(b[k][4n+i])`, wrapping. The W4A8
    /// kernel's instruction where the zero point is implicit: codes stored less their zero, as signed bytes.
    fn dpbssd(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError>;
    /// `TDPBF16PS dst, a, b`: `dst.f32[m][n] += a.bf16[m][2k]·b.bf16[k][2n] + a.bf16[m][2k+1]·b.bf16[k][2n+1]`
    /// for each `k` in order, every product and sum rounded to f32 (nearest even), with bf16 inputs and f32
    /// results that are denormal treated as zero (DAZ/FTZ), as Intel documents the instruction.
    fn dpbf16ps(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError>;
    /// `TILESTORED [base + row·stride], t`.
    fn store(&self, t: usize, base: &mut [u8], stride: usize) -> Result<(), TileError>;
    /// `TILERELEASE`: back to the unconfigured state.
    fn release(&mut self);
}

/// The software emulator.
#[derive(Clone, Debug)]
pub struct TileEmulator {
    cfg: TileShapes,
    tiles: Vec<[u8; MAX_ROWS * MAX_COLSB]>,
}

impl Default for TileEmulator {
    fn default() -> Self {
        TileEmulator::new()
    }
}

impl TileEmulator {
    /// An unconfigured tile unit.
    pub fn new() -> Self {
        TileEmulator { cfg: TileShapes::default(), tiles: vec![[0; MAX_ROWS * MAX_COLSB]; TILES] }
    }

    fn dot(&mut self, dst: usize, a: usize, b: usize, a_signed: bool, b_signed: bool) -> Result<(), TileError> {
        let (dr, dc, br) = self.cfg.check_dot(dst, a, b)?;
        let (ta, tb) = (self.tiles[a], self.tiles[b]);
        let td = &mut self.tiles[dst];
        let byte = |v: u8, signed: bool| if signed { i32::from(v as i8) } else { i32::from(v) };
        for m in 0..dr {
            for n in 0..dc / 4 {
                let o = m * MAX_COLSB + 4 * n;
                let mut acc = i32::from_le_bytes(td[o..o + 4].try_into().expect("4 bytes"));
                for k in 0..br {
                    for i in 0..4 {
                        let x = byte(ta[m * MAX_COLSB + 4 * k + i], a_signed);
                        let w = byte(tb[k * MAX_COLSB + 4 * n + i], b_signed);
                        acc = acc.wrapping_add(x * w);
                    }
                }
                td[o..o + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        Ok(())
    }
}

/// The loaded configuration as both tile units see it: every instruction's operands are checked against it
/// first, so a kernel's configuration mistake is an error on the emulator and on hardware alike (where the
/// instruction would otherwise fault or compute on the wrong shape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileShapes {
    cfg: Option<TileConfig>,
}

impl TileShapes {
    /// Validates and records `cfg` (what `LDTILECFG` does to the state).
    pub fn load(&mut self, cfg: &TileConfig) -> Result<(), TileError> {
        cfg.validate()?;
        self.cfg = Some(*cfg);
        Ok(())
    }

    /// Back to unconfigured (`TILERELEASE`).
    pub fn release(&mut self) {
        self.cfg = None;
    }

    /// Whether a configuration is loaded.
    pub fn is_configured(&self) -> bool {
        self.cfg.is_some()
    }

    /// `(rows, colsb)` of tile `t`, if configured.
    #[inline]
    pub fn shape(&self, t: usize) -> Result<(usize, usize), TileError> {
        let cfg = self.cfg.as_ref().ok_or(TileError::NotConfigured)?;
        if t >= TILES || cfg.rows[t] == 0 {
            return Err(TileError::BadTile(t));
        }
        Ok((usize::from(cfg.rows[t]), usize::from(cfg.colsb[t])))
    }

    /// Checks a memory operand of `len` bytes with `stride` for tile `t`; returns its `(rows, colsb)`.
    #[inline]
    pub fn check_memory(&self, t: usize, len: usize, stride: usize) -> Result<(usize, usize), TileError> {
        let (rows, colsb) = self.shape(t)?;
        let need = (rows - 1).checked_mul(stride).and_then(|v| v.checked_add(colsb));
        if need.is_none_or(|need| len < need) {
            return Err(TileError::OutOfBounds(format!(
                "tile {t} ({rows} rows × {colsb} bytes, stride {stride}) does not fit in {len} bytes"
            )));
        }
        Ok((rows, colsb))
    }

    /// Checks a dot product's three tiles; returns `(dst rows, dst colsb, b rows)`.
    #[inline]
    pub fn check_dot(&self, dst: usize, a: usize, b: usize) -> Result<(usize, usize, usize), TileError> {
        let (dr, dc) = self.shape(dst)?;
        let (ar, ac) = self.shape(a)?;
        let (br, bc) = self.shape(b)?;
        if dst == a || dst == b || a == b {
            return Err(TileError::ShapeMismatch("a tile dot product needs three distinct tiles".into()));
        }
        if ar != dr || bc != dc || ac != 4 * br || dc % 4 != 0 || ac % 4 != 0 {
            return Err(TileError::ShapeMismatch(format!(
                "dst {dr}×{dc}, a {ar}×{ac}, b {br}×{bc}: need a.rows = dst.rows, b.colsb = dst.colsb, a.colsb = 4·b.rows"
            )));
        }
        Ok((dr, dc, br))
    }
}

impl TileUnit for TileEmulator {
    fn load_config(&mut self, cfg: &TileConfig) -> Result<(), TileError> {
        self.cfg.load(cfg)?;
        for t in &mut self.tiles {
            t.fill(0);
        }
        Ok(())
    }

    fn zero(&mut self, t: usize) -> Result<(), TileError> {
        self.cfg.shape(t)?;
        self.tiles[t].fill(0);
        Ok(())
    }

    fn load(&mut self, t: usize, base: &[u8], stride: usize) -> Result<(), TileError> {
        let (rows, colsb) = self.cfg.check_memory(t, base.len(), stride)?;
        for r in 0..rows {
            self.tiles[t][r * MAX_COLSB..r * MAX_COLSB + colsb].copy_from_slice(&base[r * stride..r * stride + colsb]);
        }
        Ok(())
    }

    fn dpbusd(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(dst, a, b, false, true)
    }

    fn dpbsud(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(dst, a, b, true, false)
    }

    fn dpbssd(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        self.dot(dst, a, b, true, true)
    }

    fn dpbf16ps(&mut self, dst: usize, a: usize, b: usize) -> Result<(), TileError> {
        let (dr, dc, br) = self.cfg.check_dot(dst, a, b)?;
        let (ta, tb) = (self.tiles[a], self.tiles[b]);
        let td = &mut self.tiles[dst];
        let ftz = |v: f32| if v.is_subnormal() { 0.0f32.copysign(v) } else { v };
        let bf16 = |t: &[u8], at: usize| ftz(f32::from_bits(u32::from(u16::from_le_bytes([t[at], t[at + 1]])) << 16));
        for m in 0..dr {
            for n in 0..dc / 4 {
                let o = m * MAX_COLSB + 4 * n;
                let mut acc = f32::from_le_bytes(td[o..o + 4].try_into().expect("4 bytes"));
                for k in 0..br {
                    for i in 0..2 {
                        let x = bf16(&ta, m * MAX_COLSB + 4 * k + 2 * i);
                        let w = bf16(&tb, k * MAX_COLSB + 4 * n + 2 * i);
                        // The product of two bf16 values is exact in f32 unless it under- or overflows.
                        acc = ftz(acc + ftz(x * w));
                    }
                }
                td[o..o + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        Ok(())
    }

    fn store(&self, t: usize, base: &mut [u8], stride: usize) -> Result<(), TileError> {
        let (rows, colsb) = self.cfg.check_memory(t, base.len(), stride)?;
        for r in 0..rows {
            base[r * stride..r * stride + colsb].copy_from_slice(&self.tiles[t][r * MAX_COLSB..r * MAX_COLSB + colsb]);
        }
        Ok(())
    }

    fn release(&mut self) {
        self.cfg.release();
    }
}
