//! The artifact store: packed weights written once, memory-mapped after.
//!
//! **File format** (`<key hash>.int4art`), little-endian:
//!
//! ```text
//! 0   8 bytes  magic "INT4ART\0"
//! 8   u32      format version (FORMAT_VERSION)
//! 12  u32      0x01020304 written in the writer's byte order (a reader of the other order sees it swapped)
//! 16  u64      header length H
//! 24  H bytes  header JSON: key hash, the key's full canonical encoding, the section table
//!              (name, offset, length), payload blake3 (over each section's name, length and bytes)
//!     …        sections, each starting on a 64-byte boundary (so they map zero-copy and aligned)
//! ```
//!
//! **Writes** go to a uniquely named temporary file in the same directory (`.<key hash>.<pid>.<n>.tmp`,
//! created read-only and held under an exclusive `flock` by its writer for its whole life), are synced,
//! and are renamed over the final name: a reader sees a whole artifact or none, two writers of the same
//! key both succeed and one file survives, and a writer killed mid-way leaves only a temporary file that
//! is never read. A temporary is the store's own only if its name has exactly that pattern; it belongs to
//! a dead writer when its lock can be taken, and then `clear`, eviction and every cold write remove it,
//! whatever its age; a live writer's is left alone, listed by [`ArtifactStore::temporaries`] and counted
//! against the size cap. After writing, the payload is hashed again through the mapping and compared.
//! Artifacts are read-only files (mode 0444): they are never modified in place.
//!
//! **Loads** check magic, version, byte order, header, the exact file size, the key hash, the full
//! canonical encoding (so a hash collision or a renamed file is still refused) and the payload's blake3
//! over every section's name, length and bytes (so a flipped byte or two swapped section names are
//! refused) — every time, on every thread the process has. An artifact that fails any check is never
//! used: [`ArtifactStore::get_or_build`] rebuilds it and warns. Files are opened through `int4_files`
//! (a FIFO or a device at an artifact's name is an error, not a wait), and a lock held by another
//! process is waited on for at most [`LOCK_WAIT`].
//!
//! **Changed underneath a mapping.** A mapped artifact truncated by another program would make the next
//! read of a page past the new end raise SIGBUS; [`crate::sigbus`] turns that into a one-line message
//! naming the artifact and exit status [`crate::sigbus::EXIT_ARTIFACT_CHANGED`]. Modifying an artifact
//! in place while a process maps it is unsupported (`docs/bad-inputs.md`).
//!
//! **Eviction** keeps the directory under a size cap, least recently used first (a load touches the file's
//! modification time). A loaded artifact holds a shared `flock` for as long as it is mapped; eviction only
//! removes files it can lock exclusively, so nothing a running process has mapped is evicted. Pinned keys
//! (a `<hash>.pin` file beside the artifact, for example the converted default model) are never evicted.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::error::{CacheError, CacheErrorKind};
use crate::key::ArtifactKey;
use crate::sigbus::MappingGuard;

/// The artifact file format's version. 2: the payload hash covers section names and lengths.
pub const FORMAT_VERSION: u32 = 2;
const MAGIC: &[u8; 8] = b"INT4ART\0";
const ENDIAN_MARK: u32 = 0x0102_0304;
const ALIGN: u64 = 64;
const EXT: &str = "int4art";

/// How long a load, a listing or a check waits for a lock another process holds on an artifact before
/// giving up on it (the store's own exclusive locks, taken to remove a file, last microseconds).
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// One named byte range of an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    /// Name (for example `model.layers.0.mlp.gate_up.packed`).
    pub name: String,
    /// Offset from the start of the file (a multiple of 64).
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// An artifact's header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The key's hash (the file name).
    pub key: String,
    /// The key's full canonical encoding.
    pub canonical: String,
    /// The sections, in file order.
    pub sections: Vec<Section>,
    /// blake3 over every section (name, length and bytes), in order, hex.
    pub payload_blake3: String,
}

/// A loaded artifact: a read-only mapping, held with a shared lock so it is never evicted while in use.
#[derive(Debug)]
pub struct MappedArtifact {
    // Declared (and so dropped) before the mapping: the SIGBUS registration never outlives it.
    _guard: MappingGuard,
    map: Mmap,
    header: Header,
    path: PathBuf,
    _lock: File,
}

