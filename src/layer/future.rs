//! [`ResponseFuture`]: check with the store, maybe wait, then forward or reject.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use smallvec::SmallVec;
use tokio::time::Sleep;
use tower_service::Service;

use super::body::RateLimitBody;
use super::charge::Settle;
use super::config::{Config, DecisionEvent, FailurePolicy, HeldSlot, Mode};
use super::headers::{retry_after_secs, RateLimitHeaders};
use super::log::Event;
use super::observe;
use super::response::{Rejection, RejectionKind};
use crate::decision::{Decision, Denial, DenyReason, Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::key::RequestHead;
use crate::rule::Rule;
use crate::store::Health;

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

/// The store's answer for a request's batch.
pub(crate) struct Checked {
    pub(crate) result: Result<Outcome, StoreError>,
    pub(crate) route: Option<usize>,
    /// The index (among the request's limits) of each item of the batch, in order.
    pub(crate) limits: SmallVec<[usize; 4]>,
    /// For a delayed request the layer may hold: how to give its units back, and what it
    /// counts under.
    pub(crate) to_hold: Option<ToHold>,
    /// The store's health right after it answered.
    pub(crate) health: Health,
    /// For an admitted request with a limit that counts by outcome: what to give back once
    /// the response's status is known.
    pub(crate) settle: Option<Settle>,
    /// How long the store took, if timed (see `observe`).
    pub(crate) store_latency: Option<Duration>,
}

pub(crate) type CheckFuture = Pin<Box<dyn Future<Output = Checked> + Send>>;

/// Gives back the units of a held request (`Store::refund`); built with the request's batch,
/// run only if the request is dropped before its release.
pub(crate) type RefundFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What holding a delayed request takes.
#[derive(Default)]
pub(crate) struct ToHold {
    /// `None` when the store recorded nothing to give back.
    pub(crate) refund: Option<RefundFuture>,
    /// What it counts under for `max_held_per_key`: each (rule, key) that delays it.
    pub(crate) keys: SmallVec<[u64; 4]>,
    /// For a batch with rules left to the release (`Outcome::needs_confirmation`): the
    /// store call that counts them, run when the hold is over.
    pub(crate) confirm: Option<Confirm>,
}

/// The confirmation of a held request at its release (`Limiter::confirm`), and the
/// configuration to act on its answer with.
pub(crate) struct Confirm {
    pub(crate) check: CheckFuture,
    pub(crate) config: Arc<Config>,
}

/// A held request's claim: its reserved units, given back if it is dropped before its
/// release (once: the refund is taken when it runs or when the request is released), its
/// place under the layer's bounds, freed either way, and what confirms it at its release.
pub(crate) struct Hold {
    refund: Option<RefundFuture>,
    confirm: Option<Confirm>,
    _slot: HeldSlot,
}

impl Hold {
    /// The request passes: its units are spent, its place is free.
    fn release(mut self) {
        self.refund = None;
    }

    /// The hold is over and the rules left to the release are being counted: from here the
    /// confirmation gives back what the request took if it is denied, and a request dropped
    /// meanwhile keeps its units taken (never a second refund of the same units). Its place
    /// is kept until the confirmation answers.
    fn confirming(&mut self) -> Option<Confirm> {
        let confirm = self.confirm.take()?;
        self.refund = None;
        Some(confirm)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(refund) = self.refund.take() {
            give_back(refund);
        }
    }
}

/// Runs a refund from synchronous code: an in-process store answers on the first poll;
/// another store's call finishes as a task on the runtime. Best effort: without a runtime
/// (a future dropped outside one) the units stay taken.
pub(super) fn give_back(mut refund: RefundFuture) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!("no tokio runtime here: a dropped held request's units stay taken");
        return;
    };
    let mut cx = Context::from_waker(Waker::noop());
    if refund.as_mut().poll(&mut cx).is_pending() {
        drop(runtime.spawn(refund));
    }
}

