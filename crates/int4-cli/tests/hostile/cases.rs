//! The table: every hostile input, the command that meets it, and what must come of it.
//!
//! Ported from the generators that broke the release binary (safetensors headers, configs, quantized
//! tensors, tokenizers and templates, the artifact cache, FIFOs, flags, standard input and output), each
//! rebuilt here from the tiny model so the suite needs nothing but the binary under test.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::files::*;
use crate::harness::Invocation;

/// What a case must produce.
pub enum Expect {
    /// Exit status 1 (an error) with these words on stderr.
    Error(&'static str),
    /// Exit status 2 (a usage error) with these words on stderr.
    Usage(&'static str),
    /// Exit status 0.
    Ok,
    /// Exit status 0, and stderr holding these words (a warning).
    OkWarning(&'static str),
    /// Exit status 0 and the same standard output as the reference invocation (run right after, in the
    /// same cache): no wrong answer.
    SameAs(Invocation),
    /// This exit status with these words on stderr or stdout.
    Exit(i32, &'static str),
}

type Hook = Arc<dyn Fn() + Send + Sync>;

/// One case.
pub struct Case {
    pub name: String,
    /// Run just before the command (build an artifact, then damage it).
    pub prepare: Option<Hook>,
    pub inv: Invocation,
    pub expect: Expect,
    /// Run after the command (release a lock, put a file back).
    pub cleanup: Option<Hook>,
}

fn case(name: impl Into<String>, inv: Invocation, expect: Expect) -> Case {
    Case { name: name.into(), prepare: None, inv, expect, cleanup: None }
}

fn generate(dir: &Path) -> Invocation {
    Invocation::new(&["generate", dir.to_str().unwrap(), "w3 w4 w7", "--max-new-tokens", "3"])
}

fn generate_with(dir: &Path, extra: &[&str]) -> Invocation {
    let mut inv = generate(dir);
    inv.args.extend(extra.iter().map(|s| s.to_string()));
    inv
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// Every case, built under `root` from the tiny model `tiny`; `cache` is the suite's cache directory.
pub fn all(root: &Path, tiny: &Path, cache: &Path, bin: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    safetensors(root, tiny, &mut cases);
    configs(root, tiny, &mut cases);
    quantized(root, tiny, bin, cache, &mut cases);
    tokenizers(root, tiny, &mut cases);
    artifact_cache(root, tiny, cache, &mut cases);
    key_matrix(tiny, &mut cases);
    flags_and_streams(root, tiny, &mut cases);
    ggufs(root, &mut cases);
    cases
}

// --- safetensors ------------------------------------------------------------------------------------

fn safetensors(root: &Path, tiny: &Path, cases: &mut Vec<Case>) {
    let (h, data) = read_st(&tiny.join("model.safetensors"));
    let hb = Value::Object(h.clone()).to_string().into_bytes();
    let mut names: Vec<&String> = h.keys().filter(|k| *k != "__metadata__").collect();
    names.sort_by_key(|k| h[*k]["data_offsets"][0].as_u64());
    let last = names.last().unwrap().to_string();
    let raw = |name: &str, header: &[u8], data: &[u8], len: Option<u64>| {
        variant(root, tiny, &format!("st-{name}"), |d| write_raw(&d.join("model.safetensors"), header, data, len))
    };
    let st = "not a valid safetensors file";
    let hdr = |name: &str, edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut h2 = h.clone();
        edit(&mut h2);
        variant(root, tiny, &format!("st-{name}"), |d| {
            write_raw(&d.join("model.safetensors"), Value::Object(h2).to_string().as_bytes(), &data, None)
        })
    };
    for (name, len) in [("hdrlen-2p63", 1u64 << 63), ("hdrlen-max", u64::MAX), ("hdrlen-90M", 90_000_000)] {
        cases.push(case(format!("st-{name}"), generate(&raw(name, &hb, &data, Some(len))), Expect::Error(st)));
    }
    cases.push(case(
        "st-hdrlen-plus8",
        generate(&raw("hdrlen-plus8", &hb, &data, Some(hb.len() as u64 + 8))),
        Expect::Error(st),
    ));
    cases.push(case(
        "st-hdr-notjson",
        generate(&raw("hdr-notjson", &b"this is not json at all!".repeat(4), &data, None)),
        Expect::Error(st),
    ));
    cases.push(case(
        "st-hdr-notutf8",
        generate(&raw("hdr-notutf8", &[0xffu8, 0xfe, 0xfd].repeat(20), &data, None)),
        Expect::Error(st),
    ));
    cases.push(case("st-hdr-array", generate(&raw("hdr-array", b"[1,2,3]", &data, None)), Expect::Error(st)));
    let deep = [b"{\"__metadata__\":".to_vec(), vec![b'['; 100_000], vec![b']'; 100_000], b"}".to_vec()].concat();
    cases.push(case("st-hdr-deep", generate(&raw("hdr-deep", &deep, &data, None)), Expect::Error(st)));
    let l = last.clone();
    let off_past = hdr("off-past-eof", &|h| {
        let e = h[&l]["data_offsets"][1].as_u64().unwrap();
        h.get_mut(&l).unwrap()["data_offsets"][1] = json!(e + (1 << 20));
    });
    cases.push(case("st-off-past-eof", generate(&off_past), Expect::Error(st)));
    let l = last.clone();
    let off_max = hdr("off-u64max", &|h| h.get_mut(&l).unwrap()["data_offsets"][1] = json!(u64::MAX));
    cases.push(case("st-off-u64max", generate(&off_max), Expect::Error(st)));
    let (a, b) = (names[0].clone(), names[1].clone());
    let overlap = hdr("off-overlap", &|h| {
        let s0 = h[&a]["data_offsets"][0].as_u64().unwrap();
        let (s1, e1) = (h[&b]["data_offsets"][0].as_u64().unwrap(), h[&b]["data_offsets"][1].as_u64().unwrap());
        h.get_mut(&b).unwrap()["data_offsets"] = json!([s0, s0 + (e1 - s1)]);
    });
    cases.push(case("st-off-overlap", generate(&overlap), Expect::Error(st)));
    let alias = hdr("off-alias", &|h| {
        let o = h["model.layers.0.input_layernorm.weight"]["data_offsets"].clone();
        h.get_mut("model.layers.0.post_attention_layernorm.weight").unwrap()["data_offsets"] = o;
    });
    cases.push(case("st-off-alias", generate(&alias), Expect::Error(st)));
    let l = last.clone();
    let reversed = hdr("off-reversed", &|h| {
        let o = h[&l]["data_offsets"].clone();
        h.get_mut(&l).unwrap()["data_offsets"] = json!([o[1], o[0]]);
    });
    cases.push(case("st-off-reversed", generate(&reversed), Expect::Error(st)));
    let edits: [(&str, Value, Value, &str); 8] = [
        ("dtype-size-mismatch", json!("BF16"), json!([64]), st),
        ("shape-size-mismatch", json!("F32"), json!([65]), st),
        ("dtype-unknown", json!("F128"), json!([64]), st),
        ("dtype-i32", json!("I32"), json!([64]), "dtype I32 is not supported"),
        ("dtype-f4", json!("F4"), json!([512]), "dtype"),
        ("shape-overflow", json!("F32"), json!([1u64 << 32, 1u64 << 32, 16]), st),
        ("shape-zero-dim", json!("F32"), json!([0, 1u64 << 62, 8]), st),
        ("shape-2d", json!("F32"), json!([8, 8]), "shape [8, 8], expected [64]"),
    ];
    for (name, dtype, shape, msg) in edits {
        let d = hdr(name, &|h| {
            let t = h.get_mut("model.norm.weight").unwrap();
            t["dtype"] = dtype.clone();
            t["shape"] = shape.clone();
        });
        cases.push(case(format!("st-{name}"), generate(&d), Expect::Error(msg)));
    }
    let transposed = hdr("shape-transposed", &|h| {
        h.get_mut("model.layers.0.mlp.down_proj.weight").unwrap()["shape"] = json!([160, 64]);
    });
    cases.push(case(
        "st-shape-transposed",
        generate(&transposed),
        Expect::Error("shape [160, 64], expected [64, 160]"),
    ));
    let bignum =
        String::from_utf8(hb.clone()).unwrap().replacen("\"shape\":[64]", "\"shape\":[184467440737095516160]", 1);
    cases.push(case(
        "st-shape-bignum",
        generate(&raw("shape-bignum", bignum.as_bytes(), &data, None)),
        Expect::Error(st),
    ));
    let negative = String::from_utf8(hb.clone()).unwrap().replacen("\"shape\":[64]", "\"shape\":[-64]", 1);
    cases.push(case(
        "st-shape-negative",
        generate(&raw("shape-negative", negative.as_bytes(), &data, None)),
        Expect::Error(st),
    ));
    let full = std::fs::read(tiny.join("model.safetensors")).unwrap();
    for (name, bytes) in [
        ("truncated-half", full[..full.len() / 2].to_vec()),
        ("truncated-in-header", full[..40].to_vec()),
        ("truncated-4bytes", full[..4].to_vec()),
        ("extended", [full.clone(), vec![0u8; 100]].concat()),
        ("empty", Vec::new()),
    ] {
        let d = variant(root, tiny, &format!("st-{name}"), |d| {
            std::fs::write(d.join("model.safetensors"), &bytes).unwrap()
        });
        cases.push(case(format!("st-{name}"), generate(&d), Expect::Error(st)));
    }
    let is_dir = variant(root, tiny, "st-is-dir", |d| {
        std::fs::remove_file(d.join("model.safetensors")).unwrap();
        std::fs::create_dir(d.join("model.safetensors")).unwrap();
    });
    cases.push(case("st-is-dir", generate(&is_dir), Expect::Error("is a directory, not a regular file")));
    for (name, target, msg) in [
        ("symlink-loop", "model.safetensors", "symbolic links"),
        ("symlink-dangling", "/nonexistent/x", "no model.safetensors"),
        ("dev-zero", "/dev/zero", "is a character device, not a regular file"),
        ("dev-null", "/dev/null", "is a character device, not a regular file"),
    ] {
        let d = variant(root, tiny, &format!("st-{name}"), |d| symlink(&d.join("model.safetensors"), target));
        cases.push(case(format!("st-{name}"), generate(&d), Expect::Error(msg)));
    }
    let f = variant(root, tiny, "st-fifo", |d| fifo(&d.join("model.safetensors")));
    cases.push(case("st-fifo", generate(&f), Expect::Error("is a FIFO, not a regular file")));

    // Sharded: an index naming the shards.
    let wm: serde_json::Map<String, Value> =
        names.iter().map(|n| (n.to_string(), json!("shard-1.safetensors"))).collect();
    let idx = |name: &str, index: Vec<u8>, extra: &dyn Fn(&Path)| {
        variant(root, tiny, &format!("st-{name}"), |d| {
            std::fs::rename(d.join("model.safetensors"), d.join("shard-1.safetensors")).unwrap();
            std::fs::write(d.join("model.safetensors.index.json"), index).unwrap();
            extra(d);
        })
    };
    let with = |k: &str, v: Value| {
        let mut m = wm.clone();
        m.insert(k.into(), v);
        json!({ "weight_map": m }).to_string().into_bytes()
    };
    let none = |_: &Path| {};
    let ok = idx("idx-ok", json!({ "weight_map": wm }).to_string().into_bytes(), &none);
    cases.push(case("st-idx-ok", generate(&ok), Expect::SameAs(generate_with(tiny, &["--no-cache"]))));
    let plain = "is not a plain relative name inside the model directory";
    for (name, index, msg) in [
        ("idx-abs-path", with("x", json!("/etc/passwd")), plain),
        ("idx-traversal", with("x", json!("../../../../etc/passwd")), plain),
        ("idx-dir", with("x", json!(".")), plain),
        ("idx-missing-shard", with("x", json!("shard-2.safetensors")), "which is missing"),
        ("idx-self", with("x", json!("model.safetensors.index.json")), st),
        ("idx-nonstring", with("x", json!(5)), "is not a file name"),
        ("idx-no-weightmap", br#"{"metadata": {}}"#.to_vec(), "no \"weight_map\" object"),
        ("idx-weightmap-array", br#"{"weight_map": [1, 2]}"#.to_vec(), "no \"weight_map\" object"),
        ("idx-empty-map", br#"{"weight_map": {}}"#.to_vec(), "missing from the checkpoint"),
        ("idx-notjson", b"\x00\x01garbage".to_vec(), "not valid JSON"),
    ] {
        cases.push(case(format!("st-{name}"), generate(&idx(name, index, &none)), Expect::Error(msg)));
    }
    let deep_idx = [b"{\"weight_map\":".to_vec(), vec![b'['; 200_000], vec![b']'; 200_000], b"}".to_vec()].concat();
    cases.push(case("st-idx-deep", generate(&idx("idx-deep", deep_idx, &none)), Expect::Error("not valid JSON")));
    // The same tensor in two shards: the one the weight map names is read, and only it.
    let dup = idx("idx-dup-tensor", with("model.norm.weight", json!("shard-2.safetensors")), &|d: &Path| {
        let mut t = read_tensors(&d.join("shard-1.safetensors")).0;
        let norm = t.get_mut("model.norm.weight").unwrap();
        norm.2 = 5.0f32.to_le_bytes().repeat(norm.2.len() / 4);
        write_tensors(&d.join("shard-2.safetensors"), &t, None);
    });
    let dup_ref = variant(root, tiny, "st-idx-dup-tensor-ref", |d| {
        edit_tensors(d, |t| {
            let norm = t.get_mut("model.norm.weight").unwrap();
            norm.2 = 5.0f32.to_le_bytes().repeat(norm.2.len() / 4);
        })
    });
    cases.push(case("st-idx-dup-tensor", generate(&dup), Expect::SameAs(generate_with(&dup_ref, &["--no-cache"]))));
}

// --- config.json ------------------------------------------------------------------------------------

fn configs(root: &Path, tiny: &Path, cases: &mut Vec<Case>) {
    let base: Value = serde_json::from_str(&std::fs::read_to_string(tiny.join("config.json")).unwrap()).unwrap();
    let cfg = |name: &str, raw: Vec<u8>| {
        variant(root, tiny, &format!("cfg-{name}"), |d| std::fs::write(d.join("config.json"), &raw).unwrap())
    };
    let modified = |name: &str, kv: &[(&str, Option<Value>)]| {
        let mut c = base.clone();
        for (k, v) in kv {
            match v {
                Some(v) => c[*k] = v.clone(),
                None => {
                    c.as_object_mut().unwrap().remove(*k);
                }
            }
        }
        cfg(name, c.to_string().into_bytes())
    };
    let outside = "is outside what int4 supports";
    /// A config case: its name, the keys set (`None`: removed), the words of the error.
    type ConfigCase<'a> = (&'a str, Vec<(&'a str, Option<Value>)>, &'a str);
    let table: Vec<ConfigCase<'_>> = vec![
        ("hidden-neg", vec![("hidden_size", Some(json!(-64)))], "not a non-negative integer"),
        ("hidden-zero", vec![("hidden_size", Some(json!(0)))], outside),
        ("hidden-huge", vec![("hidden_size", Some(json!(1u64 << 40)))], outside),
        ("hidden-u64max", vec![("hidden_size", Some(json!(u64::MAX)))], "not a multiple"),
        ("hidden-float", vec![("hidden_size", Some(json!(64.0)))], "not a non-negative integer"),
        ("hidden-string", vec![("hidden_size", Some(json!("64")))], "not a non-negative integer"),
        (
            "heads-not-dividing",
            vec![("num_attention_heads", Some(json!(5))), ("num_key_value_heads", Some(json!(5)))],
            "not a multiple",
        ),
        ("heads-zero", vec![("num_attention_heads", Some(json!(0)))], "not a multiple"),
        ("kvheads-zero", vec![("num_key_value_heads", Some(json!(0)))], "not a multiple"),
        ("kvheads-gt-heads", vec![("num_key_value_heads", Some(json!(8)))], "not a multiple"),
        ("kvheads-huge", vec![("num_key_value_heads", Some(json!(u64::MAX)))], "not a multiple"),
        ("headdim-odd", vec![("head_dim", Some(json!(15)))], "is odd"),
        ("headdim-huge", vec![("head_dim", Some(json!(4096)))], "shape"),
        ("vocab-zero", vec![("vocab_size", Some(json!(0)))], outside),
        ("vocab-small", vec![("vocab_size", Some(json!(10)))], "shape"),
        ("layers-huge", vec![("num_hidden_layers", Some(json!(4096)))], "missing from the checkpoint"),
        ("layers-zero", vec![("num_hidden_layers", Some(json!(0)))], outside),
        ("inter-zero", vec![("intermediate_size", Some(json!(0)))], outside),
        ("rope-nan-string", vec![("rope_theta", Some(json!("NaN")))], "\"rope_theta\" is \"NaN\", not a number"),
        ("rope-string-num", vec![("rope_theta", Some(json!("500000")))], "\"rope_theta\" is \"500000\", not a number"),
        ("rope-neg", vec![("rope_theta", Some(json!(-1.0)))], "must be finite"),
        ("rope-zero", vec![("rope_theta", Some(json!(0)))], "must be finite"),
        (
            "rope-llama3-bad",
            vec![(
                "rope_scaling",
                Some(
                    json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
                ),
            )],
            "distinct high and low",
        ),
        (
            "rope-llama3-missing",
            vec![("rope_scaling", Some(json!({"rope_type": "llama3", "factor": 8.0})))],
            "rope scaling lacks",
        ),
        (
            "rope-unknown-type",
            vec![("rope_scaling", Some(json!({"rope_type": "yarn", "factor": 4.0})))],
            "rope scaling type yarn is not supported",
        ),
        ("rope-scaling-nontype", vec![("rope_scaling", Some(json!({"type": 5})))], "not a string"),
        ("eps-neg", vec![("rms_norm_eps", Some(json!(-1.0)))], "must be finite"),
        ("eps-huge", vec![("rms_norm_eps", Some(json!(1e39)))], "must be finite"),
        ("eps-string", vec![("rms_norm_eps", Some(json!("1e-5")))], "not a number"),
        ("eos-overflow", vec![("eos_token_id", Some(json!((1u64 << 32) + 2)))], "not a token id"),
        ("eos-neg", vec![("eos_token_id", Some(json!(-1)))], "not a token id"),
        ("bos-huge", vec![("bos_token_id", Some(json!(1u64 << 40)))], "not a token id"),
        ("tie-string", vec![("tie_word_embeddings", Some(json!("true")))], "not true or false"),
        ("tie-zero", vec![("tie_word_embeddings", Some(json!(0)))], "not true or false"),
        ("missing-arch", vec![("architectures", None)], "\"architectures\" is missing"),
        ("arch-empty", vec![("architectures", Some(json!([])))], "\"architectures\" is missing"),
        ("arch-wrongtype", vec![("architectures", Some(json!("LlamaForCausalLM")))], "\"architectures\" is missing"),
        (
            "arch-gpt2",
            vec![("architectures", Some(json!(["GPT2LMHeadModel"])))],
            "architecture GPT2LMHeadModel is not supported",
        ),
        ("missing-hidden", vec![("hidden_size", None)], "\"hidden_size\" is missing"),
        ("missing-vocab", vec![("vocab_size", None)], "\"vocab_size\" is missing"),
        ("missing-layers", vec![("num_hidden_layers", None)], "\"num_hidden_layers\" is missing"),
        (
            "q-bits3",
            vec![(
                "quantization_config",
                Some(json!({"quant_method": "gptq", "bits": 3, "group_size": 32, "checkpoint_format": "gptq"})),
            )],
            "bits = 3 is not supported",
        ),
        (
            "q-group0",
            vec![(
                "quantization_config",
                Some(json!({"quant_method": "gptq", "bits": 4, "group_size": 0, "checkpoint_format": "gptq"})),
            )],
            "group_size",
        ),
        (
            "q-group48",
            vec![("quantization_config", Some(json!({"quant_method": "cpu_int4", "bits": 4, "group_size": 48})))],
            "group_size = 48 is not supported",
        ),
        ("q-not-object", vec![("quantization_config", Some(json!([1, 2])))], "is not a JSON object"),
        ("q-method-num", vec![("quantization_config", Some(json!({"quant_method": 5})))], "quant_method"),
        ("q-empty", vec![("quantization_config", Some(json!({})))], "quant_method"),
    ];
    for (name, kv, msg) in table {
        cases.push(case(format!("cfg-{name}"), generate(&modified(name, &kv)), Expect::Error(msg)));
    }
    // Accepted as they are: an untied head with no lm_head tensor uses the embedding; a null
    // quantization_config is none (transformers writes null for unset fields).
    for (name, kv) in [
        ("tie-false-nohead", vec![("tie_word_embeddings", Some(json!(false)))]),
        ("q-null", vec![("quantization_config", Some(Value::Null))]),
        ("maxpos-huge", vec![("max_position_embeddings", Some(json!(u64::MAX)))]),
    ] {
        cases.push(case(
            format!("cfg-{name}"),
            generate(&modified(name, &kv)),
            Expect::SameAs(generate_with(tiny, &["--no-cache"])),
        ));
    }
    let text = base.to_string();
    let nan = text.replace("\"rope_theta\":10000.0", "\"rope_theta\":NaN");
    let big_exp = text.replace("\"rope_theta\":10000.0", "\"rope_theta\":1e400");
    let dup = text.replace("\"hidden_size\":64", "\"hidden_size\":64,\"hidden_size\":128");
    let obj = text.trim_end_matches('}').to_string();
    let raw: Vec<(&str, Vec<u8>, &str)> = vec![
        ("rope-nan-literal", nan.into_bytes(), "not valid JSON"),
        ("rope-inf-overflow", big_exp.into_bytes(), "not valid JSON"),
        ("not-object", b"[1,2,3]".to_vec(), "\"architectures\" is missing"),
        ("empty-file", Vec::new(), "not valid JSON"),
        ("not-utf8", b"\xff\xfe{}".to_vec(), "not UTF-8"),
        ("bom", [b"\xef\xbb\xbf".to_vec(), text.clone().into_bytes()].concat(), "not valid JSON"),
        ("trailing-garbage", format!("{text}xyz").into_bytes(), "not valid JSON"),
        // serde_json keeps the last of two equal keys: 128, which the weights contradict.
        ("duplicate-key", dup.into_bytes(), "shape [64, 64], expected"),
        (
            "deep-nest",
            [format!("{obj},\"x\":").into_bytes(), vec![b'['; 1_000_000], vec![b']'; 1_000_000], b"}".to_vec()]
                .concat(),
            "recursion limit exceeded",
        ),
        (
            "deep-nest-over-cap",
            [format!("{obj},\"x\":").into_bytes(), vec![b'['; 3_000_000], vec![b']'; 3_000_000], b"}".to_vec()]
                .concat(),
            "larger than the 4194304 bytes",
        ),
        (
            "100MB",
            [format!("{obj},\"junk\":[").into_bytes(), b"1,".repeat(50_000_000), b"1]}".to_vec()].concat(),
            "larger than the 4194304 bytes",
        ),
        (
            "100MB-string",
            [format!("{obj},\"junk\":\"").into_bytes(), vec![b'a'; 100_000_000], b"\"}".to_vec()].concat(),
            "larger than the 4194304 bytes",
        ),
    ];
    for (name, bytes, msg) in raw {
        cases.push(case(format!("cfg-{name}"), generate(&cfg(name, bytes)), Expect::Error(msg)));
    }
    let fifo_cfg = variant(root, tiny, "cfg-fifo", |d| fifo(&d.join("config.json")));
    cases.push(case("cfg-fifo", generate(&fifo_cfg), Expect::Error("is a FIFO, not a regular file")));
    let fifo_gen = variant(root, tiny, "cfg-fifo-generation-config", |d| fifo(&d.join("generation_config.json")));
    cases.push(case("cfg-fifo-generation-config", generate(&fifo_gen), Expect::Error("is a FIFO, not a regular file")));
    let gen_eos = variant(root, tiny, "cfg-generation-eos-huge", |d| {
        std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id": [2, 4294967298]}"#).unwrap()
    });
    cases.push(case("cfg-generation-eos-huge", generate(&gen_eos), Expect::Error("not a token id")));
}

// --- quantized checkpoints --------------------------------------------------------------------------

fn quantized(root: &Path, tiny: &Path, bin: &Path, cache: &Path, cases: &mut Vec<Case>) {
    // The quantized bases, written by the binary under test itself.
    let make = |name: &str, args: &[&str]| -> PathBuf {
        let out = root.join(name);
        let _ = std::fs::remove_dir_all(&out);
        let mut inv = vec!["quantize".to_string(), s(tiny), "--out".into(), s(&out)];
        inv.extend(args.iter().map(|a| a.to_string()));
        let o = crate::harness::run(bin, root, cache, &Invocation::new(&inv));
        assert_eq!(o.code, Some(0), "quantize {args:?}: {}", o.stderr);
        out
    };
    let ga = make("q-gptq-asym", &["--format", "gptq", "--asym", "--group-size", "32"]);
    let gs = make("q-gptq-sym", &["--format", "gptq", "--group-size", "32"]);
    let ci = make("q-cpu-int4", &["--format", "cpu_int4", "--group-size", "32"]);
    const P: &str = "model.layers.0.mlp.down_proj"; // K 160, N 64
    const Q: &str = "model.layers.0.self_attn.q_proj";
    type Edit = Box<dyn Fn(&mut Tensors)>;
    type CfgEdit = Box<dyn Fn(&mut Value)>;
    let tq = |name: &str, base: &Path, edit: Option<Edit>, cfg: Option<CfgEdit>| -> PathBuf {
        variant(root, base, &format!("q-{name}"), |d| {
            if let Some(e) = edit {
                edit_tensors(d, |t| e(t));
            }
            if let Some(c) = cfg {
                edit_config(d, |v| c(v));
            }
        })
    };
    let shape = "shape";
    // A quantized case: its name, the checkpoint it edits, the edits, the words of the error.
    #[allow(clippy::type_complexity)]
    let err_cases: Vec<(&str, &Path, Option<Edit>, Option<CfgEdit>, &str)> = vec![
        (
            "scales-fewer-groups",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.scales")).unwrap();
                let row = (x.1[1] * 2) as usize;
                x.1[0] -= 1;
                x.2.truncate(x.2.len() - row);
            })),
            None,
            shape,
        ),
        (
            "qzeros-wrong-shape",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.qzeros")).unwrap();
                x.1[1] *= 2;
                x.2 = x.2.repeat(2);
            })),
            None,
            shape,
        ),
        (
            "qweight-short-k",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.qweight")).unwrap();
                let row = (x.1[1] * 4) as usize;
                x.1[0] -= 1;
                x.2.truncate(x.2.len() - row);
            })),
            None,
            shape,
        ),
        (
            "qweight-transposed",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.qweight")).unwrap();
                x.1.swap(0, 1);
            })),
            None,
            shape,
        ),
        (
            "qweight-f32",
            &ga,
            Some(Box::new(|t: &mut Tensors| t.get_mut(&format!("{P}.qweight")).unwrap().0 = "F32".into())),
            None,
            "dtype",
        ),
        (
            "scales-i16",
            &ga,
            Some(Box::new(|t: &mut Tensors| t.get_mut(&format!("{P}.scales")).unwrap().0 = "I16".into())),
            None,
            "dtype",
        ),
        (
            "scales-nan",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                t.get_mut(&format!("{P}.scales")).unwrap().2[0..2].copy_from_slice(&[0x00, 0x7e])
            })),
            None,
            "NaN",
        ),
        (
            "scales-inf",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                t.get_mut(&format!("{P}.scales")).unwrap().2[0..2].copy_from_slice(&[0x00, 0x7c])
            })),
            None,
            "inf",
        ),
        (
            "gidx-out-of-range",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.g_idx")).unwrap();
                let mut g = i32s(&x.2);
                g[3] = 99;
                x.2 = i32_bytes(&g);
            })),
            None,
            "g_idx",
        ),
        (
            "gidx-negative",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.g_idx")).unwrap();
                let mut g = i32s(&x.2);
                g[0] = i32::MIN;
                x.2 = i32_bytes(&g);
            })),
            None,
            "g_idx",
        ),
        (
            "gidx-all-zero",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.g_idx")).unwrap();
                x.2 = vec![0; x.2.len()];
            })),
            None,
            "g_idx",
        ),
        (
            "gidx-wrong-len",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.g_idx")).unwrap();
                x.1[0] += 1;
                x.2.extend_from_slice(&[0; 4]);
            })),
            None,
            shape,
        ),
        (
            "gidx-f32",
            &ga,
            Some(Box::new(|t: &mut Tensors| t.get_mut(&format!("{P}.g_idx")).unwrap().0 = "F32".into())),
            None,
            "dtype",
        ),
        (
            "qzeros-missing",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                t.remove(&format!("{P}.qzeros"));
            })),
            None,
            "missing",
        ),
        (
            "scales-missing",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                t.remove(&format!("{P}.scales"));
            })),
            None,
            "missing",
        ),
        (
            "qweight-missing",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                t.remove(&format!("{P}.qweight"));
            })),
            None,
            "missing",
        ),
        (
            "cfg-bits3",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["bits"] = json!(3))),
            "bits = 3",
        ),
        (
            "cfg-bits8",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["bits"] = json!(8))),
            "bits = 8",
        ),
        (
            "cfg-bits-string",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["bits"] = json!("4"))),
            "bits",
        ),
        (
            "cfg-group0",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["group_size"] = json!(0))),
            "group_size",
        ),
        (
            "cfg-group64-mismatch",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["group_size"] = json!(64))),
            shape,
        ),
        (
            "cfg-group-perchannel-mismatch",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["group_size"] = json!(-1))),
            shape,
        ),
        (
            "cfg-group-huge",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["group_size"] = json!(1u64 << 62))),
            "group_size",
        ),
        (
            "cfg-group-string",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["group_size"] = json!("32"))),
            "group_size",
        ),
        (
            "sym-qzeros-mixed",
            &gs,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.qzeros")).unwrap();
                let mut z = i32s(&x.2);
                z[0] = 0x1234_5678;
                x.2 = i32_bytes(&z);
            })),
            None,
            "symmetric GPTQ zeros should all be",
        ),
        (
            "gidx-qkv-differ",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{Q}.g_idx")).unwrap();
                let mut g = i32s(&x.2);
                g.reverse();
                x.2 = i32_bytes(&g);
            })),
            None,
            "cannot share one input",
        ),
        (
            "cfg-format-marlin",
            &ga,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["checkpoint_format"] = json!("marlin"))),
            "checkpoint_format",
        ),
        (
            "ci-packed-shape",
            &ci,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.weight_packed")).unwrap();
                let rows = x.1[0] as usize;
                x.1[1] -= 1;
                x.2.truncate(x.2.len() - rows);
            })),
            None,
            shape,
        ),
        (
            "ci-packed-i32",
            &ci,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.weight_packed")).unwrap();
                x.0 = "I32".into();
                x.1[1] /= 4;
            })),
            None,
            shape,
        ),
        (
            "ci-cfg-group-mismatch",
            &ci,
            None,
            Some(Box::new(|c: &mut Value| c["quantization_config"]["group_size"] = json!(128))),
            shape,
        ),
    ];
    for (name, base, edit, cfg, msg) in err_cases {
        cases.push(case(format!("q-{name}"), generate(&tq(name, base, edit, cfg)), Expect::Error(msg)));
    }
    // Valid but unusual: a real act-order permutation, zero scales, codes that claim the other symmetry.
    let ok_cases: Vec<(&str, &Path, Option<Edit>, Option<CfgEdit>)> = vec![
        (
            "gidx-valid-actorder",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.g_idx")).unwrap();
                let mut g = i32s(&x.2);
                g.reverse();
                x.2 = i32_bytes(&g);
            })),
            None,
        ),
        (
            "scales-zero",
            &ga,
            Some(Box::new(|t: &mut Tensors| {
                let x = t.get_mut(&format!("{P}.scales")).unwrap();
                x.2 = vec![0; x.2.len()];
            })),
            None,
        ),
    ];
    for (name, base, edit, cfg) in ok_cases {
        let d = tq(name, base, edit, cfg);
        cases.push(case(format!("q-{name}"), generate(&d), Expect::SameAs(generate_with(&d, &["--no-cache"]))));
    }
    // The bases themselves, warm against uncached, on both 4-bit paths.
    for base in [&ga, &gs, &ci] {
        for path in ["w4a16", "w4a8"] {
            let name = format!("q-base-{}-{path}", base.file_name().unwrap().to_string_lossy());
            cases.push(case(
                name,
                generate_with(base, &["--path", path]),
                Expect::SameAs(generate_with(base, &["--path", path, "--no-cache"])),
            ));
        }
    }
}

