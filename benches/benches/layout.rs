//! Layout benchmarks: load-time repacking and the direct dequantization that prefill and embedding lookup
//! rely on, at the project's real shapes.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{GroupSize, rowmajor};
use std::hint::black_box;

fn repack(c: &mut Criterion) {
    let mut group = c.benchmark_group("repack_row_major_to_tinygemm64");
    for &(n, k) in int4_benches::SHAPES {
        let w = int4_benches::weights(n, k, 1);
        let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        let rm = rowmajor::pack(&q.codes).unwrap();
        let mut out = vec![0u8; n * k / 2];
        group.throughput(Throughput::Bytes((n * k / 2) as u64));
        group.bench_function(format!("{n}x{k}/chunk2048"), |b| {
            b.iter(|| {
                tinygemm::pack_from_row_major_chunked(black_box(&rm), n, k, TinygemmBlock::N64, 2048, &mut out).unwrap()
            })
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_k_range_bf16");
    for &(n, k) in &[(2048usize, 2048usize), (576, 576), (49152, 576)] {
        let w = int4_benches::weights(n, k, 2);
        let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        let packed = tinygemm::pack(&q.codes, TinygemmBlock::N64).unwrap();
        let m = TinygemmMatrix::new(&packed, n, k, TinygemmBlock::N64).unwrap();
        let kc = 256.min(k);
        let mut out = vec![half::bf16::ZERO; n * kc];
        group.throughput(Throughput::Elements((n * kc) as u64));
        group.bench_function(format!("{n}x{k}/k0..{kc}"), |b| {
            b.iter(|| m.decode_k_range(&q.params, 0..kc, black_box(&mut out)).unwrap())
        });
    }
    group.finish();
}

fn quantize(c: &mut Criterion) {
    let mut group = c.benchmark_group("quantize_asymmetric_g128");
    let (n, k) = (576, 1536);
    let w = int4_benches::weights(n, k, 3);
    group.throughput(Throughput::Elements((n * k) as u64));
    for search in [ScaleSearch::Off, ScaleSearch::Shrink] {
        group.bench_function(format!("{n}x{k}/{search:?}"), |b| {
            b.iter(|| quantize_asymmetric(black_box(&w), n, k, GroupSize::G128, search, ParamPrecision::F32).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, repack, decode, quantize);
criterion_main!(benches);
