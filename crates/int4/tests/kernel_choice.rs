//! The kernel a layer runs is the kernel its plan names: one author of the choice
//! (`int4_kernels::choice::choose`), which the policy calls with the CPU's recorded features and every layer
//! binds on the live CPU. Checked from what the layers recorded when they ran, not from a prediction.

use int4::kernels::LayerSpec;
use int4::kernels::isa::{Feature, FeatureSet, IsaCaps, IsaLevel};
use int4::select::policy::PackedLayout;
use int4::{Engine, LoadOptions, RunPath};
use int4_test_support::tiny_model;

/// Every distinct cap this machine offers under the process caps: each level that adds a feature, the
/// AVX-512 CPU classes without BF16 (Skylake-SP) and without VNNI, and AMX with AVX-512 disabled, where
/// this CPU has them.
fn caps_this_machine_offers() -> Vec<(String, IsaCaps)> {
    let base = *IsaCaps::process();
    let mut out: Vec<(String, IsaCaps)> = Vec::new();
    let mut seen: Vec<FeatureSet> = Vec::new();
    for level in [IsaLevel::Portable, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Amx] {
        let caps = base.with_max_level(level.min(base.max_level()));
        let features = FeatureSet::live(&caps);
        if !seen.contains(&features) {
            seen.push(features);
            out.push((level.name().to_string(), caps));
        }
    }
    let avx512 = base.with_max_level(IsaLevel::Avx512.min(base.max_level()));
    for f in [Feature::Avx512Bf16, Feature::Avx512Vnni] {
        let caps = avx512.without(f);
        let features = FeatureSet::live(&caps);
        if FeatureSet::live(&avx512).has(f) && !seen.contains(&features) {
            seen.push(features);
            out.push((format!("avx512 without {}", f.name()), caps));
        }
    }
    // AMX without AVX-512 (`INT4_DISABLE=avx512`): AMX-BF16 needs only AVX2, so its prefill stays beside
    // AVX2 kernels everywhere else.
    let amx = base.without(Feature::Avx512);
    let features = FeatureSet::live(&amx);
    if features.has(Feature::AmxBf16) && !seen.contains(&features) {
        seen.push(features);
        out.push(("amx without avx512".to_string(), amx));
    }
    out
}

