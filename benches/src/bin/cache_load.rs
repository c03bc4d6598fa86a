//! Cold versus warm load of a model's packed 4-bit weights through the artifact cache.
//!
//! Cold: quantize every matrix of a model-shaped set of synthetic weights (g128, scale search off), pack it
//! into the tinygemm layout and write the artifact. Warm: a fresh process loads (maps and checks) the same
//! artifact, and then touches every byte. Reports times, packed bytes, and the warm process's anonymous
//! memory against the packed bytes (the weights are file-backed pages of the mapping, not anonymous memory).
//!
//! `cache-load [--model smollm2-shaped|spark-shaped] [--dir DIR]`. The weights are synthetic, so "cold"
//! excludes reading a checkpoint; it is the repack cost the cache exists to pay once.

use std::time::Instant;

use int4_benches::{ModelShape, SMOLLM2_135M, SPARK_SHAPED, rss_anon_and_file};
use int4_cache::key::{ArtifactKey, SourceFile, SourceIdentity};
use int4_cache::quant_config::normalize;
use int4_cache::store::{ArtifactStore, Lookup};
use int4_layout::GroupSize;
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric};
use int4_layout::tinygemm::{self, TinygemmBlock};
use int4_select::policy::{CheckpointKind, Overrides, Priority, RunPath, plan};
use rayon::prelude::*;

fn key_for(model: &ModelShape) -> ArtifactKey {
    let snap = int4_select::probe::live();
    // The W4A16 plan for the grid this bench packs (tinygemm, group 128).
    let o = Overrides { path: RunPath::W4a16, group: GroupSize::G128, ..Overrides::default() };
    let p = plan(&snap, CheckpointKind::Bf16, Priority::Speed, &o).expect("a plan");
    let source = SourceIdentity {
        files: vec![SourceFile {
            name: format!("{}-synthetic-seed-1", model.name),
            size: 0,
            blake3: "synthetic".into(),
        }],
    };
    ArtifactKey::new(
        normalize(Some(&serde_json::json!({"quant_method": "cpu_int4"}))).unwrap(),
        &p,
        vec!["avx2".into(), "fma".into()],
        source,
    )
}

fn matrices(model: &ModelShape) -> Vec<(String, usize, usize)> {
    let mut v: Vec<(String, usize, usize)> = (0..model.layers)
        .flat_map(|l| model.per_layer.iter().map(move |(name, n, k)| (format!("layers.{l}.{name}"), *n, *k)))
        .collect();
    v.push(("embed_tokens".into(), model.head.0, model.head.1));
    v
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Shape {
    Smollm2Shaped,
    SparkShaped,
}

#[derive(clap::Parser)]
#[command(
    name = "cache-load",
    about = "Cold versus warm load of a model-shaped set of packed weights through the artifact cache"
)]
struct Args {
    /// The model shape.
    #[arg(long, value_enum, default_value_t = Shape::Smollm2Shaped)]
    model: Shape,
    /// The artifact store (default: target/bench/cache-<shape>).
    #[arg(long)]
    dir: Option<String>,
    /// Internal: only the warm load, in this process.
    #[arg(long, hide = true)]
    warm_only: bool,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let model = match args.model {
        Shape::SparkShaped => SPARK_SHAPED,
        Shape::Smollm2Shaped => SMOLLM2_135M,
    };
    let dir = args.dir.clone().unwrap_or_else(|| format!("target/bench/cache-{}", model.name));
    let store = ArtifactStore::new(&dir);
    let key = key_for(&model);

