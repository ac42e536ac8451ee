//! A rule's decisions per second over the last minutes: one slot per second in a ring,
//! without a lock.
//!
//! Each counter of a slot is one atomic word holding the second it counts (its low 24 bits)
//! and the count (40 bits). Counting in the second the slot holds is one `fetch_add`; the
//! first count of a new second replaces the word with a compare-and-swap, so a slot is
//! never read as the sum of two seconds and no count is lost when a second turns.

use std::sync::atomic::{AtomicU64, Ordering};

/// How many seconds a ring keeps.
pub(crate) const SECONDS: usize = 300;

/// What a ring counts per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Admitted = 0,
    Delayed = 1,
    Denied = 2,
}

const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const STAMP_MASK: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// Admitted, delayed and denied per second for the last [`SECONDS`] seconds.
pub(crate) struct DecisionRing {
    slots: Box<[[AtomicU64; 3]]>,
}

impl Default for DecisionRing {
    fn default() -> Self {
        Self {
            slots: (0..SECONDS).map(|_| Default::default()).collect(),
        }
    }
}

fn stamp(second: u64) -> u64 {
    second & STAMP_MASK
}

impl DecisionRing {
    /// Counts one decision in `second` (seconds on the ring's clock).
    pub(crate) fn count(&self, what: Counted, second: u64) {
        let slot = &self.slots[(second % SECONDS as u64) as usize][what as usize];
        let stamp = stamp(second);
        let mut word = slot.load(Ordering::Relaxed);
        loop {
            if word >> COUNT_BITS == stamp {
                slot.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let fresh = (stamp << COUNT_BITS) | 1;
            match slot.compare_exchange_weak(word, fresh, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// Per second from `now - SECONDS + 1` to `now`, oldest first: admitted, delayed,
    /// denied.
    pub(crate) fn read(&self, now: u64) -> Vec<[u64; 3]> {
        let first = (now + 1).saturating_sub(SECONDS as u64);
        (first..=now)
            .map(|second| {
                let slot = &self.slots[(second % SECONDS as u64) as usize];
                let stamp = stamp(second);
                slot.each_ref().map(|counter| {
                    let word = counter.load(Ordering::Relaxed);
                    if word >> COUNT_BITS == stamp {
                        word & COUNT_MASK
                    } else {
                        0
                    }
                })
            })
            .collect()
    }
}

impl std::fmt::Debug for DecisionRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionRing").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each second counts its own decisions; a second a full turn later replaces the old
    /// one's counts, and seconds outside the window read as zero.
    #[test]
    fn seconds_count_apart_and_age_out() {
        let ring = DecisionRing::default();
        let start = 1_000;
        ring.count(Counted::Admitted, start);
        ring.count(Counted::Admitted, start);
        ring.count(Counted::Denied, start + 1);
        ring.count(Counted::Delayed, start + 2);
        let read = ring.read(start + 2);
        assert_eq!(read.len(), SECONDS);
        assert_eq!(read[SECONDS - 3..], [[2, 0, 0], [0, 0, 1], [0, 1, 0]]);

        let later = start + SECONDS as u64;
        ring.count(Counted::Denied, later);
        let read = ring.read(later);
        assert_eq!(read[SECONDS - 1], [0, 0, 1]);
        assert_eq!(read[..2], [[0, 0, 1], [0, 1, 0]]);
        assert_eq!(read.iter().flatten().sum::<u64>(), 3);
    }

    /// Threads counting at once lose nothing.
    #[test]
    fn concurrent_counts_add_up() {
        let ring = DecisionRing::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..10_000u64 {
                        ring.count(Counted::Admitted, 50 + i / 2_500);
                    }
                });
            }
        });
        let total: u64 = ring.read(60).iter().map(|s| s[0]).sum();
        assert_eq!(total, 40_000);
    }
}