/// The request and the inner service to call with it: for a request forwarded at once, the
/// one driven to readiness; for a held one, a clone that is driven to readiness after the
/// hold.
struct Pending<S, ReqB> {
    request: Request<ReqB>,
    inner: S,
}

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit): asks the store, then forwards the
    /// request (after holding it, for a delay), or answers with the rejection.
    pub struct ResponseFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Checking {
            check: CheckFuture,
            pending: Option<Pending<S, ReqB>>,
            config: Arc<Config>,
        },
        Delayed {
            delay: Duration,
            pending: Option<Pending<S, ReqB>>,
            headers: Option<RateLimitHeaders>,
            hold: Option<Hold>,
            settle: Option<Settle>,
        },
        Sleeping {
            #[pin]
            sleep: Sleep,
            pending: Option<Pending<S, ReqB>>,
            headers: Option<RateLimitHeaders>,
            hold: Option<Hold>,
            settle: Option<Settle>,
        },
        // The hold is over; the rules left to the release count the request now.
        Confirming {
            check: CheckFuture,
            config: Arc<Config>,
            pending: Option<Pending<S, ReqB>>,
            hold: Option<Hold>,
        },
        Readying {
            pending: Option<Pending<S, ReqB>>,
            headers: Option<RateLimitHeaders>,
            settle: Option<Settle>,
        },
        Forwarding {
            #[pin]
            future: S::Future,
            headers: Option<RateLimitHeaders>,
            // Given the response's status: what of its units to give back.
            settle: Option<Settle>,
        },
        Rejected {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn checking(
        check: CheckFuture,
        request: Request<ReqB>,
        inner: S,
        config: Arc<Config>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                pending: Some(Pending { request, inner }),
                config,
            },
        }
    }

    /// Decided at once, to be held for `delay`; the timer starts on the first poll, inside
    /// the runtime. `inner` is not ready yet: it is driven to readiness after the hold.
    pub(crate) fn delayed(
        delay: Duration,
        request: Request<ReqB>,
        inner: S,
        headers: Option<RateLimitHeaders>,
        hold: Option<Hold>,
        settle: Option<Settle>,
    ) -> Self {
        Self {
            state: State::Delayed {
                delay,
                pending: Some(Pending { request, inner }),
                headers,
                hold,
                settle,
            },
        }
    }

    pub(crate) fn forwarding(
        future: S::Future,
        headers: Option<RateLimitHeaders>,
        settle: Option<Settle>,
    ) -> Self {
        Self {
            state: State::Forwarding {
                future,
                headers,
                settle,
            },
        }
    }

    pub(crate) fn rejected(response: Response<Bytes>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
{
    type Output = Result<Response<RateLimitBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking {
                    check,
                    pending,
                    config,
                } => {
                    let checked = ready!(check.as_mut().poll(cx));
                    let Pending { request, mut inner } =
                        pending.take().expect(POLLED_AFTER_COMPLETION);
                    let next = decide(config, checked, &request);
                    match next {
                        Next::Reject(response) => state.set(State::Rejected {
                            response: Some(response),
                        }),
                        Next::Forward {
                            delay,
                            headers,
                            settle,
                            ..
                        } if delay.is_zero() => {
                            let future = inner.call(request);
                            state.set(State::Forwarding {
                                future,
                                headers,
                                settle,
                            });
                        }
                        Next::Forward {
                            delay,
                            headers,
                            hold,
                            settle,
                        } => {
                            // The ready service may hold a permit (`ConcurrencyLimit`,
                            // `Buffer`): keeping it through the hold would let held requests
                            // take every permit. Hold an idle clone; give the ready one up.
                            let idle = inner.clone();
                            drop(inner);
                            state.set(State::Sleeping {
                                sleep: tokio::time::sleep(delay),
                                pending: Some(Pending {
                                    request,
                                    inner: idle,
                                }),
                                headers,
                                hold,
                                settle,
                            });
                        }
                    }
                }
                StateProj::Delayed {
                    delay,
                    pending,
                    headers,
                    hold,
                    settle,
                } => {
                    let (delay, pending, headers, hold, settle) = (
                        *delay,
                        pending.take(),
                        headers.take(),
                        hold.take(),
                        settle.take(),
                    );
                    state.set(State::Sleeping {
                        sleep: tokio::time::sleep(delay),
                        pending,
                        headers,
                        hold,
                        settle,
                    });
                }
                StateProj::Sleeping {
                    sleep,
                    pending,
                    headers,
                    hold,
                    settle,
                } => {
                    ready!(sleep.poll(cx));
                    if let Some(Confirm { check, config }) =
                        hold.as_mut().and_then(Hold::confirming)
                    {
                        // Its place under the layer's bounds lasts until confirmed.
                        let (pending, hold) = (pending.take(), hold.take());
                        state.set(State::Confirming {
                            check,
                            config,
                            pending,
                            hold,
                        });
                        continue;
                    }
                    if let Some(hold) = hold.take() {
                        hold.release();
                    }
                    let (pending, headers, settle) =
                        (pending.take(), headers.take(), settle.take());
                    state.set(State::Readying {
                        pending,
                        headers,
                        settle,
                    });
                }
                StateProj::Confirming {
                    check,
                    config,
                    pending,
                    hold,
                } => {
                    let checked = ready!(check.as_mut().poll(cx));
                    // What the confirmation took, or gave back on a denial, is in its answer.
                    if let Some(hold) = hold.take() {
                        hold.release();
                    }
                    let pending = pending.take().expect(POLLED_AFTER_COMPLETION);
                    let next = decide(config, checked, &pending.request);
                    match next {
                        Next::Reject(response) => state.set(State::Rejected {
                            response: Some(response),
                        }),
                        Next::Forward {
                            delay,
                            headers,
                            settle,
                            ..
                        } if delay.is_zero() => state.set(State::Readying {
                            pending: Some(pending),
                            headers,
                            settle,
                        }),
                        Next::Forward {
                            delay,
                            headers,
                            hold,
                            settle,
                        } => state.set(State::Sleeping {
                            sleep: tokio::time::sleep(delay),
                            pending: Some(pending),
                            headers,
                            hold,
                            settle,
                        }),
                    }
                }
                StateProj::Readying {
                    pending,
                    headers,
                    settle,
                } => {
                    let Pending { inner, .. } = pending.as_mut().expect(POLLED_AFTER_COMPLETION);
                    ready!(inner.poll_ready(cx))?;
                    let Pending { request, mut inner } =
                        pending.take().expect(POLLED_AFTER_COMPLETION);
                    let future = inner.call(request);
                    let (headers, settle) = (headers.take(), settle.take());
                    state.set(State::Forwarding {
                        future,
                        headers,
                        settle,
                    });
                }
                StateProj::Forwarding {
                    future,
                    headers,
                    settle,
                } => {
                    // An error of the inner service counts (see `Charge`): `?` drops the
                    // pending charge unsettled.
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(settle) = settle.take() {
                        settle.settle(response.status());
                    }
                    if let Some(ours) = headers.take() {
                        ours.merge_into(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::inner)));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().expect(POLLED_AFTER_COMPLETION);
                    return Poll::Ready(Ok(response.map(RateLimitBody::full)));
                }
            }
        }
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Delayed { .. } | State::Sleeping { .. } => "sleeping",
            State::Confirming { .. } => "confirming",
            State::Readying { .. } => "readying",
            State::Forwarding { .. } => "forwarding",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// What to do with a checked request.
