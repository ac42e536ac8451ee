//! The layer's policy: what a request gets for the store's answer, by the mode and the
//! failure policy: forwarded (with its `RateLimit` headers), held, or rejected.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use smallvec::SmallVec;

use super::batch::{Checked, LayerBatch};
use super::charge::Charging;
use super::config::{Config, DecisionEvent, FailurePolicy, Mode};
use super::headers::{retry_after_secs, RateLimitHeaders};
use super::held::{held_keys, Hold, HoldFuture};
use super::observe::record;
use super::response::{Rejection, RejectionKind};
use super::state::LayerState;
use crate::decision::{Decision, Denial, DenyReason, Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::key::RequestHead;
use crate::log::Event;
use crate::reservation::{run_detached, Batch, Reservation};
use crate::rule::Rule;
use crate::store::{Health, Store};

/// What to do with a checked request.
pub(crate) enum Next<St: Store + Clone> {
    /// Forward it now.
    Forward {
        headers: Option<RateLimitHeaders>,
        /// For a limit that waits for the response (a charge, a settled cost): settled with
        /// the response's head.
        charge: Option<Charging<St>>,
    },
    /// Hold it, then decide again.
    Hold(HoldFuture<St>),
    Reject(Response<Bytes>),
}

/// The rejection response, from the layer's function or the default.
pub(crate) fn reject(
    config: &Config,
    kind: RejectionKind<'_>,
    request: RequestHead<'_>,
    rules: &[(&Rule, RuleOutcome)],
) -> Response<Bytes> {
    let rejection = Rejection::new(kind, request, rules, config.headers.legacy);
    match &config.on_reject {
        Some(f) => f(&rejection),
        None => rejection.default_response(),
    }
}

/// Acts on the store's answer according to the mode and the failure policy. The request's
/// head is read only to build a rejection.
pub(crate) fn decide<B, St: Store + Clone>(
    config: &Config,
    state: &LayerState,
    checked: Checked<St>,
    request: &Request<B>,
) -> Next<St> {
    let Checked {
        result,
        route,
        limits,
        reservation,
        batch,
        health,
        store_latency,
    } = checked;
    let head = || RequestHead::from_request(request).with_route(config.route_pattern(route));
    // Read in place: the outcome is large, and nothing here needs it by value.
    let outcome = match &result {
        Ok(outcome) => outcome,
        Err(error) => return store_failed(config, state, error, health, head()),
    };
    let held = Held { reservation, batch };
    // The common case, without the per-rule lists below: an admitted batch of enforced
    // rules only, and no hook to tell.
    if outcome.decision == Decision::Allow
        && config.mode != Mode::Shadow
        && config.on_decision.is_none()
        && limits
            .iter()
            .all(|&i| config.limit(route, i).is_some_and(|l| !l.shadow))
    {
        let rules = limits
            .iter()
            .zip(&outcome.rules)
            .filter_map(|(&i, o)| Some((&config.limit(route, i)?.rule, o)));
        let enforced = limits.len().min(outcome.rules.len());
        let headers = allowed_headers(config, route, enforced, rules);
        return held.forward(headers);
    }
    let view = View::new(config, state, route, &limits, outcome);
    view.tell(health, store_latency);
    let headers = || view.headers();
    match (outcome.decision, config.mode) {
        (Decision::Deny(denial), mode) => {
            let rule = view.deciding_rule();
            let retry_after_s = denial.retry_after.map(retry_after_secs);
            if mode == Mode::Shadow {
                if let Some(suppressed) = state.log.admit(Event::ShadowDenial) {
                    tracing::info!(rule, reason = ?denial.reason, retry_after_s, suppressed, "shadow mode: request would be rate limited");
                }
                return held.forward(headers());
            }
            tracing::debug!(rule, reason = ?denial.reason, retry_after_s, "request rate limited");
            let kind = RejectionKind::Limited(outcome);
            Next::Reject(reject(config, kind, head(), &view.enforced))
        }
        // Shadow mode never holds a request.
        (Decision::Delay(_), Mode::Shadow) | (Decision::Allow, _) => held.forward(headers()),
        (Decision::Delay(delay), _) => match held.hold(config, outcome, headers()) {
            Some(hold) => Next::Hold(hold),
            None => {
                tracing::debug!(?delay, "too many held requests: request refused");
                record::held_refused();
                Next::Reject(refuse_hold(config, outcome, route, &limits, delay, head()))
            }
        },
    }
}

/// The answer when the store failed: the failure policy's, logged through the layer's log.
fn store_failed<St: Store + Clone>(
    config: &Config,
    state: &LayerState,
    error: &StoreError,
    health: Health,
    head: RequestHead<'_>,
) -> Next<St> {
    if let Some(suppressed) = state.log.admit_store_failure(error) {
        tracing::warn!(%error, policy = ?config.on_failure, %health, suppressed, "rate limit store failed");
    }
    match config.on_failure {
        FailurePolicy::FailClosed if config.mode != Mode::Shadow => {
            Next::Reject(reject(config, RejectionKind::StoreUnavailable, head, &[]))
        }
        // Fail open; a fallback the store could not give (see `FailurePolicy`); and shadow
        // mode, which never refuses.
        _ => Next::Forward {
            headers: None,
            charge: None,
        },
    }
}

/// An admitted request's reservation, if the layer made one.
struct Held<St: Store + Clone> {
    reservation: Option<Box<Reservation<St>>>,
    batch: Option<Arc<LayerBatch>>,
}

impl<St: Store + Clone> Held<St> {
    /// Forwards the request now. A rule that waits for the release (shadow mode holds
    /// nothing) counts it now, on its own; a limit counted by outcome keeps the units until
    /// the response says whether they count.
    fn forward(self, headers: Option<RateLimitHeaders>) -> Next<St> {
        let (Some(mut reservation), Some(batch)) = (self.reservation, self.batch) else {
            return Next::Forward {
                headers,
                charge: None,
            };
        };
        if reservation.pending().next().is_some() {
            // At once on a store that answers at once, so that the next request sees them.
            reservation.release_now();
            run_detached(async move {
                drop(reservation.confirm().await);
            });
            return Next::Forward {
                headers,
                charge: None,
            };
        }
        reservation.pass();
        let charge = Charging::new(reservation, batch);
        Next::Forward { headers, charge }
    }

    /// Holds the request, if the layer's bounds have room for it; without room, its
    /// reservation is dropped and gives its units back.
    fn hold(
        self,
        config: &Config,
        outcome: &Outcome,
        headers: Option<RateLimitHeaders>,
    ) -> Option<HoldFuture<St>> {
        let (reservation, batch) = (self.reservation?, self.batch?);
        let state = &batch.state;
        let keys = held_keys(&state.held, &batch.checks(), outcome);
        let slot = state.held.try_hold(&config.held, keys)?;
        let hold = Hold {
            reservation,
            slot,
            headers,
            batch,
        };
        Some(hold.release())
    }
}

/// A decided request's rules as the layer reports them: to the hook, in the log, and in
/// the headers (enforced rules only).
struct View<'a> {
    config: &'a Config,
    state: &'a LayerState,
    route: Option<usize>,
    outcome: &'a Outcome,
    /// Each rule with its outcome, when someone reads them.
    rules: SmallVec<[(&'a Rule, RuleOutcome); 4]>,
    /// Whether each rule of the batch is in shadow.
    shadow: SmallVec<[bool; 4]>,
    /// The rules clients are told about: a shadow rule, or any rule in shadow mode, is not
    /// theirs to plan around.
    enforced: SmallVec<[(&'a Rule, RuleOutcome); 4]>,
}

impl<'a> View<'a> {
    fn new(
        config: &'a Config,
        state: &'a LayerState,
        route: Option<usize>,
        limits: &[usize],
        outcome: &'a Outcome,
    ) -> Self {
        let denied = !outcome.is_admitted();
        let rules: SmallVec<[(&Rule, RuleOutcome); 4]> =
            if denied || config.on_decision.is_some() || config.headers.on_allowed {
                limits
                    .iter()
                    .zip(&outcome.rules)
                    .filter_map(|(&i, o)| Some((&config.limit(route, i)?.rule, *o)))
                    .collect()
            } else {
                SmallVec::new()
            };
        let shadow: SmallVec<[bool; 4]> = limits
            .iter()
            .map(|&i| config.limit(route, i).is_some_and(|l| l.shadow))
            .collect();
        let enforced = if config.mode == Mode::Shadow {
            SmallVec::new()
        } else {
            rules
                .iter()
                .zip(&shadow)
                .filter(|(_, &s)| !s)
                .map(|(r, _)| *r)
                .collect()
        };
        let view = Self {
            config,
            state,
            route,
            outcome,
            rules,
            shadow,
            enforced,
        };
        view.log_shadow_denial(limits);
        view
    }

    /// A shadow rule that would have denied is logged (in shadow mode a denied batch is
    /// logged once, by `decide`).
    fn log_shadow_denial(&self, limits: &[usize]) {
        let (config, outcome) = (self.config, self.outcome);
        if !outcome.is_admitted() && config.mode == Mode::Shadow {
            return;
        }
        let found = self
            .shadow
            .iter()
            .zip(limits)
            .zip(&outcome.rules)
            .find(|((&s, _), o)| s && !o.decision.is_admitted());
        if let Some(((_, &i), o)) = found {
            let rule = config.limit(self.route, i).map_or("", |l| l.rule.name());
            let reason = o.decision.denial().map(|d| d.reason);
            if let Some(suppressed) = self.state.log.admit(Event::ShadowDenial) {
                tracing::info!(
                    rule,
                    ?reason,
                    suppressed,
                    "shadow limit: request would be rate limited"
                );
            }
        }
    }

    /// Tells the layer's `on_decision` hook, if any.
    fn tell(&self, health: Health, store_latency: Option<Duration>) {
        if let Some(hook) = &self.config.on_decision {
            hook(&DecisionEvent {
                outcome: self.outcome,
                rules: &self.rules,
                shadow: &self.shadow,
                mode: self.config.mode,
                route: self.config.route_pattern(self.route),
                health,
                store_latency,
            });
        }
    }

    /// The name of the enforced rule that decided a denial.
    fn deciding_rule(&self) -> &'a str {
        // In shadow mode no rule is enforced: the deciding one is among them all.
        let rules = match self.config.mode {
            Mode::Shadow => &self.rules,
            _ => &self.enforced,
        };
        rules
            .iter()
            .find(|(_, o)| o.decision == self.outcome.decision)
            .map_or("", |(r, _)| r.name())
    }

    fn headers(&self) -> Option<RateLimitHeaders> {
        let items = self.enforced.iter().map(|(r, o)| (*r, o));
        allowed_headers(self.config, self.route, self.enforced.len(), items)
    }
}

/// The headers of a forwarded request, if the layer sends them on admitted responses: the
/// `enforced` rules of its batch (none in shadow) with their outcomes.
fn allowed_headers<'a>(
    config: &Config,
    route: Option<usize>,
    enforced: usize,
    rules: impl Iterator<Item = (&'a Rule, &'a RuleOutcome)> + Clone,
) -> Option<RateLimitHeaders> {
    (config.headers.on_allowed && enforced > 0).then(|| {
        let policy = config.policy(route, enforced);
        RateLimitHeaders::new(rules, policy, config.headers.legacy, None)
    })
}

/// The rejection of a delayed request the layer has no room to hold: a denial, each
/// delaying rule's wait its retry-after, as if the rule had denied.
fn refuse_hold(
    config: &Config,
    outcome: &Outcome,
    route: Option<usize>,
    limits: &[usize],
    delay: Duration,
    head: RequestHead<'_>,
) -> Response<Bytes> {
    let deny = |wait| {
        Decision::Deny(Denial {
            reason: DenyReason::Limited,
            retry_after: Some(wait),
        })
    };
    let refused = Outcome {
        decision: deny(delay),
        rules: outcome
            .rules
            .iter()
            .map(|r| match r.decision {
                Decision::Delay(wait) => RuleOutcome {
                    decision: deny(wait),
                    ..*r
                },
                _ => *r,
            })
            .collect(),
        admission: None,
    };
    let rules: SmallVec<[(&Rule, RuleOutcome); 4]> = limits
        .iter()
        .zip(&refused.rules)
        .filter_map(|(&i, o)| {
            let limit = config.limit(route, i)?;
            // Rules in shadow are not advertised (see `decide`).
            (!limit.is_shadow()).then_some((&limit.rule, *o))
        })
        .collect();
    reject(config, RejectionKind::Limited(&refused), head, &rules)
}
