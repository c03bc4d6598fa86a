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
//! [`ModelSource`] says where the model came from; today a directory of a Hugging Face checkpoint.

use std::fs::File;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result, at};

/// The most bytes read from a configuration file (`config.json`, `generation_config.json`,
/// `quantize_config.json`, `tokenizer_config.json`, a shard index).
pub const CONFIG_CAP: u64 = 4 << 20;
/// The most bytes read from `tokenizer.json` (large vocabularies run to tens of MiB).
pub const TOKENIZER_CAP: u64 = 128 << 20;
/// The most bytes read from `chat_template.jinja`.
pub const TEMPLATE_CAP: u64 = 1 << 20;

/// Where a model's files come from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelSource {
    /// A directory holding a Hugging Face checkpoint (`config.json`, safetensors, tokenizer).
    Directory,
}

/// A model's files, opened under the rules of the module docs.
#[derive(Clone, Debug)]
pub struct ModelDir {
    root: PathBuf,
    source: ModelSource,
}

impl ModelDir {
    /// The model directory at `path` (it must be a directory; its files are read when asked for).
    pub fn open(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(at(path.display().to_string()))?;
        if !meta.is_dir() {
            return Err(Error::input(
                path.display().to_string(),
                "is not a model directory (a directory holding config.json, the weights and the tokenizer)",
            ));
        }
        Ok(ModelDir { root: path.to_path_buf(), source: ModelSource::Directory })
    }

    /// The directory.
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
        let path = self.file_path(name)?;
        let file = int4_files::open_regular_if_exists(&path).map_err(at(path.display().to_string()))?;
        Ok(file.map(|f| (f, path)))
    }

    /// The model file `name` read whole, if it exists, at most `cap` bytes.
    pub fn read(&self, name: &str, cap: u64) -> Result<Option<Vec<u8>>> {
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
