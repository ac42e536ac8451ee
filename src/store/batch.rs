//! The all-or-nothing decision of a batch, as [`Store::check`](crate::store::Store::check)
//! documents it; `lua/batch.lua` is its Redis twin. A store holding every entry of the
//! batch exclusively [`evaluate`]s each item at its key's release ([`key_release`]), asks
//! [`admits`], then [`commit`]s (or [`report`]s) each item as [`admitted`] says.

use smallvec::SmallVec;
use std::time::Duration;

use crate::algorithm::{Algorithm, Carried, Eval, State, Verdict, MAX_SCALED};
use crate::decision::{Decision, Denial, DenyReason, RateLimitInfo, RuleOutcome, StoreId, Taken};
use crate::error::StoreError;
use crate::penalty::{PenaltyState, REFUSALS_KEPT_MICROS};
use crate::store::check::{Check, Refusal};
use crate::store::parked::Parked;
use crate::Rule;

/// The batch's decision from its rules' (Deny beats Delay beats Allow).
pub(crate) use crate::decision::combine;

/// What a store keeps for one rule name and one key.
///
/// The state belongs to the configuration of `fingerprint` (0: none yet); any other reads
/// `carried` ([`Rule`](crate::Rule#reconfiguring-a-rule)). The penalty belongs to the name.
/// `repr(C)`: the fingerprint first, as [`MemoryStore`](crate::store::MemoryStore)'s slot
/// layout needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Entry {
    pub(crate) fingerprint: u64,
    /// Written with every admission; its `until` (empty under any configuration) is the
    /// entry's expiry.
    pub(crate) carried: Carried,
    /// Boxed from a penalty's first denial (counted, or deferred: kept for a late count) or
    /// a lease, so the many entries without one stay small.
    aside: Option<Box<Aside>>,
    pub(crate) state: State,
}

/// What few entries hold: a penalty's bookkeeping (which says itself until when it counts)
/// and the units parked in leases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Aside {
    penalty: PenaltyState,
    parked: Parked,
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
        self.aside.as_deref().map(|p| p.penalty).unwrap_or_default()
    }

    /// What few entries hold, made if it was not.
    fn aside_mut(&mut self) -> &mut Aside {
        self.aside.get_or_insert_with(Box::default)
    }

    /// Whether units are parked in leases of the key ([`Parked`]).
    #[inline]
    pub(crate) fn has_leases(&self) -> bool {
        self.aside.as_ref().is_some_and(|a| !a.parked.is_empty())
    }

    /// Parks a lease of `rule` ([`Parked::park`]), kept until a bucket it held down to
    /// nothing has refilled.
    pub(crate) fn park(&mut self, rule: &Rule, id: u64, units: u64, expiry: u64) {
        let fill = crate::clock::duration_to_micros(rule.algorithm().quota().1);
        let kept = expiry.saturating_add(fill);
        self.aside_mut().parked.park(id, units, expiry, kept);
    }

    /// Brings the state to `at` under its leases' cap ([`Parked::settle`]), as `rule`'s
    /// configuration: another's state is adopted first, so that its units still count.
    pub(crate) fn settle(&mut self, rule: &Rule, at: u64) {
        let algorithm = rule.algorithm();
        let aside = self.aside.as_deref_mut();
        let Some(aside) = aside.filter(|a| !a.parked.is_empty() && algorithm.can_lease()) else {
            return;
        };
        if self.fingerprint != rule.fingerprint() {
            self.state = algorithm.adopt(self.carried, at, 0);
            self.fingerprint = rule.fingerprint();
        }
        aside.parked.settle(algorithm, &mut self.state, at);
        self.carried = carried(rule, &self.state, at);
    }

    /// Ends lease `id` at `now`, giving back `unused` of its units if it is still held.
    /// Under another configuration's state (a reload since) the lease is left to its term:
    /// only the state's own configuration can settle it.
    pub(crate) fn end_lease(&mut self, rule: &Rule, now: u64, id: u64, unused: u64) {
        if !self.is_own(rule) {
            return;
        }
        self.settle(rule, now);
        if let Some(units) = self.aside.as_deref_mut().and_then(|a| a.parked.end(id)) {
            rule.algorithm()
                .give_back(&mut self.state, now, unused.min(units));
            self.carried = carried(rule, &self.state, now);
        }
    }

    /// Forgets the state and the lock at `now`, keeping the units parked in live leases:
    /// their holders may still use them. Whether any are.
    pub(crate) fn reset(&mut self, now: u64) -> bool {
        let mut parked = self.aside.take().map(|a| a.parked).unwrap_or_default();
        parked.drop_ended(now);
        *self = Self::default();
        if !parked.is_empty() {
            self.aside_mut().parked = parked;
        }
        self.has_leases()
    }

    /// Until when the bound must keep the entry: its lock, or its leases.
    pub(crate) fn kept_until(&self) -> u64 {
        self.aside
            .as_deref()
            .map_or(0, |a| a.penalty.locked_until.max(a.parked.until()))
    }

    /// Whether the algorithm's state was written by `rule`'s configuration.
    pub(crate) fn is_own(&self, rule: &Rule) -> bool {
        self.fingerprint == rule.fingerprint()
    }

    /// When (µs) this entry equals no entry: the state empty (`carried.until`; a refund only
    /// brings it earlier) and the penalty forgotten. One with a penalty's bookkeeping (or
    /// leases) is kept [`REFUSALS_KEPT_MICROS`] µs longer: a refusal counted late finds the
    /// state it was refused on.
    pub(crate) fn expires_at(&self) -> u64 {
        let Some(aside) = self.aside.as_deref() else {
            return self.carried.until;
        };
        let kept = self.carried.until.saturating_add(REFUSALS_KEPT_MICROS);
        kept.max(aside.penalty.expires_at())
            .max(aside.parked.until())
    }
}

