//! f32 buffers that start on a cache line: [`LineAlignedF32`].
//!
//! A product's output is written sixteen values (64 bytes) per block and row. Where a row of the output
//! starts on a 64-byte boundary, and so (with N a multiple of 16) does every block's part of every row,
//! each such write fills one cache line; where it does not, every write splits across two lines, and
//! two blocks on different threads share each line. An allocator aligns a `Vec<f32>` to 16 bytes at
//! best, so the runtime keeps the buffers a step's products write in this type.
//!
//! Alignment is a matter of speed only: the kernels take any `&mut [f32]`, and an output that is not on
//! a line (a prompt's logits, say, returned as a `Vec`) gives the same values with split stores.

use std::ops::{Deref, DerefMut};

/// One cache line of f32 values.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

// SAFETY: `Line` is `repr(C)` over sixteen f32 (64 bytes) at alignment 64, so it has no padding, and
// every bit pattern (all zeros included) is sixteen valid f32.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; it is `Copy` and `'static`.
unsafe impl bytemuck::Pod for Line {}

/// `len` f32 values starting on a 64-byte boundary; derefs to `[f32]`.
#[derive(Clone)]
pub struct LineAlignedF32 {
    lines: Vec<Line>,
    len: usize,
}

impl LineAlignedF32 {
    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        LineAlignedF32 { lines: vec![Line([0.0; 16]); len.div_ceil(16)], len }
    }
}

impl Deref for LineAlignedF32 {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl DerefMut for LineAlignedF32 {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

impl std::fmt::Debug for LineAlignedF32 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineAlignedF32").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_holds_exactly_len_zeros() {
        for len in [0, 1, 15, 16, 17, 576 * 3 + 5] {
            let mut v = LineAlignedF32::zeroed(len);
            assert_eq!(v.len(), len);
            assert_eq!(v.as_ptr() as usize % 64, 0, "len {len}");
            assert!(v.iter().all(|&x| x == 0.0));
            if len > 0 {
                v[len - 1] = 2.5;
                assert_eq!(v.clone()[len - 1], 2.5);
            }
        }
    }
}
