//! One 16-channel block's work, as every W4A8 kernel variant sees it, the epilogue they share, and where the
//! AMX tiling's epilogue takes each group's sums from ([`GroupSums`]).
//!
//! A leaf module: the driver ([`crate::w4a8`]) builds blocks and the SIMD variants
//! (`crate::x86_64::w4a8`) consume them, so neither imports the other's module for the type.

use std::ops::Range;

use rayon::prelude::*;

use super::params::Params;
use crate::tile::TileError;

/// One 16-channel block's work, as every kernel variant sees it.
pub(crate) struct Block<'a> {
    /// The block's packed codes, `[k_padded/8][64]`; of an 8-bit pair, the high plane's.
    pub w: &'a [u8],
    /// Of an 8-bit pair ([`super::int8`]), the low plane's packed codes, laid out as `w`: each weight's
    /// code is then `u = 16·hi + lo` (`0..256`) with the zero point 128, `w_scales` are the low plane's
    /// and there are no zero-point or offset tables.
    pub low: Option<&'a [u8]>,
    /// Activations `[m][kp]`.
    pub x: &'a [i8],
    pub kp: usize,
    pub m: usize,
    /// `[m][groups]`: what the epilogue needs of each row and group.
    pub terms: &'a [RowGroupTerms],
    pub groups: usize,
    /// Per group: padded K range, checked against `kp` when built.
    pub spans: GroupSpans<'a>,
    /// This block's scales, `[G][16]`, f32 or f16.
    pub w_scales: Params<'a>,
    /// This block's zero points, `[G][16]`; `None`: all 8.
    pub zeros: Option<&'a [u8]>,
    /// This block's float offsets, `[G][16]`, f32 or f16; `None`: all 0.
    pub offsets: Option<Params<'a>>,
}

/// Where a block's kernel writes its `[m][16]` outputs: row `r`'s sixteen values at `r·ld` past the
/// start, inside a row-major output (the block's sixteen columns of `out[m][n]`, `ld = n`) or a tile of
/// their own (`ld = 16`, one decode row's `[N/16][16]`). A kernel sets every output to the block's bias
/// (zeros without one) plus its sums: it [`BlockOut::start`]s its rows before adding into them, or (the
/// AMX tiling's sixteen-row pass, whose outputs live in registers) begins from [`BlockOut::bias`].
///
/// Writing `out` in place, not a tile copied into it afterwards, keeps a prompt's output stores among
/// the arithmetic that produces them, where they drain while the next pass computes.
pub(crate) struct BlockOut<'a> {
    start: *mut f32,
    ld: usize,
    rows: usize,
    bias: Option<&'a [f32; 16]>,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> BlockOut<'a> {
    /// `tile` as `[tile.len() / 16][16]`.
    pub fn tile(tile: &'a mut [f32], bias: Option<&'a [f32; 16]>) -> Self {
        assert!(tile.len().is_multiple_of(16), "a block tile of whole 16-value rows");
        BlockOut { start: tile.as_mut_ptr(), ld: 16, rows: tile.len() / 16, bias, _out: std::marker::PhantomData }
    }

    /// `rows` rows of sixteen values `ld` apart from `start`.
    ///
    /// # Safety
    /// `start` must be aligned for `f32` and `ld >= 16` (so no two rows overlap). For every `r < rows`,
    /// `start + r·ld .. start + r·ld + 16` must be valid for reads and writes for `'a`, and nothing else
    /// may read or write those values while the result lives.
    pub unsafe fn strided(start: *mut f32, ld: usize, rows: usize, bias: Option<&'a [f32; 16]>) -> Self {
        BlockOut { start, ld, rows, bias, _out: std::marker::PhantomData }
    }

    /// How many rows the output holds.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The block's bias; `None`: zeros.
    pub fn bias(&self) -> Option<&'a [f32; 16]> {
        self.bias
    }

    /// Row `r`'s sixteen values.
    ///
    /// # Panics
    /// If `r` is not one of the rows.
    pub fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "row {r} of a block output of {} rows", self.rows);
        // SAFETY: r < rows, so the sixteen values are valid and ours alone (the constructors' contract);
        // the exclusive borrow of self keeps this the only reference made through it.
        unsafe { std::slice::from_raw_parts_mut(self.start.add(r * self.ld), 16) }
    }

    /// Where row `r`'s sixteen values start: for `r < self.rows()`, valid to read and write while `self`
    /// lives and no slice from [`BlockOut::row`] is held. The pointer is computed without a check (the
    /// SIMD kernels check their rows once per block); for other `r` it must not be dereferenced.
    pub fn row_ptr(&mut self, r: usize) -> *mut f32 {
        self.start.wrapping_add(r * self.ld)
    }

    /// Sets rows `rows` to the bias (zeros without one), for a kernel that adds its sums into memory.
    pub fn start(&mut self, rows: Range<usize>) {
        for r in rows {
            match self.bias {
                Some(b) => self.row(r).copy_from_slice(b),
                None => self.row(r).fill(0.0),
            }
        }
    }
}

/// A weight's groups as ranges of padded K, each starting and ending on a 32-input boundary within `kp`.
///
/// The SIMD kernels step through a group 32 inputs (four 8-input chunks) at a time and read codes and
/// activations up to its end, so every block relies on this. A product's blocks share one set of spans:
/// checking them once where the product builds them keeps an O(groups) scan out of each block's path
/// (a decode step runs a few thousand blocks). Derefs to the ranges.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupSpans<'a> {
    spans: &'a [Range<usize>],
    kp: usize,
}

