//! W4A16: 4-bit weights in a tinygemm layout, bf16 (or f32) activations, f32 accumulation.
//!
//! [`W4A16Linear::forward`] computes `y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias)` by one of two kernels, chosen by M:
//!
//! * **decode** (`M < dequant_threshold`): a GEMV that reads each packed byte once per block of four rows
//!   and keeps the group's scale and zero out of the inner loop (`s·Σ x·(q − 8) + z·Σ x` per group);
//! * **prefill** (`M ≥ dequant_threshold`): dequantize from the packed layout into panels, one lane group
//!   and K chunk at a time, and run the GEMM microkernel over them (the private `gemm` module). On AVX2 (no bf16
//!   arithmetic) the panels hold the exact f32 weights and the microkernel is f32 FMA. With
//!   `direct_dequant: true` (the default) the panels come straight from the tinygemm bytes and no second
//!   copy of the weights exists; with `false` the layer also keeps split-halves planes and the prefill
//!   reads those instead (the upstream system's arrangement, kept for comparison).
//!
//! Both read the layout through *lane groups* ([`LaneGroup`]): eight bytes per input channel holding
//! sixteen output channels. Every tinygemm variant (64- or 32-channel blocks, and the adjacent-pair tails)
//! decomposes into lane groups, so one kernel reads them all.
//!
//! Threads split lane groups (N), never a K reduction, so results are bit-identical for any thread count.

use half::bf16;
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{Codes, GroupParams, GroupSize, halves};
use rayon::prelude::*;

use crate::bytes::SharedBytes;
use crate::choice::{self, BoundKernel, BoundKernels, LayerSpec};
use crate::error::{KernelError, KernelErrorKind, check_len};
use crate::gemm::{self, InnerLoops};
use crate::isa::{Avx2Fma, Avx512, Avx512Bf16, IsaCaps, IsaLevel};
use crate::kernel_id::KernelId;
use crate::portable;
use crate::tile::{TileConfig, TileError, TileUnit};

/// The row count at and above which [`W4A16Linear`] takes the prefill kernel, unless configured otherwise.
///
/// Chosen from `cargo xtask bench`'s crossover measurement on the development machine (see
/// `docs/perf.md`): below it the decode GEMV is faster, at and above it the dequantizing GEMM is.
pub const DEFAULT_DEQUANT_THRESHOLD: usize = 16;

/// Decode processes this many activation rows per pass over the weights.
const DECODE_ROWS: usize = 4;

/// Rows per pass of [`W4A16Linear::decode_rows_exact`]'s AVX-512 kernels: three rows of eight accumulator
/// registers each (a one-row pass's chains) leave eight of the 32 for the codes and the activations. (The
/// AVX2 and portable kernels give every row its one-row bits in any pass, so they take four.)
pub const EXACT_ROWS: usize = 3;

/// How a W4A16 layer chooses and feeds its kernels (the `cpu_int4` checkpoint keys of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct W4A16Config {
    /// Rows at or above which the prefill kernel runs.
    pub dequant_threshold: usize,
    /// Prefill dequantizes from the tinygemm bytes (`true`) or from a kept split-halves copy (`false`).
    pub direct_dequant: bool,
}

impl Default for W4A16Config {
    fn default() -> Self {
        W4A16Config { dequant_threshold: DEFAULT_DEQUANT_THRESHOLD, direct_dequant: true }
    }
}

/// Sixteen output channels that a tinygemm layout stores in eight contiguous bytes per input channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneGroup {
    /// Byte offset of input channel 0's eight bytes.
    pub offset: usize,
    /// Bytes from one input channel's eight bytes to the next's.
    pub stride: usize,
    /// `channels[j]` is the output channel in lane `j`: lanes 0..8 are the low nibbles of bytes 0..8,
    /// lanes 8..16 the high nibbles.
    pub channels: [u32; 16],
}

/// The lane groups of a tinygemm layout of `n × k`, in channel-block order.
pub fn lane_groups(block: TinygemmBlock, n: usize, k: usize) -> Vec<LaneGroup> {
    let width = block.width();
    let mut out = Vec::with_capacity(n / 16);
    let mut c0 = 0;
    while c0 < n {
        let nb = width.min(n - c0);
        let base = c0 * k / 2;
        let line = nb / 2;
        for h in 0..nb / 16 {
            let mut channels = [0u32; 16];
            for j in 0..8 {
                let (lo, hi) = if nb == width {
                    // Byte d of a full block holds channels d and d + width/2.
                    (c0 + 8 * h + j, c0 + 8 * h + j + width / 2)
                } else {
                    // A tail stores adjacent pairs: byte d holds channels 2d and 2d + 1.
                    (c0 + 2 * (8 * h + j), c0 + 2 * (8 * h + j) + 1)
                };
                channels[j] = lo as u32;
                channels[j + 8] = hi as u32;
            }
            out.push(LaneGroup { offset: base + 8 * h, stride: line, channels });
        }
        c0 += nb;
    }
    out
}

/// Scales and zeros in lane order: owned, or little-endian f32 bytes read in place (a mapped artifact).
#[derive(Clone, Debug)]
enum LaneParams {
    Owned(Vec<f32>),
    /// Checked at construction to be 4-byte aligned and a whole number of f32, on a little-endian host.
    Mapped(SharedBytes),
}

impl LaneParams {
    fn as_slice(&self) -> &[f32] {
        match self {
            LaneParams::Owned(v) => v,
            LaneParams::Mapped(b) => bytemuck::cast_slice(b),
        }
    }
}

/// A W4A16 layer's weights: the tinygemm bytes, their parameters arranged per lane group, and (only with
/// `direct_dequant: false`) the split-halves planes. Only the lane-ordered parameters are kept (the
/// canonical `[N][G]` arrangement would double their memory); [`W4A16Weights::scale_zero`] and
/// [`W4A16Weights::params`] read them back per channel.
#[derive(Clone, Debug)]
pub struct W4A16Weights {
    n: usize,
    k: usize,
    group: GroupSize,
    block: TinygemmBlock,
    packed: SharedBytes,
    /// Per lane group, per group: `[s_lo 8][s_hi 8][z_lo 8][z_hi 8]` in lane order.
    lane_params: LaneParams,
    lanes: Vec<LaneGroup>,
    /// Per output channel: its lane group and lane.
    channel_lane: Vec<(u32, u8)>,
    /// Where the lane groups' tiles land in `[M][N]` (from `lanes`).
    scatter: gemm::ScatterPlan,
    halves: Option<SharedBytes>,
}

impl W4A16Weights {
    /// Packs codes and parameters into the tinygemm layout with `block`-wide channel blocks. N must be a
    /// multiple of 16 and K even (see [`int4_layout::Codes::padded_n`]).
    pub fn new(
        codes: &Codes,
        params: GroupParams,
        block: TinygemmBlock,
        direct_dequant: bool,
    ) -> Result<Self, KernelError> {
        let packed = tinygemm::pack(codes, block)?;
        let halves = if direct_dequant { None } else { Some(halves::pack(codes)?.into()) };
        Self::from_packed(packed.into(), params, block, halves)
    }

