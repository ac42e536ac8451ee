//! What the layer tells operators about each decision, through one seam: every store
//! answer becomes one [`DecisionEvent`], which fills the `tracing` span's fields and is
//! told to every [`DecisionObserver`](super::DecisionObserver) — the layer's own and, with
//! the `metrics` feature, the one that records metrics through the
//! [`metrics`](https://docs.rs/metrics) facade.
//!
//! # The span
//!
//! Every checked request gets a span `rate_limit` (target `tollgate::decision`, level
//! `DEBUG`) around the store's decision, so the store's own events are its children. Its
//! fields:
//!
//! - `route`: the route-table pattern the request matched, if any;
//! - `outcome`: the batch's outcome, one of the [outcomes](#outcomes);
//! - `rule`: the rule that decided (the longest wait of a denial or a delay), or the first
//!   of an admitted batch;
//! - `key`: that rule's key as 8 hex digits of a hash keyed per process: enough to tell
//!   whether two lines are about the same client, not which client, nor across processes;
//! - `store_us`: how long the store took, in µs.
//!
//! # Metrics
//!
//! With the `metrics` feature every layer's first observer records through whatever
//! recorder the application installs, even one installed after the layer was built. Held
//! requests, refunds and evictions are not decisions: they are recorded where they happen.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tollgate_decisions_total` | counter | `rule`, `outcome` | per rule of each checked request |
//! | `tollgate_store_duration_seconds` | histogram | | how long the store took to decide a batch |
//! | `tollgate_store_health` | gauge | | the store's [`Health`] after its last decision: 0 healthy, 1 degraded (a fallback decides), 2 failing (a breaker is open) |
//! | `tollgate_held_requests` | gauge | | requests the layer holds now (wait mode, leaky-bucket delays) |
//! | `tollgate_held_refused_total` | counter | | delayed requests refused because `max_held` or `max_held_per_key` was reached |
//! | `tollgate_charge_refunds_total` | counter | `rule` | requests whose units were given back because their response did not count ([`Charge`](super::Charge)) |
//! | `tollgate_memory_store_evictions_total` | counter | | entries a [`MemoryStore`](crate::store::MemoryStore) past its bound forgot to make room for new keys (see [`MemoryStore::max_keys`](crate::store::MemoryStore::max_keys)) |
//!
//! Each is described, with its unit, to the recorder installed when a limit is made.
//! Labels are the rule's name and fixed words only: a key is unbounded and may be personal
//! data, so never a label.
//!
//! # Outcomes
//!
//! Per rule (`tollgate_decisions_total`): `admitted`, `delayed` (held for a leaky bucket's
//! shaping or a wait-mode reservation), `denied`, `locked` (a penalty lock), `shadow_denied`
//! (a rule in shadow, or any rule in shadow mode, would have denied; nothing was refused),
//! `denied_by_other` (this rule would admit, but another rule of the batch denied, so this
//! one consumed nothing), and `store_failed` (the store failed; the
//! [`FailurePolicy`](super::FailurePolicy) decided). The span's `outcome` is the batch's,
//! with the same words. A delayed request the layer has no room to hold is counted `delayed`
//! by its rules and in `tollgate_held_refused_total`.
pub(super) mod observer;
pub(super) mod record;
pub(super) mod rules;

use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::time::Instant;

use smallvec::SmallVec;
use tracing::field::{display, Empty};
use tracing::Span;

use self::observer::{DecisionEvent, RuleDecision};
use self::record::DecisionLabel;
use super::batch::LayerBatch;
use super::config::Mode;
use crate::clock::duration_to_micros;
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::store::reservation::Batch;
use crate::store::Health;
use crate::stored::StoredKey;

/// A decision being observed: its span, and when the store was asked.
pub(crate) struct Observation {
    pub(crate) span: Span,
    start: Instant,
}

