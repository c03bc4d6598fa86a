//! Criterion benchmarks of single kernels (for profiling one at a time; the side-by-side table with the
//! machine's ceilings is `cargo xtask bench`).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use int4_kernels::isa::IsaCaps;
use int4_kernels::w4a16::{W4A16Config, W4A16Linear, W4A16Weights};
use int4_layout::GroupSize;
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::tinygemm::TinygemmBlock;
use std::hint::black_box;

fn w4a16(c: &mut Criterion) {
    let mut group = c.benchmark_group("w4a16");
    for &(name, n, k) in &[("qkv", 2048usize, 2048usize), ("gate_up", 3072, 576)] {
        let w = int4_benches::weights(n, k, 1);
        let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        let weights = W4A16Weights::new(&q.codes, q.params, TinygemmBlock::N32, true).unwrap();
        let lin = W4A16Linear::with_caps(weights, None, W4A16Config::default(), IsaCaps::process()).unwrap();
        for m in [1usize, 4, 64] {
            let x = int4_benches::weights(m, k, 2);
            let mut out = vec![0.0; m * n];
            group.throughput(Throughput::Elements((2 * m * n * k) as u64));
            group.bench_function(format!("{}/{name}/{m}x{n}x{k}", lin.kernel_for(m)), |b| {
                b.iter(|| lin.forward(black_box(&x), m, &mut out).unwrap())
            });
        }
    }
    group.finish();
}

criterion_group!(benches, w4a16);
criterion_main!(benches);
