//! Shared inputs for the workspace's criterion benchmarks.
//!
//! The shapes here are the ones the project cares about: the upstream model's linears and the ones the
//! runtime executes for SmolLM2-135M (q/k/v and gate/up fused, and the tied 49152-row embedding/head).

/// `(N, K)` of every weight matrix the benchmarks use.
pub const SHAPES: &[(usize, usize)] = &[
    (2048, 2048),
    (3072, 2048),
    (13312, 2048),
    (2048, 6656),
    (960, 576),
    (576, 576),
    (3072, 576),
    (576, 1536),
    (49152, 576),
];

/// Deterministic pseudo-random f32 weights in about ±1 (an xorshift stream), row-major `[N][K]`.
pub fn weights(n: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
