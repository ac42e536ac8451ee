use std::fmt;
use std::future::Future;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use smallvec::SmallVec;
use tower_service::Service;
use tracing::Instrument;

use super::body::RateLimitBody;
use super::charge;
use super::config::{Config, MissingKey, Mode};
use super::future::{
    decide, give_back as run_detached, reject, CheckFuture, Checked, Confirm, Next, RefundFuture,
    ResponseFuture, ToHold,
};
use super::log::Event;
use super::observe;
use super::plans::RequestPlans;
use super::reload::ConfigSource;
use super::response::RejectionKind;
use crate::decision::{Decision, Outcome};
use crate::key::{KeyBuf, KeyErrorKind, RequestHead};
use crate::limiter::Limiter;
use crate::store::{Admission, Check, MemoryStore, Store};
use crate::StoreError;

/// Rate limits the requests of an inner service; made by
/// [`RateLimitLayer`](super::RateLimitLayer).
///
/// `Clone` shares the limiter and the configuration: every clone enforces the same limits,
/// unlike tower's own `RateLimit`, whose counter lives inside each service.
pub struct RateLimit<S, St = MemoryStore> {
    inner: S,
    limiter: Limiter<St>,
    config: ConfigSource,
}

/// One limit of a request's batch: its index among the request's limits, its key's bytes in
/// the shared key buffer, its cost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub(crate) limit: usize,
    start: usize,
    end: usize,
    cost: u64,
}

impl<S, St> RateLimit<S, St> {
    pub(crate) fn from_parts(inner: S, limiter: Limiter<St>, config: ConfigSource) -> Self {
        Self {
            inner,
            limiter,
            config,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the middleware.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store + Clone,
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The store is asked in `call`, per request; readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // One configuration for the whole request, however often a reload swaps it.
        let current = self.config.current();
        let config: &Config = &current;
        // Without a route table, the path is not even looked up.
        let route = if config.routes.is_empty() {
            None
        } else {
            config.route_for(request.method(), matched_path(&request))
        };
        let head = RequestHead::from_request(&request).with_route(config.route_pattern(route));
        if config
            .exempt
            .as_ref()
            .is_some_and(|is_exempt| is_exempt(&head))
        {
            return ResponseFuture::forwarding(self.inner.call(request), None, None);
        }

        // Keys are read here, while the request is borrowed, into one inline buffer.
        let mut keys = KeyBuf::new();
        let mut items: SmallVec<[Item; 4]> = SmallVec::new();
        let mut plans = RequestPlans::default();
        for (i, limit) in config.limits(route).enumerate() {
            let start = keys.len();
            // A request of no known plan, under `UnknownPlan::Reject`, is refused whatever
            // the limit does with a missing key.
            let (extracted, plan_refused) = match plans.applies(limit, &head) {
                Ok(true) => (limit.key.extract(&head, &mut keys), false),
                Ok(false) => continue,
                Err(unknown_plan) => (Err(unknown_plan), true),
            };
            match extracted {
                Ok(()) => items.push(Item {
                    limit: i,
                    start,
                    end: keys.len(),
                    cost: limit.cost_of(&head),
                }),
                Err(e) => {
                    keys.truncate(start);
                    if e.kind() == KeyErrorKind::Misconfigured {
                        if let Some(suppressed) = config.log.admit(Event::KeyUnavailable) {
                            tracing::error!(rule = limit.rule.name(), error = %e, suppressed, "rate limit key unavailable");
                        }
                    } else if limit.on_missing == MissingKey::Skip && !plan_refused {
                        continue;
                    }
                    if config.mode == Mode::Shadow || limit.shadow {
                        // Shadow mode reports and never refuses: the rule is left out.
                        if let Some(suppressed) = config.log.admit(Event::ShadowMissingKey) {
                            tracing::info!(rule = limit.rule.name(), error = %e, suppressed, "shadow: request would be refused for its key");
                        }
                        continue;
                    }
                    return ResponseFuture::rejected(reject(
                        config,
                        RejectionKind::Key(&e),
                        head,
                        &[],
                    ));
                }
            }
        }
        if items.is_empty() {
            return ResponseFuture::forwarding(self.inner.call(request), None, None);
        }

        let max_wait = match config.mode {
            Mode::Wait { max_wait } => max_wait,
            _ => Duration::ZERO,
        };
        let call = StoreCallRef {
            limiter: &self.limiter,
            config: &current,
            route,
            items: &items,
            keys: &keys,
            max_wait,
        };
        let mut limits = SmallVec::new();
        let batch = batch_of(config, route, &items, &keys, Some(&mut limits));
        let observation = observe::start(config, route);
        // An in-process store answers at once (`Store::check_now`). Then the decision is
        // taken here, without a future, and the inner service that was driven to readiness
        // is called directly, without a clone; a store that cannot answer yet is asked by
        // the boxed `check` future, polled with the caller's waker.
        let now = {
            let _entered = observation.span.enter();
            self.limiter.reserve_now(&batch, max_wait)
        };
        if let Some(result) = now {
            let checked = call.checked(observation, limits, &batch, result);
            drop(batch);
            return decided(&mut self.inner, config, checked, request);
        }
        drop(batch);
        let mut check = Box::pin(check(
            StoreCall {
                limiter: self.limiter.clone(),
                config: Arc::clone(&current),
                route,
                items,
                keys,
                max_wait,
            },
            observation,
        ));
        // A store may still answer on the first poll (a local deny cache, a fallback while
        // its breaker is open): then too the inner service is called without a clone. One
        // that is not ready yet is polled again, with the caller's waker, by the future.
        if let Poll::Ready(checked) = check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return decided(&mut self.inner, config, checked, request);
        }
        let config = Arc::clone(&current);
        drop(current);
        let inner = self.take_ready_inner();
        ResponseFuture::checking(check, request, inner, config)
    }
}

