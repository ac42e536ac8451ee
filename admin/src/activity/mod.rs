//! What an operator asks of a running layer, kept per rule in this instance: decisions per
//! second over the last minutes, the keys denied most recently, with an estimate of how
//! many distinct keys were denied, and the keys denied lately, locked or not (to list the
//! locks and to find a key by one of its parts).
//!
//! Both are per instance: each process sees its own traffic (the store's state, read by
//! [`Limiter::peek`](tollgate::Limiter::peek), is what instances share). They
//! are fed by the layer's [`DecisionObserver`] seam: an admitted or delayed request costs a
//! lookup of the rule and one atomic increment per rule, a denial one more lock and a map
//! lookup for the top keys.
//!
//! The top keys are two [Space-Saving](sketch) summaries of `capacity` counters each: the
//! current period's and the previous one's, a period being [`PERIOD_SECONDS`]. What is
//! listed covers the last one to two periods.

pub(crate) mod distinct;
pub(crate) mod ring;
pub(crate) mod seen;
pub(crate) mod sketch;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tollgate::layer::{DecisionEvent, DecisionObserver, RuleDecision};
use tollgate::{Decision, DenyReason};

use self::distinct::Distinct;
use self::ring::{Counted, DecisionRing};
use self::seen::{SeenKeys, DEFAULT_SEEN_KEYS};
use self::sketch::SpaceSaving;

/// How long a period of the top keys lasts, in seconds.
pub(crate) const PERIOD_SECONDS: u64 = 300;

/// How many keys each rule's summary keeps by default.
pub(crate) const DEFAULT_TOP_KEYS: usize = 64;

/// Milliseconds on the recorder's clock: monotonic, per process.
pub(crate) fn now_millis() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed().as_millis();
    u64::try_from(elapsed).unwrap_or(u64::MAX)
}

/// The second of the clock the rings and the periods run on that `millis` falls in (from 1,
/// so that no second is mistaken for an empty slot's).
pub(crate) fn second_of(millis: u64) -> u64 {
    millis / 1000 + 1
}

/// The second of the recorder's clock now.
pub(crate) fn now_second() -> u64 {
    second_of(now_millis())
}

/// One rule's activity in this instance.
#[derive(Debug)]
pub(crate) struct RuleActivity {
    name: Arc<str>,
    pub(crate) decisions: DecisionRing,
    denied: Mutex<Denied>,
}

/// What a rule's denials leave: the summaries of the current period and the previous one,
/// and the keys denied lately (one lock for both per denial).
#[derive(Debug)]
struct Denied {
    started: u64,
    current: (SpaceSaving, Distinct),
    previous: (SpaceSaving, Distinct),
    seen: SeenKeys,
}

/// A key as the summary keeps it: the key itself, or, for a key the store keeps under a
/// digest, that digest (so that memory stays bounded and an unblock reaches its state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredKey {
    pub(crate) bytes: Box<[u8]>,
    pub(crate) digested: bool,
}

/// A key among the most denied, over both periods.
#[derive(Debug, Clone)]
pub(crate) struct TopKey {
    pub(crate) key: StoredKey,
    pub(crate) denials: u64,
    pub(crate) error: u64,
}

/// What the top keys of a rule say.
#[derive(Debug, Clone)]
pub(crate) struct TopReport {
    pub(crate) keys: Vec<TopKey>,
    pub(crate) denials: u64,
    pub(crate) capacity: usize,
    pub(crate) distinct: u64,
}

fn key_hasher() -> &'static RandomState {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new)
}

