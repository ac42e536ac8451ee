//! The layer's policy: what a request gets for the store's answer, by the mode and the
//! failure policy: forwarded (with its `RateLimit` headers), held, or rejected.

use std::borrow::BorrowMut;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use smallvec::SmallVec;

use super::batch::{Checked, Kept, LayerBatch};
use super::charge::{Charging, Outbound};
use super::config::{Config, FailurePolicy, Mode};
use super::headers::{retry_after_secs, RateLimitHeaders};
use super::held::{held_keys, Hold, HoldFuture};
use super::observe::record;
use super::response::{Rejection, RejectionKind};
use super::state::LayerState;
use crate::clock::duration_to_micros;
use crate::decision::{Decision, DenyReason, Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::key::RequestHead;
use crate::log::Event;
use crate::rule::Rule;
use crate::store::batch::deny;
use crate::store::reservation::{run_detached, Batch};
use crate::store::{Health, Store};

/// What to do with a checked request.
pub(crate) enum Next<St: Store + Clone> {
    /// Forward it now.
    Forward(Outbound<St>),
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
    let rejection = Rejection::new(kind, request, rules, config.legacy_headers);
    match &config.on_reject {
        Some(f) => f(&rejection),
        None => rejection.default_response(),
    }
}

/// Acts on the store's answer, borrowed (a move is a copy), by the mode and the failure policy:
/// the one place a request's fate is decided; the request's head is read only for a rejection.
pub(crate) fn decide<B, St: Store + Clone, K: BorrowMut<LayerBatch>>(
    answer: &mut Checked<St, K>,
    req: &Request<B>,
) -> Next<St> {
    let (result, health, kept) = (&answer.result, answer.health, &mut answer.kept);
    let batch = kept.batch();
    let (config, state, route) = (batch.config(), batch.state(), batch.route);
    let head = || RequestHead::from_request(req).with_route(config.route_pattern(route));
    // Read in place: the outcome is large, and nothing here needs it by value.
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => return store_failed(config, state, error, health, head()),
    };
    let shadow_mode = config.mode == Mode::Shadow;
    let rules = batch.limits().zip(&outcome.rules);
    // The rules clients are told about: a shadow rule, or any rule in shadow mode, is not
    // theirs to plan around.
    let enforced = rules.clone().filter(|(l, _)| !l.shadow && !shadow_mode);
    let enforced = enforced.map(|(l, o)| (&l.rule, o));
    if config.derived(route).is_none_or(|d| d.shadow) {
        log_shadow_limit_denial(batch, outcome);
    }
    if let Decision::Deny(denial) = outcome.decision {
        // The rule that decided: an enforced one, or in shadow mode any.
        let deciding = rules
            .clone()
            .find(|(l, o)| (shadow_mode || !l.shadow) && o.decision == outcome.decision);
        let rule = deciding.map_or("", |(l, _)| l.rule.name());
        let retry_after_s = denial.retry_after.map(retry_after_secs);
        if !shadow_mode {
            tracing::debug!(rule, reason = ?denial.reason, retry_after_s, "request rate limited");
            let told: SmallVec<[(&Rule, RuleOutcome); 4]> =
                enforced.map(|(r, o)| (r, *o)).collect();
            let kind = RejectionKind::Limited(outcome);
            return Next::Reject(reject(config, kind, head(), &told));
        }
        if let Some(suppressed) = state.log.admit(Event::ShadowDenial) {
            tracing::info!(rule, reason = ?denial.reason, retry_after_s, suppressed, "shadow mode: request would be rate limited");
        }
    }
    let headers = allowed_headers(config, route, enforced);
    drop(rules);
    match outcome.decision {
        // Shadow mode never holds a request.
        Decision::Delay(delay) if !shadow_mode => hold(kept, outcome, headers, delay, req),
        _ => forward(kept, headers),
    }
}

/// A shadow limit that would have denied is logged (in shadow mode a denied batch is logged
/// once, by `decide`); called on a route with a shadow limit only.
fn log_shadow_limit_denial(batch: &LayerBatch, outcome: &Outcome) {
    let config = batch.config();
    let denied_in_shadow_mode = !outcome.is_admitted() && config.mode == Mode::Shadow;
    let mut rules = batch.limits().zip(&outcome.rules);
    let found = rules.find(|(l, o)| l.shadow && !o.decision.is_admitted());
    let Some((limit, o)) = found.filter(|_| !denied_in_shadow_mode) else {
        return;
    };
    let reason = o.decision.denial().map(|d| d.reason);
    if let Some(suppressed) = batch.state().log.admit(Event::ShadowDenial) {
        let rule = limit.rule.name();
        tracing::info!(
            rule,
            ?reason,
            suppressed,
            "shadow limit: request would be rate limited"
        );
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
        _ => Next::Forward(Outbound::headers(None)),
    }
}