/// The response future of a request decided in `call`. A forwarded request calls `inner`,
/// the service that was driven to readiness, without a clone.
fn decided<S, ReqB, ResB>(
    inner: &mut S,
    config: &Config,
    checked: Checked,
    request: Request<ReqB>,
) -> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
{
    match decide(config, checked, &request) {
        Next::Forward {
            delay,
            headers,
            settle,
            ..
        } if delay.is_zero() => ResponseFuture::forwarding(inner.call(request), headers, settle),
        // A held request takes an idle clone, driven to readiness after the hold; the ready
        // service stays here for the next call instead of keeping its permit
        // (`ConcurrencyLimit`, `Buffer`) through the hold.
        Next::Forward {
            delay,
            headers,
            hold,
            settle,
        } => ResponseFuture::delayed(delay, request, inner.clone(), headers, hold, settle),
        Next::Reject(response) => ResponseFuture::rejected(response),
    }
}

/// The path the route table matches: the one the client sent. A router nested with axum's
/// `Router::nest` hands its layers the path without its prefix, and keeps the original in
/// `OriginalUri`.
fn matched_path<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(original) = request.extensions().get::<axum::extract::OriginalUri>() {
        return original.path();
    }
    request.uri().path()
}

impl<S: Clone, St> RateLimit<S, St> {
    /// The inner service that was driven to readiness, for a future that calls it later; a
    /// clone (not ready yet) takes its place. See
    /// <https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services>
    fn take_ready_inner(&mut self) -> S {
        let clone = self.inner.clone();
        mem::replace(&mut self.inner, clone)
    }
}

/// Asks a store that could not answer at once (`Store::check_now`) about a request's
/// batch, under the observation `call` started. The layer's own allocation for such a
/// request is the box around this future (its type cannot be named in `ResponseFuture` on
/// stable Rust).
async fn check<St: Store + Clone>(
    call: StoreCall<St>,
    observation: observe::Observation,
) -> Checked {
    let mut limits = SmallVec::new();
    let batch = batch_of(
        &call.config,
        call.route,
        &call.items,
        &call.keys,
        Some(&mut limits),
    );
    let result = call
        .limiter
        .reserve(&batch, call.max_wait)
        .instrument(observation.span.clone())
        .await;
    let checked = call.as_ref().checked(observation, limits, &batch, result);
    drop(batch);
    checked
}

