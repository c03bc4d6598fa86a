//! GGUF checkpoints read as they are stored, on tiny Llama GGUFs whose every value the test knows
//! (`int4_test_support::gguf`): each type's tensors are the values ggml dequantizes them to, each packed
//! layer holds exactly those weights (4-bit types on the 4-bit layouts, Q5_0 and Q8_0 on the W8A16 kernels
//! or the W4A8 path's 8-bit planes), every path runs the file near its f32 run, the f32 run equals the run
//! of the file's f32 expansion bit for bit, the artifact cache keys a GGUF by its bytes, and a GGUF is
//! found in a directory or in a Hugging Face cache by repo id.

use std::path::Path;

use int4::cache::ArtifactStore;
use int4::select::policy::CheckpointKind;
use int4::{
    Checkpoint, Engine, GenerationRequest, LoadOptions, ModelConfig, ModelDir, PackedFrom, Prompt, QuantFormat,
    RunPath, TextCodec, linear_specs,
};
use int4_test_support::TempDir;
use int4_test_support::gguf::{TinyGguf, tiny_llama, ty};

fn scratch(name: &str) -> TempDir {
    TempDir::new(&format!("gguf-models-{name}"))
}

/// Every layer and the embedding in one type.
fn uniform(dir: &Path, t: u32, tied: bool) -> TinyGguf {
    tiny_llama(dir, &format!("tiny-{t}-{tied}.gguf"), tied, |_| t)
}

