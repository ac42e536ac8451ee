//! The penalty of a limit charged by outcome: its denials count once the requests beside
//! them have settled (promises: [`Charge`](crate::layer::Charge)).
//!
//! A request refused while others of its limit and key are in flight may be refused only
//! for units they will give back (a burst of successful logins). The store decides it
//! without counting its denial ([`Refusal::Deferred`](crate::Refusal::Deferred)); the
//! refusal waits here until the requests checked or in flight when it was refused have
//! settled, or [`SETTLE_DEADLINE`], then [`recount`] asks [`Store::count_denials`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::limiter::Limiter;
use crate::penalty::REFUSALS_KEPT_MICROS;
use crate::rule::Rule;
use crate::store::reservation::run_detached;
use crate::store::{Check, Store};
use crate::stored::KeyBytes;

/// A denial's count, run once the requests it waits for have settled.
pub(crate) type Recount = Box<dyn FnOnce() + Send>;

/// The longest a refusal waits for the requests beside it before its denial is counted.
/// Long enough for a login to answer, short next to any penalty's window.
pub(crate) const SETTLE_DEADLINE: Duration = Duration::from_secs(2);

// The store keeps the state a refusal was made on past the deadline, with a second for
// the count's own call.
const _: () = assert!(SETTLE_DEADLINE.as_micros() + 1_000_000 <= REFUSALS_KEPT_MICROS as u128);

/// A limit's rule name and a key.
type Slot = (Arc<str>, Box<[u8]>);

/// The requests of the limits charged by outcome with a penalty, per rule name and key,
/// that have not settled, and the denials waiting for them. One per layer (in its state, so
/// a reload keeps the requests in flight).
#[derive(Default)]
pub(crate) struct Unsettled {
    slots: Mutex<HashMap<Slot, Requests>>,
}

/// The requests of one rule and key.
#[derive(Default)]
struct Requests {
    /// The number the next request gets.
    next: u64,
    /// The numbers of the requests being checked or in flight.
    active: SmallVec<[u64; 4]>,
    /// The denials waiting to be counted: each with the number the next request had when
    /// it was refused (it waits for every request numbered below), and its refused
    /// request's own number, which names it for its deadline.
    waiting: Vec<Waiting>,
}

/// A refusal waiting to be counted.
struct Waiting {
    before: u64,
    number: u64,
    recount: Recount,
}

impl std::fmt::Debug for Unsettled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unsettled({} keys)", self.slots.lock().len())
    }
}

/// A request of a limit charged by outcome with a penalty, from before the store decides it
/// until it has settled: dropped then (its batch's units counted, or given back in the
/// store), or [deferred](Self::defer) when it is refused.
#[derive(Debug)]
pub(crate) struct Ticket {
    registry: Arc<Unsettled>,
    /// `None` once settled.
    slot: Option<Slot>,
    number: u64,
}

impl Unsettled {
    /// The ticket of a request of `rule` for `key`, taken before the store decides it, and
    /// whether it is alone (nothing else checked, in flight or waiting for the rule and key).
    /// The key is kept in its stored form: a 1 MB key costs 33 bytes here too.
    pub(crate) fn start(self: &Arc<Self>, rule: &Rule, key: &[u8]) -> (Ticket, bool) {
        let slot: Slot = (rule.shared_name(), KeyBytes::of(key).as_bytes().into());
        let mut slots = self.slots.lock();
        let requests = slots.entry(slot.clone()).or_default();
        let alone = requests.active.is_empty() && requests.waiting.is_empty();
        let number = requests.next;
        requests.next += 1;
        requests.active.push(number);
        let ticket = Ticket {
            registry: Arc::clone(self),
            slot: Some(slot),
            number,
        };
        (ticket, alone)
    }

    /// The request `number` of `slot` has settled, refused if `refused` holds its recount
    /// (kept if fewer than the most that may wait): runs the recounts whose requests have
    /// all settled now. Says whether the refusal waits.
    fn settle(&self, slot: &Slot, number: u64, refused: Option<(Recount, usize)>) -> bool {
        let settled = self.in_slot(slot, |requests| {
            requests.active.retain(|n| *n != number);
            if let Some((recount, most)) = refused {
                if requests.waiting.len() < most {
                    let before = requests.next;
                    requests.waiting.push(Waiting {
                        before,
                        number,
                        recount,
                    });
                }
            }
            let oldest = requests.active.iter().copied().min().unwrap_or(u64::MAX);
            let (due, waiting) = std::mem::take(&mut requests.waiting)
                .into_iter()
                .partition::<Vec<_>, _>(|w| w.before <= oldest);
            requests.waiting = waiting;
            (due, requests.waiting.iter().any(|w| w.number == number))
        });
        let Some((due, waits)) = settled else {
            return false;
        };
        for waiting in due {
            (waiting.recount)();
        }
        waits
    }

