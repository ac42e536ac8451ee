//! The keys a rule denies most: a Space-Saving summary (Metwally, Agrawal and El Abbadi,
//! 2005) of `capacity` counters, kept in the Stream-Summary shape so that a denial costs
//! O(1) whatever the capacity.
//!
//! The counters are an array sorted by count, highest first, with the start of each run of
//! equal counts kept in a map: counting a key moves it to the start of its run (one swap)
//! and raises it by one, which keeps the order. A key not counted yet takes a free counter,
//! or, when none is free, the last one (the lowest count), whose count it inherits as its
//! possible error.
//!
//! The bound, for `n` denials counted with `capacity` counters: a listed key's count is at
//! least its true count and at most `error` more; `error` is at most `n / capacity`; and
//! every key denied more than `n / capacity` times is listed.

use std::collections::HashMap;

/// One monitored key: its count and how much of it may belong to keys it replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counter {
    pub(crate) key: Box<[u8]>,
    pub(crate) count: u64,
    pub(crate) error: u64,
}

/// A Space-Saving summary of the keys of a stream of denials.
#[derive(Debug, Clone)]
pub(crate) struct SpaceSaving {
    capacity: usize,
    /// Highest count first.
    counters: Vec<Counter>,
    /// Where each monitored key's counter is.
    index: HashMap<Box<[u8]>, usize>,
    /// Per count held by some counter, the position of the first counter with it.
    runs: HashMap<u64, usize>,
    /// Denials counted.
    total: u64,
}

impl SpaceSaving {
    /// A summary of at most `capacity` keys (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            counters: Vec::new(),
            index: HashMap::new(),
            runs: HashMap::new(),
            total: 0,
        }
    }

    /// Counts one denial of `key`.
    pub(crate) fn count(&mut self, key: &[u8]) {
        self.total += 1;
        if let Some(&at) = self.index.get(key) {
            self.raise(at);
            return;
        }
        let at = if self.counters.len() < self.capacity {
            self.counters.push(Counter {
                key: key.into(),
                count: 0,
                error: 0,
            });
            let at = self.counters.len() - 1;
            self.runs.entry(0).or_insert(at);
            at
        } else {
            // The lowest counter is the last: the new key takes it over, and what it had
            // counted becomes the new key's possible error.
            let at = self.counters.len() - 1;
            let counter = &mut self.counters[at];
            self.index.remove(&counter.key);
            counter.key = key.into();
            counter.error = counter.count;
            at
        };
        self.index.insert(key.into(), at);
        self.raise(at);
    }

    /// Raises the counter at `at` by one, keeping the order: it changes places with the
    /// first counter of its run, which then belongs to the run above.
    fn raise(&mut self, at: usize) {
        let count = self.counters[at].count;
        let Some(&first) = self.runs.get(&count) else {
            return;
        };
        if first != at {
            self.counters.swap(first, at);
            for position in [first, at] {
                let key = &self.counters[position].key;
                if let Some(slot) = self.index.get_mut(key) {
                    *slot = position;
                }
            }
        }
        let rest_of_run = self
            .counters
            .get(first + 1)
            .is_some_and(|c| c.count == count);
        if rest_of_run {
            self.runs.insert(count, first + 1);
        } else {
            self.runs.remove(&count);
        }
        self.runs.entry(count + 1).or_insert(first);
        self.counters[first].count = count + 1;
    }

    /// Forgets `key` (an unblocked key starts afresh). Linear in the capacity: an
    /// operator's action, not a request's.
    pub(crate) fn forget(&mut self, key: &[u8]) {
        let Some(at) = self.index.remove(key) else {
            return;
        };
        self.counters.remove(at);
        self.reindex();
    }

    fn reindex(&mut self) {
        self.index.clear();
        self.runs.clear();
        for (position, counter) in self.counters.iter().enumerate() {
            self.index.insert(counter.key.clone(), position);
            self.runs.entry(counter.count).or_insert(position);
        }
    }

    /// The counters, highest count first.
    pub(crate) fn counters(&self) -> &[Counter] {
        &self.counters
    }

    /// Denials counted.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The count a key not listed may have at most: the lowest count when every counter
    /// is taken, otherwise none (every key counted so far is listed).
    pub(crate) fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            0
        } else {
            self.counters.last().map_or(0, |c| c.count)
        }
    }

    /// How many counters the summary has.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts are exact while every key has a counter, and listed highest first.
    #[test]
    fn counts_are_exact_while_keys_fit() {
        let mut summary = SpaceSaving::new(4);
        for key in ["a", "b", "a", "c", "a", "b"] {
            summary.count(key.as_bytes());
        }
        let listed: Vec<_> = summary
            .counters()
            .iter()
            .map(|c| (&*c.key, c.count, c.error))
            .collect();
        assert_eq!(
            listed,
            [(&b"a"[..], 3, 0), (&b"b"[..], 2, 0), (&b"c"[..], 1, 0)]
        );
        assert_eq!(summary.floor(), 0);
    }

    /// On a skewed stream with more keys than counters, every key denied more than
    /// `total / capacity` times is listed, and each listed count is within its error of
    /// the true count, the error never above `total / capacity`.
    #[test]
    fn the_bound_holds_on_a_skewed_stream() {
        let capacity = 16;
        let mut summary = SpaceSaving::new(capacity);
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        // A few heavy keys in a stream of many light ones, interleaved by a fixed pattern.
        let mut x: u64 = 7;
        for i in 0..20_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = if i % 3 == 0 {
                format!("heavy-{}", (x >> 33) % 5)
            } else {
                format!("light-{}", (x >> 33) % 5_000)
            };
            summary.count(key.as_bytes());
            *truth.entry(key.into_bytes()).or_default() += 1;
        }
        let bound = summary.total() / capacity as u64;
        for counter in summary.counters() {
            let real = truth[&*counter.key];
            assert!(counter.count >= real, "{counter:?} < {real}");
            assert!(
                counter.count - counter.error <= real,
                "{counter:?} vs {real}"
            );
            assert!(counter.error <= bound, "{counter:?} over {bound}");
        }
        for (key, &real) in &truth {
            if real > bound {
                let listed = summary.counters().iter().any(|c| *c.key == **key);
                assert!(
                    listed,
                    "{} ({real}) not listed",
                    String::from_utf8_lossy(key)
                );
            }
        }
        let heavy = summary.counters()[..5].iter();
        assert!(heavy.clone().all(|c| c.key.starts_with(b"heavy-")));
        assert!(summary
            .counters()
            .windows(2)
            .all(|w| w[0].count >= w[1].count));
    }

    /// A forgotten key is no longer listed, and the order of the others holds.
    #[test]
    fn a_forgotten_key_is_gone() {
        let mut summary = SpaceSaving::new(3);
        for key in ["a", "a", "a", "b", "b", "c", "d"] {
            summary.count(key.as_bytes());
        }
        summary.forget(b"a");
        assert!(summary.counters().iter().all(|c| &*c.key != b"a"));
        summary.count(b"d");
        summary.count(b"d");
        assert_eq!(&*summary.counters()[0].key, b"d");
        assert!(summary
            .counters()
            .windows(2)
            .all(|w| w[0].count >= w[1].count));
    }
}
