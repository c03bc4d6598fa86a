//! Reading tensors from a checkpoint: its safetensors files, each mapped by `int4_safetensors::MappedFile`,
//! or a GGUF mapped by `int4_gguf`.
//!
//! One `model.safetensors`, or shards listed by `model.safetensors.index.json`. Tensor data is not assumed
//! aligned (a header of odd length puts every tensor at an odd offset): values are decoded byte-wise from
//! the mapping. bf16, f16 and f32 are accepted; anything else is an error naming the tensor.
//!
//! A GGUF's tensors are named and shaped as the Hugging Face checkpoint's ([`int4_gguf::GgufModel`]), so
//! every reader above this one asks for `model.layers.0.self_attn.q_proj.weight` either way. Its
//! block-quantized tensors (Q4_0, Q4_1, Q4_K, Q5_0, Q8_0) are read as stored by `crate::quantized`; as f32
//! here, they (and Q6_K) are dequantized exactly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use int4_gguf::{GgmlType, GgufModel};
use int4_safetensors::{Dtype, MappedFile};

use crate::error::{Error, Result, at};
use crate::model_dir::ModelDir;

struct Shard {
    // Declared (and so dropped) before the mapping: a read faulting in a file truncated underneath the
    // process is reported by `int4_cache::sigbus` for as long as the file is mapped.
    _guard: int4_cache::sigbus::MappingGuard,
    path: PathBuf,
    file: MappedFile,
}

/// Where a tensor is: its shard, and its entry in that shard's [`MappedFile::entries`].
#[derive(Clone, Copy, Debug)]
struct Entry {
    shard: usize,
    index: usize,
}

/// A tensor as stored in its file, read in place from the mapping (what an export copies unchanged).
#[derive(Clone, Copy, Debug)]
pub struct StoredTensor<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Its dtype as stored.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its bytes (`shape`'s elements of `dtype`, little-endian; safetensors checked the extent).
    pub bytes: &'a [u8],
    /// Which of [`Checkpoint::files`] holds it.
    pub file: usize,
    /// For a GGUF's `q_proj`/`k_proj`: the heads whose rows llama.cpp interleaved. `bytes` holds the rows in
    /// the GGUF's order; Hugging Face row `h·hd + t·hd/2 + i` is stored row `h·hd + 2i + t` (`hd` the rows
    /// per head), so a copy must reorder the rows.
    pub gguf_qk_heads: Option<usize>,
}

/// A checkpoint's tensors.
pub struct Checkpoint {
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    gguf: Option<GgufSource>,
}