    /// The deadline of the refusal of request `number` of `slot`: counted now if it still
    /// waits, whatever the requests before it do.
    fn overdue(&self, slot: &Slot, number: u64) {
        let due = self.in_slot(slot, |requests| {
            let at = requests.waiting.iter().position(|w| w.number == number)?;
            Some(requests.waiting.swap_remove(at))
        });
        if let Some(due) = due.flatten() {
            (due.recount)();
        }
    }

    /// `change` of the requests of `slot`, under the lock; the slot is forgotten once
    /// nothing is left in it. The caller runs the recounts it takes outside the lock: a
    /// recount on an in-process store runs at once.
    fn in_slot<R>(&self, slot: &Slot, change: impl FnOnce(&mut Requests) -> R) -> Option<R> {
        let mut slots = self.slots.lock();
        let requests = slots.get_mut(slot)?;
        let changed = change(requests);
        if requests.active.is_empty() && requests.waiting.is_empty() {
            slots.remove(slot);
        }
        Some(changed)
    }
}

impl Ticket {
    /// The ticket's key, in stored form (empty once settled).
    pub(crate) fn key(&self) -> &[u8] {
        self.slot.as_ref().map_or(&[], |(_, key)| key)
    }

    /// The request was refused by its limit's quota: `recount` runs once the requests of its
    /// limit and key started before now have settled, or at [`SETTLE_DEADLINE`]. At most
    /// `most` (the penalty's count) wait per limit and key; the others are not counted.
    pub(crate) fn defer(mut self, recount: Recount, most: usize) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let number = self.number;
        if !self.registry.settle(&slot, number, Some((recount, most))) {
            return;
        }
        let registry = Arc::clone(&self.registry);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                tokio::time::sleep(SETTLE_DEADLINE).await;
                registry.overdue(&slot, number);
            })),
            Err(_) => tracing::debug!("no tokio runtime here: a refusal waits without a deadline"),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.registry.settle(&slot, self.number, None);
        }
    }
}

/// The count of a denial of `rule` for `key` (in stored form) at `cost`, refused now,
/// judged at the instant of the refusal ([`Store::count_denials`]): a window turning
/// meanwhile forgives nothing.
pub(crate) fn recount<St: Store + Clone>(
    limiter: Limiter<St>,
    rule: Rule,
    key: Box<[u8]>,
    cost: u64,
) -> Recount {
    let refused = tokio::time::Instant::now();
    Box::new(move || {
        run_detached(async move {
            let batch = [Check::stored(&rule, &key).with_cost(cost)];
            let counted = limiter.store().count_denials(&batch, refused.elapsed());
            if let Err(error) = counted.await {
                tracing::debug!(%error, rule = rule.name(), "a refused request's denial was not counted");
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts the recounts that ran.
    fn counted(runs: &Arc<AtomicUsize>) -> Recount {
        let runs = Arc::clone(runs);
        Box::new(move || {
            runs.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// A refusal waits for the requests that were checked or in flight when it was
    /// refused, not for those that came after it; the slot is gone once nothing is left.
    #[test]
    fn a_refusal_waits_for_the_requests_before_it_only() {
        let registry = Arc::new(Unsettled::default());
        let rule = Rule::fixed_window("r", 1, Duration::from_secs(1));
        let runs = Arc::new(AtomicUsize::new(0));
        let (first, alone) = registry.start(&rule, b"k");
        assert!(alone);
        let (refused, alone) = registry.start(&rule, b"k");
        assert!(!alone);
        refused.defer(counted(&runs), 5);
        let (later, _) = registry.start(&rule, b"k");
        assert_eq!(runs.load(Ordering::Relaxed), 0);
        drop(first);
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        drop(later);
        assert!(registry.slots.lock().is_empty());
    }

    /// No more refusals wait per rule and key than the penalty counts.
    #[test]
    fn at_most_the_penalty_count_waits() {
        let registry = Arc::new(Unsettled::default());
        let rule = Rule::fixed_window("r", 1, Duration::from_secs(1));
        let runs = Arc::new(AtomicUsize::new(0));
        let (first, _) = registry.start(&rule, b"k");
        for _ in 0..4 {
            registry.start(&rule, b"k").0.defer(counted(&runs), 2);
        }
        drop(first);
        assert_eq!(runs.load(Ordering::Relaxed), 2);
    }
}