impl<'a> GroupSpans<'a> {
    /// Checks `spans` against the padded K `kp`.
    ///
    /// # Panics
    /// If a span starts or ends off a multiple of 32, or ends past `kp`: weights' spans hold neither
    /// (their geometry pads K to the tile block), so this is a bug in the caller.
    pub fn new(spans: &'a [Range<usize>], kp: usize) -> Self {
        assert!(
            spans.iter().all(|s| s.start % 32 == 0 && s.end % 32 == 0 && s.start <= s.end && s.end <= kp),
            "group spans on 32-input boundaries within the padded K {kp}"
        );
        GroupSpans { spans, kp }
    }

    /// The padded K the spans were checked against.
    pub fn kp(&self) -> usize {
        self.kp
    }
}

impl std::ops::Deref for GroupSpans<'_> {
    type Target = [Range<usize>];

    fn deref(&self) -> &[Range<usize>] {
        self.spans
    }
}

/// One activation row's scalars for one weight group, as the epilogue uses them, computed once per call.
/// The SIMD epilogues broadcast each straight from memory (a load, no vector arithmetic); derived from the
/// integer sum in every block, row and group instead, `8·Σx` and `Σx as f32` would cost a broadcast from
/// a general register and an integer-to-float conversion on the vector pipes the multiply-adds need.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowGroupTerms {
    /// The activations' scale.
    pub a_scale: f32,
    /// `Σ xq` over the group, converted to f32 (the offsets' multiplier).
    pub sum_f32: f32,
    /// `Σ xq` over the group.
    pub sum: i32,
    /// `8·Σ xq`, wrapping: the implicit zero point's term.
    pub sum_times_8: i32,
    /// `128·Σ xq`, wrapping: an 8-bit pair's zero point's term.
    pub sum_times_128: i32,
}

/// From this many row-and-group entries [`RowGroupTerms::table`] runs over the pool.
const PARALLEL_TERMS: usize = 4096;

impl RowGroupTerms {
    /// The terms of `[m][groups]` activation scales and group sums.
    pub fn table(a_scales: &[f32], sums: &[i32]) -> Vec<RowGroupTerms> {
        let terms = |(&a_scale, &sum): (&f32, &i32)| RowGroupTerms {
            a_scale,
            sum_f32: sum as f32,
            sum,
            sum_times_8: sum.wrapping_mul(8),
            sum_times_128: sum.wrapping_mul(128),
        };
        // A prompt's table (thousands of entries, for every product) is built over the pool; a decode
        // step's few dozen on the calling thread.
        if a_scales.len() >= PARALLEL_TERMS {
            a_scales.par_iter().zip(sums).map(terms).collect()
        } else {
            a_scales.iter().zip(sums).map(terms).collect()
        }
    }
}

impl Block<'_> {
    /// The epilogue of one row and group, shared by every variant: `out = fma(acc − z·Σx, a_s·w_s, out)`,
    /// then, with offsets, `out = fma(Σx, a_s·f, out)`. `acc` is `Σ xq·q` (of a pair, `Σ xq·u`).
    #[inline]
    pub fn finish(&self, r: usize, g: usize, acc: &[i32; 16], out: &mut [f32]) {
        let sum = self.terms[r * self.groups + g].sum;
        let centered: [i32; 16] = std::array::from_fn(|c| {
            let z = match (self.low, self.zeros) {
                (Some(_), _) => 128,
                (None, Some(z)) => i32::from(z[g * 16 + c]),
                (None, None) => 8,
            };
            acc[c].wrapping_sub(z.wrapping_mul(sum))
        });
        self.finish_centered(r, g, &centered, out);
    }

    /// [`Block::finish`] from `acc − z·Σx` (wrapping), which is `Σ xq·(q − z)`: what a kernel has directly
    /// when its codes are stored less an implicit zero point (the AMX tiling's signed B tiles).
    #[inline]
    pub fn finish_centered(&self, r: usize, g: usize, centered: &[i32; 16], out: &mut [f32]) {
        let RowGroupTerms { a_scale: a_s, sum_f32, .. } = self.terms[r * self.groups + g];
        for c in 0..16 {
            out[c] = (centered[c] as f32).mul_add(a_s * self.w_scales.get(g * 16 + c), out[c]);
            if let Some(f) = self.offsets {
                out[c] = sum_f32.mul_add(a_s * f.get(g * 16 + c), out[c]);
            }
        }
    }

    /// Whether the zero point is implicit (8, or a pair's 128) rather than stored per channel.
    pub fn implicit_zero(&self) -> bool {
        self.zeros.is_none()
    }
}

/// Where an epilogue takes a pass's sums from: the groups' sums in order, each stored on request (the AMX
/// tiling's tile stores, run ahead by the next group's dot products).
pub(crate) trait GroupSums {
    /// Stores group `g`'s sums and returns the buffer holding them: its first `rows × 16` values,
    /// `[rows][16]`, are this group's (the groups are asked for in order). The buffer is the source's,
    /// kept across its passes (one made for each pass would be zeroed for each), so past a short pass's
    /// rows it holds an earlier pass's sums.
    fn group(&mut self, g: usize) -> Result<&[i32; 256], TileError>;
}
