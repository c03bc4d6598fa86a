//! W8A16: int8 weight codes with one f32 scale per 32 input channels, against f32 activations.
//!
//! GGUF checkpoints store some tensors as Q8_0 (blocks of 32: an f16 scale `d` and 32 codes, `w = d·q`,
//! `q ∈ −128..=127`) and Q5_0 (`w = d·(q − 16)`, which is `d·q'` with int8 codes `q' ∈ −16..=15`). This
//! layer runs such tensors as stored, without requantizing them: its weights are the checkpoint's codes
//! `[N][K]` and scales `[N][K/32]` (widened to f32, which is exact for f16), and its activations stay f32.
//! The 4-bit W4A8 planes ([`crate::w4a8::int8`]) can hold the same weights, but they quantize the
//! activations to int8; here the only roundings are the f32 ones of the order below.
//!
//! # The arithmetic: one order, so one answer on every CPU
//!
//! For output `(m, n)`, with `q(i) = codes[n][32g + i]` converted to f32 (exact), `x(i) = x[m][32g + i]`
//! and `d = scales[n][g]`, sixteen f32 lane accumulators `acc[0..16]` start at +0, and for each group `g`
//! in K order each lane `j` does
//!
//! ```text
//! t[j]   = fma(q(16 + j), x(16 + j), q(j)·x(j))     // the product rounded, then one fused multiply-add
//! acc[j] = fma(d, t[j], acc[j])
//! ```
//!
//! then a fixed pairwise tree sums the lanes, `acc[j] += acc[j + 8]` (j < 8), `acc[j] += acc[j + 4]`
//! (j < 4), `acc[j] += acc[j + 2]` (j < 2), `sum = acc[0] + acc[1]`, and `out = sum + bias[n]` (`sum`
//! without a bias).
//!
//! Every kernel performs exactly these operations on exactly these operands: the portable one on a
//! `[f32; 16]` with [`f32::mul_add`], AVX2 with lanes 0..8 and 8..16 in two 8-wide registers, AVX-512
//! with all sixteen in one. Lanes never mix before the tree, so a kernel may visit them, the weight rows
//! and the activation rows in any order it likes; and threads split N, never K. So the result is a
//! function of the inputs alone — the same bits on every CPU, ISA and thread count — and
//! [`crate::reference::w8a16`], the same order written as naive loops, is the definition every kernel is
//! tested against bit for bit. Against the exact sum ([`crate::reference::w8a16_f64`]) each term goes
//! through at most `G + 7` roundings (`G = K/32`: its product, the inner FMA, the group FMA and every later
//! one, four tree additions, the bias addition): [`crate::budget::w8a16_bound`].
//!
//! Sixteen lanes fit a 16-wide register without any horizontal step until the end, and the scale
//! multiplies a group's partial sum once (one FMA per sixteen lanes) instead of every weight.
//!
//! # Kernels
//!
//! * **decode** (fewer than `prefill_from` rows; by default [`W8A16_PREFILL_FROM_ROWS`], so one): a GEMV,
//!   one activation row at a time over four weight rows per pass — four independent accumulator chains,
//!   where one row alone would wait on the FMA latency once per group — the four rows' codes staying in
//!   L1 for the next activation row;
//! * **prefill**: tiles of four activation rows per pass over two weight rows, each code loaded and
//!   converted once for the tile; two or three rows left over make a smaller tile, a single one runs as
//!   decode.
//!
//! Each exists portable, AVX2 + FMA (`x86_64::w8a16`) and AVX-512, chosen by [`crate::choice`] and run
//! through the capability token it bound.
//!
//! # Storage
//!
//! Codes `[N][K]` (one byte each) and little-endian f32 scales `[N][K/32]`, each readable in place from
//! [`SharedBytes`] (a mapped artifact's sections, [`W8A16Weights::from_parts`]); the scales are copied only
//! when misaligned or on a big-endian host. Every length is checked and every scale must be finite.

use rayon::prelude::*;

use crate::bytes::{Floats, SharedBytes};
use crate::choice::{self, BoundKernel, BoundKernels, LayerSpec};
use crate::error::{KernelError, KernelErrorKind, check_len};
use crate::isa::{Avx2Fma, Avx512, IsaCaps, IsaLevel};
use crate::kernel_id::KernelId;

pub use crate::choice::W8A16_PREFILL_FROM_ROWS;

/// Input channels per scale (Q8_0's and Q5_0's block).
pub const GROUP: usize = 32;

