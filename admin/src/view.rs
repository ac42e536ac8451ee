//! What the admin router shows, read from the running layer: its rules, their decisions
//! over time, their most denied keys, their locked keys, the store's health, the state of
//! the keys a lookup finds. The JSON API serializes these; the page renders them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tollgate::layer::{Mode, RuleInfo};
use tollgate::{
    store::{Health, Store},
    Decision, DenyReason, Limiter, Rule, StoreError, StoredKey,
};

use super::activity::{now_millis, now_second, ring, RuleActivities, TopKey, PERIOD_SECONDS};
use super::text::{hex, key_text};
use super::watch::{BreakerView, BreakerWatch, MemoryView, MemoryWatch};

/// A rule as configured now.
#[derive(Debug, Serialize)]
pub(crate) struct RuleView {
    pub(crate) name: String,
    pub(crate) algorithm: &'static str,
    /// The most units admitted at once, and the period that restores them.
    pub(crate) limit: u64,
    pub(crate) period_ms: u128,
    pub(crate) cost: u64,
    pub(crate) penalty: Option<PenaltyView>,
    /// The route patterns it applies to; `"*"` for every request.
    pub(crate) routes: Vec<String>,
    /// `enforce`, `shadow` or `wait`.
    pub(crate) mode: &'static str,
}

/// A rule's penalty lockout.
#[derive(Debug, Serialize)]
pub(crate) struct PenaltyView {
    pub(crate) lock_for_ms: u128,
    pub(crate) after: u64,
    pub(crate) within_ms: u128,
}

/// Every rule the layer runs, in the order of the layer's limits, then the routes'.
pub(crate) fn rules(running: &[RuleInfo]) -> Vec<RuleView> {
    running
        .iter()
        .map(|info| {
            let rule = &info.rule;
            let mode = match info.mode {
                Mode::Shadow => "shadow",
                Mode::Wait { .. } => "wait",
                _ => "enforce",
            };
            RuleView {
                name: rule.name().to_owned(),
                algorithm: info.algorithm,
                limit: info.quota,
                period_ms: info.period.as_millis(),
                cost: rule.cost(),
                penalty: rule.penalty().map(|p| PenaltyView {
                    lock_for_ms: p.lock_duration().as_millis(),
                    after: p.denials(),
                    within_ms: p.window().as_millis(),
                }),
                routes: info.routes.clone(),
                mode,
            }
        })
        .collect()
}

/// The rule named `name` among the running ones.
pub(crate) fn rule(running: &[RuleInfo], name: &str) -> Option<Rule> {
    running
        .iter()
        .find(|i| i.rule.name() == name)
        .map(|i| i.rule.clone())
}

/// A rule's decisions per second, oldest first, ending now.
#[derive(Debug, Serialize)]
pub(crate) struct DecisionsView {
    pub(crate) rule: String,
    pub(crate) admitted: Vec<u64>,
    pub(crate) delayed: Vec<u64>,
    pub(crate) denied: Vec<u64>,
}

/// The decisions of every running rule over the last [`ring::SECONDS`] seconds. The
/// activity of rules a reload removed is dropped.
pub(crate) fn decisions(running: &[RuleInfo], activity: &RuleActivities) -> Vec<DecisionsView> {
    let now = now_second();
    let names: Vec<&str> = running.iter().map(|i| i.rule.name()).collect();
    activity.retain(&names);
    rules(running)
        .into_iter()
        .map(|view| {
            let seconds = activity
                .find(&view.name)
                .map(|a| a.decisions.read(now))
                .unwrap_or_else(|| vec![[0; 3]; ring::SECONDS]);
            let series = |i: usize| seconds.iter().map(|s| s[i]).collect();
            DecisionsView {
                rule: view.name,
                admitted: series(0),
                delayed: series(1),
                denied: series(2),
            }
        })
        .collect()
}

/// A key as shown: as text, as hex (exact), and whether it is the store's digest of a
/// longer key.
#[derive(Debug, Serialize)]
pub(crate) struct KeyView {
    pub(crate) key: String,
    pub(crate) key_hex: String,
    pub(crate) digested: bool,
}

impl KeyView {
    pub(crate) fn of(bytes: &[u8], digested: bool) -> Self {
        Self {
            key: key_text(bytes, digested),
            key_hex: hex(bytes),
            digested,
        }
    }
}

/// A key among a rule's most denied: its denials, which may be up to `error` more than
/// the true count.
#[derive(Debug, Serialize)]
pub(crate) struct TopKeyView {
    #[serde(flatten)]
    pub(crate) key: KeyView,
    pub(crate) denials: u64,
    pub(crate) error: u64,
}

/// A rule's most denied keys in this instance.
#[derive(Debug, Serialize)]
pub(crate) struct TopView {
    pub(crate) rule: String,
    /// Denials counted over the last one to two periods of this many seconds.
    pub(crate) period_seconds: u64,
    pub(crate) denials: u64,
    /// The estimated number of distinct keys denied.
    pub(crate) distinct_keys: u64,
    /// Keys the summary keeps per period.
    pub(crate) capacity: usize,
    /// No listed count is more than this above the truth, and every key denied more often
    /// than this is listed.
    pub(crate) error_bound: u64,
    pub(crate) keys: Vec<TopKeyView>,
}

