//! Unpacked 4-bit codes and the per-group parameters that turn them back into weights.
//!
//! Every packed layout in this crate is a permutation of the same thing: an `N × K` matrix of codes in
//! `0..16` (one per weight, `n` the output channel, `k` the input channel) plus, per output channel and per
//! group of `g` consecutive input channels, an f32 scale and zero. [`Codes`] and [`GroupParams`] are that
//! canonical, layout-free form; packers take them and decoders give them back.

use crate::error::{LayoutErrorKind, Result, err};

/// How many consecutive input channels share one scale and zero.
///
/// The last group of a row may be shorter when `g` does not divide `K` (SmolLM2's `K = 576` at `g = 128`
/// has four full groups and one of 64); there are `ceil(K / g)` groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupSize {
    /// 32 input channels per group (llama.cpp's Q4 blocks; the runtime's default at load).
    G32,
    /// 64 input channels per group.
    G64,
    /// 128 input channels per group (GPTQ's usual export).
    G128,
    /// 256 input channels per group.
    G256,
    /// One group spanning all of K (GPTQ's `group_size: -1`).
    PerChannel,
}

impl GroupSize {
    /// Parses a checkpoint's `group_size`: 32, 64, 128, 256, or -1 for per-channel.
    pub fn from_checkpoint(size: i64) -> Result<Self> {
        Ok(match size {
            32 => GroupSize::G32,
            64 => GroupSize::G64,
            128 => GroupSize::G128,
            256 => GroupSize::G256,
            -1 => GroupSize::PerChannel,
            _ => return err(LayoutErrorKind::UnsupportedGroupSize { size }),
        })
    }

    /// The value a checkpoint stores for this size (-1 for per-channel).
    pub fn to_checkpoint(self) -> i64 {
        match self {
            GroupSize::PerChannel => -1,
            other => other.len(usize::MAX) as i64,
        }
    }

    /// Input channels per group for a matrix with `k` input channels (all of them for per-channel).
    pub fn len(self, k: usize) -> usize {
        match self {
            GroupSize::G32 => 32,
            GroupSize::G64 => 64,
            GroupSize::G128 => 128,
            GroupSize::G256 => 256,
            GroupSize::PerChannel => k.max(1),
        }
    }

    /// Number of groups per row: `ceil(k / g)`.
    pub fn groups(self, k: usize) -> usize {
        k.div_ceil(self.len(k))
    }

    /// The group that input channel `kk` of a `k`-wide row belongs to.
    pub fn group_of(self, kk: usize, k: usize) -> usize {
        kk / self.len(k)
    }
}

/// An `N × K` matrix of 4-bit codes, one byte per code, row-major (`n` major, `k` minor).
#[derive(Clone, PartialEq, Eq)]
pub struct Codes {
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for Codes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codes").field("n", &self.n).field("k", &self.k).finish_non_exhaustive()
    }
}

impl Codes {
    /// Wraps `data` (`n * k` codes, row-major). Fails if the length is wrong or any code is 16 or more.
    pub fn new(n: usize, k: usize, data: Vec<u8>) -> Result<Self> {
        check_shape(n, k)?;
        if data.len() != n * k {
            return err(LayoutErrorKind::LengthMismatch { what: "codes", expected: n * k, actual: data.len() });
        }
        if let Some(i) = data.iter().position(|&c| c > 15) {
            return err(LayoutErrorKind::CodeOutOfRange { n: i / k, k: i % k, value: data[i] });
        }
        Ok(Codes { n, k, data })
    }

    /// Builds the matrix from a function of `(n, k)`; each value is masked to its low 4 bits.
    pub fn from_fn(n: usize, k: usize, mut f: impl FnMut(usize, usize) -> u8) -> Result<Self> {
        check_shape(n, k)?;
        let mut data = Vec::with_capacity(n * k);
        for row in 0..n {
            for col in 0..k {
                data.push(f(row, col) & 0xF);
            }
        }
        Ok(Codes { n, k, data })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The code of output channel `n`, input channel `k`. Panics if out of bounds, like slice indexing.
    #[inline]
    pub fn get(&self, n: usize, k: usize) -> u8 {
        assert!(n < self.n && k < self.k, "code ({n}, {k}) outside {}x{}", self.n, self.k);
        self.data[n * self.k + k]
    }

    /// Row `n` (all K codes of one output channel).
    pub fn row(&self, n: usize) -> &[u8] {
        &self.data[n * self.k..(n + 1) * self.k]
    }

    /// All codes, row-major.
    pub fn as_slice(&self) -> &[u8] {
        &self.data
    }

    /// Consumes the matrix and returns its codes, row-major.
    pub fn into_vec(self) -> Vec<u8> {
        self.data
    }

    /// The same matrix with zero-code channels appended so that N is a multiple of `multiple`.
    ///
    /// Together with [`GroupParams::padded_n`] (scale 0 and zero 0 for the new channels, so they decode to
    /// exactly 0.0) this lets a packer that needs `N % 16 == 0` take any N; the caller drops the extra
    /// outputs.
    pub fn padded_n(&self, multiple: usize) -> Codes {
        let n = self.n.next_multiple_of(multiple.max(1));
        let mut data = self.data.clone();
        data.resize(n * self.k, 0);
        Codes { n, k: self.k, data }
    }
}

/// Per-output-channel, per-group f32 scale and zero, `[N][G]` each.
///
/// A weight decodes as [`dequantize`]`(q, scale, zero)`; symmetric grids have `zero = 0`, and an integer
/// zero point `z` becomes the float zero `scale * (8 - z)` (see [`crate::convert`]).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupParams {
    n: usize,
    k: usize,
    group: GroupSize,
    scale: Vec<f32>,
    zero: Vec<f32>,
}

