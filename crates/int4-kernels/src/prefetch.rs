//! Software prefetch of memory a step reads soon, for the callers that know what comes next.
//!
//! Why: a decode step streams every weight of the model through the caches, so whatever it touched one
//! step ago (a layer's keys and values in the KV cache) is back in memory by the time it is read again,
//! and a decode row reads a few kilobytes of it per head with little arithmetic in between: its time is
//! the memory's latency, not its bandwidth. Requested before the layer's first product, those lines
//! arrive while the product runs (docs/perf.md, "Decode attention waits on the KV cache").
//!
//! A prefetch is a hint: it never faults, never changes a value, and is dropped where the hardware has
//! no room. On other architectures these functions do nothing.

/// The bytes of one cache line, the unit a prefetch requests.
pub const LINE_BYTES: usize = 64;

/// Requests every cache line of `data` into this core's L2 (`prefetcht1` on x86-64), in address order.
/// One instruction a line, and each holds one of the core's few line-fill buffers until its line arrives,
/// so a long run goes at the memory's latency on the calling thread: callers bound what they pass.
pub fn prefetch_l2<T>(data: &[T]) {
    let start = data.as_ptr().cast::<u8>();
    let (skew, lines) = lines_spanned(start as usize, std::mem::size_of_val(data));
    for line in 0..lines {
        line_to_l2(start.wrapping_sub(skew).wrapping_add(line * LINE_BYTES));
    }
}

/// The cache lines `bytes` bytes from address `addr` touch: how far `addr` lies past the start of its line,
/// and how many lines there are from that one to the line holding the last byte (none for no bytes). A
/// slice need not start on a line, and then its last line is past `addr + bytes` rounded down.
fn lines_spanned(addr: usize, bytes: usize) -> (usize, usize) {
    let skew = addr % LINE_BYTES;
    (skew, if bytes == 0 { 0 } else { (skew + bytes).div_ceil(LINE_BYTES) })
}

#[cfg(target_arch = "x86_64")]
fn line_to_l2(p: *const u8) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    // SAFETY: the intrinsic's only requirement is SSE, which is part of x86-64's baseline (every x86-64
    // CPU has it, so no runtime check can fail); a prefetch reads nothing back and never faults, whatever
    // the address, and `p` starts a line that holds a byte of a live slice anyway.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) };
}

#[cfg(not(target_arch = "x86_64"))]
fn line_to_l2(_p: *const u8) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_touches_every_line_from_its_first_byte_to_its_last() {
        for (addr, bytes, want) in [
            (0, 0, (0, 0)),
            (64, 64, (0, 1)),
            (64, 65, (0, 2)),
            (60, 8, (60, 2)),
            (63, 1, (63, 1)),
            (1, 128, (1, 3)),
            (17, 0, (17, 0)),
        ] {
            assert_eq!(lines_spanned(addr, bytes), want, "{bytes} bytes from {addr}");
        }
    }
}