// --- tokenizers and templates -----------------------------------------------------------------------

fn tokenizers(root: &Path, tiny: &Path, cases: &mut Vec<Case>) {
    let tok: Value = serde_json::from_str(&std::fs::read_to_string(tiny.join("tokenizer.json")).unwrap()).unwrap();
    let with_tok = |name: &str, bytes: Vec<u8>| {
        variant(root, tiny, &format!("tok-{name}"), |d| std::fs::write(d.join("tokenizer.json"), &bytes).unwrap())
    };
    let edited = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut t = tok.clone();
        edit(&mut t);
        with_tok(name, t.to_string().into_bytes())
    };
    let chat = |d: &Path| Invocation::new(&["generate", &s(d), "w7 w8", "--chat", "--max-new-tokens", "3"]);
    let missing = variant(root, tiny, "tok-missing", |d| std::fs::remove_file(d.join("tokenizer.json")).unwrap());
    cases.push(case("tok-missing", generate(&missing), Expect::Error("the model has no tokenizer")));
    for (name, bytes) in [
        ("notjson", b"\x00garbage".to_vec()),
        ("empty", Vec::new()),
        ("deep", [b"{\"normalizer\":".to_vec(), vec![b'['; 500_000], vec![b']'; 500_000], b"}".to_vec()].concat()),
    ] {
        cases.push(case(format!("tok-{name}"), generate(&with_tok(name, bytes)), Expect::Error("tokenizer.json")));
    }
    let seq = |n: usize| {
        let mut v = json!({"type": "Lowercase"});
        for _ in 0..n {
            v = json!({"type": "Sequence", "normalizers": [v]});
        }
        v
    };
    cases.push(case(
        "tok-deep-seq",
        generate(&edited("deep-seq", &|t| t["normalizer"] = seq(100))),
        Expect::Error("tokenizer.json"),
    ));
    let rep = json!({"type": "Replace", "pattern": {"String": "w"}, "content": "wwwwwwwwww"});
    for (name, n) in [("expand-1e8", 8), ("expand-1e10", 10)] {
        let d = edited(name, &|t| t["normalizer"] = json!({"type": "Sequence", "normalizers": vec![rep.clone(); n]}));
        cases.push(case(format!("tok-{name}"), generate(&d), Expect::Error("its normalizers can make a text")));
    }
    // One character for another that NFKC expands eighteen times (three spaces among them), repeated.
    let nfkc = json!([{"type": "Replace", "pattern": {"String": " "}, "content": "\u{FDFA}"}, {"type": "NFKC"}]);
    let bypass = edited("expand-through-nfkc", &|t| {
        let steps: Vec<Value> = (0..20).flat_map(|_| nfkc.as_array().unwrap().clone()).collect();
        t["normalizer"] = json!({"type": "Sequence", "normalizers": steps});
    });
    cases.push(case("tok-expand-through-nfkc", generate(&bypass), Expect::Error("its normalizers can make a text")));
    // A real tokenizer's shape (SentencePiece: a Unicode normal form, then runs of spaces folded) loads.
    let sp = edited("sentencepiece-shape", &|t| {
        t["normalizer"] = json!({"type": "Sequence", "normalizers": [
            {"type": "NFKC"},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
        ]});
    });
    cases.push(case("tok-sentencepiece-shape", generate(&sp), Expect::Ok));
    let vocab_edit = |name: &str, key: &str, id: u64| edited(name, &|t| t["model"]["vocab"][key] = json!(id));
    cases.push(case(
        "tok-id-beyond-vocab",
        generate(&vocab_edit("id-beyond-vocab", "w3", 1_000_000)),
        Expect::Error("outside the vocabulary"),
    ));
    cases.push(case(
        "tok-id-u32max",
        generate(&vocab_edit("id-u32max", "w3", u64::from(u32::MAX))),
        Expect::Error("outside the vocabulary"),
    ));
    // An unknown-token name the vocabulary lacks: prompts of known words still work.
    cases.push(case(
        "tok-unk-missing",
        generate(&edited("unk-missing", &|t| t["model"]["unk_token"] = json!("NOPE"))),
        Expect::Ok,
    ));
    // A tokenizer smaller than the model's vocabulary: ids it has no token for are never drawn (decoding
    // one would be an error, so the run's success shows none was).
    let small = edited("vocab-smaller", &|t| {
        t["model"]["vocab"] = Value::Object((0..6).map(|i| (format!("w{i}"), json!(i))).collect());
    });
    cases.push(case(
        "tok-vocab-smaller",
        Invocation::new(&["generate", &s(&small), "--prompt-ids", "3,4,5", "--max-new-tokens", "8"]),
        Expect::Ok,
    ));
    cases.push(case(
        "tok-added-huge-id",
        generate(&edited("added-huge-id", &|t| {
            t["added_tokens"] = json!([{"id": 4294967295u64, "content": "ZZZ", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}])
        })),
        Expect::Ok,
    ));
    cases.push(case(
        "tok-redos",
        generate(&edited("redos", &|t| {
            t["pre_tokenizer"] =
                json!({"type": "Split", "pattern": {"Regex": "(a|a)*\\1b"}, "behavior": "Isolated", "invert": false})
        })),
        Expect::Ok,
    ));
    cases.push(case(
        "tok-bad-regex",
        generate(&edited("bad-regex", &|t| {
            t["pre_tokenizer"] =
                json!({"type": "Split", "pattern": {"Regex": "(((("}, "behavior": "Isolated", "invert": false})
        })),
        Expect::Error("tokenizer"),
    ));
    cases.push(case(
        "tok-model-unknown",
        generate(&edited("model-unknown", &|t| t["model"]["type"] = json!("Nope"))),
        Expect::Error("tokenizer"),
    ));
    cases.push(case(
        "tok-bpe-bad-merges",
        generate(&edited("bpe-bad-merges", &|t| {
            t["model"] = json!({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c", "x y"]})
        })),
        Expect::Error("tokenizer"),
    ));
    let huge = edited("huge-vocab", &|t| {
        t["model"]["vocab"] = Value::Object((0..1_000_000).map(|i| (format!("w{i}"), json!(i))).collect());
    });
    cases.push(case("tok-huge-vocab", generate(&huge), Expect::Ok));
    let fifo_tok = variant(root, tiny, "tok-fifo", |d| fifo(&d.join("tokenizer.json")));
    cases.push(case("tok-fifo", generate(&fifo_tok), Expect::Error("is a FIFO, not a regular file")));

    // tokenizer_config.json and templates.
    let tcfg = |name: &str, bytes: &[u8]| {
        variant(root, tiny, &format!("tok-{name}"), |d| std::fs::write(d.join("tokenizer_config.json"), bytes).unwrap())
    };
    cases.push(case("tok-cfg-notjson", chat(&tcfg("cfg-notjson", b"{not json")), Expect::Error("not valid JSON")));
    cases.push(case("tok-cfg-array", chat(&tcfg("cfg-array", b"[1,2]")), Expect::Error("the model has none")));
    cases.push(case(
        "tok-cfg-template-num",
        chat(&tcfg("cfg-template-num", br#"{"chat_template": 5}"#)),
        Expect::Error("the model has none"),
    ));
    cases.push(case(
        "tok-cfg-template-list",
        chat(&tcfg("cfg-template-list", br#"{"chat_template": [{"name": "default", "template": "{{ 1 }}"}]}"#)),
        Expect::Error("the model has none"),
    ));
    let tpl = |name: &str, jinja: &str| {
        variant(root, tiny, &format!("tok-tpl-{name}"), |d| {
            std::fs::write(d.join("chat_template.jinja"), jinja).unwrap()
        })
    };
    let budget_time = "did not finish";
    let budget_memory = "needs more than 256 MiB to render";
    for (name, jinja, expect) in [
        ("syntax", "{% for %}", Expect::Error("syntax error")),
        ("raise", "{{ raise_exception('nope') }}", Expect::Error("refused the conversation: nope")),
        ("tojson-undefined", "{{ nothing | tojson }}", Expect::Error("not JSON serializable")),
        ("tojson-bad-indent", "{{ messages | tojson(indent=[1]) }}", Expect::Error("indent")),
        ("strftime-bad", "{{ strftime_now('%Y %') }} w1", Expect::Error("strftime_now")),
        (
            "pycompat",
            "{% for m in messages %}{{ m.content.strip().lower().replace('w', 'w') }}{% endfor %}",
            Expect::Ok,
        ),
        ("undefined", "{{ foo.bar.baz }}", Expect::Error("undefined")),
        (
            "hang",
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}w5",
            Expect::Error(budget_time),
        ),
        (
            "mem",
            "{% set ns = namespace(s='w1 ') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            Expect::Error(budget_memory),
        ),
        (
            "mem-sequential",
            &format!("{{% set s = 'w1 ' %}}{}{{{{ s }}}}", "{% set s = s ~ s %}".repeat(40)),
            Expect::Error(budget_memory),
        ),
        ("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", Expect::Error("recursion")),
        ("empty-output", "", Expect::Error("is empty")),
        (
            "huge-output",
            "{% for i in range(100000) %}w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 {% endfor %}",
            Expect::Error("do not fit the context"),
        ),
        (
            "too-long-output",
            "{% for i in range(100000) %}{% for j in range(100) %}w1 w2 w3 w4 {% endfor %}{% endfor %}",
            Expect::Error("rendered more than"),
        ),
    ] {
        cases.push(case(format!("tok-tpl-{name}"), chat(&tpl(name, jinja)), expect));
    }
    let is_dir = variant(root, tiny, "tok-tpl-is-dir", |d| std::fs::create_dir(d.join("chat_template.jinja")).unwrap());
    cases.push(case("tok-tpl-is-dir", chat(&is_dir), Expect::Error("is a directory, not a regular file")));
    let big_tpl = tpl("over-cap", &"w1 ".repeat(400_000));
    cases.push(case("tok-tpl-over-cap", chat(&big_tpl), Expect::Error("larger than the 1048576 bytes")));
}

// --- the artifact cache -----------------------------------------------------------------------------

fn artifact_cache(root: &Path, tiny: &Path, cache: &Path, cases: &mut Vec<Case>) {
    let model = variant(root, tiny, "cache-model", |_| {});
    let tc = root.join("cache-tamper");
    let env_cache = s(&tc);
    let warm = generate(&model).env("INT4_CACHE_DIR", &env_cache);
    let reference = generate_with(&model, &["--no-cache"]);
    let artifact = |dir: &Path| -> PathBuf {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "int4art"))
            .unwrap()
    };
    // Each tampering starts from a fresh cold artifact.
    let fresh = {
        let (tc, model) = (tc.clone(), model.clone());
        move || -> PathBuf {
            let _ = std::fs::remove_dir_all(&tc);
            let st = std::process::Command::new(env!("CARGO_BIN_EXE_int4"))
                .args(["generate", model.to_str().unwrap(), "w3", "--max-new-tokens", "1"])
                .env("INT4_CACHE_DIR", &tc)
                .output()
                .unwrap();
            assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
            let a = artifact(&tc);
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o644)).unwrap();
            a
        }
    };
    let fresh = Arc::new(fresh);
    let tamper = |name: &str, edit: Arc<dyn Fn(&Path) + Send + Sync>, expect: Expect, inv: Invocation| {
        let f = fresh.clone();
        Case {
            name: format!("cache-{name}"),
            prepare: Some(Arc::new(move || {
                let a = f();
                edit(&a);
            })),
            inv,
            expect,
            cleanup: None,
        }
    };
    let flip_at = |frac: f64, bits: u8| -> Arc<dyn Fn(&Path) + Send + Sync> {
        Arc::new(move |a: &Path| {
            let mut b = std::fs::read(a).unwrap();
            let i = ((b.len() as f64) * frac) as usize;
            b[i] ^= bits;
            std::fs::write(a, b).unwrap();
        })
    };
    let same = || Expect::SameAs(reference.clone());
    cases.push(tamper("warm-untampered", Arc::new(|_: &Path| {}), same(), warm.clone()));
    for (i, frac) in [0.5, 0.8, 0.99].into_iter().enumerate() {
        cases.push(tamper(&format!("payload-flip-{i}"), flip_at(frac, 0xff), same(), warm.clone()));
    }
    cases.push(tamper("payload-1bit", flip_at(0.7, 0x10), same(), warm.clone()));
    let at = |off: u64, bytes: Vec<u8>| -> Arc<dyn Fn(&Path) + Send + Sync> {
        Arc::new(move |a: &Path| {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new().write(true).open(a).unwrap();
            f.seek(SeekFrom::Start(off)).unwrap();
            f.write_all(&bytes).unwrap();
        })
    };
    cases.push(tamper(
        "header-byte-40",
        Arc::new(|a: &Path| {
            let mut b = std::fs::read(a).unwrap();
            b[40] ^= 1;
            std::fs::write(a, b).unwrap();
        }),
        same(),
        warm.clone(),
    ));
    cases.push(tamper("bad-magic", at(0, b"XXXX".to_vec()), same(), warm.clone()));
    cases.push(tamper("bad-version", at(8, vec![9]), same(), warm.clone()));
    cases.push(tamper("header-len-2p63", at(16, (1u64 << 63).to_le_bytes().to_vec()), same(), warm.clone()));
    cases.push(tamper("header-len-u64max", at(16, u64::MAX.to_le_bytes().to_vec()), same(), warm.clone()));
    cases.push(tamper(
        "swap-section-names",
        Arc::new(|a: &Path| {
            let b = std::fs::read(a).unwrap();
            let n = u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize;
            let header = String::from_utf8(b[24..24 + n].to_vec()).unwrap();
            let (x, y) = ("model.layers.0.self_attn.qkv.", "model.layers.1.self_attn.qkv.");
            let swapped = header.replace(x, "@@").replace(y, x).replace("@@", y);
            let mut out = b.clone();
            out[24..24 + n].copy_from_slice(swapped.as_bytes());
            std::fs::write(a, out).unwrap();
        }),
        same(),
        warm.clone(),
    ));
    let truncate = |to: Box<dyn Fn(u64) -> u64 + Send + Sync>| -> Arc<dyn Fn(&Path) + Send + Sync> {
        Arc::new(move |a: &Path| {
            let len = std::fs::metadata(a).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(a).unwrap().set_len(to(len)).unwrap();
        })
    };
    cases.push(tamper("truncated-half", truncate(Box::new(|l| l / 2)), same(), warm.clone()));
    cases.push(tamper("truncated-10B", truncate(Box::new(|_| 10)), same(), warm.clone()));
    cases.push(tamper("truncated-0B", truncate(Box::new(|_| 0)), same(), warm.clone()));
    cases.push(tamper("extended-64", truncate(Box::new(|l| l + 64)), same(), warm.clone()));
    for (name, target) in
        [("symlink-passwd", "/etc/passwd"), ("symlink-dev-zero", "/dev/zero"), ("symlink-dev-urandom", "/dev/urandom")]
    {
        cases.push(tamper(name, Arc::new(move |a: &Path| symlink(a, target)), same(), warm.clone()));
    }
    cases.push(tamper(
        "symlink-loop",
        Arc::new(|a: &Path| {
            let name = a.file_name().unwrap().to_str().unwrap().to_string();
            symlink(a, &name)
        }),
        same(),
        warm.clone(),
    ));
    cases.push(tamper(
        "artifact-is-dir",
        Arc::new(|a: &Path| {
            std::fs::remove_file(a).unwrap();
            std::fs::create_dir(a).unwrap();
        }),
        same(),
        warm.clone(),
    ));
    cases.push(tamper("artifact-is-fifo", Arc::new(|a: &Path| fifo(a)), same(), warm.clone()));
    let cache_cmd = |action: &str| Invocation::new(&["cache", action]).env("INT4_CACHE_DIR", &env_cache);
    cases.push(tamper("ls-artifact-fifo", Arc::new(|a: &Path| fifo(a)), Expect::Ok, cache_cmd("ls")));
    cases.push(tamper(
        "verify-artifact-fifo",
        Arc::new(|a: &Path| fifo(a)),
        Expect::Exit(1, "CORRUPT"),
        cache_cmd("verify"),
    ));
    cases.push(tamper(
        "verify-payload-flip",
        flip_at(0.6, 0xff),
        Expect::Exit(1, "payload blake3 does not match"),
        cache_cmd("verify"),
    ));
    let mut evict = cache_cmd("evict");
    evict.args.push("0".into());
    cases.push(tamper("evict-artifact-fifo", Arc::new(|a: &Path| fifo(a)), Expect::Ok, evict));
    // sources.json: garbage, a directory, a FIFO, hashes that lie.
    let sources = |edit: Arc<dyn Fn(&Path) + Send + Sync>| -> Arc<dyn Fn(&Path) + Send + Sync> {
        Arc::new(move |a: &Path| edit(&a.parent().unwrap().join("sources.json")))
    };
    cases.push(tamper(
        "sources-garbage",
        sources(Arc::new(|p: &Path| std::fs::write(p, "{garbage").unwrap())),
        same(),
        warm.clone(),
    ));
    cases.push(tamper(
        "sources-is-dir",
        sources(Arc::new(|p: &Path| {
            std::fs::remove_file(p).unwrap();
            std::fs::create_dir(p).unwrap();
        })),
        same(),
        warm.clone(),
    ));
    cases.push(tamper("sources-fifo", sources(Arc::new(|p: &Path| fifo(p))), same(), warm.clone()));
    cases.push(tamper(
        "sources-wrong-hash",
        sources(Arc::new(|p: &Path| {
            let t = std::fs::read_to_string(p).unwrap();
            let mut v: Value = serde_json::from_str(&t).unwrap();
            for r in v["files"].as_object_mut().unwrap().values_mut() {
                r["blake3"] = json!("0".repeat(64));
            }
            std::fs::write(p, v.to_string()).unwrap();
        })),
        same(),
        warm.clone(),
    ));
    // A lock held by another process: the load waits a bounded time, then rebuilds.
    let holder: Arc<std::sync::Mutex<Option<std::fs::File>>> = Arc::new(std::sync::Mutex::new(None));
    let (h1, h2) = (holder.clone(), holder.clone());
    let f = fresh.clone();
    cases.push(Case {
        name: "cache-artifact-locked".into(),
        prepare: Some(Arc::new(move || {
            use std::os::fd::AsRawFd;
            let a = f();
            let file = std::fs::File::open(&a).unwrap();
            // SAFETY: the descriptor is open for the call; flock changes only its advisory lock.
            assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
            *h1.lock().unwrap() = Some(file);
        })),
        inv: warm.clone(),
        expect: Expect::SameAs(reference.clone()),
        cleanup: Some(Arc::new(move || {
            h2.lock().unwrap().take();
        })),
    });
    // Where the cache directory cannot be.
    let blocker = root.join("cache-blocker");
    std::fs::write(&blocker, "not a directory").unwrap();
    for (name, dir) in [
        ("dir-is-file", s(&blocker)),
        ("dir-under-file", s(&blocker.join("sub"))),
        ("dir-in-proc", "/proc/int4-cache".to_string()),
    ] {
        cases.push(case(
            format!("cache-{name}"),
            generate(&model).env("INT4_CACHE_DIR", &dir),
            Expect::SameAs(reference.clone()),
        ));
    }
    // Only the store's own, dead temporaries are removed.
    let tmpdir = root.join("cache-temporaries");
    let (t1, t2) = (tmpdir.clone(), tmpdir.clone());
    cases.push(Case {
        name: "cache-clear-keeps-foreign-files".into(),
        prepare: Some(Arc::new(move || {
            let _ = std::fs::remove_dir_all(&t1);
            std::fs::create_dir_all(&t1).unwrap();
            std::fs::write(t1.join(".notes.tmp"), "mine").unwrap();
            std::fs::write(t1.join(format!(".{}.77.0.tmp", "ab".repeat(32))), vec![0u8; 1 << 20]).unwrap();
        })),
        inv: Invocation::new(&["cache", "clear"]).env("INT4_CACHE_DIR", &s(&tmpdir)),
        expect: Expect::Ok,
        cleanup: Some(Arc::new(move || {
            assert!(t2.join(".notes.tmp").exists(), "cache clear removed a file that only looks like a temporary");
            assert!(!t2.join(format!(".{}.77.0.tmp", "ab".repeat(32))).exists(), "a dead writer's temporary was kept");
        })),
    });
    // A killed writer's temporary is listed (and counted) by `cache ls`.
    let tmp_ls = root.join("cache-temporary-ls");
    let t3 = tmp_ls.clone();
    cases.push(Case {
        name: "cache-ls-lists-a-dead-writers-temporary".into(),
        prepare: Some(Arc::new(move || {
            let _ = std::fs::remove_dir_all(&t3);
            std::fs::create_dir_all(&t3).unwrap();
            std::fs::write(t3.join(format!(".{}.77.0.tmp", "cd".repeat(32))), vec![0u8; 4096]).unwrap();
        })),
        inv: Invocation::new(&["cache", "ls"]).env("INT4_CACHE_DIR", &s(&tmp_ls)),
        expect: Expect::Exit(0, "left by a writer that died"),
        cleanup: None,
    });
    // Truncated while a chat has it mapped: reported (exit 74, the artifact named), never a bare SIGBUS
    // or a reply computed from the missing bytes.
    let tc2 = tc.clone();
    let mut live = Invocation::new(&["chat", &s(&model), "--max-new-tokens", "4"]).env("INT4_CACHE_DIR", &env_cache);
    live.live = Some(crate::harness::Live {
        first: b"w3 w4\n".to_vec(),
        wait: std::time::Duration::from_millis(800),
        then: b"w5 w6\n".to_vec(),
        hook: Arc::new(move || {
            let a = artifact(&tc2);
            std::fs::OpenOptions::new().write(true).open(&a).unwrap().set_len(4096).unwrap();
        }),
    });
    let f2 = fresh.clone();
    cases.push(Case {
        name: "cache-truncated-under-a-running-chat".into(),
        prepare: Some(Arc::new(move || {
            f2();
        })),
        inv: live,
        expect: Expect::Exit(74, "was truncated while this process had it mapped"),
        cleanup: None,
    });
    let _ = cache;
}

