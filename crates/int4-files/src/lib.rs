//! Opening files a user or a model names, under one set of rules, so that no input can hang a process or
//! run its memory away.
//!
//! * **Only regular files.** A file is opened with `O_NONBLOCK` and checked with `fstat` before anything
//!   reads it: a FIFO with no writer, a character device such as `/dev/zero` or a directory is an error
//!   naming the path, never a wait or an endless read. (`O_NONBLOCK` changes nothing for a regular file,
//!   and stays set on the returned `File`.)
//! * **Reads are capped.** [`read_capped`] reads at most the caller's cap, plus one byte to tell a file
//!   exactly at the cap from a longer one, so a file that grows while it is read is still refused.
//!
//! The callers are every reader of a path from outside: the runtime's model directory (config, weights,
//! tokenizer, template), the artifact cache (artifacts and its source index), CPU profiles, and the
//! calibration and evaluation texts.
#![deny(missing_docs)]

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Why a file could not be opened or read.
#[derive(Debug)]
pub struct FileError {
    path: PathBuf,
    kind: FileErrorKind,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum FileErrorKind {
    /// The operating system refused (missing, unreadable, an I/O error).
    Io(std::io::Error),
    /// Not a regular file: a directory, a FIFO, a socket or a device.
    NotRegular {
        /// What it is, in words.
        what: &'static str,
    },
    /// Larger than the caller allows.
    TooLarge {
        /// The most bytes allowed.
        cap: u64,
    },
    /// Not UTF-8 text ([`read_text_capped`]).
    NotUtf8,
}

impl FileError {
    fn new(path: &Path, kind: FileErrorKind) -> Self {
        FileError { path: path.to_path_buf(), kind }
    }

    /// The file concerned.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What went wrong.
    pub fn kind(&self) -> &FileErrorKind {
        &self.kind
    }

    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(&self.kind, FileErrorKind::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.kind)
    }
}

/// What went wrong, without the path (for a caller whose own error names it).
impl std::fmt::Display for FileErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileErrorKind::Io(e) => write!(f, "{e}"),
            FileErrorKind::NotRegular { what } => write!(f, "is {what}, not a regular file"),
            FileErrorKind::TooLarge { cap } => write!(f, "is larger than the {cap} bytes this file may be"),
            FileErrorKind::NotUtf8 => f.write_str("is not UTF-8 text"),
        }
    }
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            FileErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Opens `path` for reading if it is a regular file (following symlinks), without blocking on a FIFO.
pub fn open_regular(path: &Path) -> Result<File, FileError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking so a FIFO cannot stall the open; never becoming a terminal's controlling process.
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = options.open(path).map_err(|e| FileError::new(path, FileErrorKind::Io(e)))?;
    let meta = file.metadata().map_err(|e| FileError::new(path, FileErrorKind::Io(e)))?;
    if !meta.is_file() {
        return Err(FileError::new(path, FileErrorKind::NotRegular { what: describe(&meta) }));
    }
    Ok(file)
}

/// [`open_regular`], with a missing file as `None`.
pub fn open_regular_if_exists(path: &Path) -> Result<Option<File>, FileError> {
    match open_regular(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The regular file `path`, read whole, at most `cap` bytes.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    let file = open_regular(path)?;
    read_open_capped(file, path, cap)
}

/// An opened file (from [`open_regular`]) read whole, at most `cap` bytes; `path` names it in errors.
pub fn read_open_capped(file: File, path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| FileError::new(path, FileErrorKind::Io(e)))?;
    if bytes.len() as u64 > cap {
        return Err(FileError::new(path, FileErrorKind::TooLarge { cap }));
    }
    Ok(bytes)
}

/// The regular file `path`, read whole as UTF-8 text, at most `cap` bytes.
pub fn read_text_capped(path: &Path, cap: u64) -> Result<String, FileError> {
    let bytes = read_capped(path, cap)?;
    String::from_utf8(bytes).map_err(|_| FileError::new(path, FileErrorKind::NotUtf8))
}

fn describe(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() { "a directory" } else { "not a regular file" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("int4-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn regular_files_are_read_up_to_their_cap() {
        let d = scratch("cap");
        let p = d.join("ten");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_capped(&p, 10).unwrap(), b"0123456789");
        let e = read_capped(&p, 9).unwrap_err();
        assert!(matches!(e.kind(), FileErrorKind::TooLarge { cap: 9 }), "{e}");
        assert!(e.to_string().contains("ten") && e.to_string().contains("larger than the 9 bytes"), "{e}");
        std::fs::write(&p, [0xffu8, 0xfe]).unwrap();
        assert!(matches!(read_text_capped(&p, 10).unwrap_err().kind(), FileErrorKind::NotUtf8));
        let missing = d.join("missing");
        assert!(read_capped(&missing, 10).unwrap_err().is_not_found());
        assert!(open_regular_if_exists(&missing).unwrap().is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directories_devices_and_fifos_are_refused_without_waiting() {
        let d = scratch("kinds");
        let started = std::time::Instant::now();
        let e = read_capped(&d, 10).unwrap_err();
        assert!(matches!(e.kind(), FileErrorKind::NotRegular { what: "a directory" }), "{e}");
        #[cfg(unix)]
        {
            let e = read_capped(Path::new("/dev/zero"), 10).unwrap_err();
            assert!(matches!(e.kind(), FileErrorKind::NotRegular { what: "a character device" }), "{e}");
            // A FIFO with no writer: a blocking open would wait forever.
            let fifo = d.join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path; mkfifo creates a file and touches no memory of ours.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let e = read_capped(&fifo, 10).unwrap_err();
            assert!(matches!(e.kind(), FileErrorKind::NotRegular { what: "a FIFO" }), "{e}");
            assert!(e.to_string().contains("is a FIFO, not a regular file"), "{e}");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "nothing waited");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
