//! The answer cache of one server worker: encoded replies keyed by the request's shape (the
//! lower-cased question and the flags that change the reply), valid for one index generation.
//!
//! At saturation nearly every query is a cache hit, and a hit's cost is its memory accesses: a
//! `HashMap<Vec<u8>, Vec<u8>>` of ~80k answers touches four cache lines that are rarely in the
//! CPU cache (the control bytes, the bucket, the key's and the answer's heap blocks). Here a hit
//! touches two: an 8-byte slot (32-bit hash tag + arena offset; 2 MiB of slots at most, mostly
//! in L2) and one arena entry that holds the key and the answer side by side. The worker
//! computes the hashes of a whole receive batch first and touches the slots and entries of all
//! of them ([`AnswerCache::touch`]) before answering, so the misses of a batch overlap instead
//! of stalling one after another.
//!
//! Probing is linear and bounded ([`MAX_PROBE`]): keys that collide beyond it are not cached
//! (answered from the index every time), so crafted names cannot make lookups slow. The hash is
//! keyed with a per-cache random seed. The cache is bounded in entries and in bytes; when full,
//! it is emptied (as the map before it was), and it is emptied when the index generation changes.

/// Slots looked at before giving up (lookup: miss; insert: not cached).
pub const MAX_PROBE: usize = 32;
/// Default bounds: entries and arena bytes.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;
const ENTRY_HEADER: usize = 4;
const MIN_SLOTS: usize = 1024;