impl MappedArtifact {
    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A section's bytes (64-byte aligned), zero-copy from the mapping.
    pub fn section(&self, name: &str) -> Option<&[u8]> {
        self.section_range(name).map(|r| &self.map[r])
    }

    /// Where a section lies in the whole file ([`AsRef<[u8]>`] gives the file's bytes), for callers that
    /// share the mapping among many readers.
    pub fn section_range(&self, name: &str) -> Option<std::ops::Range<usize>> {
        let s = self.header.sections.iter().find(|s| s.name == name)?;
        Some(s.offset as usize..(s.offset + s.len) as usize)
    }

    /// blake3 of the payload, recomputed from the mapping.
    pub fn payload_hash(&self) -> String {
        let mut h = blake3::Hasher::new();
        for s in &self.header.sections {
            hash_section(&mut h, &s.name, &self.map[s.offset as usize..(s.offset + s.len) as usize]);
        }
        h.finalize().to_hex().to_string()
    }
}

impl AsRef<[u8]> for MappedArtifact {
    /// The whole file, header included.
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

/// What a load found.
#[derive(Debug)]
pub enum Lookup {
    /// A valid artifact.
    Hit(MappedArtifact),
    /// No artifact for this key.
    Miss,
    /// An artifact that failed a check (the error says which); it must not be used.
    Invalid(CacheError),
}

/// An artifact: mapped from the cache, or built in memory because the cache could not be written.
#[derive(Debug)]
pub enum Artifact {
    /// From (or just written to) the cache.
    Mapped(MappedArtifact),
    /// Built in memory; the cache was unusable (the warning says why).
    InMemory {
        /// The sections.
        sections: Vec<(String, Vec<u8>)>,
        /// Why it is not cached.
        warning: String,
    },
}

impl Artifact {
    /// A section's bytes.
    pub fn section(&self, name: &str) -> Option<&[u8]> {
        match self {
            Artifact::Mapped(m) => m.section(name),
            Artifact::InMemory { sections, .. } => sections.iter().find(|(n, _)| n == name).map(|(_, b)| b.as_slice()),
        }
    }
}

/// An entry in the cache directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key hash.
    pub key: String,
    /// File size.
    pub size: u64,
    /// Pinned (never evicted).
    pub pinned: bool,
}

/// A cache directory.
#[derive(Clone, Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    cap: Option<u64>,
}

