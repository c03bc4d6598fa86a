//! `int4_quant::export`: the `cpu_int4` and GPTQ checkpoint writers, checked through the runtime's readers.
//!
//! The tiny random model is exported in each format; the test decodes the written bytes itself, following
//! the documented layouts (not the library's decoders), into a plain f32 checkpoint. The f32 path on the
//! export must give exactly that checkpoint's logits (the readers see what the writer meant), the report's
//! SNR must be the SNR of those decoded weights, and the zero-point conventions, the untied head and the
//! errors are checked as stored.

use std::collections::HashMap;
use std::path::Path;

use int4::{Checkpoint, Engine, IntegerZeros, LoadOptions, QuantFormat, RunPath, read_linear};
use int4_layout::GroupSize;
use int4_layout::gptq::{self, ZeroFormat};
use int4_layout::grid::{ParamPrecision, ScaleSearch, quantize_integer_zero};
use int4_quant::export::{ExportFormat, QuantizeErrorKind, QuantizeOptions, QuantizeReport, quantize_checkpoint};
use int4_test_support::{CONFIG, TempDir, tiny_model, tiny_model_with};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::Value;

const PROMPT: [u32; 12] = [1, 17, 33, 5, 90, 44, 12, 61, 7, 3, 80, 29];

/// `name → (dtype, shape, bytes)` of a safetensors file.
type Tensors = HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

fn scratch(name: &str) -> TempDir {
    TempDir::unmade(&format!("qw-{name}"))
}

fn opts(format: ExportFormat, asym: bool, group: GroupSize) -> QuantizeOptions {
    QuantizeOptions { asym, group, ..QuantizeOptions::new(format) }
}

fn export(src: &Path, name: &str, o: &QuantizeOptions) -> (TempDir, QuantizeReport) {
    let out = scratch(name);
    let report = quantize_checkpoint(src, &out, o, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    (out, report)
}

/// Reads the output's `model.safetensors`, checking it with the safetensors crate and checking that every
/// tensor starts aligned to its element size.
fn read_tensors(dir: &Path) -> Tensors {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let base = bytes.as_ptr() as usize;
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            let at = v.data().as_ptr() as usize - base;
            assert_eq!(at % (v.dtype().bitsize() / 8).max(1), 0, "{name} at byte {at} is not aligned");
            (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        })
        .collect()
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
fn f16s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}
fn as_f32(dtype: Dtype, b: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => f32s(b),
        Dtype::F16 => f16s(b),
        Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => panic!("not a float dtype: {other:?}"),
    }
}
fn nibble(word: i32, i: usize) -> u32 {
    (word as u32 >> (4 * i)) & 0xF
}

/// A `cpu_int4` layer decoded by hand: nibble `k % 2` of byte `n·K/2 + k/2`, `(q − 8)·s + z`.
fn decode_cpu_int4(t: &Tensors, p: &str, n: usize, k: usize, g_len: usize) -> Vec<f32> {
    let groups = k.div_ceil(g_len);
    let packed = &t[&format!("{p}.weight_packed")];
    let (scale, zero) = (&t[&format!("{p}.weight_scale")], &t[&format!("{p}.weight_zero")]);
    assert_eq!((packed.0, &packed.1), (Dtype::U8, &vec![n, k / 2]), "{p}");
    assert_eq!((scale.0, &scale.1, zero.0, &zero.1), (Dtype::F32, &vec![n, groups], Dtype::F32, &vec![n, groups]));
    let (s, z) = (f32s(&scale.2), f32s(&zero.2));
    let mut w = vec![0.0f32; n * k];
    for row in 0..n {
        for kk in 0..k {
            let byte = packed.2[row * k / 2 + kk / 2];
            let q = if kk % 2 == 0 { byte & 0xF } else { byte >> 4 };
            let g = row * groups + kk / g_len;
            w[row * k + kk] = (f32::from(q) - 8.0) * s[g] + z[g];
        }
    }
    w
}