/// Like llama-quantize's Q4_K_M of a model whose rows are not multiples of 256: Q5_0 most places, Q8_0
/// for v, down and the head; and a Q4_0 k fused with a Q8_0 v.
fn k_quant_fallbacks(dir: &Path) -> TinyGguf {
    tiny_llama(dir, "tiny-q4_k_m-like.gguf", false, |name| {
        if name.contains("v_proj") || name.contains("down_proj") || name.contains("lm_head") {
            ty::Q8_0
        } else if name.contains("k_proj") {
            ty::Q4_0
        } else {
            ty::Q5_0
        }
    })
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[test]
fn every_type_reads_as_ggml_dequantizes_it() {
    let dir = scratch("types");
    for t in [ty::F32, ty::F16, ty::BF16, ty::Q4_0, ty::Q4_1, ty::Q5_0, ty::Q8_0] {
        for tied in [true, false] {
            let tiny = uniform(&dir, t, tied);
            let model = ModelDir::open(&tiny.path).unwrap();
            let cfg = ModelConfig::from_json(&model.config_text().unwrap()).unwrap();
            assert_eq!((cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads), (64, 2, 4, 2));
            assert_eq!(cfg.tie_word_embeddings, tied);
            let ckpt = Checkpoint::open_in(&model).unwrap();
            for (name, shape, want) in &tiny.expected {
                let got = ckpt.f32(name, shape).unwrap();
                assert!(same(&got, want), "type {t}: {name} differs from ggml's dequantization");
            }
            assert!(ckpt.f32("model.layers.0.mlp.up_proj.weight", &[64, 128]).is_err(), "a wrong shape is refused");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every linear of every packed path holds exactly the stored weights: a row decoded from the packed
/// layer equals ggml's dequantization of that row (the Q/K rows in Hugging Face order).
#[test]
fn packed_layers_hold_the_stored_weights_exactly() {
    let dir = scratch("exact");
    let mut files = vec![k_quant_fallbacks(&dir)];
    files.extend([ty::Q4_0, ty::Q4_1, ty::Q5_0, ty::Q8_0].map(|t| uniform(&dir, t, true)));
    let paths = [RunPath::W4a16, RunPath::Wna16, RunPath::W4a8];
    for tiny in &files {
        let model = ModelDir::open(&tiny.path).unwrap();
        let cfg = ModelConfig::from_json(&model.config_text().unwrap()).unwrap();
        let ckpt = Checkpoint::open_in(&model).unwrap();
        let format = QuantFormat::Gguf { kind: CheckpointKind::CpuInt4 };
        for path in paths {
            let opts = LoadOptions { path, cache: None, ..LoadOptions::default() };
            let numerics = match Engine::load(&tiny.path, &opts) {
                Ok(e) => e.model.numerics(),
                Err(e) => {
                    eprintln!("gguf_models: SKIPPED {path} on this machine: {e}");
                    assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "{e}");
                    continue;
                }
            };
            let specs = linear_specs(&cfg, &ckpt);
            for (i, spec) in specs.iter().enumerate() {
                let layer_numerics = spec.numerics(&ckpt, Some(&format), numerics, i + 1 == specs.len());
                let stored = spec.quantized(&ckpt, Some(&format)).unwrap().expect("every linear is stored quantized");
                let linear = int4::Linear::build_stored(&spec.name, stored, None, layer_numerics).unwrap();
                let want = spec.weights(&ckpt).unwrap();
                let mut row = vec![0.0f32; spec.k];
                for r in 0..spec.n {
                    linear.decode_row(r, &mut row).expect("a packed layer decodes its rows").unwrap();
                    assert!(
                        same(&row, &want[r * spec.k..(r + 1) * spec.k]),
                        "{}: {path} {} row {r} differs from the stored weights",
                        tiny.path.display(),
                        spec.name
                    );
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn first_logits(engine: &Engine, prompt: &[u32]) -> Vec<f32> {
    engine.generate(GenerationRequest::greedy(Prompt::Ids(prompt.to_vec()), 1), |_| {}).unwrap().first_logits
}

/// The f32 path on the GGUF is the f32 path on its expansion (`gguf_to_hf`), bit for bit; every packed
/// path stays near it (bf16 or int8 activations: within 5% of the logits' range).
#[test]
fn every_path_runs_a_gguf_near_its_f32_run() {
    let dir = scratch("paths");
    let prompt: Vec<u32> = (0..24).map(|i| 3 + (i * 37) % 250).collect();
    for tiny in [uniform(&dir, ty::Q4_1, true), k_quant_fallbacks(&dir)] {
        let load =
            |model: &Path, path| Engine::load(model, &LoadOptions { path, cache: None, ..LoadOptions::default() });
        let reference = first_logits(&load(&tiny.path, RunPath::F32).unwrap(), &prompt);
        let expanded = dir.join(format!("{}-hf", tiny.path.file_stem().unwrap().to_string_lossy()));
        int4::gguf::gguf_to_hf(&tiny.path, &expanded).unwrap();
        let via_expansion = first_logits(&load(&expanded, RunPath::F32).unwrap(), &prompt);
        assert!(same(&reference, &via_expansion), "f32 on the GGUF differs from f32 on its expansion");
        let range = reference.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for path in [RunPath::Bf16, RunPath::W4a16, RunPath::Wna16, RunPath::W4a8] {
            let Ok(engine) = load(&tiny.path, path) else {
                eprintln!("gguf_models: SKIPPED {path} (not available here)");
                continue;
            };
            let got = first_logits(&engine, &prompt);
            let worst = got.iter().zip(&reference).fold(0.0f32, |a, (g, r)| a.max((g - r).abs()));
            assert!(worst <= 0.05 * range, "{path}: logits off by {worst} (range {range})");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A GGUF's artifact is keyed by its bytes: a warm load maps what the cold one packed and runs the same
/// bits; another file under the same name is packed anew.
#[test]
fn the_artifact_cache_keys_a_gguf_by_its_bytes() {
    let dir = scratch("cache");
    let store = dir.join("store");
    let tiny = uniform(&dir, ty::Q4_1, true);
    let opts =
        || LoadOptions { path: RunPath::W4a16, cache: Some(ArtifactStore::new(&store)), ..LoadOptions::default() };
    let prompt = [5u32, 80, 120, 7, 9];
    let cold = Engine::load(&tiny.path, &opts()).unwrap();
    assert!(matches!(cold.packed_from, PackedFrom::Built(_)), "{:?}", cold.packed_from);
    let warm = Engine::load(&tiny.path, &opts()).unwrap();
    assert!(matches!(warm.packed_from, PackedFrom::Cache(_)), "{:?}", warm.packed_from);
    assert!(same(&first_logits(&cold, &prompt), &first_logits(&warm, &prompt)));
    // The same name, other weights (Q4_0): never the first file's artifact.
    let other = tiny_llama(&dir, "other.gguf", true, |_| ty::Q4_0);
    std::fs::rename(&other.path, &tiny.path).unwrap();
    let fresh = Engine::load(&tiny.path, &opts()).unwrap();
    assert!(matches!(fresh.packed_from, PackedFrom::Built(_)), "{:?}", fresh.packed_from);
    drop((cold, warm, fresh));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The tokenizer and chat template come from the GGUF's metadata.
#[test]
fn the_tokenizer_and_template_come_from_the_metadata() {
    let dir = scratch("text");
    let tiny = uniform(&dir, ty::Q8_0, true);
    let text = TextCodec::load(&tiny.path).unwrap();
    let ids = text.encode("hello world").unwrap();
    assert_eq!(text.decode(&ids).unwrap(), "hello world");
    assert_eq!(text.encode("<|im_start|>").unwrap(), [1], "a control token is one id");
    let mut messages = int4::Messages::new();
    messages.push("user", "hi");
    let chat = text.apply_chat_template(&messages, &int4::ChatOptions::default()).unwrap();
    assert_eq!(chat, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A directory holding one GGUF (and no config.json) is that GGUF; two are an error naming both; a repo id
/// in a Hugging Face cache laid out by the test resolves to the file its quant names.
#[test]
fn a_gguf_is_found_in_its_directory_and_by_repo_id() {
    let dir = scratch("found");
    let one = dir.join("one");
    std::fs::create_dir_all(&one).unwrap();
    let tiny = tiny_llama(&one, "model-Q4_1.gguf", true, |_| ty::Q4_1);
    let engine = Engine::load(&one, &LoadOptions { path: RunPath::F32, cache: None, ..LoadOptions::default() });
    assert_eq!(engine.unwrap().model.config().vocab_size, 261);
    tiny_llama(&one, "model-Q8_0.gguf", true, |_| ty::Q8_0);
    let e = Engine::load(&one, &LoadOptions::default()).unwrap_err().to_string();
    assert!(e.contains("model-Q4_1.gguf") && e.contains("model-Q8_0.gguf"), "{e}");

    // A hub cache: blobs, a snapshot of relative symlinks, refs/main.
    let hub = dir.join("hub");
    let repo = hub.join("models--someone--tiny-GGUF");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for (i, name) in ["model-Q4_1.gguf", "model-Q8_0.gguf"].iter().enumerate() {
        let blob = format!("{:064x}", i + 1);
        std::fs::copy(one.join(name), repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snapshot.join(name)).unwrap();
    }
    let cache = int4::hub::HubCache::at(&hub);
    let found = int4::hub::resolve_model_arg("someone/tiny-GGUF:q4_1", &cache).unwrap();
    assert_eq!(std::fs::read(found.path()).unwrap(), std::fs::read(&tiny.path).unwrap());
    let engine = Engine::load(found.path(), &LoadOptions { path: RunPath::F32, cache: None, ..LoadOptions::default() });
    assert_eq!(engine.unwrap().model.config().num_layers, 2);
    let e = int4::hub::resolve_model_arg("someone/tiny-GGUF", &cache).unwrap_err().to_string();
    assert!(e.contains("model-Q4_1.gguf") && e.contains("model-Q8_0.gguf"), "{e}");
    let e = int4::hub::resolve_model_arg("someone/absent", &cache).unwrap_err().to_string();
    assert!(e.contains("not in the Hugging Face cache"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fused layer whose parts cannot share one stored layout (q and k Q4_1, with float zeros; v Q8_0 — the
/// shape of llama-quantize's K-quant mixes, where a Q4_K q/k meets a Q6_K or Q8_0 v) is read exactly and
/// held at 8 bits, with a load note, on every path; the rest still runs as stored.
#[test]
fn a_fused_layer_of_mixed_forms_is_held_at_eight_bits() {
    let dir = scratch("mixed");
    let tiny = tiny_llama(&dir, "mixed.gguf", true, |name| if name.contains("v_proj") { ty::Q8_0 } else { ty::Q4_1 });
    let prompt: Vec<u32> = (0..16).map(|i| 3 + (i * 29) % 250).collect();
    let f32_logits = first_logits(
        &Engine::load(&tiny.path, &LoadOptions { path: RunPath::F32, cache: None, ..LoadOptions::default() }).unwrap(),
        &prompt,
    );
    let range = f32_logits.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    for path in [RunPath::W4a16, RunPath::Wna16, RunPath::W4a8] {
        let Ok(engine) = Engine::load(&tiny.path, &LoadOptions { path, cache: None, ..LoadOptions::default() }) else {
            eprintln!("gguf_models: SKIPPED {path} (not available here)");
            continue;
        };
        assert!(
            engine.warnings.iter().any(|w| w.contains("self_attn.qkv") && w.contains("held at 8 bits")),
            "{path}: {:?}",
            engine.warnings
        );
        let got = first_logits(&engine, &prompt);
        let worst = got.iter().zip(&f32_logits).fold(0.0f32, |a, (g, r)| a.max((g - r).abs()));
        assert!(worst <= 0.05 * range, "{path}: logits off by {worst} (range {range})");
        let kernels = engine.model.kernels(1);
        let qkv = kernels.iter().find(|k| k.layer.ends_with("qkv")).unwrap();
        let up = kernels.iter().find(|k| k.layer.ends_with("gate_up")).unwrap();
        if path != RunPath::W4a8 {
            assert!(qkv.decode.name().starts_with("w8a16"), "{path}: qkv runs {}", qkv.decode);
            assert!(!up.decode.name().starts_with("w8a16"), "{path}: gate_up runs {}", up.decode);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What the W4A8 rule is told about a GGUF: a file whose decoder layers are 4-bit as stored is a quantized
/// checkpoint (W4A8 with speed priority); one whose layers are stored unquantized and only its head
/// block-quantized is quantized at load like an unquantized checkpoint, so the load defaults (group 32,
/// 8-bit head) keep it on W4A16; and one whose layers are all stored in 8 bits stays on W4A16 too
/// (docs/policy.md, "W4A8 by evidence"). Planned at the AVX2 level, which
/// every x86-64 CI machine runs, or on the portable fallback both share where the caps allow no SIMD.
#[test]
fn a_gguf_with_unquantized_layers_is_planned_as_quantized_at_load() {
    use int4::kernels::isa::{Feature, FeatureSet, IsaCaps, IsaLevel};
    use int4::select::Rung;
    let dir = scratch("rule");
    let q4_0 = uniform(&dir, ty::Q4_0, true);
    let q8_0 = uniform(&dir, ty::Q8_0, true);
    let head_only = |name: &str| if name.contains("lm_head") { ty::Q8_0 } else { ty::F16 };
    let f16_layers = tiny_llama(&dir, "tiny-f16-q8-head.gguf", false, head_only);
    let caps = IsaCaps::process().with_max_level(IsaLevel::Avx2.min(IsaCaps::process().max_level()));
    let simd = FeatureSet::live(&caps).has(Feature::Avx2) && FeatureSet::live(&caps).has(Feature::Fma);
    let opts = LoadOptions { caps, cache: None, context: 64, ..LoadOptions::default() };
    for (tiny, w4a8) in [(&q4_0, true), (&f16_layers, false), (&q8_0, false)] {
        let info = Engine::describe(&tiny.path, &opts).unwrap();
        let expected = match (simd, w4a8) {
            (false, _) => Rung::Wna16Portable,
            (true, true) => Rung::W4a8Avx2,
            (true, false) => Rung::W4a16Avx2,
        };
        assert_eq!(info.plan.path, expected, "{}: {:?}", tiny.path.display(), info.plan.rejected);
    }
}
