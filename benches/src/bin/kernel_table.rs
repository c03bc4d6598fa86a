//! The kernel table: W4A16 and dense kernels at the project's real shapes, measured side by side with the
//! machine's own ceilings, interleaved round by round so that a noisy neighbour moves them together.
//!
//! `cargo xtask bench` runs this (release build, every core) and prints the markdown table; `--json FILE`
//! writes the same numbers for machines; `--quick` uses fewer shapes and rounds; `--memory-only` runs only
//! the decode-from-memory table.
//!
//! Per shape and round: a streaming read over the packed weights (the bandwidth ceiling for that very
//! buffer), W4A16 decode at M = 1 and M = 4, the dense bf16 GEMV and its own streaming read, W4A16 prefill
//! at M = 512 from the packed layout and from split halves, the dense bf16 GEMM, the FMA peak, and W4A8
//! (int8 activations, quantization included) at M = 1 and M = 512. Each figure is the median over rounds
//! of the per-call time, timed from a pool thread as a model's step makes its calls.

use std::time::{Duration, Instant};

use half::bf16;
use int4_kernels::ceiling;
use int4_kernels::dense::{DenseLinear, DenseWeights};
use int4_kernels::isa::{IsaCaps, IsaLevel};
use int4_kernels::shapes::{SMOLLM2_SHAPES, UPSTREAM_SHAPES};
use int4_kernels::w4a8::{W4A8Linear, W4A8Weights};
use int4_kernels::w4a16::{W4A16Config, W4A16Linear, W4A16Weights};
use int4_layout::GroupSize;
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric, quantize_integer_zero};
use int4_layout::tinygemm::TinygemmBlock;
use serde_json::json;

/// Calls `f` until at least `budget` has passed (and at least twice) and returns the mean time per call.
fn time_per_call(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u32;
    while calls < 2 || start.elapsed() < budget {
        f();
        calls += 1;
    }
    start.elapsed().as_secs_f64() / f64::from(calls)
}

/// The median of `v`; NaN for no samples (a kernel the CPU cannot run was not timed).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

struct W4a8Row {
    name: &'static str,
    n: usize,
    k: usize,
    bytes: usize,
    kernel: &'static str,
    decode1: f64,
    prefill: f64,
    read_packed: f64,
    read_bytes: usize,
    w4a16_decode1: f64,
    w4a16_prefill: f64,
}

struct Row {
    name: String,
    n: usize,
    k: usize,
    packed_bytes: usize,
    /// Bytes of the streaming read (the packed codes; the decode also reads the parameters).
    read_bytes: usize,
    read_packed: f64,
    decode1: f64,
    decode4: f64,
    read_bf16: f64,
    gemv_bf16: f64,
    prefill_direct: f64,
    prefill_halves: f64,
    gemm_bf16: f64,
    fma_flops: f64,
    /// The `vdpbf16ps` peak (0 without AVX512-BF16).
    bf16_flops: f64,
    /// The f32 prefill on 512-bit FMA (`w4a16-prefill-direct-avx512`) and on 256-bit FMA, and the 512-bit
    /// FMA peak: where the CPU has AVX-512 (0 elsewhere).
    prefill_f32_512: f64,
    prefill_f32_256: f64,
    fma512_flops: f64,
    decode_kernel: &'static str,
    prefill_kernel: &'static str,
}

#[derive(clap::Parser)]
#[command(
    name = "kernel-table",
    about = "The kernels at the project's shapes beside the machine's bandwidth and FMA ceilings"
)]
struct Args {
    /// Fewer shapes and rounds.
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON here.
    #[arg(long = "json")]
    json_path: Option<String>,
    /// Only the decode-from-memory table.
    #[arg(long)]
    memory_only: bool,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    // Every table is timed from a pool thread, as a model's step calls its layers: from outside, each
    // parallel call would also hand its work to the pool and sleep until it is done, tens of µs that a
    // small layer never sees in a model.
    rayon::scope(|_| tables(args));
}