/// Counts the rules a held request's batch left to its release (`Limiter::confirm`), when
/// its hold is over. Observed (metrics, span) for those rules only: the others were when
/// the request was checked.
async fn confirm<St: Store + Clone>(call: StoreCall<St>, held: Outcome) -> Checked {
    let StoreCall {
        limiter,
        config,
        route,
        items,
        keys,
        max_wait,
    } = &call;
    let mut limits = SmallVec::new();
    let batch = batch_of(config, *route, items, keys, Some(&mut limits));
    let pending: SmallVec<[usize; 4]> = held
        .admission
        .iter()
        .flat_map(|a| a.pending())
        .filter(|&i| i < batch.len())
        .collect();
    let observation = observe::start(config, *route);
    let result = limiter
        .confirm(&batch, &held, *max_wait)
        .instrument(observation.span.clone())
        .await;
    let health = limiter.health();
    let counted_now = result.as_ref().map(|outcome| Outcome {
        decision: outcome.decision,
        rules: pending.iter().map(|&i| outcome.rules[i]).collect(),
        admission: None,
    });
    let store_latency = observe::finish(
        observation,
        config,
        *route,
        &pending
            .iter()
            .map(|&i| limits[i])
            .collect::<SmallVec<[_; 4]>>(),
        &pending
            .iter()
            .map(|&i| batch[i])
            .collect::<SmallVec<[_; 4]>>(),
        &counted_now.map_err(|e| e.clone()),
        health,
    );
    let checked = call
        .as_ref()
        .answered(limits, &batch, result, health, store_latency);
    drop(batch);
    checked
}

/// What a store call for a request needs, kept for what follows it: giving its units back,
/// confirming it at its release.
#[derive(Clone)]
struct StoreCall<St> {
    limiter: Limiter<St>,
    config: Arc<Config>,
    route: Option<usize>,
    items: SmallVec<[Item; 4]>,
    keys: KeyBuf,
    max_wait: Duration,
}

impl<St: Clone> StoreCall<St> {
    fn as_ref(&self) -> StoreCallRef<'_, St> {
        StoreCallRef {
            limiter: &self.limiter,
            config: &self.config,
            route: self.route,
            items: &self.items,
            keys: &self.keys,
            max_wait: self.max_wait,
        }
    }
}

/// A store call's parts, borrowed: a request decided at once keeps them on `call`'s stack,
/// and copies them only for what outlives `call` (a held request's refund and
/// confirmation).
struct StoreCallRef<'a, St> {
    limiter: &'a Limiter<St>,
    config: &'a Arc<Config>,
    route: Option<usize>,
    items: &'a [Item],
    keys: &'a KeyBuf,
    max_wait: Duration,
}