impl ArtifactStore {
    /// A store in `dir` (created on first write), without a size cap.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ArtifactStore { dir: dir.into(), cap: None }
    }

    /// The user's store: the cache root ([`crate::dirs::cache_root`]), capped at `INT4_CACHE_MAX_BYTES` if
    /// set ([`crate::dirs::cache_cap`]: a malformed cap is an error); `None` when no environment variable
    /// names a cache root.
    pub fn from_env() -> Result<Option<Self>, CacheError> {
        let cap = crate::dirs::cache_cap()?;
        Ok(crate::dirs::cache_root().map(|dir| ArtifactStore { dir, cap }))
    }

    /// The same store, evicting down to `cap` bytes after every write.
    pub fn with_cap(mut self, cap: u64) -> Self {
        self.cap = Some(cap);
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_for(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}.{EXT}"))
    }

    /// Looks up `key`: every check of the module docs, the payload hash included.
    pub fn load(&self, key: &ArtifactKey) -> Lookup {
        let hash = key.hash();
        let path = self.path_for(&hash);
        let file = match int4_files::open_regular(&path) {
            Ok(f) => f,
            // No file, or no directory to hold one: nothing cached (a store will say why it cannot write).
            Err(e)
                if e.is_not_found()
                    || matches!(e.kind(), int4_files::FileErrorKind::Io(io) if io.raw_os_error() == Some(libc::ENOTDIR)) =>
            {
                return Lookup::Miss;
            }
            Err(e) => return Lookup::Invalid(CacheError::new(CacheErrorKind::File(e))),
        };
        let checked = lock_shared(&file, &path)
            .and_then(|()| map_checked(file, &path, Some((&hash, &key.canonical()))))
            .and_then(|m| check_payload(m, &path));
        match checked {
            Ok(m) => {
                // Mark it recently used for eviction; failing to do so only affects eviction order.
                let _ = m._lock.set_modified(std::time::SystemTime::now());
                Lookup::Hit(m)
            }
            Err(e) => Lookup::Invalid(e),
        }
    }

    /// Writes an artifact for `key` atomically and returns it mapped (payload hash checked).
    pub fn store(&self, key: &ArtifactKey, sections: &[(String, Vec<u8>)]) -> Result<MappedArtifact, CacheError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| CacheError::io(&self.dir, e))?;
        self.remove_dead_temporaries();
        let hash = key.hash();
        let mut table = Vec::new();
        let mut payload = blake3::Hasher::new();
        for (name, bytes) in sections {
            hash_section(&mut payload, name, bytes);
            table.push(Section { name: name.clone(), offset: 0, len: bytes.len() as u64 });
        }
        let mut header = Header {
            key: hash.clone(),
            canonical: key.canonical(),
            sections: table,
            payload_blake3: payload.finalize().to_hex().to_string(),
        };
        // Offsets depend on the header's length, which depends on the offsets' digits: iterate to a fixpoint.
        loop {
            let header_len = serde_json::to_vec(&header).expect("header serialises").len() as u64;
            let mut off = (24 + header_len).next_multiple_of(ALIGN);
            let mut changed = false;
            for s in &mut header.sections {
                if s.offset != off {
                    s.offset = off;
                    changed = true;
                }
                off = (off + s.len).next_multiple_of(ALIGN);
            }
            if !changed {
                break;
            }
        }
        let header_bytes = serde_json::to_vec(&header).expect("header serialises");
        let (mut f, tmp) = self.create_temporary(&hash)?;
        let mut write = || -> std::io::Result<()> {
            let f = &mut f;
            let mut pos = 0u64;
            let put = |f: &mut File, b: &[u8], pos: &mut u64| -> std::io::Result<()> {
                f.write_all(b)?;
                *pos += b.len() as u64;
                Ok(())
            };
            put(f, MAGIC, &mut pos)?;
            put(f, &FORMAT_VERSION.to_le_bytes(), &mut pos)?;
            put(f, &ENDIAN_MARK.to_ne_bytes(), &mut pos)?;
            put(f, &(header_bytes.len() as u64).to_le_bytes(), &mut pos)?;
            put(f, &header_bytes, &mut pos)?;
            for (s, (_, bytes)) in header.sections.iter().zip(sections) {
                let pad = vec![0u8; (s.offset - pos) as usize];
                put(f, &pad, &mut pos)?;
                put(f, bytes, &mut pos)?;
            }
            f.sync_all()?;
            std::fs::rename(&tmp, self.path_for(&hash))
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(CacheError::io(&tmp, e));
        }
        let path = self.path_for(&hash);
        // The writer's descriptor now names the artifact: its exclusive lock becomes the shared lock every
        // mapping holds, and the file is mapped through it (not reopened by name). The conversion is not
        // atomic and not waited on: if an evictor takes the file in between, it unlinks a name, and this
        // mapping stays valid.
        let _ = flock(&f, libc::LOCK_SH | libc::LOCK_NB);
        let mapped = map_checked(f, &path, Some((&hash, &header.canonical)))?;
        if mapped.payload_hash() != header.payload_blake3 {
            let _ = std::fs::remove_file(&path);
            return Err(CacheError::new(CacheErrorKind::Corrupt {
                path,
                reason: "payload hash differs after writing".into(),
            }));
        }
        if let Some(cap) = self.cap {
            // The new artifact is mapped (and so locked): eviction cannot take it.
            self.evict_to(cap);
        }
        Ok(mapped)
    }

    /// Loads `key`, or builds it with `build` and stores it. An invalid artifact is rebuilt; a cache that
    /// cannot be written gives an in-memory artifact. Every such event is returned as a warning; only an
    /// error of `build` itself is an error.
    pub fn get_or_build<E>(
        &self,
        key: &ArtifactKey,
        build: impl FnOnce() -> Result<Vec<(String, Vec<u8>)>, E>,
    ) -> Result<(Artifact, Vec<String>), E> {
        let mut warnings = Vec::new();
        match self.load(key) {
            Lookup::Hit(m) => return Ok((Artifact::Mapped(m), warnings)),
            Lookup::Miss => {}
            Lookup::Invalid(why) => warnings.push(format!("cached artifact not used ({why}); rebuilding it")),
        }
        let sections = build()?;
        match self.store(key, &sections) {
            Ok(m) => Ok((Artifact::Mapped(m), warnings)),
            Err(e) => {
                let warning = format!("cache unusable ({e}); running uncached");
                warnings.push(warning.clone());
                Ok((Artifact::InMemory { sections, warning }, warnings))
            }
        }
    }

    /// Creates this process's next temporary for `hash`: read-only, locked exclusively, and still the file
    /// its name points at once locked (a remover that raced the creation would have unlinked it).
    fn create_temporary(&self, hash: &str) -> Result<(File, PathBuf), CacheError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let tmp = self.dir.join(format!(".{hash}.{}.{n}.tmp", std::process::id()));
            let mut options = OpenOptions::new();
            options.read(true).write(true).create_new(true);
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o444);
            }
            let f = match options.open(&tmp) {
                Ok(f) => f,
                // Another process with the same pid (a container sharing the volume) got there first.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1 << 20 => continue,
                Err(e) => return Err(CacheError::io(&tmp, e)),
            };
            // Never waited on: a lister may hold a shared lock for a moment, anything longer is foreign.
            if let Err(e) = lock_within(&f, libc::LOCK_EX) {
                let _ = std::fs::remove_file(&tmp);
                return Err(CacheError::io(&tmp, e));
            }
            match (f.metadata(), std::fs::symlink_metadata(&tmp)) {
                (Ok(a), Ok(b)) if same_file(&a, &b) => return Ok((f, tmp)),
                // Removed before the lock was taken: try the next name (a remover only takes unlocked ones,
                // so this happens at most once per racing remover).
                _ if n < 1 << 20 => continue,
                _ => return Err(CacheError::io(&tmp, std::io::Error::other("temporary removed while created"))),
            }
        }
    }

    /// Every artifact in the directory.
    pub fn list(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == EXT)
                && let Some(stem) = p.file_stem().map(|s| s.to_string_lossy().to_string())
            {
                let size = e.metadata().map_or(0, |m| m.len());
                let pinned = self.dir.join(format!("{stem}.pin")).exists();
                out.push(Entry { key: stem, size, pinned });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// The header of the artifact named `hash` (checked as a load checks it, payload hash aside), for
    /// listings that say what each artifact is.
    pub fn header(&self, hash: &str) -> Result<Header, CacheError> {
        let path = self.path_for(hash);
        let file = int4_files::open_regular(&path).map_err(|e| CacheError::new(CacheErrorKind::File(e)))?;
        lock_shared(&file, &path)?;
        Ok(map_checked(file, &path, None)?.header)
    }

    /// The store's temporaries in the directory: `(path, size, whether its writer is alive)`.
    pub fn temporaries(&self) -> Vec<(PathBuf, u64, bool)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out: Vec<(PathBuf, u64, bool)> = rd
            .flatten()
            .filter(|e| is_own_temporary(&e.file_name().to_string_lossy()))
            .filter_map(|e| {
                let path = e.path();
                let file = int4_files::open_regular(&path).ok()?;
                let meta = file.metadata().ok()?;
                let alive = match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
                    Ok(()) => false,
                    Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => true,
                    // No locks on this filesystem: a writer is presumed alive for an hour.
                    Err(_) => {
                        meta.modified().ok().and_then(|t| t.elapsed().ok()).is_none_or(|age| age.as_secs() < 3600)
                    }
                };
                Some((path, meta.len(), alive))
            })
            .collect();
        out.sort();
        out
    }

    /// Checks every artifact fully (header, size, payload blake3): `(key, Ok or the problem)`.
    pub fn verify(&self) -> Vec<(String, Result<(), CacheError>)> {
        self.list()
            .into_iter()
            .map(|e| {
                let path = self.path_for(&e.key);
                let corrupt = |reason: String| CacheError::new(CacheErrorKind::Corrupt { path: path.clone(), reason });
                let r = int4_files::open_regular(&path)
                    .map_err(|err| CacheError::new(CacheErrorKind::File(err)))
                    .and_then(|f| lock_shared(&f, &path).map(|()| f))
                    .and_then(|f| map_checked(f, &path, None))
                    .and_then(|m| {
                        if m.header.key != e.key {
                            Err(corrupt(format!("header names key {}, file is named {}", m.header.key, e.key)))
                        } else {
                            check_payload(m, &path).map(drop)
                        }
                    });
                (e.key, r)
            })
            .collect()
    }

    /// Marks a key as never to be evicted.
    pub fn pin(&self, key: &ArtifactKey) -> Result<(), CacheError> {
        use std::os::unix::fs::OpenOptionsExt;
        let p = self.dir.join(format!("{}.pin", key.hash()));
        std::fs::create_dir_all(&self.dir).map_err(|e| CacheError::io(&self.dir, e))?;
        // Created if absent, never through a link or into a FIFO.
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&p)
            .map_err(|e| CacheError::io(&p, e))?;
        match f.metadata() {
            Ok(m) if m.is_file() => Ok(()),
            _ => Err(CacheError::io(&p, std::io::Error::other("not a regular file"))),
        }
    }

    /// Removes every artifact no process has mapped (and dead writers' temporaries); returns the count of
    /// artifacts removed.
    pub fn clear(&self) -> usize {
        self.remove_dead_temporaries();
        self.list().into_iter().filter(|e| self.try_remove(&e.key)).count()
    }

    /// Evicts least recently used, unpinned, unmapped artifacts until the total is at most `cap` bytes;
    /// returns the keys evicted.
    pub fn evict_to(&self, cap: u64) -> Vec<String> {
        self.remove_dead_temporaries();
        let mut entries: Vec<(std::time::SystemTime, Entry)> = self
            .list()
            .into_iter()
            .map(|e| {
                let t = std::fs::metadata(self.path_for(&e.key))
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                (t, e)
            })
            .collect();
        entries.sort_by_key(|(t, _)| *t);
        // Live writers' temporaries count against the cap: they become artifacts.
        let writing: u64 = self.temporaries().iter().map(|(_, size, _)| size).sum();
        let mut total: u64 = entries.iter().map(|(_, e)| e.size).sum::<u64>() + writing;
        let mut evicted = Vec::new();
        for (_, e) in entries {
            if total <= cap {
                break;
            }
            if !e.pinned && self.try_remove(&e.key) {
                total -= e.size;
                evicted.push(e.key);
            }
        }
        evicted
    }

    /// Removes an artifact if no process holds it (an exclusive non-blocking lock succeeds).
    fn try_remove(&self, hash: &str) -> bool {
        let path = self.path_for(hash);
        let Ok(f) = int4_files::open_regular(&path) else {
            return false;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_err() {
            return false;
        }
        unlink_if_same(&f, &path)
    }

    /// Removes the store's temporaries whose writer is dead (its exclusive lock is gone), whatever their
    /// age; files that merely look like temporaries are left alone.
    fn remove_dead_temporaries(&self) {
        for (path, _, alive) in self.temporaries() {
            if alive {
                continue;
            }
            // Taken exclusively before removal, so a writer that created this name since the listing (and so
            // holds its lock) is never removed.
            if let Ok(f) = int4_files::open_regular(&path)
                && flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok()
            {
                unlink_if_same(&f, &path);
            }
        }
    }
}

