//! A model as the runtime finds it: the one place that opens a model's files.
//!
//! Every file the runtime reads from a model — `config.json`, `generation_config.json`, a
//! `quantize_config.json`, the safetensors files and their index, `tokenizer.json`,
//! `tokenizer_config.json`, `chat_template.jinja` — is opened here, by name, under the same rules:
//!
//! * **Names are confined.** A name the model supplies (a shard in `weight_map`) must be relative, with no
//!   `..`, absolute or empty component. Symlinks are followed (a Hugging Face snapshot is symlinks into
//!   `../../blobs/`): confinement applies to names, not to where a link points.
//! * **Only regular files.** Each file is opened through `int4_files`: non-blocking and checked with
//!   `fstat`, so a FIFO or a device at a model path is an error, not a hang or an endless read.
//! * **Sizes are capped.** Text files are read up to a cap each ([`CONFIG_CAP`], [`TOKENIZER_CAP`],
//!   [`TEMPLATE_CAP`]); a larger one is an error naming the file and the cap.
//!
//! [`ModelSource`] says where the model came from: a directory of a Hugging Face checkpoint, or a GGUF
//! file (a `.gguf` path, or a directory holding one and no `config.json`). A GGUF holds what a Hugging Face
//! directory spreads over files in its metadata; [`ModelDir`] serves `config.json`, `tokenizer.json`,
//! `tokenizer_config.json` and `generation_config.json` for it as `int4_gguf::GgufModel` makes them, so the
//! rest of the runtime reads a GGUF's configuration, tokenizer and chat template exactly as it reads a
//! directory's.

use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use int4_gguf::GgufModel;

use crate::error::{Error, Result, at};

/// The most bytes read from a configuration file (`config.json`, `generation_config.json`,
/// `quantize_config.json`, `tokenizer_config.json`, a shard index).
pub const CONFIG_CAP: u64 = 4 << 20;
/// The most bytes read from `tokenizer.json` (large vocabularies run to tens of MiB).
pub const TOKENIZER_CAP: u64 = 128 << 20;
/// The most bytes read from `chat_template.jinja`.
pub const TEMPLATE_CAP: u64 = 1 << 20;

/// Where a model's files come from.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ModelSource {
    /// A directory holding a Hugging Face checkpoint (`config.json`, safetensors, tokenizer).
    Directory,
    /// A GGUF file, mapped and checked.
    Gguf(Arc<GgufModel>),
}

/// A model's files, opened under the rules of the module docs.
#[derive(Clone, Debug)]
pub struct ModelDir {
    root: PathBuf,
    source: ModelSource,
}

/// The model a user names: an existing local path as it is (a model directory or a `.gguf` file), else a
/// repo id `org/name[@revision][:QUANT]` resolved offline in the Hugging Face cache (`int4_hub`: the
/// snapshot directory of a safetensors repo, or the one `.gguf` file of a GGUF repo that `QUANT` picks).
pub fn resolve_model(arg: &str) -> Result<PathBuf> {
    let source = int4_hub::resolve_model_arg(arg, &int4_hub::HubCache::from_env()).map_err(at("model"))?;
    Ok(source.path().to_path_buf())
}

/// The most `.gguf` files a directory is searched through for its one model file.
const MAX_DIR_ENTRIES: usize = 10_000;

