//! GPTQ and AWQ tensors: `qweight`, `qzeros`, `scales`, `g_idx`.
//!
//! **GPTQ** (`quant_method: "gptq"`), per linear layer with `K` inputs, `N` outputs and `G = ceil(K/g)`
//! groups:
//!
//! * `qweight` — i32 `[K/8, N]`, packed along K, least significant nibble first: nibble `i` (bits
//!   `4i..4i+4`) of word `(r, n)` is the code of input channel `k = 8r + i`, output channel `n` ([`locate`]).
//! * `qzeros` — i32 `[G, N/8]`, packed along N, least significant first: nibble `i` of word `(g, c)` is the
//!   zero point of output channel `8c + i`. **v1** (`checkpoint_format: "gptq"`) stores `zero − 1`, **v2**
//!   (`"gptq_v2"`) stores `zero` ([`ZeroFormat`]). A symmetric 4-bit checkpoint's real zero is 8, so v1
//!   files hold 7s and v2 files 8s; [`detect_symmetric_zero_format`] tells them apart by value, since
//!   some files label v2 zeros as v1.
//! * `scales` — `[G, N]` (f16 on disk; f32 here, which holds every f16 exactly).
//! * `g_idx` — i32 `[K]`, the group of each input channel: `k / g` normally, a permutation of that with
//!   `desc_act` (act-order). [`act_order_permutation`] turns it into the K permutation that makes groups
//!   contiguous; the same permutation is applied to the activations at run time.
//!
//! Weight `(k, n)` is `scales[g_idx[k], n] · (q − z)`.
//!
//! **AWQ** (`quant_method: "awq"`) packs along N instead: `qweight` i32 `[K, N/8]` and `qzeros` i32
//! `[G, N/8]`, with nibble `i` of word `(r, c)` holding column `8c + AWQ_ORDER[i]` ([`pack_awq`]). AWQ
//! zeros carry no off-by-one.

use crate::codes::{Codes, GroupSize, check_shape};
use crate::error::{LayoutErrorKind, Result, err};

/// Where a code lives in a word-packed tensor: the word's index (row-major) and the nibble within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WordLoc {
    /// Index of the `i32` word.
    pub word: usize,
    /// Nibble `0..8` within it, 0 being bits 0..4.
    pub nibble: usize,
}

impl WordLoc {
    /// Reads the nibble from `words`.
    #[inline]
    pub fn read(self, words: &[i32]) -> u8 {
        ((words[self.word] as u32 >> (4 * self.nibble)) & 0xF) as u8
    }
}

/// Which zero-point convention a GPTQ checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZeroFormat {
    /// `checkpoint_format: "gptq"`: the stored nibble is `zero − 1`.
    V1,
    /// `checkpoint_format: "gptq_v2"`: the stored nibble is `zero`.
    V2,
}

impl ZeroFormat {
    /// Parses `checkpoint_format` (`"gptq"` or `"gptq_v2"`).
    pub fn from_checkpoint_format(s: &str) -> Option<Self> {
        match s {
            "gptq" => Some(ZeroFormat::V1),
            "gptq_v2" => Some(ZeroFormat::V2),
            _ => None,
        }
    }

    /// The `checkpoint_format` string.
    pub fn as_checkpoint_format(self) -> &'static str {
        match self {
            ZeroFormat::V1 => "gptq",
            ZeroFormat::V2 => "gptq_v2",
        }
    }
}

/// Where code `(n, k)` lives in `qweight` of a matrix with `n_total` outputs.
#[inline]
pub fn locate(n: usize, k: usize, n_total: usize) -> WordLoc {
    WordLoc { word: (k / 8) * n_total + n, nibble: k % 8 }
}

/// Packs codes (`[N][K]`) as GPTQ `qweight` (`[K/8][N]`). K must be a multiple of 8.
pub fn pack_qweight(codes: &Codes) -> Result<Vec<i32>> {
    let (n, k) = (codes.n(), codes.k());
    check_k8(k)?;
    let mut out = vec![0i32; k / 8 * n];
    for row in 0..n {
        for (kk, &c) in codes.row(row).iter().enumerate() {
            let loc = locate(row, kk, n);
            out[loc.word] |= (u32::from(c) << (4 * loc.nibble)) as i32;
        }
    }
    Ok(out)
}

