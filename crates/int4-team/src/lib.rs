//! A thread team for the short parallel loops of a decode step: its members do not sleep between loops.
//!
//! Why: a decode step of a small model is a chain of about a hundred parallel loops of 5–30 µs each (one
//! per linear layer), each needing the one before it. On rayon a loop reaches the other threads through
//! work stealing: an idle worker yields to the operating system (`sched_yield`, a system call per round)
//! and after a few dozen rounds sleeps on a futex, so loops wait for a wake-up, and the thread that
//! starts a loop ends up doing more than its share of it (docs/perf.md, "A thread team for a decode step's short loops"). A
//! team's members instead watch one atomic word, spinning, for a while after each loop, so the next loop
//! reaches them in a cache-line transfer; and they take a loop's parts from a shared counter, so a member
//! that comes late (descheduled, or parked after a long pause) only leaves the others more parts.
//!
//! Watching costs a core, which is free in a decode step (every thread waits on the same serial work) but
//! not in a prompt, whose long loops run on rayon's threads: a member spinning there would take a core
//! from them. So a member yields its core on each look once it has spun a while, and parks as soon as a
//! loop ends if that loop came after a pause longer than its watch: loops that far apart gain nothing
//! from watching.
//!
//! The team is the current rayon pool's size (the thread that starts a loop, the *leader*, plus
//! `threads − 1` members of the team's own), one per pool size, made on first use and kept for the
//! process, as rayon keeps its pool. A loop runs on the team only when the team is free; a loop started
//! while another holds it (another leader, or the leader's own part) runs on rayon instead, so no caller
//! waits for another, and one started in a part a member runs runs there, in order (a member is no
//! rayon worker, so rayon would send it to the global pool).
//!
//! Which thread runs a part never changes a result: callers split output channels, never a reduction.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long a member watches for the next loop before it parks. Long enough to span the serial work
/// between two loops of one step (attention, norms, an activation quantization: microseconds), short
/// enough that an idle process stops burning cores soon after its last step.
const SPIN_FOR: Duration = Duration::from_millis(5);

/// How long a member spins without yielding. Past it the member gives up its core on every look
/// (`sched_yield`), so a thread with work (a prompt's loops on rayon, another process) gets the core
/// while the member still sees the next loop within a system call.
const SPIN_HOT: Duration = Duration::from_micros(100);

/// Parts per thread in one loop: a few, so a member that starts late is made up for by the others.
const PARTS_PER_THREAD: usize = 2;

/// The most parts a loop is split into (the `state` word's part fields are 16 bits).
const MAX_PARTS: usize = 1 << 12;

