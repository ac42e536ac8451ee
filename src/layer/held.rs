//! Held requests: the bounds on how many the layer holds, and the hold itself. A delayed
//! request is held with the [`Reservation`] the store's answer made: its units go back if
//! the request is dropped before its release, and the rules that wait for the release
//! count it when the hold is over.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::Mutex;
use smallvec::SmallVec;
use tracing::Instrument;

use super::charge::Charging;
use super::config::Config;
use super::decide::Checked;
use super::headers::RateLimitHeaders;
use super::observe;
use super::service::{batch_of, Item};
use crate::decision::{Decision, Outcome};
use crate::key::KeyBuf;
use crate::reservation::{Batch, Reservation};
use crate::store::{Check, Store};

/// How many requests a layer holds at once unless told otherwise
/// ([`RateLimitLayerBuilder::max_held`](super::RateLimitLayerBuilder::max_held)).
pub const DEFAULT_MAX_HELD: usize = 10_000;

/// The bounds on held requests and their count, shared by every service a layer makes.
#[derive(Clone)]
pub(crate) struct HeldLimits {
    pub(crate) max: usize,
    pub(crate) max_per_key: Option<usize>,
    pub(crate) counts: Arc<HeldCounts>,
}

impl Default for HeldLimits {
    fn default() -> Self {
        Self {
            max: DEFAULT_MAX_HELD,
            max_per_key: None,
            counts: Arc::new(HeldCounts::new()),
        }
    }
}

impl fmt::Debug for HeldLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLimits")
            .field("max", &self.max)
            .field("max_per_key", &self.max_per_key)
            .field("held", &self.counts.total.load(Ordering::Relaxed))
            .finish()
    }
}

/// Shards of the per-key counts: held requests are few next to requests, so a handful of
/// locks is enough to keep them from queueing on one.
const HELD_SHARDS: usize = 16;

/// The requests held now: in all, and per (rule, key) that delays them.
pub(crate) struct HeldCounts {
    total: AtomicUsize,
    /// By the hash of (rule name, key): no allocation per key, and with a per-process random
    /// seed a client cannot aim at another's count.
    per_key: [Mutex<HashMap<u64, usize>>; HELD_SHARDS],
    hasher: DefaultHashBuilder,
}

impl HeldCounts {
    fn new() -> Self {
        Self {
            total: AtomicUsize::new(0),
            per_key: std::array::from_fn(|_| Mutex::new(HashMap::default())),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// What a held request counts under for `rule` and `key`.
    pub(crate) fn key_of(&self, rule: &str, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        rule.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, usize>> {
        &self.per_key[(key >> 60) as usize % HELD_SHARDS]
    }
}

impl HeldLimits {
    /// Counts one more held request under `keys` (distinct), or says `None` when that would
    /// pass a bound.
    pub(crate) fn try_hold(&self, keys: SmallVec<[u64; 4]>) -> Option<HeldSlot> {
        let counts = &self.counts;
        let max = self.max;
        counts
            .total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        observe::held(true);
        // The slot gives back what it took when dropped, on the way out too.
        let mut slot = HeldSlot {
            counts: counts.clone(),
            keys: SmallVec::new(),
        };
        if let Some(max_per_key) = self.max_per_key {
            for key in keys {
                let mut shard = counts.shard(key).lock();
                let n = shard.entry(key).or_insert(0);
                if *n >= max_per_key {
                    if *n == 0 {
                        shard.remove(&key);
                    }
                    return None;
                }
                *n += 1;
                slot.keys.push(key);
            }
        }
        Some(slot)
    }
}

/// One held request's place under the bounds; given back when dropped.
pub(crate) struct HeldSlot {
    counts: Arc<HeldCounts>,
    keys: SmallVec<[u64; 4]>,
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        for &key in &self.keys {
            let mut shard = self.counts.shard(key).lock();
            if let Some(n) = shard.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    shard.remove(&key);
                }
            }
        }
        self.counts.total.fetch_sub(1, Ordering::AcqRel);
        observe::held(false);
    }
}

/// A request's batch as the layer keeps it: the configuration it was checked under, its
/// route, and its keys in one buffer.
pub(crate) struct LayerBatch {
    pub(crate) config: Arc<Config>,
    pub(crate) route: Option<usize>,
    pub(crate) items: SmallVec<[Item; 4]>,
    pub(crate) keys: KeyBuf,
}

impl Batch for LayerBatch {
    fn checks(&self) -> SmallVec<[Check<'_>; 4]> {
        batch_of(&self.config, self.route, &self.items, &self.keys, None)
    }
}