/// Unpacks GPTQ `qweight` (`[K/8][N]`) into codes (`[N][K]`).
pub fn unpack_qweight(qweight: &[i32], k: usize, n: usize) -> Result<Codes> {
    check_shape(n, k)?;
    check_k8(k)?;
    check_words("qweight", qweight, k / 8 * n)?;
    Codes::from_fn(n, k, |row, kk| locate(row, kk, n).read(qweight))
}

/// Packs zero points (`[G][N]`, each the real zero in `0..=15`) as GPTQ `qzeros` (`[G][N/8]`) in `format`.
/// v1 cannot store a zero of 0 (it would need −1): that is an error, use v2.
pub fn pack_qzeros(zeros: &[u8], groups: usize, n: usize, format: ZeroFormat) -> Result<Vec<i32>> {
    check_n8(n)?;
    if zeros.len() != groups * n {
        return err(LayoutErrorKind::LengthMismatch { what: "zero points", expected: groups * n, actual: zeros.len() });
    }
    let mut out = vec![0i32; groups * n / 8];
    for g in 0..groups {
        for col in 0..n {
            let z = zeros[g * n + col];
            if z > 15 {
                return err(LayoutErrorKind::CodeOutOfRange { n: col, k: g, value: z });
            }
            let stored = match format {
                ZeroFormat::V2 => z,
                ZeroFormat::V1 if z == 0 => return err(LayoutErrorKind::ZeroNotRepresentable { group: g, n: col }),
                ZeroFormat::V1 => z - 1,
            };
            out[g * n / 8 + col / 8] |= (u32::from(stored) << (4 * (col % 8))) as i32;
        }
    }
    Ok(out)
}

/// Unpacks GPTQ `qzeros` (`[G][N/8]`) into the real zero points (`[G][N]`). In v1 a stored 15 reads as 16
/// (that is what `zero − 1` means; it is how a v1 writer's underflowed 0 comes back).
pub fn unpack_qzeros(qzeros: &[i32], groups: usize, n: usize, format: ZeroFormat) -> Result<Vec<u8>> {
    check_n8(n)?;
    check_words("qzeros", qzeros, groups * n / 8)?;
    let offset = match format {
        ZeroFormat::V1 => 1,
        ZeroFormat::V2 => 0,
    };
    let mut out = Vec::with_capacity(groups * n);
    for g in 0..groups {
        for col in 0..n {
            let loc = WordLoc { word: g * n / 8 + col / 8, nibble: col % 8 };
            out.push(loc.read(qzeros) + offset);
        }
    }
    Ok(out)
}

/// Tells a symmetric 4-bit checkpoint's zero convention from its stored values: all 7 is v1 (zero 8 stored
/// as 7), all 8 is v2. Anything else is an error naming the first odd value.
pub fn detect_symmetric_zero_format(qzeros: &[i32]) -> Result<ZeroFormat> {
    let mut seen = None;
    for &w in qzeros {
        for i in 0..8 {
            let v = ((w as u32 >> (4 * i)) & 0xF) as u8;
            let f = match v {
                7 => ZeroFormat::V1,
                8 => ZeroFormat::V2,
                _ => return err(LayoutErrorKind::AmbiguousZeroFormat { value: v }),
            };
            match seen {
                None => seen = Some(f),
                Some(s) if s != f => return err(LayoutErrorKind::AmbiguousZeroFormat { value: v }),
                Some(_) => {}
            }
        }
    }
    seen.ok_or(crate::error::LayoutError::new(LayoutErrorKind::EmptyShape { n: 0, k: 0 }))
}

/// The `g_idx` of a checkpoint without act-order: `k / g` for every input channel.
pub fn default_g_idx(k: usize, group: GroupSize) -> Vec<i32> {
    (0..k).map(|kk| group.group_of(kk, k) as i32).collect()
}

