//! Loading quantized checkpoints — GPTQ (symmetric v1, asymmetric v2, act-order), AWQ and `cpu_int4` —
//! written by the test from the tiny random model with the layout crate's packers, beside a plain f32
//! checkpoint of the same weights dequantized by the test (`(q − z)·s`, in the checkpoint's own K order).
//!
//! The f32 path on the quantized checkpoint must reproduce the dequantized checkpoint bit for bit (every
//! tensor read, unpacked, un-permuted and dequantized right); the 4-bit paths must compute the same model
//! within their error budget (the codes packed as they are, act-order applied to the activations).

use std::collections::HashMap;
use std::path::Path;

use int4::Checkpoint;
use int4::cache::ArtifactStore;
use int4::layout::gptq::{self, ZeroFormat};
use int4::layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric, quantize_integer_zero, quantize_symmetric};
use int4::layout::{GroupSize, rowmajor};
use int4::{Engine, KvType, LoadOptions, PackedFrom, RunPath};
use int4_test_support::{CONFIG, TempDir, tiny_model};
use safetensors::tensor::{Dtype, TensorView};

const PROMPT: [u32; 12] = [1, 17, 33, 5, 90, 44, 12, 61, 7, 3, 80, 29];
const G: GroupSize = GroupSize::G32;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    GptqSymV1,
    GptqAsymV2,
    GptqActOrder,
    Awq,
    CpuInt4,
}

/// `(name, dtype, shape, bytes)` of one tensor to write.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()
}
fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
/// `[N][G]` → `[G][N]`.
fn transpose(v: &[f32], n: usize, g: usize) -> Vec<f32> {
    (0..g * n).map(|i| v[(i % n) * g + i / n]).collect()
}

/// A fixed permutation of K for each distinct input (so q/k/v, and gate/up, share one, as GPTQ's do).
fn scramble(k: usize, seed: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..k).collect();
    let mut s = seed as u64 * 0x9E37_79B9 + 7;
    for i in (1..k).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p.swap(i, (s % (i as u64 + 1)) as usize);
    }
    p
}