/// `f(i, chunk)` for the consecutive chunks of `chunk_len` elements of `data` (the last may be shorter),
/// chunk `i` starting at `i · chunk_len`: `data.par_chunks_mut(chunk_len).enumerate()`, in parts of at
/// least `min_chunks` chunks, on the current pool's team when it is free, else on rayon. Every chunk runs
/// once; after an error the chunks not yet started are skipped, and one of the errors is returned. A
/// panic in `f` is resumed on the calling thread once every part has ended.
///
/// # Panics
/// If `chunk_len` is 0, or where `f` panics.
pub fn try_for_each_chunk_mut<T, E, F>(data: &mut [T], chunk_len: usize, min_chunks: usize, f: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(usize, &mut [T]) -> Result<(), E> + Sync,
{
    assert!(chunk_len > 0, "chunks of no elements");
    let chunks = data.len().div_ceil(chunk_len);
    let min_chunks = min_chunks.max(1);
    let parts = (chunks / min_chunks).min(rayon::current_num_threads() * PARTS_PER_THREAD);
    run_chunks(data, chunk_len, parts, &f, |data| {
        data.par_chunks_mut(chunk_len).with_min_len(min_chunks).enumerate().try_for_each(|(i, c)| f(i, c))
    })
}

/// [`try_for_each_chunk_mut`] for an `f` that cannot fail.
///
/// # Panics
/// If `chunk_len` is 0, or where `f` panics.
pub fn for_each_chunk_mut<T, F>(data: &mut [T], chunk_len: usize, min_chunks: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let never = try_for_each_chunk_mut(data, chunk_len, min_chunks, |i, c| {
        f(i, c);
        Ok::<(), std::convert::Infallible>(())
    });
    match never {
        Ok(()) => {}
        Err(e) => match e {},
    }
}

/// `items.iter().map(f).collect()`, each item a part of its own (up to 4096 parts; beyond, consecutive
/// items share one), taken in order: the thread that is free first takes the next item, so items sorted
/// longest first balance across the threads. On the team when it is free, else on rayon (an item a job).
///
/// # Panics
/// Where `f` panics.
pub fn map_each<T, R, F>(items: &[T], f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let never = run_chunks(
        &mut out,
        1,
        items.len(),
        &|i, slot: &mut [Option<R>]| {
            slot[0] = Some(f(&items[i]));
            Ok::<(), std::convert::Infallible>(())
        },
        |out| {
            out.par_iter_mut().with_max_len(1).zip(items).for_each(|(slot, item)| *slot = Some(f(item)));
            Ok(())
        },
    );
    match never {
        Ok(()) => {}
        Err(e) => match e {},
    }
    out.into_iter().map(|r| r.expect("every item ran")).collect()
}

/// Runs `f` over `data`'s chunks of `chunk_len` in `parts` parts of consecutive chunks on the team; in
/// order on this thread for one part; by `on_rayon` when the team is busy or there is none (one thread).
fn run_chunks<T, E, F>(
    data: &mut [T],
    chunk_len: usize,
    parts: usize,
    f: &F,
    on_rayon: impl FnOnce(&mut [T]) -> Result<(), E>,
) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(usize, &mut [T]) -> Result<(), E> + Sync,
{
    let chunks = data.len().div_ceil(chunk_len);
    let parts = parts.min(chunks).min(MAX_PARTS);
    // A member is no rayon worker: a loop started in a part it runs would go to the global pool, not the
    // caller's, and wait there. It runs in order here instead (the leader's own nested loops go to rayon,
    // on the caller's pool, below).
    if parts <= 1 || IN_MEMBER.get() {
        return data.chunks_mut(chunk_len).enumerate().try_for_each(|(i, c)| f(i, c));
    }
    let Some(team) = Team::for_threads(rayon::current_num_threads()).and_then(Team::lead) else {
        return on_rayon(data);
    };
    let (len, base) = (data.len(), SendPtr(data.as_mut_ptr()));
    let failed = AtomicBool::new(false);
    let error = Mutex::new(None);
    let run_part = |p: usize| {
        for i in split(p, chunks, parts)..split(p + 1, chunks, parts) {
            if failed.load(Ordering::Relaxed) {
                return;
            }
            let start = i * chunk_len;
            let end = (start + chunk_len).min(len);
            // SAFETY: `start < end ≤ len` (i < chunks), so the range lies within `data`, whose exclusive
            // borrow this function holds until every part has ended (`Leader::run` returns only then). Parts
            // cover disjoint chunk ranges and each part runs exactly once (`Leader::run`), so no two threads
            // hold a reference to the same element.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            if let Err(e) = f(i, chunk) {
                failed.store(true, Ordering::Relaxed);
                error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                return;
            }
        }
    };
    team.run(parts, &run_part);
    match error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Where part `p` of `chunks` split in `parts` starts: `p · chunks / parts`, without overflow.
fn split(p: usize, chunks: usize, parts: usize) -> usize {
    (p as u128 * chunks as u128 / parts as u128) as usize
}

thread_local! {
    /// Whether this thread is a team member (set once, as it starts).
    static IN_MEMBER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A pointer to the caller's slice that the parts share (each part derefs only its own chunks).
struct SendPtr<T>(*mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer. A method, so closures capture the whole `SendPtr` (which is `Sync`), not its field.
    fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: the pointer is only dereferenced through disjoint chunks, each by one thread at a time
// (`run_chunks`), and `T: Send` there, so sharing it moves at most a `&mut [T]` per chunk.
unsafe impl<T: Send> Sync for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SendPtr<T> {}

/// The `state` word: the loop's generation (32 bits), its parts (16 bits), the next part to take (16).
fn pack(generation: u64, parts: usize, next: usize) -> u64 {
    (generation << 32) | ((parts as u64) << 16) | next as u64
}

fn parts_of(state: u64) -> usize {
    ((state >> 16) & 0xFFFF) as usize
}

fn next_of(state: u64) -> usize {
    (state & 0xFFFF) as usize
}

/// One loop, on its leader's stack while it runs.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    /// A payload from a part that panicked, resumed by the leader.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A value alone on its cache line, so writes to its neighbours do not disturb the members polling it.
#[repr(align(64))]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One pool size's team.
struct Team {
    /// Generation, parts and next part of the current loop ([`pack`]). A member takes part `next` by
    /// advancing `next` with a compare-and-swap on the whole word, so it can only take a part of the loop
    /// whose generation and size it read.
    state: OwnLine<AtomicU64>,
    /// When the last loop ended, in nanoseconds since `epoch`: members watch for [`SPIN_FOR`] from then.
    last_end: AtomicU64,
    /// Whether the current (or last) loop started more than [`SPIN_FOR`] after the one before: then
    /// members park as soon as it ends. The leader decides it for the whole team, so a member that keeps
    /// missing loops (woken too late for them) does not stay in the wrong mode.
    far_apart: AtomicBool,
    epoch: Instant,
    /// The current loop. Written by the leader before the `state` that announces it, and not changed
    /// again until every part of it has ended.
    job: AtomicPtr<Job<'static>>,
    /// Parts of the current loop that have ended.
    done: AtomicUsize,
    /// Held by the loop's leader.
    busy: AtomicBool,
    members: Vec<Member>,
}

struct Member {
    thread: OnceLock<Thread>,
    /// Set while the member is parked (or about to park).
    parked: AtomicBool,
}

impl Team {
    /// The team for a pool of `threads`, made on first use; `None` for one thread or if a member thread
    /// could not be started.
    fn for_threads(threads: usize) -> Option<&'static Team> {
        static TEAMS: Mutex<Vec<&'static Team>> = Mutex::new(Vec::new());
        thread_local!(static MINE: std::cell::Cell<Option<&'static Team>> = const { std::cell::Cell::new(None) });
        if threads <= 1 {
            return None;
        }
        if let Some(team) = MINE.get().filter(|t| t.members.len() + 1 == threads) {
            return Some(team);
        }
        let mut teams = TEAMS.lock().unwrap_or_else(|p| p.into_inner());
        let team = match teams.iter().find(|t| t.members.len() + 1 == threads) {
            Some(&team) => team,
            None => {
                let team: &'static Team = Box::leak(Box::new(Team {
                    state: OwnLine(AtomicU64::new(0)),
                    last_end: AtomicU64::new(0),
                    far_apart: AtomicBool::new(true),
                    epoch: Instant::now(),
                    job: AtomicPtr::new(std::ptr::null_mut()),
                    done: AtomicUsize::new(0),
                    busy: AtomicBool::new(false),
                    members: (1..threads)
                        .map(|_| Member { thread: OnceLock::new(), parked: AtomicBool::new(false) })
                        .collect(),
                }));
                for (i, member) in team.members.iter().enumerate() {
                    let spawned = thread::Builder::new()
                        .name(format!("int4-team-{threads}-{}", i + 1))
                        .spawn(move || team.serve(member));
                    match spawned {
                        Ok(handle) => {
                            let _ = member.thread.set(handle.thread().clone());
                        }
                        // A team with fewer members still runs every loop (the leader takes the parts no
                        // member does) and is kept, so no later loop spawns threads again.
                        Err(_) => break,
                    }
                }
                teams.push(team);
                team
            }
        };
        MINE.set(Some(team));
        Some(team)
    }

    /// The team, held by the calling thread until the returned leader is dropped; `None` while another
    /// thread holds it.
    fn lead(&'static self) -> Option<Leader> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Leader { team: self })
    }

    /// A member's life: take parts of each loop as it is announced, and between loops watch for the
    /// next: spinning for [`SPIN_HOT`], then yielding its core on each look, and parking after
    /// [`SPIN_FOR`] without a loop. After a loop that started longer than that after the one before
    /// (`far_apart`, the leader's call), members park as soon as it ends: the loops are far apart (the
    /// team's between long loops on rayon), and watching would only take a core from the threads with
    /// work.
    fn serve(&self, me: &Member) {
        IN_MEMBER.set(true);
        loop {
            if self.take_part() {
                continue;
            }
            let idle = self.now().saturating_sub(self.last_end.load(Ordering::Relaxed));
            if !self.far_apart.load(Ordering::Relaxed) && idle < SPIN_FOR.as_nanos() as u64 {
                if idle < SPIN_HOT.as_nanos() as u64 {
                    std::hint::spin_loop();
                } else {
                    thread::yield_now();
                }
                continue;
            }
            // Announce the park, then look once more: a leader announces a loop before it reads `parked`,
            // and this member sets `parked` before it reads `state` (both sequentially consistent), so
            // either this look sees the loop or the leader sees `parked` and unparks.
            me.parked.store(true, Ordering::SeqCst);
            let state = self.state.load(Ordering::SeqCst);
            if next_of(state) >= parts_of(state) {
                thread::park();
            }
            me.parked.store(false, Ordering::SeqCst);
        }
    }

    /// Nanoseconds since the team was made.
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Takes and runs one part of the current loop; false if there was none to take.
    fn take_part(&self) -> bool {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = next_of(state);
            if next >= parts_of(state) {
                return false;
            }
            match self.state.compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break self.run_part(next),
                Err(now) => state = now,
            }
        }
        true
    }

    /// Runs part `p` of the current loop, which the caller has taken.
    fn run_part(&self, p: usize) {
        // SAFETY: the caller took part p of the loop `state` announced (a successful compare-and-swap on
        // the word that the leader stored after `job`, so that store happened before this load). The loop
        // has not ended, since part p has not, and the leader keeps its `Job` alive and `job` unchanged
        // until every part has ended (`Leader::run`).
        let job = unsafe { &*self.job.load(Ordering::Acquire) };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (job.run)(p))) {
            let mut first = job.panic.lock().unwrap_or_else(|e| e.into_inner());
            if first.is_none() {
                *first = Some(payload);
            } else {
                // Dropping a payload runs its destructor, which may itself panic and unwind out of here
                // with the part uncounted: the loop's only payload is the first; the others are leaked.
                std::mem::forget(payload);
            }
        }
        self.done.fetch_add(1, Ordering::Release);
    }
}

