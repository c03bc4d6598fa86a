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
    let bytes = std::mem::size_of_val(data);
    let mut at = 0;
    while at < bytes {
        line_to_l2(start.wrapping_add(at));
        at += LINE_BYTES;
    }
}

#[cfg(target_arch = "x86_64")]
fn line_to_l2(p: *const u8) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    // SAFETY: the intrinsic's only requirement is SSE, which is part of x86-64's baseline (every x86-64
    // CPU has it, so no runtime check can fail); a prefetch reads nothing back and never faults, whatever
    // the address, and `p` lies within a live slice anyway.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) };
}

#[cfg(not(target_arch = "x86_64"))]
fn line_to_l2(_p: *const u8) {}