#[cfg(target_arch = "x86_64")]
const _: () = assert!(GROUP == crate::x86_64::w8a16::GROUP, "the SIMD kernels' group is the layer's");

/// Weight rows a decode pass takes (independent accumulator chains per activation row).
const DECODE_ROWS: usize = 4;
/// Activation rows a prefill pass takes.
const PREFILL_TILE: usize = 4;
/// Weight rows a prefill pass takes with its tile of activation rows.
const PREFILL_ROWS: usize = 2;
/// Weight rows per prefill task: their codes (18 KiB at K = 576) stay in L1/L2 while every tile of
/// activation rows passes over them.
const PREFILL_TASK_ROWS: usize = 32;
/// Code bytes × activation rows per decode task, at least: small layers are not drowned in scheduling.
const DECODE_TASK_WORK: usize = 65536;

/// `a·b`, or an error naming `what` when it overflows.
fn product(what: &str, a: usize, b: usize) -> Result<usize, KernelError> {
    a.checked_mul(b).ok_or_else(|| KernelError::invalid(format!("{what}: {a} × {b} overflows the address space")))
}

/// int8 codes `[N][K]` and f32 scales `[N][K/32]`: `w[n][k] = scales[n][k/32]·codes[n][k]`.
#[derive(Clone, Debug)]
pub struct W8A16Weights {
    n: usize,
    k: usize,
    /// `[N][K]`, each byte one code (two's complement).
    codes: SharedBytes,
    /// `[N][K/32]`, every one finite.
    scales: Floats,
}

impl W8A16Weights {
    /// The weights from owned codes (`[n][k]`) and scales (`[n][k/32]`). K must be a positive multiple of
    /// 32, N at least 1, every scale finite.
    pub fn new(codes: Vec<i8>, scales: Vec<f32>, n: usize, k: usize) -> Result<Self, KernelError> {
        let (code_count, scale_count) = Self::geometry(n, k)?;
        check_len("W8A16 codes [N][K]", code_count, codes.len())?;
        check_len("W8A16 scales [N][K/32]", scale_count, scales.len())?;
        // Same size and alignment: the collect reuses the allocation.
        let bytes: Vec<u8> = codes.into_iter().map(|q| q as u8).collect();
        Self::checked(n, k, bytes.into(), Floats::Owned(scales))
    }

    /// The weights from stored parts ([`Self::codes_bytes`], [`Self::scales_le_bytes`]), read in place:
    /// `codes` holds `[n][k]` codes, one byte each, `scales_le` `[n][k/32]` little-endian f32. Every
    /// length is checked and every scale must be finite.
    pub fn from_parts(codes: SharedBytes, scales_le: SharedBytes, n: usize, k: usize) -> Result<Self, KernelError> {
        let (code_count, scale_count) = Self::geometry(n, k)?;
        check_len("W8A16 code bytes", code_count, codes.len())?;
        check_len("W8A16 scale bytes", product("W8A16 scale bytes", scale_count, 4)?, scales_le.len())?;
        Self::checked(n, k, codes, Floats::new(scales_le)?)
    }

    /// `(N·K, N·K/32)`, after checking the shape.
    fn geometry(n: usize, k: usize) -> Result<(usize, usize), KernelError> {
        if n == 0 {
            return Err(KernelError::shape("W8A16 output channels (at least 1)", 1, 0));
        }
        if k == 0 || !k.is_multiple_of(GROUP) {
            return Err(KernelError::shape(
                "W8A16 input channels (a positive multiple of 32)",
                k.next_multiple_of(GROUP).max(GROUP),
                k,
            ));
        }
        Ok((product("W8A16 codes", n, k)?, n * (k / GROUP)))
    }