/// The `n` most denied keys of every running rule.
pub(crate) fn top(running: &[RuleInfo], activities: &RuleActivities, n: usize) -> Vec<TopView> {
    let now = now_second();
    let mut views = Vec::new();
    for rule in rules(running) {
        let Some(activity) = activities.find(&rule.name) else {
            continue;
        };
        let report = activity.top(n, now);
        let bound = report.denials / report.capacity.max(1) as u64;
        let key = |k: TopKey| TopKeyView {
            key: KeyView::of(&k.key.bytes, k.key.digested),
            denials: k.denials,
            error: k.error,
        };
        views.push(TopView {
            rule: rule.name,
            period_seconds: PERIOD_SECONDS,
            denials: report.denials,
            distinct_keys: report.distinct,
            capacity: report.capacity,
            error_bound: bound,
            keys: report.keys.into_iter().map(key).collect(),
        });
    }
    views
}

/// The store's health and what it means, with the state of what the router was given to
/// watch: a circuit breaker, an in-process store.
#[derive(Debug, Serialize)]
pub(crate) struct HealthView {
    pub(crate) health: &'static str,
    pub(crate) meaning: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) breaker: Option<BreakerView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory_store: Option<MemoryView>,
}

pub(crate) fn health(
    health: Health,
    breaker: Option<&BreakerWatch>,
    memory: Option<&MemoryWatch>,
) -> HealthView {
    let (health, meaning) = match health {
        Health::Healthy => (
            "healthy",
            "the store decides as configured; a circuit breaker, if any, is closed",
        ),
        Health::Degraded => (
            "degraded",
            "the primary store is away: a local fallback decides, per instance",
        ),
        Health::Failing => (
            "failing",
            "a circuit breaker is open and nothing decides: the failure policy applies",
        ),
    };
    HealthView {
        health,
        meaning,
        breaker: breaker.map(BreakerWatch::view),
        memory_store: memory.map(MemoryWatch::view),
    }
}

/// One key's state under one rule, as the store has it (shared by every instance).
#[derive(Debug, Serialize)]
pub(crate) struct KeyState {
    pub(crate) rule: String,
    #[serde(flatten)]
    pub(crate) key: KeyView,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_ms: u128,
    /// Whether a request at the rule's cost would be admitted now.
    pub(crate) admitted: bool,
    pub(crate) locked: bool,
    pub(crate) retry_after_ms: Option<u128>,
    /// For a locked key, when a request of it is admitted again, in milliseconds since the
    /// Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) locked_until_unix_ms: Option<u128>,
}

