//! What the workspace's integration tests share (the role `test-utils` plays in rust-analyzer):
//!
//! * [`tiny_model`] — a tiny random Llama checkpoint, written by the test into a temporary directory,
//!   with a word-level tokenizer so the whole engine (not only the model) can load it;
//! * [`TempDir`] — a directory of the test's own under the system's temporary directory, removed when
//!   dropped (a run of the suite writes hundreds of model directories, caches and outputs);
//! * [`default_model_or_skip!`] — the converted default model, or a skip that is printed, recorded for
//!   `cargo xtask ci` to report, and refused under `CI=true`;
//! * [`fuzz`] — bounded mutation fuzzing of loaders on the stable toolchain;
//! * [`gguf`] — tiny Llama GGUF files in the types a test picks, with the values they hold;
//! * [`in_own_process`] — runs one test of an integration binary alone in a child process, for the
//!   measurements that are process-wide (anonymous memory) and would see the other tests' allocations.
#![allow(missing_docs)]

pub mod fuzz;
pub mod gguf;

use std::collections::HashMap;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};

/// A small xorshift generator with Box–Muller normals.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);
impl Rng {
    /// A standard normal sample.
    pub fn normal(&mut self) -> f32 {
        let mut u = || {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64).max(1e-12)
        };
        let (a, b) = (u(), u());
        ((-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()) as f32
    }
}

/// The tiny model's `config.json`.
pub const CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "max_position_embeddings": 256, "vocab_size": 96, "tie_word_embeddings": true,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"
}"#;

/// A directory of the caller's own under the system's temporary directory, named `int4-{name}-` and a
/// random suffix (so tests running at once never share one), removed with everything in it when
/// dropped. It derefs to its path: the directory itself ([`TempDir::new`]), or a path inside it that
/// nothing holds yet ([`TempDir::unmade`]), for code that must make its output itself and leave nothing
/// beside it.
#[derive(Debug)]
pub struct TempDir {
    root: tempfile::TempDir,
    path: PathBuf,
}

impl TempDir {
    /// A new, empty directory.
    ///
    /// # Panics
    /// If the directory cannot be made.
    pub fn new(name: &str) -> Self {
        let root = tempfile::Builder::new()
            .prefix(&format!("int4-{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("making a temporary directory for {name}: {e}"));
        let path = root.path().to_path_buf();
        TempDir { root, path }
    }

    /// A path, `{name}` inside a new, empty directory, that nothing holds yet.
    ///
    /// # Panics
    /// If the directory cannot be made.
    pub fn unmade(name: &str) -> Self {
        let mut dir = TempDir::new(name);
        dir.path = dir.root.path().join(name);
        dir
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// Writes a tiny random checkpoint into a directory of its own, removed when the result is dropped.
pub fn tiny_model(name: &str) -> TempDir {
    tiny_model_with(name, |_, w| w)
}

/// The same, with `edit(name, values)` applied to every 2-D weight.
pub fn tiny_model_with(name: &str, edit: impl Fn(&str, Vec<f32>) -> Vec<f32>) -> TempDir {
    let dir = TempDir::new(&format!("tiny-{name}"));
    write_tiny_model(&dir, edit);
    dir
}

/// Writes the tiny checkpoint, `edit(name, values)` applied to every 2-D weight, into `dir` (made if
/// missing), over any files of the same names: for tests that change a checkpoint in place.
pub fn write_tiny_model(dir: &Path, edit: impl Fn(&str, Vec<f32>) -> Vec<f32>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let (h, inter, hd, nh, nkv, vocab) = (64usize, 160usize, 16usize, 4usize, 2usize, 96usize);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32, rng: &mut Rng| {
        let n: usize = shape.iter().product();
        let mut values: Vec<f32> = (0..n).map(|_| offset + scale * rng.normal()).collect();
        if shape.len() == 2 {
            values = edit(&name, values);
        }
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((name, shape, data));
    };
    add("model.embed_tokens.weight".into(), vec![vocab, h], 0.5, 0.0, &mut rng);
    add("model.norm.weight".into(), vec![h], 0.1, 1.0, &mut rng);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], 0.1, 1.0, &mut rng);
        add(format!("{p}.post_attention_layernorm.weight"), vec![h], 0.1, 1.0, &mut rng);
        add(format!("{p}.self_attn.q_proj.weight"), vec![nh * hd, h], 0.15, 0.0, &mut rng);
        add(format!("{p}.self_attn.k_proj.weight"), vec![nkv * hd, h], 0.15, 0.0, &mut rng);
        add(format!("{p}.self_attn.v_proj.weight"), vec![nkv * hd, h], 0.15, 0.0, &mut rng);
        add(format!("{p}.self_attn.o_proj.weight"), vec![h, nh * hd], 0.15, 0.0, &mut rng);
        add(format!("{p}.mlp.gate_proj.weight"), vec![inter, h], 0.15, 0.0, &mut rng);
        add(format!("{p}.mlp.up_proj.weight"), vec![inter, h], 0.15, 0.0, &mut rng);
        add(format!("{p}.mlp.down_proj.weight"), vec![h, inter], 0.1, 0.0, &mut rng);
    }
    let views: HashMap<String, TensorView<'_>> =
        tensors.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(&views, None, &dir.join("model.safetensors")).unwrap();
    // A word-level tokenizer over the 96 ids: "w0" … "w95", split on whitespace.
    let vocab: serde_json::Map<String, serde_json::Value> = (0..vocab).map(|i| (format!("w{i}"), i.into())).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// The converted default model, or `None` with the skip printed and appended to `skips` (a failure
/// under `CI=true`, where `cargo xtask ci` fetches the model first, so a missing one is a broken setup).
/// Called through [`default_model_or_skip!`], which names the skip file of the calling test target.
pub fn default_model_or_skip_recorded(test: &str, skips: &std::path::Path) -> Option<PathBuf> {
    let dir = int4_cache::dirs::default_model_dir()?;
    if dir.join("int4-source.json").exists() {
        return Some(dir);
    }
    let msg = format!("default model not found at {}: run `cargo xtask fetch-model`", dir.display());
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("SKIPPED: {msg}");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(skips) {
        use std::io::Write;
        let _ = writeln!(f, "int4 {test}: SKIPPED ({msg})");
    }
    None
}

/// `default_model_or_skip!("test name")`: [`default_model_or_skip_recorded`] with the calling test
/// target's `target/tmp/int4-test-skips.txt`, which `cargo xtask ci` prints after the tests.
#[macro_export]
macro_rules! default_model_or_skip {
    ($test:expr) => {
        $crate::default_model_or_skip_recorded(
            $test,
            ::std::path::Path::new(concat!(env!("CARGO_TARGET_TMPDIR"), "/int4-test-skips.txt")),
        )
    };
}

/// Whether the calling test should run its body here: `true` in a child process started for it alone;
/// otherwise starts that child (this test binary, filtered to `test` exactly, one thread), checks that it
/// ran the test and passed, and returns `false`. `test` is the test's full path in the binary
/// (`module::name`).
///
/// Why: every test of an integration binary shares one process, so a test that measures `RssAnon` would
/// see its neighbours' allocations come and go.
pub fn in_own_process(test: &str) -> bool {
    const VAR: &str = "INT4_TEST_ALONE";
    if std::env::var_os(VAR).is_some_and(|v| v == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads", "1", "--nocapture"])
        .env(VAR, test)
        .output()
        .expect("the test binary starts again");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test}, run alone in a child process, failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("test result: ok. 1 passed"), "{test} did not run in the child process:\n{stdout}");
    false
}