fn tables(Args { quick, json_path, memory_only }: Args) {
    let rounds = if quick { 3 } else { 7 };
    let budget = Duration::from_millis(if quick { 15 } else { 60 });
    let m_prefill = 512;

    let level = IsaCaps::process().effective_level();
    // The layout the policy gives this machine's W4A16 path: 64-channel blocks with AVX-512.
    let block = if int4_kernels::isa::Avx512::new().is_some() { TinygemmBlock::N64 } else { TinygemmBlock::N32 };
    let threads = rayon::current_num_threads();
    eprintln!("kernel table: ISA {} ({} threads), {} rounds", level.name(), threads, rounds);

    if memory_only {
        from_memory(quick, rounds, budget, block);
        return;
    }
    let shapes: Vec<(&str, usize, usize)> = if quick {
        vec![UPSTREAM_SHAPES[0], SMOLLM2_SHAPES[2], SMOLLM2_SHAPES[4]]
    } else {
        UPSTREAM_SHAPES.iter().chain(SMOLLM2_SHAPES.iter()).copied().collect()
    };

    let mut rows = Vec::new();
    let mut wna16_rows = Vec::new();
    let mut w4a8_rows = Vec::new();
    for (name, n, k) in shapes {
        eprintln!("  {name} {n}x{k} ...");
        let w = int4_benches::weights(n, k, 7);
        let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        let direct = W4A16Linear::with_caps(
            W4A16Weights::new(&q.codes, q.params.clone(), block, true).unwrap(),
            None,
            W4A16Config::default(),
            IsaCaps::process(),
        )
        .unwrap();
        let halves = W4A16Linear::with_caps(
            W4A16Weights::new(&q.codes, q.params.clone(), block, false).unwrap(),
            None,
            W4A16Config { direct_dequant: false, ..W4A16Config::default() },
            IsaCaps::process(),
        )
        .unwrap();
        // The f32 prefill at each FMA width, where the CPU has AVX-512: the AVX-512 one as a CPU without
        // AVX512-BF16 runs it, and the AVX2 one.
        let f32_widths = int4_kernels::isa::Avx512::new().map(|_| {
            let at = |level: IsaLevel, caps: &IsaCaps| {
                let weights = W4A16Weights::new(&q.codes, q.params.clone(), block, true).unwrap();
                W4A16Linear::forced(weights, None, W4A16Config::default(), level, caps).unwrap()
            };
            let no_bf16 = IsaCaps::process().without(int4_kernels::isa::Feature::Avx512Bf16);
            (at(IsaLevel::Avx512, &no_bf16), at(IsaLevel::Avx2, IsaCaps::process()))
        });
        let wna16 = int4_kernels::portable::Wna16Linear::from_codes(&q.codes, q.params.clone(), None).unwrap();
        let qi = quantize_integer_zero(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        let groups = GroupSize::G128.groups(k);
        let gn = |v: &[f32]| (0..groups * n).map(|i| v[(i % n) * groups + i / n]).collect::<Vec<f32>>();
        let zeros_gn: Vec<u8> =
            (0..groups * n).map(|i| qi.zero_points.as_deref().unwrap()[(i % n) * groups + i / n]).collect();
        let w4a8 = W4A8Linear::new(
            W4A8Weights::pack(&qi.codes, &gn(qi.params.scales()), Some(&zeros_gn), None, GroupSize::G128).unwrap(),
            None,
            IsaCaps::process(),
        )
        .unwrap();
        drop(qi);
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        drop(w);
        drop(q);
        let bf16_bytes: Vec<u8> = wb.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        let dense = DenseLinear::new(n, k, DenseWeights::Bf16(wb), None).unwrap();
        let x1 = int4_benches::weights(1, k, 8);
        let x4 = int4_benches::weights(4, k, 9);
        let xp = int4_benches::weights(m_prefill, k, 10);
        let (mut o1, mut o4, mut op) = (vec![0.0; n], vec![0.0; 4 * n], vec![0.0; m_prefill * n]);
        let packed = direct.weights().packed().to_vec();
        let mut sink = 0u64;
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); 16];
        for _ in 0..rounds {
            samples[0].push(time_per_call(budget, || sink ^= ceiling::stream_read(&packed)));
            samples[1].push(time_per_call(budget, || direct.decode(&x1, 1, &mut o1).unwrap()));
            samples[2].push(time_per_call(budget, || direct.decode(&x4, 4, &mut o4).unwrap()));
            samples[3].push(time_per_call(budget, || sink ^= ceiling::stream_read(&bf16_bytes)));
            samples[4].push(time_per_call(budget, || {
                dense.forward(&x1, 1, &mut o1).unwrap();
            }));
            samples[5].push(time_per_call(budget, || direct.prefill(&xp, m_prefill, &mut op).unwrap()));
            samples[6].push(time_per_call(budget, || halves.prefill(&xp, m_prefill, &mut op).unwrap()));
            samples[7].push(time_per_call(budget, || {
                dense.forward(&xp, m_prefill, &mut op).unwrap();
            }));
            let iters = 200_000;
            let t = time_per_call(budget, || sink ^= u64::from(ceiling::fma_peak(iters).1.to_bits()));
            samples[8].push(ceiling::fma_peak(1).0 as f64 * iters as f64 / t);
            samples[9].push(time_per_call(budget, || {
                wna16.forward(&x1, 1, &mut o1).unwrap();
            }));
            samples[10].push(time_per_call(budget, || {
                w4a8.forward(&x1, 1, &mut o1).unwrap();
            }));
            samples[11].push(time_per_call(budget, || {
                w4a8.forward(&xp, m_prefill, &mut op).unwrap();
            }));
            let iters = 100_000;
            let t = time_per_call(budget, || sink ^= u64::from(ceiling::bf16_peak(iters).1.to_bits()));
            samples[12].push(ceiling::bf16_peak(1).0 as f64 * iters as f64 / t);
            if let Some((wide, narrow)) = &f32_widths {
                samples[13].push(time_per_call(budget, || wide.prefill(&xp, m_prefill, &mut op).unwrap()));
                samples[14].push(time_per_call(budget, || narrow.prefill(&xp, m_prefill, &mut op).unwrap()));
                let iters = 200_000;
                let t = time_per_call(budget, || sink ^= u64::from(ceiling::fma512_peak(iters).1.to_bits()));
                samples[15].push(ceiling::fma512_peak(1).0 as f64 * iters as f64 / t);
            }
        }
        std::hint::black_box(sink);
        let med: Vec<f64> = samples.into_iter().map(median).collect();
        wna16_rows.push((name, n, k, med[9], med[1]));
        w4a8_rows.push(W4a8Row {
            name,
            n,
            k,
            bytes: w4a8.weights().resident_bytes(),
            kernel: w4a8.kernel_for(m_prefill).name(),
            decode1: med[10],
            prefill: med[11],
            read_packed: med[0],
            read_bytes: packed.len(),
            w4a16_decode1: med[1],
            w4a16_prefill: med[5],
        });
        rows.push(Row {
            name: name.to_string(),
            n,
            k,
            packed_bytes: direct.weights().decode_bytes(),
            read_bytes: packed.len(),
            read_packed: med[0],
            decode1: med[1],
            decode4: med[2],
            read_bf16: med[3],
            gemv_bf16: med[4],
            prefill_direct: med[5],
            prefill_halves: med[6],
            gemm_bf16: med[7],
            fma_flops: med[8],
            bf16_flops: med[12],
            prefill_f32_512: if f32_widths.is_some() { med[13] } else { 0.0 },
            prefill_f32_256: if f32_widths.is_some() { med[14] } else { 0.0 },
            fma512_flops: if f32_widths.is_some() { med[15] } else { 0.0 },
            decode_kernel: direct.kernel_for(1).name(),
            prefill_kernel: direct.kernel_for(m_prefill).name(),
        });
    }

    println!(
        "\n### Kernels: {} threads, ISA {}, W4A16 g128 ({:?} blocks; {} / {}), prefill M = {m_prefill}\n",
        threads,
        level.name(),
        block,
        rows.first().map_or("", |r| r.decode_kernel),
        rows.first().map_or("", |r| r.prefill_kernel),
    );
    println!(
        "| shape | N×K | read GB/s (packed) | decode M=1 µs | GB/s | % of read | ns/weight | M=4 / M=1 | bf16 GEMV GB/s (% of its read) | prefill GFLOP/s | % of its peak (FMA or vdpbf16ps) | direct / halves | vs bf16 GEMM |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut out = Vec::new();
    for r in &rows {
        let read_gbs = r.read_bytes as f64 / r.read_packed / 1e9;
        let dec_gbs = r.packed_bytes as f64 / r.decode1 / 1e9;
        let bf16_read = (r.n * r.k * 2) as f64 / r.read_bf16 / 1e9;
        let gemv_gbs = (r.n * r.k * 2) as f64 / r.gemv_bf16 / 1e9;
        let flops = 2.0 * (m_prefill * r.n * r.k) as f64;
        let gflops = flops / r.prefill_direct / 1e9;
        let bf16_prefill = r.prefill_kernel.contains("bf16");
        let peak = if bf16_prefill { r.bf16_flops } else { r.fma_flops } / 1e9;
        println!(
            "| {} | {}×{} | {:.1} | {:.1} | {:.1} | {:.0}% | {:.3} | {:.2} | {:.1} ({:.0}%) | {:.1} | {:.0}% of {:.0} {} | {:.3} | {:.2}× |",
            r.name,
            r.n,
            r.k,
            read_gbs,
            r.decode1 * 1e6,
            dec_gbs,
            100.0 * dec_gbs / read_gbs,
            r.decode1 * 1e9 / (r.n * r.k) as f64,
            r.decode4 / r.decode1,
            gemv_gbs,
            100.0 * gemv_gbs / bf16_read,
            gflops,
            100.0 * gflops / peak,
            peak,
            if bf16_prefill { "bf16" } else { "FMA" },
            r.prefill_direct / r.prefill_halves,
            r.gemm_bf16 / r.prefill_direct,
        );
        out.push(json!({
            "shape": r.name, "n": r.n, "k": r.k, "packed_bytes": r.packed_bytes,
            "stream_read_packed_s": r.read_packed, "decode_m1_s": r.decode1, "decode_m4_s": r.decode4,
            "stream_read_bf16_s": r.read_bf16, "dense_bf16_gemv_m1_s": r.gemv_bf16,
            "prefill_direct_s": r.prefill_direct, "prefill_halves_s": r.prefill_halves,
            "dense_bf16_gemm_s": r.gemm_bf16, "fma_peak_flops": r.fma_flops, "bf16_peak_flops": r.bf16_flops,
            "prefill_f32_avx512_s": r.prefill_f32_512, "prefill_f32_avx2_s": r.prefill_f32_256,
            "fma512_peak_flops": r.fma512_flops,
            "decode_kernel": r.decode_kernel, "prefill_kernel": r.prefill_kernel,
            "decode_gbs": dec_gbs, "stream_read_gbs": read_gbs, "prefill_gflops": gflops,
        }));
    }

    if rows.iter().any(|r| r.prefill_f32_512 > 0.0) {
        println!(
            "\n### The f32 prefill at each FMA width (M = {m_prefill}; 512-bit: `w4a16-prefill-direct-avx512`, what an AVX-512 CPU without AVX512-BF16 runs; 256-bit: `w4a16-prefill-direct-avx2`), same rounds\n"
        );
        println!(
            "| shape | N×K | 512-bit GFLOP/s | % of 512-bit FMA peak | 256-bit GFLOP/s | % of 256-bit FMA peak | 512 / 256 | peaks 512 / 256 GFLOP/s |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rows {
            let flops = 2.0 * (m_prefill * r.n * r.k) as f64;
            let (wide, narrow) = (flops / r.prefill_f32_512 / 1e9, flops / r.prefill_f32_256 / 1e9);
            println!(
                "| {} | {}×{} | {:.1} | {:.0}% | {:.1} | {:.0}% | {:.2}× | {:.0} / {:.0} |",
                r.name,
                r.n,
                r.k,
                wide,
                100.0 * wide * 1e9 / r.fma512_flops,
                narrow,
                100.0 * narrow * 1e9 / r.fma_flops,
                wide / narrow,
                r.fma512_flops / 1e9,
                r.fma_flops / 1e9
            );
        }
    }

    println!(
        "\n### W4A8 (g128, asymmetric integer zeros; int8 activation quantization included) beside W4A16, same rounds\n"
    );
    println!(
        "| shape | N×K | kernel | M=1 µs | GB/s | % of read | vs W4A16 M=1 | M=512 GOP/s | % of FMA peak (f32 FLOP/s) | vs W4A16 prefill |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut w4a8_json = Vec::new();
    for (r, base) in w4a8_rows.iter().zip(&rows) {
        // The read ceiling was measured on the W4A16 codes; as bytes per second it applies to any buffer.
        let read_gbs = r.read_bytes as f64 / r.read_packed / 1e9;
        let gbs = r.bytes as f64 / r.decode1 / 1e9;
        let gops = 2.0 * (m_prefill * r.n * r.k) as f64 / r.prefill / 1e9;
        println!(
            "| {} | {}×{} | {} | {:.1} | {:.1} | {:.0}% | {:.2}× | {:.1} | {:.0}% | {:.2}× |",
            r.name,
            r.n,
            r.k,
            r.kernel,
            r.decode1 * 1e6,
            gbs,
            100.0 * gbs / read_gbs,
            r.w4a16_decode1 / r.decode1,
            gops,
            100.0 * gops * 1e9 / base.fma_flops,
            r.w4a16_prefill / r.prefill,
        );
        w4a8_json.push(json!({
            "shape": r.name, "n": r.n, "k": r.k, "kernel": r.kernel, "bytes": r.bytes,
            "decode_m1_s": r.decode1, "m512_s": r.prefill, "decode_gbs": gbs, "m512_gops": gops,
            "speedup_vs_w4a16_decode": r.w4a16_decode1 / r.decode1,
            "speedup_vs_w4a16_prefill": r.w4a16_prefill / r.prefill,
        }));
    }

    let decode = rows.first().map_or("w4a16 decode", |r| r.decode_kernel);
    println!("\n### The portable fallback (wna16) against the SIMD decode, M = 1\n");
    println!("| shape | N×K | wna16 µs | {decode} µs | wna16 / SIMD |");
    println!("|---|---|---|---|---|");
    for (name, n, k, wna, avx) in &wna16_rows {
        println!("| {name} | {n}×{k} | {:.1} | {:.1} | {:.1}× |", wna * 1e6, avx * 1e6, wna / avx);
    }

    // Where the prefill overtakes decode: the dequant_threshold evidence.
    let (n, k) = (2048, 2048);
    let w = int4_benches::weights(n, k, 11);
    let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
    let weights = W4A16Weights::new(&q.codes, q.params, block, true).unwrap();
    let lin = W4A16Linear::with_caps(weights, None, W4A16Config::default(), IsaCaps::process()).unwrap();
    println!("\n### Decode vs prefill by M ({n}×{k}): µs per call\n");
    println!("| M | decode | prefill | faster |");
    println!("|---|---|---|---|");
    let mut crossover = Vec::new();
    for m in [1usize, 2, 4, 6, 8, 12, 16, 20, 24, 32] {
        let x = int4_benches::weights(m, k, 12);
        let mut o = vec![0.0; m * n];
        let mut d = Vec::new();
        let mut p = Vec::new();
        for _ in 0..rounds {
            d.push(time_per_call(budget, || lin.decode(&x, m, &mut o).unwrap()));
            p.push(time_per_call(budget, || lin.prefill(&x, m, &mut o).unwrap()));
        }
        let (d, p) = (median(d), median(p));
        println!("| {m} | {:.1} | {:.1} | {} |", d * 1e6, p * 1e6, if d <= p { "decode" } else { "prefill" });
        crossover.push(json!({"m": m, "decode_s": d, "prefill_s": p}));
    }

    let memory = from_memory(quick, rounds, budget, block);

    if let Some(path) = json_path {
        let doc = json!({
            "schema": "int4-kernel-table/1",
            "isa": level.name(), "threads": threads, "rounds": rounds, "quick": quick,
            "group_size": 128, "block": format!("{block:?}"), "prefill_m": m_prefill,
            "rows": out, "w4a8_rows": w4a8_json, "crossover_2048x2048": crossover,
            "from_memory": memory,
        });
        if let Some(dir) = std::path::Path::new(&path).parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
        eprintln!("wrote {path}");
    }
}

/// The last-level cache of CPU 0 in bytes, from sysfs; 32 MiB where sysfs does not say.
fn last_level_cache() -> usize {
    (0..8)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let level: u32 = std::fs::read_to_string(format!("{dir}/level")).ok()?.trim().parse().ok()?;
            let size = std::fs::read_to_string(format!("{dir}/size")).ok()?;
            let size = size.trim();
            let (num, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
            let mult = match unit {
                "K" => 1 << 10,
                "M" => 1 << 20,
                _ => 1,
            };
            Some((level, num.parse::<usize>().ok()? * mult))
        })
        .max()
        .map_or(32 << 20, |(_, bytes)| bytes)
}