/// A GGUF checkpoint: the model, and its mapping registered with the SIGBUS report.
struct GgufSource {
    // Declared before the model, so dropped before the mapping it guards.
    _guard: int4_cache::sigbus::MappingGuard,
    model: Arc<GgufModel>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tensors = self.gguf.as_ref().map_or(self.entries.len(), |g| g.model.tensors().len());
        f.debug_struct("Checkpoint").field("tensors", &tensors).finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// Opens the safetensors files of the model directory `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_in(&ModelDir::open(dir)?)
    }

    /// Opens the safetensors files of `model`: `model.safetensors`, or the shards that
    /// `model.safetensors.index.json` names, each tensor taken from the shard its `weight_map` names.
    pub fn open_in(model: &ModelDir) -> Result<Self> {
        if let Some(gguf) = model.gguf() {
            let path = gguf.file().path();
            let guard = int4_cache::sigbus::MappingGuard::register_file(
                gguf.file().bytes_all(),
                &format!("the model file {}", path.display()),
                "a model's files must not change while it runs",
            );
            let gguf = Some(GgufSource { _guard: guard, model: Arc::clone(gguf) });
            return Ok(Checkpoint { shards: Vec::new(), entries: HashMap::new(), gguf });
        }
        const INDEX: &str = "model.safetensors.index.json";
        let index_path = || model.path().join(INDEX).display().to_string();
        // Shard file names, and for an index, which shard each tensor is read from.
        let (files, weight_map): (Vec<String>, Option<HashMap<String, String>>) =
            if model.open_file("model.safetensors")?.is_some() {
                (vec!["model.safetensors".to_string()], None)
            } else if let Some(v) = model.read_json(INDEX)? {
                let map = v
                    .get("weight_map")
                    .and_then(|m| m.as_object())
                    .ok_or_else(|| Error::checkpoint(index_path(), "no \"weight_map\" object"))?;
                let mut wanted = HashMap::new();
                for (tensor, file) in map {
                    let file = file.as_str().ok_or_else(|| {
                        Error::checkpoint(index_path(), format!("weight_map[{tensor:?}] is not a file name"))
                    })?;
                    model.file_path(file)?;
                    wanted.insert(tensor.clone(), file.to_string());
                }
                let mut names: Vec<String> = wanted.values().cloned().collect();
                names.sort();
                names.dedup();
                (names, Some(wanted))
            } else {
                return Err(Error::checkpoint(
                    model.path().display().to_string(),
                    "no model.safetensors or model.safetensors.index.json",
                ));
            };
        let mut shards = Vec::new();
        let mut entries = HashMap::new();
        for name in files {
            let (file, path) = model.open_file(&name)?.ok_or_else(|| {
                Error::checkpoint(index_path(), format!("names the shard {name:?}, which is missing"))
            })?;
            let file = MappedFile::open(&file).map_err(at(path.display().to_string()))?;
            for (index, tensor) in file.entries().iter().enumerate() {
                // With an index, a tensor comes from the shard the weight map names, and no other.
                if weight_map.as_ref().is_some_and(|w| w.get(&tensor.name) != Some(&name)) {
                    continue;
                }
                entries.insert(tensor.name.clone(), Entry { shard: shards.len(), index });
            }
            let guard = int4_cache::sigbus::MappingGuard::register_file(
                file.bytes_all(),
                &format!("the model file {}", path.display()),
                "a model's files must not change while it runs",
            );
            shards.push(Shard { _guard: guard, path, file });
        }
        Ok(Checkpoint { shards, entries, gguf: None })
    }

    /// The GGUF the checkpoint is, if it is one.
    pub fn gguf(&self) -> Option<&GgufModel> {
        self.gguf.as_ref().map(|g| &*g.model)
    }

    /// Every tensor as stored, in file order ([`Checkpoint::files`], then by offset). A GGUF's F32, F16 and
    /// BF16 tensors are listed under their Hugging Face names and shapes, their bytes in place (the Q/K rows
    /// in the GGUF's order, [`StoredTensor::gguf_qk_heads`]); its block-quantized tensors have no safetensors
    /// form and are not.
    pub fn stored_tensors(&self) -> Vec<StoredTensor<'_>> {
        if let Some(g) = &self.gguf {
            let dtype = |t: GgmlType| match t {
                GgmlType::F32 => Some(Dtype::F32),
                GgmlType::F16 => Some(Dtype::F16),
                GgmlType::BF16 => Some(Dtype::BF16),
                _ => None,
            };
            return g
                .model
                .tensors()
                .iter()
                .filter_map(|t| {
                    let bytes = g.model.file().tensor_data(&t.gguf_name).ok()?;
                    let dtype = dtype(t.ggml_type)?;
                    Some(StoredTensor {
                        name: &t.hf_name,
                        dtype,
                        shape: &t.shape,
                        bytes,
                        file: 0,
                        gguf_qk_heads: t.qk_heads,
                    })
                })
                .collect();
        }
        let mut v: Vec<(Entry, StoredTensor<'_>)> =
            self.entries.iter().map(|(n, &e)| (e, self.stored_at(n, e))).collect();
        v.sort_by_key(|(e, _)| (e.shard, e.index));
        v.into_iter().map(|(_, t)| t).collect()
    }

    /// One tensor as stored, if the checkpoint has it (a safetensors checkpoint's; see
    /// [`Checkpoint::stored_tensors`] for a GGUF's).
    pub fn stored(&self, name: &str) -> Option<StoredTensor<'_>> {
        let (name, &e) = self.entries.get_key_value(name)?;
        Some(self.stored_at(name, e))
    }

    fn stored_at<'a>(&'a self, name: &'a str, e: Entry) -> StoredTensor<'a> {
        let file = &self.shards[e.shard].file;
        let t = &file.entries()[e.index];
        StoredTensor {
            name,
            dtype: t.dtype,
            shape: &t.shape,
            bytes: file.bytes(e.index),
            file: e.shard,
            gguf_qk_heads: None,
        }
    }

    /// The model's files (the safetensors files in the order they were opened, or the GGUF).
    pub fn files(&self) -> Vec<PathBuf> {
        match &self.gguf {
            Some(g) => vec![g.model.file().path().to_path_buf()],
            None => self.shards.iter().map(|s| s.path.clone()).collect(),
        }
    }

    /// Each safetensors file as held: its path, the metadata of the descriptor that was mapped, and the
    /// whole mapping — what a content identity of the checkpoint hashes, so it is the identity of the bytes
    /// this checkpoint reads even if a path is renamed over meanwhile.
    pub fn held_files(&self) -> Vec<(&Path, &std::fs::Metadata, &[u8])> {
        if let Some(g) = &self.gguf {
            let file = g.model.file();
            // A GGUF opened by path is always mapped, so it has the mapped descriptor's metadata.
            return file.file_metadata().map(|m| (file.path(), m, file.bytes_all())).into_iter().collect();
        }
        self.shards.iter().map(|s| (s.path.as_path(), s.file.metadata(), s.file.bytes_all())).collect()
    }

    /// Every tensor's name and dtype (as safetensors spells it, or the GGUF type in capitals: `Q4_1`),
    /// sorted by name.
    pub fn tensors(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = match &self.gguf {
            Some(g) => g.model.tensors().iter().map(|t| (t.hf_name.clone(), gguf_dtype(t.ggml_type))).collect(),
            None => self.stored_tensors().iter().map(|t| (t.name.to_string(), format!("{:?}", t.dtype))).collect(),
        };
        v.sort();
        v
    }

    /// A tensor's dtype (as safetensors spells it, or the GGUF type in capitals), if the checkpoint has it.
    pub fn dtype(&self, name: &str) -> Option<String> {
        match &self.gguf {
            Some(g) => g.model.tensor(name).map(|t| gguf_dtype(t.ggml_type)),
            None => self.stored(name).map(|t| format!("{:?}", t.dtype)),
        }
    }

    /// Whether the checkpoint has a tensor.
    pub fn has(&self, name: &str) -> bool {
        match &self.gguf {
            Some(g) => g.model.tensor(name).is_some(),
            None => self.entries.contains_key(name),
        }
    }

    /// A tensor's shape.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        match &self.gguf {
            Some(g) => g.model.tensor(name).map(|t| t.shape.as_slice()),
            None => self.stored(name).map(|t| t.shape),
        }
    }

    /// A tensor as stored, and how an error about it names it (the tensor and its file).
    fn find(&self, name: &str) -> Result<(StoredTensor<'_>, String)> {
        let t = self.stored(name).ok_or_else(|| Error::checkpoint(name, "tensor is missing from the checkpoint"))?;
        let ctx = format!("{} (in {})", name, self.shards[t.file].path.display());
        Ok((t, ctx))
    }

    /// A tensor's raw bytes, checked against the expected shape and one of the accepted dtypes.
    fn raw(&self, name: &str, shape: &[usize], dtypes: &[Dtype]) -> Result<(&[u8], Dtype)> {
        let (t, ctx) = self.find(name)?;
        if t.shape != shape {
            return Err(Error::checkpoint(ctx, format!("shape {:?}, expected {:?}", t.shape, shape)));
        }
        if !dtypes.contains(&t.dtype) {
            return Err(Error::checkpoint(ctx, format!("dtype {:?}, expected one of {dtypes:?}", t.dtype)));
        }
        let n: usize = shape.iter().product();
        let need = n * t.dtype.bitsize() / 8;
        if t.bytes.len() != need {
            return Err(Error::checkpoint(ctx, format!("holds {} bytes, its shape needs {need}", t.bytes.len())));
        }
        Ok((t.bytes, t.dtype))
    }

    /// A 32-bit integer tensor (GPTQ/AWQ `qweight`, `qzeros`, `g_idx`), checked against the expected shape.
    pub fn i32(&self, name: &str, shape: &[usize]) -> Result<Vec<i32>> {
        let (bytes, _) = self.raw(name, shape, &[Dtype::I32, Dtype::U32])?;
        Ok(bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// A byte tensor (`cpu_int4` `weight_packed`), checked against the expected shape.
    pub fn u8(&self, name: &str, shape: &[usize]) -> Result<Vec<u8>> {
        Ok(self.raw(name, shape, &[Dtype::U8, Dtype::I8])?.0.to_vec())
    }

    /// A tensor as f32 (from bf16, f16 or f32; from a GGUF, any type it reads, dequantized exactly),
    /// checked against the expected shape.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        if let Some(g) = &self.gguf {
            let path = g.model.file().path().display().to_string();
            let ctx = format!("{name} (in {path})");
            let t = g.model.tensor(name).ok_or_else(|| Error::checkpoint(name, "tensor is missing from the GGUF"))?;
            if t.shape != shape {
                return Err(Error::checkpoint(ctx, format!("shape {:?}, expected {:?}", t.shape, shape)));
            }
            let out = g.model.tensor_f32(name).map_err(at(&ctx))?;
            return finite(out, &ctx);
        }
        let (t, ctx) = self.find(name)?;
        if t.shape != shape {
            return Err(Error::checkpoint(ctx, format!("shape {:?}, expected {:?}", t.shape, shape)));
        }
        let bytes = t.bytes;
        let n: usize = shape.iter().product();
        let out: Vec<f32> = match t.dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => return Err(Error::checkpoint(ctx, format!("dtype {other:?} is not supported (bf16, f16, f32)"))),
        };
        if out.len() != n {
            return Err(Error::checkpoint(ctx, format!("holds {} values, its shape needs {n}", out.len())));
        }
        finite(out, &ctx)
    }
}

/// `values`, unless one is not finite (an error naming it).
fn finite(values: Vec<f32>, ctx: &str) -> Result<Vec<f32>> {
    match values.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::checkpoint(ctx, format!("value {i} is {}", values[i]))),
        None => Ok(values),
    }
}

/// A GGUF tensor type as [`Checkpoint::dtype`] names it: ggml's name in capitals (`Q4_1`, `F32`).
pub fn gguf_dtype(t: GgmlType) -> String {
    t.name().to_ascii_uppercase()
}