/// Quantizes one linear `w` (`[n][k]`) in `format`: its tensors under `prefix`, and the dequantized weights.
fn quantize_linear(
    prefix: &str,
    w: &[f32],
    n: usize,
    k: usize,
    format: Format,
    seed: usize,
) -> (Vec<Tensor>, Vec<f32>) {
    let groups = G.groups(k);
    let mut out = Vec::new();
    let mut deq = vec![0.0f32; n * k];
    let t = |s: &str| format!("{prefix}.{s}");
    match format {
        Format::GptqSymV1 | Format::GptqActOrder => {
            // Act-order quantizes the columns in the order `perm` and stores which group each came from.
            let perm: Vec<usize> = if format == Format::GptqActOrder { scramble(k, seed) } else { (0..k).collect() };
            let wp: Vec<f32> = (0..n * k).map(|i| w[(i / k) * k + perm[i % k]]).collect();
            let q = quantize_symmetric(&wp, n, k, G, ScaleSearch::Off, ParamPrecision::F16).unwrap();
            let codes =
                int4::layout::Codes::from_fn(n, k, |r, c| q.codes.get(r, perm.iter().position(|&p| p == c).unwrap()))
                    .unwrap();
            for r in 0..n {
                for (i, &c) in perm.iter().enumerate() {
                    deq[r * k + c] = (f32::from(q.codes.get(r, i)) - 8.0) * q.params.scale(r, i / 32);
                }
            }
            let qw = gptq::pack_qweight(&codes).unwrap();
            let qz = gptq::pack_qzeros(&vec![8u8; groups * n], groups, n, ZeroFormat::V1).unwrap();
            out.push((t("qweight"), Dtype::I32, vec![k / 8, n], i32_bytes(&qw)));
            out.push((t("qzeros"), Dtype::I32, vec![groups, n / 8], i32_bytes(&qz)));
            out.push((t("scales"), Dtype::F16, vec![groups, n], f16_bytes(&transpose(q.params.scales(), n, groups))));
            let mut g_idx = vec![0i32; k];
            for (i, &c) in perm.iter().enumerate() {
                g_idx[c] = (i / 32) as i32;
            }
            out.push((t("g_idx"), Dtype::I32, vec![k], i32_bytes(&g_idx)));
        }
        Format::GptqAsymV2 | Format::Awq => {
            let q = quantize_integer_zero(w, n, k, G, ScaleSearch::Off, ParamPrecision::F16).unwrap();
            for (i, d) in deq.iter_mut().enumerate() {
                let (r, c) = (i / k, i % k);
                let gi = r * groups + c / 32;
                *d = (f32::from(q.codes.get(r, c)) - f32::from(q.zero_points.as_deref().unwrap()[gi]))
                    * q.params.scales()[gi];
            }
            let zp_gn: Vec<u8> =
                (0..groups * n).map(|i| q.zero_points.as_deref().unwrap()[(i % n) * groups + i / n]).collect();
            let scales = f16_bytes(&transpose(q.params.scales(), n, groups));
            if format == Format::Awq {
                let kn: Vec<u8> = (0..k * n).map(|i| q.codes.get(i % n, i / n)).collect();
                out.push((t("qweight"), Dtype::I32, vec![k, n / 8], i32_bytes(&gptq::pack_awq(&kn, k, n).unwrap())));
                out.push((
                    t("qzeros"),
                    Dtype::I32,
                    vec![groups, n / 8],
                    i32_bytes(&gptq::pack_awq(&zp_gn, groups, n).unwrap()),
                ));
            } else {
                let qz = gptq::pack_qzeros(&zp_gn, groups, n, ZeroFormat::V2).unwrap();
                out.push((t("qweight"), Dtype::I32, vec![k / 8, n], i32_bytes(&gptq::pack_qweight(&q.codes).unwrap())));
                out.push((t("qzeros"), Dtype::I32, vec![groups, n / 8], i32_bytes(&qz)));
            }
            out.push((t("scales"), Dtype::F16, vec![groups, n], scales));
        }
        Format::CpuInt4 => {
            let q = quantize_asymmetric(w, n, k, G, ScaleSearch::Off, ParamPrecision::Bf16).unwrap();
            for (i, d) in deq.iter_mut().enumerate() {
                *d = q.params.weight(i / k, i % k, q.codes.get(i / k, i % k));
            }
            let bf = |v: &[f32]| v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect::<Vec<u8>>();
            out.push((t("weight_packed"), Dtype::U8, vec![n, k / 2], rowmajor::pack(&q.codes).unwrap()));
            out.push((t("weight_scale"), Dtype::BF16, vec![n, groups], bf(q.params.scales())));
            out.push((t("weight_zero"), Dtype::BF16, vec![n, groups], bf(q.params.zeros())));
        }
    }
    (out, deq)
}