/// What `rule` says about `cost` units at `at` given `entry` (absent = never used); a key
/// with leases on a settled copy ([`Entry::settle`]).
fn evaluate_algorithm(rule: &Rule, entry: Option<&Entry>, at: u64, cost: u64) -> Eval {
    match entry {
        Some(e) if e.has_leases() && rule.algorithm().can_lease() => {
            let mut settled = e.clone();
            settled.settle(rule, at);
            rule.algorithm().evaluate(&settled.state, at, cost)
        }
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
    /// When the rule counts the request: its key's release, or arrival for a leaky bucket.
    at: u64,
    /// Now, or later for a reservation. Locks and penalty denials are about arrivals.
    arrival: u64,
    /// A trial item: it never denies or delays the batch.
    shadow: bool,
    /// Pending: left unwritten until the caller confirms it (see [`evaluate`]).
    pending: bool,
    /// For a leaky bucket that would release the request before the batch does, the batch's
    /// release, until which its queue holds it (see [`evaluate`]); 0 otherwise.
    held_until: u64,
    /// The water that hold adds ([`Algorithm::hold`]), which a refund drains too.
    hold: u64,
    /// Decided on another configuration's units, which no reservation waits for: this
    /// configuration's state could not keep the key closed until then.
    foreign: bool,
}

impl Evaluated {
    fn rejects(&self) -> bool {
        self.locked_for.is_some() || !self.eval.is_admitted()
    }

    /// Whether this is a quota denial, which a penalty counts. Requests already locked out,
    /// or costing more than the rule can ever admit (an error, not a rate), don't count.
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

/// `batch` with no item [deferring](Refusal::Deferred) its refusal, for
/// [`Store::count_denials`](crate::store::Store::count_denials).
pub(crate) fn undeferred<'a>(batch: &[Check<'a>]) -> SmallVec<[Check<'a>; 4]> {
    batch
        .iter()
        .map(|c| match c.refusal {
            Refusal::Deferred => Check {
                refusal: Refusal::Enforced,
                ..*c
            },
            _ => *c,
        })
        .collect()
}

/// Refuses batches the stores cannot decide consistently: the same rule twice for one key
/// (one state read twice admits too much), or a rule with a configuration problem
/// ([`Rule::checked`](crate::Rule::checked) names it).
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

/// Step 0: when `check`'s rule lets a request arriving at `arrival` pass: a leaky bucket
/// once the water queued before it has drained (whether or not its own fits); every other
/// rule, a shadow item, and a request adding no water, on arrival.
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