// --- warm against uncached, every path and ISA cap --------------------------------------------------

fn key_matrix(tiny: &Path, cases: &mut Vec<Case>) {
    let prompt = "w3 w4 w7 w9 w11 w13 w17 w19 w23 w29 w31 w37 w41 w43 w47 w53 w59 w61";
    /// The environment and the flags of one combination.
    type Combo<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
    let combos: [Combo<'_>; 21] = [
        (&[], &["--path", "w4a16"]),
        (&[], &["--path", "w4a16", "--head-bits", "4"]),
        (&[], &["--path", "w4a16", "--group", "64"]),
        (&[], &["--path", "wna16"]),
        (&[], &["--path", "wna16", "--head-bits", "4"]),
        (&[], &["--path", "w4a8", "--head-bits", "4"]),
        (&[], &["--path", "w4a8"]),
        (&[], &["--path", "w4a8", "--act-scales", "per-token"]),
        (&[], &["--path", "w4a8", "--head-bits", "8"]),
        (&[], &["--path", "w4a8", "--head-bits", "8", "--act-scales", "per-token"]),
        (&[], &["--path", "w4a8", "--kv", "f32"]),
        (&[], &["--path", "auto", "--priority", "fidelity"]),
        (&[("INT4_ISA", "avx2")], &["--path", "w4a16"]),
        (&[("INT4_ISA", "avx2")], &["--path", "w4a8"]),
        (&[("INT4_ISA", "portable")], &["--path", "w4a16"]),
        (&[("INT4_ISA", "portable")], &["--path", "w4a8"]),
        (&[("INT4_DISABLE", "avx512vbmi")], &["--path", "w4a16"]),
        (&[("INT4_DISABLE", "avx512bf16")], &["--path", "w4a16"]),
        (&[("INT4_DISABLE", "avx512vnni,avx512")], &["--path", "w4a8"]),
        (&[], &["--path", "bf16"]),
        (&[], &["--path", "f32"]),
    ];
    for (i, (env, opts)) in combos.iter().enumerate() {
        let mk = |no_cache: bool| {
            let mut args = vec!["generate".to_string(), s(tiny), prompt.into(), "--max-new-tokens".into(), "16".into()];
            args.extend(opts.iter().map(|o| o.to_string()));
            if no_cache {
                args.push("--no-cache".into());
            }
            let mut inv = Invocation::new(&args);
            for (k, v) in *env {
                inv = inv.env(k, v);
            }
            inv
        };
        let name = format!(
            "key-{i:02}-{}{}",
            env.iter().map(|(k, v)| format!("{k}={v} ")).collect::<String>(),
            opts.join(" ")
        );
        // Twice: the first may build the artifact, the second maps it.
        cases.push(case(format!("{name} (cold)"), mk(false), Expect::SameAs(mk(true))));
        cases.push(case(format!("{name} (warm)"), mk(false), Expect::SameAs(mk(true))));
    }
}