    fn checked(n: usize, k: usize, codes: SharedBytes, scales: Floats) -> Result<Self, KernelError> {
        if let Some(i) = scales.as_slice().iter().position(|d| !d.is_finite()) {
            let d = scales.as_slice()[i];
            let (row, g) = (i / (k / GROUP), i % (k / GROUP));
            return Err(KernelError::invalid(format!(
                "W8A16 scale of row {row}, group {g} is {d}; scales must be finite"
            )));
        }
        Ok(W8A16Weights { n, k, codes, scales })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Groups (scales) per row: `K/32`.
    pub fn groups(&self) -> usize {
        self.k / GROUP
    }

    /// The codes, `[N][K]`.
    pub fn codes(&self) -> &[i8] {
        bytemuck::cast_slice(&self.codes)
    }

    /// The scales, `[N][K/32]`.
    pub fn scales(&self) -> &[f32] {
        self.scales.as_slice()
    }

    /// The codes as stored (an artifact section; [`Self::from_parts`] reads it back).
    pub fn codes_bytes(&self) -> &SharedBytes {
        &self.codes
    }

    /// The scales as little-endian bytes (an artifact section; [`Self::from_parts`] reads it back).
    pub fn scales_le_bytes(&self) -> Vec<u8> {
        self.scales().iter().flat_map(|d| d.to_le_bytes()).collect()
    }

    /// Bytes the weights occupy (codes and scales).
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales().len() * 4
    }

    /// Row `row` of the weights, `d·q` (one f32 multiply each): a tied head's embedding lookup.
    pub fn row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        let (k, groups) = (self.k, self.groups());
        check_len("dequantized W8A16 row", k, out.len())?;
        if row >= self.n {
            return Err(KernelError::shape("row index (below N)", self.n, row));
        }
        let codes = &self.codes()[row * k..(row + 1) * k];
        let scales = &self.scales()[row * groups..(row + 1) * groups];
        for ((o, q), &d) in out.chunks_exact_mut(GROUP).zip(codes.chunks_exact(GROUP)).zip(scales) {
            for (o, &q) in o.iter_mut().zip(q) {
                *o = d * f32::from(q);
            }
        }
        Ok(())
    }
}

/// Which registers hold the sixteen lanes.
#[derive(Clone, Copy, Debug)]
enum Lanes {
    /// A `[f32; 16]`, [`f32::mul_add`].
    Portable,
    /// Two 8-wide registers.
    Avx2(Avx2Fma),
    /// One 16-wide register.
    Avx512(Avx512),
}

impl Lanes {
    /// The sums (before the bias) of `NR` weight rows (`codes` `[NR][k]`, `scales` `[NR][k/32]`) against
    /// `MR` activation rows (`x` `[MR][k]`), in the module's order: `[weight row][activation row]`.
    fn sums<const NR: usize, const MR: usize>(
        self,
        codes: &[i8],
        scales: &[f32],
        x: &[f32],
        k: usize,
    ) -> [[f32; MR]; NR] {
        match self {
            Lanes::Portable => sums_portable::<NR, MR>(codes, scales, x, k),
            #[cfg(target_arch = "x86_64")]
            Lanes::Avx2(tok) => crate::x86_64::w8a16::sums_avx2::<NR, MR>(tok, codes, scales, x, k),
            #[cfg(target_arch = "x86_64")]
            Lanes::Avx512(tok) => crate::x86_64::w8a16::sums_avx512::<NR, MR>(tok, codes, scales, x, k),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("x86 tokens cannot be constructed on other architectures"),
        }
    }
}

/// The fixed pairwise tree over sixteen lanes: `8 + 8`, `4 + 4`, `2 + 2`, `1 + 1`.
pub(crate) fn tree16(mut acc: [f32; 16]) -> f32 {
    for width in [8, 4, 2, 1] {
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// The portable kernel for [`Lanes::sums`]: the module's order on `[f32; 16]` accumulators.
fn sums_portable<const NR: usize, const MR: usize>(
    codes: &[i8],
    scales: &[f32],
    x: &[f32],
    k: usize,
) -> [[f32; MR]; NR] {
    let groups = k / GROUP;
    assert!(k.is_multiple_of(GROUP) && codes.len() == NR * k && scales.len() == NR * groups && x.len() == MR * k);
    let mut acc = [[[0.0f32; 16]; MR]; NR];
    for g in 0..groups {
        for (i, acc) in acc.iter_mut().enumerate() {
            let q: [f32; GROUP] = std::array::from_fn(|j| f32::from(codes[i * k + g * GROUP + j]));
            let d = scales[i * groups + g];
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = &x[r * k + g * GROUP..r * k + (g + 1) * GROUP];
                for (j, a) in acc.iter_mut().enumerate() {
                    let t = q[16 + j].mul_add(x[16 + j], q[j] * x[j]);
                    *a = d.mul_add(t, *a);
                }
            }
        }
    }
    acc.map(|rows| rows.map(tree16))
}

/// A prefill task's operands: its weight rows (`codes` `[rows][k]`, `scales` `[rows][k/32]`) and all the
/// activations (`x` `[m][k]`).
struct Tile<'a> {
    lanes: Lanes,
    codes: &'a [i8],
    scales: &'a [f32],
    x: &'a [f32],
    k: usize,
    m: usize,
}