/// For every cap the machine offers and every path, and for W4A16 also with the split-halves prefill: load
/// the tiny model with the caps in `LoadOptions`, run one prefill of `dequant_threshold` rows and one
/// decode, and compare what each linear layer recorded with the plan. The head runs on the last position
/// only, so it records decode alone.
#[test]
fn every_layer_runs_the_kernels_its_plan_names_at_every_isa_level() {
    // Room for the largest threshold (W4A8's AMX prefill starts at 64 rows) and the decode after it.
    const CONTEXT: usize = 2 * int4::kernels::w4a8::AMX_MIN_ROWS;
    let dir = tiny_model("kernel-choice");
    let offered = caps_this_machine_offers();
    assert!(!offered.is_empty());
    let mut checked = 0;
    for (name, caps) in &offered {
        for path in RunPath::ALL {
            for direct_dequant in [None, Some(false)] {
                if direct_dequant.is_some() && path != RunPath::W4a16 {
                    continue;
                }
                let opts = LoadOptions {
                    path,
                    caps: *caps,
                    cache: None,
                    context: CONTEXT,
                    direct_dequant,
                    ..LoadOptions::default()
                };
                let what = format!("caps {name}, path {path}, direct_dequant {direct_dequant:?}");
                let engine = Engine::load(&dir, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                let plan = engine.plan.clone();
                // The plan never names a kernel the caps forbid: it binds under them.
                plan.kernels().bind(caps).unwrap_or_else(|e| panic!("{what}: {e}"));
                let rows = plan.dequant_threshold.max(2);
                assert!(rows < CONTEXT, "{what}: a prefill of {rows} rows and a decode do not fit the context");
                let prompt: Vec<u32> = (0..rows as u32).map(|i| 1 + i % 90).collect();
                let mut kv = engine.new_cache().unwrap();
                engine.model.forward(&prompt, &mut kv, false).unwrap();
                engine.model.forward(&[7], &mut kv, false).unwrap();
                // The unquantized head is held at 8 bits (the default): on the W4A16 and portable paths it runs
                // the W8A16 kernels of the plan's own level as far as the caps leave, on W4A8 the same W4A8
                // kernel as two planes.
                let head_decode = match plan.layout {
                    PackedLayout::Tinygemm32 | PackedLayout::Tinygemm64 | PackedLayout::RowMajor => {
                        let eight = if plan.layout == PackedLayout::RowMajor {
                            let spec =
                                LayerSpec::W8a16 { prefill_from: int4::kernels::choice::W8A16_PREFILL_FROM_ROWS };
                            int4::kernels::choice::at_level(spec, IsaLevel::Portable, caps)
                        } else {
                            int4::kernels::choice::w8a16_beside(&plan.kernels(), caps)
                        };
                        let decode = eight.unwrap().choice().decode;
                        // Never above what the caps leave (AMX-BF16 needs only AVX2: without AVX-512 the
                        // head runs AVX2 beside the AMX prefill).
                        assert!(decode.level() <= caps.effective_level(), "{what}: head on {decode}");
                        decode
                    }
                    _ => plan.decode.kernel,
                };
                for d in engine.model.dispatched() {
                    let decode = if d.layer == "lm_head" { head_decode } else { plan.decode.kernel };
                    assert_eq!(d.decode, Some(decode), "{what}: {} decode", d.layer);
                    let prefill = if d.layer == "lm_head" { None } else { Some(plan.prefill.kernel) };
                    assert_eq!(d.prefill, prefill, "{what}: {} prefill", d.layer);
                    checked += 1;
                }
                eprintln!("{what}: {} decode {} prefill {}", plan.path, plan.decode.kernel, plan.prefill.kernel);
            }
        }
    }
    assert!(checked >= offered.len() * 7 * 9, "only {checked} layers checked");
}

/// The grid a load will run reaches the policy's W4A8 rule (docs/policy.md, "W4A8 by evidence"): an
/// unquantized checkpoint at the load defaults (group 32, an 8-bit head) stays on W4A16 under speed
/// priority; a coarser group or a 4-bit head takes W4A8, and per-token activation scales do so only from
/// group 128 up. Checked at the AVX2 level (where both families have a rung every x86-64 CI machine runs),
/// or, where the process caps allow no SIMD, on the portable fallback that both then share.
#[test]
fn the_load_grid_reaches_the_w4a8_rule() {
    use int4::HeadBits;
    use int4::kernels::w4a8::ActivationScales;
    use int4::layout::GroupSize;
    use int4::select::Rung;
    let dir = tiny_model("w4a8-rule");
    let caps = IsaCaps::process().with_max_level(IsaLevel::Avx2.min(IsaCaps::process().max_level()));
    let simd = FeatureSet::live(&caps).has(Feature::Avx2) && FeatureSet::live(&caps).has(Feature::Fma);
    let base = LoadOptions { caps, cache: None, context: 64, ..LoadOptions::default() };
    for (group_size, head_bits, activation_scales, w4a8) in [
        (GroupSize::G32, HeadBits::Eight, ActivationScales::PerGroup, false),
        (GroupSize::G32, HeadBits::Four, ActivationScales::PerGroup, true),
        (GroupSize::G64, HeadBits::Eight, ActivationScales::PerGroup, true),
        (GroupSize::G64, HeadBits::Four, ActivationScales::PerToken, false),
        (GroupSize::G128, HeadBits::Eight, ActivationScales::PerToken, true),
    ] {
        let opts = LoadOptions { group_size, head_bits, activation_scales, ..base.clone() };
        let plan = Engine::describe(&dir, &opts).unwrap().plan;
        let expected = match (simd, w4a8) {
            (false, _) => Rung::Wna16Portable,
            (true, true) => Rung::W4a8Avx2,
            (true, false) => Rung::W4a16Avx2,
        };
        assert_eq!(plan.path, expected, "{group_size:?} {head_bits:?} {activation_scales:?}: {:?}", plan.rejected);
        // And a load runs what was described.
        let engine = Engine::load(&dir, &opts).unwrap();
        assert_eq!(engine.plan.path, expected);
    }
}