/// The K permutation that makes `g_idx`'s groups contiguous, or `None` if they already are (no act-order).
///
/// Position `i` of the permuted matrix takes input channel `perm[i]` (a stable sort by group), so group `j`
/// occupies `j·g .. min((j+1)·g, K)` afterwards. The activations must be permuted the same way:
/// `x'[i] = x[perm[i]]`. Fails if an entry is not a group index or a group does not have its share of K.
pub fn act_order_permutation(g_idx: &[i32], k: usize, group: GroupSize) -> Result<Option<Vec<u32>>> {
    if g_idx.len() != k {
        return err(LayoutErrorKind::LengthMismatch { what: "g_idx", expected: k, actual: g_idx.len() });
    }
    let groups = group.groups(k);
    let g_len = group.len(k);
    let mut counts = vec![0usize; groups];
    for (kk, &g) in g_idx.iter().enumerate() {
        if g < 0 || g as usize >= groups {
            return err(LayoutErrorKind::BadGroupIndex { k: kk, value: i64::from(g), groups });
        }
        counts[g as usize] += 1;
    }
    for (g, &c) in counts.iter().enumerate() {
        let expected = g_len.min(k - g * g_len);
        if c != expected {
            return err(LayoutErrorKind::UnevenGroups { group: g, expected, actual: c });
        }
    }
    if g_idx.iter().enumerate().all(|(kk, &g)| g as usize == kk / g_len) {
        return Ok(None);
    }
    let mut perm: Vec<u32> = (0..k as u32).collect();
    perm.sort_by_key(|&kk| g_idx[kk as usize]);
    Ok(Some(perm))
}

/// Applies a K permutation to codes: column `i` of the result is column `perm[i]` of `codes`.
pub fn permute_k(codes: &Codes, perm: &[u32]) -> Result<Codes> {
    if perm.len() != codes.k() {
        return err(LayoutErrorKind::LengthMismatch { what: "permutation", expected: codes.k(), actual: perm.len() });
    }
    Codes::from_fn(codes.n(), codes.k(), |n, i| codes.get(n, perm[i] as usize))
}

/// AWQ's column order within a word: nibble `i` holds column `8c + AWQ_ORDER[i]`.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// The inverse of [`AWQ_ORDER`]: column `8c + j` is in nibble `AWQ_REVERSE_ORDER[j]`.
pub const AWQ_REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Where column `col` of row `row` lives in an AWQ word tensor (`[rows][N/8]`).
#[inline]
pub fn awq_locate(row: usize, col: usize, n_total: usize) -> WordLoc {
    WordLoc { word: row * (n_total / 8) + col / 8, nibble: AWQ_REVERSE_ORDER[col % 8] }
}

/// Packs `[rows][N]` nibble values along N in AWQ's interleaved order (`qweight` with rows = K, `qzeros`
/// with rows = G).
pub fn pack_awq(values: &[u8], rows: usize, n: usize) -> Result<Vec<i32>> {
    check_n8(n)?;
    if values.len() != rows * n {
        return err(LayoutErrorKind::LengthMismatch { what: "AWQ values", expected: rows * n, actual: values.len() });
    }
    let mut out = vec![0i32; rows * n / 8];
    for r in 0..rows {
        for col in 0..n {
            let v = values[r * n + col];
            if v > 15 {
                return err(LayoutErrorKind::CodeOutOfRange { n: col, k: r, value: v });
            }
            let loc = awq_locate(r, col, n);
            out[loc.word] |= (u32::from(v) << (4 * loc.nibble)) as i32;
        }
    }
    Ok(out)
}

/// Unpacks an AWQ word tensor (`[rows][N/8]`) into `[rows][N]` values.
pub fn unpack_awq(words: &[i32], rows: usize, n: usize) -> Result<Vec<u8>> {
    check_n8(n)?;
    check_words("AWQ tensor", words, rows * n / 8)?;
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        for col in 0..n {
            out.push(awq_locate(r, col, n).read(words));
        }
    }
    Ok(out)
}

/// Unpacks AWQ `qweight` (`[K][N/8]`) into codes (`[N][K]`).
pub fn unpack_awq_qweight(qweight: &[i32], k: usize, n: usize) -> Result<Codes> {
    check_shape(n, k)?;
    let kn = unpack_awq(qweight, k, n)?;
    Codes::from_fn(n, k, |row, kk| kn[kk * n + row])
}

fn check_k8(k: usize) -> Result<()> {
    if !k.is_multiple_of(8) {
        return err(LayoutErrorKind::KNotMultiple { k, multiple: 8 });
    }
    Ok(())
}

fn check_n8(n: usize) -> Result<()> {
    if n == 0 || !n.is_multiple_of(8) {
        return err(LayoutErrorKind::NNotMultiple { n, multiple: 8 });
    }
    Ok(())
}

fn check_words(what: &'static str, words: &[i32], expected: usize) -> Result<()> {
    if words.len() != expected {
        return err(LayoutErrorKind::LengthMismatch { what, expected, actual: words.len() });
    }
    Ok(())
}
