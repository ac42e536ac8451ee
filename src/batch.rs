//! The decision of a batch of rules, all or nothing: the one place where Deny beats Delay
//! beats Allow, where penalties lock keys, and where a denied batch is kept from consuming.
//!
//! A store calls it in three steps while it holds every entry of the batch exclusively:
//! [`evaluate`] each item (read only), [`admits`] on all of them, then [`commit`] (or
//! [`report`], for items that change nothing) each item.
//! `lua/batch.lua` is the Redis twin of this module.

use std::time::Duration;

use crate::algorithm::{Eval, State, Verdict, MAX_SCALED};
use crate::decision::{Decision, Denial, DenyReason, Outcome, RateLimitInfo, RuleOutcome};
use crate::error::StoreError;
use crate::penalty::PenaltyState;
use crate::store::Check;
use crate::Rule;

/// What a store keeps for one rule and one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) state: State,
    pub(crate) penalty: PenaltyState,
}

impl Entry {
    /// The instant (µs) from which this entry is the same as no entry under `rule`.
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        let penalty = rule.penalty().map_or(0, |p| p.expires_at(&self.penalty));
        rule.algorithm().expires_at(&self.state).max(penalty)
    }
}

/// One item of a batch, evaluated but not yet committed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evaluated {
    eval: Eval,
    /// Microseconds of penalty lock left, if the key is locked.
    locked_for: Option<u64>,
    /// The instant evaluated: the request's arrival, or later for a reservation.
    at: u64,
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

/// Refuses batches the stores cannot decide consistently: the same rule twice for one key
/// would read one state twice and admit more than the rule allows.
pub(crate) fn validate(batch: &[Check<'_>]) -> Result<(), StoreError> {
    for (i, a) in batch.iter().enumerate() {
        if batch[..i]
            .iter()
            .any(|b| b.rule.name() == a.rule.name() && b.key == a.key)
        {
            return Err(StoreError::InvalidBatch(format!(
                "rule {:?} appears twice for the same key",
                a.rule.name()
            )));
        }
    }
    Ok(())
}

/// Step 1: what `check` would get from `entry` (absent = never used) at instant `at`.
pub(crate) fn evaluate(check: &Check<'_>, entry: Option<&Entry>, at: u64) -> Evaluated {
    let empty = State::default();
    let state = entry.map_or(&empty, |e| &e.state);
    let locked_for = match (check.rule.penalty(), entry) {
        (Some(_), Some(e)) => e.penalty.locked_for(at),
        _ => None,
    };
    Evaluated {
        eval: check.rule.algorithm().evaluate(state, at, check.cost),
        locked_for,
        at,
    }
}

/// Step 2: whether the batch is admitted (no item rejects).
pub(crate) fn admits(items: &[Evaluated]) -> bool {
    items.iter().all(|e| !e.rejects())
}

/// Step 2, in wait mode: for a denied batch, how long after `now` it could be admitted, if
/// that is within `max_wait` µs. The store then evaluates the batch again at that instant
/// and, if it admits, commits it there: the units are reserved now, taken from the future,
/// and the request is delayed until then. Locked keys and costs over capacity never wait.
///
/// Each item's retry is the earliest instant it admits, and with no other traffic an
/// admissible item stays admissible, so the largest retry admits the whole batch.
///
/// Waits are capped at 2^50 µs (some 35 years) whatever `max_wait` says: each reservation
/// then lies at most that far ahead, so the instants in a state stay below 2^53 instead of
/// overflowing under reservations that would wait forever (`Duration::MAX`).
pub(crate) fn reservation(items: &[Evaluated], max_wait: u64) -> Option<u64> {
    let max_wait = max_wait.min(MAX_SCALED);
    let mut wait = 0;
    for item in items.iter().filter(|e| e.rejects()) {
        if item.locked_for.is_some() {
            return None;
        }
        match item.eval.verdict {
            Verdict::Reject {
                retry_micros: Some(r),
            } => wait = wait.max(r),
            _ => return None,
        }
    }
    (wait <= max_wait).then_some(wait)
}

/// Whether [`commit`] will change the entry of an item, so a store can skip the write (and
/// avoid creating entries for keys that stay empty).
pub(crate) fn writes(check: &Check<'_>, item: &Evaluated, admitted: bool) -> bool {
    if admitted {
        check.cost > 0
    } else {
        item.counts_for_penalty() && check.rule.penalty().is_some()
    }
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
            check
                .rule
                .algorithm()
                .apply(&mut entry.state, item.at, check.cost);
        }
    } else if item.counts_for_penalty() {
        if let Some(penalty) = check.rule.penalty() {
            if penalty.record_denial(&mut entry.penalty, item.at) {
                item.locked_for = entry.penalty.locked_for(item.at);
            }
        }
    }
    report(check, Some(entry), now, &item, admitted)
}

/// Step 3, for an item that does not write (or after [`commit`]): what it decided.
pub(crate) fn report(
    check: &Check<'_>,
    entry: Option<&Entry>,
    now: u64,
    item: &Evaluated,
    admitted: bool,
) -> RuleOutcome {
    let (limit, _) = check.rule.algorithm().quota();
    let info = |eval: &Eval| RateLimitInfo {
        limit,
        remaining: eval.remaining,
        reset: Duration::from_micros(eval.reset_micros),
    };
    if admitted {
        // A reservation's wait comes before the rule's own shaping delay.
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
    let algorithm_retry = match item.eval.verdict {
        Verdict::Admit { .. } => Some(0),
        Verdict::Reject { retry_micros } => retry_micros,
    };
    let decision = match (algorithm_retry, item.locked_for) {
        (None, _) => deny(DenyReason::CostExceedsCapacity, None),
        // A lock ends before the algorithm may admit again, or after: the later of the two.
        (Some(retry), Some(lock)) => deny(DenyReason::Locked, Some(retry.max(lock))),
        (Some(_), None) if item.eval.is_admitted() => Decision::Allow,
        (retry, None) => deny(DenyReason::Limited, retry),
    };
    // Nothing was consumed: report the quota as it stands.
    let empty = State::default();
    let state = entry.map_or(&empty, |e| &e.state);
    RuleOutcome {
        decision,
        info: info(&check.rule.algorithm().evaluate(state, now, 0)),
    }
}

fn deny(reason: DenyReason, retry_micros: Option<u64>) -> Decision {
    Decision::Deny(Denial {
        reason,
        retry_after: retry_micros.map(Duration::from_micros),
    })
}

/// The decision of the batch from its rules' decisions: Deny beats Delay beats Allow; the
/// longest retry-after wins, and a denial no wait can lift beats every other.
pub(crate) fn combine(rules: Vec<RuleOutcome>) -> Outcome {
    let mut decision = Decision::Allow;
    for rule in &rules {
        decision = match (decision, rule.decision) {
            (Decision::Deny(a), Decision::Deny(b)) => Decision::Deny(longer(a, b)),
            (Decision::Deny(a), _) => Decision::Deny(a),
            (_, Decision::Deny(b)) => Decision::Deny(b),
            (Decision::Delay(a), Decision::Delay(b)) => Decision::Delay(a.max(b)),
            (Decision::Delay(a), Decision::Allow) | (Decision::Allow, Decision::Delay(a)) => {
                Decision::Delay(a)
            }
            (Decision::Allow, Decision::Allow) => Decision::Allow,
        };
    }
    Outcome { decision, rules }
}

fn longer(a: Denial, b: Denial) -> Denial {
    match (a.retry_after, b.retry_after) {
        (None, _) => a,
        (_, None) => b,
        (Some(x), Some(y)) if y > x => b,
        _ => a,
    }
}