impl GroupParams {
    /// Wraps `[N][G]` scales and zeros. Fails on a length mismatch or a NaN/infinite value.
    pub fn new(n: usize, k: usize, group: GroupSize, scale: Vec<f32>, zero: Vec<f32>) -> Result<Self> {
        check_shape(n, k)?;
        let g = group.groups(k);
        for (what, v) in [("scales", &scale), ("zeros", &zero)] {
            if v.len() != n * g {
                return err(LayoutErrorKind::LengthMismatch { what, expected: n * g, actual: v.len() });
            }
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return err(LayoutErrorKind::NonFiniteParam {
                    what: if what == "scales" { "scale" } else { "zero" },
                    n: i / g,
                    group: i % g,
                });
            }
        }
        Ok(GroupParams { n, k, group, scale, zero })
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input channels.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The group size.
    pub fn group_size(&self) -> GroupSize {
        self.group
    }

    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.group.groups(self.k)
    }

    /// Scale of output channel `n`, group `g`.
    #[inline]
    pub fn scale(&self, n: usize, g: usize) -> f32 {
        self.scale[n * self.groups() + g]
    }

    /// Zero of output channel `n`, group `g`.
    #[inline]
    pub fn zero(&self, n: usize, g: usize) -> f32 {
        self.zero[n * self.groups() + g]
    }

    /// All scales, `[N][G]`.
    pub fn scales(&self) -> &[f32] {
        &self.scale
    }

    /// All zeros, `[N][G]`.
    pub fn zeros(&self) -> &[f32] {
        &self.zero
    }

    /// The weight at `(n, k)` given its code, by the crate's one rounding rule ([`dequantize`]).
    #[inline]
    pub fn weight(&self, n: usize, k: usize, code: u8) -> f32 {
        let g = self.group.group_of(k, self.k);
        dequantize(code, self.scale(n, g), self.zero(n, g))
    }

    /// The scales then the zeros, each `[N][G]` f32 little-endian: the form artifacts store.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.scale.iter().chain(&self.zero).flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Reads what [`GroupParams::to_le_bytes`] wrote for an `n × k` matrix with `group`, checking its
    /// length and that every value is finite.
    pub fn from_le_bytes(n: usize, k: usize, group: GroupSize, bytes: &[u8]) -> Result<Self> {
        check_shape(n, k)?;
        let count = n * group.groups(k);
        if bytes.len() != 8 * count {
            return err(LayoutErrorKind::LengthMismatch {
                what: "scale and zero bytes",
                expected: 8 * count,
                actual: bytes.len(),
            });
        }
        let mut values = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let scale: Vec<f32> = values.by_ref().take(count).collect();
        let zero: Vec<f32> = values.collect();
        GroupParams::new(n, k, group, scale, zero)
    }

    /// PyTorch's `qScaleAndZeros` arrangement: `[G][N][2]` with the pair (scale, zero), here in f32.
    pub fn to_tinygemm_scales_and_zeros(&self) -> Vec<f32> {
        let groups = self.groups();
        let mut out = Vec::with_capacity(groups * self.n * 2);
        for g in 0..groups {
            for n in 0..self.n {
                out.push(self.scale(n, g));
                out.push(self.zero(n, g));
            }
        }
        out
    }

    /// The same parameters with channels of scale 0 and zero 0 appended up to a multiple of `multiple`.
    pub fn padded_n(&self, multiple: usize) -> GroupParams {
        let n = self.n.next_multiple_of(multiple.max(1));
        let g = self.groups();
        let mut scale = self.scale.clone();
        let mut zero = self.zero.clone();
        scale.resize(n * g, 0.0);
        zero.resize(n * g, 0.0);
        GroupParams { n, k: self.k, group: self.group, scale, zero }
    }
}

/// The crate's one dequantization rule: `w = (q − 8)·scale + zero`, in f32, with two roundings (the product,
/// then the sum) and no fused multiply-add.
///
/// Every path that turns a code back into a weight (the scalar reference, the SIMD kernels' dequantizing
/// prefill, the embedding lookup) must produce exactly this value, so that they agree bit for bit. Two
/// plain roundings are used rather than one FMA because they are available, and identical, on every ISA:
/// a portable build without FMA computes the same bits as an AVX-512 one. `(q − 8)` is an integer in
/// `-8..=7`, exact in f32.
#[inline]
pub fn dequantize(q: u8, scale: f32, zero: f32) -> f32 {
    let centred = f32::from(q) - 8.0;
    let product = centred * scale;
    product + zero
}

pub(crate) fn check_shape(n: usize, k: usize) -> Result<()> {
    if n == 0 || k == 0 {
        return err(LayoutErrorKind::EmptyShape { n, k });
    }
    Ok(())
}