/// Opens the span of a request's decision and starts the clock; `None` (and no span's code
/// runs) when neither a subscriber nor an observer would read them.
///
/// The span is made only when tracing's global level hint allows `DEBUG`: even a disabled
/// span costs tracing's `log` compatibility on every request when a dependency (axum) turns
/// on tracing's `log` feature.
#[inline]
pub(crate) fn start(batch: &LayerBatch) -> Option<Observation> {
    let debug = tracing::Level::DEBUG;
    let wanted = debug <= tracing::level_filters::STATIC_MAX_LEVEL
        && debug <= tracing::level_filters::LevelFilter::current();
    let observed = !batch.state().observers.is_empty();
    if !wanted && !observed {
        return None;
    }
    let span = if wanted {
        tracing::debug_span!(
            target: "tollgate::decision",
            "rate_limit",
            route = batch.config().route_pattern(batch.route),
            outcome = Empty,
            rule = Empty,
            key = Empty,
            store_us = Empty,
        )
    } else {
        Span::none()
    };
    let timed = observed || !span.is_disabled();
    timed.then(|| Observation {
        span,
        start: Instant::now(),
    })
}

/// The span a store's future runs in: the observation's, or none.
pub(crate) fn span_of(observed: &Option<Observation>) -> Span {
    observed
        .as_ref()
        .map_or_else(Span::none, |o| o.span.clone())
}

/// Observes the store's answer for `batch`'s checks (all, or at a held request's release
/// those at `which`): one event fills the span's fields and is told to every observer.
pub(crate) fn finish(
    observation: Observation,
    batch: &LayerBatch,
    which: Option<&[usize]>,
    result: &Result<Outcome, StoreError>,
    health: Health,
) {
    let Observation { span, start } = observation;
    let (span, store_latency) = (&span, start.elapsed());
    let outcome = result.as_ref();
    let batch_admitted = outcome.is_ok_and(Outcome::is_admitted);
    let shadow_mode = batch.config().mode == Mode::Shadow;
    let checks = batch.checks();
    let chosen = |(i, _): &(usize, _)| which.is_none_or(|w| w.contains(i));
    let rules: SmallVec<[RuleDecision<'_>; 4]> = (batch.limits().zip(&checks).enumerate())
        .filter(chosen)
        .enumerate()
        .map(|(j, (_, (limit, check)))| RuleDecision {
            rule: check.rule,
            key: StoredKey::kept(check.key()),
            outcome: outcome.ok().and_then(|o| o.rules.get(j)),
            batch_admitted,
            shadow: limit.shadow || shadow_mode,
            metrics: &limit.metrics,
        })
        .collect();
    let event = DecisionEvent {
        route: batch.config().route_pattern(batch.route),
        outcome,
        rules: &rules,
        health,
        store_latency,
    };
    if !span.is_disabled() {
        record_span(span, &event, shadow_mode);
    }
    batch.state().observers.notify(&event);
}

/// The span's fields, from the event the observers see.
fn record_span(span: &Span, event: &DecisionEvent<'_>, shadow_mode: bool) {
    let verdict = DecisionLabel::of(shadow_mode, false, event.outcome.ok().map(|o| o.decision));
    span.record("outcome", verdict.as_str());
    span.record("store_us", duration_to_micros(event.store_latency));
    // The rule that decided a denial or a delay (the longest wait), as `decide` finds it;
    // else the first.
    let decided = |r: &&RuleDecision<'_>| {
        let decision = event.outcome.ok().map(|o| o.decision);
        let by = r.outcome.map(|o| o.decision);
        (!r.shadow || shadow_mode) && by == decision && decision != Some(Decision::Allow)
    };
    let deciding = event.rules.iter().find(decided).or(event.rules.first());
    if let Some(rule) = deciding {
        span.record("rule", rule.rule.name());
        let digest = key_digest(rule.key.as_bytes());
        span.record("key", display(format_args!("{digest:08x}")));
    }
}

/// A key as the span shows it: 32 bits of a hash keyed per process.
fn key_digest(key: &[u8]) -> u32 {
    static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    (SEED.get_or_init(Default::default).hash_one(key) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key digest is eight characters, stable for a key, different for another, and not
    /// the key.
    #[test]
    fn a_key_digest_is_short_stable_and_not_the_key() {
        let digest = |key: &[u8]| format!("{:08x}", key_digest(key));
        let a = digest(b"203.0.113.7");
        assert_eq!(a.len(), 8);
        assert_eq!(a, digest(b"203.0.113.7"));
        assert_ne!(a, digest(b"203.0.113.8"));
    }
}
