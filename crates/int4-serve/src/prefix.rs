//! Prompt prefixes kept across requests, so a prompt that begins as an earlier one did — the same
//! system prompt, a chat's earlier turns, a document asked about again — is not read again.
//!
//! A new sequence starts from a copy of the longest run of **whole prompt chunks** (every
//! [`PREFILL_CHUNK`] positions from the start) that it shares with a kept cache or with a running
//! sequence. Only whole chunks, and only positions that were read as prompt: those are the positions a
//! fresh run computes in the same calls with the same kernels, so the copy holds the bits the new sequence
//! would compute itself and its output is the same bytes with or without the cache. A generated position,
//! or a prompt's last partial chunk, ran in calls of another length and is never shared. At least the
//! prompt's last position always runs (its logits start the generation).
//!
//! Kept caches are shrunk to their shareable positions, at most `capacity` of them, least recently used
//! dropped first; their bytes count against the server's KV budget and they are dropped when that lets a
//! waiting request in. With a capacity of 0 nothing is kept and nothing is shared.

use int4::{KvCache, Model};

/// The chunk a prompt is read in: every `PREFILL_CHUNK` positions from its start, the boundaries
/// [`int4::Engine::generate`] cuts at; the scheduler reads prompts in these chunks and only whole ones are
/// shared.
pub const PREFILL_CHUNK: usize = 256;

/// Where a new sequence's shared prefix comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A kept cache (its index).
    Kept(usize),
    /// A running sequence (its index among the running ones).
    Running(usize),
}

struct Entry {
    cache: KvCache,
    last_used: u64,
}

/// The kept caches.
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    capacity: usize,
    clock: u64,
}

/// The positions of `prompt` a cache holding `ids`, of which the first `shareable` may be shared, gives
/// it: the common prefix in whole chunks, short of the prompt's last position.
pub(crate) fn shared_positions(ids: &[u32], shareable: usize, prompt: &[u32]) -> usize {
    let limit = shareable.min(ids.len()).min(prompt.len().saturating_sub(1));
    let common = ids[..limit].iter().zip(prompt).take_while(|(a, b)| a == b).count();
    common / PREFILL_CHUNK * PREFILL_CHUNK
}

/// The positions of a sequence's cache that may be shared: its prompt positions read so far, in whole
/// chunks.
pub(crate) fn shareable(prompt_read: usize) -> usize {
    prompt_read / PREFILL_CHUNK * PREFILL_CHUNK
}

impl PrefixCache {
    /// At most `capacity` kept caches (0: none).
    pub(crate) fn new(capacity: usize) -> Self {
        PrefixCache { entries: Vec::new(), capacity, clock: 0 }
    }

    /// Bytes the kept caches hold.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.cache.bytes()).sum()
    }

    /// The best source for `prompt` among the kept caches and `running` (each running sequence's cache
    /// with its shareable positions), and the positions it gives; `None` when none gives a whole chunk.
    /// A kept cache is preferred at equal length (it is not changing under a step).
    pub(crate) fn best<'a>(
        &self,
        prompt: &[u32],
        running: impl Iterator<Item = (&'a KvCache, usize)>,
    ) -> Option<(Source, usize)> {
        let kept = self.entries.iter().enumerate().map(|(i, e)| (Source::Kept(i), &e.cache, e.cache.len()));
        let running = running.enumerate().map(|(i, (c, n))| (Source::Running(i), c, n));
        let mut best: Option<(Source, usize)> = None;
        for (source, cache, n) in kept.chain(running) {
            let positions = shared_positions(cache.ids(), n, prompt);
            if positions > 0 && best.is_none_or(|(_, b)| positions > b) {
                best = Some((source, positions));
            }
        }
        best
    }

    /// A kept cache, marked as used now.
    pub(crate) fn take_use(&mut self, i: usize) -> &KvCache {
        self.clock += 1;
        self.entries[i].last_used = self.clock;
        &self.entries[i].cache
    }

    /// Drops the least recently used kept cache; the bytes freed, or `None` when there is nothing to drop.
    pub(crate) fn evict_one(&mut self) -> Option<usize> {
        let i = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)?;
        Some(self.entries.remove(i).cache.bytes())
    }

    /// Keeps the shareable positions of a finished sequence's `cache` (its prompt read to `prompt_read`),
    /// within `room` bytes (dropping kept caches to make it): nothing when they are fewer than a chunk,
    /// already kept, or do not fit.
    pub(crate) fn keep(&mut self, mut cache: KvCache, prompt_read: usize, room: usize) {
        let n = shareable(prompt_read).min(cache.len());
        if self.capacity == 0 || n == 0 {
            return;
        }
        self.clock += 1;
        let ids = &cache.ids()[..n];
        // Already covered by a kept cache: mark it used.
        if let Some(e) = self.entries.iter_mut().find(|e| e.cache.len() >= n && &e.cache.ids()[..n] == ids) {
            e.last_used = self.clock;
            return;
        }
        // Its bytes once shrunk to `n` positions: nothing is dropped for a cache that cannot be kept.
        let bytes = cache.bytes() / cache.capacity() * n;
        if bytes > room {
            return;
        }
        // Kept caches this one covers go.
        self.entries.retain(|e| !(e.cache.len() <= n && e.cache.ids() == &ids[..e.cache.len()]));
        cache.truncate(n);
        cache.shrink_to_len();
        debug_assert_eq!(cache.bytes(), bytes);
        while self.entries.len() >= self.capacity || self.bytes() + bytes > room {
            if self.evict_one().is_none() {
                break;
            }
        }
        self.entries.push(Entry { cache, last_used: self.clock });
    }

    /// How many caches are kept.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A fresh cache of `positions` for `model` within `budget`, starting from `shared` positions of `from`.
pub(crate) fn started_from(
    model: &Model,
    positions: usize,
    budget: usize,
    from: Option<(&KvCache, usize)>,
) -> int4::Result<KvCache> {
    let mut cache = model.kv_cache(positions, budget)?;
    if let Some((source, shared)) = from {
        cache.copy_prefix_from(source, shared)?;
    }
    Ok(cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_prompt_chunks_short_of_the_last_position_are_shared() {
        let c = PREFILL_CHUNK;
        let ids: Vec<u32> = (0..3 * c as u32).collect();
        // The whole cache shareable: a prompt equal to it shares all but its last chunk (its last
        // position must run).
        assert_eq!(shared_positions(&ids, ids.len(), &ids), 2 * c);
        // A longer prompt shares all three.
        let mut longer = ids.clone();
        longer.push(7);
        assert_eq!(shared_positions(&ids, ids.len(), &longer), 3 * c);
        // Departing one position into the third chunk: two chunks.
        let mut other = ids.clone();
        other[2 * c + 1] = 999_999;
        assert_eq!(shared_positions(&ids, ids.len(), &other), 2 * c);
        // Departing before the first chunk ends: nothing.
        other[c - 1] = 999_999;
        assert_eq!(shared_positions(&ids, ids.len(), &other), 0);
        // Only what the cache may share: generated positions past its prompt's whole chunks are not.
        assert_eq!(shared_positions(&ids, shareable(c + 100), &longer), c);
        assert_eq!(shared_positions(&ids, shareable(c - 1), &longer), 0);
        assert_eq!(shared_positions(&[], 0, &longer), 0);
        assert_eq!(shared_positions(&ids, ids.len(), &[]), 0);
    }
}