pub(crate) enum Next {
    Forward {
        delay: Duration,
        headers: Option<RateLimitHeaders>,
        /// For a held request (`delay` > 0).
        hold: Option<Hold>,
        /// For a limit that counts by outcome: settled with the response's status.
        settle: Option<Settle>,
    },
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
pub(crate) fn decide<B>(config: &Config, mut checked: Checked, request: &Request<B>) -> Next {
    let head =
        || RequestHead::from_request(request).with_route(config.route_pattern(checked.route));
    // Only an admitted batch has a pending charge (a store failure or a shadow-mode denial
    // consumed nothing).
    let settle = checked.settle.take();
    let forward = |headers, settle| Next::Forward {
        delay: Duration::ZERO,
        headers,
        hold: None,
        settle,
    };
    let outcome = match checked.result {
        Ok(outcome) => outcome,
        Err(error) => {
            if let Some(suppressed) = config.log.admit_store_failure(&error) {
                tracing::warn!(%error, policy = ?config.on_failure, health = %checked.health, suppressed, "rate limit store failed");
            }
            return match config.on_failure {
                FailurePolicy::FailClosed if config.mode != Mode::Shadow => {
                    Next::Reject(reject(config, RejectionKind::StoreUnavailable, head(), &[]))
                }
                // Fail open; a fallback the store could not give (see `FailurePolicy`);
                // and shadow mode, which never refuses.
                _ => forward(None, None),
            };
        }
    };
    // The common case, without the per-rule lists below: an admitted batch of enforced
    // rules only, and no hook to tell.
    let route = checked.route;
    if outcome.decision == Decision::Allow
        && config.mode != Mode::Shadow
        && config.on_decision.is_none()
        && checked
            .limits
            .iter()
            .all(|&i| config.limit(route, i).is_some_and(|l| !l.shadow))
    {
        let rules = checked
            .limits
            .iter()
            .zip(&outcome.rules)
            .filter_map(|(&i, o)| Some((&config.limit(route, i)?.rule, o)));
        let enforced = checked.limits.len().min(outcome.rules.len());
        return forward(allowed_headers(config, route, enforced, rules), settle);
    }
    let denied = !outcome.is_admitted();
    let rules: SmallVec<[(&Rule, RuleOutcome); 4]> =
        if denied || config.on_decision.is_some() || config.headers.on_allowed {
            checked
                .limits
                .iter()
                .zip(&outcome.rules)
                .filter_map(|(&i, o)| Some((&config.limit(checked.route, i)?.rule, *o)))
                .collect()
        } else {
            SmallVec::new()
        };
    let shadow: SmallVec<[bool; 4]> = checked
        .limits
        .iter()
        .map(|&i| config.limit(checked.route, i).is_some_and(|l| l.shadow))
        .collect();
    let shadow_denial = shadow
        .iter()
        .zip(&checked.limits)
        .zip(&outcome.rules)
        .find(|((&s, _), o)| s && !o.decision.is_admitted());
    // In shadow mode a denied batch is logged below, once.
    let shadow_denial = shadow_denial.filter(|_| !(denied && config.mode == Mode::Shadow));
    if let Some(((_, &i), o)) = shadow_denial {
        let rule = config.limit(checked.route, i).map_or("", |l| l.rule.name());
        let reason = o.decision.denial().map(|d| d.reason);
        if let Some(suppressed) = config.log.admit(Event::ShadowDenial) {
            tracing::info!(
                rule,
                ?reason,
                suppressed,
                "shadow limit: request would be rate limited"
            );
        }
    }
    if let Some(hook) = &config.on_decision {
        hook(&DecisionEvent {
            outcome: &outcome,
            rules: &rules,
            shadow: &shadow,
            mode: config.mode,
            route: config.route_pattern(checked.route),
            health: checked.health,
            store_latency: checked.store_latency,
        });
    }
    // Clients are told about enforced rules only: a trial rule, or any rule in shadow mode,
    // is not theirs to plan around.
    let enforced: SmallVec<[(&Rule, RuleOutcome); 4]> = if config.mode == Mode::Shadow {
        SmallVec::new()
    } else {
        rules
            .iter()
            .zip(&shadow)
            .filter(|(_, &s)| !s)
            .map(|(r, _)| *r)
            .collect()
    };
    let headers = || {
        let items = enforced.iter().map(|(r, o)| (*r, o));
        allowed_headers(config, route, enforced.len(), items)
    };
    match (outcome.decision, config.mode) {
        (Decision::Deny(denial), mode) => {
            let rule = enforced
                .iter()
                .find(|(_, o)| o.decision == outcome.decision)
                .map_or("", |(r, _)| r.name());
            let retry_after_s = denial.retry_after.map(retry_after_secs);
            if mode == Mode::Shadow {
                if let Some(suppressed) = config.log.admit(Event::ShadowDenial) {
                    tracing::info!(rule, reason = ?denial.reason, retry_after_s, suppressed, "shadow mode: request would be rate limited");
                }
                forward(headers(), None)
            } else {
                tracing::debug!(rule, reason = ?denial.reason, retry_after_s, "request rate limited");
                Next::Reject(reject(
                    config,
                    RejectionKind::Limited(&outcome),
                    head(),
                    &enforced,
                ))
            }
        }
        // Shadow mode never holds a request.
        (Decision::Delay(_), Mode::Shadow) | (Decision::Allow, _) => forward(headers(), settle),
        (Decision::Delay(delay), _) => {
            let ToHold {
                refund,
                keys,
                confirm,
            } = checked.to_hold.unwrap_or_default();
            match config.held.try_hold(keys) {
                Some(slot) => Next::Forward {
                    delay,
                    headers: headers(),
                    hold: Some(Hold {
                        refund,
                        confirm,
                        _slot: slot,
                    }),
                    settle,
                },
                None => {
                    if let Some(refund) = refund {
                        give_back(refund);
                    }
                    tracing::debug!(?delay, "too many held requests: request refused");
                    observe::held_refused();
                    let limits = &checked.limits;
                    Next::Reject(refuse_hold(
                        config,
                        &outcome,
                        checked.route,
                        limits,
                        delay,
                        head(),
                    ))
                }
            }
        }
    }
}

/// The headers of a forwarded request, if the layer sends them on admitted responses: the
/// `enforced` rules of its batch (none on trial) with their outcomes.
fn allowed_headers<'a>(
    config: &Config,
    route: Option<usize>,
    enforced: usize,
    rules: impl Iterator<Item = (&'a Rule, &'a RuleOutcome)>,
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
            // Rules on trial are not advertised (see `decide`).
            (!limit.is_shadow()).then_some((&limit.rule, *o))
        })
        .collect();
    reject(config, RejectionKind::Limited(&refused), head, &rules)
}
