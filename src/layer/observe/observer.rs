//! The one seam through which a layer's decisions are watched.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::record::{self, DecisionLabel, RuleMetrics};
use crate::decision::{Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::log::Event;
use crate::rule::Rule;
use crate::store::Health;
use crate::stored::StoredKey;

/// Watches every decision of a layer; added with
/// [`RateLimitLayerBuilder::observe`](crate::layer::RateLimitLayerBuilder::observe).
///
/// It is told once per store answer (failures included): when a request is checked, and
/// again for the rules that count a held request at its release. It runs on the request's
/// path: keep it short (count, push to a channel), never block. A panic in it is caught and
/// logged (at most once per interval) and the request goes on as decided; the observer sees
/// the next decision with whatever state the panic left (`panic = "abort"` aborts as anywhere).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate::layer::{DecisionEvent, DecisionObserver, Limit, RateLimitLayer};
/// use tollgate::{key, Rule};
///
/// #[derive(Default)]
/// struct Denials(AtomicU64);
///
/// impl DecisionObserver for Denials {
///     fn on_decision(&self, event: &DecisionEvent<'_>) {
///         if event.outcome.is_ok_and(|o| !o.is_admitted()) {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let denials = Arc::new(Denials::default());
/// let layer = RateLimitLayer::builder()
///     .limit(Limit::new(Rule::fixed_window("api", 100, Duration::from_secs(60)), key::global()))
///     .observe(denials.clone())
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
pub trait DecisionObserver: Send + Sync + 'static {
    /// A request's batch was decided, or its store failed.
    fn on_decision(&self, event: &DecisionEvent<'_>);
}

impl<T: DecisionObserver + ?Sized> DecisionObserver for Arc<T> {
    fn on_decision(&self, event: &DecisionEvent<'_>) {
        (**self).on_decision(event);
    }
}

/// A decision, as a [`DecisionObserver`] sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct DecisionEvent<'a> {
    /// The route-table pattern the request matched, if any.
    pub route: Option<&'a str>,
    /// The store's answer for the batch; `Err` when the store failed, and the
    /// [`FailurePolicy`](crate::layer::FailurePolicy) decided, not a rule.
    pub outcome: Result<&'a Outcome, &'a StoreError>,
    /// Each rule of the batch, in order.
    pub rules: &'a [RuleDecision<'a>],
    /// The store's health when it answered: [`Health::Degraded`] means a
    /// [`Fallback`](crate::store::Fallback)'s local store decided (its circuit breaker
    /// open, or Redis failing).
    pub health: Health,
    /// How long the store took to answer.
    pub store_latency: Duration,
}

/// One rule's decision of one request, as a [`DecisionEvent`] lists it.
#[derive(Debug)]
#[non_exhaustive]
pub struct RuleDecision<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The request's key under this rule as the store keeps it (a key over 128 bytes is its
    /// 33-byte digest), which [`Limiter::peek`](crate::Limiter::peek) and
    /// [`reset`](crate::Limiter::reset) take.
    pub key: StoredKey<'a>,
    /// What the rule decided; `None` when the store failed. In a batch another rule
    /// denied, a rule that would have admitted says `Allow` here but consumed nothing (see
    /// `batch_admitted`).
    pub outcome: Option<&'a RuleOutcome>,
    /// Whether the request's batch was admitted (allowed or delayed) by all its rules.
    pub batch_admitted: bool,
    /// Whether the rule was checked in shadow, so that its denial was not enforced: a
    /// [`Limit::shadow`](crate::layer::Limit::shadow), or any rule in
    /// [`Mode::Shadow`](crate::layer::Mode::Shadow).
    pub shadow: bool,
    /// The limit's metric keys, for the `metrics` feature's observer.
    pub(crate) metrics: &'a RuleMetrics,
}

/// The observers of a layer: the `metrics` feature's first, then the layer's, in the order
/// they were added.
#[derive(Clone)]
pub(crate) struct Observers(Vec<Arc<dyn DecisionObserver>>);

impl Default for Observers {
    fn default() -> Self {
        let metrics = record::ENABLED.then(|| Arc::new(Metrics) as Arc<dyn DecisionObserver>);
        Self(metrics.into_iter().collect())
    }
}

impl Observers {
    pub(crate) fn add(&mut self, observer: impl DecisionObserver) {
        self.0.push(Arc::new(observer));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Tells every observer; one that panics is logged and passed over, never taking the
    /// request down nor hiding it from the next observer.
    pub(crate) fn notify(&self, event: &DecisionEvent<'_>) {
        for observer in self.0.iter() {
            let told = catch_unwind(AssertUnwindSafe(|| observer.on_decision(event)));
            if told.is_err() {
                observer_panicked(event.route);
            }
        }
    }
}

/// Records each decision as metrics (see `record`).
struct Metrics;

impl DecisionObserver for Metrics {
    fn on_decision(&self, event: &DecisionEvent<'_>) {
        let rules = event.rules.iter().map(|rule| {
            let decision = rule.outcome.map(|outcome| outcome.decision);
            let verdict = DecisionLabel::of(rule.shadow, !rule.batch_admitted, decision);
            (rule.metrics, verdict)
        });
        record::decision(rules, event.health, event.store_latency);
    }
}

#[cold]
fn observer_panicked(route: Option<&str>) {
    if let Some(suppressed) = crate::log::process_log().admit(Event::ObserverPanic) {
        tracing::error!(
            route,
            suppressed,
            "a decision observer panicked: passed over, the request goes on as decided"
        );
    }
}

impl fmt::Debug for Observers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} observer(s)", self.0.len())
    }
}
