//! The runtime on a tiny random Llama checkpoint written by the test: every path agrees with the f32
//! reference within its error, incremental decoding equals a full forward, results do not depend on the
//! thread count, and bad inputs are clear errors.

use std::path::Path;

use int4::kernels::LayerSpec;
use int4::kernels::isa::{IsaCaps, IsaLevel};
use int4::kernels::w4a16::W4A16Config;
use int4::layout::GroupSize;
use int4::layout::tinygemm::TinygemmBlock;
use int4::{Checkpoint, HeadBits, Model, ModelConfig, Numerics, argmax};
use int4_test_support::{CONFIG, TempDir, tiny_model, tiny_model_with};

fn load(dir: &Path, numerics: Numerics) -> Model {
    let cfg = ModelConfig::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    Model::load(cfg, &Checkpoint::open(dir).unwrap(), numerics, None, None).unwrap()
}

fn w4a16(level: IsaLevel, threshold: usize) -> Numerics {
    let config = W4A16Config { dequant_threshold: threshold, direct_dequant: true };
    let spec = LayerSpec::W4a16 { block: TinygemmBlock::N32, direct_dequant: true, prefill_from: threshold };
    let kernels = int4::kernels::choice::at_level(spec, level, IsaCaps::process()).unwrap();
    let eight = LayerSpec::W8a16 { prefill_from: int4::kernels::choice::W8A16_PREFILL_FROM_ROWS };
    let eight = int4::kernels::choice::at_level(eight, level, IsaCaps::process()).unwrap();
    Numerics::W4a16 { block: TinygemmBlock::N32, group: GroupSize::G32, config, kernels, eight, head: HeadBits::Four }
}

fn levels() -> Vec<IsaLevel> {
    let mut v = vec![IsaLevel::Portable];
    if int4::kernels::isa::Avx2Fma::with_caps(IsaCaps::process()).is_some() {
        v.push(IsaLevel::Avx2);
    } else {
        eprintln!("runtime: SKIPPED the AVX2 kernels (not available on this machine or capped)");
        assert!(std::env::var("INT4_TEST_EVERYTHING").as_deref() != Ok("1"), "INT4_TEST_EVERYTHING=1 forbids skips");
    }
    v
}

const PROMPT: [u32; 12] = [1, 17, 33, 5, 90, 44, 12, 61, 7, 3, 80, 29];