impl Tile<'_> {
    /// Activation rows `r0..r0 + MR` against every weight row, two at a time (each code converted once
    /// for the tile), into `out` (`[rows][m]`).
    fn pass<const MR: usize>(&self, r0: usize, out: &mut [f32]) {
        let (k, m, groups) = (self.k, self.m, self.k / GROUP);
        let rows = out.len() / m;
        let xt = &self.x[r0 * k..(r0 + MR) * k];
        let mut i = 0;
        while i < rows {
            let count = PREFILL_ROWS.min(rows - i);
            let (c, s) = (&self.codes[i * k..(i + count) * k], &self.scales[i * groups..(i + count) * groups]);
            let mut store = |sums: &[[f32; MR]]| {
                for (di, row) in sums.iter().enumerate() {
                    out[(i + di) * m + r0..(i + di) * m + r0 + MR].copy_from_slice(row);
                }
            };
            if count == PREFILL_ROWS {
                store(&self.lanes.sums::<PREFILL_ROWS, MR>(c, s, xt, k));
            } else {
                store(&self.lanes.sums::<1, MR>(c, s, xt, k));
            }
            i += count;
        }
    }
}

/// A linear layer with W8A16 weights: `out = x·Wᵀ + bias`, in the module's order on every kernel.
#[derive(Debug)]
pub struct W8A16Linear {
    weights: W8A16Weights,
    bias: Option<Vec<f32>>,
    kernels: BoundKernels,
}

/// Whether `k` is a W8A16 kernel.
pub(crate) fn is_w8a16(k: KernelId) -> bool {
    matches!(
        k,
        KernelId::W8a16DecodePortable
            | KernelId::W8a16DecodeAvx2
            | KernelId::W8a16DecodeAvx512
            | KernelId::W8a16PrefillPortable
            | KernelId::W8a16PrefillAvx2
            | KernelId::W8a16PrefillAvx512
    )
}

impl W8A16Linear {
    /// What W8A16 layers are, for [`crate::choice::choose`], with the default prefill row count.
    pub fn spec() -> LayerSpec {
        LayerSpec::W8a16 { prefill_from: W8A16_PREFILL_FROM_ROWS }
    }

    /// The layer on the fastest kernels `caps` allows.
    pub fn new(weights: W8A16Weights, bias: Option<Vec<f32>>, caps: &IsaCaps) -> Result<Self, KernelError> {
        Self::with_kernels(weights, bias, choice::best(Self::spec(), caps)?)
    }

    /// The layer on the kernels of exactly `level` ([`choice::at_level`]), or a clear error naming what is
    /// missing.
    pub fn forced(
        weights: W8A16Weights,
        bias: Option<Vec<f32>>,
        level: IsaLevel,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        Self::with_kernels(weights, bias, choice::at_level(Self::spec(), level, caps)?)
    }

    /// The layer on `kernels` (a [`KernelChoice`](crate::choice::KernelChoice) of W8A16 kernels, bound).
    /// The bias, if any, holds N finite values.
    pub fn with_kernels(
        weights: W8A16Weights,
        bias: Option<Vec<f32>>,
        kernels: BoundKernels,
    ) -> Result<Self, KernelError> {
        if let Some(b) = &bias {
            check_len("bias", weights.n, b.len())?;
            if let Some(i) = b.iter().position(|v| !v.is_finite()) {
                return Err(KernelError::invalid(format!("bias {i} is {}; a bias must be finite", b[i])));
            }
        }
        kernels.expect_family("W8A16", is_w8a16)?;
        Ok(W8A16Linear { weights, bias, kernels })
    }

    /// The weights.
    pub fn weights(&self) -> &W8A16Weights {
        &self.weights
    }