/// A GPTQ layer decoded by hand: code nibble `k % 8` of `qweight[k/8][n]`, zero nibble `n % 8` of
/// `qzeros[g][n/8]` (+1 in v1), f16 `scales[g][n]`, `g = g_idx[k]`; `(q − z)·s`.
fn decode_gptq(t: &Tensors, p: &str, n: usize, k: usize, g_len: usize, v1: bool) -> Vec<f32> {
    let groups = k.div_ceil(g_len);
    let get = |s: &str| &t[&format!("{p}.{s}")];
    assert_eq!((get("qweight").0, &get("qweight").1), (Dtype::I32, &vec![k / 8, n]), "{p}");
    assert_eq!((get("qzeros").0, &get("qzeros").1), (Dtype::I32, &vec![groups, n / 8]), "{p}");
    assert_eq!((get("scales").0, &get("scales").1), (Dtype::F16, &vec![groups, n]), "{p}");
    assert_eq!((get("g_idx").0, &get("g_idx").1), (Dtype::I32, &vec![k]), "{p}");
    let (qw, qz, s, g_idx) =
        (i32s(&get("qweight").2), i32s(&get("qzeros").2), f16s(&get("scales").2), i32s(&get("g_idx").2));
    let mut w = vec![0.0f32; n * k];
    for kk in 0..k {
        let g = g_idx[kk] as usize;
        assert_eq!(g, kk / g_len, "{p}: g_idx without act-order is k / g");
        for row in 0..n {
            let q = nibble(qw[(kk / 8) * n + row], kk % 8);
            let z = nibble(qz[g * (n / 8) + row / 8], row % 8) + u32::from(v1);
            w[row * k + kk] = (q as f32 - z as f32) * s[g * n + row];
        }
    }
    w
}

