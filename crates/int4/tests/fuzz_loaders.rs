//! Bounded mutation fuzzing of the loaders, on the stable toolchain: proptest mutates valid inputs —
//! the safetensors checkpoint, `config.json`, a `cpu_int4` and a GPTQ checkpoint, and a packed artifact in
//! the cache — and every load must end in `Ok` or a clear error, never a panic. A mutated artifact that
//! still loads must be one `int4 cache verify` flags whenever its bytes changed.
//!
//! `INT4_FUZZ_CASES` sets the cases per target (default 48; CI runs the default). Each target prints how
//! many loads it ran.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use int4::Checkpoint;
use int4::cache::ArtifactStore;
use int4::layout::grid::{ParamPrecision, ScaleSearch, quantize_asymmetric, quantize_symmetric};
use int4::layout::{GroupSize, gptq, rowmajor};
use int4::{Engine, LoadOptions, PackedFrom, RunPath};
use int4_test_support::fuzz::{Edit, apply, cases, edits, run};
use int4_test_support::{TempDir, tiny_model};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use safetensors::tensor::{Dtype, TensorView};

fn opts(path: RunPath, cache: Option<&Path>) -> LoadOptions {
    LoadOptions { path, context: 32, cache: cache.map(ArtifactStore::new), ..LoadOptions::default() }
}

/// Loads `dir` and runs one token if it loaded; `Err(())` only on a panic.
fn load_and_run(dir: &Path, o: &LoadOptions) -> Result<Option<Engine>, ()> {
    catch_unwind(AssertUnwindSafe(|| {
        let e = Engine::load(dir, o).ok()?;
        let mut kv = e.new_cache().ok()?;
        e.model.forward(&[3, 4], &mut kv, false).ok()?;
        Some(e)
    }))
    .map_err(|_| ())
}

fn scratch(name: &str) -> TempDir {
    TempDir::new(&format!("fuzz-{name}"))
}

/// Copies the model directory `src` to `dst` with `file` replaced by `bytes`.
fn with_file(src: &Path, dst: &Path, file: &str, bytes: &[u8]) {
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    std::fs::write(dst.join(file), bytes).unwrap();
}

#[test]
fn mutated_safetensors_never_panic() {
    let src = tiny_model("fuzz-st");
    let dst = scratch("st");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    run("safetensors", edits(), |e| {
        with_file(&src, &dst, "model.safetensors", &apply(&bytes, e));
        for path in [RunPath::F32, RunPath::W4a16] {
            load_and_run(&dst, &opts(path, None)).map_err(|_| format!("{path:?} panicked on {e:?}"))?;
        }
        Ok(())
    });
}

#[test]
fn mutated_configs_never_panic() {
    let src = tiny_model("fuzz-cfg");
    let dst = scratch("cfg");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let mut keys: Vec<String> = base.as_object().unwrap().keys().cloned().collect();
    keys.extend(["quantization_config", "rope_scaling", "head_dim"].map(String::from));
    let values = [
        serde_json::json!(0),
        serde_json::json!(1),
        serde_json::json!(-1),
        serde_json::json!(3),
        serde_json::json!(1u64 << 31),
        serde_json::json!(u64::MAX),
        serde_json::json!(1e300),
        serde_json::json!("x"),
        serde_json::Value::Null,
        serde_json::json!({"rope_type": "llama3", "factor": 0.0}),
        serde_json::json!({"quant_method": "gptq", "bits": 4}),
        serde_json::json!({"quant_method": "cpu_int4", "group_size": 48}),
    ];
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let strategy = prop::collection::vec((0..keys.len(), 0..values.len()), 1..4);
    let n = std::cell::Cell::new(0u32);
    let r = runner.run(&strategy, |edits| {
        n.set(n.get() + 1);
        let mut cfg = base.clone();
        for (k, v) in &edits {
            cfg[keys[*k].as_str()] = values[*v].clone();
        }
        with_file(&src, &dst, "config.json", cfg.to_string().as_bytes());
        load_and_run(&dst, &opts(RunPath::W4a16, None))
            .map_err(|_| TestCaseError::fail(format!("panicked on config {cfg}")))?;
        Ok(())
    });
    eprintln!("fuzz config.json: {} mutated loads", n.get());
    if let Err(e) = r {
        panic!("fuzz config.json: {e}");
    }
}