/// A held request: its reservation, its place under the layer's bounds, and the headers
/// it is forwarded with when nothing is counted at its release.
pub(crate) struct Hold<St: Store + Clone> {
    pub(crate) reservation: Reservation<St>,
    pub(crate) slot: HeldSlot,
    pub(crate) headers: Option<RateLimitHeaders>,
    pub(crate) batch: Arc<LayerBatch>,
}

/// What the end of a hold says.
pub(crate) enum Released<St: Store + Clone> {
    /// Nothing was counted at the release: the request passes as it was decided.
    Pass {
        headers: Option<RateLimitHeaders>,
        charge: Option<Charging<St>>,
    },
    /// The rules that wait for the release counted it: the layer decides on their answer.
    Counted(Checked<St>),
}

/// The hold of a request, as a future: waits until the request is due, confirms it, and
/// frees its place once the confirmation has answered. Dropped before that, the
/// reservation gives the units back.
pub(crate) type HoldFuture<St> = Pin<Box<dyn Future<Output = Released<St>> + Send>>;

impl<St: Store + Clone> Hold<St> {
    pub(crate) fn release(self) -> HoldFuture<St> {
        Box::pin(async move {
            let Hold {
                mut reservation,
                slot,
                headers,
                batch,
            } = self;
            let pending: SmallVec<[usize; 4]> = reservation.pending().collect();
            reservation.wait().await;
            if pending.is_empty() {
                // Nothing waits for the release: the confirmation answers at once.
                let _ = reservation.confirm().await;
                drop(slot);
                let charge = Charging::new(&batch.config.clone(), reservation, batch);
                return Released::Pass { headers, charge };
            }
            let observation = observe::start(&batch.config, batch.route);
            let result = reservation
                .confirm()
                .instrument(observation.span.clone())
                .await;
            // The place under the bounds lasts until the confirmation has answered.
            drop(slot);
            Released::Counted(counted(batch, reservation, &pending, observation, result))
        })
    }
}

/// The layer's view of a confirmation: observed (metrics, span) for the rules counted at
/// the release only, the others were when the request was checked.
fn counted<St: Store + Clone>(
    batch: Arc<LayerBatch>,
    reservation: Reservation<St>,
    pending: &[usize],
    observation: observe::Observation,
    result: Result<Outcome, crate::StoreError>,
) -> Checked<St> {
    let checks = batch.checks();
    let limits: SmallVec<[usize; 4]> = batch.items.iter().map(|item| item.limit).collect();
    let health = reservation.health();
    let counted_now = result.as_ref().map(|outcome| Outcome {
        decision: outcome.decision,
        rules: pending
            .iter()
            .filter_map(|&i| outcome.rules.get(i).copied())
            .collect(),
        admission: None,
    });
    let pick = |all: &[usize]| -> SmallVec<[usize; 4]> {
        pending
            .iter()
            .filter_map(|&i| all.get(i).copied())
            .collect()
    };
    let pending_checks: SmallVec<[Check<'_>; 4]> = pending
        .iter()
        .filter_map(|&i| checks.get(i).copied())
        .collect();
    let store_latency = observe::finish(
        observation,
        &batch.config,
        batch.route,
        &pick(&limits),
        &pending_checks,
        &counted_now.map_err(|e| e.clone()),
        health,
    );
    let admitted = result.as_ref().is_ok_and(|o| o.is_admitted());
    drop((pending_checks, checks));
    Checked {
        result,
        route: batch.route,
        limits,
        reservation: admitted.then_some(reservation),
        batch: Some(batch),
        health,
        store_latency,
    }
}

/// For a request the layer will hold (delayed, not in shadow mode), what it counts under
/// for `max_held_per_key`: each (rule, key) whose rule delays it, once. A trial rule never
/// delays a request (its `Delay` says what enforcing it would do), so it takes no place:
/// else it could refuse a request. A rule left pending to the release says `Delay` only
/// because another rule holds the request.
pub(crate) fn held_keys(
    config: &Config,
    batch: &[Check<'_>],
    outcome: &Outcome,
) -> SmallVec<[u64; 4]> {
    let mut keys = SmallVec::new();
    if config.held.max_per_key.is_none() {
        return keys;
    }
    let pending = |i: usize| {
        outcome
            .admission
            .as_ref()
            .is_some_and(|a| a.taken(i).pending)
    };
    for (i, (check, rule)) in batch.iter().zip(&outcome.rules).enumerate() {
        if !check.shadow && matches!(rule.decision, Decision::Delay(_)) && !pending(i) {
            let key = config.held.counts.key_of(check.rule.name(), check.key);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    keys
}
