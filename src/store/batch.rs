//! The decision of a batch of rules, all or nothing: where penalties lock keys, where a
//! denied batch is kept from consuming, and where its rules' decisions make the batch's
//! ([`combine`]: Deny beats Delay beats Allow).
//!
//! A store calls it in three steps while it holds every entry of the batch exclusively:
//! [`evaluate`] each item (read only) at its key's release ([`key_release`]), [`admits`]
//! on all of them, then [`commit`] (or [`report`], for items that change nothing) each item, as
//! [`admitted`] says.
//!
//! A shadow item (a trial rule) is decided with the others but never vetoes or delays: it
//! takes the batch's part when it admits on its own, and a denied item's part (nothing
//! consumed, the penalty counted) when it does not.
//!
//! Every rule counts the request at the instant it passes: the batch's arrival (now, or the
//! reserved instant in wait mode; on a Redis Cluster, the latest of the parts'
//! reservations), or later where a leaky bucket holds it in its queue. Every queue of the
//! batch holds it until the latest of their releases (the batch's release) and the rules on
//! the key that releases it last count it then; the rules on other keys are pending:
//! checked now at the release, counted when the request is released
//! ([`Reservation::confirm`](crate::Reservation::confirm)), so one client's queue never dates a
//! shared state in the future (see [`evaluate`]).
//!
//! `lua/batch.lua` is the Redis twin of this module.

use smallvec::SmallVec;
use std::time::Duration;

use crate::algorithm::{Algorithm, Carried, Eval, State, Verdict, MAX_SCALED};
use crate::decision::{Decision, Denial, DenyReason, RateLimitInfo, RuleOutcome, Taken};
use crate::error::StoreError;
use crate::penalty::PenaltyState;
use crate::store::check::Check;
use crate::Rule;

/// The batch's decision from its rules' (Deny beats Delay beats Allow): the outcome's own
/// rule, which every store applies to its batches.
pub(crate) use crate::decision::combine;

/// What a store keeps for one rule name and one key.
///
/// The algorithm's state belongs to the configuration whose fingerprint is stored with it
/// (0: no state yet). Any other configuration reads `carried` instead (see
/// [`Rule`](crate::Rule#reconfiguring-a-rule)); the penalty belongs to the name and is read
/// by every configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) state: State,
    pub(crate) fingerprint: u64,
    /// Written with every admission: `until` is also when the state is back to empty,
    /// under its own configuration and any other, which makes it the entry's expiry
    /// without a field of its own.
    pub(crate) carried: Carried,
    /// The penalty's bookkeeping, on the heap from the first denial it counts: most entries
    /// never have one, and the entries of the in-process map stay small without it (the
    /// map's size is what a decision on many keys waits for).
    penalty: Option<Box<Penalized>>,
}

/// A penalty's bookkeeping, and the instant it is forgotten as the rule that last wrote
/// the entry sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Penalized {
    state: PenaltyState,
    expires_at: u64,
}

impl Entry {
    /// An entry holding `state`, written by the configuration of `fingerprint`.
    pub(crate) fn own(state: State, fingerprint: u64) -> Self {
        Self {
            state,
            fingerprint,
            ..Self::default()
        }
    }

    /// The penalty's bookkeeping (all zeros until a denial counted).
    pub(crate) fn penalty(&self) -> PenaltyState {
        self.penalty.as_deref().map(|p| p.state).unwrap_or_default()
    }

    /// The penalty's bookkeeping to record a denial in.
    fn penalty_mut(&mut self) -> &mut PenaltyState {
        &mut self.penalty.get_or_insert_with(Box::default).state
    }

    /// Whether the algorithm's state was written by `rule`'s configuration.
    pub(crate) fn is_own(&self, rule: &Rule) -> bool {
        self.fingerprint == rule.fingerprint()
    }