/// Encoded answers keyed by request shape (see the module docs).
pub struct AnswerCache {
    generation: u64,
    seed: u64,
    /// 0 = empty; else `tag << 32 | (offset + 1)` with `tag` the hash's high 32 bits.
    slots: Vec<u64>,
    /// Entries: key length (u16 LE), value length (u16 LE), key, value.
    arena: Vec<u8>,
    entries: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for AnswerCache {
    fn default() -> Self {
        AnswerCache::new(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a).wrapping_mul(u128::from(b));
    (p as u64) ^ ((p >> 64) as u64)
}

const K0: u64 = 0x243F_6A88_85A3_08D3;
const K1: u64 = 0x1319_8A2E_0370_7344;
const K2: u64 = 0xA409_3822_299F_31D0;

impl AnswerCache {
    /// A cache of at most `max_entries` answers and `max_bytes` of keys and answers (capped
    /// below 4 GiB: offsets are 32-bit).
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        AnswerCache {
            generation: 0,
            seed: rand::random::<u64>() | 1,
            slots: Vec::new(),
            arena: Vec::new(),
            entries: 0,
            max_entries: max_entries.max(1),
            max_bytes: max_bytes.min(u32::MAX as usize - 1),
        }
    }

    /// The same with a fixed hash seed (tests: deterministic probe sequences).
    #[cfg(test)]
    fn with_seed(max_entries: usize, max_bytes: usize, seed: u64) -> Self {
        AnswerCache {
            seed: seed | 1,
            ..AnswerCache::new(max_entries, max_bytes)
        }
    }

    /// Empties the cache if the index generation changed since the last call.
    pub fn sync_generation(&mut self, generation: u64) {
        if self.generation != generation {
            self.clear();
            self.generation = generation;
        }
    }

    /// Number of cached answers.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Bytes of keys and answers held.
    pub fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    pub fn clear(&mut self) {
        self.slots.fill(0);
        self.arena.clear();
        self.entries = 0;
    }

    /// The key's hash (seeded per cache).
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        let mut h = fold_mul(self.seed ^ K0, (key.len() as u64) ^ K1);
        let mut chunks = key.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = fold_mul(h ^ u64::from_le_bytes(w), K1);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            h = fold_mul(h ^ u64::from_le_bytes(w), K2);
        }
        fold_mul(h, K0 ^ self.seed)
    }

    /// Loads the memory a lookup of `hash` will read (its first slot and that slot's entry) and
    /// returns a value derived from it: the caller passes it to `std::hint::black_box`, so the
    /// loads are issued now. Done for a batch of queries before their lookups, the cache misses
    /// overlap.
    #[inline]
    pub fn touch(&self, hash: u64) -> u64 {
        if self.slots.is_empty() {
            return 0;
        }
        let slot = self.slots[hash as usize & (self.slots.len() - 1)];
        let off = (slot & 0xFFFF_FFFF) as usize;
        match off.checked_sub(1).and_then(|o| self.arena.get(o)) {
            Some(&b) => slot ^ u64::from(b),
            None => slot,
        }
    }

    fn entry(&self, off: usize) -> Option<(&[u8], &[u8])> {
        let h = self.arena.get(off..off + ENTRY_HEADER)?;
        let klen = usize::from(u16::from_le_bytes([h[0], h[1]]));
        let vlen = usize::from(u16::from_le_bytes([h[2], h[3]]));
        let kstart = off + ENTRY_HEADER;
        let key = self.arena.get(kstart..kstart + klen)?;
        let value = self.arena.get(kstart + klen..kstart + klen + vlen)?;
        Some((key, value))
    }

    /// The slot index holding `key`, or where it would go (an empty slot), or None if the probe
    /// limit was reached.
    fn find(&self, hash: u64, key: &[u8]) -> Option<(usize, bool)> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let tag = hash >> 32;
        let mut i = hash as usize & mask;
        for _ in 0..MAX_PROBE {
            let slot = self.slots[i];
            if slot == 0 {
                return Some((i, false));
            }
            if slot >> 32 == tag {
                let off = (slot & 0xFFFF_FFFF) as usize - 1;
                if self.entry(off).is_some_and(|(k, _)| k == key) {
                    return Some((i, true));
                }
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// The cached answer for `key` (`hash` = [`Self::hash`] of it).
    #[inline]
    pub fn get(&self, hash: u64, key: &[u8]) -> Option<&[u8]> {
        let (i, found) = self.find(hash, key)?;
        if !found {
            return None;
        }
        let off = (self.slots[i] & 0xFFFF_FFFF) as usize - 1;
        self.entry(off).map(|(_, v)| v)
    }

    /// Caches `value` for `key`. Returns false if it was not cached (too large, or its probe
    /// sequence full). A full cache is emptied first.
    pub fn insert(&mut self, hash: u64, key: &[u8], value: &[u8]) -> bool {
        let size = ENTRY_HEADER + key.len() + value.len();
        let (Ok(klen), Ok(vlen)) = (u16::try_from(key.len()), u16::try_from(value.len())) else {
            self.forget(hash, key);
            return false;
        };
        if size > self.max_bytes {
            self.forget(hash, key);
            return false;
        }
        if self.entries >= self.max_entries || self.arena.len() + size > self.max_bytes {
            self.clear();
        }
        if (self.entries + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let Some((i, _)) = self.find(hash, key) else {
            return false;
        };
        let off = self.arena.len();
        self.arena.extend_from_slice(&klen.to_le_bytes());
        self.arena.extend_from_slice(&vlen.to_le_bytes());
        self.arena.extend_from_slice(key);
        self.arena.extend_from_slice(value);
        // A replaced entry (same key) stays in the arena until the next clear.
        if self.slots[i] == 0 {
            self.entries += 1;
        }
        self.slots[i] = ((hash >> 32) << 32) | (off as u64 + 1);
        true
    }

    /// Makes sure `key` is not answered from the cache any more (an answer that could not be
    /// stored must not leave an older one in place). Rare: empties the cache if it is there.
    fn forget(&mut self, hash: u64, key: &[u8]) {
        if self.get(hash, key).is_some() {
            self.clear();
        }
    }

    /// Doubles the slots (at least [`MIN_SLOTS`]) and re-places every entry.
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![0; n]);
        let mask = n - 1;
        let mut kept = 0;
        for slot in old.into_iter().filter(|&s| s != 0) {
            let off = (slot & 0xFFFF_FFFF) as usize - 1;
            let Some((key, _)) = self.entry(off) else {
                continue;
            };
            let hash = self.hash(key);
            let mut i = hash as usize & mask;
            for _ in 0..MAX_PROBE {
                if self.slots[i] == 0 {
                    self.slots[i] = slot;
                    kept += 1;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        self.entries = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn put(c: &mut AnswerCache, k: &[u8], v: &[u8]) -> bool {
        let h = c.hash(k);
        c.insert(h, k, v)
    }
    fn get<'a>(c: &'a AnswerCache, k: &[u8]) -> Option<&'a [u8]> {
        c.get(c.hash(k), k)
    }

    #[test]
    fn stores_and_finds_answers() {
        let mut c = AnswerCache::default();
        assert_eq!(get(&c, b"a"), None);
        assert!(put(&mut c, b"a", b"answer-a"));
        assert!(put(&mut c, b"bb", b""));
        assert_eq!(get(&c, b"a"), Some(&b"answer-a"[..]));
        assert_eq!(get(&c, b"bb"), Some(&b""[..]));
        assert_eq!(get(&c, b"A"), None);
        assert_eq!(c.len(), 2);
        // Replacing keeps one entry.
        assert!(put(&mut c, b"a", b"new"));
        assert_eq!(get(&c, b"a"), Some(&b"new"[..]));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn generation_change_empties_it() {
        let mut c = AnswerCache::default();
        c.sync_generation(1);
        put(&mut c, b"k", b"v");
        c.sync_generation(1);
        assert_eq!(get(&c, b"k"), Some(&b"v"[..]));
        c.sync_generation(2);
        assert_eq!(get(&c, b"k"), None);
        assert!(c.is_empty());
        assert_eq!(c.arena_bytes(), 0);
    }

    #[test]
    fn bounded_in_entries_and_bytes() {
        let mut c = AnswerCache::new(3, 1 << 20);
        for k in [b"1", b"2", b"3"] {
            assert!(put(&mut c, k, b"v"));
        }
        assert_eq!(c.len(), 3);
        // The fourth empties the cache first.
        assert!(put(&mut c, b"4", b"v"));
        assert_eq!(c.len(), 1);
        assert_eq!(get(&c, b"1"), None);
        assert_eq!(get(&c, b"4"), Some(&b"v"[..]));

        let mut c = AnswerCache::new(100, 64);
        assert!(
            !put(&mut c, b"big", &[0; 61]),
            "larger than the whole cache"
        );
        assert!(put(&mut c, b"k1", &[1; 30]));
        assert!(put(&mut c, b"k2", &[2; 30]), "empties, then fits");
        assert_eq!(get(&c, b"k1"), None);
        assert_eq!(get(&c, b"k2"), Some(&[2; 30][..]));
        assert!(c.arena_bytes() <= 64);
        // Values beyond a u16 length are not cached.
        let mut c = AnswerCache::default();
        assert!(put(&mut c, b"k", b"old"));
        assert!(!put(&mut c, b"k", &vec![0; 70_000]));
        assert_eq!(get(&c, b"k"), None, "no stale answer left");
    }

    #[test]
    fn colliding_keys_beyond_the_probe_limit_are_not_cached() {
        let mut c = AnswerCache::default();
        // Same hash for every key: only MAX_PROBE of them fit in the probe sequence.
        let h = 42u64;
        let keys: Vec<Vec<u8>> = (0..(2 * MAX_PROBE as u8)).map(|i| vec![i]).collect();
        let stored = keys.iter().filter(|k| c.insert(h, k, k)).count();
        assert_eq!(stored, MAX_PROBE);
        for (i, k) in keys.iter().enumerate() {
            let want = (i < MAX_PROBE).then_some(k.as_slice());
            assert_eq!(c.get(h, k), want);
        }
    }

    #[test]
    fn hash_depends_on_every_byte_and_length() {
        let c = AnswerCache::default();
        let base =
            b"\x03svc\x02ns\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01\x05\x02\x00".to_vec();
        let h = c.hash(&base);
        for i in 0..base.len() {
            let mut k = base.clone();
            k[i] ^= 0x20;
            assert_ne!(c.hash(&k), h, "byte {i}");
        }
        assert_ne!(c.hash(&base[..base.len() - 1]), h);
        let mut longer = base.clone();
        longer.push(0);
        assert_ne!(c.hash(&longer), h);
        // touch never fails, whatever the state.
        let _ = c.touch(h);
        let mut c2 = AnswerCache::default();
        put(&mut c2, &base, b"x");
        let _ = c2.touch(c2.hash(&base));
    }

    #[test]
    fn many_keys_stay_findable() {
        let keys: Vec<Vec<u8>> = (0..20_000u32)
            .map(|i| format!("\x05svc-{i}\x05ns-{}\x03svc", i % 100).into_bytes())
            .collect();
        // Fixed seeds: the probe sequences (and so this test) are the same on every run.
        for seed in [1u64, 0x9E37_79B9_7F4A_7C15, 0xDEAD_BEEF, 12_345_678_901] {
            let mut c = AnswerCache::with_seed(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES, seed);
            let stored: Vec<&Vec<u8>> = keys.iter().filter(|k| put(&mut c, k, k)).collect();
            // Linear probing at load <= 1/2 almost never needs more than MAX_PROBE slots: a key
            // that would is simply not cached. At most one in a thousand here.
            assert!(
                stored.len() >= keys.len() - keys.len() / 1000,
                "seed {seed:#x}: {} of {} cached",
                stored.len(),
                keys.len()
            );
            for k in &stored {
                assert_eq!(get(&c, k), Some(k.as_slice()), "seed {seed:#x}");
            }
        }
    }

    proptest! {
        /// Against a HashMap of the last value stored per key: a lookup returns that value or
        /// nothing (the cache is bounded and may drop entries), never another key's answer or an
        /// older one; a lookup right after a successful insert finds it.
        #[test]
        fn behaves_as_a_bounded_map(ops in proptest::collection::vec(
            (proptest::collection::vec(0u8..6, 0..12), proptest::collection::vec(any::<u8>(), 0..40), any::<bool>()),
            1..400,
        )) {
            let mut c = AnswerCache::new(50, 2_000);
            let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for (k, v, is_insert) in ops {
                if is_insert {
                    model.insert(k.clone(), v.clone());
                    if put(&mut c, &k, &v) {
                        prop_assert_eq!(get(&c, &k), Some(v.as_slice()));
                    } else {
                        prop_assert_eq!(get(&c, &k), None);
                    }
                    prop_assert!(c.len() <= 50);
                    prop_assert!(c.arena_bytes() <= 2_000);
                }
                if let Some(got) = get(&c, &k) {
                    prop_assert_eq!(Some(&got.to_vec()), model.get(&k));
                }
            }
        }
    }
}