/// The team, held by one thread for one loop.
struct Leader {
    team: &'static Team,
}

impl Leader {
    /// Runs `run(p)` for every `p` in `0..parts` (at most [`MAX_PARTS`]) on the leader and the members,
    /// returning once every part has ended; a panic in a part is resumed here after that.
    fn run(self, parts: usize, run: &(dyn Fn(usize) + Sync)) {
        debug_assert!(parts <= MAX_PARTS);
        let team = self.team;
        let job = Job { run, panic: Mutex::new(None) };
        // SAFETY (of the lifetime erasure): members dereference `job` only after taking one of this loop's
        // parts, and this function does not return until every part has ended, nor unwind before then
        // (parts run under `catch_unwind` and `run_part` drops no payload; should anything else unwind,
        // `stay` aborts the process rather than free what members still use), so `job` and what `run`
        // borrows outlive every use.
        let erased = (&job as *const Job<'_>).cast::<Job<'static>>().cast_mut();
        let start = team.now();
        let gap = start.saturating_sub(team.last_end.load(Ordering::Relaxed));
        team.far_apart.store(gap > SPIN_FOR.as_nanos() as u64, Ordering::Relaxed);
        let stay = AbortOnUnwind;
        team.done.store(0, Ordering::Relaxed);
        team.job.store(erased, Ordering::Release);
        let generation = (team.state.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        team.state.store(pack(generation, parts, 0), Ordering::SeqCst);
        for member in &team.members {
            if member.parked.load(Ordering::SeqCst)
                && let Some(t) = member.thread.get()
            {
                t.unpark();
            }
        }
        while team.take_part() {}
        let mut spins = 0u32;
        while team.done.load(Ordering::Acquire) < parts {
            // A member holding a part may have been descheduled: after a while, give it the core.
            spins = spins.wrapping_add(1);
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        std::mem::forget(stay);
        team.last_end.store(team.now(), Ordering::Relaxed);
        let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(self);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }
}

/// Aborts the process if dropped: held by a leader while members may be running its loop's parts.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        std::process::abort();
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.team.busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a test pool")
    }

    /// What the serial loop writes: each element its chunk index and its place in the chunk.
    fn serial(len: usize, chunk_len: usize) -> Vec<(usize, usize)> {
        (0..len).map(|j| (j / chunk_len, j % chunk_len)).collect()
    }

    #[test]
    fn every_chunk_runs_once_with_its_index_at_every_split() {
        for threads in [1, 2, 3] {
            pool(threads).install(|| {
                for len in [0, 1, 15, 16, 17, 100, 1000] {
                    for chunk_len in [1, 3, 16] {
                        for min_chunks in [0, 1, 2, 7, 1000] {
                            let mut data = vec![(usize::MAX, usize::MAX); len];
                            let runs: Vec<AtomicUsize> =
                                (0..len.div_ceil(chunk_len)).map(|_| AtomicUsize::new(0)).collect();
                            for_each_chunk_mut(&mut data, chunk_len, min_chunks, |i, c| {
                                runs[i].fetch_add(1, Ordering::Relaxed);
                                assert!(
                                    c.len() == chunk_len || (i + 1) * chunk_len >= len,
                                    "only the last chunk is short"
                                );
                                for (j, d) in c.iter_mut().enumerate() {
                                    *d = (i, j);
                                }
                            });
                            assert_eq!(
                                data,
                                serial(len, chunk_len),
                                "{threads} threads, {len}/{chunk_len}/{min_chunks}"
                            );
                            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
                        }
                    }
                }
            });
        }
    }

    /// Runs a loop whose parts each wait (up to a deadline) until parts run on two threads at once, so
    /// the leader alone would time out; returns the names of the threads that ran parts. Call it inside
    /// a pool of `threads`, a size no other test uses, so that team is free.
    fn names_in_a_loop_needing_two_threads() -> HashSet<String> {
        let names = Mutex::new(HashSet::new());
        let running = AtomicUsize::new(0);
        let mut data = vec![0u32; 14];
        for_each_chunk_mut(&mut data, 1, 1, |i, c| {
            names.lock().unwrap().insert(thread::current().name().unwrap_or("").to_string());
            running.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(20);
            while running.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            c[0] = i as u32;
        });
        assert_eq!(running.load(Ordering::SeqCst), 14);
        assert_eq!(data, (0..14).collect::<Vec<_>>());
        names.into_inner().unwrap()
    }

    /// That the team for `threads` is free and its members take parts.
    fn assert_team_works(threads: usize) {
        let team = Team::for_threads(threads).expect("a team");
        assert!(!team.busy.load(Ordering::SeqCst), "the team for {threads} is still held");
        let names = names_in_a_loop_needing_two_threads();
        let member = format!("int4-team-{threads}-");
        assert!(names.iter().any(|n| n.starts_with(&member)), "no part ran on a member of {threads}: {names:?}");
    }

    #[test]
    fn the_team_takes_parts_on_threads_of_its_own() {
        pool(7).install(|| assert_team_works(7));
    }

    #[test]
    fn members_that_parked_come_back() {
        pool(4).install(|| {
            let team = Team::for_threads(4).expect("a team");
            for _ in 0..3 {
                // Idle members park (within a deadline: the machine may be busy), and come back for a loop.
                let deadline = Instant::now() + Duration::from_secs(20);
                while !team.members.iter().all(|m| m.parked.load(Ordering::SeqCst)) {
                    assert!(Instant::now() < deadline, "idle members did not park");
                    thread::sleep(Duration::from_millis(1));
                }
                assert_team_works(4);
            }
        });
    }

    #[test]
    fn an_error_is_returned_and_stops_the_chunks_not_started() {
        pool(5).install(|| {
            let ran = AtomicUsize::new(0);
            let mut data = vec![0u8; 4096];
            let r = try_for_each_chunk_mut(&mut data, 1, 1, |i, _| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i % 500 == 7 { Err(i) } else { Ok(()) }
            });
            let e = r.expect_err("chunks failed");
            assert_eq!(e % 500, 7, "the error is one that a chunk returned");
            assert!(ran.load(Ordering::Relaxed) < 4096, "chunks after the errors were skipped");
            assert_team_works(5);
        });
    }