    /// Wraps already-packed tinygemm bytes (for example a section of a memory-mapped artifact, which is
    /// then read in place), checking their length against the parameters' shape.
    pub fn from_packed(
        packed: SharedBytes,
        params: GroupParams,
        block: TinygemmBlock,
        halves: Option<SharedBytes>,
    ) -> Result<Self, KernelError> {
        let (n, k) = (params.n(), params.k());
        let lanes = lane_groups(block, n, k);
        let groups = params.groups();
        let mut lane_params = Vec::with_capacity(lanes.len() * groups * 32);
        for lg in &lanes {
            for g in 0..groups {
                lane_params.extend(lg.channels.iter().map(|&c| params.scale(c as usize, g)));
                lane_params.extend(lg.channels.iter().map(|&c| params.zero(c as usize, g)));
            }
        }
        Self::assemble(packed, LaneParams::Owned(lane_params), n, k, params.group_size(), block, halves)
    }

    /// Wraps packed bytes and lane-ordered parameters exactly as [`W4A16Weights::lane_params_le_bytes`]
    /// wrote them, both read in place: the zero-copy load of a cached artifact. Lengths and alignment are
    /// checked; the values are not (an artifact's payload hash is checked when it is written and by
    /// `int4 cache verify`, not on every load).
    pub fn from_packed_lane_params(
        packed: SharedBytes,
        lane_params: SharedBytes,
        (n, k, group): (usize, usize, GroupSize),
        block: TinygemmBlock,
        halves: Option<SharedBytes>,
    ) -> Result<Self, KernelError> {
        let params = if cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, f32>(&lane_params).is_ok() {
            LaneParams::Mapped(lane_params)
        } else {
            // A big-endian host, or bytes not 4-byte aligned: decode a copy.
            if !lane_params.len().is_multiple_of(4) {
                return Err(KernelError::shape(
                    "lane parameter bytes",
                    lane_params.len().next_multiple_of(4),
                    lane_params.len(),
                ));
            }
            LaneParams::Owned(
                lane_params.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            )
        };
        Self::assemble(packed, params, n, k, group, block, halves)
    }

    fn assemble(
        packed: SharedBytes,
        lane_params: LaneParams,
        n: usize,
        k: usize,
        group: GroupSize,
        block: TinygemmBlock,
        halves: Option<SharedBytes>,
    ) -> Result<Self, KernelError> {
        TinygemmMatrix::new(&packed, n, k, block)?;
        if let Some(h) = &halves {
            check_len("split halves", n * k / 2, h.len())?;
        }
        let lanes = lane_groups(block, n, k);
        check_len("lane parameters", lanes.len() * group.groups(k) * 32, lane_params.as_slice().len())?;
        let mut channel_lane = vec![(0u32, 0u8); n];
        for (lg, l) in lanes.iter().enumerate() {
            for (j, &c) in l.channels.iter().enumerate() {
                channel_lane[c as usize] = (lg as u32, j as u8);
            }
        }
        let scatter = gemm::ScatterPlan::new(lanes.iter().map(|l| l.channels), n);
        Ok(W4A16Weights { n, k, group, block, packed, lane_params, lanes, channel_lane, scatter, halves })
    }

    /// The lane-ordered parameters as little-endian f32 bytes: what an artifact stores beside the packed
    /// bytes for [`W4A16Weights::from_packed_lane_params`].
    pub fn lane_params_le_bytes(&self) -> Vec<u8> {
        self.lane_params.as_slice().iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Scale and zero of output channel `c`, group `g`.
    #[inline]
    pub fn scale_zero(&self, c: usize, g: usize) -> (f32, f32) {
        let (lg, j) = self.channel_lane[c];
        let p = &self.lane_sz(lg as usize)[g * 32..g * 32 + 32];
        (p[j as usize], p[16 + j as usize])
    }

    /// The parameters in their canonical `[N][G]` arrangement (a copy).
    pub fn params(&self) -> GroupParams {
        let groups = self.group.groups(self.k);
        let (mut scale, mut zero) = (Vec::with_capacity(self.n * groups), Vec::with_capacity(self.n * groups));
        for c in 0..self.n {
            for g in 0..groups {
                let (s, z) = self.scale_zero(c, g);
                scale.push(s);
                zero.push(z);
            }
        }
        GroupParams::new(self.n, self.k, self.group, scale, zero).expect("parameters that were valid when packed")
    }

    /// Decodes output channel `row` (all K weights) into `out`: the embedding lookup of a tied 4-bit head.
    /// The same values as the kernels' dequantization, [`int4_layout::dequantize`].
    pub fn decode_row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.n {
            return Err(KernelError::invalid(format!("row {row} is outside the {} output channels", self.n)));
        }
        check_len("row", self.k, out.len())?;
        let (lg, j) = self.channel_lane[row];
        let (lg, j) = (lg as usize, j as usize);
        let (bytes, stride, sz) = (self.lane_bytes(lg), self.lanes[lg].stride, self.lane_sz(lg));
        let g_len = self.group.len(self.k);
        for (kk, o) in out.iter_mut().enumerate() {
            let b = bytes[kk * stride + j % 8];
            let q = if j < 8 { b & 0xF } else { b >> 4 };
            let p = &sz[(kk / g_len) * 32..];
            *o = int4_layout::dequantize(q, p[j], p[16 + j]);
        }
        Ok(())
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The tinygemm block width of the packed bytes.
    pub fn block(&self) -> TinygemmBlock {
        self.block
    }

    /// The packed tinygemm bytes.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// The split-halves planes, when kept (`direct_dequant: false`).
    pub fn halves(&self) -> Option<&[u8]> {
        self.halves.as_deref()
    }

    /// Bytes the decode kernel streams per call: packed codes plus f32 scales and zeros.
    pub fn decode_bytes(&self) -> usize {
        self.packed.len() + self.lane_params.as_slice().len() * 4
    }

    /// Bytes this layer holds (packed, parameters, and the split halves if kept).
    pub fn resident_bytes(&self) -> usize {
        self.decode_bytes() + self.halves.as_ref().map_or(0, |h| h.len())
    }

    fn lane_sz(&self, lg: usize) -> &[f32] {
        let per = self.group.groups(self.k) * 32;
        &self.lane_params.as_slice()[lg * per..(lg + 1) * per]
    }

    /// The bytes a lane group reads: from its offset to its last input channel's eight bytes.
    fn lane_bytes(&self, lg: usize) -> &[u8] {
        let l = &self.lanes[lg];
        &self.packed[l.offset..l.offset + (self.k - 1) * l.stride + 8]
    }
}

/// A W4A16 layer ready to run: weights, optional bias, configuration and its kernels, bound.
#[derive(Clone, Debug)]
pub struct W4A16Linear {
    weights: W4A16Weights,
    bias: Option<Vec<f32>>,
    config: W4A16Config,
    kernels: BoundKernels,
}

impl W4A16Linear {
    /// What `weights` under `config` are, for [`crate::choice::choose`].
    pub fn spec(weights: &W4A16Weights, config: W4A16Config) -> LayerSpec {
        LayerSpec::W4a16 {
            block: weights.block,
            direct_dequant: config.direct_dequant,
            prefill_from: config.dequant_threshold,
        }
    }