    if args.warm_only {
        let before = rss_anon_and_file().unwrap_or((0, 0));
        let t = Instant::now();
        let Lookup::Hit(m) = store.load(&key) else {
            eprintln!("warm load found no valid artifact in {dir}");
            std::process::exit(1);
        };
        let load = t.elapsed().as_secs_f64();
        let after_load = rss_anon_and_file().unwrap_or((0, 0));
        let t = Instant::now();
        let mut sum = 0u64;
        for s in &m.header().sections {
            sum = m.section(&s.name).unwrap().iter().fold(sum, |a, &b| a.wrapping_add(u64::from(b)));
        }
        let touch = t.elapsed().as_secs_f64();
        let after_touch = rss_anon_and_file().unwrap_or((0, 0));
        println!(
            "{{\"warm_load_s\": {load}, \"touch_all_s\": {touch}, \"rss_anon_before\": {}, \"rss_anon_after_load\": {}, \"rss_anon_after_touch\": {}, \"rss_file_after_touch\": {}, \"checksum\": {sum}}}",
            before.0, after_load.0, after_touch.0, after_touch.1
        );
        return;
    }

    let _ = std::fs::remove_dir_all(&dir);
    let list = matrices(&model);
    let params: u64 = list.iter().map(|(_, n, k)| (n * k) as u64).sum();
    eprintln!("{}: {} matrices, {:.3} B parameters; cold build ...", model.name, list.len(), params as f64 / 1e9);
    let t = Instant::now();
    let sections: Vec<(String, Vec<u8>)> = list
        .par_iter()
        .enumerate()
        .flat_map_iter(|(i, (name, n, k))| {
            let w = int4_benches::weights(*n, *k, i as u64 + 1);
            let q = quantize_asymmetric(&w, *n, *k, GroupSize::G128, ScaleSearch::Off, ParamPrecision::F32).unwrap();
            let packed = tinygemm::pack(&q.codes, TinygemmBlock::N32).unwrap();
            let mut sz = Vec::with_capacity(q.params.scales().len() * 8);
            for (s, z) in q.params.scales().iter().zip(q.params.zeros()) {
                sz.extend_from_slice(&s.to_le_bytes());
                sz.extend_from_slice(&z.to_le_bytes());
            }
            [(format!("{name}.packed"), packed), (format!("{name}.scales_zeros"), sz)]
        })
        .collect();
    let quantize_pack = t.elapsed().as_secs_f64();
    let bytes: u64 = sections.iter().map(|(_, b)| b.len() as u64).sum();
    let t = Instant::now();
    let m = store.store(&key, &sections).expect("artifact written");
    let write = t.elapsed().as_secs_f64();
    drop(m);
    drop(sections);
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .args(["--model", model.name, "--dir", &dir, "--warm-only"])
        .output()
        .expect("warm run");
    let warm: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("warm run failed: {}", String::from_utf8_lossy(&out.stderr));
    });
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "\n### Cold vs warm load: {} ({:.3} B parameters, synthetic), {} threads\n",
        model.name,
        params as f64 / 1e9,
        rayon::current_num_threads()
    );
    println!("| phase | time | notes |");
    println!("|---|---|---|");
    println!("| cold: quantize + pack | {quantize_pack:.2} s | g128, no scale search, tinygemm 32-channel blocks |");
    println!("| cold: write artifact (+ payload hash check) | {write:.2} s | {:.1} MiB |", mib(bytes as f64));
    println!(
        "| warm: load (map + header/size/key checks) | {:.2} ms | fresh process |",
        warm["warm_load_s"].as_f64().unwrap() * 1e3
    );
    println!("| warm: first touch of every byte | {:.2} s | page cache hot |", warm["touch_all_s"].as_f64().unwrap());
    println!(
        "\nwarm process RssAnon: {:.1} MiB before load, {:.1} MiB after load, {:.1} MiB after touching every byte (packed bytes {:.1} MiB; RssFile then {:.1} MiB)",
        mib(warm["rss_anon_before"].as_f64().unwrap()),
        mib(warm["rss_anon_after_load"].as_f64().unwrap()),
        mib(warm["rss_anon_after_touch"].as_f64().unwrap()),
        mib(bytes as f64),
        mib(warm["rss_file_after_touch"].as_f64().unwrap()),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
