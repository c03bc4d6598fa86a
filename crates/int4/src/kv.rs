//! The KV cache: every layer's keys and values for the positions a sequence has seen, stored as f32 or
//! f16 ([`KvType`], which the policy picks by priority).
//!
//! Why a 16-bit cache: past a few hundred positions attention's reads of the cache outgrow a decode step's
//! reads of the 4-bit weights (SmolLM2 keeps 45 KiB of f32 keys and values a position, 110 MiB at 2,500),
//! and those reads run at memory speed. f16 halves them. Planes are head-major ([`Heads`]): the positions
//! of the one KV head an attention task reads are contiguous, so decode scores a head's keys as stored,
//! widening them in registers, and widens a block of its values at a time into an f32 buffer that stays in
//! cache; every widening is exact and the f32 kernels' chains are the same. A 16-bit cache therefore gives
//! bit for bit what an f32 cache holding the same rounded values gives. The new errors are the rounding
//! of each stored value (relative 2⁻¹¹ in f16's normal range, absolute 2⁻²⁵ below it) and, for a value
//! beyond f16's range, saturation: it is stored as ±65504. Converted as it is, a value from 65520 up
//! would become infinite, and one infinite key makes its head's attention, and then every logit, NaN (as
//! in llama.cpp's f16 cache); saturated, the outlier is off by its excess and the output stays a
//! distribution. An infinite input is saturated too, so an f16 cache gives finite output where an f32
//! cache would pass the overflow on as NaN.

use std::ops::Range;

use half::f16;
use int4_kernels::prefetch::prefetch_l2;
use int4_kernels::vector::VectorOps;
use int4_select::KvType;

use crate::error::{Error, Result};

/// The largest finite f16 (65504): an f16 plane stores a value of larger magnitude as this, signed. A NaN
/// fails the range test and stays NaN (`f32::clamp` keeps it).
const F16_LIMIT: f32 = 65504.0;

/// Where a plane keeps a value: KV head `h`, position `p` and dimension `d` at `(h·capacity + p)·dim + d`.
/// Head-major, so the positions of one head, which one attention task reads, are contiguous: its keys are
/// scored and a block of its values widened in one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heads {
    /// KV heads.
    pub(crate) count: usize,
    /// Values per head and position.
    pub(crate) dim: usize,
    /// Positions per head.
    pub(crate) capacity: usize,
}

/// One layer's keys or values, laid out as [`Heads`] says.
#[derive(Debug)]
pub(crate) enum Plane {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// The values of a plane ([`Heads`]) a prefetch of positions `0..len` requests within `budget` values:
/// the same first positions of every head, as many as the budget holds (all `len` where it holds them).
/// Each head's keys are one attention task's stream, so each stream's first lines arrive ahead of it and
/// the hardware prefetcher carries on from there.
fn prefetch_spans(g: Heads, len: usize, budget: usize) -> impl Iterator<Item = Range<usize>> {
    let positions = (budget / (g.count * g.dim).max(1)).min(len).min(g.capacity);
    (0..g.count).map(move |h| {
        let at = h * g.capacity * g.dim;
        at..at + positions * g.dim
    })
}

impl Plane {
    /// Requests positions `0..len` of every head toward this core's L2, at most `budget` bytes of them
    /// ([`prefetch_spans`]); returns the bytes requested.
    fn prefetch(&self, g: Heads, len: usize, budget: usize) -> usize {
        /// Requests `x`'s values in `spans`; returns their bytes.
        fn request<T>(x: &[T], spans: impl Iterator<Item = Range<usize>>) -> usize {
            spans
                .map(|r| {
                    let values = &x[r];
                    prefetch_l2(values);
                    std::mem::size_of_val(values)
                })
                .sum()
        }
        match self {
            Plane::F32(x) => request(x, prefetch_spans(g, len, budget / 4)),
            Plane::F16(x) => request(x, prefetch_spans(g, len, budget / 2)),
        }
    }

    fn zeros(kv: KvType, len: usize) -> Plane {
        match kv {
            KvType::F32 => Plane::F32(vec![0.0; len]),
            KvType::F16 => Plane::F16(vec![f16::ZERO; len]),
        }
    }

