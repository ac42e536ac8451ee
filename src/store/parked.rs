//! Units parked in leases: a key's ledger of live leases, which keeps its bucket from
//! refilling what they may still use ([`Store::lease`](crate::store::Store::lease) says why).
//! A lease that ends gives its unused units back (exact: the bucket held them out); one that
//! expires counts them as used, as its holder may have used each until its last instant.
//! The stores apply the cap when they evaluate a key ([`Parked::settle`]), persisting it
//! when they write it. The Lua twin is `lua/parked.lua`.

use smallvec::SmallVec;

use crate::algorithm::{Algorithm, State};

/// The live leases of one key, in order of expiry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Parked {
    leases: SmallVec<[Lease; 2]>,
    /// Until when the key is kept: a bucket held down to nothing by the last lease to
    /// expire refilled, since only a later settling counts its units as used.
    kept_until: u64,
}

/// One live lease: its id (unique among the key's leases), its units, its expiry (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    id: u64,
    units: u64,
    expiry: u64,
}

impl Parked {
    pub(crate) fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The units parked in the leases held.
    fn units(&self) -> u64 {
        self.leases.iter().map(|l| l.units).sum()
    }

    /// Until when the key must be kept (0 with no lease).
    pub(crate) fn until(&self) -> u64 {
        self.kept_until * u64::from(!self.is_empty())
    }

    /// Parks `units` under `id` until `expiry`; the key is kept until `kept`.
    pub(crate) fn park(&mut self, id: u64, units: u64, expiry: u64, kept: u64) {
        let at = self.leases.partition_point(|l| l.expiry <= expiry);
        self.leases.insert(at, Lease { id, units, expiry });
        self.kept_until = self.kept_until.max(kept);
    }

    /// Drops the leases that ended by `now` (a reset's fresh bucket owes them nothing).
    pub(crate) fn drop_ended(&mut self, now: u64) {
        self.leases.retain(|l| l.expiry > now);
    }

    /// Ends lease `id`: its units, if it is still held.
    pub(crate) fn end(&mut self, id: u64) -> Option<u64> {
        let at = self.leases.iter().position(|l| l.id == id)?;
        Some(self.leases.remove(at).units)
    }

    /// Brings `state` to `now` under the cap: each lease that expired since held the bucket
    /// down until its expiry (with the others then live), and is dropped; the live ones
    /// hold it down now.
    pub(crate) fn settle(&mut self, algorithm: &Algorithm, state: &mut State, now: u64) {
        while let Some(first) = self.leases.first().filter(|l| l.expiry <= now) {
            let expiry = first.expiry;
            algorithm.cap(state, expiry, self.units());
            self.leases.remove(0);
        }
        algorithm.cap(state, now, self.units());
    }
}

/// An id no other lease of this process has.
pub(crate) fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Rate, Rule};

    fn remaining(rule: &Rule, state: &State, now: u64) -> u64 {
        rule.algorithm().evaluate(state, now, 0).remaining
    }

    /// A bucket under a live lease refills only to its burst less the lease; once the lease
    /// expires it refills on from where it stood then, never above what one process allows.
    #[test]
    fn a_lease_holds_the_refill_down_until_it_expires() {
        for rule in [
            Rule::gcra("g", 10, Rate::new(1, Duration::from_millis(100))),
            Rule::token_bucket("t", 10, Rate::new(1, Duration::from_millis(100))),
        ] {
            let algorithm = rule.algorithm();
            let mut state = State::default();
            // 4 leased at 0 (the bucket at 6), the other 6 used at once.
            algorithm.apply(&mut state, 0, 10);
            let mut parked = Parked::default();
            parked.park(1, 4, 1_000_000, 2_000_000);
            parked.settle(algorithm, &mut state, 900_000);
            assert_eq!(remaining(&rule, &state, 900_000), 6, "{rule:?}");
            parked.settle(algorithm, &mut state, 1_200_000);
            assert_eq!(remaining(&rule, &state, 1_200_000), 8, "{rule:?}");
            assert!(parked.is_empty());
        }
    }

    /// An ended lease's unused units go back at once, the rest stay counted.
    #[test]
    fn an_ended_lease_gives_its_unused_units_back() {
        let rule = Rule::gcra("g", 10, Rate::new(1, Duration::from_secs(1)));
        let algorithm = rule.algorithm();
        let mut state = State::default();
        algorithm.apply(&mut state, 0, 4);
        let mut parked = Parked::default();
        parked.park(7, 4, 500_000, 10_500_000);
        parked.settle(algorithm, &mut state, 100_000);
        assert_eq!(parked.end(7), Some(4));
        algorithm.give_back(&mut state, 100_000, 3);
        assert_eq!(remaining(&rule, &state, 100_000), 9);
        assert_eq!(parked.end(7), None);
    }
}
