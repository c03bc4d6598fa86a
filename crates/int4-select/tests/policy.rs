//! The probe and the policy on real CPUs: recorded CPUID dumps (InstLatx64, cited in each fixture)
//! replayed through raw-cpuid together with an XCR0 and an AMX permission outcome, plus the live host.

use int4_kernels::KernelId;
use int4_kernels::isa::IsaLevel;
use int4_kernels::isa::{Feature, IsaCaps};
use int4_select::policy::{CheckpointKind, Overrides, PackedLayout, Priority, RunPath, Rung, plan};
use int4_select::probe::{RecordedCpuid, non_x86_snapshot, snapshot_from};
use int4_select::{AmxPermission, CpuSnapshot};
use std::fmt::Write;

fn fixture(name: &str) -> RecordedCpuid {
    let path = format!("{}/tests/fixtures/cpuid/{name}.json", env!("CARGO_MANIFEST_DIR"));
    RecordedCpuid::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A recorded CPU on an OS that enables every state it supports and grants AMX when asked.
fn linux(name: &str) -> CpuSnapshot {
    let r = fixture(name);
    let xcr0 = r.xcr0_all_enabled();
    let s = snapshot_from(r.clone(), &format!("fixture:{name}"), xcr0, AmxPermission::NotApplicable(String::new()));
    let perm = if s.cpu.amx_tile && s.os.amx_state {
        AmxPermission::Granted
    } else {
        AmxPermission::NotApplicable("CPUID reports no AMX-TILE".into())
    };
    snapshot_from(r, &format!("fixture:{name}"), xcr0, perm)
}

fn scenarios() -> Vec<(&'static str, CpuSnapshot)> {
    let mut v: Vec<(&'static str, CpuSnapshot)> =
        ["sapphire_rapids", "emerald_rapids", "zen4", "zen5", "skylake_x", "haswell", "sse_only"]
            .into_iter()
            .map(|n| (n, linux(n)))
            .collect();
    let spr = fixture("sapphire_rapids");
    let xcr0 = spr.xcr0_all_enabled();
    v.push((
        "sapphire_rapids_amx_refused",
        snapshot_from(
            spr,
            "fixture:sapphire_rapids",
            xcr0,
            AmxPermission::Refused("ARCH_REQ_XCOMP_PERM(18) failed (errno 95)".into()),
        ),
    ));
    v.push((
        "zen4_avx512_off_in_xcr0",
        snapshot_from(
            fixture("zen4"),
            "fixture:zen4",
            Some(0x7),
            AmxPermission::NotApplicable("CPUID reports no AMX-TILE".into()),
        ),
    ));
    v.push(("aarch64", non_x86_snapshot("aarch64", "fixture:aarch64")));
    v
}

#[test]
fn recorded_cpus_decode_to_their_real_features() {
    let s = scenarios();
    let get = |n: &str| s.iter().find(|(name, _)| *name == n).unwrap().1.clone();
    let spr = get("sapphire_rapids");
    assert_eq!(spr.vendor, "GenuineIntel");
    assert!(spr.cpu.amx_tile && spr.cpu.amx_int8 && spr.cpu.amx_bf16 && spr.cpu.avx512bf16 && spr.cpu.avx512vnni);
    assert!(spr.usable().amx_int8 && spr.usable().amx_bf16);
    let t = spr.tile_limits.expect("SPR reports tile limits");
    assert_eq!((t.max_names, t.bytes_per_row, t.max_rows), (8, 64, 16));
    let zen4 = get("zen4");
    assert_eq!(zen4.vendor, "AuthenticAMD");
    assert!(zen4.usable().avx512bf16 && zen4.usable().avx512vnni && !zen4.cpu.amx_tile);
    let skx = get("skylake_x");
    assert!(skx.usable().avx512 && !skx.cpu.avx512vnni);
    let hsw = get("haswell");
    assert!(hsw.usable().avx2_fma && !hsw.cpu.avx512f);
    let sse = get("sse_only");
    assert!(sse.cpu.sse42 && !sse.cpu.avx && sse.os.xcr0.is_none() && !sse.usable().avx2_fma);
    // AMX present but refused: nothing AMX is usable, AVX-512 still is.
    let refused = get("sapphire_rapids_amx_refused");
    assert!(refused.cpu.amx_tile && !refused.usable().amx_int8 && refused.usable().avx512);
    // AVX-512 present but not enabled by the OS.
    let off = get("zen4_avx512_off_in_xcr0");
    assert!(off.cpu.avx512f && !off.os.avx512_state && !off.usable().avx512 && off.usable().avx2_fma);
    let arm = get("aarch64");
    assert_eq!(arm.usable(), Default::default());
}

/// The whole decision matrix, pinned: every scenario × checkpoint kind × priority.
#[test]
fn decision_matrix() {
    let mut out = String::new();
    for (name, s) in scenarios() {
        let u = s.usable();
        writeln!(
            out,
            "## {name}: {} — usable: avx2_fma={} avx512={} bf16={} vnni={} amx_int8={} amx_bf16={}",
            if s.model_name.is_empty() { &s.arch } else { &s.model_name },
            u.avx2_fma,
            u.avx512,
            u.avx512bf16,
            u.avx512vnni,
            u.amx_int8,
            u.amx_bf16
        )
        .unwrap();
        for kind in CheckpointKind::ALL {
            for prio in [Priority::Speed, Priority::Fidelity] {
                let p = plan(&s, kind, prio, &Overrides::default()).unwrap();
                writeln!(
                    out,
                    "{kind:?}/{prio:?}: {} (decode {}, prefill {}, {:?}, threshold {})",
                    p.path, p.decode.kernel, p.prefill.kernel, p.layout, p.dequant_threshold
                )
                .unwrap();
                for r in &p.rejected {
                    writeln!(out, "    rejected {}: {}", r.path, r.why).unwrap();
                }
            }
        }
    }
    insta::assert_snapshot!(out);
}

#[test]
fn rejections_name_the_real_reason() {
    let s = scenarios();
    let get = |n: &str| s.iter().find(|(name, _)| *name == n).unwrap().1.clone();
    let why = |snap: &CpuSnapshot, kind, prio, path: &str| {
        plan(snap, kind, prio, &Overrides::default())
            .unwrap()
            .rejected
            .into_iter()
            .find(|r| r.path.name() == path)
            .map(|r| r.why)
            .unwrap_or_default()
    };
    assert!(
        why(&get("sapphire_rapids_amx_refused"), CheckpointKind::GptqSym, Priority::Speed, "w4a8-amx")
            .contains("permission")
    );
    assert!(
        why(&get("zen4_avx512_off_in_xcr0"), CheckpointKind::CpuInt4, Priority::Speed, "w4a16-avx512").contains("XCR0")
    );
    assert!(
        why(&get("zen4"), CheckpointKind::Bf16, Priority::Speed, "w4a8-vnni").contains("group 32 with an 8-bit head")
    );
    assert!(why(&get("zen4"), CheckpointKind::GptqAsym, Priority::Fidelity, "w4a8-vnni").contains("fidelity"));
    assert!(why(&get("skylake_x"), CheckpointKind::GptqSym, Priority::Speed, "w4a8-vnni").contains("VNNI"));
    assert!(why(&get("haswell"), CheckpointKind::GptqSym, Priority::Speed, "w4a8-vnni").contains("AVX-512"));
    let spr = plan(&get("sapphire_rapids"), CheckpointKind::GptqSym, Priority::Speed, &Overrides::default()).unwrap();
    assert_eq!(
        (spr.path.name(), spr.decode.kernel.name(), spr.prefill.kernel.name()),
        ("w4a8-amx", "w4a8-vnni", "w4a8-amx")
    );
    let hsw = plan(&get("haswell"), CheckpointKind::GptqAsym, Priority::Speed, &Overrides::default()).unwrap();
    assert_eq!((hsw.path.name(), hsw.layout), ("w4a8-avx2", PackedLayout::W4a8Vnni));
    assert!(why(&get("haswell"), CheckpointKind::Bf16, Priority::Speed, "w4a16-avx512").contains("AVX-512"));
}

/// Speed priority takes W4A8 exactly where the measured rule says it keeps the model as well as W4A16
/// (docs/policy.md, "W4A8 by evidence"), on every W4A8 rung, and fidelity priority never does.
#[test]
fn speed_takes_w4a8_where_its_grid_keeps_the_model() {
    use int4_kernels::w4a8::ActivationScales::{PerGroup, PerToken};
    use int4_layout::GroupSize::{G32, G64, G128, G256, PerChannel};
    use int4_select::HeadBits::{Eight, Four};
    let cpus = [("zen4", "w4a8-vnni", "w4a16-avx512"), ("haswell", "w4a8-avx2", "w4a16-avx2")];
    let cpus = cpus.map(|(n, w4a8, w4a16)| (linux(n), w4a8, w4a16));
    let spr = linux("sapphire_rapids");
    for (kind, group, head_bits, activation_scales, takes_w4a8, why) in [
        // Quantized at load: group 32 with an 8-bit head keeps W4A16 (W4A8's KL 32x W4A16's)...
        (CheckpointKind::Bf16, G32, Eight, PerGroup, false, "group 32 with an 8-bit head"),
        // ... a 4-bit head or a coarser group does not (1.02-1.04x).
        (CheckpointKind::Bf16, G32, Four, PerGroup, true, ""),
        (CheckpointKind::Bf16, G64, Eight, PerGroup, true, ""),
        (CheckpointKind::Bf16, G128, Eight, PerGroup, true, ""),
        (CheckpointKind::Bf16, G256, Four, PerGroup, true, ""),
        // Per-token activation scales only from group 128 up (1.05-1.09x there, 1.11-1.54x finer)...
        (CheckpointKind::Bf16, G32, Four, PerToken, false, "per-token"),
        (CheckpointKind::Bf16, G64, Four, PerToken, false, "per-token"),
        (CheckpointKind::Bf16, G128, Eight, PerToken, true, ""),
        (CheckpointKind::Bf16, G256, Four, PerToken, true, ""),
        (CheckpointKind::Bf16, PerChannel, Eight, PerGroup, true, ""),
        // ... and where the load defaults rule W4A8 out as well, the reason is theirs (32x), not the
        // per-token one (which would wrongly promise that per-group scales match there).
        (CheckpointKind::Bf16, G32, Eight, PerToken, false, "group 32 with an 8-bit head"),
        // Checkpoints quantized already, integer or float zeros, any group and head: against the model
        // they were quantized from, W4A8 is within 1-2% of W4A16.
        (CheckpointKind::GptqSym, G32, Eight, PerGroup, true, ""),
        (CheckpointKind::GptqAsym, G128, Four, PerGroup, true, ""),
        (CheckpointKind::CpuInt4, G32, Eight, PerGroup, true, ""),
        (CheckpointKind::CpuInt4, G128, Eight, PerGroup, true, ""),
        (CheckpointKind::GptqSym, PerChannel, Four, PerToken, true, ""),
        (CheckpointKind::GptqSym, G32, Eight, PerToken, false, "per-token"),
        // Layers stored in 8 bits are close enough to the model that int8 activations dominate (3.6x).
        (CheckpointKind::EightBit, G32, Eight, PerGroup, false, "stored in 8 bits"),
    ] {
        let o = Overrides { group, head_bits, activation_scales, ..Overrides::default() };
        let case = format!("{kind:?} {group:?} {head_bits:?} {activation_scales:?}");
        for (cpu, w4a8, w4a16) in &cpus {
            let p = plan(cpu, kind, Priority::Speed, &o).unwrap();
            assert_eq!(p.path.name(), if takes_w4a8 { *w4a8 } else { *w4a16 }, "{case}");
            if !takes_w4a8 {
                let r = p.rejected.iter().find(|r| r.path.name() == *w4a8).expect("the W4A8 rung is reported");
                assert!(r.why.contains(why), "{case}: {}", r.why);
            }
            let p = plan(cpu, kind, Priority::Fidelity, &o).unwrap();
            assert_eq!(p.path.name(), *w4a16, "{case}, fidelity");
            // Forced, W4A8 runs whatever the rule says.
            let forced = Overrides { path: RunPath::W4a8, ..o };
            assert_eq!(plan(cpu, kind, Priority::Fidelity, &forced).unwrap().path.name(), *w4a8, "{case}, forced");
        }
        // On an AMX CPU the rule gates the AMX rung the same way.
        let p = plan(&spr, kind, Priority::Speed, &o).unwrap();
        assert_eq!(p.path.name() == "w4a8-amx", takes_w4a8, "{case}: {}", p.path);
    }
}

#[test]
fn overrides_caps_and_forced_paths() {
    let hsw = linux("haswell");
    let capped = Overrides { caps: IsaCaps::unrestricted().with_max_level(IsaLevel::Portable), ..Overrides::default() };
    let p = plan(&hsw, CheckpointKind::CpuInt4, Priority::Speed, &capped).unwrap();
    assert_eq!(p.path.name(), "wna16-portable");
    assert!(p.rejected.iter().any(|r| r.path.name() == "w4a16-avx2" && r.why.contains("INT4_ISA")));
    // Forcing W4A8 overrides the fidelity priority, and takes an unquantized checkpoint (quantized at load).
    let w4a8 = Overrides { path: RunPath::W4a8, ..Overrides::default() };
    let p = plan(&hsw, CheckpointKind::Bf16, Priority::Fidelity, &w4a8).unwrap();
    assert_eq!((p.path.name(), p.prefill.kernel.name()), ("w4a8-avx2", "w4a8-avx2"));
    // ... and a cpu_int4 checkpoint, whose float zeros run as the kernels' float offsets.
    let p = plan(&hsw, CheckpointKind::CpuInt4, Priority::Fidelity, &w4a8).unwrap();
    assert_eq!((p.path.name(), p.decode.kernel.name()), ("w4a8-avx2", "w4a8-avx2"));
    // A forced path keeps its numerics where no SIMD rung of it runs: its portable kernels (never
    // chosen automatically, which falls back to wna16), with every faster rung's reason reported.
    let sse = linux("sse_only");
    let p = plan(&sse, CheckpointKind::GptqSym, Priority::Speed, &w4a8).unwrap();
    assert_eq!(
        (p.path.name(), p.decode.kernel.name(), p.layout),
        ("w4a8-portable", "w4a8-portable", PackedLayout::W4a8Vnni)
    );
    assert!(p.rejected.iter().any(|r| r.path.name() == "w4a8-avx2" && r.why.contains("AVX2")), "{:?}", p.rejected);
    let w4a16 = Overrides { path: RunPath::W4a16, ..Overrides::default() };
    let p = plan(&sse, CheckpointKind::CpuInt4, Priority::Speed, &w4a16).unwrap();
    assert_eq!(
        (p.path.name(), p.decode.kernel.name(), p.prefill.kernel.name(), p.layout),
        ("w4a16-portable", "w4a16-decode-portable", "w4a16-prefill-portable", PackedLayout::Tinygemm32)
    );
    let p = plan(
        &hsw,
        CheckpointKind::CpuInt4,
        Priority::Speed,
        &Overrides { caps: IsaCaps::unrestricted().with_max_level(IsaLevel::Portable), ..w4a16 },
    )
    .unwrap();
    assert_eq!(p.path.name(), "w4a16-portable");
    assert!(p.rejected.iter().any(|r| r.path.name() == "w4a16-avx2" && r.why.contains("INT4_ISA")));
    let p = plan(&sse, CheckpointKind::CpuInt4, Priority::Speed, &Overrides::default()).unwrap();
    assert_eq!(p.path.name(), "wna16-portable");
    // A forced W4A8 on float zeros runs on every rung, the portable one included.
    let p = plan(&sse, CheckpointKind::CpuInt4, Priority::Speed, &w4a8).unwrap();
    assert_eq!(p.path.name(), "w4a8-portable");
    let p =
        plan(&sse, CheckpointKind::Bf16, Priority::Speed, &Overrides { path: RunPath::Bf16, ..Overrides::default() })
            .unwrap();
    assert_eq!(p.decode.kernel.name(), "dense-portable");
    // A feature taken away by INT4_DISABLE is taken from the plan too: the rung that needs it is rejected
    // with the reason, and the next one is taken (rather than a plan whose kernels cannot bind).
    let zen4 = linux("zen4");
    let no_avx512 = Overrides { caps: IsaCaps::unrestricted().without(Feature::Avx512), ..Overrides::default() };
    let p = plan(&zen4, CheckpointKind::CpuInt4, Priority::Fidelity, &no_avx512).unwrap();
    assert_eq!(p.path, Rung::W4a16Avx2);
    let why = p.rejected.iter().find(|r| r.path == Rung::W4a16Avx512).map(|r| r.why.clone()).unwrap_or_default();
    assert!(why.contains("w4a16-decode-avx512") && why.contains("INT4_DISABLE"), "{why}");
    let no_bf16 = Overrides { caps: IsaCaps::unrestricted().without(Feature::Avx512Bf16), ..Overrides::default() };
    let p = plan(&zen4, CheckpointKind::CpuInt4, Priority::Fidelity, &no_bf16).unwrap();
    assert_eq!(
        (p.path, p.decode.kernel, p.prefill.kernel),
        (Rung::W4a16Avx512, KernelId::W4a16DecodeAvx512, KernelId::W4a16PrefillDirectAvx512)
    );
    let no_vnni = Overrides { caps: IsaCaps::unrestricted().without(Feature::Avx512Vnni), ..Overrides::default() };
    assert_eq!(plan(&zen4, CheckpointKind::GptqSym, Priority::Speed, &no_vnni).unwrap().path, Rung::W4a16Avx512);
    // Precedence: the checkpoint's key, then the plan's measured default.
    let keyed = Overrides { dequant_threshold: Some(2), direct_dequant: Some(false), ..Overrides::default() };
    let p = plan(&hsw, CheckpointKind::CpuInt4, Priority::Fidelity, &keyed).unwrap();
    assert_eq!(
        (p.dequant_threshold, p.direct_dequant, p.prefill.kernel.name()),
        (2, false, "w4a16-prefill-halves-avx2")
    );
    let p = plan(&hsw, CheckpointKind::CpuInt4, Priority::Fidelity, &Overrides::default()).unwrap();
    assert_eq!(p.dequant_threshold, int4_kernels::w4a16::DEFAULT_DEQUANT_THRESHOLD);
}

/// The live probe on this host, printed; its features agree with the standard library's detection, and
/// whatever the plan picks can actually be built here (the capability tokens agree).
#[test]
fn live_probe_on_this_host() {
    let s = int4_select::probe::live();
    println!("{}", serde_json::to_string_pretty(&s).unwrap());
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(s.usable().avx2_fma, is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        assert_eq!(
            s.usable().avx512,
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
        );
    }
    // Whatever the live plan picks binds here, for every kind and path: the snapshot and the capability
    // tokens agree on what this CPU has.
    for kind in CheckpointKind::ALL {
        for path in RunPath::ALL {
            let o = Overrides { path, ..Overrides::default() };
            let p = plan(&s, kind, Priority::Speed, &o).unwrap();
            println!("{kind:?} {path}: {} {} {}", p.path, p.decode.kernel, p.prefill.kernel);
            if let Err(e) = p.kernels().bind(&IsaCaps::unrestricted()) {
                panic!("{kind:?} {path}: the live plan {} does not bind here: {e}", p.path);
            }
        }
    }
}

/// An override profile changes the plan only: a fake machine claiming AVX-512 gets a plan, but the kernels
/// are still built through tokens that check the live CPU, so asking for an AVX-512 kernel on a CPU without
/// it is an error, never an illegal instruction.
#[test]
fn override_profiles_change_decisions_not_instructions() {
    let fake = linux("zen4");
    let path = std::env::temp_dir().join(format!("int4-profile-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&fake).unwrap()).unwrap();
    let loaded = int4_select::load_profile(path.to_str().unwrap()).unwrap();
    assert!(loaded.source.starts_with("override:"));
    assert_eq!(loaded.cpu, fake.cpu);
    std::fs::remove_file(&path).unwrap();
    assert!(int4_select::load_profile("/nonexistent/profile.json").unwrap_err().to_string().contains("/nonexistent"));
    let codes = int4_layout_codes();
    let w = int4_kernels::w4a16::W4A16Weights::new(&codes.0, codes.1, int4_layout::tinygemm::TinygemmBlock::N64, true)
        .unwrap();
    let r = int4_kernels::w4a16::W4A16Linear::forced(
        w,
        None,
        Default::default(),
        IsaLevel::Avx512,
        &int4_kernels::isa::IsaCaps::unrestricted(),
    );
    // Whatever the profile claims, the kernel exists only if the live CPU has AVX-512.
    let live = int4_kernels::isa::Avx512::with_caps(&int4_kernels::isa::IsaCaps::unrestricted()).is_some();
    assert_eq!(r.is_ok(), live, "{r:?}");
    // The profile's plan names the Zen 4 kernels; they bind only where this CPU has AVX512-BF16.
    let p = plan(&loaded, CheckpointKind::CpuInt4, Priority::Fidelity, &Overrides::default()).unwrap();
    assert_eq!(p.decode.kernel, int4_kernels::KernelId::W4a16DecodeAvx512Bf16);
    let bound = p.kernels().bind(&IsaCaps::unrestricted());
    let bf16 = int4_kernels::isa::Avx512Bf16::with_caps(&IsaCaps::unrestricted()).is_some();
    assert_eq!(bound.is_ok(), bf16, "{bound:?}");
}

fn int4_layout_codes() -> (int4_layout::Codes, int4_layout::GroupParams) {
    let codes = int4_layout::Codes::from_fn(16, 32, |n, k| ((n + k) % 16) as u8).unwrap();
    let params =
        int4_layout::GroupParams::new(16, 32, int4_layout::GroupSize::G32, vec![0.1; 16], vec![0.0; 16]).unwrap();
    (codes, params)
}

/// The KV cache's type: f16 for speed on every path but the f32 reference, f32 for fidelity; names parse
/// back and nothing else does.
#[test]
fn the_kv_cache_is_f16_for_speed_and_f32_for_fidelity_and_the_reference() {
    use int4_select::policy::{KvType, kv_type};
    for path in RunPath::ALL {
        let speed = if path == RunPath::F32 { KvType::F32 } else { KvType::F16 };
        assert_eq!(kv_type(Priority::Speed, path), speed, "{path}");
        assert_eq!(kv_type(Priority::Fidelity, path), KvType::F32, "{path}");
    }
    for t in KvType::ALL {
        assert_eq!(t.name().parse::<KvType>(), Ok(t));
    }
    assert_eq!([KvType::F32.bytes(), KvType::F16.bytes()], [4, 2]);
    assert!("bf16".parse::<KvType>().unwrap_err().to_string().contains("expected f32 or f16"));
}