impl<St: Store + Clone> StoreCallRef<'_, St> {
    fn to_owned(&self) -> StoreCall<St> {
        StoreCall {
            limiter: self.limiter.clone(),
            config: Arc::clone(self.config),
            route: self.route,
            items: self.items.into(),
            keys: self.keys.clone(),
            max_wait: self.max_wait,
        }
    }

    /// The store's answer for `batch` (this call's items, at `limits` among the request's
    /// limits), observed.
    fn checked(
        &self,
        observation: observe::Observation,
        limits: SmallVec<[usize; 4]>,
        batch: &[Check<'_>],
        result: Result<Outcome, StoreError>,
    ) -> Checked {
        let health = self.limiter.health();
        let store_latency = observe::finish(
            observation,
            self.config,
            self.route,
            &limits,
            batch,
            &result,
            health,
        );
        self.answered(limits, batch, result, health, store_latency)
    }

    /// The layer's view of the store's answer: for an admitted request counted by outcome,
    /// its pending charge; for a delayed request, what holding it takes.
    fn answered(
        &self,
        limits: SmallVec<[usize; 4]>,
        batch: &[Check<'_>],
        result: Result<Outcome, StoreError>,
        health: crate::store::Health,
        store_latency: Option<Duration>,
    ) -> Checked {
        let route = self.route;
        let held = held_keys(self.config, batch, &result);
        let settle = result.as_ref().ok().and_then(|outcome| {
            charge::pending(
                self.limiter,
                self.config,
                route,
                self.items,
                self.keys,
                outcome,
            )
        });
        let to_hold = match (&result, held) {
            (Ok(outcome), Some(keys_held)) => {
                let call = self.to_owned();
                // A wait at the release takes what is left of `max_wait` after this one.
                let held_for = match outcome.decision {
                    Decision::Delay(delay) => delay,
                    _ => Duration::ZERO,
                };
                let confirm = outcome.needs_confirmation().then(|| Confirm {
                    config: Arc::clone(self.config),
                    check: Box::pin(confirm(
                        StoreCall {
                            max_wait: call.max_wait.saturating_sub(held_for),
                            ..call.clone()
                        },
                        outcome.clone(),
                    )) as CheckFuture,
                });
                let refund = outcome
                    .admission
                    .clone()
                    .map(|admission| Box::pin(give_back(call, admission)) as RefundFuture);
                Some(ToHold {
                    refund,
                    keys: keys_held,
                    confirm,
                })
            }
            _ => None,
        };
        if let Ok(outcome) = &result {
            if self.config.mode == Mode::Shadow && outcome.needs_confirmation() {
                // Shadow mode holds nothing: the rules left to the release count it now.
                let confirmation = confirm(self.to_owned(), outcome.clone());
                run_detached(Box::pin(async move {
                    drop(confirmation.await);
                }));
            }
        }
        Checked {
            result,
            route,
            limits,
            to_hold,
            health,
            settle,
            store_latency,
        }
    }
}

/// The batch of a request's items: each limit's rule, its key's bytes, the cost; and, if
/// asked, each item's index among the request's limits.
pub(super) fn batch_of<'a>(
    config: &'a Config,
    route: Option<usize>,
    items: &[Item],
    keys: &'a KeyBuf,
    mut limits: Option<&mut SmallVec<[usize; 4]>>,
) -> SmallVec<[Check<'a>; 4]> {
    let mut batch = SmallVec::new();
    for item in items {
        // Always present: the items were made from these limits and this buffer.
        let limit = config.limit(route, item.limit);
        let key = keys.as_bytes().get(item.start..item.end);
        if let (Some(limit), Some(key)) = (limit, key) {
            if let Some(limits) = limits.as_deref_mut() {
                limits.push(item.limit);
            }
            batch.push(Check {
                rule: &limit.rule,
                key,
                cost: item.cost,
                shadow: limit.shadow,
            });
        }
    }
    batch
}

/// For a request the layer will hold (delayed, not in shadow mode), what it counts under
/// for `max_held_per_key`: each (rule, key) whose rule delays it, once. A trial rule never
/// delays a request (its `Delay` says what enforcing it would do), so it takes no place:
/// else it could refuse a request.
fn held_keys(
    config: &Config,
    batch: &[Check<'_>],
    result: &Result<Outcome, StoreError>,
) -> Option<SmallVec<[u64; 4]>> {
    let outcome = match result {
        Ok(outcome)
            if matches!(outcome.decision, Decision::Delay(_)) && config.mode != Mode::Shadow =>
        {
            outcome
        }
        _ => return None,
    };
    let mut keys = SmallVec::new();
    if config.held.max_per_key.is_none() {
        return Some(keys);
    }
    // A rule left pending to the release says `Delay` only because another rule holds the
    // request.
    let pending = |i: usize| {
        outcome
            .admission
            .as_ref()
            .is_some_and(|a| a.taken(i).pending)
    };
    for (i, (check, rule)) in batch.iter().zip(&outcome.rules).enumerate() {
        if !check.shadow && matches!(rule.decision, Decision::Delay(_)) && !pending(i) {
            let key = config.held.counts.key_of(check.rule.name(), check.key);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    Some(keys)
}

/// Gives back the units of a held request dropped before its release: the same batch as
/// it was checked, so each rule finds its own part of the admission.
async fn give_back<St: Store>(call: StoreCall<St>, admission: Admission) {
    let StoreCall {
        limiter,
        config,
        route,
        items,
        keys,
        ..
    } = call;
    let batch = batch_of(&config, route, &items, &keys, None);
    if let Err(error) = limiter.refund(&batch, &admission).await {
        tracing::warn!(%error, "could not give back the units of a dropped held request");
    }
}

impl<S: Clone, St: Clone> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug> fmt::Debug for RateLimit<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("config", &self.config)
            .finish()
    }
}