/// Whether `name` is one of the store's temporaries: `.<64 hex digits>.<pid>.<n>.tmp`.
fn is_own_temporary(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { return false };
    let mut parts = inner.split('.');
    let (Some(hash), Some(pid), Some(n), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) && digits(pid) && digits(n)
}

/// Whether two metadata describe the same file (device and inode).
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Unlinks `path` if it still names the file `locked` holds (another process may have renamed a fresh
/// artifact over the name since it was opened); whether it did.
fn unlink_if_same(locked: &File, path: &Path) -> bool {
    match (locked.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) if same_file(&a, &b) => std::fs::remove_file(path).is_ok(),
        _ => false,
    }
}

/// `flock(file, op | LOCK_NB)`, retried for at most [`LOCK_WAIT`] while another process holds a
/// conflicting lock.
fn lock_within(file: &File, op: libc::c_int) -> std::io::Result<()> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match flock(file, op | libc::LOCK_NB) {
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Takes the shared lock a mapping holds, waiting at most [`LOCK_WAIT`] for another process's exclusive
/// one. A filesystem without locks (the call fails otherwise) leaves the artifact evictable, which only
/// unlinks it: the mapping stays valid.
fn lock_shared(file: &File, path: &Path) -> Result<(), CacheError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match flock(file, libc::LOCK_SH | libc::LOCK_NB) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                if Instant::now() >= deadline {
                    return Err(CacheError::new(CacheErrorKind::Locked {
                        path: path.to_path_buf(),
                        waited: LOCK_WAIT,
                    }));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => return Ok(()),
        }
    }
}