/// The release of the `i`-th item's key: the latest of `releases` over its key's items.
pub(crate) fn key_release(batch: &[Check<'_>], releases: &[u64], i: usize) -> u64 {
    let key = batch[i].key();
    batch
        .iter()
        .zip(releases)
        .filter(|(c, _)| c.key() == key)
        .fold(releases[i], |latest, (_, &r)| latest.max(r))
}

/// [`validate`] for a lease ([`Store::lease`](crate::store::Store::lease)): an enforced
/// item of a token bucket or GCRA.
pub(crate) fn validate_lease(check: &Check<'_>) -> Result<(), StoreError> {
    validate(std::slice::from_ref(check))?;
    if !check.rule.algorithm().can_lease() || check.in_shadow() {
        return Err(StoreError::InvalidBatch(format!(
            "rule {:?}: only an enforced token bucket or GCRA can lease",
            check.rule.name()
        )));
    }
    Ok(())
}

/// Step 1: what `check` would get from `entry` (absent = never used) for a request arriving
/// at `arrival`, released by its key at `release` and by the batch at `batch_release`.
///
/// A leaky bucket counts it on arrival and holds it to the batch's release, read as queued
/// water ([`Algorithm::evaluate_held`]). Every other rule counts it at its key's release; a
/// rule whose key releases earlier is *pending*
/// ([`Store::check`](crate::store::Store::check)): evaluated at the batch's release,
/// changing nothing, counted by [`Reservation::confirm`](crate::Reservation::confirm).
pub(crate) fn evaluate(
    check: &Check<'_>,
    entry: Option<&Entry>,
    arrival: u64,
    release: u64,
    batch_release: u64,
) -> Evaluated {
    let queue = is_queue(check);
    let pending = !queue && release < batch_release && check.cost > 0 && !check.in_shadow();
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
        shadow: check.in_shadow(),
        pending,
        held_until,
        hold,
        foreign: entry.is_some_and(|e| e.fingerprint != 0 && !e.is_own(check.rule)),
    }
}

/// The water a hold of `check`'s queue until `until` adds above its own at `at`.
fn queued_hold(check: &Check<'_>, entry: Option<&Entry>, at: u64, until: u64) -> u64 {
    let algorithm = check.rule.algorithm();
    match entry {
        Some(e) if e.is_own(check.rule) => algorithm.hold(&e.state, at, until),
        Some(e) => algorithm.hold(&algorithm.adopt(e.carried, at, 0), at, until),
        None => algorithm.hold(&State::default(), at, until),
    }
}

/// Whether `check` joins a leaky bucket's queue (it adds water and is not on trial): its
/// key's rules count the request at the queue's release, not on arrival.
pub(crate) fn is_queue(check: &Check<'_>) -> bool {
    check.cost > 0
        && !check.in_shadow()
        && matches!(check.rule.algorithm(), Algorithm::LeakyBucket(_))
}

/// [`evaluate`] for a batch of one, whose key and batch release are the rule's own.
pub(crate) fn evaluate_alone(check: &Check<'_>, entry: Option<&Entry>, arrival: u64) -> Evaluated {
    let release = release(check, entry, arrival);
    evaluate(check, entry, arrival, release, release)
}

impl Evaluated {
    /// What the item's admission takes in `store`, before its mark is known ([`mark`]):
    /// the instant the rule counts it, the hold a refund drains too; nothing yet if it is
    /// pending (see [`evaluate`]).
    #[inline]
    pub(crate) fn taken(&self, store: StoreId) -> Taken {
        if self.pending {
            return Taken::pending();
        }
        Taken {
            store,
            at: self.at,
            hold: self.hold,
            ..Taken::default()
        }
    }
}

/// Microseconds after `from` until the item's rule admits, if a wait can help.
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

/// Step 3: whether `item` takes its part as admitted: every item of an admitted batch but a
/// shadow item that would deny on its own.
pub(crate) fn admitted(item: &Evaluated, batch_admitted: bool) -> bool {
    batch_admitted && !(item.shadow && item.rejects())
}

/// Step 2, in wait mode: how long after `now` a denied batch could be admitted, if within
/// `max_wait` µs (capped at 2^50 so instants stay below 2^53); the store then evaluates and
/// commits it there. Locked keys, costs over capacity and another configuration's units
/// never wait. An admissible item stays admissible later (with no other traffic), so the
/// largest item retry admits the whole batch.
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