    /// Notes, after `rule` wrote the entry, when its penalty is forgotten: the rule's
    /// penalty says when it stops counting denials; a rule without one keeps the lock
    /// only, which belongs to the name (else the entry, and the lock, would go with the
    /// state).
    pub(crate) fn written_by(&mut self, rule: &Rule) {
        if let Some(p) = &mut self.penalty {
            p.expires_at = rule
                .penalty()
                .map_or(p.state.locked_until, |penalty| penalty.expires_at(&p.state));
        }
    }

    /// The instant (µs) from which this entry is the same as no entry, under any
    /// configuration of its name: when the state is back to empty (`carried.until`, set at
    /// every admission; a refund since only brings the state's own end earlier) and the
    /// penalty is forgotten (as of the last [`written_by`](Self::written_by)).
    pub(crate) fn expires_at(&self) -> u64 {
        let penalty = self.penalty.as_deref().map_or(0, |p| p.expires_at);
        self.carried.until.max(penalty)
    }
}

/// What `rule` says about `cost` units at `at` given `entry` (absent = never used).
fn evaluate_algorithm(rule: &Rule, entry: Option<&Entry>, at: u64, cost: u64) -> Eval {
    match entry {
        Some(e) if e.is_own(rule) => rule.algorithm().evaluate(&e.state, at, cost),
        Some(e) => rule.algorithm().evaluate_carried(e.carried, at, cost),
        None => rule.algorithm().evaluate(&State::default(), at, cost),
    }
}

/// One item of a batch, evaluated but not yet committed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evaluated {
    eval: Eval,
    /// Microseconds of penalty lock left at arrival, if the key is locked.
    locked_for: Option<u64>,
    /// The instant the rule counts the request at: its key's release, or the arrival for
    /// the leaky bucket that holds the request until the release.
    at: u64,
    /// The instant the request arrives: now, or later for a reservation. Locks and the
    /// denials a penalty counts are about arrivals.
    arrival: u64,
    /// A trial item: it never denies or delays the batch.
    shadow: bool,
    /// Counted only when the request passes: a rule on a key that releases the request
    /// before the batch does (see [`evaluate`]), evaluated here at the batch's release and
    /// left unwritten until the caller confirms it then.
    pending: bool,
    /// For a leaky bucket that would release the request before the batch does: the
    /// batch's release, until which its queue holds the request (see [`evaluate`]); 0
    /// otherwise.
    held_until: u64,
    /// The water that hold adds above the queue's own ([`Algorithm::hold`]): what a refund
    /// drains beside the units.
    hold: u64,
    /// Decided on units another configuration of the rule holds (see [`Rule`]'s
    /// reconfiguring), which no reservation waits for: this configuration's state, written
    /// at the reserved instant, could not keep the key closed until then.
    foreign: bool,
}

impl Evaluated {
    fn rejects(&self) -> bool {
        self.locked_for.is_some() || !self.eval.is_admitted()
    }

    /// Whether a penalty counts this item's denial: a denial by the rule's quota. Requests
    /// already locked out, or costing more than the rule can ever admit (a client or
    /// configuration error, not a rate), don't count.
    fn counts_for_penalty(&self) -> bool {
        self.locked_for.is_none()
            && matches!(
                self.eval.verdict,
                Verdict::Reject {
                    retry_micros: Some(_)
                }
            )
    }
}

/// `batch` as [`Store::count_denials`](crate::store::Store::count_denials) counts it: a
/// check that [deferred](Check::defers_denial) its denial did so at its check, and is
/// counted now.
pub(crate) fn undeferred<'a>(batch: &[Check<'a>]) -> SmallVec<[Check<'a>; 4]> {
    batch
        .iter()
        .map(|c| Check {
            defers_denial: false,
            ..*c
        })
        .collect()
}