    /// The layer on `kernels` (a [`KernelChoice`](crate::choice::KernelChoice) bound to this process).
    /// Fails when they are not W4A16 kernels, disagree with `config` (its threshold, or split halves the
    /// weights were built without), or read whole 64-channel blocks of a 32-channel layout.
    pub fn new(
        weights: W4A16Weights,
        bias: Option<Vec<f32>>,
        config: W4A16Config,
        kernels: BoundKernels,
    ) -> Result<Self, KernelError> {
        if let Some(b) = &bias {
            check_len("bias", weights.n, b.len())?;
        }
        kernels.expect_family("W4A16", |k| {
            k.name().starts_with("w4a16-decode-") || k.name().starts_with("w4a16-prefill-")
        })?;
        let choice = kernels.choice();
        if choice.prefill_from != config.dequant_threshold {
            return Err(KernelError::invalid(format!(
                "the kernels switch to prefill at {} rows, the configuration at {}",
                choice.prefill_from, config.dequant_threshold
            )));
        }
        let halves_kernel = matches!(
            choice.prefill,
            KernelId::W4a16PrefillHalvesAvx2
                | KernelId::W4a16PrefillHalvesAvx512
                | KernelId::W4a16PrefillHalvesAvx512Bf16
        );
        if (halves_kernel || !config.direct_dequant) && weights.halves.is_none() {
            return Err(KernelError::invalid(
                "the prefill reads split halves (direct_dequant: false), which these weights were built without; \
                 build the weights with direct_dequant = false",
            ));
        }
        if choice.decode == KernelId::W4a16DecodeAvx512Bf16 && weights.block != TinygemmBlock::N64 {
            return Err(KernelError::invalid(
                "the vdpbf16ps decode reads whole 64-channel blocks; these weights are in 32-channel blocks",
            ));
        }
        Ok(W4A16Linear { weights, bias, config, kernels })
    }

    /// The layer on the fastest kernels this process may run under `caps`.
    pub fn with_caps(
        weights: W4A16Weights,
        bias: Option<Vec<f32>>,
        config: W4A16Config,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        let kernels = choice::best(Self::spec(&weights, config), caps)?;
        Self::new(weights, bias, config, kernels)
    }

    /// The layer on the kernels of exactly `level` ([`choice::at_level`]), or a clear error naming what is
    /// missing (the CPU lacks it, or `caps` forbids it). Never SIGILL.
    pub fn forced(
        weights: W4A16Weights,
        bias: Option<Vec<f32>>,
        config: W4A16Config,
        level: IsaLevel,
        caps: &IsaCaps,
    ) -> Result<Self, KernelError> {
        let kernels = choice::at_level(Self::spec(&weights, config), level, caps)?;
        Self::new(weights, bias, config, kernels)
    }

    /// The weights.
    pub fn weights(&self) -> &W4A16Weights {
        &self.weights
    }

    /// The configuration.
    pub fn config(&self) -> W4A16Config {
        self.config
    }

    /// The kernels, bound.
    pub fn kernels(&self) -> BoundKernels {
        self.kernels
    }