#[test]
fn incremental_decoding_equals_one_full_forward() {
    let dir = tiny_model("incremental");
    for numerics in
        [Numerics::f32(IsaCaps::process()), Numerics::bf16(IsaCaps::process()), w4a16(*levels().last().unwrap(), 4)]
    {
        let model = load(&dir, numerics);
        let mut full = model.kv_cache(64, 1 << 30).unwrap();
        let all = model.forward(&PROMPT, &mut full, true).unwrap();
        let mut inc = model.kv_cache(64, 1 << 30).unwrap();
        let mut last = model.forward(&PROMPT[..5], &mut inc, false).unwrap();
        for &t in &PROMPT[5..] {
            last = model.forward(&[t], &mut inc, false).unwrap();
        }
        let v = model.config().vocab_size;
        let want = &all[(PROMPT.len() - 1) * v..];
        let worst = want.iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        // Decode rows run the decode kernel and a full forward the prefill kernel (at M >= 4), so the
        // 4-bit path differs by float rounding only; the dense paths use one kernel per M as well.
        assert!(worst < 2e-3, "{numerics:?}: incremental and full logits differ by {worst}");
        assert_eq!(argmax(want), argmax(&last));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every weight replaced by its 4-bit round trip (asymmetric grid, g32, no search): what the 4-bit paths
/// compute, up to float rounding.
fn dequantized(name: &str, w: Vec<f32>) -> Vec<f32> {
    // Every 2-D weight has K = 64 (the hidden size) except down_proj (K = the intermediate size, 160).
    let k = if name.ends_with("down_proj.weight") { 160 } else { 64 };
    let n = w.len() / k;
    let q = int4::layout::grid::quantize_asymmetric(
        &w,
        n,
        k,
        GroupSize::G32,
        int4::layout::grid::ScaleSearch::Off,
        int4::layout::grid::ParamPrecision::F32,
    )
    .unwrap();
    (0..n * k).map(|i| q.params.weight(i / k, i % k, q.codes.get(i / k, i % k))).collect()
}

#[test]
fn four_bit_paths_compute_the_dequantized_model() {
    let exact = tiny_model("paths-exact");
    let deq = tiny_model_with("paths-deq", dequantized);
    let reference = load(&deq, Numerics::f32(IsaCaps::process()));
    let mut c = reference.kv_cache(64, 1 << 30).unwrap();
    let want = reference.forward(&PROMPT, &mut c, true).unwrap();
    let norm = (want.iter().map(|x| x * x).sum::<f32>() / want.len() as f32).sqrt();
    for level in levels() {
        for numerics in [w4a16(level, 4), w4a16(level, 100), Numerics::wna16(GroupSize::G32)] {
            let m = load(&exact, numerics);
            let mut c = m.kv_cache(64, 1 << 30).unwrap();
            let got = m.forward(&PROMPT, &mut c, true).unwrap();
            let worst = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            // Same weights, different summation orders: float rounding only.
            assert!(
                worst < 1e-4 * norm.max(1.0) * 10.0,
                "{numerics:?}: differs from the dequantized f32 model by {worst}"
            );
            assert_eq!(
                (0..PROMPT.len()).map(|i| argmax(&got[i * 96..(i + 1) * 96])).collect::<Vec<_>>(),
                (0..PROMPT.len()).map(|i| argmax(&want[i * 96..(i + 1) * 96])).collect::<Vec<_>>(),
                "{numerics:?}"
            );
        }
    }
    std::fs::remove_dir_all(&exact).unwrap();
    std::fs::remove_dir_all(&deq).unwrap();
}

#[test]
fn greedy_tokens_are_identical_for_one_and_two_threads() {
    let dir = tiny_model("threads");
    let model = load(&dir, w4a16(*levels().last().unwrap(), 4));
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut c = model.kv_cache(64, 1 << 30).unwrap();
            let mut logits = model.forward(&PROMPT, &mut c, false).unwrap();
            let mut out = Vec::new();
            for _ in 0..20 {
                let t = argmax(&logits);
                out.push(t);
                logits = model.forward(&[t], &mut c, false).unwrap();
            }
            (out, logits)
        })
    };
    assert_eq!(run(1), run(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tiny_model("bad");
    let model = load(&dir, Numerics::f32(IsaCaps::process()));
    let mut c = model.kv_cache(8, 1 << 30).unwrap();
    let e = model.forward(&[1, 2, 96], &mut c, false).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    let e = model.forward(&[1; 9], &mut c, false).unwrap_err();
    assert!(e.to_string().contains("exceed the context"), "{e}");
    assert!(model.forward(&[], &mut c, false).is_err());
    let e = model.kv_cache(1 << 40, 1 << 30).unwrap_err();
    assert!(e.to_string().contains("KV cache"), "{e}");
    // Within the cap but beyond the machine's memory: refused before anything is allocated.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let per_position = model.kv_cache(1, usize::MAX).unwrap().bytes();
    let e = model.kv_cache(kib * 1024 / per_position + 1, usize::MAX).unwrap_err();
    assert!(e.to_string().contains("bytes of memory available"), "{e}");
    // A checkpoint missing a tensor, or with a wrong shape, names it.
    let cfg = ModelConfig::from_json(&CONFIG.replace("\"hidden_size\": 64", "\"hidden_size\": 32")).unwrap();
    let e =
        Model::load(cfg, &Checkpoint::open(&dir).unwrap(), Numerics::f32(IsaCaps::process()), None, None).unwrap_err();
    assert!(e.to_string().contains("shape"), "{e}");
    assert!(
        ModelConfig::from_json(r#"{"architectures": ["GPT2LMHeadModel"]}"#)
            .unwrap_err()
            .to_string()
            .contains("not supported")
    );
    assert!(ModelConfig::from_json("{").is_err());
    assert!(Checkpoint::open(&dir.join("nowhere")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_reads_v4_and_v5_spellings_and_llama3_rope() {
    let v4 = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 4, "vocab_size": 10, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, "torch_dtype": "bfloat16"}"#;
    let v5 = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 4, "vocab_size": 10,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "dtype": "bfloat16"}"#;
    let (a, b) = (ModelConfig::from_json(v4).unwrap(), ModelConfig::from_json(v5).unwrap());
    assert_eq!(a, b);
    assert_eq!(a.rope_theta, 500000.0);
    let f = a.rope_inv_freq();
    let plain = ModelConfig { rope_llama3: None, ..a.clone() }.rope_inv_freq();
    // High frequencies are kept, low ones divided by the factor.
    assert_eq!(f[0], plain[0]);
    assert!((f[f.len() - 1] - plain[plain.len() - 1] / 8.0).abs() < 1e-12);
    let q3 = ModelConfig::from_json(
        r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 10}"#,
    )
    .unwrap();
    assert_eq!(q3.head_dim, 32);
}

/// Sequences decoded together in one batch produce exactly the tokens each produces alone (greedy), on
/// every path, with prompts of different lengths so the batch's rows sit at different positions.
#[test]
fn batched_decoding_equals_each_sequence_alone() {
    use int4::{Engine, GenerationRequest, LoadOptions, Prompt, RunPath};
    let dir = tiny_model("batch");
    let prompts: Vec<Vec<u32>> = vec![PROMPT.to_vec(), vec![5, 6], PROMPT[3..9].to_vec()];
    for path in [RunPath::W4a16, RunPath::Wna16, RunPath::F32] {
        let e = Engine::load(&dir, &LoadOptions { path, context: 64, cache: None, ..LoadOptions::default() }).unwrap();
        let mut seen = vec![Vec::new(); prompts.len()];
        let requests = prompts.iter().map(|p| GenerationRequest::greedy(Prompt::Ids(p.clone()), 12)).collect();
        let batch = e.generate_batch(requests, |i, t| seen[i].push(t.id)).unwrap();
        // The batch must really decode together for a while, not stop at the first token.
        assert!(batch.iter().filter(|g| g.tokens.len() >= 6).count() >= 2, "{path:?}: {batch:?}");
        for (i, p) in prompts.iter().enumerate() {
            let alone = e.generate(GenerationRequest::greedy(Prompt::Ids(p.to_vec()), 12), |_| {}).unwrap();
            assert_eq!(batch[i].tokens, alone.tokens, "{path:?} sequence {i}");
            assert_eq!(batch[i].finish, alone.finish, "{path:?} sequence {i}");
            assert_eq!(seen[i], alone.tokens, "{path:?} sequence {i}: streamed tokens");
        }
    }
}

/// A callback can stop generation after any token (how stop strings end a run), and a full context is a
/// stop reason, not an error.
#[test]
fn a_callback_stops_generation_and_a_full_context_is_a_stop_reason() {
    use int4::{Engine, FinishReason, GenerationRequest, LoadOptions, Next, Prompt, RunPath};
    let dir = tiny_model("stop");
    let e = Engine::load(&dir, &LoadOptions { path: RunPath::F32, context: 16, cache: None, ..LoadOptions::default() })
        .unwrap();
    let mut n = 0;
    let out = e
        .generate(GenerationRequest::greedy(Prompt::Ids(vec![5, 6]), 10), |_| {
            n += 1;
            if n == 3 { Next::Stop } else { Next::Continue }
        })
        .unwrap();
    assert!(
        out.finish == FinishReason::Cancelled && out.tokens.len() == 3 || out.finish == FinishReason::Eos,
        "{out:?}"
    );
    let full = e.generate(GenerationRequest::greedy(Prompt::Ids(PROMPT.to_vec()), 100), |_| {}).unwrap();
    assert!(matches!(full.finish, FinishReason::ContextFull | FinishReason::Eos), "{full:?}");
    assert!(full.tokens.len() <= 16 - PROMPT.len() + 1);
    assert!(
        e.generate(GenerationRequest::greedy(Prompt::Ids([1; 17].to_vec()), 1), |_| {}).is_err(),
        "a prompt longer than the context"
    );
    assert!(e.generate(GenerationRequest::greedy(Prompt::Ids(Vec::new()), 1), |_| {}).is_err(), "an empty prompt");
}

/// A checkpoint split into shards with an index loads the same model as the single file, and the
/// end-of-sequence ids of `generation_config.json` join those of `config.json`.
#[test]
fn sharded_checkpoints_and_generation_config_eos() {
    use int4::{Engine, LoadOptions, RunPath};
    let single = tiny_model("shards-single");
    let ckpt = Checkpoint::open(&single).unwrap();
    let dir = TempDir::new("tiny-sharded");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(single.join(f), dir.join(f)).unwrap();
    }
    let names: Vec<String> = ckpt.tensors().into_iter().map(|(n, _)| n).collect();
    let mut weight_map = serde_json::Map::new();
    for (shard, chunk) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", shard + 1);
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = chunk
            .iter()
            .map(|n| {
                let shape = ckpt.shape(n).unwrap().to_vec();
                let v = ckpt.f32(n, &shape).unwrap();
                (n.clone(), shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
            })
            .collect();
        let views: std::collections::HashMap<String, safetensors::tensor::TensorView<'_>> = data
            .iter()
            .map(|(n, s, d)| {
                (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap())
            })
            .collect();
        safetensors::serialize_to_file(&views, None, &dir.join(&file)).unwrap();
        for n in chunk {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [2, 7]}"#).unwrap();
    let opts = LoadOptions { path: RunPath::W4a16, context: 32, cache: None, ..LoadOptions::default() };
    let (a, b) = (Engine::load(&single, &opts).unwrap(), Engine::load(&dir, &opts).unwrap());
    let run = |e: &Engine| {
        let mut kv = e.new_cache().unwrap();
        e.model.forward(&PROMPT, &mut kv, true).unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(&a), run(&b));
    assert_eq!(b.model.config().eos_token_ids, vec![2, 7]);
    assert_eq!(a.model.config().eos_token_ids, vec![2]);
}

/// A sharded checkpoint reads each tensor from the shard its `weight_map` names, even when another shard
/// (later by file name) holds a tensor of the same name; a shard name that leaves the directory is refused
/// before anything is opened.
#[test]
fn sharded_checkpoints_read_each_tensor_from_its_named_shard() {
    let dir = TempDir::new("tiny-shard-map");
    let write = |file: &str, value: f32| {
        let data: Vec<u8> = [value; 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data).unwrap();
        let views = std::collections::HashMap::from([("w".to_string(), view)]);
        safetensors::serialize_to_file(&views, None, &dir.join(file)).unwrap();
    };
    write("a.safetensors", 1.0);
    write("b.safetensors", 2.0);
    let index = |file: &str| serde_json::json!({"weight_map": {"w": file, "x": "b.safetensors"}}).to_string();
    std::fs::write(dir.join("model.safetensors.index.json"), index("a.safetensors")).unwrap();
    assert_eq!(Checkpoint::open(&dir).unwrap().f32("w", &[4]).unwrap(), vec![1.0; 4]);
    std::fs::write(dir.join("model.safetensors.index.json"), index("b.safetensors")).unwrap();
    assert_eq!(Checkpoint::open(&dir).unwrap().f32("w", &[4]).unwrap(), vec![2.0; 4]);
    for outside in ["../a.safetensors", "/etc/passwd", "sub/../../a.safetensors"] {
        std::fs::write(dir.join("model.safetensors.index.json"), index(outside)).unwrap();
        let e = Checkpoint::open(&dir).unwrap_err().to_string();
        assert!(e.contains("not a plain relative name"), "{outside}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One step of many sequences — decode rows beside prompt chunks, seventeen decode rows at once (past the
/// W4A16 prefill threshold of 16) — gives every sequence the logits it gets alone, bit for bit, on every
/// path: a row's kernel follows its role, not the size of the step.
#[test]
fn a_step_gives_every_sequence_the_logits_it_gets_alone() {
    use int4::{Engine, LoadOptions, RunPath, StepEntry};
    let dir = tiny_model("step");
    let prompts: Vec<Vec<u32>> = (0..17u32).map(|i| (0..=i).map(|j| (7 * i + 3 * j + 1) % 90 + 2).collect()).collect();
    let decode = [5u32, 6, 7];
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for path in [RunPath::W4a16, RunPath::Wna16, RunPath::W4a8, RunPath::Bf16, RunPath::F32] {
        let e = Engine::load(&dir, &LoadOptions { path, context: 64, cache: None, ..LoadOptions::default() }).unwrap();
        let m = &e.model;
        // Alone: the prompt, then three decode tokens.
        let alone: Vec<Vec<Vec<u32>>> = prompts
            .iter()
            .map(|p| {
                let mut c = e.new_cache().unwrap();
                let mut out = vec![bits(&m.forward(p, &mut c, false).unwrap())];
                for &t in &decode {
                    out.push(bits(&m.forward(&[t], &mut c, false).unwrap()));
                }
                out
            })
            .collect();
        // Together: the first nine prompts; then their first decode token beside the other eight prompts;
        // then every sequence's next tokens, seventeen decode rows at once.
        let mut caches: Vec<_> = (0..prompts.len()).map(|_| e.new_cache().unwrap()).collect();
        let vocab = m.config().vocab_size;
        let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
        let mut run = |which: Vec<(usize, Vec<u32>)>, caches: &mut Vec<int4::KvCache>| {
            let mut rest: Vec<Option<&mut int4::KvCache>> = caches.iter_mut().map(Some).collect();
            let mut entries: Vec<StepEntry> =
                which.iter().map(|(i, t)| StepEntry { tokens: t, cache: rest[*i].take().unwrap() }).collect();
            let logits = m.step(&mut entries).unwrap();
            for (j, (i, _)) in which.iter().enumerate() {
                got[*i].push(bits(&logits[j * vocab..(j + 1) * vocab]));
            }
        };
        run((0..9).map(|i| (i, prompts[i].clone())).collect(), &mut caches);
        run(
            (9..17).map(|i| (i, prompts[i].clone())).chain((0..9).map(|i| (i, vec![decode[0]]))).collect(),
            &mut caches,
        );
        run((9..17).map(|i| (i, vec![decode[0]])).chain((0..9).map(|i| (i, vec![decode[1]]))).collect(), &mut caches);
        run((0..17).map(|i| (i, vec![decode[if i < 9 { 2 } else { 1 }]])).collect(), &mut caches);
        run((9..17).map(|i| (i, vec![decode[2]])).collect(), &mut caches);
        for i in 0..prompts.len() {
            assert_eq!(got[i].len(), 4, "{path:?} sequence {i}");
            for (k, (a, b)) in got[i].iter().zip(&alone[i]).enumerate() {
                assert!(a == b, "{path:?} sequence {i} (prompt of {}), step {k}: logits differ", prompts[i].len());
            }
        }
    }
}