/// The export decoded into a plain f32 checkpoint (every quantized layer as `<p>.weight`, everything else
/// as f32), with the export's config less its `quantization_config`. Returns the directory and the decoded
/// layers.
fn dequantized_checkpoint(out: &Path, name: &str, g_len: usize) -> (TempDir, HashMap<String, Vec<f32>>) {
    let t = read_tensors(out);
    let cfg = config(out);
    let qc = &cfg["quantization_config"];
    let v1 = qc["checkpoint_format"] == "gptq";
    let mut plain: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut layers = HashMap::new();
    let packed_suffixes = [".weight_packed", ".qweight"];
    let parts = [".weight_packed", ".weight_scale", ".weight_zero", ".qweight", ".qzeros", ".scales", ".g_idx"];
    for (tname, (dtype, shape, bytes)) in &t {
        if let Some(p) = packed_suffixes.iter().find_map(|s| tname.strip_suffix(s)) {
            let w = if qc["quant_method"] == "cpu_int4" {
                let (n, k) = (shape[0], shape[1] * 2);
                (decode_cpu_int4(&t, p, n, k, g_len), n, k)
            } else {
                let (n, k) = (shape[1], shape[0] * 8);
                (decode_gptq(&t, p, n, k, g_len, v1), n, k)
            };
            plain.push((format!("{p}.weight"), vec![w.1, w.2], w.0.iter().flat_map(|x| x.to_le_bytes()).collect()));
            layers.insert(p.to_string(), w.0);
        } else if !parts.iter().any(|s| tname.ends_with(s)) {
            let v = as_f32(*dtype, bytes);
            plain.push((tname.clone(), shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()));
        }
    }
    let dir = scratch(&format!("{name}-plain"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = cfg.clone();
    c.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    std::fs::copy(out.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let views: HashMap<String, TensorView<'_>> =
        plain.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &dir.join("model.safetensors")).unwrap();
    (dir, layers)
}

fn engine(dir: &Path, path: RunPath) -> Engine {
    let opts = LoadOptions { path, context: 64, cache: None, ..LoadOptions::default() };
    Engine::load(dir, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn logits(e: &Engine) -> Vec<f32> {
    let mut kv = e.new_cache().unwrap();
    e.model.forward(&PROMPT, &mut kv, true).unwrap()
}

fn snr(src: &[f32], got: &[f32]) -> Option<f64> {
    let signal: f64 = src.iter().map(|&a| f64::from(a) * f64::from(a)).sum();
    let noise: f64 = src.iter().zip(got).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum();
    (noise > 0.0).then(|| 10.0 * (signal / noise).log10())
}

/// The tiny model re-stored as bf16 in two shards (with an index), plus the side files an HF directory has.
fn bf16_sharded(name: &str) -> TempDir {
    let src = tiny_model(&format!("{name}-f32"));
    let ckpt = Checkpoint::open(&src).unwrap();
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    let names: Vec<String> = ckpt.tensors().into_iter().map(|(n, _)| n).collect();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = shard
            .iter()
            .map(|n| {
                let shape = ckpt.shape(n).unwrap().to_vec();
                let v = ckpt.f32(n, &shape).unwrap();
                (n.clone(), shape, v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect())
            })
            .collect();
        let views: HashMap<String, TensorView<'_>> =
            data.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::BF16, s.clone(), d).unwrap())).collect();
        safetensors::serialize_to_file(&views, None, &dir.join(&file)).unwrap();
        for n in shard {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let mut c: Value = serde_json::from_str(CONFIG).unwrap();
    c["torch_dtype"] = "bfloat16".into();
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 2}"#).unwrap();
    std::fs::write(dir.join("special_tokens_map.json"), r#"{"bos_token": "w1"}"#).unwrap();
    dir
}

/// Each export loads back: the f32 path on it gives exactly the logits of a plain f32 checkpoint holding
/// the weights decoded by hand from its bytes, the runtime's reader decodes the same weights, and the
/// report's SNR is the SNR of those weights against the source. Covers bf16 sharded input with partial
/// groups (cpu_int4, group 128 over K = 64 and 160), and f32 input at group 32 (GPTQ sym and asym).
#[test]
fn exports_read_back_exactly_and_report_the_snr_of_what_is_stored() {
    let variants = [
        ("cpu-int4", bf16_sharded("rt-cpu-src"), opts(ExportFormat::CpuInt4, false, GroupSize::G128)),
        ("gptq-sym", tiny_model("rt-sym-src"), opts(ExportFormat::Gptq, false, GroupSize::G32)),
        ("gptq-asym", tiny_model("rt-asym-src"), opts(ExportFormat::Gptq, true, GroupSize::G32)),
    ];
    for (name, src, o) in variants {
        let (out, report) = export(&src, &format!("rt-{name}"), &o);
        let g_len = if o.group == GroupSize::G128 { 128 } else { 32 };
        let (plain, layers) = dequantized_checkpoint(&out, name, g_len);
        let want = logits(&engine(&plain, RunPath::F32));
        let got = logits(&engine(&out, RunPath::F32));
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the f32 path on the export differs from the hand-decoded weights"
        );
        // The runtime's own reader decodes the same weights.
        let ckpt = Checkpoint::open(&out).unwrap();
        let cfg = config(&out);
        let norm = int4::cache::quant_config::normalize(Some(&cfg["quantization_config"])).unwrap();
        assert!(norm.warnings.is_empty(), "{name}: {:?}", norm.warnings);
        let format = QuantFormat::from_config(&norm).unwrap().unwrap();
        let src_ckpt = Checkpoint::open(&src).unwrap();
        // 2 layers × 7 linears + the untied head.
        assert_eq!(report.tensors.len(), 15, "{name}");
        assert_eq!(layers.len(), 15, "{name}");
        for t in &report.tensors {
            let [n, k] = t.shape;
            let read = read_linear(&ckpt, &t.name, n, k, &format).unwrap().dequantized();
            let mine = &layers[&t.name];
            assert!(read.iter().zip(mine).all(|(a, b)| a == b), "{name} {}", t.name);
            let source = src_ckpt.f32(&t.source, &[n, k]).unwrap();
            let (want, have) = (snr(&source, mine).unwrap(), t.snr_db.unwrap());
            assert!((want - have).abs() <= 1e-9 * want.abs(), "{name} {}: report {have} dB, stored {want} dB", t.name);
            assert!(have > 10.0, "{name} {}: {have} dB", t.name);
            let params = if o.format == ExportFormat::CpuInt4 { 64.0 } else { 16.0 + 4.0 };
            let groups = k.div_ceil(g_len) as f64;
            assert!((t.bits_per_weight - (4.0 + params * groups / k as f64)).abs() < 1e-9, "{name} {}", t.name);
        }
        let head = report.tensors.iter().find(|t| t.name == "lm_head").unwrap();
        assert_eq!(head.source, "model.embed_tokens.weight", "{name}: the tied head is quantized from the embedding");
        // The report on disk is the one returned (floats to within JSON's parse rounding).
        let on_disk: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("quantization_report.json")).unwrap()).unwrap();
        assert_eq!(
            (on_disk["format"].as_str(), on_disk["group_size"].as_i64()),
            (Some(o.format.name()), Some(o.group.to_checkpoint()))
        );
        let disk_tensors = on_disk["tensors"].as_array().unwrap();
        assert_eq!(disk_tensors.len(), report.tensors.len());
        for (d, t) in disk_tensors.iter().zip(&report.tensors) {
            assert_eq!(d["name"].as_str(), Some(t.name.as_str()));
            let (a, b) = (d["snr_db"].as_f64().unwrap(), t.snr_db.unwrap());
            assert!((a - b).abs() <= 1e-12 * b.abs(), "{name} {}: {a} on disk, {b} returned", t.name);
        }
        // The embedding and norms are copied as stored (bf16 stays bf16, byte for byte).
        let t = read_tensors(&out);
        let embed = &t["model.embed_tokens.weight"];
        let src_embed = src_ckpt.f32("model.embed_tokens.weight", &[96, 64]).unwrap();
        assert_eq!(as_f32(embed.0, &embed.2), src_embed, "{name}");
        let stored = if name == "cpu-int4" { Dtype::BF16 } else { Dtype::F32 };
        assert!(t.iter().filter(|(n, _)| !n.contains("proj") && !n.starts_with("lm_head")).all(|(_, v)| v.0 == stored));
        assert_eq!(report.copied.len(), 6, "{name}: embedding, final norm and two norms per layer");
        // The tokenizer and the other side files come along; the index of the input's shards does not.
        let mut files: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        files.sort();
        let mut expect = vec!["config.json", "model.safetensors", "quantization_report.json", "tokenizer.json"];
        if name == "cpu-int4" {
            expect.extend(["generation_config.json", "special_tokens_map.json"]);
            expect.sort();
        }
        assert_eq!(files, expect, "{name}");
        // And the 4-bit path runs it as stored, nothing quantized at load.
        let e = engine(&out, RunPath::W4a16);
        assert!(e.warnings.is_empty(), "{name}: {:?}", e.warnings);
    }
}