fn write(dir: &Path, config: &serde_json::Value, tensors: &[Tensor], tokenizer_from: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(tokenizer_from.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let views: HashMap<String, TensorView<'_>> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &dir.join("model.safetensors")).unwrap();
}

/// The tiny model quantized in `format` (untied head, quantized too unless `tied`), and the same weights
/// dequantized as a plain f32 checkpoint.
fn checkpoints(name: &str, format: Format, tied: bool) -> (TempDir, TempDir) {
    let src = tiny_model(&format!("q-src-{name}"));
    let ckpt = Checkpoint::open(&src).unwrap();
    let (h, inter, vocab) = (64usize, 160usize, 96usize);
    let mut quant: Vec<Tensor> = Vec::new();
    let mut plain: Vec<Tensor> = Vec::new();
    let dense = |n: &str, shape: Vec<usize>, quant: &mut Vec<Tensor>, plain: &mut Vec<Tensor>| {
        let v = ckpt.f32(n, &shape).unwrap();
        quant.push((n.into(), Dtype::F32, shape.clone(), f32_bytes(&v)));
        plain.push((n.into(), Dtype::F32, shape, f32_bytes(&v)));
    };
    dense("model.embed_tokens.weight", vec![vocab, h], &mut quant, &mut plain);
    dense("model.norm.weight", vec![h], &mut quant, &mut plain);
    let mut linears: Vec<(String, usize, usize, usize)> = Vec::new();
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        dense(&format!("{p}.input_layernorm.weight"), vec![h], &mut quant, &mut plain);
        dense(&format!("{p}.post_attention_layernorm.weight"), vec![h], &mut quant, &mut plain);
        for (t, n, k, input) in [
            ("self_attn.q_proj", 64, h, 0),
            ("self_attn.k_proj", 32, h, 0),
            ("self_attn.v_proj", 32, h, 0),
            ("self_attn.o_proj", h, 64, 1),
            ("mlp.gate_proj", inter, h, 2),
            ("mlp.up_proj", inter, h, 2),
            ("mlp.down_proj", h, inter, 3),
        ] {
            linears.push((format!("{p}.{t}"), n, k, 10 * l + input));
        }
    }
    if !tied {
        // The untied head: the embedding's values, stored (and quantized) as lm_head.
        linears.push(("lm_head".into(), vocab, h, 99));
    }
    for (prefix, n, k, input) in linears {
        let src_name =
            if prefix == "lm_head" { "model.embed_tokens.weight".to_string() } else { format!("{prefix}.weight") };
        let w = ckpt.f32(&src_name, &[n, k]).unwrap();
        let (tensors, deq) = quantize_linear(&prefix, &w, n, k, format, input);
        quant.extend(tensors);
        plain.push((format!("{prefix}.weight"), Dtype::F32, vec![n, k], f32_bytes(&deq)));
    }
    let mut config: serde_json::Value = serde_json::from_str(CONFIG).unwrap();
    config["tie_word_embeddings"] = tied.into();
    let plain_dir = TempDir::new(&format!("q-{name}-plain"));
    write(&plain_dir, &config, &plain, &src);
    config["quantization_config"] = match format {
        Format::GptqSymV1 => serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": true,
            "desc_act": false, "lm_head": !tied, "damp_percent": 0.01}),
        Format::GptqActOrder => serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": true,
            "desc_act": true, "lm_head": !tied}),
        Format::GptqAsymV2 => serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": false,
            "checkpoint_format": "gptq_v2", "lm_head": !tied}),
        Format::Awq => serde_json::json!({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": true,
            "version": "gemm"}),
        Format::CpuInt4 => serde_json::json!({"quant_method": "cpu_int4", "bits": 4, "group_size": 32}),
    };
    let quant_dir = TempDir::new(&format!("q-{name}-quant"));
    write(&quant_dir, &config, &quant, &src);
    (quant_dir, plain_dir)
}