/// Whether [`commit`] will change an item's entry, so a store can skip the write.
pub(crate) fn writes(check: &Check<'_>, item: &Evaluated, admitted: bool) -> bool {
    if admitted {
        check.cost > 0 && !item.pending
    } else {
        counts_denial(check, item)
    }
}

/// Whether a penalty counts this denial, or keeps it for a late count if
/// [deferred](Refusal::Deferred): a quota denial, of a rule with a penalty.
fn counts_denial(check: &Check<'_>, item: &Evaluated) -> bool {
    item.counts_for_penalty() && check.rule.penalty().is_some()
}

/// Step 3, for an item that [`writes`]: records its admission or counted denial.
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
            entry.settle(check.rule, item.at);
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
            // Boxed here if it was not: the entry is kept for a deferred refusal's count.
            let state = &mut entry.aside_mut().penalty;
            let deferred = check.refusal == Refusal::Deferred;
            if !deferred && penalty.record_denial(state, item.arrival) {
                item.locked_for = state.locked_for(item.arrival);
            }
        }
    }
    report(check, Some(entry), now, &item, admitted)
}

/// After [`commit`] of an admitted item: its admission's mark in `entry`, for [`refund`].
pub(crate) fn mark(check: &Check<'_>, entry: &Entry, item: &Evaluated) -> u64 {
    check.rule.algorithm().mark(&entry.state, item.at)
}

/// Gives back what `taken` took, where exact ([`Store::refund`](crate::store::Store::refund)).
pub(crate) fn refund(check: &Check<'_>, entry: &mut Entry, now: u64, taken: &Taken) {
    if taken.lease {
        entry.end_lease(check.rule, now, taken.mark, check.cost);
        return;
    }
    // Another configuration wrote the state since (a reconfiguration): not ours to change.
    let algorithm = check.rule.algorithm();
    let (at, mark) = (taken.at, (taken.mark, taken.hold));
    if entry.is_own(check.rule) && algorithm.refund(&mut entry.state, now, at, check.cost, mark) {
        // What other configurations read goes back with the units.
        entry.carried = carried(check.rule, &entry.state, now);
    }
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

/// Takes `check.cost` units at `now` without a check
/// ([`Store::overdraw`](crate::store::Store::overdraw); each model carries them as
/// [`Algorithm::overdraw`](crate::algorithm::Algorithm::overdraw) says). Another
/// configuration's state is adopted first, so its units still count.
pub(crate) fn overdraw(check: &Check<'_>, entry: &mut Entry, now: u64) {
    entry.settle(check.rule, now);
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
    if admitted {
        return admitted_rule(check.rule, &item.eval, item.at.saturating_sub(now));
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
    let eval = evaluate_algorithm(check.rule, entry, now, 0);
    rule_says(check.rule, decision, eval.remaining, eval.reset_micros)
}

/// What a rule admitted with `eval` reports when it counts the request `later` µs from now
/// (its key's release, or arrival with its delay ending there): a delay until then, and
/// the reset as a client sees it from now.
#[inline]
pub(crate) fn admitted_rule(rule: &Rule, eval: &Eval, later: u64) -> RuleOutcome {
    let delay = match eval.verdict {
        Verdict::Admit { delay_micros } => later + delay_micros,
        Verdict::Reject { .. } => 0,
    };
    let decision = match delay {
        0 => Decision::Allow,
        _ => Decision::Delay(Duration::from_micros(delay)),
    };
    rule_says(rule, decision, eval.remaining, eval.reset_micros + later)
}

/// `rule`'s part of an outcome: `decision`, `left` units remaining, the reset `reset` µs
/// from now.
#[inline]
pub(crate) fn rule_says(rule: &Rule, decision: Decision, left: u64, reset: u64) -> RuleOutcome {
    RuleOutcome {
        decision,
        info: RateLimitInfo {
            limit: rule.algorithm().limit(),
            remaining: left,
            reset: Duration::from_micros(reset),
        },
    }
}

/// A denial for `reason`, retried after `retry_micros` µs where a wait helps.
pub(crate) fn deny(reason: DenyReason, retry_micros: Option<u64>) -> Decision {
    Decision::Deny(Denial {
        reason,
        retry_after: retry_micros.map(Duration::from_micros),
    })
}