/// A symmetric GPTQ export is v1 with every stored zero nibble 7 (zero − 1), read as zero point 8; an
/// asymmetric one is `gptq_v2` with the grid's own zero points stored as they are (0 included).
#[test]
fn symmetric_gptq_stores_sevens_as_v1_and_asymmetric_is_v2() {
    let src = tiny_model("zp-src");
    let (sym, _) = export(&src, "zp-sym", &opts(ExportFormat::Gptq, false, GroupSize::G32));
    let qc = &config(&sym)["quantization_config"];
    assert_eq!((qc["checkpoint_format"].as_str(), qc["sym"].as_bool()), (Some("gptq"), Some(true)));
    assert_eq!(
        (qc["bits"].as_i64(), qc["group_size"].as_i64(), qc["desc_act"].as_bool()),
        (Some(4), Some(32), Some(false))
    );
    let t = read_tensors(&sym);
    let mut zero_tensors = 0;
    for (name, (_, _, bytes)) in t.iter().filter(|(n, _)| n.ends_with(".qzeros")) {
        let words = i32s(bytes);
        assert!(words.iter().all(|&w| (0..8).all(|i| nibble(w, i) == 7)), "{name}: a nibble other than 7");
        assert_eq!(gptq::detect_symmetric_zero_format(&words).unwrap(), ZeroFormat::V1);
        zero_tensors += 1;
    }
    assert_eq!(zero_tensors, 15);
    let ckpt = Checkpoint::open(&sym).unwrap();
    let norm = int4::cache::quant_config::normalize(Some(qc)).unwrap();
    let format = QuantFormat::from_config(&norm).unwrap().unwrap();
    let q = read_linear(&ckpt, "model.layers.0.mlp.gate_proj", 160, 64, &format).unwrap();
    assert_eq!(q.zeros, IntegerZeros::Symmetric);
    assert!(q.zeros.per_group(160, 2).unwrap().iter().all(|&z| z == 8));
    assert!(q.params.zeros().iter().all(|&z| z == 0.0), "zero point 8 is float zero 0");

    let (asym, _) = export(&src, "zp-asym", &opts(ExportFormat::Gptq, true, GroupSize::G32));
    let qc = &config(&asym)["quantization_config"];
    assert_eq!((qc["checkpoint_format"].as_str(), qc["sym"].as_bool()), (Some("gptq_v2"), Some(false)));
    let t = read_tensors(&asym);
    let ckpt = Checkpoint::open(&asym).unwrap();
    let src_ckpt = Checkpoint::open(&src).unwrap();
    let norm = int4::cache::quant_config::normalize(Some(qc)).unwrap();
    let format = QuantFormat::from_config(&norm).unwrap().unwrap();
    let mut zeros_seen = [false; 16];
    for (p, n, k) in [("model.layers.0.mlp.gate_proj", 160, 64), ("model.layers.1.mlp.down_proj", 64, 160)] {
        let grid = quantize_integer_zero(
            &src_ckpt.f32(&format!("{p}.weight"), &[n, k]).unwrap(),
            n,
            k,
            GroupSize::G32,
            ScaleSearch::Shrink,
            ParamPrecision::F16,
        )
        .unwrap();
        let groups = k / 32;
        let words = i32s(&t[&format!("{p}.qzeros")].2);
        for g in 0..groups {
            for row in 0..n {
                let stored = nibble(words[g * (n / 8) + row / 8], row % 8) as u8;
                assert_eq!(
                    stored,
                    grid.zero_points.as_deref().unwrap()[row * groups + g],
                    "{p} ({row}, {g}): v2 stores the zero as is"
                );
                zeros_seen[stored as usize] = true;
            }
        }
        let read = read_linear(&ckpt, p, n, k, &format).unwrap();
        assert_eq!(read.zeros, IntegerZeros::PerGroup(grid.zero_points.clone().unwrap()), "{p}");
    }
    assert!(zeros_seen.iter().filter(|&&s| s).count() > 2, "the zero points vary: {zeros_seen:?}");
}