/// An engine on `path` whose KV cache keeps f32 on every path, so that what these tests compare with the
/// dense reference is the kernels' arithmetic alone.
fn engine(dir: &Path, path: RunPath, cache: Option<&Path>) -> Engine {
    let opts = LoadOptions {
        path,
        context: 64,
        cache: cache.map(ArtifactStore::new),
        kv: Some(KvType::F32),
        ..LoadOptions::default()
    };
    Engine::load(dir, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn logits(e: &Engine) -> Vec<f32> {
    let mut kv = e.new_cache().unwrap();
    e.model.forward(&PROMPT, &mut kv, true).unwrap()
}

#[test]
fn every_format_reads_exactly_and_runs_on_the_four_bit_paths() {
    for format in [Format::GptqSymV1, Format::GptqAsymV2, Format::GptqActOrder, Format::Awq, Format::CpuInt4] {
        let (quant, plain) = checkpoints(&format!("{format:?}"), format, false);
        let want = logits(&engine(&plain, RunPath::F32, None));
        let got = logits(&engine(&quant, RunPath::F32, None));
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{format:?}: the f32 path on the quantized checkpoint differs from the dequantized one by {diff}"
        );
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for path in [RunPath::W4a16, RunPath::Wna16] {
            let e = engine(&quant, path, None);
            assert!(e.warnings.is_empty(), "{format:?} {path:?}: {:?}", e.warnings);
            let got = logits(&e);
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            // The kernels accumulate in f32 in another order than the dense reference: a few ulps of the
            // logit scale over K ≤ 160, through two layers. Kernels that round the activations to bf16
            // (W4A16 with AVX512-BF16) move this random model's logits by up to about 1% of their scale.
            let bf16 = e
                .model
                .kernels(PROMPT.len())
                .iter()
                .any(|l| [l.decode, l.prefill].iter().any(|k| k.name().contains("bf16")));
            let tolerance = if bf16 { 2e-2 } else { 1e-5 };
            assert!(worst <= scale * tolerance, "{format:?} {path:?}: logits differ by {worst} (scale {scale})");
        }
    }
}

/// W4A8 reads the integer zero points as stored (symmetric, asymmetric v2, act-order, AWQ) and a
/// cpu_int4 checkpoint's float zeros (as offsets), runs every linear layer, head included, on a W4A8
/// kernel, and stays close to the f32 path on the dequantized weights (the only difference is int8
/// activations); cold and warm cached loads compute the same bits.
#[test]
fn quantized_checkpoints_run_w4a8_on_their_stored_codes() {
    for format in [Format::GptqSymV1, Format::GptqAsymV2, Format::GptqActOrder, Format::Awq, Format::CpuInt4] {
        let (quant, plain) = checkpoints(&format!("w4a8-{format:?}"), format, false);
        let want = logits(&engine(&plain, RunPath::F32, None));
        let e = engine(&quant, RunPath::W4a8, None);
        assert!(e.warnings.is_empty(), "{format:?}: {:?}", e.warnings);
        for l in e.model.kernels(64) {
            for k in [l.decode, l.prefill] {
                assert!(k.name().starts_with("w4a8-"), "{format:?}: {} runs {k}", l.layer);
            }
        }
        let got = logits(&e);
        let signal: f64 = want.iter().map(|v| f64::from(*v).powi(2)).sum();
        let noise: f64 = want.iter().zip(&got).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        let snr = 10.0 * (signal / noise).log10();
        println!("{format:?}: W4A8 logits SNR {snr:.1} dB against f32");
        // Two layers of int8 activations (about 40 dB each on Gaussian-like rows, less with outliers).
        assert!(snr > 25.0, "{format:?}: W4A8 logits SNR {snr:.1} dB against f32");
        let dir = TempDir::new(&format!("q-w4a8-cache-{format:?}"));
        let (cold, warm) = (engine(&quant, RunPath::W4a8, Some(&dir)), engine(&quant, RunPath::W4a8, Some(&dir)));
        assert!(matches!(warm.packed_from, PackedFrom::Cache(_)), "{:?}", warm.packed_from);
        assert_eq!(logits(&cold), got);
        assert_eq!(logits(&warm), got);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A GPTQ export with a tied head on W4A8: the head is untied and quantized at load, so no linear layer
/// runs outside a 4-bit kernel, and the embedding lookup reads the same 4-bit rows.
#[test]
fn a_tied_head_runs_in_four_bits_on_w4a8_too() {
    let (quant, _) = checkpoints("w4a8-tied", Format::GptqSymV1, true);
    let e = engine(&quant, RunPath::W4a8, None);
    assert!(e.warnings.iter().any(|w| w.contains("lm_head") && w.contains("quantized at load")), "{:?}", e.warnings);
    let kernels = e.model.kernels(64);
    assert!(kernels.iter().any(|l| l.layer == "lm_head"), "the head is a linear layer");
    for l in kernels {
        assert!(l.decode.name().starts_with("w4a8-") && l.prefill.name().starts_with("w4a8-"), "{}", l.layer);
    }
    assert!(logits(&e).iter().all(|v| v.is_finite()));
}

#[test]
fn a_tied_unquantized_head_is_quantized_at_load_with_a_warning_and_act_order_survives_the_cache() {
    let (quant, _) = checkpoints("tied", Format::GptqActOrder, true);
    let e = engine(&quant, RunPath::W4a16, None);
    assert!(e.warnings.iter().any(|w| w.contains("lm_head") && w.contains("quantized at load")), "{:?}", e.warnings);
    let dir = TempDir::new("q-cache");
    let cold = engine(&quant, RunPath::W4a16, Some(&dir));
    let warm = engine(&quant, RunPath::W4a16, Some(&dir));
    assert!(matches!(cold.packed_from, PackedFrom::Built(_)) && matches!(warm.packed_from, PackedFrom::Cache(_)));
    let want = logits(&e);
    assert_eq!(logits(&cold), want);
    assert_eq!(logits(&warm), want);
}

#[test]
fn bad_quantized_checkpoints_are_clear_errors() {
    let (quant, _) = checkpoints("bad", Format::GptqSymV1, false);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(quant.join("config.json")).unwrap()).unwrap();
    let try_config = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(quant.join("config.json"), c.to_string()).unwrap();
        let r = Engine::load(
            &quant,
            &LoadOptions { path: RunPath::W4a16, context: 64, cache: None, ..LoadOptions::default() },
        );
        r.err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert!(try_config(&|c| c["quantization_config"]["bits"] = 8.into()).contains("bits"));
    assert!(
        try_config(&|c| c["quantization_config"]["quant_method"] = "bitsandbytes".into()).contains("not supported")
    );
    assert!(try_config(&|c| c["quantization_config"]["group_size"] = 64.into()).contains("shape"));
    assert!(
        try_config(&|c| c["quantization_config"]["checkpoint_format"] = "marlin".into()).contains("checkpoint_format")
    );
}

/// An older GPTQ export keeps its settings in `quantize_config.json` (without `quant_method`) rather than
/// in `config.json`: it loads the same model.
#[test]
fn quantize_config_json_is_read_when_config_json_has_none() {
    let (quant, _) = checkpoints("sidecar", Format::GptqAsymV2, false);
    let want = logits(&engine(&quant, RunPath::W4a16, None));
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(quant.join("config.json")).unwrap()).unwrap();
    let mut q = config.as_object_mut().unwrap().remove("quantization_config").unwrap();
    q.as_object_mut().unwrap().remove("quant_method");
    std::fs::write(quant.join("config.json"), config.to_string()).unwrap();
    std::fs::write(quant.join("quantize_config.json"), q.to_string()).unwrap();
    let e = engine(&quant, RunPath::W4a16, None);
    assert_eq!(logits(&e), want);
}

/// The same tied GPTQ export with `head_bits: Eight`: the layers run as stored, the head (and the
/// embedding lookup through it) in 8 bits on the W4A8 kernels; the load says so, the head holds about
/// twice the bytes, and the logits come closer to the f32 path on the dequantized checkpoint.
#[test]
fn a_tied_head_can_be_held_in_eight_bits_on_w4a8() {
    use int4::HeadBits;
    let (quant, plain) = checkpoints("w4a8-tied-h8", Format::GptqSymV1, true);
    let want = logits(&engine(&plain, RunPath::F32, None));
    let four =
        LoadOptions { path: RunPath::W4a8, context: 64, cache: None, head_bits: HeadBits::Four, ..Default::default() };
    let four = Engine::load(&quant, &four).unwrap();
    let opts = LoadOptions {
        path: RunPath::W4a8,
        context: 64,
        cache: None,
        head_bits: HeadBits::Eight,
        ..LoadOptions::default()
    };
    let eight = Engine::load(&quant, &opts).unwrap();
    assert!(eight.warnings.iter().any(|w| w.contains("lm_head") && w.contains("8 bits")), "{:?}", eight.warnings);
    for l in eight.model.kernels(64) {
        assert!(l.decode.name().starts_with("w4a8-") && l.prefill.name().starts_with("w4a8-"), "{}", l.layer);
    }
    assert!(eight.model.weight_bytes() > four.model.weight_bytes());
    let err = |e: &Engine| -> f64 { logits(e).iter().zip(&want).map(|(a, b)| f64::from(a - b).powi(2)).sum() };
    let (e4, e8) = (err(&four), err(&eight));
    assert!(e8 < e4, "8-bit head error {e8} is not below the 4-bit head's {e4}");
}