    /// The bias.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The kernel `forward` runs for `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        self.kernels.for_rows(m)
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`. Returns the kernel that ran.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let (n, k) = (self.weights.n, self.weights.k);
        check_len("activations", product("activations", m, k)?, x.len())?;
        check_len("output", product("output", m, n)?, out.len())?;
        let kernel = self.kernels.bound_for_rows(m);
        let (lanes, prefill) = match kernel {
            BoundKernel::W8a16DecodePortable => (Lanes::Portable, false),
            BoundKernel::W8a16DecodeAvx2(t) => (Lanes::Avx2(t), false),
            BoundKernel::W8a16DecodeAvx512(t) => (Lanes::Avx512(t), false),
            BoundKernel::W8a16PrefillPortable => (Lanes::Portable, true),
            BoundKernel::W8a16PrefillAvx2(t) => (Lanes::Avx2(t), true),
            BoundKernel::W8a16PrefillAvx512(t) => (Lanes::Avx512(t), true),
            other => {
                return Err(KernelError::new(KernelErrorKind::WrongFamily { kernel: other.id(), layer: "W8A16" }));
            }
        };
        if m > 0 {
            self.run(lanes, prefill, x, m, out);
        }
        Ok(kernel.id())
    }

    /// Splits N into tasks of whole weight rows (threads never split K) and writes `out[m][n]`.
    fn run(&self, lanes: Lanes, prefill: bool, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.weights.n, self.weights.k);
        let task_rows = if prefill {
            PREFILL_TASK_ROWS
        } else {
            (DECODE_TASK_WORK / (k * m)).next_multiple_of(DECODE_ROWS).max(DECODE_ROWS)
        };
        let task = |t: usize, sums: &mut [f32]| self.task(lanes, prefill, x, m, t * task_rows, sums);
        if m == 1 {
            int4_team::for_each_chunk_mut(out, task_rows, 1, task);
        } else {
            // Each task's outputs are `[its rows][m]`, contiguous: written in place, then transposed.
            let mut by_row = vec![0.0f32; n * m];
            // A prefill's tasks are long and many, so rayon's stealing balances them; the team takes
            // decode's short loops in a couple of parts per thread.
            if prefill {
                by_row.par_chunks_mut(task_rows * m).enumerate().for_each(|(t, sums)| task(t, sums));
            } else {
                int4_team::for_each_chunk_mut(&mut by_row, task_rows * m, 1, task);
            }
            for (col, sums) in by_row.chunks_exact(m).enumerate() {
                for (r, &s) in sums.iter().enumerate() {
                    out[r * n + col] = s;
                }
            }
        }
    }

    /// Weight rows `row0..row0 + out.len()/m` against every activation row: `out` is `[rows][m]`.
    fn task(&self, lanes: Lanes, prefill: bool, x: &[f32], m: usize, row0: usize, out: &mut [f32]) {
        let (k, groups) = (self.weights.k, self.weights.groups());
        let rows = out.len() / m;
        let codes = &self.weights.codes()[row0 * k..(row0 + rows) * k];
        let scales = &self.weights.scales()[row0 * groups..(row0 + rows) * groups];
        let weight_rows =
            |i: usize, count: usize| (&codes[i * k..(i + count) * k], &scales[i * groups..(i + count) * groups]);
        // Prefill: tiles of activation rows, each passing over the task's weight rows a pair at a time; two
        // or three rows left over make a smaller tile, one runs as decode.
        let mut tiled = 0;
        if prefill {
            let tile = Tile { lanes, codes, scales, x, k, m };
            while tiled + PREFILL_TILE <= m {
                tile.pass::<PREFILL_TILE>(tiled, out);
                tiled += PREFILL_TILE;
            }
            match m - tiled {
                3 => tile.pass::<3>(tiled, out),
                2 => tile.pass::<2>(tiled, out),
                _ => {}
            }
            if m - tiled >= 2 {
                tiled = m;
            }
        }
        // Decode, and the prefill's last rows: per group of weight rows, each activation row in turn.
        let mut i = 0;
        while tiled < m && i < rows {
            let count = if rows - i >= DECODE_ROWS { DECODE_ROWS } else { 1 };
            let (c, s) = weight_rows(i, count);
            for r in tiled..m {
                let xr = &x[r * k..(r + 1) * k];
                if count == DECODE_ROWS {
                    for (di, [v]) in lanes.sums::<DECODE_ROWS, 1>(c, s, xr, k).into_iter().enumerate() {
                        out[(i + di) * m + r] = v;
                    }
                } else {
                    out[i * m + r] = lanes.sums::<1, 1>(c, s, xr, k)[0][0];
                }
            }
            i += count;
        }
        if let Some(b) = &self.bias {
            for (sums, &b) in out.chunks_exact_mut(m).zip(&b[row0..row0 + rows]) {
                for s in sums {
                    *s += b;
                }
            }
        }
    }
}