    /// The kernel `forward` runs for `m` rows.
    pub fn kernel_for(&self, m: usize) -> KernelId {
        self.kernels.for_rows(m)
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`, with bf16 activations; returns the kernel that ran.
    pub fn forward_bf16(&self, x: &[bf16], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        self.forward(&xf, m, out)
    }

    /// `out[M][N] = x[M][K]·Wᵀ + bias`: decode below the threshold, prefill at or above it. Returns the
    /// kernel that ran: the bound kernel [`W4A16Linear::decode`] or [`W4A16Linear::prefill`] dispatched on.
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<KernelId, KernelError> {
        if m < self.kernels.choice().prefill_from {
            self.decode(x, m, out)?;
            Ok(self.kernels.decode().id())
        } else {
            self.prefill(x, m, out)?;
            Ok(self.kernels.prefill().id())
        }
    }

    /// Checks the operands' lengths for `m` rows; `false` when there are no rows to compute.
    fn has_rows(&self, x: &[f32], m: usize, out: &[f32]) -> Result<bool, KernelError> {
        check_len("activations", m * self.weights.k, x.len())?;
        check_len("output", m * self.weights.n, out.len())?;
        Ok(m > 0)
    }

    /// Runs the decode kernel for any `m` (the threshold is not consulted).
    pub fn decode(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.decode_passes(x, m, out, DECODE_ROWS, false)
    }

    /// The decode kernel for `m` rows, each row's result bit for bit what [`W4A16Linear::decode`] gives it
    /// alone: one pass over the weights for all rows, each row's sums on the accumulator chains of a
    /// one-row pass. The AVX-512 kernels (bf16 and f32) unpack each block's codes once for up to
    /// [`EXACT_ROWS`] rows, each row keeping its own chains; the AVX2 kernel keeps one chain per row and
    /// lane in every pass, and the portable one computes each row on its own, so any of their passes is
    /// exact. ([`W4A16Linear::decode`] on AVX-512 takes up to four rows per pass, each on
    /// fewer chains, so its rows' sums round otherwise; on AVX2 and portable it is this.)
    pub fn decode_rows_exact(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        self.decode_passes(x, m, out, EXACT_ROWS, true)
    }

    /// The decode kernel, up to `rows` activation rows per pass over a block of weights; with
    /// `one_row_chains`, each row on the accumulator chains a one-row pass gives it.
    fn decode_passes(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        rows: usize,
        one_row_chains: bool,
    ) -> Result<(), KernelError> {
        let w = &self.weights;
        let (n, k) = (w.n, w.k);
        if !self.has_rows(x, m, out)? {
            return Ok(());
        }
        let g_len = w.group.len(k);
        let groups = w.group.groups(k);
        match self.kernels.decode() {
            BoundKernel::W4a16DecodeAvx512Bf16(bt) => {
                // The bf16 kernel's operands: activation pairs rounded to bf16, and their group sums.
                let (pairs, sums) = bf16_pairs_and_sums(x, m, k, g_len);
                // The f32 kernel's group sums, unless the bf16 kernel takes every block (N a multiple of 64).
                let xs = if n.is_multiple_of(64) { Vec::new() } else { portable::group_sums(x, m, k, g_len) };
                let passes = Passes { rows, one_row_chains };
                self.decode_avx512(bt.avx512(), Some((bt, &pairs, &sums)), x, m, passes, &xs, out);
                return Ok(());
            }
            BoundKernel::W4a16DecodeAvx512(tok) => {
                let xs = portable::group_sums(x, m, k, g_len);
                self.decode_avx512(tok, None, x, m, Passes { rows, one_row_chains }, &xs, out);
                return Ok(());
            }
            BoundKernel::W4a16DecodeAvx2(tok) => {
                let xs = portable::group_sums(x, m, k, g_len);
                // Every AVX2 pass gives a row its one-row bits, so exact decodes take as many rows per pass.
                self.decode_avx2_blocks(tok, x, m, DECODE_ROWS, &xs, out);
                return Ok(());
            }
            BoundKernel::W4a16DecodePortable => {}
            other => return Err(wrong_family(other)),
        }
        let mut tiles = vec![0.0f32; w.lanes.len() * m * 16];
        // The portable kernel computes each row on its own, so every pass gives a row its one-row bits.
        let rows = DECODE_ROWS;
        let xs = portable::group_sums(x, m, k, g_len);
        // Keep tasks to at least ~64 K weights so small layers are not drowned in scheduling.
        let min_lanes = (65536 / (16 * k)).max(1);
        int4_team::for_each_chunk_mut(&mut tiles, m * 16, min_lanes, |lg, tile| {
            let (lb, sz, stride) = (w.lane_bytes(lg), w.lane_sz(lg), w.lanes[lg].stride);
            let mut r0 = 0;
            while r0 < m {
                let mr = rows.min(m - r0);
                let xr = &x[r0 * k..];
                let xsr = &xs[r0 * groups..];
                let t = &mut tile[r0 * 16..(r0 + mr) * 16];
                portable::decode_lane_group(mr, xr, k, xsr, lb, stride, sz, k, g_len, t);
                r0 += mr;
            }
        });
        self.finish(&tiles, m, out)
    }

    /// Runs `task(first, count, chunk)` in parallel tasks of four lane groups and writes their tiles to
    /// `out[m][n]`, adding the bias: `first` is a task's first lane group, `count` how many it holds (four,
    /// but for the last), `chunk` their tiles (`[count][m][16]`). Tasks run at least ~64 K weights each, so
    /// a small layer is not drowned in scheduling. At one row, where the layout puts each four lane groups'
    /// channels in one 64-channel piece, a task writes its piece of `out` itself from tiles on its stack:
    /// the calling thread then has no scatter left to do and never reads tiles another thread wrote.
    fn four_lane_groups(&self, m: usize, out: &mut [f32], task: impl Fn(usize, usize, &mut [f32]) + Sync) {
        let w = &self.weights;
        let min_quads = (65536 / (64 * w.k)).max(1);
        let bias = self.bias.as_deref();
        if m == 1 && w.scatter.quads_in_place() {
            int4_team::for_each_chunk_mut(&mut out[..w.n], 64, min_quads, |q, piece| {
                let count = (w.lanes.len() - 4 * q).min(4);
                let mut tiles = [0.0f32; 64];
                task(4 * q, count, &mut tiles[..count * 16]);
                w.scatter.quad_into(q, &tiles, bias, piece);
            });
            return;
        }
        let mut tiles = vec![0.0f32; w.lanes.len() * m * 16];
        int4_team::for_each_chunk_mut(&mut tiles, 4 * m * 16, min_quads, |q, chunk| {
            task(4 * q, chunk.len() / (m * 16), chunk)
        });
        gemm::scatter(&tiles, m, &w.scatter, bias, out);
    }

    /// Scatters the lane groups' tiles (`[lanes][m][16]`) to `out[m][n]`, adding the bias.
    fn finish(&self, tiles: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        gemm::scatter(tiles, m, &self.weights.scatter, self.bias.as_deref(), out);
        Ok(())
    }

    /// The inner loops that dequantize panels for the prefill kernel (its AVX2 + FMA where it has them).
    fn prefill_loops(&self) -> InnerLoops {
        match self.kernels.prefill() {
            BoundKernel::W4a16PrefillAmxBf16(t) => InnerLoops::Avx2(t.avx2()),
            BoundKernel::W4a16PrefillDirectAvx512Bf16(t) | BoundKernel::W4a16PrefillHalvesAvx512Bf16(t) => {
                InnerLoops::Avx2(t.avx512().avx2())
            }
            BoundKernel::W4a16PrefillDirectAvx512(t) | BoundKernel::W4a16PrefillHalvesAvx512(t) => {
                InnerLoops::Avx2(t.avx2())
            }
            BoundKernel::W4a16PrefillDirectAvx2(t) | BoundKernel::W4a16PrefillHalvesAvx2(t) => InnerLoops::Avx2(t),
            _ => InnerLoops::Portable,
        }
    }

    /// The AVX-512 decode into `out` (`[m][n]`, through [`W4A16Linear::four_lane_groups`]), four lane
    /// groups per task: a full 64-channel block's four side by side in one pass (each byte read once), else
    /// neighbours in pairs (a tinygemm layout stores lane groups `h` and `h + 1` of a block side by side),
    /// else one alone.
    ///
    /// With `bf16` (the token, activation pairs `[m][k/2]` and their bf16 group sums `[m][groups]`), each
    /// full 64-channel block runs the `vdpbf16ps` kernel instead, for up to four rows per pass.
    #[allow(clippy::too_many_arguments)]
    fn decode_avx512(
        &self,
        tok: Avx512,
        bf16: Option<(Avx512Bf16, &[u32], &[f32])>,
        x: &[f32],
        m: usize,
        passes: Passes,
        xs: &[f32],
        out: &mut [f32],
    ) {
        let Passes { rows, one_row_chains } = passes;
        let w = &self.weights;
        let k = w.k;
        let g_len = w.group.len(k);
        let groups = w.group.groups(k);
        // Whether lane group `i + 1` lies right after `i` (same stride, the next eight bytes).
        let next_to = |i: usize| {
            let (a, b) = (&w.lanes[i], &w.lanes[i + 1]);
            b.offset == a.offset + 8 && b.stride == a.stride
        };
        self.four_lane_groups(m, out, |first, count, chunk| {
            let mut r0 = 0;
            while r0 < m {
                let mr = rows.min(m - r0);
                // `xs` is empty when the bf16 kernel takes every block.
                let (xr, xsr) = (&x[r0 * k..], xs.get(r0 * groups..).unwrap_or(&[]));
                let mut i = 0;
                while i < count {
                    let lg = first + i;
                    let quad = i + 4 <= count && (0..3).all(|d| next_to(lg + d));
                    if let (Some((bt, pairs, sums)), true) = (bf16, quad && w.lanes[lg].stride == 32) {
                        let l = &w.lanes[lg];
                        let bytes = &w.packed[l.offset..l.offset + k * 32];
                        let sz: [&[f32]; 4] = std::array::from_fn(|d| w.lane_sz(lg + d));
                        let tiles = &mut chunk[i * m * 16..(i + 4) * m * 16];
                        let kp2 = k.div_ceil(2);
                        let (xb, xsb) = (&pairs[r0 * kp2..], &sums[r0 * groups..]);
                        decode_block_bf16_checked(
                            bt,
                            xb,
                            k,
                            xsb,
                            bytes,
                            sz,
                            g_len,
                            TileRows { tiles, m, r0, mr, width: 4, one_row_chains },
                        );
                        i += 4;
                        continue;
                    }
                    // Four side by side (only for few rows: four pairs of accumulators per row, unless each
                    // row keeps a one-row pass's chains, which takes four side by side), two, or one.
                    let width = if (mr <= 2 || one_row_chains) && quad {
                        4
                    } else if i + 2 <= count && next_to(lg) {
                        2
                    } else {
                        1
                    };
                    let l = &w.lanes[lg];
                    let len = (k - 1) * l.stride + 8 * width;
                    let bytes = &w.packed[l.offset..l.offset + len];
                    // Slots past `width` repeat the last lane group; the kernel never touches them.
                    let sz: [&[f32]; 4] = std::array::from_fn(|d| w.lane_sz(lg + d.min(width - 1)));
                    let tiles = &mut chunk[i * m * 16..(i + width) * m * 16];
                    let rows = TileRows { tiles, m, r0, mr, width, one_row_chains };
                    decode_avx512_checked(tok, xr, k, xsr, bytes, l.stride, sz, g_len, rows);
                    i += width;
                }
                r0 += mr;
            }
        });
    }

    /// The AVX2 decode into `out` (`[m][n]`, through [`W4A16Linear::four_lane_groups`]), four lane groups
    /// per task, every row on one FMA chain per lane and half ([`crate::x86_64::avx2::decode_lanes`]): so
    /// every pass gives a row its one-row bits, and `one_row_chains` costs nothing. Lane groups that share a
    /// stride (a task's two 32-channel blocks, or one 64-channel block) run side by side, as many as keep
    /// eight chains: four for one row, two for two, one for more.
    fn decode_avx2_blocks(&self, tok: Avx2Fma, x: &[f32], m: usize, rows: usize, xs: &[f32], out: &mut [f32]) {
        let w = &self.weights;
        let k = w.k;
        let (g_len, groups) = (w.group.len(k), w.group.groups(k));
        self.four_lane_groups(m, out, |first, count, chunk| {
            let mut r0 = 0;
            while r0 < m {
                let mr = rows.min(m - r0);
                let (xr, xsr) = (&x[r0 * k..], &xs[r0 * groups..]);
                let most = match mr {
                    1 => 4,
                    2 => 2,
                    _ => 1,
                };
                let mut i = 0;
                while i < count {
                    let stride = w.lanes[first + i].stride;
                    // The run of lane groups from `i` that share its stride, up to `most`, as 4, 2 or 1.
                    let run = (i..count.min(i + most)).take_while(|&j| w.lanes[first + j].stride == stride).count();
                    let width = if run == 3 { 2 } else { run };
                    let lane = |d: usize| first + i + d.min(width - 1);
                    let bytes: [&[u8]; 4] = std::array::from_fn(|d| w.lane_bytes(lane(d)));
                    let sz: [&[f32]; 4] = std::array::from_fn(|d| w.lane_sz(lane(d)));
                    let tiles = &mut chunk[i * m * 16..(i + width) * m * 16];
                    let rows = TileRows { tiles, m, r0, mr, width, one_row_chains: false };
                    decode_avx2_checked(tok, xr, k, xsr, bytes, stride, sz, g_len, rows);
                    i += width;
                }
                r0 += mr;
            }
        });
    }

    /// Runs the prefill kernel for any `m` (the threshold is not consulted).
    pub fn prefill(&self, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
        let w = &self.weights;
        let k = w.k;
        if !self.has_rows(x, m, out)? {
            return Ok(());
        }
        let kernel = self.kernels.prefill();
        // Whether the panels come from the packed layout, and the GEMM: bf16 pairs, or f32 on 512-bit
        // registers, or (neither) on the dequantization's own inner loops.
        let (direct, bf16, wide) = match kernel {
            #[cfg(target_arch = "x86_64")]
            BoundKernel::W4a16PrefillAmxBf16(tok) => {
                return self.prefill_tiles(&|| crate::x86_64::amx::AmxTiles::for_bf16(tok), x, m, out);
            }
            BoundKernel::W4a16PrefillDirectAvx512Bf16(t) => (true, Some(t), None),
            BoundKernel::W4a16PrefillHalvesAvx512Bf16(t) => (false, Some(t), None),
            BoundKernel::W4a16PrefillDirectAvx512(t) => (true, None, Some(t)),
            BoundKernel::W4a16PrefillHalvesAvx512(t) => (false, None, Some(t)),
            BoundKernel::W4a16PrefillDirectAvx2(_) => (true, None, None),
            BoundKernel::W4a16PrefillHalvesAvx2(_) => (false, None, None),
            // The portable prefill reads what the configuration keeps.
            BoundKernel::W4a16PrefillPortable => (self.config.direct_dequant, None, None),
            other => return Err(wrong_family(other)),
        };
        let g_len = w.group.len(k);
        let mut tiles = gemm::take_tiles(w.lanes.len() * m * 16);
        let loops = self.prefill_loops();
        let from_packed = |lg: usize, k0: usize, k1: usize, panel: &mut [f32]| {
            let (lb, sz, stride) = (w.lane_bytes(lg), w.lane_sz(lg), w.lanes[lg].stride);
            match loops {
                InnerLoops::Avx2(tok) => dequant_panel_avx2(tok, lb, stride, sz, k0, k1, g_len, panel),
                InnerLoops::Portable => portable::dequant_panel(lb, stride, sz, k0, k1, g_len, panel),
            }
        };
        let halves = match (&w.halves, direct) {
            (Some(h), false) => Some(h),
            (None, false) => return Err(KernelError::invalid("the split-halves prefill needs the split halves")),
            (_, true) => None,
        };
        let from_halves = |lg: usize, k0: usize, k1: usize, panel: &mut [f32]| {
            if let Some(h) = halves {
                halves_panel(h, w, lg, k0, k1, panel)
            }
        };
        let produce: &gemm::PanelProducer<'_> = if direct { &from_packed } else { &from_halves };
        match bf16 {
            // The same exact f32 panels, rounded to bf16 pairs, against bf16 activations.
            Some(tok) => gemm::panel_gemm_bf16(tok, &gemm::bf16_rows(tok, x, m, k), m, k, &mut tiles, produce),
            None => gemm::panel_gemm(loops, wide, x, m, k, &mut tiles, produce),
        }
        self.finish(&tiles, m, out)?;
        gemm::keep_tiles(tiles);
        Ok(())
    }
}

/// The error for a kernel a W4A16 layer was built without: unreachable through [`W4A16Linear::new`],
/// which checks the family, but an error rather than a panic.
fn wrong_family(k: BoundKernel) -> KernelError {
    KernelError::new(KernelErrorKind::WrongFamily { kernel: k.id(), layer: "W4A16" })
}

impl W4A16Linear {
    /// The prefill on bf16 tiles (`TDPBF16PS`), over any tile unit: `new_unit` makes one per task (the
    /// hardware unit on an AMX-BF16 host, the emulator in tests). Per lane group of 16 channels, the
    /// weights are dequantized straight from the packed layout (as the FMA prefill does), rounded to bf16
    /// and laid out as B tiles in VNNI pairs (`[K/2][16 × 2]`); the activations are rounded to bf16 once.
    /// Then per 16 rows, one f32 accumulator tile sums every 32-channel K block. Each task loads its own
    /// tile configuration and releases the tiles on every exit path.
    ///
    /// Arithmetic: weights and activations rounded to bf16 (`Budget` with both roundings), products and
    /// sums in f32 in the instruction's order, denormals flushed. The hardware's internal order of its f32
    /// sums is not specified to the bit, so tests hold it (on an AMX host: `scripts/device-tests.sh`) to
    /// the error budget, not to the emulator's bits.
    pub fn prefill_tiles<T: TileUnit>(
        &self,
        new_unit: &(dyn Fn() -> T + Sync),
        x: &[f32],
        m: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let w = &self.weights;
        let k = w.k;
        if !self.has_rows(x, m, out)? {
            return Ok(());
        }
        let g_len = w.group.len(k);
        let kp = k.next_multiple_of(32);
        // Activations as bf16 bytes, [m][kp], zero padded; rows in parallel (a prompt's are megabytes).
        let mut xb = vec![0u8; m * kp * 2];
        xb.par_chunks_mut(kp * 2).zip(x.par_chunks_exact(k)).for_each(|(dst, row)| {
            for (v, d) in row.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        });
        let loops = self.prefill_loops();
        // Every value is stored by its lane group's task (`prefill_block_tiles` writes each row it runs).
        let mut tiles = gemm::take_tiles(w.lanes.len() * m * 16);
        tiles
            .par_chunks_mut(m * 16)
            .enumerate()
            .try_for_each(|(lg, tile)| {
                let (lb, sz, stride) = (w.lane_bytes(lg), w.lane_sz(lg), w.lanes[lg].stride);
                let mut panel = vec![0.0f32; k * 16];
                match loops {
                    InnerLoops::Avx2(tok) => dequant_panel_avx2(tok, lb, stride, sz, 0, k, g_len, &mut panel),
                    InnerLoops::Portable => portable::dequant_panel(lb, stride, sz, 0, k, g_len, &mut panel),
                }
                // B tiles: row p holds K pair (2p, 2p + 1); channel c's pair at bytes 4c..4c + 4.
                let mut b = vec![0u8; kp / 2 * 64];
                for (kk, vals) in panel.chunks_exact(16).enumerate() {
                    for (c, v) in vals.iter().enumerate() {
                        let at = (kk / 2) * 64 + 4 * c + 2 * (kk % 2);
                        b[at..at + 2].copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
                    }
                }
                let mut unit = new_unit();
                let result = prefill_block_tiles(&mut unit, &xb, m, kp, &b, tile);
                unit.release();
                result
            })
            .map_err(KernelError::from)?;
        gemm::scatter(&tiles, m, &w.scatter, self.bias.as_deref(), out);
        gemm::keep_tiles(tiles);
        Ok(())
    }
}

/// One lane group on bf16 tiles: tile 0 accumulates `rows × 16` f32, tile 4 holds `rows × 32` bf16
/// activations, tile 6 sixteen K pairs × 16 channels of weights.
fn prefill_block_tiles<T: TileUnit>(
    unit: &mut T,
    xb: &[u8],
    m: usize,
    kp: usize,
    b: &[u8],
    tile: &mut [f32],
) -> Result<(), TileError> {
    let (c, ta, tb) = (0, 4, 6);
    let mut acc = [0u8; 16 * 64];
    let mut loaded_rows = 0;
    let mut m0 = 0;
    while m0 < m {
        let mr = 16.min(m - m0);
        if mr != loaded_rows {
            unit.load_config(
                &TileConfig::new().with_tile(c, mr as u8, 64).with_tile(ta, mr as u8, 64).with_tile(tb, 16, 64),
            )?;
            loaded_rows = mr;
        }
        unit.zero(c)?;
        for k0 in (0..kp).step_by(32) {
            unit.load(ta, &xb[(m0 * kp + k0) * 2..], kp * 2)?;
            unit.load(tb, &b[k0 / 2 * 64..(k0 / 2 + 16) * 64], 64)?;
            unit.dpbf16ps(c, ta, tb)?;
        }
        unit.store(c, &mut acc, 64)?;
        for r in 0..mr {
            for (j, v) in tile[(m0 + r) * 16..(m0 + r + 1) * 16].iter_mut().enumerate() {
                *v = f32::from_le_bytes(acc[r * 64 + 4 * j..r * 64 + 4 * j + 4].try_into().expect("4 bytes"));
            }
        }
        m0 += mr;
    }
    Ok(())
}

/// The `direct_dequant: false` panel producer: row by row of the panel, each of the lane's sixteen
/// channels' codes from its split-halves row (low nibbles for the first K/2 input channels, high nibbles
/// for the rest), with the lane's scales and zeros fetched once per group. (It took the row position as
/// `t % (K/2)` per weight, a division each, and wrote the panel a column at a time; on SmolLM2 that made
/// pp64 on `direct_dequant: false` 395–421 tok/s, now 640–653, against about 1100 direct.)
fn halves_panel(h: &[u8], w: &W4A16Weights, lg: usize, k0: usize, k1: usize, panel: &mut [f32]) {
    let k = w.k;
    let half = k / 2;
    let g_len = w.group.len(k);
    let sz = w.lane_sz(lg);
    let rows: [&[u8]; 16] = w.lanes[lg].channels.map(|c| &h[c as usize * half..(c as usize + 1) * half]);
    let mut kk = k0;
    while kk < k1 {
        let g = kk / g_len;
        let end = ((g + 1) * g_len).min(k1);
        let (s, z) = (&sz[g * 32..g * 32 + 16], &sz[g * 32 + 16..g * 32 + 32]);
        for t in kk..end {
            let (at, shift) = if t < half { (t, 0) } else { (t - half, 4) };
            let dst = &mut panel[(t - k0) * 16..(t - k0 + 1) * 16];
            for (j, d) in dst.iter_mut().enumerate() {
                *d = int4_layout::dequantize((rows[j][at] >> shift) & 0xF, s[j], z[j]);
            }
        }
        kk = end;
    }
}

/// Calls the AVX2 decode of `rows.width` lane groups sharing `stride` ([`crate::x86_64::avx2::decode_lanes`])
/// after checking every range it touches: `bytes[i]` holds lane group `i`'s eight bytes per input channel at
/// `stride`, `sz[i]` its parameters (slots past `width` unused). Off x86-64 no `Avx2Fma` token can exist,
/// so this is never reached there.
#[allow(clippy::too_many_arguments)]
fn decode_avx2_checked(
    _tok: Avx2Fma,
    x: &[f32],
    k: usize,
    xs: &[f32],
    bytes: [&[u8]; 4],
    stride: usize,
    sz: [&[f32]; 4],
    g_len: usize,
    rows: TileRows<'_>,
) {
    let groups = k.div_ceil(g_len);
    let TileRows { tiles, m, r0, mr, width, .. } = rows;
    // At most eight accumulators: four lane groups for one row, two for two, one for more.
    assert!((1..=DECODE_ROWS).contains(&mr) && matches!((mr, width), (1, 4) | (1 | 2, 2) | (_, 1)));
    assert!(r0 + mr <= m);
    assert!(x.len() >= (mr - 1) * k + k && xs.len() >= mr * groups);
    assert!(bytes.iter().all(|b| b.len() >= (k - 1) * stride + 8));
    assert!(sz.iter().all(|p| p.len() >= groups * 32) && tiles.len() >= width * m * 16);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::x86_64::avx2::decode_lanes as d;
        let (xp, xsp) = (x.as_ptr(), xs.as_ptr());
        let bp: [*const u8; 4] = bytes.map(<[u8]>::as_ptr);
        let s: [*const f32; 4] = sz.map(<[f32]>::as_ptr);
        let base = tiles.as_mut_ptr();
        // SAFETY: the assert gives width·m·16 floats of `tiles`, so each lane group's rows r0..r0 + mr
        // (at i·m·16 + r0·16, i < width; slots past width repeat the last) are in range.
        let t: [*mut f32; 4] = std::array::from_fn(|i| unsafe { base.add(i.min(width - 1) * m * 16 + r0 * 16) });
        // SAFETY: `Avx2Fma` proves AVX2 and FMA on this CPU. The asserts give every range `decode_lanes`
        // reads (x rows r < mr of k floats at stride k; xs[r·groups + g]; 8 bytes at kk·stride of each lane
        // group's bytes for kk < k; 32 floats per group of each lane group's parameters) and writes (mr rows
        // of 16 floats of each of the width tiles).
        unsafe {
            match (mr, width) {
                (1, 4) => d::<1, 4>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (1, 2) => d::<1, 2>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (1, _) => d::<1, 1>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (2, 2) => d::<2, 2>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (2, _) => d::<2, 1>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (3, _) => d::<3, 1>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (_, _) => d::<4, 1>(xp, k, xsp, bp, stride, s, k, g_len, t),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Avx2Fma token exists off x86-64");
}

/// Rows `r0..r0 + mr` of `width` (1, 2 or 4) consecutive `[m][16]` lane-group tiles, back to back in
/// `tiles`; with `one_row_chains`, each row's sums run on the accumulator chains a one-row call gives it
/// (then `mr` is at most [`EXACT_ROWS`]).
struct TileRows<'a> {
    tiles: &'a mut [f32],
    m: usize,
    r0: usize,
    mr: usize,
    width: usize,
    one_row_chains: bool,
}

/// How a decode groups its rows: up to `rows` per pass over a block, and whether each row keeps the
/// accumulator chains of a one-row pass.
#[derive(Clone, Copy)]
struct Passes {
    rows: usize,
    one_row_chains: bool,
}

/// Calls the AVX-512 decode for `rows` of `rows.width` side-by-side lane groups after checking every
/// range it touches: `bytes` starts at the first lane group's offset and holds `8·width` bytes per input
/// channel at `stride`; `sz[i]` are lane group `i`'s parameters (slots past `width` unused). Off x86-64 no
/// `Avx512` token can exist, so this is never reached there.
#[allow(clippy::too_many_arguments)]
fn decode_avx512_checked(
    _tok: Avx512,
    x: &[f32],
    k: usize,
    xs: &[f32],
    bytes: &[u8],
    stride: usize,
    sz: [&[f32]; 4],
    g_len: usize,
    rows: TileRows<'_>,
) {
    let groups = k.div_ceil(g_len);
    let TileRows { tiles, m, r0, mr, width, one_row_chains } = rows;
    assert!((1..=DECODE_ROWS).contains(&mr) && matches!(width, 1 | 2 | 4) && r0 + mr <= m);
    assert!(!one_row_chains || mr <= EXACT_ROWS);
    assert!(x.len() >= (mr - 1) * k + k && xs.len() >= mr * groups);
    assert!(bytes.len() >= (k - 1) * stride + 8 * width);
    assert!(sz.iter().all(|p| p.len() >= groups * 32) && tiles.len() >= width * m * 16);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::x86_64::avx512::decode_lanes as d;
        let (xp, xsp, bp) = (x.as_ptr(), xs.as_ptr(), bytes.as_ptr());
        let s: [*const f32; 4] = sz.map(<[f32]>::as_ptr);
        let base = tiles.as_mut_ptr();
        // SAFETY: the assert gives width·m·16 floats of `tiles`, so each lane group's rows r0..r0 + mr
        // (at i·m·16 + r0·16, i < width; slots past width repeat the last) are in range.
        let t: [*mut f32; 4] = std::array::from_fn(|i| unsafe { base.add(i.min(width - 1) * m * 16 + r0 * 16) });
        // SAFETY: `Avx512` proves AVX-512 F/BW/VL, AVX2 and FMA on this CPU. The asserts give every range
        // `decode_lanes` reads (x rows r < mr of k floats at stride k; xs[r·groups + g]; 8·width bytes at
        // kk·stride for kk < k; 32 floats per group of each lane group's parameters) and writes (mr rows of
        // 16 floats of each of the width tiles): C pairs = width / 2, or HALF for width 1.
        unsafe {
            if one_row_chains {
                // Every row on the chains of the one-row instance of its width: U = 2 for four lane
                // groups, 4 for two or one.
                match (mr, width) {
                    (1, 4) => d::<1, 2, 2, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (2, 4) => d::<2, 2, 2, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (_, 4) => d::<3, 2, 2, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (1, 2) => d::<1, 4, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (2, 2) => d::<2, 4, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (_, 2) => d::<3, 4, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (1, _) => d::<1, 4, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (2, _) => d::<2, 4, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
                    (_, _) => d::<3, 4, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
                }
                return;
            }
            match (mr, width) {
                (1, 4) => d::<1, 2, 2, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (_, 4) => d::<2, 1, 2, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (1, 2) => d::<1, 4, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (2, 2) => d::<2, 2, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (3, 2) => d::<3, 1, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (_, 2) => d::<4, 1, 1, false>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (1, _) => d::<1, 4, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (2, _) => d::<2, 2, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (3, _) => d::<3, 1, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
                (_, _) => d::<4, 1, 1, true>(xp, k, xsp, bp, stride, s, k, g_len, t),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Avx512 token exists off x86-64");
}

/// Activations rounded to bf16 (round to nearest even) as `vdpbf16ps` pairs `[m][ceil(k/2)]` (input
/// channels `2p` low, `2p + 1` high; after an odd last channel, zero), and the f32 sums of the rounded
/// values per row and group `[m][groups]`, which the bf16 decode's offset term needs: `Σ xb·(128 + q)` is
/// corrected by `128·Σ xb`, so the sum must be of the same rounded values.
fn bf16_pairs_and_sums(x: &[f32], m: usize, k: usize, g_len: usize) -> (Vec<u32>, Vec<f32>) {
    let (kp2, groups) = (k.div_ceil(2), k.div_ceil(g_len));
    let mut pairs = vec![0u32; m * kp2];
    let mut sums = vec![0.0f32; m * groups];
    for (r, row) in x.chunks_exact(k).take(m).enumerate() {
        let (pairs, sums) = (&mut pairs[r * kp2..(r + 1) * kp2], &mut sums[r * groups..(r + 1) * groups]);
        // Each value rounded once, into its pair (an odd last channel paired with zero).
        let whole = row.chunks_exact(2);
        if let ([last], Some(pair)) = (whole.remainder(), pairs.last_mut()) {
            *pair = bf16_bits(*last);
        }
        for (pair, two) in pairs.iter_mut().zip(whole) {
            *pair = bf16_bits(two[0]) | bf16_bits(two[1]) << 16;
        }
        // Each group's sum of its rounded values, in K order from +0: eight groups at a time, their sums
        // independent chains in registers.
        let rounded = |kk: usize| f32::from_bits((pairs[kk / 2] >> (16 * (kk % 2))) << 16);
        for (eight, sums) in sums.chunks_mut(8).enumerate() {
            let mut acc = [0.0f32; 8];
            for j in 0..g_len.min(k) {
                for (t, a) in acc.iter_mut().enumerate().take(sums.len()) {
                    let kk = (eight * 8 + t) * g_len + j;
                    if kk < k {
                        *a += rounded(kk);
                    }
                }
            }
            sums.copy_from_slice(&acc[..sums.len()]);
        }
    }
    (pairs, sums)
}

/// The bits of `v` rounded to bf16, to nearest with ties to even, in the low half: [`bf16::from_f32`]'s
/// result (a NaN keeps its sign and top payload bits and is made quiet), written without branches so that
/// a row's values round side by side.
#[inline]
fn bf16_bits(v: f32) -> u32 {
    let x = v.to_bits();
    let nan = (x & 0x7FFF_FFFF) > 0x7F80_0000;
    // x + 0x7FFF + (lowest kept bit) carries into the kept half exactly when the dropped half is over
    // 0x8000, or is 0x8000 and the kept half is odd; for a non-NaN x (at most 0xFF80_0000) it cannot
    // overflow, and a NaN's wrapped sum is discarded.
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    if nan { (x >> 16) | 0x0040 } else { rounded }
}

/// Calls the `vdpbf16ps` decode for one full 64-channel block after checking its ranges.
#[allow(clippy::too_many_arguments)]
fn decode_block_bf16_checked(
    tok: Avx512Bf16,
    xb: &[u32],
    k: usize,
    xs: &[f32],
    bytes: &[u8],
    sz: [&[f32]; 4],
    g_len: usize,
    rows: TileRows<'_>,
) {
    let (groups, kp2) = (k.div_ceil(g_len), k.div_ceil(2));
    let TileRows { tiles, m, r0, mr, width, one_row_chains } = rows;
    assert!((1..=DECODE_ROWS).contains(&mr) && width == 4 && r0 + mr <= m);
    assert!(!one_row_chains || mr <= EXACT_ROWS);
    assert!(g_len.is_multiple_of(2) || g_len == k);
    assert!(xb.len() >= mr * kp2 && xs.len() >= mr * groups && bytes.len() >= k * 32);
    assert!(sz.iter().all(|p| p.len() >= groups * 32) && tiles.len() >= 4 * m * 16);
    #[cfg(target_arch = "x86_64")]
    {
        use crate::x86_64::avx512::{decode_block_bf16 as d, decode_block_bf16_vbmi as dv};
        let (xp, xsp, bp) = (xb.as_ptr(), xs.as_ptr(), bytes.as_ptr());
        let s: [*const f32; 4] = sz.map(<[f32]>::as_ptr);
        let base = tiles.as_mut_ptr();
        // SAFETY: the assert gives 4·m·16 floats of `tiles`, so each lane group's rows r0..r0 + mr (at
        // i·m·16 + r0·16, i < 4) are in range.
        let t: [*mut f32; 4] = std::array::from_fn(|i| unsafe { base.add(i * m * 16 + r0 * 16) });
        // The row count picks the instance: two accumulator sets in flight for one or two rows, one for more
        // (two for every row with `one_row_chains`, as one row alone has).
        macro_rules! by_rows {
            ($f:ident) => {
                match (mr, one_row_chains) {
                    (1, _) => $f::<1, 2>(xp, kp2, xsp, bp, s, k, g_len, t),
                    (2, _) => $f::<2, 2>(xp, kp2, xsp, bp, s, k, g_len, t),
                    (_, true) => $f::<3, 2>(xp, kp2, xsp, bp, s, k, g_len, t),
                    (3, false) => $f::<3, 1>(xp, kp2, xsp, bp, s, k, g_len, t),
                    (_, false) => $f::<4, 1>(xp, kp2, xsp, bp, s, k, g_len, t),
                }
            };
        }
        // SAFETY: `Avx512Bf16` proves AVX-512 F/BW/VL and AVX512-BF16 on this CPU, and `Avx512Bf16Vbmi`
        // (only where `vbmi()` gives one) AVX512-VBMI too. The asserts give every range the decode reads
        // (mr rows of ceil(k/2) pairs at stride ceil(k/2); xs[r·groups + g]; 32 bytes at kk·32 for kk < k;
        // 32 floats per group of each lane group's parameters) and writes (mr rows of 16 floats of each of
        // the four tiles), and the group length is even or k.
        unsafe { if tok.vbmi().is_some() { by_rows!(dv) } else { by_rows!(d) } }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no Avx512Bf16 token ({tok:?}) exists off x86-64");
}

/// Calls the AVX2 panel dequantization after checking its ranges (off x86-64, the portable loop).
#[allow(clippy::too_many_arguments)]
fn dequant_panel_avx2(
    _tok: Avx2Fma,
    bytes: &[u8],
    stride: usize,
    sz: &[f32],
    k0: usize,
    k1: usize,
    g_len: usize,
    panel: &mut [f32],
) {
    #[cfg(not(target_arch = "x86_64"))]
    portable::dequant_panel(bytes, stride, sz, k0, k1, g_len, panel);
    #[cfg(target_arch = "x86_64")]
    {
        assert!(k1 > k0 && bytes.len() >= (k1 - 1) * stride + 8);
        assert!(sz.len() >= ((k1 - 1) / g_len + 1) * 32 && panel.len() >= (k1 - k0) * 16);
        // SAFETY: `Avx2Fma` proves AVX2 and FMA; the asserts give the byte, parameter and panel ranges the
        // function touches for input channels k0..k1.
        unsafe {
            crate::x86_64::avx2::dequant_panel(bytes.as_ptr(), stride, sz.as_ptr(), k0, k1, g_len, panel.as_mut_ptr())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free rounding is `half`'s `bf16::from_f32` on every upper half with the lower halves
    /// that decide a rounding (ties, one either side, zero, all ones) and some others: NaNs, infinities,
    /// subnormals and carries into the exponent included.
    #[test]
    fn bf16_bits_rounds_as_half_does() {
        let lows = [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000];
        for hi in 0..=0xFFFFu32 {
            for &lo in &lows {
                let v = f32::from_bits(hi << 16 | lo);
                assert_eq!(bf16_bits(v), u32::from(bf16::from_f32(v).to_bits()), "{:#010x}", hi << 16 | lo);
            }
        }
    }

    /// Pairs and group sums are their definition: each value rounded once, pair `p` holding channels
    /// `2p` (low) and `2p + 1`, an odd last channel paired with zero, each group's rounded values summed
    /// from +0 in K order; for K even and odd, groups that divide K and one group of all of K.
    #[test]
    fn bf16_pairs_and_sums_are_their_definition() {
        for (m, k, g_len) in
            [(1usize, 576usize, 32usize), (2, 96, 32), (3, 130, 64), (1, 33, 33), (2, 7, 7), (1, 200, 128)]
        {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.0137 * if i % 11 == 0 { 1e-30 } else { 1.0 })
                .collect();
            let (pairs, sums) = bf16_pairs_and_sums(&x, m, k, g_len);
            let (kp2, groups) = (k.div_ceil(2), k.div_ceil(g_len));
            let mut want_pairs = vec![0u32; m * kp2];
            let mut want_sums = vec![0.0f32; m * groups];
            for r in 0..m {
                for kk in 0..k {
                    let b = bf16::from_f32(x[r * k + kk]);
                    want_pairs[r * kp2 + kk / 2] |= u32::from(b.to_bits()) << (16 * (kk % 2));
                    want_sums[r * groups + kk / g_len] += b.to_f32();
                }
            }
            assert_eq!(pairs, want_pairs, "M={m} K={k} G={g_len}");
            assert!(sums.iter().zip(&want_sums).all(|(a, b)| a.to_bits() == b.to_bits()), "M={m} K={k} G={g_len}");
        }
    }

    /// At one row, each four lane groups' tiles written into their own 64-channel piece give what the
    /// scatter writes, bias or not, -0.0 included, for the layouts whose quads are pieces; a plan whose
    /// lanes cross a piece says so.
    #[test]
    fn quads_written_in_place_are_the_scatter_at_one_row() {
        for block in [TinygemmBlock::N64, TinygemmBlock::N32] {
            for n in [16usize, 48, 64, 96, 112, 576, 3072 + 48] {
                let lanes = lane_groups(block, n, 8);
                let plan = gemm::ScatterPlan::new(lanes.iter().map(|l| l.channels), n);
                assert!(plan.quads_in_place(), "{block:?} N={n}");
                let tiles: Vec<f32> = (0..lanes.len() * 16)
                    .map(|i| if i % 7 == 3 { -0.0 } else { (i % 997) as f32 * 0.5 - 99.0 })
                    .collect();
                let bias: Vec<f32> = (0..n).map(|c| if c % 5 == 0 { 0.0 } else { c as f32 * 0.25 }).collect();
                for bias in [None, Some(&bias[..])] {
                    let mut want = vec![f32::NAN; n];
                    gemm::scatter(&tiles, 1, &plan, bias, &mut want);
                    let mut got = vec![f32::NAN; n];
                    for (q, piece) in got.chunks_mut(64).enumerate() {
                        let quad = &tiles[64 * q..(64 * q + 64).min(tiles.len())];
                        plan.quad_into(q, quad, bias, piece);
                    }
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{block:?} N={n}");
                }
            }
        }
        // Lane group 3's lanes moved to channels 64..80: its quad no longer fills channels 0..64 alone.
        let mut channels: Vec<[u32; 16]> = (0..8).map(|lg| std::array::from_fn(|j| (lg * 16 + j) as u32)).collect();
        channels.swap(3, 4);
        assert!(!gemm::ScatterPlan::new(channels, 128).quads_in_place());
        assert!(gemm::ScatterPlan::in_order(100).quads_in_place());
    }
}
