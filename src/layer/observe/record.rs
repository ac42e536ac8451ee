//! The outcome words, and the `metrics` feature: each limit's metric keys, the records of
//! decisions (for the observer that `observer` installs) and of what is not a decision
//! (held requests, refunds) through the `metrics` facade (see the [module docs](super) for
//! the names and labels). The one place the feature is read in the layer.

use std::time::Duration;

use crate::decision::{Decision, DenyReason};
use crate::rule::Rule;
use crate::store::Health;

/// The outcome of a rule, or of a batch (see the [module docs](super#outcomes)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DecisionLabel {
    Admitted,
    Delayed,
    Denied,
    Locked,
    ShadowDenied,
    DeniedByOther,
    StoreFailed,
}

impl DecisionLabel {
    /// The words of the outcomes, in the order of the variants.
    const NAMES: [&'static str; 7] = [
        "admitted",
        "delayed",
        "denied",
        "locked",
        "shadow_denied",
        "denied_by_other",
        "store_failed",
    ];

    pub(super) fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The outcome of a `decision`, a batch's or one rule's in a batch (`None`: the store
    /// failed): `in_shadow` for a layer in shadow mode (or a shadow limit's rule),
    /// `batch_denied` when another rule denied the rule's batch.
    pub(super) fn of(in_shadow: bool, batch_denied: bool, decision: Option<Decision>) -> Self {
        match decision {
            None => DecisionLabel::StoreFailed,
            Some(Decision::Deny(_)) if in_shadow => DecisionLabel::ShadowDenied,
            Some(Decision::Deny(d)) if d.reason == DenyReason::Locked => DecisionLabel::Locked,
            Some(Decision::Deny(_)) => DecisionLabel::Denied,
            _ if batch_denied => DecisionLabel::DeniedByOther,
            Some(Decision::Delay(_)) if !in_shadow => DecisionLabel::Delayed,
            _ => DecisionLabel::Admitted,
        }
    }
}

/// A limit's metric keys, made once with the limit, so that recording one costs no
/// allocation (a key made per request would allocate its label list). Empty without the
/// `metrics` feature.
#[derive(Clone, Debug)]
pub(crate) struct RuleMetrics {
    #[cfg(feature = "metrics")]
    keys: std::sync::Arc<recording::RuleKeys>,
}

impl RuleMetrics {
    pub(crate) fn new(_rule: &Rule) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: std::sync::Arc::new(recording::RuleKeys::new(_rule)),
        }
    }
}

/// A request starts (`true`) or stops (`false`) being held.
pub(crate) fn held(_starts: bool) {
    #[cfg(feature = "metrics")]
    recording::held(_starts);
}

/// A delayed request was refused: no room to hold it.
pub(crate) fn held_refused() {
    #[cfg(feature = "metrics")]
    recording::count(&recording::HELD_REFUSED);
}

/// A request's units were given back for the limit of `_metrics`: its response did not
/// count.
pub(crate) fn charge_refunded(_metrics: &RuleMetrics) {
    #[cfg(feature = "metrics")]
    recording::count(&_metrics.keys.refunds);
}

/// Whether decisions are recorded as metrics: the `metrics` feature.
pub(super) const ENABLED: bool = cfg!(feature = "metrics");

/// Records a decision: each rule's metric keys with its outcome, the store's health and
/// how long it took, if timed.
pub(super) fn decision<'a>(
    _rules: impl Iterator<Item = (&'a RuleMetrics, DecisionLabel)>,
    _health: Health,
    _latency: Duration,
) {
    #[cfg(feature = "metrics")]
    recording::decision(_rules, _health, _latency);
}

/// The metrics, through the `metrics` facade: every call asks for the current recorder, so
/// one installed after the layer was built records too.
#[cfg(feature = "metrics")]
mod recording {
    use std::time::Duration;

    use metrics::{Key, Label, Level, Metadata};