/// Forwards the request now. A rule that waits for the release (shadow mode holds nothing)
/// counts it now, on its own; a limit counted by outcome keeps the units until the response
/// says whether they count.
fn forward<St: Store + Clone, K: BorrowMut<LayerBatch>>(
    kept: &mut Kept<St, K>,
    headers: Option<RateLimitHeaders>,
) -> Next<St> {
    let Some((batch, mut reservation)) = kept.take_reserved() else {
        return Next::Forward(Outbound::headers(headers));
    };
    if reservation.pending().next().is_some() {
        // At once on a store that answers at once, so that the next request sees them.
        reservation.release_now();
        run_detached(async move {
            drop(reservation.confirm().await);
        });
        return Next::Forward(Outbound::headers(headers));
    }
    reservation.pass();
    let charge = Charging::new(reservation, batch);
    Next::Forward(Outbound { headers, charge })
}

/// Holds the request, if the layer's bounds have room for it; without room, it is refused
/// and its reservation, dropped, gives its units back.
fn hold<B, St: Store + Clone, K: BorrowMut<LayerBatch>>(
    kept: &mut Kept<St, K>,
    outcome: &Outcome,
    headers: Option<RateLimitHeaders>,
    delay: Duration,
    request: &Request<B>,
) -> Next<St> {
    if let Some((batch, reservation)) = kept.take_reserved() {
        let (config, state) = (batch.config(), batch.state());
        let keys = held_keys(&state.held, &batch.checks(), outcome);
        if let Some(slot) = state.held.try_hold(&config.held, keys) {
            let hold = Hold {
                reservation,
                slot,
                headers,
                batch,
            };
            return Next::Hold(hold.release());
        }
        drop(reservation);
        tracing::debug!(?delay, "too many held requests: request refused");
        record::held_refused();
        return Next::Reject(refuse_hold(&batch, outcome, delay, request));
    }
    // Not reserved: nothing to hold it with.
    Next::Reject(refuse_hold(kept.batch(), outcome, delay, request))
}

/// The headers of a forwarded request, if the layer sends them on admitted responses: the
/// `enforced` rules of its batch (none in shadow) with their outcomes.
fn allowed_headers<'a>(
    config: &Config,
    route: Option<usize>,
    enforced: impl Iterator<Item = (&'a Rule, &'a RuleOutcome)> + Clone,
) -> Option<RateLimitHeaders> {
    let cached = |count| config.policy(route, count).cloned();
    let legacy = config.legacy_headers;
    config
        .headers_on_allowed
        .then(|| RateLimitHeaders::new(enforced, cached, legacy, None))?
}

/// The rejection of a delayed request the layer has no room to hold: a denial, each
/// delaying rule's wait its retry-after, as if the rule had denied.
fn refuse_hold<B>(
    batch: &LayerBatch,
    outcome: &Outcome,
    delay: Duration,
    request: &Request<B>,
) -> Response<Bytes> {
    let route = batch.config().route_pattern(batch.route);
    let head = RequestHead::from_request(request).with_route(route);
    let denied = |wait| deny(DenyReason::Limited, Some(duration_to_micros(wait)));
    let refused = Outcome {
        decision: denied(delay),
        rules: outcome
            .rules
            .iter()
            .map(|r| match r.decision {
                Decision::Delay(wait) => RuleOutcome {
                    decision: denied(wait),
                    ..*r
                },
                _ => *r,
            })
            .collect(),
        admission: None,
    };
    // Rules in shadow are not advertised (see `decide`).
    let rules: SmallVec<[(&Rule, RuleOutcome); 4]> = batch
        .limits()
        .zip(&refused.rules)
        .filter(|(limit, _)| !limit.shadow)
        .map(|(limit, o)| (&limit.rule, *o))
        .collect();
    reject(
        batch.config(),
        RejectionKind::Limited(&refused),
        head,
        &rules,
    )
}
