//! What the size of a map entry costs a decision on many keys: 100k entries in 32 sharded
//! hashbrown tables (as `MemoryStore` keeps them), each lookup under its shard's
//! `parking_lot::Mutex` (as a decision is) or without one, cycling through the keys in
//! order (as `benches/inproc.rs`'s 100k-key rows do), for entries of 64 bytes, of 96
//! (`MemoryStore`'s: a 32-byte key and a 64-byte entry), of 104 (the expiry in a field of
//! its own) and of 120 (the penalty inline too); those of 64 and 96 bytes also aligned to 32
//! bytes, as `MemoryStore`'s are, so that none spans three cache lines, and 64 bytes aligned
//! to 64 (one line each). Each lookup reads the key and writes three words of the entry, as
//! an admission does. Nothing of tollgate is measured: this isolates the memory.
//!
//! `cargo bench -p tollgate-bench --bench map_entry` (about 30 s). A lookup this short leaves
//! the next ones room in the core's reorder window, lock or not (AMD Zen 5: locked and
//! unlocked columns alike), so their misses overlap; a decision of ~500 instructions leaves
//! none. The last column chains each lookup's key to the one before's result, so that each
//! miss costs its full latency, as in a decision.

use std::hash::BuildHasher;
use std::hint::black_box;
use std::time::Instant;

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::Mutex;

const KEYS: usize = 100_000;
const SHARDS: usize = 32;
const ROUNDS: usize = 10_000_000;

/// A map entry of `N` words after its 32-byte key.
struct Entry<const N: usize> {
    key: [u8; 32],
    words: [u64; N],
}

/// The same entry aligned to 32 bytes: a 96-byte entry then starts at 0 or 32 within a cache
/// line and spans two lines, where at 16-byte alignment (what hashbrown gives an 8-aligned
/// entry) half of them start at 16 or 48 and span three.
#[repr(align(32))]
struct Aligned<const N: usize>(Entry<N>);

/// A bucket of a table, seen as its entry.
trait Bucket<const N: usize> {
    fn new(entry: Entry<N>) -> Self;
    fn entry(&self) -> &Entry<N>;
    fn entry_mut(&mut self) -> &mut Entry<N>;
}

impl<const N: usize> Bucket<N> for Entry<N> {
    fn new(entry: Entry<N>) -> Self {
        entry
    }
    fn entry(&self) -> &Entry<N> {
        self
    }
    fn entry_mut(&mut self) -> &mut Entry<N> {
        self
    }
}

impl<const N: usize> Bucket<N> for Aligned<N> {
    fn new(entry: Entry<N>) -> Self {
        Self(entry)
    }
    fn entry(&self) -> &Entry<N> {
        &self.0
    }
    fn entry_mut(&mut self) -> &mut Entry<N> {
        &mut self.0
    }
}

/// The same entry on a cache line of its own.
#[repr(align(64))]
struct Line<const N: usize>(Entry<N>);

impl<const N: usize> Bucket<N> for Line<N> {
    fn new(entry: Entry<N>) -> Self {
        Self(entry)
    }
    fn entry(&self) -> &Entry<N> {
        &self.0
    }
    fn entry_mut(&mut self) -> &mut Entry<N> {
        &mut self.0
    }
}

fn key(i: usize) -> [u8; 32] {
    let mut key = [0u8; 32];
    let text = format!("api client-{i:06}");
    key[..text.len()].copy_from_slice(text.as_bytes());
    key
}

/// Best of three runs: ns per lookup-and-write, under each shard's lock or without one;
/// `chained`: under the lock, each lookup's key known only from the last one's result.
fn measure<const N: usize, B: Bucket<N>>(locked: bool, chained: bool) -> f64 {
    let hasher = DefaultHashBuilder::default();
    let mut shards: Vec<HashTable<B>> = (0..SHARDS).map(|_| HashTable::new()).collect();
    let keys: Vec<[u8; 32]> = (0..KEYS).map(key).collect();
    let shard_of = |hash: u64| (hash >> 48) as usize % SHARDS;
    for key in &keys {
        let hash = hasher.hash_one(key);
        let entry = B::new(Entry {
            key: *key,
            words: [1; N],
        });
        shards[shard_of(hash)].insert_unique(hash, entry, |e| hasher.hash_one(e.entry().key));
    }
    let touch = |table: &mut HashTable<B>, hash: u64, key: &[u8; 32]| {
        let e = table.find_mut(hash, |e| &e.entry().key == key)?.entry_mut();
        e.words[0] += 1;
        e.words[N / 2] = e.words[0];
        e.words[N - 1] = black_box(e.words[0]);
        Some(e.words[0])
    };
    // Zero, but not to the compiler: `after & zero` makes the next key wait for `after`.
    let zero = black_box(0);
    let locked_shards: Vec<Mutex<HashTable<B>>> = if locked {
        shards.drain(..).map(Mutex::new).collect()
    } else {
        Vec::new()
    };
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let mut after = 0;
        for i in 0..ROUNDS {
            let key = &keys[(i + if chained { after & zero } else { 0 }) % KEYS];
            let hash = hasher.hash_one(key);
            let touched = if locked {
                touch(&mut locked_shards[shard_of(hash)].lock(), hash, key)
            } else {
                touch(&mut shards[shard_of(hash)], hash, key)
            };
            after = touched.unwrap_or(0) as usize;
        }
        best = best.min(start.elapsed().as_nanos() as f64 / ROUNDS as f64);
    }
    best
}

/// Under the lock, without it, and under it one lookup after another.
fn row<const N: usize, B: Bucket<N>>() -> [f64; 3] {
    [
        measure::<N, B>(true, false),
        measure::<N, B>(false, false),
        measure::<N, B>(true, true),
    ]
}

fn main() {
    println!(
        "| entry bytes | under the shard's lock, ns | without a lock, ns | one after another, ns |"
    );
    println!("|---|---:|---:|---:|");
    for _ in 0..2 {
        for (bytes, [locked, unlocked, chained]) in [
            ("64", row::<4, Entry<4>>()),
            ("64, aligned to 32", row::<4, Aligned<4>>()),
            ("64, aligned to 64", row::<4, Line<4>>()),
            ("96", row::<8, Entry<8>>()),
            ("96, aligned to 32", row::<8, Aligned<8>>()),
            ("104", row::<9, Entry<9>>()),
            ("120", row::<11, Entry<11>>()),
        ] {
            println!("| {bytes} | {locked:.1} | {unlocked:.1} | {chained:.1} |");
        }
    }
}