/// The tiny model with every linear stored quantized (`cpu_int4` or symmetric GPTQ v1), unfused names.
fn quantized_tiny(name: &str, gptq_format: bool) -> TempDir {
    let src = tiny_model(&format!("fuzz-q-{name}"));
    let ckpt = Checkpoint::open(&src).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i32b = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (t, _) in ckpt.tensors() {
        let shape = ckpt.shape(&t).unwrap().to_vec();
        let w = ckpt.f32(&t, &shape).unwrap();
        let Some(prefix) = t.strip_suffix(".weight").filter(|_| shape.len() == 2 && !t.contains("embed")) else {
            tensors.push((t.clone(), Dtype::F32, shape, f32b(&w)));
            continue;
        };
        let (n, k) = (shape[0], shape[1]);
        let g = GroupSize::G32.groups(k);
        if gptq_format {
            let q = quantize_symmetric(&w, n, k, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F16).unwrap();
            let scales: Vec<f32> = (0..g * n).map(|i| q.params.scale(i % n, i / n)).collect();
            let qz = gptq::pack_qzeros(&vec![8; g * n], g, n, gptq::ZeroFormat::V1).unwrap();
            tensors.push((
                format!("{prefix}.qweight"),
                Dtype::I32,
                vec![k / 8, n],
                i32b(&gptq::pack_qweight(&q.codes).unwrap()),
            ));
            tensors.push((format!("{prefix}.qzeros"), Dtype::I32, vec![g, n / 8], i32b(&qz)));
            tensors.push((format!("{prefix}.scales"), Dtype::F32, vec![g, n], f32b(&scales)));
        } else {
            let q = quantize_asymmetric(&w, n, k, GroupSize::G32, ScaleSearch::Off, ParamPrecision::F32).unwrap();
            tensors.push((
                format!("{prefix}.weight_packed"),
                Dtype::U8,
                vec![n, k / 2],
                rowmajor::pack(&q.codes).unwrap(),
            ));
            tensors.push((format!("{prefix}.weight_scale"), Dtype::F32, vec![n, g], f32b(q.params.scales())));
            tensors.push((format!("{prefix}.weight_zero"), Dtype::F32, vec![n, g], f32b(q.params.zeros())));
        }
    }
    let dir = scratch(&format!("q-{name}"));
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = if gptq_format {
        serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": true})
    } else {
        serde_json::json!({"quant_method": "cpu_int4", "bits": 4, "group_size": 32})
    };
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let views: HashMap<String, TensorView<'_>> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn mutated_quantized_checkpoints_never_panic() {
    for (name, gptq_format) in [("cpu_int4", false), ("gptq", true)] {
        let src = quantized_tiny(name, gptq_format);
        assert!(load_and_run(&src, &opts(RunPath::W4a16, None)).unwrap().is_some(), "{name}: the unmutated one loads");
        let dst = scratch(&format!("q-{name}-mut"));
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        // Mutate the tensor data too, not only the header: codes, scales and zero points.
        let anywhere = prop::collection::vec(
            (any::<usize>(), 1u8..=255).prop_map(|(p, x)| Edit::Flip(p.wrapping_mul(4).wrapping_add(1), x)),
            1..8,
        );
        run(&format!("{name} data"), anywhere, |e| {
            with_file(&src, &dst, "model.safetensors", &apply(&bytes, e));
            load_and_run(&dst, &opts(RunPath::W4a16, None)).map_err(|_| format!("panicked on {e:?}"))?;
            Ok(())
        });
        run(&format!("{name} header"), edits(), |e| {
            with_file(&src, &dst, "model.safetensors", &apply(&bytes, e));
            load_and_run(&dst, &opts(RunPath::Wna16, None)).map_err(|_| format!("panicked on {e:?}"))?;
            Ok(())
        });
    }
}

#[test]
fn mutated_artifacts_never_panic_and_verify_flags_every_change() {
    let src = tiny_model("fuzz-art");
    let cache = scratch("art-cache");
    let cold = Engine::load(&src, &opts(RunPath::W4a16, Some(&cache))).unwrap();
    let PackedFrom::Built(file) = cold.packed_from.clone() else { panic!("no artifact written") };
    drop(cold);
    let original = std::fs::read(&file).unwrap();
    run("artifact", edits(), |e| {
        let mutated = apply(&original, e);
        std::fs::write(&file, &mutated).unwrap();
        let changed = mutated != original;
        if changed && ArtifactStore::new(cache.path()).verify().iter().all(|(_, r)| r.is_ok()) {
            return Err(format!("verify passed an artifact changed by {e:?}"));
        }
        load_and_run(&src, &opts(RunPath::W4a16, Some(&cache))).map_err(|_| format!("panicked on {e:?}"))?;
        // Put the original back (a load may have rebuilt it; either way the next case starts clean).
        std::fs::write(&file, &original).unwrap();
        Ok(())
    });
}
