//! The layer's policy: what a request gets for the store's answer, by the mode and the
//! failure policy: forwarded (with its `RateLimit` headers), held, or rejected.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use smallvec::SmallVec;

use super::batch::{Checked, Kept, LayerBatch};
use super::charge::Charging;
use super::config::{Config, FailurePolicy, Mode};
use super::headers::{retry_after_secs, RateLimitHeaders};
use super::held::{held_keys, Hold, HoldFuture};
use super::observe::record;
use super::response::{Rejection, RejectionKind};
use super::state::LayerState;
use crate::decision::{Decision, Denial, DenyReason, Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::key::RequestHead;
use crate::log::Event;
use crate::rule::Rule;
use crate::store::reservation::{run_detached, Batch};
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

/// Acts on the store's answer according to the mode and the failure policy: the one place
/// a request's fate is decided. The request's head is read only to build a rejection.
pub(crate) fn decide<B, St: Store + Clone>(checked: Checked<St>, request: &Request<B>) -> Next<St> {
    let Checked {
        result,
        health,
        kept,
    } = checked;
    let batch = kept.batch();
    let (config, state, route) = (&*batch.config, &*batch.state, batch.route);
    let head = || RequestHead::from_request(request).with_route(config.route_pattern(route));
    // Read in place: the outcome is large, and nothing here needs it by value.
    let outcome = match &result {
        Ok(outcome) => outcome,
        Err(error) => return store_failed(config, state, error, health, head()),
    };
    // The common case, without the per-rule lists below: an admitted batch of enforced
    // rules only.
    if outcome.decision == Decision::Allow
        && config.mode != Mode::Shadow
        && batch.limits().all(|l| !l.shadow)
    {
        let rules = batch
            .limits()
            .zip(&outcome.rules)
            .map(|(l, o)| (&l.rule, o));
        let enforced = batch.items.len().min(outcome.rules.len());
        let headers = allowed_headers(config, route, enforced, rules);
        return forward(kept, headers);
    }
    let view = View::new(batch, outcome);
    let headers = view.headers();
    if let Decision::Deny(denial) = outcome.decision {
        let rule = view.deciding_rule();
        let retry_after_s = denial.retry_after.map(retry_after_secs);
        if config.mode != Mode::Shadow {
            tracing::debug!(rule, reason = ?denial.reason, retry_after_s, "request rate limited");
            let kind = RejectionKind::Limited(outcome);
            return Next::Reject(reject(config, kind, head(), &view.enforced));
        }
        if let Some(suppressed) = state.log.admit(Event::ShadowDenial) {
            tracing::info!(rule, reason = ?denial.reason, retry_after_s, suppressed, "shadow mode: request would be rate limited");
        }
    }
    drop(view);
    match (outcome.decision, config.mode) {
        (Decision::Deny(_), _) => forward(kept, headers),
        // Shadow mode never holds a request.
        (Decision::Delay(_), Mode::Shadow) | (Decision::Allow, _) => forward(kept, headers),
        (Decision::Delay(delay), _) => hold(kept, outcome, headers, delay, request),
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

/// Forwards the request now. A rule that waits for the release (shadow mode holds nothing)
/// counts it now, on its own; a limit counted by outcome keeps the units until the response
/// says whether they count.
fn forward<St: Store + Clone>(kept: Kept<St>, headers: Option<RateLimitHeaders>) -> Next<St> {
    let Kept::Reserved(batch, Some(mut reservation)) = kept else {
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

/// Holds the request, if the layer's bounds have room for it; without room, it is refused
/// and its reservation, dropped, gives its units back.
fn hold<B, St: Store + Clone>(
    kept: Kept<St>,
    outcome: &Outcome,
    headers: Option<RateLimitHeaders>,
    delay: Duration,
    request: &Request<B>,
) -> Next<St> {
    if let Kept::Reserved(batch, Some(reservation)) = kept {
        let (config, state) = (&batch.config, &batch.state);
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

/// A decided request's rules as the layer reports them: in the log, and in the headers
/// (enforced rules only).
struct View<'a> {
    batch: &'a LayerBatch,
    outcome: &'a Outcome,
    /// Each rule with its outcome, when someone reads them.
    rules: SmallVec<[(&'a Rule, RuleOutcome); 4]>,
    /// The rules clients are told about: a shadow rule, or any rule in shadow mode, is not
    /// theirs to plan around.
    enforced: SmallVec<[(&'a Rule, RuleOutcome); 4]>,
}

impl<'a> View<'a> {
    fn new(batch: &'a LayerBatch, outcome: &'a Outcome) -> Self {
        let config = &*batch.config;
        let denied = !outcome.is_admitted();
        let with_outcomes = batch.limits().zip(&outcome.rules);
        let (mut rules, mut enforced) = (SmallVec::new(), SmallVec::new());
        if denied || config.headers.on_allowed {
            for (limit, o) in with_outcomes.clone() {
                rules.push((&limit.rule, *o));
                if !limit.shadow && config.mode != Mode::Shadow {
                    enforced.push((&limit.rule, *o));
                }
            }
        }
        // A shadow rule that would have denied is logged (in shadow mode a denied batch is
        // logged once, by `decide`).
        let found = with_outcomes
            .clone()
            .find(|(l, o)| l.shadow && !o.decision.is_admitted());
        if let Some((limit, o)) = found.filter(|_| !denied || config.mode != Mode::Shadow) {
            let reason = o.decision.denial().map(|d| d.reason);
            if let Some(suppressed) = batch.state.log.admit(Event::ShadowDenial) {
                let rule = limit.rule.name();
                tracing::info!(
                    rule,
                    ?reason,
                    suppressed,
                    "shadow limit: request would be rate limited"
                );
            }
        }
        Self {
            batch,
            outcome,
            rules,
            enforced,
        }
    }

    /// The name of the enforced rule that decided a denial.
    fn deciding_rule(&self) -> &'a str {
        // In shadow mode no rule is enforced: the deciding one is among them all.
        let rules = match self.batch.config.mode {
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
        let (config, route) = (&self.batch.config, self.batch.route);
        allowed_headers(config, route, self.enforced.len(), items)
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
fn refuse_hold<B>(
    batch: &LayerBatch,
    outcome: &Outcome,
    delay: Duration,
    request: &Request<B>,
) -> Response<Bytes> {
    let route = batch.config.route_pattern(batch.route);
    let head = RequestHead::from_request(request).with_route(route);
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
    // Rules in shadow are not advertised (see `decide`).
    let rules: SmallVec<[(&Rule, RuleOutcome); 4]> = batch
        .limits()
        .zip(&refused.rules)
        .filter(|(limit, _)| !limit.shadow)
        .map(|(limit, o)| (&limit.rule, *o))
        .collect();
    reject(
        &batch.config,
        RejectionKind::Limited(&refused),
        head,
        &rules,
    )
}