// --- flags, environment, standard input and output --------------------------------------------------

fn flags_and_streams(root: &Path, tiny: &Path, cases: &mut Vec<Case>) {
    let t = s(tiny);
    let g = |extra: &[&str]| generate_with(tiny, extra);
    let errors: Vec<(&str, Invocation, &str)> = vec![
        ("temperature-nan", g(&["--temperature", "NaN"]), "is not a temperature"),
        ("temperature-negative", g(&["--temperature=-1"]), "is not a temperature"),
        ("temperature-inf", g(&["--temperature", "inf"]), "is not a temperature"),
        ("top-p-2", g(&["--temperature", "0.7", "--top-p", "2"]), "is not a probability mass"),
        ("top-p-negative", g(&["--temperature", "0.7", "--top-p=-1"]), "is not a probability mass"),
        ("top-p-nan", g(&["--temperature", "0.7", "--top-p", "NaN"]), "is not a probability mass"),
        ("top-k-without-temperature", g(&["--top-k", "5"]), "needs --temperature"),
        ("top-p-without-temperature", g(&["--top-p", "0.5"]), "needs --temperature"),
        ("greedy-and-temperature", g(&["--greedy", "--temperature", "0.5"]), "contradict"),
        ("stop-empty", g(&["--stop", ""]), "an empty stop string"),
        ("min-p-2", g(&["--temperature", "0.7", "--min-p", "2"]), "min_p"),
        ("min-p-nan", g(&["--temperature", "0.7", "--min-p", "NaN"]), "min_p"),
        ("min-p-without-temperature", g(&["--min-p", "0.1"]), "needs --temperature"),
        ("greedy-and-top-k", g(&["--greedy", "--top-k", "3"]), "--greedy turns off"),
        ("repetition-penalty-0", g(&["--repetition-penalty", "0"]), "repetition_penalty"),
        ("repetition-penalty-inf", g(&["--repetition-penalty", "inf"]), "repetition_penalty"),
        ("presence-penalty-3", g(&["--presence-penalty", "3"]), "presence_penalty"),
        ("presence-penalty-minus-3", g(&["--presence-penalty", "-3"]), "presence_penalty"),
        ("frequency-penalty-nan", g(&["--frequency-penalty", "NaN"]), "frequency_penalty"),
        ("logprobs-21", g(&["--json", "--logprobs", "21"]), "at most 20"),
        ("max-new-tokens-0", Invocation::new(&["generate", &t, "w1", "--max-new-tokens", "0"]), "give at least 1"),
        ("stop-too-long", g(&["--stop", &"w1 ".repeat(400)]), "at most 1024"),
        ("threads-zero", g(&["--threads", "0"]), "--threads 0"),
        ("isa-garbage", g(&[]).env("INT4_ISA", "garbage"), "INT4_ISA=\"garbage\" is not one of"),
        ("disable-garbage", g(&[]).env("INT4_DISABLE", "avx9000"), "INT4_DISABLE names"),
        ("cache-max-garbage", g(&[]).env("INT4_CACHE_MAX_BYTES", "garbage"), "INT4_CACHE_MAX_BYTES=\"garbage\""),
        ("cpu-profile-dev-zero", g(&["--path", "auto"]).env("INT4_CPU_PROFILE", "/dev/zero"), "is a character device"),
        ("cpu-profile-missing", g(&["--path", "auto"]).env("INT4_CPU_PROFILE", "/nonexistent"), "CPU profile"),
        ("prompt-ids-garbage", Invocation::new(&["generate", &t, "--prompt-ids", "1,x"]), "--prompt-ids"),
        (
            "prompt-ids-beyond-vocab",
            Invocation::new(&["generate", &t, "--prompt-ids", "1,4000000000"]),
            "outside the vocabulary",
        ),
        ("no-prompt", Invocation::new(&["generate", &t]), "give a prompt"),
        ("dir-nonexistent", Invocation::new(&["generate", "/nonexistent", "w1"]), "no such file or directory"),
        (
            "dir-is-file",
            Invocation::new(&["generate", &s(&tiny.join("config.json")), "w1"]),
            "is not a model directory",
        ),
        ("dir-is-devnull", Invocation::new(&["generate", "/dev/null", "w1"]), "is not a model"),
        ("context-zero", g(&["--context", "0"]), "context"),
    ];
    for (name, inv, msg) in errors {
        cases.push(case(format!("flag-{name}"), inv, Expect::Error(msg)));
    }
    cases.push(case("flag-threads-huge", g(&["--threads", "100000"]), Expect::OkWarning("more than the")));
    let every = [
        "--temperature",
        "0.9",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--min-p",
        "0.05",
        "--repetition-penalty",
        "1.2",
        "--presence-penalty",
        "-0.5",
        "--frequency-penalty",
        "0.5",
        "--seed",
        "3",
        "--stop",
        "w9",
    ];
    cases.push(case("flag-sampling-every-value", g(&every), Expect::Ok));
    // A seeded sampled run is the same run again (and through the cache or not).
    let seeded = |extra: &[&str]| {
        let args = ["generate", &t, "w3 w4 w7", "--max-new-tokens", "24", "--temperature", "1.5", "--seed", "7"];
        Invocation::new(&[&args[..], extra].concat())
    };
    cases.push(case("flag-seeded-run-repeats", seeded(&[]), Expect::SameAs(seeded(&["--no-cache"]))));
    cases.push(case(
        "flag-disable-avx512-auto",
        g(&["--path", "auto"]).env("INT4_DISABLE", "avx512"),
        Expect::SameAs(g(&["--path", "auto", "--no-cache"]).env("INT4_DISABLE", "avx512")),
    ));
    // Usage errors (clap) exit 2.
    for (name, args) in [
        ("cache-bad-action", vec!["cache", "frobnicate"]),
        ("cache-evict-nobytes", vec!["cache", "evict"]),
        ("cache-evict-abc", vec!["cache", "evict", "abc"]),
        ("cache-evict-neg", vec!["cache", "evict", "-1"]),
        ("path-unknown", vec!["generate", &t, "w1", "--path", "w3a7"]),
        ("seed-garbage", vec!["generate", &t, "w1", "--seed", "x"]),
        ("seed-negative", vec!["generate", &t, "w1", "--seed=-1"]),
        ("logprobs-garbage", vec!["generate", &t, "w1", "--logprobs", "many"]),
        ("dir-empty-string", vec!["generate", "", "w1"]),
    ] {
        cases.push(case(format!("usage-{name}"), Invocation::new(&args), Expect::Usage("")));
    }
    cases.push(case(
        "cache-ls-nonexistent",
        Invocation::new(&["cache", "ls"]).env("INT4_CACHE_DIR", "/nonexistent/x"),
        Expect::Ok,
    ));
    cases.push(case("cache-ls-etc", Invocation::new(&["cache", "ls"]).env("INT4_CACHE_DIR", "/etc"), Expect::Ok));
    cases.push(case("info-json", Invocation::new(&["info", &t, "--json"]), Expect::Ok));

    // `int4 bench`: llama-bench's flags, each bad value refused by name.
    let b =
        |extra: &[&str]| Invocation::new(&[&["bench", "-m", &t, "-p", "8", "-n", "4", "-r", "1"][..], extra].concat());
    for (name, inv, expect) in [
        ("bench-every-format", b(&["-o", "jsonl", "-pg", "8,2", "-t", "1"]), Expect::Ok),
        ("bench-json", b(&["-o", "json", "--path", "w4a16,w4a8"]), Expect::Ok),
        ("bench-csv", b(&["-o", "csv"]), Expect::Ok),
        ("bench-md-type-k", b(&["-o", "md"]), Expect::Exit(0, "| type_k |")),
        (
            "bench-act-scales-per-token",
            b(&["-o", "jsonl", "--path", "w4a8", "--act-scales", "per-token"]),
            Expect::Exit(0, "\"act_scales\":\"per-token\""),
        ),
        ("bench-act-scales-bad", b(&["--act-scales", "per-row"]), Expect::Usage("per-row")),
        ("bench-r0", Invocation::new(&["bench", "-m", &t, "-r", "0"]), Expect::Error("-r 0")),
        ("bench-t0", b(&["-t", "0"]), Expect::Error("-t 0")),
        ("bench-t-huge", b(&["-t", "100000"]), Expect::Error("-t 100000")),
        (
            "bench-nothing",
            Invocation::new(&["bench", "-m", &t, "-p", "0", "-n", "0"]),
            Expect::Error("nothing to time"),
        ),
        ("bench-format-xml", b(&["-o", "xml"]), Expect::Usage("xml")),
        ("bench-pg-one", b(&["-pg", "512"]), Expect::Usage("pp,tg")),
        ("bench-pg-garbage", b(&["-pg", "a,b"]), Expect::Usage("invalid digit")),
        ("bench-unknown-flag", b(&["--frobnicate"]), Expect::Usage("--frobnicate")),
        ("bench-no-model", Invocation::new(&["bench"]), Expect::Usage("--model")),
        (
            "bench-missing-model",
            Invocation::new(&["bench", "-m", "/nonexistent/model"]),
            Expect::Error("/nonexistent/model"),
        ),
        ("bench-group-48", b(&["--group", "48"]), Expect::Error("--group 48")),
        ("bench-head-bits-5", b(&["--head-bits", "5"]), Expect::Error("--head-bits 5")),
        ("bench-context-over", b(&["-p", "100000"]), Expect::Error("the model's context is")),
        (
            "serve-read-timeout-0",
            Invocation::new(&["serve", &t, "--port", "0", "--request-read-timeout", "0"]),
            Expect::Error("--request-read-timeout"),
        ),
        (
            "serve-max-connections-0",
            Invocation::new(&["serve", &t, "--port", "0", "--max-connections", "0"]),
            Expect::Error("--max-connections"),
        ),
        (
            "serve-prefix-cache-huge",
            Invocation::new(&["serve", &t, "--port", "0", "--prefix-cache", "1025"]),
            Expect::Error("--prefix-cache 1025: at most 1024"),
        ),
    ] {
        cases.push(case(name, inv, expect));
    }

    // Standard output: a closed pipe stops at once, silently; a full device is one line and status 1.
    cases.push(case("flag-head-bits-5", g(&["--head-bits", "5"]), Expect::Error("--head-bits 5: 4 or 8")));
    cases.push(case("flag-group-48", g(&["--group", "48"]), Expect::Error("--group 48")));
    cases.push(case("flag-group-huge", g(&["--group", "99999999999999999999"]), Expect::Usage("--group")));
    cases.push(case("flag-kv-f8", g(&["--kv", "f8"]), Expect::Usage("[possible values: f32, f16]")));
    cases.push(case(
        "info-head-bits-3",
        Invocation::new(&["info", &t, "--head-bits", "3"]),
        Expect::Error("--head-bits 3"),
    ));
    cases.push(case(
        "info-priority-bad",
        Invocation::new(&["info", &t, "--priority", "fastest"]),
        Expect::Error("--priority fastest: expected speed or fidelity"),
    ));
    let mut head = Invocation::new(&["generate", &t, "w3", "--max-new-tokens", "100000", "--context", "200000"]);
    head.close_stdout_after = Some(4);
    cases.push(case("stdout-closed-pipe", head, Expect::Ok));
    let mut full = g(&[]);
    full.stdout_to = Some(PathBuf::from("/dev/full"));
    cases.push(case("stdout-dev-full", full, Expect::Error("cannot write to standard output")));
    let calib = root.join("calib.txt");
    std::fs::write(&calib, "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10\n".repeat(200)).unwrap();
    let mut eval_full = Invocation::new(&[
        "eval",
        &t,
        "--ref",
        "f32",
        "--ctx",
        "16",
        "--text",
        &s(&calib),
        "--json",
        &s(&root.join("eval.json")),
    ]);
    eval_full.stdout_to = Some(PathBuf::from("/dev/full"));
    let eval_json = root.join("eval.json");
    cases.push(Case {
        name: "eval-dev-full-keeps-json".into(),
        prepare: None,
        inv: eval_full,
        expect: Expect::Error("cannot write to standard output"),
        cleanup: Some(Arc::new(move || assert!(eval_json.exists(), "eval lost its results when stdout failed"))),
    });

    // Chat: a bad line is skipped, an endless one ends the chat, a full context drops old turns.
    let chat = |extra: &[&str]| {
        let mut args = vec!["chat", t.as_str(), "--max-new-tokens", "4"];
        args.extend_from_slice(extra);
        Invocation::new(&args)
    };
    let two_replies =
        |o: &crate::harness::Outcome| o.stdout_text().lines().filter(|l| !l.trim().is_empty()).count() >= 2;
    let _ = two_replies;
    cases.push(case(
        "chat-invalid-utf8-line",
        chat(&[]).stdin(b"w3 \xff\xfe w4\nw5\n".to_vec()),
        Expect::OkWarning("not UTF-8 text"),
    ));
    cases.push(case("chat-nul-bytes", chat(&[]).stdin(b"w1\0w2\n".to_vec()), Expect::Ok));
    let long_line = format!("{}\nw2 w3\n", "w1 ".repeat(400_000));
    cases.push(case(
        "chat-line-over-cap",
        chat(&[]).stdin(long_line.into_bytes()),
        Expect::OkWarning("longer than 1048576 bytes"),
    ));
    cases.push(case("chat-endless-input", chat(&[]).stdin(vec![b'w'; 70 << 20]), Expect::Error("has no line end")));
    let turn_too_big = format!("{}\nw2 w3\n", "w1 ".repeat(100));
    cases.push(case(
        "chat-turn-larger-than-context",
        chat(&["--context", "64"]).stdin(turn_too_big.into_bytes()),
        Expect::OkWarning("more than the context"),
    ));
    let many = "w1 w2 w3 w4 w5 w6 w7 w8\n".repeat(40);
    cases.push(case(
        "chat-fills-context",
        chat(&["--context", "128"]).stdin(many.into_bytes()),
        Expect::OkWarning("dropped the"),
    ));
    cases.push(case(
        "chat-sampling-flags",
        chat(&[
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--min-p",
            "0.05",
            "--repetition-penalty",
            "1.1",
            "--stop",
            "w3",
        ])
        .stdin(b"w1\nw2\n".to_vec()),
        Expect::Ok,
    ));
    cases.push(case(
        "chat-top-k-without-temperature",
        chat(&["--top-k", "4"]).stdin(b"w1\n".to_vec()),
        Expect::Error("needs --temperature"),
    ));
    cases.push(case(
        "chat-temperature-nan",
        chat(&["--temperature", "NaN"]).stdin(b"w1\n".to_vec()),
        Expect::Error("is not a temperature"),
    ));

    // quantize and eval arguments.
    let q = |extra: &[&str], out: &str| {
        let mut args = vec!["quantize".to_string(), t.clone(), "--out".into(), s(&root.join(out))];
        args.extend(extra.iter().map(|a| a.to_string()));
        Invocation::new(&args)
    };
    let c = s(&calib);
    let quant: Vec<(&str, Invocation, Expect)> = vec![
        ("group0", q(&["--format", "gptq", "--group-size", "0"], "qo-a"), Expect::Error("group")),
        ("group48", q(&["--format", "gptq", "--group-size", "48"], "qo-a"), Expect::Error("group")),
        ("group-neg5", q(&["--format", "gptq", "--group-size", "-5"], "qo-a"), Expect::Error("group")),
        ("out-is-input", q(&["--format", "gptq", "--force"], "tiny"), Expect::Error("")),
        ("out-inside-input", q(&["--format", "gptq", "--force"], "tiny/sub"), Expect::Error("")),
        (
            "out-parent-of-input",
            Invocation::new(&["quantize", &t, "--format", "gptq", "--force", "--out", &s(root)]),
            Expect::Error(""),
        ),
        ("asym-cpu-int4", q(&["--format", "cpu_int4", "--asym"], "qo-b"), Expect::Error("asym")),
        (
            "calib-with-rtn",
            q(&["--format", "gptq", "--calib", &c], "qo-b"),
            Expect::Error("--calib is for --method gptq"),
        ),
        (
            "gptq-calib-seq1",
            q(&["--format", "gptq", "--method", "gptq", "--calib", &c, "--calib-seq", "1"], "qo-c"),
            Expect::Error("calib"),
        ),
        (
            "gptq-damp-nan",
            q(&["--format", "gptq", "--method", "gptq", "--calib", &c, "--damp", "NaN"], "qo-c"),
            Expect::Error("--damp"),
        ),
        (
            "gptq-calib-tokens0",
            q(&["--format", "gptq", "--method", "gptq", "--calib", &c, "--calib-tokens", "0"], "qo-c"),
            Expect::Error("--calib-tokens 0"),
        ),
        (
            "gptq-calib-missing",
            q(&["--format", "gptq", "--method", "gptq", "--calib", "/nonexistent"], "qo-c"),
            Expect::Error("No such file"),
        ),
        (
            "gptq-calib-binary",
            q(&["--format", "gptq", "--method", "gptq", "--calib", &s(&tiny.join("model.safetensors"))], "qo-c"),
            Expect::Error("not UTF-8"),
        ),
        (
            "gptq-calib-dev-zero",
            q(&["--format", "gptq", "--method", "gptq", "--calib", "/dev/zero"], "qo-c"),
            Expect::Error("character device"),
        ),
        ("threads0", q(&["--format", "cpu_int4", "--threads", "0"], "qo-t0"), Expect::Error("--threads 0")),
        (
            "ignore-garbage",
            q(&["--format", "cpu_int4", "--ignore", "nope,model.layers.99"], "qo-ig"),
            Expect::Error("nope"),
        ),
        ("gptq-ok", q(&["--format", "gptq", "--method", "gptq", "--calib", &c], "qo-gptq"), Expect::Ok),
    ];
    for (name, inv, expect) in quant {
        cases.push(case(format!("quantize-{name}"), inv, expect));
    }
    let ev = |extra: &[&str]| {
        let mut args = vec!["eval".to_string(), t.clone(), "--ref".into(), "f32".into(), "--text".into(), c.clone()];
        args.extend(extra.iter().map(|a| a.to_string()));
        Invocation::new(&args)
    };
    let evals: Vec<(&str, Invocation, Expect)> = vec![
        ("ctx0", ev(&["--ctx", "0"]), Expect::Error("--ctx")),
        ("ctx1", ev(&["--ctx", "1"]), Expect::Error("--ctx")),
        ("ctx-huge", ev(&["--ctx", "1000000000"]), Expect::Error("")),
        ("score-from-huge", ev(&["--ctx", "16", "--score-from", "99"]), Expect::Error("--score-from 99")),
        (
            "text-empty",
            Invocation::new(&["eval", &t, "--ref", "f32", "--ctx", "16", "--text", &s(&write(root, "empty.txt", ""))]),
            Expect::Error("empty"),
        ),
        (
            "text-dev-zero",
            Invocation::new(&["eval", &t, "--ref", "f32", "--ctx", "16", "--text", "/dev/zero"]),
            Expect::Error("character device"),
        ),
        ("ref-w4a8", ev(&["--ref", "w4a8", "--ctx", "16"]), Expect::Usage("")),
        ("json-unwritable", ev(&["--ctx", "16", "--json", "/proc/x/y.json"]), Expect::Error("/proc/x")),
        ("group-bad", ev(&["--ctx", "16", "--group", "7"]), Expect::Error("--group 7")),
    ];
    for (name, inv, expect) in evals {
        cases.push(case(format!("eval-{name}"), inv, expect));
    }
}