impl RuleActivity {
    pub(crate) fn new(name: Arc<str>, capacity: usize) -> Self {
        let fresh = || (SpaceSaving::new(capacity), Distinct::default());
        Self {
            name,
            decisions: DecisionRing::default(),
            denied: Mutex::new(Denied {
                started: now_second(),
                current: fresh(),
                previous: fresh(),
                seen: SeenKeys::new(DEFAULT_SEEN_KEYS),
            }),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Counts a decision other than a denial.
    pub(crate) fn count(&self, what: Counted, second: u64) {
        self.decisions.count(what, second);
    }

    /// Counts a denial of `key`, in the form the store keeps it, at `millis` on the
    /// recorder's clock; `locked_for` is the wait of a lock's denial.
    pub(crate) fn deny(&self, key: &[u8], millis: u64, locked_for: Option<Duration>) {
        let second = second_of(millis);
        self.decisions.count(Counted::Denied, second);
        let hash = key_hasher().hash_one(key);
        let mut denied = self.denied.lock();
        denied.rotate(second);
        denied.current.0.count(key);
        denied.current.1.add(hash);
        denied.seen.denied(key, millis, locked_for);
    }

    /// Forgets `key` (stored form) in both periods and among the keys denied lately: it
    /// was unblocked.
    pub(crate) fn forget(&self, key: &[u8]) {
        let mut denied = self.denied.lock();
        denied.current.0.forget(key);
        denied.previous.0.forget(key);
        denied.seen.forget(key);
    }

    /// The keys whose last denial here said they are locked until after `millis`, with the
    /// end of each lock (on the recorder's clock), the soonest first.
    pub(crate) fn locked(&self, millis: u64) -> Vec<(Box<[u8]>, u64)> {
        self.denied.lock().seen.locked(millis)
    }

    /// How many locked keys were forgotten here whose locks may run at `millis` (see
    /// [`SeenKeys::locks_forgotten`]).
    pub(crate) fn locks_forgotten(&self, millis: u64) -> u64 {
        self.denied.lock().seen.locks_forgotten(millis)
    }

    /// Notes that `key` is not locked: the store says so.
    pub(crate) fn unlocked(&self, key: &[u8]) {
        self.denied.lock().seen.unlocked(key);
    }

    /// The keys denied lately that are `typed` or have it as one of their parts.
    pub(crate) fn matching(&self, typed: &[u8]) -> Vec<Box<[u8]>> {
        self.denied.lock().seen.matching(typed)
    }

    /// The most denied keys, at most `n`, over the current and the previous period.
    pub(crate) fn top(&self, n: usize, second: u64) -> TopReport {
        let mut top = self.denied.lock();
        top.rotate(second);
        let (current, previous) = (&top.current.0, &top.previous.0);
        let mut keys: Vec<TopKey> = merged(current, previous);
        keys.sort_by(|a, b| {
            b.denials
                .cmp(&a.denials)
                .then(a.key.bytes.cmp(&b.key.bytes))
        });
        keys.truncate(n);
        TopReport {
            keys,
            denials: current.total() + previous.total(),
            capacity: current.capacity(),
            distinct: top.current.1.estimate_with(&top.previous.1),
        }
    }
}

/// Two summaries as one: a key missing from one may have had up to that one's floor there,
/// which is added to its count and to its error (the merge of Agarwal et al., 2012).
fn merged(a: &SpaceSaving, b: &SpaceSaving) -> Vec<TopKey> {
    let mut keys: Vec<TopKey> = Vec::new();
    let in_b = |key: &[u8]| b.counters().iter().find(|c| *c.key == *key);
    for counter in a.counters() {
        let (count, error) = match in_b(&counter.key) {
            Some(other) => (other.count, other.error),
            None => (b.floor(), b.floor()),
        };
        keys.push(top_key(
            &counter.key,
            counter.count + count,
            counter.error + error,
        ));
    }
    for counter in b.counters() {
        if !a.counters().iter().any(|c| c.key == counter.key) {
            let (count, error) = (counter.count + a.floor(), counter.error + a.floor());
            keys.push(top_key(&counter.key, count, error));
        }
    }
    keys
}

fn top_key(stored: &[u8], denials: u64, error: u64) -> TopKey {
    // A key the store keeps as is never starts with 0xFF: its digests all do.
    let digested = stored.first() == Some(&0xFF);
    TopKey {
        key: StoredKey {
            bytes: stored.into(),
            digested,
        },
        denials,
        error,
    }
}

impl Denied {
    /// Starts a new period when the current one is over; `true` if it did.
    fn rotate(&mut self, second: u64) -> bool {
        let elapsed = second.saturating_sub(self.started);
        if elapsed < PERIOD_SECONDS {
            return false;
        }
        let capacity = self.current.0.capacity();
        let fresh = || (SpaceSaving::new(capacity), Distinct::default());
        self.previous = if elapsed < 2 * PERIOD_SECONDS {
            std::mem::replace(&mut self.current, fresh())
        } else {
            self.current = fresh();
            fresh()
        };
        self.started = second - elapsed % PERIOD_SECONDS;
        true
    }
}

/// The recorder of a layer's activity, per rule and in this instance: decisions per second
/// over the last five minutes, the keys denied most (a Space-Saving summary of `n` keys per
/// period of five minutes, the current one's and the previous one's), an estimate of the
/// distinct keys denied (a HyperLogLog of 256 bytes per period), and the last 1,024 keys
/// denied, with the end of the lock of those a penalty locked: what lists the locked keys,
/// and what a lookup searches for a key by one of its parts (a user name finds the
/// `address␟user` keys it was denied under). What the [`Admin`] router shows.
///
/// Set it on the layer as its observer
/// ([`RateLimitLayerBuilder::observe`](tollgate::layer::RateLimitLayerBuilder::observe)) and
/// give a clone to [`Admin::new`]: clones share one record. A rule that keeps its name
/// across a reload keeps its history. A would-be denial of a rule in shadow counts as
/// denied; a rule that admits a request another rule denies counts nothing (the denying
/// rule counts it). Keys are the store's form of them, so a key over 128 bytes is kept as
/// its 33-byte digest and an unblock still reaches it.
///
/// [`Admin`]: crate::Admin
/// [`Admin::new`]: crate::Admin::new
#[derive(Debug, Clone)]
pub struct Activity(pub(crate) Arc<RuleActivities>);

impl Activity {
    /// A recorder keeping the 64 keys each rule denied most, per period.
    pub fn new() -> Self {
        Self::with_top_keys(DEFAULT_TOP_KEYS)
    }

    /// A recorder keeping the `n` keys each rule denied most, per period of five minutes:
    /// memory of `n` keys of at most 128 bytes per rule and period. For `N` denials in a
    /// period, a listed count is never below the true count and at most `N / n` above it,
    /// and every key denied more than `N / n` times is listed.
    pub fn with_top_keys(n: usize) -> Self {
        Self(Arc::new(RuleActivities::new(n.max(1))))
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

impl DecisionObserver for Activity {
    fn on_decision(&self, event: &DecisionEvent<'_>) {
        for rule in event.rules {
            self.on_rule(rule);
        }
    }
}

impl Activity {
    /// One rule's decision; none when the store failed (the failure policy decided).
    fn on_rule(&self, d: &RuleDecision<'_>) {
        let Some(outcome) = d.outcome else {
            return;
        };
        let denied = matches!(outcome.decision, Decision::Deny(_));
        if !denied && !d.batch_admitted {
            // Another rule denied the request: that rule counts it.
            return;
        }
        let activity = self.0.rule(d.rule.name());
        match outcome.decision {
            Decision::Deny(denial) => {
                let locked = denial.reason == DenyReason::Locked;
                let locked_for = denial.retry_after.filter(|_| locked);
                activity.deny(d.key.as_bytes(), now_millis(), locked_for);
            }
            Decision::Delay(_) if !d.shadow => activity.count(Counted::Delayed, now_second()),
            _ => activity.count(Counted::Admitted, now_second()),
        }
    }
}

/// The activity of every rule of a layer, by name.
#[derive(Debug)]
pub(crate) struct RuleActivities {
    capacity: usize,
    rules: Mutex<Vec<Arc<RuleActivity>>>,
}

impl RuleActivities {
    /// Activity whose summaries keep `capacity` keys per rule and period.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            rules: Mutex::new(Vec::new()),
        }
    }

    /// The activity of the rule named `name`, made if new.
    pub(crate) fn rule(&self, name: &str) -> Arc<RuleActivity> {
        let mut rules = self.rules.lock();
        if let Some(found) = rules.iter().find(|r| r.name() == name) {
            return found.clone();
        }
        let made = Arc::new(RuleActivity::new(name.into(), self.capacity));
        rules.push(made.clone());
        made
    }

    /// The activity of the rule named `name`, if it has any.
    pub(crate) fn find(&self, name: &str) -> Option<Arc<RuleActivity>> {
        self.rules.lock().iter().find(|r| r.name() == name).cloned()
    }

    /// Drops the activity of rules not named in `kept` (a reload removed them).
    pub(crate) fn retain(&self, kept: &[&str]) {
        self.rules.lock().retain(|r| kept.contains(&r.name()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key the sketch tells apart from `other`: the process's hash puts two keys in one
    /// of its 256 registers one time in 256, and the sketch then counts them once.
    fn apart_from(other: &[u8]) -> Vec<u8> {
        let counted = |key: &[u8]| {
            let mut sketch = Distinct::default();
            sketch.add(key_hasher().hash_one(other));
            sketch.add(key_hasher().hash_one(key));
            sketch.estimate_with(&Distinct::default())
        };
        let mut keys = (0..).map(|i: u32| format!("new-{i}").into_bytes());
        keys.find(|key| counted(key) == 2)
            .expect("a key in another register")
    }

    /// Denials of the previous period still count; two periods later they are gone.
    #[test]
    fn top_keys_cover_one_to_two_periods() {
        let rule = RuleActivity::new("r".into(), 8);
        let t = rule.denied.lock().started;
        let at = |second: u64| (second - 1) * 1000;
        let new = apart_from(b"old");
        rule.deny(b"old", at(t), None);
        rule.deny(b"old", at(t), None);
        rule.deny(&new, at(t + PERIOD_SECONDS), None);
        let report = rule.top(10, t + PERIOD_SECONDS);
        let keys: Vec<_> = report
            .keys
            .iter()
            .map(|k| (&*k.key.bytes, k.denials))
            .collect();
        assert_eq!(keys, [(&b"old"[..], 2), (&new[..], 1)]);
        assert_eq!((report.denials, report.distinct), (3, 2));

        let report = rule.top(10, t + 2 * PERIOD_SECONDS);
        assert_eq!(report.keys.len(), 1);
        let report = rule.top(10, t + 4 * PERIOD_SECONDS);
        assert!(report.keys.is_empty());
    }

    /// A long key is kept as the digest the store keeps it under, and marked so.
    #[test]
    fn a_long_key_is_kept_as_its_digest() {
        let rule = RuleActivity::new("r".into(), 8);
        let long = [b'x'; 300];
        rule.deny(
            tollgate::StoredKey::of(&long).as_bytes(),
            now_millis(),
            None,
        );
        let report = rule.top(1, now_second());
        let key = &report.keys[0].key;
        assert!(key.digested);
        assert_eq!(key.bytes.len(), 33);
    }
}
