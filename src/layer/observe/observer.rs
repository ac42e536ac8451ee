//! The seam for what watches the layer's decisions from outside the crate: a dashboard, an
//! audit log, an exporter of its own (the operator's view, `tollgate-admin`, is one).

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::decision::RuleOutcome;
use crate::log::Event;
use crate::rule::Rule;
use crate::stored::StoredKey;

/// Watches each rule's decision of every request a layer checks; set with
/// [`RateLimitLayerBuilder::observe`](crate::layer::RateLimitLayerBuilder::observe).
///
/// Every method has a default that does nothing, so an observer implements what it reads
/// and keeps compiling when a method is added. It is called on the request's path, after
/// the store decided and before the request goes on: keep it short (count, push to a
/// channel), never block. A panic in it is caught and logged (`tracing::error!`, at most
/// once per interval), and the request goes on as decided; an observer whose state a
/// panic leaves half-written sees the next decision with it (in a build with
/// `panic = "abort"`, a panic aborts the process as anywhere). Requests whose store failed are not observed (the
/// [`FailurePolicy`](crate::layer::FailurePolicy) decided them, not a rule).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate::layer::{DecisionObserver, Limit, RateLimitLayer, RuleDecision};
/// use tollgate::{key, Rule};
///
/// #[derive(Default)]
/// struct Denials(AtomicU64);
///
/// impl DecisionObserver for Denials {
///     fn on_rule(&self, decision: &RuleDecision<'_>) {
///         if !decision.outcome.decision.is_admitted() {
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
    /// One rule's decision of a request: called for each rule of the request's batch, in
    /// order, once the store decided.
    fn on_rule(&self, decision: &RuleDecision<'_>) {
        let _ = decision;
    }
}

impl<T: DecisionObserver + ?Sized> DecisionObserver for Arc<T> {
    fn on_rule(&self, decision: &RuleDecision<'_>) {
        (**self).on_rule(decision);
    }
}

/// One rule's decision of one request, as a [`DecisionObserver`] sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct RuleDecision<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The request's key under this rule, in the form the store keeps it: a key over 128
    /// bytes is its digest, so an observer keeping keys keeps at most 33 bytes of each,
    /// and [`Limiter::peek_stored`](crate::Limiter::peek_stored) and
    /// [`reset_stored`](crate::Limiter::reset_stored) reach its state.
    pub key: StoredKey<'a>,
    /// What the rule decided. In a batch another rule denied, a rule that would have
    /// admitted says `Allow` here but consumed nothing (see `batch_admitted`).
    pub outcome: &'a RuleOutcome,
    /// Whether the request's batch was admitted (allowed or delayed) by all its rules.
    pub batch_admitted: bool,
    /// Whether the rule was checked in shadow, so that its denial was not enforced: a
    /// [`Limit::shadow`](crate::layer::Limit::shadow), or any rule in
    /// [`Mode::Shadow`](crate::layer::Mode::Shadow).
    pub shadow: bool,
}

/// The observers of a layer, in the order they were set.
#[derive(Clone, Default)]
pub(crate) struct Observers(pub(crate) Box<[Arc<dyn DecisionObserver>]>);

impl Observers {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Tells every observer, each on its own: one that panics is logged and passed over,
    /// and the request goes on as decided (an observer watches; it never takes a request
    /// down, nor keeps the next observer from seeing it).
    pub(crate) fn notify(&self, decision: &RuleDecision<'_>) {
        for observer in self.0.iter() {
            let told = catch_unwind(AssertUnwindSafe(|| observer.on_rule(decision)));
            if told.is_err() {
                observer_panicked(decision.rule);
            }
        }
    }
}

#[cold]
fn observer_panicked(rule: &Rule) {
    if let Some(suppressed) = crate::reservation::process_log().admit(Event::ObserverPanic) {
        tracing::error!(
            rule = rule.name(),
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
