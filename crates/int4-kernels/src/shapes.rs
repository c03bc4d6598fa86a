//! The shape corpus shared by the tests and the benchmarks.
//!
//! Tests run every kernel on these shapes; benchmarks time the ones the runtime actually executes. N covers
//! every tinygemm tail class (16 alone, 48 = 32 + 16 under 32-channel blocks, 80 = 64 + 16, 144) and two real
//! widths; K is chosen so that no group size divides it (SmolLM2's 576 at g = 128, and 200).

use int4_layout::GroupSize;

/// Output widths the tests use.
pub const TEST_N: [usize; 6] = [16, 48, 80, 144, 576, 2048];

/// Input widths the tests use: 200 (no supported group size divides it) and 576 (g = 128 leaves a group
/// of 64).
pub const TEST_K: [usize; 2] = [200, 576];

/// Row counts the tests use: decode sizes, the 4-row boundary of the decode kernel's row blocks, and
/// prefill sizes.
pub const TEST_M: [usize; 8] = [1, 2, 3, 4, 5, 17, 64, 512];

/// Group sizes the tests use.
pub const TEST_GROUPS: [GroupSize; 4] = [GroupSize::G32, GroupSize::G64, GroupSize::G128, GroupSize::G256];

/// `(name, N, K)` of the linears the runtime executes for SmolLM2-135M with q/k/v and gate/up fused, and
/// its tied 49152-row head.
pub const SMOLLM2_SHAPES: [(&str, usize, usize); 5] =
    [("qkv", 960, 576), ("o_proj", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("lm_head", 49152, 576)];

/// `(name, N, K)` of the upstream 1.7B model's linears.
pub const UPSTREAM_SHAPES: [(&str, usize, usize); 4] =
    [("qkv", 2048, 2048), ("qkv_gqa", 3072, 2048), ("gate_up", 13312, 2048), ("down", 2048, 6656)];
