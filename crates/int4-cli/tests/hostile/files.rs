//! Making hostile inputs: copies of the tiny model with one file replaced or edited, raw safetensors files
//! with any header, FIFOs and symlinks.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// A word-level chat template for the tiny model's tokenizer (`w0` … `w95`).
pub const TINY_TEMPLATE: &str =
    "{% for m in messages %}w3 {{ m.content }} w4 {% endfor %}{% if add_generation_prompt %}w5{% endif %}";

/// The tiny random model of the workspace's tests, with a chat template, in `root/tiny`.
pub fn tiny(root: &Path) -> PathBuf {
    let src = int4_test_support::tiny_model("hostile-suite");
    let dir = root.join("tiny");
    copy_dir(&src, &dir);
    let tc = json!({"chat_template": TINY_TEMPLATE, "bos_token": "w1", "eos_token": "w2"});
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
    dir
}

pub fn copy_dir(src: &Path, dst: &Path) {
    let _ = std::fs::remove_dir_all(dst);
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

/// A copy of `base` named `name` under `root/cases`, edited by `edit`.
pub fn variant(root: &Path, base: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = root.join("cases").join(name);
    copy_dir(base, &dir);
    edit(&dir);
    dir
}

/// A safetensors file split into its header (as JSON) and data section.
pub fn read_st(path: &Path) -> (serde_json::Map<String, Value>, Vec<u8>) {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), b[8 + n..].to_vec())
}

/// Writes a safetensors file from raw parts; `declared_len` overrides the header length field.
pub fn write_raw(path: &Path, header: &[u8], data: &[u8], declared_len: Option<u64>) {
    let mut out = declared_len.unwrap_or(header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    let _ = std::fs::remove_file(path);
    std::fs::write(path, out).unwrap();
}

/// A safetensors file's tensors, by name: dtype, shape and bytes.
pub type Tensors = std::collections::BTreeMap<String, (String, Vec<u64>, Vec<u8>)>;

pub fn read_tensors(path: &Path) -> (Tensors, Option<Value>) {
    let (mut h, data) = read_st(path);
    let meta = h.remove("__metadata__");
    let tensors = h
        .into_iter()
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            let (s, e) = (o[0].as_u64().unwrap() as usize, o[1].as_u64().unwrap() as usize);
            let shape = v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            (k, (v["dtype"].as_str().unwrap().to_string(), shape, data[s..e].to_vec()))
        })
        .collect();
    (tensors, meta)
}

pub fn write_tensors(path: &Path, tensors: &Tensors, meta: Option<Value>) {
    let mut h = serde_json::Map::new();
    let mut data = Vec::new();
    for (k, (dtype, shape, bytes)) in tensors {
        h.insert(
            k.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    if let Some(m) = meta {
        h.insert("__metadata__".into(), m);
    }
    write_raw(path, Value::Object(h).to_string().as_bytes(), &data, None);
}

/// Edits `dir/model.safetensors` tensor by tensor.
pub fn edit_tensors(dir: &Path, edit: impl FnOnce(&mut Tensors)) {
    let p = dir.join("model.safetensors");
    let (mut t, meta) = read_tensors(&p);
    edit(&mut t);
    write_tensors(&p, &t, meta);
}

/// Rewrites `dir/config.json` through `edit`.
pub fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&p, c.to_string()).unwrap();
}

/// Replaces `path` with a FIFO (no writer ever opens it).
pub fn fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path; mkfifo creates a file and touches no memory of ours.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Replaces `path` with a symlink to `target`.
pub fn symlink(path: &Path, target: &str) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(target, path).unwrap();
}

pub fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
