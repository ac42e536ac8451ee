//! What the layer tells operators about each decision: a `tracing` span, and with the
//! `metrics` feature, metrics through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! # The span
//!
//! Every checked request gets a span `rate_limit` (target `tollgate::decision`, level
//! `DEBUG`) around the store's decision, so the store's own events (a breaker opening, a
//! Redis error) are its children, and a tracing exporter shows the decision inside the
//! request's trace. Its fields:
//!
//! - `route`: the route-table pattern the request matched, if any;
//! - `outcome`: the batch's outcome, one of the [outcomes](#outcomes);
//! - `rule`: the rule that decided (the longest wait of a denial or a delay), or the first
//!   of an admitted batch;
//! - `key`: that rule's key, only as a short digest (8 hex digits of a hash keyed with a
//!   random value per process): enough to tell whether two lines are about the same client,
//!   not to learn which client, nor to match lines of two processes;
//! - `store_us`: how long the store took, in µs.
//!
//! When nothing listens at `DEBUG` for this target, the span costs a check of a cached
//! interest and the store call is not timed (unless the `metrics` feature is on).
//!
//! # Metrics
//!
//! With the `metrics` feature the layer records, through whatever recorder the application
//! installs (Prometheus, StatsD, OpenTelemetry…):
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tollgate_decisions_total` | counter | `rule`, `outcome` | per rule of each checked request |
//! | `tollgate_store_duration_seconds` | histogram | | how long the store took to decide a batch |
//! | `tollgate_store_health` | gauge | | the store's [`Health`] after its last decision: 0 healthy, 1 degraded (a fallback decides), 2 failing (a breaker is open) |
//! | `tollgate_held_requests` | gauge | | requests the layer holds now (wait mode, leaky-bucket delays) |
//! | `tollgate_held_refused_total` | counter | | delayed requests refused because `max_held` or `max_held_per_key` was reached |
//! | `tollgate_charge_refunds_total` | counter | `rule` | requests whose units were given back because their response did not count ([`Charge`](super::Charge)) |
//!
//! Labels are the rule's name and fixed words only. A key never becomes a label: keys are
//! unbounded (every client IP would be a series) and may be personal data.
//!
//! # Outcomes
//!
//! Per rule (`tollgate_decisions_total`): `admitted`, `delayed` (held for a leaky bucket's
//! shaping or a wait-mode reservation), `denied`, `locked` (a penalty lock), `shadow_denied`
//! (a rule on trial, or any rule in shadow mode, would have denied; nothing was refused),
//! `denied_by_other` (this rule would admit, but another rule of the batch denied, so this
//! one consumed nothing), and `store_failed` (the store failed; the
//! [`FailurePolicy`](super::FailurePolicy) decided). The span's `outcome` is the batch's,
//! with the same words.
//!
//! Recording a metric with labels costs the recorder a lookup (and, with the `metrics`
//! facade, a small allocation for the label list): some hundreds of nanoseconds per rule of
//! each request, paid only with the feature on and a recorder installed.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing::field::{display, Empty};
use tracing::Span;

use super::config::{Config, Mode};
use crate::decision::{Decision, DenyReason, Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::store::{Check, Health};

/// A decision being observed: its span, and when the store was asked, if timed.
pub(crate) struct Observation {
    pub(crate) span: Span,
    start: Option<Instant>,
}

/// Opens the span of a request's decision, and starts the clock if anyone will read it.
pub(crate) fn start(config: &Config, route: Option<usize>) -> Observation {
    let span = tracing::debug_span!(
        target: "tollgate::decision",
        "rate_limit",
        route = config.route_pattern(route),
        outcome = Empty,
        rule = Empty,
        key = Empty,
        store_us = Empty,
    );
    let timed = cfg!(feature = "metrics") || !span.is_disabled();
    Observation {
        span,
        start: timed.then(Instant::now),
    }
}

/// Records the store's answer for `batch`: the span's fields and the metrics.
pub(crate) fn finish(
    observation: Observation,
    config: &Config,
    batch: &[Check<'_>],
    result: &Result<Outcome, StoreError>,
    health: Health,
) {
    let elapsed = observation.start.map(|start| start.elapsed());
    let outcome = match result {
        Ok(outcome) => batch_outcome(config.mode, outcome),
        Err(_) => "store_failed",
    };
    #[cfg(feature = "metrics")]
    record_metrics(config, batch, result, health, elapsed);
    #[cfg(not(feature = "metrics"))]
    let _ = health;

    let span = &observation.span;
    if span.is_disabled() {
        return;
    }
    span.record("outcome", outcome);
    if let Some(elapsed) = elapsed {
        span.record("store_us", micros(elapsed));
    }
    let deciding = result.as_ref().ok().and_then(deciding_rule).unwrap_or(0);
    if let Some(check) = batch.get(deciding) {
        span.record("rule", check.rule.name());
        span.record("key", display(KeyDigest::of(check.key)));
    }
}

/// The batch's outcome in the words of the metrics.
fn batch_outcome(mode: Mode, outcome: &Outcome) -> &'static str {
    match outcome.decision {
        Decision::Deny(_) if mode == Mode::Shadow => "shadow_denied",
        Decision::Deny(denial) if denial.reason == DenyReason::Locked => "locked",
        Decision::Deny(_) => "denied",
        Decision::Delay(_) if mode != Mode::Shadow => "delayed",
        _ => "admitted",
    }
}

/// The index of the rule that decided a denial or a delay (the longest wait).
fn deciding_rule(outcome: &Outcome) -> Option<usize> {
    match outcome.decision {
        Decision::Deny(_) => outcome.deciding_rule(),
        Decision::Delay(wait) => outcome
            .rules
            .iter()
            .position(|r| r.decision == Decision::Delay(wait)),
        Decision::Allow => None,
    }
}

/// One rule's outcome in the words of the metrics (see the [module docs](self#outcomes)).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn rule_outcome(mode: Mode, shadow: bool, batch_denied: bool, rule: &RuleOutcome) -> &'static str {
    let on_trial = shadow || mode == Mode::Shadow;
    match rule.decision {
        Decision::Deny(_) if on_trial => "shadow_denied",
        Decision::Deny(denial) if denial.reason == DenyReason::Locked => "locked",
        Decision::Deny(_) => "denied",
        _ if batch_denied => "denied_by_other",
        Decision::Delay(_) if !on_trial => "delayed",
        _ => "admitted",
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A key as the span shows it: 32 bits of a hash keyed per process.
struct KeyDigest(u32);

impl KeyDigest {
    fn of(key: &[u8]) -> Self {
        static SEED: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        let hash = SEED.get_or_init(Default::default).hash_one(key);
        Self((hash >> 32) as u32)
    }
}

impl fmt::Display for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

#[cfg(feature = "metrics")]
fn record_metrics(
    config: &Config,
    batch: &[Check<'_>],
    result: &Result<Outcome, StoreError>,
    health: Health,
    elapsed: Option<Duration>,
) {
    if let Some(elapsed) = elapsed {
        metrics::histogram!("tollgate_store_duration_seconds").record(elapsed.as_secs_f64());
    }
    let health = match health {
        Health::Healthy => 0.0,
        Health::Degraded => 1.0,
        Health::Failing => 2.0,
    };
    metrics::gauge!("tollgate_store_health").set(health);
    match result {
        Ok(outcome) => {
            let denied = !outcome.is_admitted();
            for (check, rule) in batch.iter().zip(&outcome.rules) {
                let label = rule_outcome(config.mode, check.shadow, denied, rule);
                decision(check, label);
            }
        }
        Err(_) => batch
            .iter()
            .for_each(|check| decision(check, "store_failed")),
    }
}

#[cfg(feature = "metrics")]
fn decision(check: &Check<'_>, outcome: &'static str) {
    metrics::counter!(
        "tollgate_decisions_total",
        "rule" => check.rule.shared_name(),
        "outcome" => outcome,
    )
    .increment(1);
}

/// A request starts (`true`) or stops (`false`) being held.
pub(crate) fn held(_starts: bool) {
    #[cfg(feature = "metrics")]
    {
        let gauge = metrics::gauge!("tollgate_held_requests");
        if _starts {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
}

/// A delayed request was refused: no room to hold it.
pub(crate) fn held_refused() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_held_refused_total").increment(1);
}

/// A request's units were given back for `rule`: its response did not count.
pub(crate) fn charge_refunded(_rule: &crate::Rule) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_charge_refunds_total", "rule" => _rule.shared_name()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_digest_is_short_stable_and_not_the_key() {
        let a = KeyDigest::of(b"203.0.113.7").to_string();
        assert_eq!(a.len(), 8);
        assert_eq!(a, KeyDigest::of(b"203.0.113.7").to_string());
        assert_ne!(a, KeyDigest::of(b"203.0.113.8").to_string());
    }
}