/// Calls `f` on `items` in turn: each call meets a buffer that `items.len() − 1` others have evicted.
fn rotating<T>(items: &[T], mut f: impl FnMut(&T)) -> impl FnMut() {
    let mut i = 0;
    move || {
        f(&items[i % items.len()]);
        i += 1;
    }
}

/// Decode as a model meets it: each layer's weights were evicted from cache since the layer last ran.
/// Every timed call runs the next of enough copies of the layer to fill four times the last-level cache
/// (at least 128 MiB), so its weights come from memory; the streaming read rotates over the same copies'
/// codes in the same rounds. W4A16 at M = 1 and 4 and W4A8 at M = 1 and 4, g128; the upstream shapes and
/// SmolLM2's.
fn from_memory(quick: bool, rounds: usize, budget: Duration, block: TinygemmBlock) -> Vec<serde_json::Value> {
    let llc = last_level_cache();
    let target = (4 * llc).max(128 << 20);
    let shapes: Vec<(&str, usize, usize)> =
        if quick { vec![UPSTREAM_SHAPES[0]] } else { UPSTREAM_SHAPES.iter().chain(&SMOLLM2_SHAPES).copied().collect() };
    println!(
        "\n### Decode from memory: each call on the next of enough copies to fill {} MiB (4 × the {} MiB last-level \
         cache, at least 128), g128\n",
        target >> 20,
        llc >> 20
    );
    println!(
        "| shape | N×K | copies | read GB/s | W4A16 M=1 µs | GB/s | % of read | M=4 / M=1 | W4A8 M=1 µs | GB/s | % of read | M=4 / M=1 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut out = Vec::new();
    for (name, n, k) in shapes {
        eprintln!("  from memory: {name} {n}x{k} ...");
        let w = int4_benches::weights(n, k, 7);
        let q = quantize_asymmetric(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        let qi = quantize_integer_zero(&w, n, k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
        drop(w);
        let groups = GroupSize::G128.groups(k);
        let scales: Vec<f32> = (0..groups * n).map(|i| qi.params.scales()[(i % n) * groups + i / n]).collect();
        let zeros: Vec<u8> =
            (0..groups * n).map(|i| qi.zero_points.as_deref().unwrap()[(i % n) * groups + i / n]).collect();
        // Each copy is packed anew: a clone would share the packed buffer.
        let new_w4a16 = || {
            let weights = W4A16Weights::new(&q.codes, q.params.clone(), block, true).unwrap();
            W4A16Linear::with_caps(weights, None, W4A16Config::default(), IsaCaps::process()).unwrap()
        };
        let new_w4a8 = || {
            let weights = W4A8Weights::pack(&qi.codes, &scales, Some(&zeros), None, GroupSize::G128).unwrap();
            W4A8Linear::new(weights, None, IsaCaps::process()).unwrap()
        };
        let copies = target.div_ceil(new_w4a16().weights().decode_bytes()).max(2);
        let w4a16s: Vec<W4A16Linear> = (0..copies).map(|_| new_w4a16()).collect();
        let w4a8s: Vec<W4A8Linear> = (0..copies).map(|_| new_w4a8()).collect();
        drop((q, qi));
        let (w4a16, w4a8) = (&w4a16s[0], w4a8s[0].weights());
        let (x1, x4) = (int4_benches::weights(1, k, 8), int4_benches::weights(4, k, 9));
        let (mut o1, mut o4) = (vec![0.0; n], vec![0.0; 4 * n]);
        let mut sink = 0u64;
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); 5];
        for _ in 0..rounds {
            samples[0]
                .push(time_per_call(budget, rotating(&w4a16s, |l| sink ^= ceiling::stream_read(l.weights().packed()))));
            samples[1].push(time_per_call(budget, rotating(&w4a16s, |l| l.decode(&x1, 1, &mut o1).unwrap())));
            samples[2].push(time_per_call(budget, rotating(&w4a16s, |l| l.decode(&x4, 4, &mut o4).unwrap())));
            samples[3].push(time_per_call(
                budget,
                rotating(&w4a8s, |l| {
                    l.forward(&x1, 1, &mut o1).unwrap();
                }),
            ));
            samples[4].push(time_per_call(
                budget,
                rotating(&w4a8s, |l| {
                    l.forward(&x4, 4, &mut o4).unwrap();
                }),
            ));
        }
        std::hint::black_box(sink);
        let med: Vec<f64> = samples.into_iter().map(median).collect();
        let read_gbs = w4a16.weights().packed().len() as f64 / med[0] / 1e9;
        let (b16, b8) = (w4a16.weights().decode_bytes() as f64, w4a8.resident_bytes() as f64);
        let (g16, g8) = (b16 / med[1] / 1e9, b8 / med[3] / 1e9);
        println!(
            "| {name} | {n}×{k} | {copies} | {read_gbs:.1} | {:.1} | {g16:.1} | {:.0}% | {:.2} | {:.1} | {g8:.1} | {:.0}% | {:.2} |",
            med[1] * 1e6,
            100.0 * g16 / read_gbs,
            med[2] / med[1],
            med[3] * 1e6,
            100.0 * g8 / read_gbs,
            med[4] / med[3],
        );
        out.push(json!({
            "shape": name, "n": n, "k": k, "copies": copies, "stream_read_gbs": read_gbs,
            "w4a16_bytes": b16, "w4a16_m1_s": med[1], "w4a16_m4_s": med[2],
            "w4a8_bytes": b8, "w4a8_m1_s": med[3], "w4a8_m4_s": med[4],
        }));
    }
    out
}
