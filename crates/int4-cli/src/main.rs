//! The `int4` command-line tool.
//!
//! A thin layer over the `int4` library. Today it has `probe` (the hardware probe and the path policy's
//! plan for every checkpoint kind) and `cache` (list, verify, clear and evict packed artifacts); the model
//! commands (`generate`, `chat`, `quantize`, `info`) come with the runtime.

use std::process::ExitCode;

use int4::select::policy::{CheckpointKind, Overrides, Priority, plan};
use int4::select::{CpuSnapshot, snapshot_for_policy};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("int4 {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("probe") => probe(&args[1..]),
        Some("cache") => cache(&args[1..]),
        None | Some("--help") | Some("-h") => {
            println!("int4 {}: 4-bit-weight LLM inference on x86 CPUs", env!("CARGO_PKG_VERSION"));
            println!();
            println!(
                "usage: int4 probe [--json]     CPU features, OS support, AMX permission and the plan per checkpoint kind"
            );
            println!("       int4 --version");
            println!();
            println!("INT4_CPU_PROFILE=file.json replaces the live probe for the plan (decisions only);");
            println!("INT4_ISA=portable|avx2|avx512|amx and INT4_DISABLE=feature,... cap what the kernels use.");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("int4: unknown command `{other}` (try `int4 --help`)");
            ExitCode::from(2)
        }
    }
}

fn probe(args: &[String]) -> ExitCode {
    let json = args.iter().any(|a| a == "--json");
    if let Some(bad) = args.iter().find(|a| *a != "--json") {
        eprintln!("int4 probe: unknown option `{bad}` (usage: int4 probe [--json])");
        return ExitCode::from(2);
    }
    let snap = match snapshot_for_policy() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("int4 probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    let caps = int4::kernels::isa::IsaCaps::process();
    let isa_cap = std::env::var("INT4_ISA").ok().and_then(|v| int4::kernels::isa::IsaLevel::parse(&v));
    let overrides = Overrides { isa_cap, ..Overrides::default() };
    let mut plans = Vec::new();
    for kind in CheckpointKind::ALL {
        for prio in [Priority::Speed, Priority::Fidelity] {
            plans.push((kind, prio, plan(&snap, kind, prio, &overrides)));
        }
    }
    if json {
        let doc = serde_json::json!({
            "snapshot": snap,
            "usable": snap.usable(),
            "kernels_level_in_this_process": caps.effective_level(),
            "plans": plans.iter().map(|(k, p, r)| serde_json::json!({
                "checkpoint": k, "priority": p,
                "plan": r.as_ref().ok(), "error": r.as_ref().err().map(|e| e.to_string()),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("snapshot serialises"));
        return ExitCode::SUCCESS;
    }
    print_snapshot(&snap);
    println!("kernels this process can run: {}", caps.effective_level().name());
    println!();
    println!("plan per checkpoint kind:");
    for (kind, prio, r) in &plans {
        match r {
            Ok(p) => {
                println!(
                    "  {kind:?}/{prio:?}: {}  decode {}  prefill {} (M >= {})  layout {:?}",
                    p.path, p.decode.kernel, p.prefill.kernel, p.dequant_threshold, p.layout
                );
                for rj in &p.rejected {
                    println!("      not {}: {}", rj.path, rj.why);
                }
            }
            Err(e) => println!("  {kind:?}/{prio:?}: error: {e}"),
        }
    }
    ExitCode::SUCCESS
}

fn cache(args: &[String]) -> ExitCode {
    let store = int4::cache::ArtifactStore::from_env();
    match args.first().map(String::as_str) {
        Some("ls") => {
            let entries = store.list();
            println!("{} ({} artifacts)", store.dir().display(), entries.len());
            let mut total = 0;
            for e in entries {
                total += e.size;
                println!("  {}  {:>12} bytes{}", e.key, e.size, if e.pinned { "  pinned" } else { "" });
            }
            println!("total {total} bytes");
            ExitCode::SUCCESS
        }
        Some("verify") => {
            let mut bad = 0;
            for (key, r) in store.verify() {
                match r {
                    Ok(()) => println!("ok       {key}"),
                    Err(e) => {
                        bad += 1;
                        println!("CORRUPT  {key}: {e}");
                    }
                }
            }
            if bad == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some("clear") => {
            println!("removed {} artifacts from {}", store.clear(), store.dir().display());
            ExitCode::SUCCESS
        }
        Some("evict") => match args.get(1).and_then(|v| v.parse::<u64>().ok()) {
            Some(cap) => {
                let gone = store.evict_to(cap);
                println!("evicted {} artifacts to stay under {cap} bytes", gone.len());
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("int4 cache evict: give the size cap in bytes");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("usage: int4 cache ls|verify|clear|evict BYTES");
            ExitCode::from(2)
        }
    }
}

fn print_snapshot(s: &CpuSnapshot) {
    let yn = |b: bool| if b { "yes" } else { "no" };
    println!(
        "CPU: {} ({}, family {} model {} stepping {})",
        s.model_name, s.vendor, s.family_model_stepping.0, s.family_model_stepping.1, s.family_model_stepping.2
    );
    println!(
        "source: {}   arch: {}   logical cores: {:?}   physical cores: {:?}",
        s.source, s.arch, s.logical_cores, s.physical_cores
    );
    println!("caches: L1d {:?}  L2 {:?}  L3 {:?} bytes", s.caches.l1d, s.caches.l2, s.caches.l3);
    println!();
    let c = &s.cpu;
    let u = s.usable();
    println!("{:<14} {:>6} {:>8}", "feature", "CPUID", "usable");
    for (name, cpu, usable) in [
        ("sse4.2", c.sse42, c.sse42),
        ("avx2+fma", c.avx2 && c.fma, u.avx2_fma),
        ("f16c", c.f16c, c.f16c && s.os.avx_state),
        ("avx512 f/bw/vl", c.avx512f && c.avx512bw && c.avx512vl, u.avx512),
        ("avx512-vnni", c.avx512vnni, u.avx512vnni),
        ("avx512-bf16", c.avx512bf16, u.avx512bf16),
        ("avx-vnni", c.avx_vnni, c.avx_vnni && s.os.avx_state),
        ("amx-tile", c.amx_tile, u.amx_int8 || u.amx_bf16),
        ("amx-int8", c.amx_int8, u.amx_int8),
        ("amx-bf16", c.amx_bf16, u.amx_bf16),
    ] {
        println!("{name:<14} {:>6} {:>8}", yn(cpu), yn(usable));
    }
    println!();
    println!(
        "OS: osxsave {}  xcr0 {}  avx state {}  avx512 state {}  amx state {}",
        yn(c.osxsave),
        s.os.xcr0.map_or("unreadable".to_string(), |x| format!("{x:#x}")),
        yn(s.os.avx_state),
        yn(s.os.avx512_state),
        yn(s.os.amx_state)
    );
    println!("AMX permission: {:?}", s.amx_permission);
    if let Some(t) = s.tile_limits {
        println!(
            "tiles: {} names, {} rows x {} bytes; TMUL max K {} max N {}",
            t.max_names, t.max_rows, t.bytes_per_row, t.tmul_max_k, t.tmul_max_n
        );
    }
}