/// `m` if its payload hashes to what its header says.
fn check_payload(m: MappedArtifact, path: &Path) -> Result<MappedArtifact, CacheError> {
    if m.payload_hash() == m.header.payload_blake3 {
        Ok(m)
    } else {
        Err(CacheError::new(CacheErrorKind::Corrupt {
            path: path.to_path_buf(),
            reason: "payload blake3 does not match the header: the file is corrupt".into(),
        }))
    }
}

/// Adds one section to a payload hash: its name and length as well as its bytes, so a renamed or
/// reordered section changes the hash too.
fn hash_section(h: &mut blake3::Hasher, name: &str, bytes: &[u8]) {
    h.update(&(name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update_rayon(bytes);
}

/// `flock(fd, op)`.
fn flock(f: &File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: `f` is an open file for the duration of the call, so its descriptor is valid; flock only
    // changes the advisory lock state of that open file description.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Maps `file` (the caller holds its shared lock) and checks everything but the payload hash. `expect`
/// is the key hash and canonical encoding the caller asked for (`None` to accept whatever key the header
/// names).
fn map_checked(file: File, path: &Path, expect: Option<(&str, &str)>) -> Result<MappedArtifact, CacheError> {
    let corrupt = |reason: String| CacheError::new(CacheErrorKind::Corrupt { path: path.to_path_buf(), reason });
    // SAFETY: the mapping is read-only and private to this process. The store never modifies an artifact
    // in place: writers create a new, read-only file and rename it over the old name, and removal only
    // unlinks. Another program truncating the file underneath the mapping makes a later read of a whole
    // page past the new end fault with SIGBUS, which `sigbus` reports and ends the process on; the rest of
    // a partly cut page reads as zeros, and rewriting the file in place changes what is read: both are
    // in-place modification, unsupported (module docs, docs/bad-inputs.md).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| CacheError::io(path, e))?;
    let guard = MappingGuard::register(&map, path);
    if map.len() < 24 {
        return Err(corrupt(format!("{} bytes is too short for an artifact header", map.len())));
    }
    if &map[..8] != MAGIC {
        return Err(corrupt("not an int4 artifact (bad magic)".into()));
    }
    let version = u32::from_le_bytes(map[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(corrupt(format!("artifact format version {version}, this build reads {FORMAT_VERSION}")));
    }
    if u32::from_ne_bytes(map[12..16].try_into().expect("4 bytes")) != ENDIAN_MARK {
        return Err(corrupt("written on a machine of the other byte order".into()));
    }
    let header_len = u64::from_le_bytes(map[16..24].try_into().expect("8 bytes"));
    if header_len > map.len() as u64 - 24 {
        return Err(corrupt(format!("header length {header_len} runs past the end of the file")));
    }
    let header: Header = serde_json::from_slice(&map[24..24 + header_len as usize])
        .map_err(|source| CacheError::new(CacheErrorKind::BadHeader { path: path.to_path_buf(), source }))?;
    if blake3::hash(header.canonical.as_bytes()).to_hex().as_str() != header.key {
        return Err(corrupt("the header's canonical key does not hash to the key it names".into()));
    }
    let mut end = 24 + header_len;
    for s in &header.sections {
        if s.offset % ALIGN != 0 || s.offset < end {
            return Err(corrupt(format!("section {} is misaligned or overlaps the one before it", s.name)));
        }
        // The alignment padding is zeros: a changed padding byte is damage too, and this keeps every byte
        // of the file covered by some check (header, padding, or the payload hash).
        if s.offset <= map.len() as u64 && map[end as usize..s.offset as usize].iter().any(|&b| b != 0) {
            return Err(corrupt(format!("the padding before section {} is not zero", s.name)));
        }
        if s.offset.checked_add(s.len).is_none_or(|e| e > map.len() as u64) {
            return Err(corrupt(format!(
                "file is {} bytes but section {} ends at {}: truncated",
                map.len(),
                s.name,
                s.offset.saturating_add(s.len)
            )));
        }
        end = s.offset + s.len;
    }
    if end != map.len() as u64 {
        return Err(corrupt(format!("file is {} bytes, its sections end at {end} (truncated or extended)", map.len())));
    }
    if let Some((hash, canonical)) = expect {
        if header.key != hash {
            return Err(corrupt(format!("header is for key {}, not {hash}", header.key)));
        }
        if header.canonical != canonical {
            return Err(corrupt("header's configuration differs from the one asked for".into()));
        }
    }
    Ok(MappedArtifact { _guard: guard, map, header, path: path.to_path_buf(), _lock: file })
}