/// Refuses batches the stores cannot decide consistently: the same rule twice for one key
/// would read one state twice and admit more than the rule allows, and a rule that records
/// a configuration problem (see [`Rule::validate`](crate::Rule::validate)) has nothing to
/// decide with.
pub(crate) fn validate(batch: &[Check<'_>]) -> Result<(), StoreError> {
    for (i, a) in batch.iter().enumerate() {
        if let Err(e) = a.rule.validate() {
            return Err(StoreError::InvalidBatch(
                e.problems().collect::<Vec<_>>().join("; "),
            ));
        }
        if batch[..i]
            .iter()
            .any(|b| b.rule.name() == a.rule.name() && b.key() == a.key())
        {
            return Err(StoreError::InvalidBatch(format!(
                "rule {:?} appears twice for the same key",
                a.rule.name()
            )));
        }
    }
    Ok(())
}

/// Step 0: the instant `check`'s rule lets a request arriving at `arrival` pass. A leaky
/// bucket holds it until the water queued before it has drained (the end of its delay,
/// whether or not the water it adds fits; a request that adds no water does not queue);
/// every other rule lets it pass on arrival, and so does a shadow item, which never holds a
/// request.
///
/// The release of a key is the latest of these over the items on that key (see
/// [`key_release`]): the rules on that key count the request there, so a fixed window
/// beside the client's own queue never counts the request in a window it does not pass in.
/// Rules on other keys (a global or per-tenant limit) wait for the batch's release, the
/// latest over its keys, without closing their state before then: they are pending (see
/// [`evaluate`]). Every queue of the batch holds the request until the batch's release,
/// so that no queue lets its next request go before this one's units have drained from
/// the instant it really leaves. A wait-mode reservation moves every rule of its batch to
/// the reserved instant (its arrival).
pub(crate) fn release(check: &Check<'_>, entry: Option<&Entry>, arrival: u64) -> u64 {
    match (check.rule.algorithm(), entry) {
        (algorithm, Some(e)) if is_queue(check) => {
            let queued = if e.is_own(check.rule) {
                algorithm.expires_at(&e.state)
            } else {
                // Another configuration's water, held as this bucket's own (see `Rule`).
                algorithm.expires_at(&algorithm.adopt(e.carried, arrival, 0))
            };
            queued.max(arrival)
        }
        _ => arrival,
    }
}

/// The release of the `i`-th item's key: the latest [`release`] (`releases[j]` for the
/// `j`-th item) over the items of `batch` on the same key.
pub(crate) fn key_release(batch: &[Check<'_>], releases: &[u64], i: usize) -> u64 {
    let key = batch[i].key();
    batch
        .iter()
        .zip(releases)
        .filter(|(c, _)| c.key() == key)
        .fold(releases[i], |latest, (_, &r)| latest.max(r))
}

/// Step 1: what `check` would get from `entry` (absent = never used) for a request arriving
/// at `arrival` that its key releases at `release` (see [`key_release`]) and the batch at
/// `batch_release` (the latest release over every key).
///
/// A leaky bucket counts the request on arrival, its delay being its queue, and lets it go
/// at the batch's release: when another queue of the batch holds the request longer, this
/// one holds it too, the time until then reading as queued water
/// ([`Algorithm::evaluate_held`]), so its next request leaves after this one's units have
/// drained from the instant it really leaves, never sooner (a queue with too little room
/// for the hold denies). Every other rule counts the request at its key's release. A rule
/// whose key releases the request before the batch does (a global or per-tenant limit
/// beside one client's queue) is *pending*: counting it at the batch's release would date a
/// shared state in the future and close it to every other client until then
/// (`tests/stores/shaping.rs` `one_clients_queue_does_not_close_a_shared_bucket`),
/// counting it on arrival would count the request in a window it does not pass in. So it is
/// evaluated at the batch's release, changing nothing, and counted when the request is
/// released ([`Reservation::confirm`](crate::Reservation::confirm)).
pub(crate) fn evaluate(
    check: &Check<'_>,
    entry: Option<&Entry>,
    arrival: u64,
    release: u64,
    batch_release: u64,
) -> Evaluated {
    let queue = is_queue(check);
    let pending = !queue && release < batch_release && check.cost > 0 && !check.shadow;
    let held_until = if queue && self::release(check, entry, arrival) < batch_release {
        batch_release
    } else {
        0
    };
    let at = match (pending, queue) {
        (true, _) => batch_release,
        (false, true) => arrival,
        (false, false) => release,
    };
    let (eval, hold) = match held_until {
        0 => (None, 0),
        until => (
            check.rule.algorithm().evaluate_held(at, check.cost, until),
            queued_hold(check, entry, at, until),
        ),
    };
    let locked_for = match (check.rule.penalty(), entry) {
        (Some(_), Some(e)) => e.penalty().locked_for(arrival),
        _ => None,
    };
    Evaluated {
        eval: eval.unwrap_or_else(|| evaluate_algorithm(check.rule, entry, at, check.cost)),
        locked_for,
        at,
        arrival,
        shadow: check.shadow,
        pending,
        held_until,
        hold,
        foreign: entry.is_some_and(|e| e.fingerprint != 0 && !e.is_own(check.rule)),
    }
}

/// The water a hold of `check`'s queue until `until` adds above its own at `at` (another
/// configuration's water read as its own, as [`release`] reads it).
fn queued_hold(check: &Check<'_>, entry: Option<&Entry>, at: u64, until: u64) -> u64 {
    let algorithm = check.rule.algorithm();
    match entry {
        Some(e) if e.is_own(check.rule) => algorithm.hold(&e.state, at, until),
        Some(e) => algorithm.hold(&algorithm.adopt(e.carried, at, 0), at, until),
        None => algorithm.hold(&State::default(), at, until),
    }
}

/// Whether `check` joins a leaky bucket's queue: it adds water and is not on trial (a trial
/// rule never holds a request).
fn is_queue(check: &Check<'_>) -> bool {
    check.cost > 0 && !check.shadow && matches!(check.rule.algorithm(), Algorithm::LeakyBucket(_))
}

/// [`evaluate`] for a batch of one, whose key and batch release are the rule's own.
pub(crate) fn evaluate_alone(check: &Check<'_>, entry: Option<&Entry>, arrival: u64) -> Evaluated {
    let release = release(check, entry, arrival);
    evaluate(check, entry, arrival, release, release)
}

impl Evaluated {
    /// The instant the rule counts the request at: what a refund of its admission needs.
    pub(crate) fn counted_at(&self) -> u64 {
        self.at
    }

    /// What a refund of its admission drains beside the units (see [`Algorithm::hold`]).
    pub(crate) fn hold(&self) -> u64 {
        self.hold
    }

    /// Whether the rule is counted only when the request is released (see [`evaluate`]).
    pub(crate) fn is_pending(&self) -> bool {
        self.pending
    }
}

/// Microseconds after `from` until the item's rule admits, if a wait can help: the rule's
/// own retry counts from the instant the rule counts the request at.
fn retry_from(item: &Evaluated, from: u64) -> Option<u64> {
    let counted_in = item.at.saturating_sub(from);
    match item.eval.verdict {
        Verdict::Admit { .. } => Some(counted_in),
        Verdict::Reject { retry_micros } => retry_micros.map(|r| counted_in + r),
    }
}

/// Step 2: whether the batch is admitted (no item rejects but shadow ones).
pub(crate) fn admits(items: &[Evaluated]) -> bool {
    items.iter().all(|e| e.shadow || !e.rejects())
}

/// Step 3: whether `item` takes its part as admitted in a batch that `batch_admitted` says
/// of: every item of an admitted batch, except a shadow item that would deny on its own (it
/// consumes nothing, as a denied batch would under that rule).
pub(crate) fn admitted(item: &Evaluated, batch_admitted: bool) -> bool {
    batch_admitted && !(item.shadow && item.rejects())
}

/// Step 2, in wait mode: for a denied batch, how long after `now` it could be admitted, if
/// that is within `max_wait` µs. The store then evaluates the batch again at that instant
/// and, if it admits, commits it there: the units are reserved now, taken from the future,
/// and the request is delayed until then. Locked keys, costs over capacity and units another
/// configuration of a rule holds never wait.
///
/// Each item's retry is the earliest arrival it admits at, and with no other traffic an
/// admissible item stays admissible (a later arrival is released no earlier), so the largest
/// retry admits the whole batch.
///
/// Waits are capped at 2^50 µs (some 35 years) whatever `max_wait` says: each reservation
/// then lies at most that far ahead, so the instants in a state stay below 2^53 instead of
/// overflowing under reservations that would wait forever (`Duration::MAX`).
pub(crate) fn reservation(items: &[Evaluated], max_wait: u64) -> Option<u64> {
    let max_wait = max_wait.min(MAX_SCALED);
    let mut wait = 0;
    // A trial rule never makes a request wait.
    for item in items.iter().filter(|e| !e.shadow && e.rejects()) {
        if item.locked_for.is_some() || item.foreign {
            return None;
        }
        wait = wait.max(retry_from(item, item.arrival)?);
    }
    (wait <= max_wait).then_some(wait)
}

/// Whether [`commit`] will change the entry of an item, so a store can skip the write (and
/// avoid creating entries for keys that stay empty).
pub(crate) fn writes(check: &Check<'_>, item: &Evaluated, admitted: bool) -> bool {
    if admitted {
        check.cost > 0 && !item.pending
    } else {
        counts_denial(check, item)
    }
}

/// Whether a denied item's penalty counts its denial: a quota denial of a rule with a
/// penalty, unless the check leaves it to its caller ([`Check::defers_denial`]).
fn counts_denial(check: &Check<'_>, item: &Evaluated) -> bool {
    item.counts_for_penalty() && check.rule.penalty().is_some() && !check.defers_denial
}

/// Step 3, for an item that [`writes`]: records its part in the batch (the admission, or
/// the denial a penalty counts) and says what it decided.
pub(crate) fn commit(
    check: &Check<'_>,
    entry: &mut Entry,
    now: u64,
    item: &Evaluated,
    admitted: bool,
) -> RuleOutcome {
    let mut item = *item;
    if admitted {
        if check.cost > 0 {
            let algorithm = check.rule.algorithm();
            let held = match item.held_until {
                0 => None,
                until => algorithm.held(item.at, check.cost, until),
            };
            if let Some(held) = held {
                // The queue before the hold has drained by its end: the hold replaces it.
                entry.state = held;
                entry.fingerprint = check.rule.fingerprint();
            } else if entry.is_own(check.rule) {
                algorithm.apply(&mut entry.state, item.at, check.cost);
            } else {
                entry.state = algorithm.adopt(entry.carried, item.at, check.cost);
                entry.fingerprint = check.rule.fingerprint();
            }
            entry.carried = Carried {
                used: algorithm.limit().saturating_sub(item.eval.remaining),
                until: algorithm.expires_at(&entry.state),
            };
        }
    } else if counts_denial(check, &item) {
        if let Some(penalty) = check.rule.penalty() {
            let state = entry.penalty_mut();
            if penalty.record_denial(state, item.arrival) {
                item.locked_for = state.locked_for(item.arrival);
            }
        }
    }
    report(check, Some(entry), now, &item, admitted)
}

/// After [`commit`] of an admitted item: what identifies its admission in `entry`, for
/// [`refund`].
pub(crate) fn mark(check: &Check<'_>, entry: &Entry, item: &Evaluated) -> u64 {
    let delay = match item.eval.verdict {
        Verdict::Admit { delay_micros } => delay_micros,
        Verdict::Reject { .. } => 0,
    };
    check.rule.algorithm().mark(&entry.state, item.at, delay)
}

/// Gives back what an item's admission (`taken`) took, where that is exact (see
/// [`Store::refund`](crate::store::Store::refund)); returns whether it did.
pub(crate) fn refund(check: &Check<'_>, entry: &mut Entry, now: u64, taken: &Taken) -> bool {
    // Another configuration wrote the state since (a reconfiguration): not ours to change.
    if !entry.is_own(check.rule) {
        return false;
    }
    let algorithm = check.rule.algorithm();
    let (at, mark) = (taken.at, (taken.mark, taken.hold));
    if !algorithm.refund(&mut entry.state, now, at, check.cost, mark) {
        return false;
    }
    // What other configurations read goes back with the units: a state the refund emptied
    // holds nothing for them.
    entry.carried = carried(check.rule, &entry.state, now);
    true
}

/// What another configuration reads of `state` written at `now` (see [`Carried`]).
fn carried(rule: &Rule, state: &State, now: u64) -> Carried {
    let algorithm = rule.algorithm();
    let remaining = algorithm.evaluate(state, now, 0).remaining;
    Carried {
        used: algorithm.limit().saturating_sub(remaining),
        until: algorithm.expires_at(state),
    }
}

/// Takes `check.cost` units at `now` without a check, for a request already served (its
/// cost settled above what its admission took; see
/// [`Algorithm::overdraw`](crate::algorithm::Algorithm::overdraw) for how each model
/// carries the excess). A state another configuration wrote is adopted first, as an
/// admission's commit adopts it, so the units it held still count.
pub(crate) fn overdraw(check: &Check<'_>, entry: &mut Entry, now: u64) {
    let algorithm = check.rule.algorithm();
    if !entry.is_own(check.rule) {
        entry.state = algorithm.adopt(entry.carried, now, 0);
        entry.fingerprint = check.rule.fingerprint();
    }
    algorithm.overdraw(&mut entry.state, now, check.cost);
    entry.carried = carried(check.rule, &entry.state, now);
}

/// Step 3, for an item that does not write (or after [`commit`]): what it decided.
pub(crate) fn report(
    check: &Check<'_>,
    entry: Option<&Entry>,
    now: u64,
    item: &Evaluated,
    admitted: bool,
) -> RuleOutcome {
    let limit = check.rule.algorithm().limit();
    let info = |eval: &Eval| RateLimitInfo {
        limit,
        remaining: eval.remaining,
        reset: Duration::from_micros(eval.reset_micros),
    };
    if admitted {
        // The release comes after a reservation's wait, and after a leaky bucket's queue:
        // the rule counted at the release, or at the arrival with its delay ending there.
        let delay = match item.eval.verdict {
            Verdict::Admit { delay_micros } => item.at.saturating_sub(now) + delay_micros,
            Verdict::Reject { .. } => 0,
        };
        let decision = if delay > 0 {
            Decision::Delay(Duration::from_micros(delay))
        } else {
            Decision::Allow
        };
        // The eval was made at the reserved instant; the reset a client sees counts from now.
        let reserved = Eval {
            reset_micros: item.eval.reset_micros + item.at.saturating_sub(now),
            ..item.eval
        };
        return RuleOutcome {
            decision,
            info: info(&reserved),
        };
    }
    let algorithm_retry = retry_from(item, now);
    let decision = match (algorithm_retry, item.locked_for) {
        (None, _) => deny(DenyReason::CostExceedsCapacity, None),
        // A lock ends before the algorithm may admit again, or after: the later of the two.
        (Some(retry), Some(lock)) => deny(DenyReason::Locked, Some(retry.max(lock))),
        (Some(_), None) if item.eval.is_admitted() => Decision::Allow,
        (retry, None) => deny(DenyReason::Limited, retry),
    };
    // Nothing was consumed: report the quota as it stands.
    RuleOutcome {
        decision,
        info: info(&evaluate_algorithm(check.rule, entry, now, 0)),
    }
}

fn deny(reason: DenyReason, retry_micros: Option<u64>) -> Decision {
    Decision::Deny(Denial {
        reason,
        retry_after: retry_micros.map(Duration::from_micros),
    })
}
