//! A writer killed at an arbitrary point of an artifact write (SIGKILL: no destructor, no cleanup, no
//! flush) never leaves anything that a later load uses: every artifact is either absent or complete and
//! checked, and the next writer of the same key succeeds.
//!
//! The test runs its own binary a second time as the writer: with `INT4_KILLED_WRITER_DIR` set it writes
//! artifacts back to back until the parent kills it, at a different moment in each round.

use int4_cache::key::{ArtifactKey, SourceFile, SourceIdentity};
use int4_cache::quant_config::normalize;
use int4_cache::store::{ArtifactStore, Lookup};
use int4_select::policy::{CheckpointKind, Overrides, Priority, plan};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_DIR: &str = "INT4_KILLED_WRITER_DIR";
const CHILD_ROUND: &str = "INT4_KILLED_WRITER_ROUND";
const ROUNDS: u64 = 10;
/// Keys one writer may get through before it is killed (it is killed long before).
const KEYS_PER_ROUND: u64 = 1000;
/// Big enough that a write (with its fsync) takes a while, so kills land inside writes.
const SECTION_BYTES: usize = 8 << 20;

fn key(id: u64) -> ArtifactKey {
    let snap = int4_select::probe::non_x86_snapshot("aarch64", "test");
    let plan = plan(&snap, CheckpointKind::CpuInt4, Priority::Speed, &Overrides::default()).unwrap();
    ArtifactKey::new(
        normalize(Some(&json!({"quant_method": "cpu_int4", "group_size": 128}))).unwrap(),
        &plan,
        vec![],
        SourceIdentity {
            files: vec![SourceFile { name: "model.safetensors".into(), size: id, blake3: format!("key-{id}") }],
        },
    )
}

/// The sections of artifact `id`: contents that differ per key and per byte, so a mix-up or a torn
/// write cannot pass for the real thing.
fn sections(id: u64) -> Vec<(String, Vec<u8>)> {
    let bytes = |salt: u64, len: usize| -> Vec<u8> {
        (0..len as u64).map(|i| (i.wrapping_mul(2654435761).wrapping_add(id * 31 + salt) >> 7) as u8).collect()
    };
    vec![("packed".into(), bytes(1, SECTION_BYTES)), ("scales".into(), bytes(2, 4099))]
}

/// The writer: stores keys `round * KEYS_PER_ROUND ..` one after another until killed.
fn write_until_killed(dir: &Path, round: u64) {
    let store = ArtifactStore::new(dir);
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in round * KEYS_PER_ROUND..(round + 1) * KEYS_PER_ROUND {
        if Instant::now() > deadline {
            break;
        }
        store.store(&key(id), &sections(id)).unwrap();
    }
}

fn temporaries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "tmp")).collect::<Vec<_>>()
        })
        .unwrap_or_default()
}

#[test]
fn a_writer_killed_mid_write_leaves_nothing_that_is_used() {
    if let (Ok(dir), Ok(round)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_ROUND)) {
        write_until_killed(Path::new(&dir), round.parse().unwrap());
        return;
    }
    let scratch = tempfile::Builder::new().prefix("int4-killed-writer-").tempdir().unwrap();
    let dir = scratch.path();
    let store = ArtifactStore::new(dir);
    let exe = std::env::current_exe().unwrap();
    let (mut torn, mut complete) = (0, 0);
    // At least ROUNDS kills; on a loaded machine, where a kill more often lands between two writes, more
    // (up to four times as many) until half of ROUNDS have landed inside one.
    let mut round = 0;
    while round < ROUNDS || (torn < ROUNDS / 2 && round < 4 * ROUNDS) {
        let mut child = Command::new(&exe)
            .args(["--exact", "a_writer_killed_mid_write_leaves_nothing_that_is_used", "--test-threads", "1"])
            .env(CHILD_DIR, dir)
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until the writer is inside its first write, then let it run on for a different while in
        // each round (0–72 ms: within the first write, or some writes later).
        let start = Instant::now();
        let before = temporaries(dir).len();
        while temporaries(dir).len() == before && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis((round % ROUNDS) * 8));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "round {round}: the writer finished before it was killed");
        // Every key the writer could have reached is absent, or there whole; never invalid.
        for id in round * KEYS_PER_ROUND..(round + 1) * KEYS_PER_ROUND {
            match store.load(&key(id)) {
                Lookup::Miss => {}
                Lookup::Hit(m) => {
                    for (name, bytes) in sections(id) {
                        assert!(m.section(&name) == Some(&bytes[..]), "round {round}: key {id}'s {name} differs");
                    }
                    complete += 1;
                }
                Lookup::Invalid(why) => panic!("round {round}: key {id} left a damaged artifact: {why}"),
            }
        }
        if !temporaries(dir).is_empty() {
            torn += 1;
        }
        // The next writer of the key that was being written when the writer died succeeds.
        let next = (round * KEYS_PER_ROUND..(round + 1) * KEYS_PER_ROUND)
            .find(|&id| matches!(store.load(&key(id)), Lookup::Miss))
            .unwrap();
        store.store(&key(next), &sections(next)).unwrap();
        assert!(matches!(store.load(&key(next)), Lookup::Hit(_)));
        round += 1;
    }
    // The kills did land inside writes (a half-written temporary was left behind), so the checks above
    // were made against torn writes, not only between them.
    assert!(torn >= ROUNDS / 2, "only {torn} of {round} kills left a half-written temporary");
    // `verify` reads every artifact in the directory: all whole.
    let verified = store.verify();
    assert!(verified.iter().all(|(_, r)| r.is_ok()), "{verified:?}");
    assert_eq!(verified.len(), complete + round as usize);
    // The killed writers' temporaries were never taken for artifacts; the writes that followed each kill
    // removed them (a dead writer's lock is gone), so none is left.
    assert!(temporaries(dir).is_empty(), "dead writers' temporaries were not removed: {:?}", temporaries(dir));
    eprintln!("killed {round} writers: {torn} mid-write, {complete} artifacts finished before the kill, all whole");
}