// --- GGUF files and repo ids ------------------------------------------------------------------------------

/// Where the tensor-info record of `name` keeps its ggml type: after the name, the dimension count and the
/// dimensions.
fn type_field(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the tensor's record") + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * n_dims
}

/// A copy of the GGUF `base` as `root/name`, its bytes edited.
fn gguf_with(root: &Path, base: &Path, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(base).unwrap();
    edit(&mut bytes);
    let p = root.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn ggufs(root: &Path, cases: &mut Vec<Case>) {
    use int4_test_support::gguf::{tiny_llama, ty};
    let dir = root.join("ggufs");
    std::fs::create_dir_all(&dir).unwrap();
    let empty_hub = dir.join("empty-hub");
    std::fs::create_dir_all(&empty_hub).unwrap();
    let hub = s(&empty_hub);
    let run_on = |p: &Path| generate(p).env("HF_HUB_CACHE", &hub);
    let good = tiny_llama(&dir, "good-Q4_1.gguf", true, |_| ty::Q4_1).path;
    let fallbacks =
        tiny_llama(&dir, "q4_k_m-like.gguf", false, |n| if n.contains("v_proj") { ty::Q8_0 } else { ty::Q5_0 });
    cases.push(case("gguf-q4_1", run_on(&good), Expect::Ok));
    cases.push(case("gguf-q5_0-q8_0", run_on(&fallbacks.path), Expect::Ok));
    for path in ["w4a8", "wna16", "f32"] {
        cases.push(case(format!("gguf-q4_1-{path}"), generate_with(&good, &["--path", path]), Expect::Ok));
    }
    let len = std::fs::metadata(&good).unwrap().len() as usize;
    for (what, keep) in [("magic", 3), ("header", 20), ("metadata", 200), ("tensor-table", len / 2), ("data", len - 1)]
    {
        let cut = gguf_with(&dir, &good, &format!("truncated-{what}.gguf"), |b| b.truncate(keep));
        let words = if what == "data" || what == "tensor-table" { "past the end" } else { "truncated" };
        cases.push(case(format!("gguf-truncated-{what}"), run_on(&cut), Expect::Error(words)));
    }
    let retyped = |name: &str, file: &str, t: u32| {
        gguf_with(&dir, &good, file, |b| {
            let at = type_field(b, name);
            b[at..at + 4].copy_from_slice(&t.to_le_bytes());
        })
    };
    let lie = retyped("blk.0.ffn_up.weight", "type-size-disagree.gguf", ty::Q8_0);
    cases.push(case("gguf-type-and-size-disagree", run_on(&lie), Expect::Error("disagrees with the file's layout")));
    let unknown = retyped("blk.1.attn_q.weight", "unknown-type.gguf", 99);
    cases.push(case("gguf-unknown-type", run_on(&unknown), Expect::Error("unknown ggml tensor type 99")));
    let last = retyped("output_norm.weight", "unsupported-type.gguf", 16);
    cases.push(case("gguf-unsupported-type", run_on(&last), Expect::Error("iq2_xxs")));
    let nan = gguf_with(&dir, &good, "nan-scale.gguf", |b| {
        // The first tensor (the embedding, Q4_1) starts the data section: its first block's d is NaN.
        let data = data_start(b);
        b[data..data + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    });
    cases.push(case("gguf-nan-scale", run_on(&nan), Expect::Error("not finite")));
    let arch = gguf_with(&dir, &good, "other-arch.gguf", |b| {
        let at = b.windows(5).position(|w| w == b"llama").unwrap();
        b[at..at + 5].copy_from_slice(b"qwen9");
    });
    cases.push(case("gguf-other-architecture", run_on(&arch), Expect::Error("only \"llama\"")));
    let json = write(&dir, "json.gguf", "{\"not\": \"a gguf\"}");
    cases.push(case("gguf-json", run_on(&json), Expect::Error("is not a model directory or a GGUF file")));
    let two = dir.join("two");
    std::fs::create_dir_all(&two).unwrap();
    std::fs::copy(&good, two.join("a.gguf")).unwrap();
    std::fs::copy(&good, two.join("b.gguf")).unwrap();
    cases.push(case("gguf-dir-with-two", run_on(&two), Expect::Error("holds 2 GGUF files")));
    cases.push(case(
        "repo-id-not-cached",
        run_on(Path::new("someone/absent")),
        Expect::Error("not in the Hugging Face cache"),
    ));
    cases.push(case("repo-id-bad", run_on(Path::new("someone/../x")), Expect::Error("no such file")));
}

/// The data section's start in a file the test writer made (alignment 32): the end of the last tensor-info
/// record, rounded up. Found from the last tensor's name, which the writer puts last in the table.
fn data_start(bytes: &[u8]) -> usize {
    let name = b"output_norm.weight";
    let at = bytes.windows(name.len()).rposition(|w| w == name).unwrap() + name.len();
    let end = at + 4 + 8 + 4 + 8;
    end.div_ceil(32) * 32
}

fn write(root: &Path, name: &str, text: &str) -> PathBuf {
    let p = root.join(name);
    std::fs::write(&p, text).unwrap();
    p
}