    use crate::layer::observe::record::{DecisionLabel, RuleMetrics};
    use crate::rule::Rule;
    use crate::store::Health;

    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));
    static STORE_DURATION: Key = Key::from_static_name("tollgate_store_duration_seconds");
    static STORE_HEALTH: Key = Key::from_static_name("tollgate_store_health");
    static HELD: Key = Key::from_static_name("tollgate_held_requests");
    pub(super) static HELD_REFUSED: Key = Key::from_static_name("tollgate_held_refused_total");

    /// One limit's keys: `tollgate_decisions_total` per outcome, and its refunds.
    #[derive(Debug)]
    pub(super) struct RuleKeys {
        decisions: [Key; DecisionLabel::NAMES.len()],
        pub(super) refunds: Key,
    }

    impl RuleKeys {
        pub(super) fn new(rule: &Rule) -> Self {
            describe();
            let name = rule.shared_name();
            let decision = |verdict: &'static str| {
                let labels = vec![
                    Label::new("rule", name.clone()),
                    Label::new("outcome", verdict),
                ];
                Key::from_parts("tollgate_decisions_total", labels)
            };
            Self {
                decisions: DecisionLabel::NAMES.map(decision),
                refunds: Key::from_parts(
                    "tollgate_charge_refunds_total",
                    vec![Label::new("rule", name.clone())],
                ),
            }
        }
    }

    /// Describes every metric of the crate, with its unit, to the recorder installed now:
    /// Prometheus's `# HELP` lines. A limit calls it when it is made, so the descriptions
    /// reach the recorder an application installs before it builds its layers.
    fn describe() {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!(
            "tollgate_decisions_total",
            Unit::Count,
            "Decisions per rule of each checked request, by outcome: admitted, delayed, denied, locked (a penalty lock), shadow_denied (a rule in shadow would have denied), denied_by_other (another rule of the batch denied), store_failed (the failure policy decided)."
        );
        describe_histogram!(
            "tollgate_store_duration_seconds",
            Unit::Seconds,
            "How long the store took to decide a batch."
        );
        describe_gauge!(
            "tollgate_store_health",
            "The store's health after its last decision: 0 healthy, 1 degraded (a fallback decides), 2 failing (a circuit breaker is open)."
        );
        describe_gauge!(
            "tollgate_held_requests",
            Unit::Count,
            "Requests the layer holds now (wait mode, leaky-bucket delays)."
        );
        describe_counter!(
            "tollgate_held_refused_total",
            Unit::Count,
            "Delayed requests refused because max_held or max_held_per_key was reached."
        );
        describe_counter!(
            "tollgate_charge_refunds_total",
            Unit::Count,
            "Requests whose units were given back to the rule because their response did not count (Charge)."
        );
        describe_counter!(
            "tollgate_memory_store_evictions_total",
            Unit::Count,
            "Entries an in-process store past its bound (max_keys) forgot to make room for new keys."
        );
    }

    pub(super) fn count(key: &Key) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }

    pub(super) fn decision<'a>(
        rules: impl Iterator<Item = (&'a RuleMetrics, DecisionLabel)>,
        health: Health,
        latency: Duration,
    ) {
        // Health is ordered by severity: 0 healthy, 1 degraded, 2 failing.
        let health = f64::from(health as u8);
        metrics::with_recorder(|r| {
            r.register_histogram(&STORE_DURATION, &METADATA)
                .record(latency.as_secs_f64());
            r.register_gauge(&STORE_HEALTH, &METADATA).set(health);
        });
        for (metrics, verdict) in rules {
            count(&metrics.keys.decisions[verdict as usize]);
        }
    }

    pub(super) fn held(starts: bool) {
        metrics::with_recorder(|r| {
            let gauge = r.register_gauge(&HELD, &METADATA);
            if starts {
                gauge.increment(1.0);
            } else {
                gauge.decrement(1.0);
            }
        });
    }
}