    #[test]
    fn a_panic_is_resumed_on_the_caller_and_the_team_stays_usable() {
        pool(6).install(|| {
            for _ in 0..3 {
                let caught = catch_unwind(AssertUnwindSafe(|| {
                    let mut data = vec![0u8; 64];
                    for_each_chunk_mut(&mut data, 1, 1, |i, _| {
                        if i == 40 {
                            panic!("part 40 failed");
                        }
                    });
                }));
                let payload = caught.expect_err("the panic reached the caller");
                assert_eq!(payload.downcast_ref::<&str>(), Some(&"part 40 failed"));
            }
            assert_team_works(6);
        });
    }

    /// A panic payload whose destructor panics.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a payload's destructor");
        }
    }

    #[test]
    fn many_panics_with_payloads_that_panic_when_dropped_wait_for_every_part() {
        pool(8).install(|| {
            let slow_done = AtomicBool::new(false);
            let caught = catch_unwind(AssertUnwindSafe(|| {
                let mut data = vec![0u8; 16];
                for_each_chunk_mut(&mut data, 1, 1, |i, c| {
                    if i == 15 {
                        thread::sleep(Duration::from_millis(200));
                        c[0] = 1;
                        slow_done.store(true, Ordering::SeqCst);
                    } else {
                        std::panic::panic_any(Bomb);
                    }
                });
            }));
            assert!(slow_done.load(Ordering::SeqCst), "the loop ended before its slow part");
            let payload = caught.expect_err("the panic reached the caller");
            assert!(payload.is::<Bomb>());
            std::mem::forget(payload);
            assert_team_works(8);
        });
    }

    #[test]
    fn loops_inside_parts_and_beside_each_other_complete() {
        pool(9).install(|| {
            // Outer parts wait for a second thread, so some run on a member; a loop inside those runs
            // there, in order; one inside the leader's parts goes to rayon.
            let running = AtomicUsize::new(0);
            let mut outer = vec![(Vec::new(), String::new(), HashSet::new()); 12];
            for_each_chunk_mut(&mut outer, 1, 1, |i, c| {
                running.fetch_add(1, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(20);
                while running.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                let names = Mutex::new(HashSet::new());
                let mut inner = vec![0usize; 50];
                for_each_chunk_mut(&mut inner, 5, 1, |j, d| {
                    names.lock().unwrap().insert(thread::current().name().unwrap_or("").to_string());
                    d.fill(i * 100 + j)
                });
                c[0] = (inner, thread::current().name().unwrap_or("").to_string(), names.into_inner().unwrap());
            });
            let mut on_members = 0;
            for (i, (inner, outer_name, inner_names)) in outer.iter().enumerate() {
                assert_eq!(*inner, (0..50).map(|j| i * 100 + j / 5).collect::<Vec<_>>());
                if outer_name.starts_with("int4-team-9-") {
                    on_members += 1;
                    assert_eq!(inner_names, &HashSet::from([outer_name.clone()]), "a member's nested loop stays on it");
                }
            }
            assert!(on_members > 0, "no outer part ran on a member");
            // Two leaders at once: one gets the team, the other rayon; both complete.
            let (a, b) = rayon::join(
                || map_each(&(0..200).collect::<Vec<u64>>(), |&x| x * x),
                || map_each(&(0..200).collect::<Vec<u64>>(), |&x| x + 1),
            );
            assert_eq!(a, (0..200).map(|x| x * x).collect::<Vec<_>>());
            assert_eq!(b, (1..201).collect::<Vec<_>>());
        });
    }

    #[test]
    fn map_each_keeps_the_items_order() {
        for threads in [1, 2, 3] {
            pool(threads).install(|| {
                for n in [0, 1, 2, 5, 33] {
                    let items: Vec<String> = (0..n).map(|i| format!("item {i}")).collect();
                    assert_eq!(map_each(&items, |s| s.len()), items.iter().map(String::len).collect::<Vec<_>>());
                }
            });
        }
    }

    #[test]
    #[should_panic(expected = "chunks of no elements")]
    fn chunks_of_no_elements_are_refused() {
        for_each_chunk_mut(&mut [0u8; 4], 0, 1, |_, _| {});
    }
}