impl ModelDir {
    /// The model at `path`: a Hugging Face directory (holding `config.json`), a `.gguf` file, or a
    /// directory holding exactly one `.gguf` and no `config.json`. A directory's files are read when asked
    /// for; a GGUF is mapped and checked here.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = || path.display().to_string();
        let meta = std::fs::metadata(path).map_err(at(shown()))?;
        if meta.is_file() {
            return Self::open_gguf(path);
        }
        if !meta.is_dir() {
            return Err(Error::input(
                shown(),
                "is not a model: a directory holding config.json, the weights and the tokenizer, or a .gguf file",
            ));
        }
        if !path.join("config.json").exists()
            && let Some(gguf) = Self::only_gguf_in(path)?
        {
            let mut model = Self::open_gguf(&gguf)?;
            model.root = path.to_path_buf();
            return Ok(model);
        }
        Ok(ModelDir { root: path.to_path_buf(), source: ModelSource::Directory })
    }

    /// Maps and checks the GGUF file at `path`.
    fn open_gguf(path: &Path) -> Result<Self> {
        let model = GgufModel::open(path).map_err(|e| {
            if let int4_gguf::ConvertErrorKind::Gguf(g) = e.kind()
                && matches!(g.kind(), int4_gguf::GgufErrorKind::BadMagic(_))
            {
                return Error::input(
                    path.display().to_string(),
                    "is not a model directory or a GGUF file (a model is a directory holding config.json, the \
                     weights and the tokenizer, or a .gguf file)",
                );
            }
            // The GGUF reader's message names the file.
            Error::new("", e.into())
        })?;
        let root = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        Ok(ModelDir { root, source: ModelSource::Gguf(Arc::new(model)) })
    }

    /// The one `.gguf` file directly in `dir`, if there is one; several are an error listing them.
    fn only_gguf_in(dir: &Path) -> Result<Option<PathBuf>> {
        let shown = || dir.display().to_string();
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(at(shown()))?.take(MAX_DIR_ENTRIES) {
            let path = entry.map_err(at(shown()))?.path();
            // A projector (`mmproj`) or an importance matrix (`imatrix`) beside the model is not the model.
            let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
            let aside = name.contains("mmproj") || name.contains("imatrix");
            if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) && !aside {
                found.push(path);
            }
        }
        found.sort();
        match found.len() {
            0 | 1 => Ok(found.pop()),
            _ => Err(Error::input(
                shown(),
                format!(
                    "holds {} GGUF files and no config.json: name the one to run ({})",
                    found.len(),
                    found
                        .iter()
                        .filter_map(|p| p.file_name())
                        .map(|n| n.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// The GGUF this model is read from, if it is one.
    pub fn gguf(&self) -> Option<&Arc<GgufModel>> {
        match &self.source {
            ModelSource::Gguf(m) => Some(m),
            ModelSource::Directory => None,
        }
    }

    /// A file the GGUF's metadata stands in for (`None` for any other name, or a directory's model).
    fn gguf_file(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let Some(model) = self.gguf() else { return Ok(None) };
        let json = |v: serde_json::Value| Some(v.to_string().into_bytes());
        Ok(match name {
            "config.json" => json(model.config_json()),
            "tokenizer_config.json" => json(model.tokenizer_config_json()),
            "generation_config.json" => json(model.generation_config_json()),
            "tokenizer.json" => Some(model.tokenizer_json().map_err(at(model.file().path().display().to_string()))?),
            _ => None,
        })
    }

    /// The directory (for a GGUF, the directory holding it).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Where the model came from.
    pub fn source(&self) -> &ModelSource {
        &self.source
    }

    /// The path of the model file called `name`, refusing a name that could leave the directory.
    pub fn file_path(&self, name: &str) -> Result<PathBuf> {
        let rel = Path::new(name);
        let confined = !name.is_empty()
            && rel.components().all(|c| matches!(c, Component::Normal(_)))
            && !name.split(['/', '\\']).any(str::is_empty);
        if !confined {
            return Err(Error::checkpoint(
                self.root.display().to_string(),
                format!("the file name {name:?} is not a plain relative name inside the model directory"),
            ));
        }
        Ok(self.root.join(rel))
    }

    /// Opens the model file `name` for reading: `None` if there is none, an error unless it is a regular
    /// file (`int4_files`: opened non-blocking, so a FIFO cannot stall the open).
    pub fn open_file(&self, name: &str) -> Result<Option<(File, PathBuf)>> {
        if self.gguf().is_some() {
            // A GGUF is one file: nothing beside it belongs to the model.
            return Ok(None);
        }
        let path = self.file_path(name)?;
        let file = int4_files::open_regular_if_exists(&path).map_err(at(path.display().to_string()))?;
        Ok(file.map(|f| (f, path)))
    }

    /// The model file `name` read whole, if it exists, at most `cap` bytes.
    pub fn read(&self, name: &str, cap: u64) -> Result<Option<Vec<u8>>> {
        if self.gguf().is_some() {
            return self.gguf_file(name);
        }
        let Some((file, path)) = self.open_file(name)? else { return Ok(None) };
        int4_files::read_open_capped(file, &path, cap).map(Some).map_err(at(path.display().to_string()))
    }

    /// The model file `name` read whole as UTF-8 text, if it exists, at most `cap` bytes.
    pub fn read_text(&self, name: &str, cap: u64) -> Result<Option<String>> {
        let Some(bytes) = self.read(name, cap)? else { return Ok(None) };
        let path = self.root.join(name).display().to_string();
        String::from_utf8(bytes).map(Some).map_err(|_| Error::checkpoint(path, "is not UTF-8 text"))
    }

    /// The model file `name` as JSON, if it exists (at most [`CONFIG_CAP`] bytes).
    pub fn read_json(&self, name: &str) -> Result<Option<serde_json::Value>> {
        let Some(text) = self.read_text(name, CONFIG_CAP)? else { return Ok(None) };
        serde_json::from_str(&text).map(Some).map_err(at(self.root.join(name).display().to_string()))
    }

    /// `config.json`'s text (required).
    pub fn config_text(&self) -> Result<String> {
        self.read_text("config.json", CONFIG_CAP)?.ok_or_else(|| {
            Error::config(self.root.join("config.json").display().to_string(), "is missing: not a model directory")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("int4-model-dir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_that_leave_the_directory_are_refused() {
        let d = scratch("names");
        let m = ModelDir::open(&d).unwrap();
        for bad in ["../x", "/etc/passwd", "", "a//b", "a/../b", "./a", "a/"] {
            assert!(m.file_path(bad).is_err(), "{bad:?}");
        }
        for good in ["model.safetensors", "sub/model-00001-of-00002.safetensors"] {
            assert_eq!(m.file_path(good).unwrap(), d.join(good));
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_regular_files_within_their_cap_are_read() {
        let d = scratch("files");
        let m = ModelDir::open(&d).unwrap();
        assert!(m.read("absent.json", 10).unwrap().is_none());
        std::fs::write(d.join("small"), b"0123456789").unwrap();
        assert_eq!(m.read("small", 10).unwrap().unwrap().len(), 10);
        let e = m.read("small", 9).unwrap_err();
        assert!(e.to_string().contains("small") && e.to_string().contains("larger than"), "{e}");
        std::fs::create_dir(d.join("a_dir")).unwrap();
        assert!(m.read("a_dir", 10).unwrap_err().to_string().contains("not a regular file"));
        #[cfg(unix)]
        {
            // A FIFO with no writer: opened non-blocking, refused by fstat, never waited on.
            let fifo = d.join("config.json");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path; mkfifo creates a file and touches no memory of ours.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let started = std::time::Instant::now();
            assert!(m.config_text().unwrap_err().to_string().contains("not a regular file"));
            assert!(started.elapsed() < std::time::Duration::from_secs(2));
        }
        assert!(ModelDir::open(&d.join("small")).is_err(), "a file is not a model directory");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