    /// Stores position `p` of every head from `row` (`[head][dim]`), rounded to this plane's type (with
    /// `ops`' f16 conversion).
    pub(crate) fn write_position(&mut self, ops: &VectorOps, g: Heads, p: usize, row: &[f32]) {
        for (h, values) in row.chunks_exact(g.dim).enumerate().take(g.count) {
            let at = (h * g.capacity + p) * g.dim;
            match self {
                Plane::F32(x) => x[at..at + g.dim].copy_from_slice(values),
                Plane::F16(x) => {
                    let dst = &mut x[at..at + g.dim];
                    // Every value tested (a fold, not a short-circuit, so the test vectorises).
                    if values.iter().fold(true, |ok, v| ok & (v.abs() <= F16_LIMIT)) {
                        ops.narrow_f16(values, dst);
                    } else {
                        for (d, &v) in dst.iter_mut().zip(values) {
                            *d = f16::from_f32(v.clamp(-F16_LIMIT, F16_LIMIT));
                        }
                    }
                }
            }
        }
    }

    /// Every position of head `h` (`[capacity][dim]`), where this plane stores f32.
    pub(crate) fn head_f32(&self, g: Heads, h: usize) -> Option<&[f32]> {
        match self {
            Plane::F32(x) => Some(&x[h * g.capacity * g.dim..(h + 1) * g.capacity * g.dim]),
            Plane::F16(_) => None,
        }
    }

    /// Every position of head `h` (`[capacity][dim]`), where this plane stores f16.
    pub(crate) fn head_f16(&self, g: Heads, h: usize) -> Option<&[f16]> {
        match self {
            Plane::F16(x) => Some(&x[h * g.capacity * g.dim..(h + 1) * g.capacity * g.dim]),
            Plane::F32(_) => None,
        }
    }

    /// Head `h`'s positions from `p0` on, widened to f32 into `out` (`out.len() / dim` positions).
    pub(crate) fn widen(&self, ops: &VectorOps, g: Heads, h: usize, p0: usize, out: &mut [f32]) {
        let at = (h * g.capacity + p0) * g.dim;
        match self {
            Plane::F32(x) => out.copy_from_slice(&x[at..at + out.len()]),
            Plane::F16(x) => ops.widen_f16(&x[at..at + out.len()], out),
        }
    }

    /// Copies the first `positions` of every head from `source` (laid out as `from`) into this plane
    /// (laid out as `to`).
    fn copy_prefix(&mut self, to: Heads, source: &Plane, from: Heads, positions: usize) {
        let n = positions * to.dim;
        for h in 0..to.count {
            let (d, s) = (h * to.capacity * to.dim, h * from.capacity * from.dim);
            match (&mut *self, source) {
                (Plane::F32(x), Plane::F32(y)) => x[d..d + n].copy_from_slice(&y[s..s + n]),
                (Plane::F16(x), Plane::F16(y)) => x[d..d + n].copy_from_slice(&y[s..s + n]),
                _ => unreachable!("copy_prefix_from checks that both caches store the same type"),
            }
        }
    }

    /// Keeps the first `positions` of every head, laid out for a capacity of `positions`, and releases the
    /// rest.
    fn shrink(&mut self, g: Heads, positions: usize) {
        fn keep<T: Copy>(x: &mut Vec<T>, g: Heads, positions: usize) {
            let n = positions * g.dim;
            let mut kept = Vec::with_capacity(g.count * n);
            for h in 0..g.count {
                let at = h * g.capacity * g.dim;
                kept.extend_from_slice(&x[at..at + n]);
            }
            *x = kept;
        }
        match self {
            Plane::F32(x) => keep(x, g, positions),
            Plane::F16(x) => keep(x, g, positions),
        }
    }
}

/// Keys and values of every layer for the positions seen so far, sized for a context chosen up front.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) k: Vec<Plane>,
    pub(crate) v: Vec<Plane>,
    /// The token at each stored position.
    pub(crate) ids: Vec<u32>,
    pub(crate) len: usize,
    heads: Heads,
    kv: KvType,
}

impl KvCache {
    /// An empty cache of `layers` layers, `capacity` positions of `heads` KV heads of `dim` values, stored
    /// as `kv` (the caller has checked that its bytes are allowed and available).
    pub(crate) fn zeroed(layers: usize, capacity: usize, heads: usize, dim: usize, kv: KvType) -> KvCache {
        let len = capacity * heads * dim;
        KvCache {
            k: (0..layers).map(|_| Plane::zeros(kv, len)).collect(),
            v: (0..layers).map(|_| Plane::zeros(kv, len)).collect(),
            ids: Vec::new(),
            len: 0,
            heads: Heads { count: heads, dim, capacity },
            kv,
        }
    }