/// A tied model's export gets its own quantized head, `tie_word_embeddings: false` (and `"lm_head": true`
/// for GPTQ), and then every linear layer, head included, runs on a 4-bit kernel on W4A8 and W4A16 with
/// nothing quantized at load. With the head left out, the tie is kept and the loader has to quantize it.
#[test]
fn a_tied_head_is_untied_and_quantized_so_every_layer_runs_in_four_bits() {
    let src = tiny_model("tied-src");
    assert_eq!(config(&src)["tie_word_embeddings"], true);
    let (out, report) = export(&src, "tied-gptq", &opts(ExportFormat::Gptq, false, GroupSize::G32));
    let t = read_tensors(&out);
    for s in ["qweight", "qzeros", "scales", "g_idx"] {
        assert!(t.contains_key(&format!("lm_head.{s}")), "lm_head.{s} missing");
    }
    assert!(!t.contains_key("lm_head.weight"));
    let in_bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let src_st = safetensors::SafeTensors::deserialize(&in_bytes).unwrap();
    assert_eq!(t["model.embed_tokens.weight"].2, src_st.tensor("model.embed_tokens.weight").unwrap().data());
    let cfg = config(&out);
    assert_eq!(cfg["tie_word_embeddings"], false);
    assert_eq!(cfg["quantization_config"]["lm_head"], true);
    assert!(report.head.contains("untied"), "{}", report.head);
    for (path, prefix) in [(RunPath::W4a8, "w4a8-"), (RunPath::W4a16, "w4a16-")] {
        let e = engine(&out, path);
        assert!(!e.warnings.iter().any(|w| w.contains("quantized at load")), "{path:?}: {:?}", e.warnings);
        let kernels = e.model.kernels(64);
        assert!(kernels.iter().any(|l| l.layer == "lm_head"), "the head is a linear layer");
        for l in &kernels {
            for k in [l.decode, l.prefill] {
                assert!(k.name().starts_with(prefix), "{path:?}: {} runs {k}", l.layer);
            }
        }
        assert!(logits(&e).iter().all(|v| v.is_finite()));
    }

    // cpu_int4 unties the same way.
    let (cpu, _) = export(&src, "tied-cpu", &opts(ExportFormat::CpuInt4, false, GroupSize::G32));
    assert!(read_tensors(&cpu).contains_key("lm_head.weight_packed"));
    assert_eq!(config(&cpu)["tie_word_embeddings"], false);
    let e = engine(&cpu, RunPath::W4a16);
    assert!(e.warnings.is_empty(), "{:?}", e.warnings);
    assert!(e.model.kernels(64).iter().all(|l| l.decode.name().starts_with("w4a16-")));

    // --no-lm-head: the head stays tied and unquantized, and the loader says it quantizes it.
    let o = QuantizeOptions { quantize_head: false, ..opts(ExportFormat::Gptq, false, GroupSize::G32) };
    let (kept, report) = export(&src, "tied-kept", &o);
    assert!(!read_tensors(&kept).keys().any(|n| n.starts_with("lm_head")));
    let cfg = config(&kept);
    assert_eq!(
        (cfg["tie_word_embeddings"].as_bool(), cfg["quantization_config"]["lm_head"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(report.tensors.len(), 14);
    let e = engine(&kept, RunPath::W4a8);
    assert!(e.warnings.iter().any(|w| w.contains("lm_head") && w.contains("quantized at load")), "{:?}", e.warnings);
}

/// `ignore` leaves whole layers (or fused groups, or everything under a prefix) unquantized, copied as
/// stored; the export still loads on every path.
#[test]
fn ignored_layers_are_copied_as_stored() {
    let src = tiny_model("ignore-src");
    let o = QuantizeOptions {
        ignore: vec!["model.layers.1.mlp.down_proj.weight".into(), "model.layers.0.self_attn.qkv".into()],
        ..opts(ExportFormat::Gptq, false, GroupSize::G32)
    };
    let (out, report) = export(&src, "ignore", &o);
    let mut want = vec![
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.mlp.down_proj",
    ];
    want.sort();
    assert_eq!(report.ignored, want);
    assert_eq!(report.tensors.len(), 15 - 4);
    let t = read_tensors(&out);
    let in_bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let src_st = safetensors::SafeTensors::deserialize(&in_bytes).unwrap();
    for p in &want {
        let name = format!("{p}.weight");
        assert_eq!(t[&name].2, src_st.tensor(&name).unwrap().data(), "{name} is copied as stored");
        assert!(!t.contains_key(&format!("{p}.qweight")));
        assert!(report.copied.iter().any(|c| c.name == name && c.why == "ignored"));
    }
    assert_eq!(logits(&engine(&out, RunPath::F32)).len(), PROMPT.len() * 96);
    let e = engine(&out, RunPath::W4a16);
    assert!(e.warnings.iter().any(|w| w.contains("quantized at load")), "{:?}", e.warnings);

    let o =
        QuantizeOptions { ignore: vec!["model.layers.1".into()], ..opts(ExportFormat::CpuInt4, false, GroupSize::G32) };
    let (_, report) = export(&src, "ignore-prefix", &o);
    assert_eq!(report.ignored.len(), 7);
    assert!(report.ignored.iter().all(|p| p.starts_with("model.layers.1.")));
}

/// A model with `vocab_size` and `intermediate_size` of our choosing (the tiny model's other tensors).
fn odd_model(name: &str, vocab: usize, inter: usize) -> TempDir {
    let src = tiny_model(&format!("{name}-base"));
    let ckpt = Checkpoint::open(&src).unwrap();
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (n, _) in ckpt.tensors() {
        let mut shape = ckpt.shape(&n).unwrap().to_vec();
        let v = ckpt.f32(&n, &shape).unwrap();
        let (rows, cols) = if n.ends_with("embed_tokens.weight") {
            (vocab, 64)
        } else if n.ends_with("gate_proj.weight") || n.ends_with("up_proj.weight") {
            (inter, 64)
        } else if n.ends_with("down_proj.weight") {
            (64, inter)
        } else {
            data.push((n, shape, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
            continue;
        };
        shape = vec![rows, cols];
        let values: Vec<f32> = (0..rows * cols).map(|i| v[i % v.len()]).collect();
        data.push((n, shape, values.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    let views: HashMap<String, TensorView<'_>> =
        data.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &dir.join("model.safetensors")).unwrap();
    let mut c: Value = serde_json::from_str(CONFIG).unwrap();
    c["vocab_size"] = vocab.into();
    c["intermediate_size"] = inter.into();
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    dir
}

fn leftovers(out: &Path) -> Vec<String> {
    let name = out.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!(".{name}.")))
        .collect()
}

/// Bad inputs are typed errors with clear messages, and leave nothing at (or beside) the output.
#[test]
fn bad_inputs_are_clear_errors_and_leave_nothing_behind() {
    let gptq = opts(ExportFormat::Gptq, false, GroupSize::G32);
    let run = |src: &Path, name: &str, o: &QuantizeOptions| {
        let out = scratch(name);
        let e = quantize_checkpoint(src, &out, o, None).expect_err(name);
        assert!(!out.exists(), "{name}: {} was left behind", out.display());
        assert!(leftovers(&out).is_empty(), "{name}: {:?} left beside the output", leftovers(&out));
        (e.to_string(), e)
    };

    let (msg, e) = run(Path::new("/nonexistent/int4-model"), "bad-missing", &gptq);
    assert!(matches!(e.kind(), QuantizeErrorKind::Input { .. }), "{e:?}");
    assert!(msg.contains("/nonexistent/int4-model"), "{msg}");

    // Already quantized: our own export, and an old-style quantize_config.json.
    let src = tiny_model("bad-src");
    let (done, _) = export(&src, "bad-done", &gptq);
    let (msg, e) = run(&done, "bad-again", &gptq);
    assert!(
        matches!(e.kind(), QuantizeErrorKind::AlreadyQuantized { .. }) && msg.contains("already quantized"),
        "{msg}"
    );
    let side = tiny_model("bad-side");
    std::fs::write(side.join("quantize_config.json"), r#"{"bits": 4, "group_size": 128}"#).unwrap();
    let (msg, e) = run(&side, "bad-side-out", &gptq);
    assert!(
        matches!(e.kind(), QuantizeErrorKind::AlreadyQuantized { .. }) && msg.contains("quantize_config.json"),
        "{msg}"
    );

    // NaN in a linear (read through the checkpoint), infinity in a copied tensor (streamed): both named.
    let nan = tiny_model_with("bad-nan", |name, mut v| {
        if name == "model.layers.1.mlp.up_proj.weight" {
            v[3 * 64 + 5] = f32::NAN;
        }
        v
    });
    let (msg, e) = run(&nan, "bad-nan-out", &gptq);
    match e.kind() {
        QuantizeErrorKind::NonFinite { tensor, index, value } => {
            assert_eq!((tensor.as_str(), index.as_slice()), ("model.layers.1.mlp.up_proj.weight", &[3usize, 5][..]));
            assert!(value.is_nan());
        }
        other => panic!("{other:?}"),
    }
    assert!(msg.contains("model.layers.1.mlp.up_proj.weight") && msg.contains("NaN"), "{msg}");
    let inf = tiny_model_with("bad-inf", |name, mut v| {
        if name == "model.embed_tokens.weight" {
            v[70] = f32::INFINITY;
        }
        v
    });
    let (msg, e) = run(&inf, "bad-inf-out", &QuantizeOptions { quantize_head: false, ..gptq.clone() });
    assert!(
        matches!(e.kind(), QuantizeErrorKind::NonFinite { tensor, index, .. } if tensor == "model.embed_tokens.weight" && index == &[1, 6]),
        "{e:?}"
    );
    assert!(msg.contains("model.embed_tokens.weight") && msg.contains("inf"), "{msg}");

    // Shapes the format cannot store.
    let vocab100 = odd_model("bad-vocab", 100, 160);
    let (msg, e) = run(&vocab100, "bad-vocab-out", &gptq);
    assert!(matches!(e.kind(), QuantizeErrorKind::Shape { tensor, n: 100, k: 64, .. } if tensor == "lm_head"), "{e:?}");
    assert!(msg.contains("multiples of 8"), "{msg}");
    let o = QuantizeOptions { quantize_head: false, ..gptq.clone() };
    export(&vocab100, "bad-vocab-nohead", &o); // the head left out, nothing else is in the way
    let inter161 = odd_model("bad-inter", 96, 161);
    let (_, e) = run(&inter161, "bad-inter-cpu", &opts(ExportFormat::CpuInt4, false, GroupSize::G32));
    assert!(
        matches!(e.kind(), QuantizeErrorKind::Shape { tensor, k: 161, .. } if tensor == "model.layers.0.mlp.down_proj"),
        "{e:?}"
    );
    let (_, e) = run(&inter161, "bad-inter-gptq", &gptq);
    assert!(
        matches!(e.kind(), QuantizeErrorKind::Shape { tensor, n: 161, .. } if tensor == "model.layers.0.mlp.gate_proj"),
        "{e:?}"
    );

    // Options.
    let (msg, e) =
        run(&src, "bad-ignore", &QuantizeOptions { ignore: vec!["model.layers.7.mlp".into()], ..gptq.clone() });
    assert!(matches!(e.kind(), QuantizeErrorKind::UnknownIgnore { .. }) && msg.contains("model.layers.7.mlp"), "{msg}");
    let (msg, e) = run(
        &src,
        "bad-fused",
        &QuantizeOptions { ignore: vec!["model.layers.0.self_attn.q_proj".into()], ..gptq.clone() },
    );
    assert!(
        matches!(e.kind(), QuantizeErrorKind::PartialFusedIgnore { .. })
            && msg.contains("model.layers.0.self_attn.qkv"),
        "{msg}"
    );
    let (_, e) = run(&src, "bad-asym", &opts(ExportFormat::CpuInt4, true, GroupSize::G32));
    assert!(matches!(e.kind(), QuantizeErrorKind::Options(_)), "{e:?}");

    // An existing, non-empty output is refused, kept as it was, and replaced only with force.
    let out = scratch("bad-exists");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = quantize_checkpoint(&src, &out, &gptq, None).unwrap_err();
    assert!(matches!(e.kind(), QuantizeErrorKind::OutputExists { .. }) && e.to_string().contains("--force"), "{e}");
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "mine");
    quantize_checkpoint(&src, &out, &QuantizeOptions { force: true, ..gptq.clone() }, None).unwrap();
    assert!(!out.join("keep.txt").exists() && out.join("config.json").exists());
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    // An empty directory is fine without force; the input itself never is.
    let empty = scratch("bad-empty");
    std::fs::create_dir_all(&empty).unwrap();
    quantize_checkpoint(&src, &empty, &gptq, None).unwrap();
    let e = quantize_checkpoint(&src, &src, &QuantizeOptions { force: true, ..gptq.clone() }, None).unwrap_err();
    assert!(matches!(e.kind(), QuantizeErrorKind::Output { .. }), "{e:?}");
    assert!(src.join("model.safetensors").exists());
}

/// Progress is told once per tensor, ending at the total, and search on does better than search off.
#[test]
fn progress_reaches_the_total_and_search_helps() {
    let src = tiny_model("progress-src");
    let seen = std::sync::Mutex::new(Vec::new());
    let record =
        |p: int4_quant::export::Progress<'_>| seen.lock().unwrap().push((p.done, p.total, p.bytes_done, p.bytes_total));
    let out = scratch("progress");
    let on =
        quantize_checkpoint(&src, &out, &opts(ExportFormat::CpuInt4, false, GroupSize::G32), Some(&record)).unwrap();
    let seen = seen.into_inner().unwrap();
    // 20 input tensors, plus the head quantized from the embedding.
    assert_eq!(seen.len(), 21);
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].2 <= w[1].2));
    let last = seen.last().unwrap();
    assert_eq!((last.0, last.2), (last.1, last.3));
    let off_opts = QuantizeOptions { search: ScaleSearch::Off, ..opts(ExportFormat::CpuInt4, false, GroupSize::G32) };
    let (_, off) = export(&src, "progress-off", &off_opts);
    assert!(!off.search && on.search);
    assert!(
        on.totals.snr_db.unwrap() > off.totals.snr_db.unwrap(),
        "{:?} vs {:?}",
        on.totals.snr_db,
        off.totals.snr_db
    );
    assert!(on.tensors.iter().zip(&off.tensors).all(|(a, b)| a.snr_db >= b.snr_db));
}

/// An unquantized GGUF (F16 layers, F32 norms) is an input like a Hugging Face directory: its export equals,
/// logit for logit, the export of its f32 expansion (`gguf_to_hf`), with and without a fused layer left as
/// stored (whose Q/K rows go back to Hugging Face order), and the tokenizer files come from its metadata;
/// a block-quantized GGUF is refused as already quantized.
#[test]
fn an_unquantized_gguf_exports_like_its_expansion() {
    use int4_test_support::gguf::{tiny_llama, ty};
    let dir = scratch("gguf-in");
    std::fs::create_dir_all(&dir).unwrap();
    let tiny = tiny_llama(&dir, "tiny-f16.gguf", true, |_| ty::F16);
    let expansion = dir.join("expansion");
    int4::gguf::gguf_to_hf(&tiny.path, &expansion).unwrap();
    let prompt = [5u32, 80, 120, 7, 9, 44];
    let run = |model: &Path| {
        let e =
            Engine::load(model, &LoadOptions { path: RunPath::F32, cache: None, ..LoadOptions::default() }).unwrap();
        e.generate(int4::GenerationRequest::greedy(int4::Prompt::Ids(prompt.to_vec()), 1), |_| {}).unwrap().first_logits
    };
    for (name, ignore) in [("plain", vec![]), ("ignore-qkv", vec!["model.layers.1.self_attn.qkv".to_string()])] {
        let o = QuantizeOptions { ignore, ..opts(ExportFormat::CpuInt4, false, GroupSize::G32) };
        let (from_gguf, report) = export(&tiny.path, &format!("gguf-{name}"), &o);
        let (from_expansion, _) = export(&expansion, &format!("expansion-{name}"), &o);
        let (a, b) = (run(&from_gguf), run(&from_expansion));
        assert!(a.iter().zip(&b).all(|(x, y)| x == y), "{name}: the GGUF's export differs from its expansion's");
        for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            assert!(report.files_copied.contains(&f.to_string()) && from_gguf.join(f).is_file(), "{name}: {f}");
        }
    }
    let q = tiny_llama(&dir, "tiny-q4_0.gguf", true, |_| ty::Q4_0);
    let e = quantize_checkpoint(&q.path, &scratch("gguf-q"), &opts(ExportFormat::CpuInt4, false, GroupSize::G32), None)
        .unwrap_err();
    assert!(matches!(e.kind(), QuantizeErrorKind::AlreadyQuantized { .. }), "{e}");
    assert!(e.to_string().contains("Q4_0"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