/// When `wait` from now ends, in milliseconds since the Unix epoch.
fn unix_ms_after(wait: Duration) -> u128 {
    let then = SystemTime::now() + wait;
    then.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The state of `key` under `rule`; nothing is consumed.
pub(crate) async fn key_state<St: Store>(
    limiter: &Limiter<St>,
    rule: &Rule,
    key: &StoredKey<'_>,
) -> Result<KeyState, StoreError> {
    let now = limiter.peek(rule, key, 0).await?;
    let next = limiter.peek(rule, key, rule.cost()).await?;
    let (locked, retry_after) = match next.decision {
        Decision::Deny(denial) => (denial.reason == DenyReason::Locked, denial.retry_after),
        Decision::Delay(wait) => (false, Some(wait)),
        Decision::Allow => (false, None),
    };
    Ok(KeyState {
        rule: rule.name().to_owned(),
        key: KeyView::of(key.as_bytes(), key.is_digest()),
        limit: now.info.limit,
        remaining: now.info.remaining,
        reset_ms: now.info.reset.as_millis(),
        admitted: next.decision.is_admitted(),
        locked,
        retry_after_ms: retry_after.map(|d| d.as_millis()),
        locked_until_unix_ms: retry_after.filter(|_| locked).map(unix_ms_after),
    })
}

/// How many keys a lookup lists per rule.
pub(crate) const FOUND_PER_RULE: usize = 20;

/// What a lookup found: the state of each key.
#[derive(Debug, Serialize)]
pub(crate) struct Found {
    pub(crate) keys: Vec<KeyState>,
    /// Keys denied lately that match too, beyond the [`FOUND_PER_RULE`] listed per rule.
    pub(crate) more: usize,
    /// Locked keys of the rules searched that this instance forgot (more than it
    /// remembers) while their locks may still run: a key with the typed part may be among
    /// them, locked and not found.
    pub(crate) locks_forgotten: u64,
}

/// The keys `key` names under each of `rules`, with their state: the key itself, and the
/// keys this instance saw denied lately that have it as one of their parts (a user name
/// finds the `address␟user` keys it was denied under). The key itself is listed when it
/// was denied lately, when the store holds anything of it (it is not at its full quota),
/// or when the rule was `named` and no other key matches: a key made of the typed text
/// alone, under a rule whose keys have parts, is otherwise a key no request has, and its
/// fresh state ("admitted") would hide the locked key the operator is looking for.
pub(crate) async fn find<St: Store>(
    limiter: &Limiter<St>,
    activities: &RuleActivities,
    rules: &[Rule],
    named: bool,
    key: &StoredKey<'_>,
) -> Result<Found, StoreError> {
    let mut found = Found {
        keys: Vec::new(),
        more: 0,
        locks_forgotten: 0,
    };
    let now = now_millis();
    for rule in rules {
        let activity = activities.find(rule.name());
        found.locks_forgotten += activity.as_ref().map_or(0, |a| a.locks_forgotten(now));
        let mut seen = match &activity {
            Some(activity) if !key.is_digest() => activity.matching(key.as_bytes()),
            _ => Vec::new(),
        };
        let denied_lately = seen.iter().any(|k| **k == *key.as_bytes());
        seen.retain(|k| **k != *key.as_bytes());
        let exact = key_state(limiter, rule, key).await?;
        let untouched = exact.admitted && exact.remaining >= exact.limit;
        let mut listed = 0;
        if denied_lately || !untouched || (named && seen.is_empty()) {
            found.keys.push(exact);
            listed += 1;
        }
        for bytes in seen {
            let Some(stored) = StoredKey::from_stored(&bytes) else {
                continue;
            };
            if listed >= FOUND_PER_RULE {
                found.more += 1;
                continue;
            }
            found.keys.push(key_state(limiter, rule, &stored).await?);
            listed += 1;
        }
    }
    Ok(found)
}

/// How many locked keys are listed per rule.
pub(crate) const LOCKED_PER_RULE: usize = 50;

/// A key a penalty locks, as the store has it.
#[derive(Debug, Serialize)]
pub(crate) struct LockedKeyView {
    #[serde(flatten)]
    pub(crate) key: KeyView,
    /// How long until a request of the key is admitted again: the lock's end, or the
    /// quota's if later.
    pub(crate) retry_after_ms: u128,
    /// When that is, in milliseconds since the Unix epoch.
    pub(crate) until_unix_ms: u128,
}

/// The keys a rule locks now.
#[derive(Debug, Serialize)]
pub(crate) struct LockedView {
    pub(crate) rule: String,
    /// Soonest unlocked first.
    pub(crate) keys: Vec<LockedKeyView>,
    /// Keys locked as far as their denials here said, beyond the ones listed (not asked
    /// of the store).
    pub(crate) more: usize,
    /// Locked keys this instance forgot (more than it remembers) while their locks may
    /// still run: the list is not complete.
    pub(crate) forgotten: u64,
}

/// The keys each rule with a penalty locks now, at most `n` per rule: those this instance
/// saw denied as locked, each asked of the store (shared by every instance), so a key
/// unblocked anywhere, or whose lock ended, is not listed. A key locked only by other
/// instances' traffic is not known here.
pub(crate) async fn locked<St: Store>(
    limiter: &Limiter<St>,
    running: &[RuleInfo],
    activities: &RuleActivities,
    n: usize,
) -> Result<Vec<LockedView>, StoreError> {
    let now = now_millis();
    let mut views = Vec::new();
    for info in running.iter().filter(|i| i.rule.penalty().is_some()) {
        let rule = &info.rule;
        let mut view = LockedView {
            rule: rule.name().to_owned(),
            keys: Vec::new(),
            more: 0,
            forgotten: 0,
        };
        let Some(activity) = activities.find(rule.name()) else {
            views.push(view);
            continue;
        };
        view.forgotten = activity.locks_forgotten(now);
        for (bytes, _) in activity.locked(now) {
            let Some(stored) = StoredKey::from_stored(&bytes) else {
                continue;
            };
            if view.keys.len() >= n {
                view.more += 1;
                continue;
            }
            let next = limiter.peek(rule, &stored, rule.cost()).await?;
            match next.decision.denial() {
                Some(d) if d.reason == DenyReason::Locked => {
                    let wait = d.retry_after.unwrap_or_default();
                    view.keys.push(LockedKeyView {
                        key: KeyView::of(&bytes, stored.is_digest()),
                        retry_after_ms: wait.as_millis(),
                        until_unix_ms: unix_ms_after(wait),
                    });
                }
                _ => activity.unlocked(&bytes),
            }
        }
        views.push(view);
    }
    Ok(views)
}

/// Unblocks `key` under `rule`: clears its state and lifts its lock in the store (for every
/// instance), and forgets it among this instance's most denied keys.
pub(crate) async fn unblock<St: Store>(
    limiter: &Limiter<St>,
    activity: &RuleActivities,
    rule: &Rule,
    key: &StoredKey<'_>,
) -> Result<(), StoreError> {
    limiter.reset(rule, key).await?;
    if let Some(activity) = activity.find(rule.name()) {
        activity.forget(key.as_bytes());
    }
    Ok(())
}