    /// Requests layer `li`'s stored keys and values toward this core's L2, at most `budget` bytes in all
    /// (half of it keys); returns the bytes requested. A step issues it before the layer's first product,
    /// so attention finds them there ([`int4_kernels::prefetch`] says why).
    pub(crate) fn prefetch_layer(&self, li: usize, budget: usize) -> usize {
        self.k[li].prefetch(self.heads, self.len, budget / 2) + self.v[li].prefetch(self.heads, self.len, budget / 2)
    }

    /// How its planes are laid out.
    pub(crate) fn heads(&self) -> Heads {
        self.heads
    }

    /// Positions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions it can hold.
    pub fn capacity(&self) -> usize {
        self.heads.capacity
    }

    /// How keys and values are stored.
    pub fn kv_type(&self) -> KvType {
        self.kv
    }

    /// Forgets every position (the allocation is kept).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Keeps the first `len` positions and forgets the rest (nothing if it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.ids.truncate(self.len);
    }

    /// The token at each stored position, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        let Heads { count, dim, capacity } = self.heads;
        2 * self.k.len() * capacity * count * dim * self.kv.bytes()
    }

    /// Replaces what this cache holds with the first `positions` positions of `source` (keys, values and
    /// ids, as they are): continued from there, it gives what `source`'s sequence would. An error, with
    /// this cache unchanged, when `source` was made for another model or stores another type, holds fewer
    /// positions, or they do not fit this cache.
    pub fn copy_prefix_from(&mut self, source: &KvCache, positions: usize) -> Result<()> {
        let (from, to) = (source.heads, self.heads);
        if source.k.len() != self.k.len() || (from.count, from.dim) != (to.count, to.dim) {
            return Err(Error::input("KV cache", "the cache to copy from was made for another model"));
        }
        if source.kv != self.kv {
            return Err(Error::input(
                "KV cache",
                format!("the cache to copy from stores {}, this one {}", source.kv, self.kv),
            ));
        }
        if positions > source.len || positions > to.capacity {
            return Err(Error::input(
                "KV cache",
                format!(
                    "cannot copy {positions} positions from a cache holding {} into one of {}",
                    source.len, to.capacity
                ),
            ));
        }
        for (dst, src) in self.k.iter_mut().zip(&source.k).chain(self.v.iter_mut().zip(&source.v)) {
            dst.copy_prefix(to, src, from, positions);
        }
        self.ids.clear();
        self.ids.extend_from_slice(&source.ids[..positions]);
        self.len = positions;
        Ok(())
    }

    /// Makes the capacity the positions held, releasing the memory past them (a cache kept only to be
    /// copied from).
    pub fn shrink_to_len(&mut self) {
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.shrink(self.heads, self.len);
        }
        self.ids.shrink_to_fit();
        self.heads.capacity = self.len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position `p`, head `h`, dimension `d` of a test row: distinct values an f16 holds exactly.
    fn value(p: usize, h: usize, d: usize) -> f32 {
        (p * 100 + h * 10 + d) as f32
    }

    fn filled(kv: KvType, capacity: usize, positions: usize) -> KvCache {
        let (heads, dim) = (3, 4);
        let mut c = KvCache::zeroed(2, capacity, heads, dim, kv);
        let g = c.heads();
        for p in 0..positions {
            let row: Vec<f32> = (0..heads * dim).map(|i| value(p, i / dim, i % dim)).collect();
            for plane in c.k.iter_mut().chain(c.v.iter_mut()) {
                plane.write_position(&VectorOps::new(), g, p, &row);
            }
            c.ids.push(p as u32);
        }
        c.len = positions;
        c
    }

    fn head(c: &KvCache, h: usize, positions: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; positions * c.heads().dim];
        c.v[1].widen(&VectorOps::new(), c.heads(), h, 0, &mut out);
        out
    }

    /// An f16 plane stores a value beyond f16's range, an infinity included, as ±65504, never as an
    /// infinity (which would make attention NaN), and a NaN as NaN; the in-range values of a row holding
    /// one round as in a row without (the conversion of the whole row), and an f32 plane keeps them all.
    #[test]
    fn an_f16_plane_saturates_values_beyond_its_range() {
        let g = Heads { count: 3, dim: 4, capacity: 3 };
        let in_range = [0.1f32, 1.5, -3.0, 1.0e-6];
        let row: Vec<f32> = [1.0e6f32, -7.0e4, 65520.0, -65504.0]
            .into_iter()
            .chain([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.1])
            .chain(in_range)
            .collect();
        let mut half = Plane::zeros(KvType::F16, 3 * 3 * 4);
        half.write_position(&VectorOps::new(), g, 1, &row);
        let read = |plane: &Plane, h: usize| {
            let mut stored = vec![0.0f32; 4];
            plane.widen(&VectorOps::new(), g, h, 1, &mut stored);
            stored
        };
        assert_eq!(read(&half, 0), [65504.0, -65504.0, 65504.0, -65504.0]);
        let head1 = read(&half, 1);
        assert_eq!(head1[..2], [65504.0, -65504.0]);
        assert!(head1[2].is_nan());
        assert_eq!(head1[3], f16::from_f32(0.1).to_f32());
        let rounded: Vec<f32> = in_range.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!(read(&half, 2), rounded, "a row without outliers converts whole");
        let mut wide = Plane::zeros(KvType::F32, 3 * 3 * 4);
        wide.write_position(&VectorOps::new(), g, 1, &row);
        assert_eq!(read(&wide, 0), row[..4]);
        assert_eq!(read(&wide, 2), in_range);
    }

    /// A prefetch requests the same first positions of every head, within that head's stored positions
    /// and the plane, all of `0..len` where the budget holds them and never more than the budget.
    #[test]
    fn a_prefetch_takes_each_heads_first_positions_within_its_budget() {
        let g = Heads { count: 3, dim: 4, capacity: 10 };
        // A plane of no heads, or of heads of no values, has nothing to request.
        for g in [Heads { count: 0, dim: 4, capacity: 10 }, Heads { count: 3, dim: 0, capacity: 10 }] {
            assert_eq!(prefetch_spans(g, 6, 1000).map(|r| r.len()).sum::<usize>(), 0);
        }
        for (len, budget, positions) in [(0, 1000, 0), (6, 1000, 6), (6, 72, 6), (6, 71, 5), (6, 11, 0), (25, 1000, 10)]
        {
            let spans: Vec<Range<usize>> = prefetch_spans(g, len, budget).collect();
            assert_eq!(spans.len(), 3, "len {len}, budget {budget}");
            for (h, span) in spans.iter().enumerate() {
                let first = h * g.capacity * g.dim;
                assert_eq!(*span, first..first + positions * g.dim, "head {h}, len {len}, budget {budget}");
            }
            let values: usize = spans.iter().map(|r| r.len()).sum();
            assert!(values <= budget, "len {len}: {values} values past a budget of {budget}");
        }
        // A layer's request in bytes, for either type: every stored position of its 3 heads × 4 values in
        // keys and values under a large budget; under 100 bytes (50 a plane), the positions 50 bytes hold
        // in each head: one of 48 bytes in f32 (12 values), two of 48 in f16 (24 values).
        for (kv, all, small) in
            [(KvType::F32, 2 * 6 * 3 * 4 * 4, 2 * 3 * 4 * 4), (KvType::F16, 2 * 6 * 3 * 4 * 2, 2 * 2 * 3 * 4 * 2)]
        {
            let c = filled(kv, 10, 6);
            assert_eq!(c.prefetch_layer(1, 1 << 20), all, "{kv:?}");
            assert_eq!(c.prefetch_layer(0, 100), small, "{kv:?}");
            assert_eq!(c.prefetch_layer(0, 0), 0, "{kv:?}");
        }
    }

    /// A prefix copied into a cache of another capacity, and a cache shrunk to its length, keep every
    /// head's positions in place (head-major offsets follow each cache's own capacity), for both types; a
    /// cache of the other type is refused and left as it was.
    #[test]
    fn copies_and_shrinks_keep_every_heads_positions() {
        for kv in KvType::ALL {
            let source = filled(kv, 10, 8);
            let mut dest = filled(kv, 20, 0);
            dest.copy_prefix_from(&source, 6).unwrap();
            assert_eq!((dest.len(), dest.capacity(), dest.ids()), (6, 20, &[0u32, 1, 2, 3, 4, 5][..]));
            let mut kept = filled(kv, 10, 7);
            kept.shrink_to_len();
            assert_eq!((kept.capacity(), kept.bytes()), (7, 2 * 2 * 7 * 3 * 4 * kv.bytes()));
            for h in 0..3 {
                let want = |n: usize| -> Vec<f32> { (0..n * 4).map(|i| value(i / 4, h, i % 4)).collect() };
                assert_eq!(head(&dest, h, 6), want(6), "{kv} copied, head {h}");
                assert_eq!(head(&kept, h, 7), want(7), "{kv} shrunk, head {h}");
            }
        }
        let mut half = filled(KvType::F16, 10, 3);
        let e = half.copy_prefix_from(&filled(KvType::F32, 10, 5), 2).unwrap_err().to_string();
        assert!(e.contains("stores f32, this one f16"), "{e}");
        assert_eq!(half.len(), 3);
    }
}
