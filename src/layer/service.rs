use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use smallvec::SmallVec;
use tower_service::Service;
use tracing::Instrument;

use super::batch::{batch_of, settled_by_response, Checked, Item, LayerBatch, Tickets};
use super::body::RateLimitBody;
use super::charge::unsettled::recount;
use super::config::{Config, MissingKey, Mode};
use super::decide::{decide, reject};
use super::future::{CheckFuture, ResponseFuture};
use super::observe;
use super::plans::select::RequestPlans;
use super::reload::source::ConfigSource;
use super::response::RejectionKind;
use super::state::LayerState;
use crate::decision::{Decision, DenyReason, Outcome};
use crate::key::{KeyBuf, KeyError, KeyErrorKind, RequestHead};
use crate::limiter::Limiter;
use crate::log::Event;
use crate::reservation::Reservation;
use crate::store::{Check, MemoryStore, Store};
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
    state: Arc<LayerState>,
}

impl<S, St> RateLimit<S, St> {
    pub(crate) fn from_parts(
        inner: S,
        limiter: Limiter<St>,
        config: ConfigSource,
        state: Arc<LayerState>,
    ) -> Self {
        Self {
            inner,
            limiter,
            config,
            state,
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
    type Future = ResponseFuture<S, ReqB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The store is asked in `call`, per request; readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // One configuration for the whole request, however often a reload swaps it.
        let current = self.config.current();
        let config: &Config = &current;
        let route = route_of(config, &request);
        let head = RequestHead::from_request(&request).with_route(config.route_pattern(route));
        if config
            .exempt
            .as_ref()
            .is_some_and(|is_exempt| is_exempt(&head))
        {
            return ResponseFuture::forwarding(self.inner.call(request));
        }

        // Keys are read here, while the request is borrowed, into one inline buffer.
        let mut keys = KeyBuf::new();
        let state = &self.state;
        let mut items = match items(config, state, route, &head, &mut keys) {
            Ok(items) => items,
            Err(e) => {
                let kind = RejectionKind::Key(&e);
                return ResponseFuture::rejected(reject(config, kind, head, &[]));
            }
        };
        if items.is_empty() {
            return ResponseFuture::forwarding(self.inner.call(request));
        }

        let tickets = tickets(config, state, route, &mut items, &keys);
        let max_wait = config.mode.max_wait();
        let call = StoreCallRef {
            limiter: &self.limiter,
            config: &current,
            state,
            route,
            items: &items,
            keys: &keys,
            max_wait,
        };
        let mut limits = SmallVec::new();
        let batch = batch_of(config, route, &items, &keys, Some(&mut limits));
        let observation = observe::start(config, route);
        // An in-process store answers at once (`Store::try_check_now`). Then the decision is
        // taken here, without a future, and the inner service that was driven to readiness
        // is called directly, without a clone; a store that cannot answer yet is asked by
        // the boxed `check` future, polled with the caller's waker.
        let now = {
            let _entered = observation.span.enter();
            self.limiter.reserve_now(&batch, max_wait)
        };
        if let Some(result) = now {
            let checked = call.checked(observation, limits, &batch, result, tickets);
            drop(batch);
            let next = decide(config, state, checked, &request);
            return ResponseFuture::decided(next, request, &mut self.inner, &current, state);
        }
        drop(batch);
        let call = StoreCall {
            limiter: self.limiter.clone(),
            config: Arc::clone(&current),
            state: Arc::clone(state),
            route,
            items,
            keys,
            max_wait,
            tickets,
        };
        ask_later(
            &mut self.inner,
            (&current, state),
            call,
            observation,
            request,
        )
    }
}

/// Asks a store that could not answer at once through the boxed `check` future. A store
/// may still answer on its first poll (a local deny cache, a fallback while its breaker is
/// open): then too `inner`, driven to readiness, is called without a clone, and the
/// request's configuration and state are borrowed, not counted. One that is not ready yet
/// is polled again, with the caller's waker, by the response future.
fn ask_later<S, St, ReqB, ResB>(
    inner: &mut S,
    (config, state): (&Arc<Config>, &Arc<LayerState>),
    call: StoreCall<St>,
    observation: observe::Observation,
    request: Request<ReqB>,
) -> ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store + Clone,
{
    let mut check: CheckFuture<St> = Box::pin(check(call, observation));
    if let Poll::Ready(checked) = check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        let next = decide(config, state, checked, &request);
        return ResponseFuture::decided(next, request, inner, config, state);
    }
    let inner = take_ready(inner);
    ResponseFuture::checking(check, request, inner, Arc::clone(config), Arc::clone(state))
}

/// The items of a request's batch: each of its limits on `route` that applies to it, with
/// its key (read into `keys`) and its cost. A limit without a key is left out, or the
/// request is refused with the key's error, as the limit and the mode say.
fn items(
    config: &Config,
    state: &LayerState,
    route: Option<usize>,
    head: &RequestHead<'_>,
    keys: &mut KeyBuf,
) -> Result<SmallVec<[Item; 4]>, KeyError> {
    let mut items: SmallVec<[Item; 4]> = SmallVec::new();
    let mut plans = RequestPlans::default();
    for (i, limit) in config.limits(route).enumerate() {
        let start = keys.len();
        // A request of no known plan, under `UnknownPlan::Reject`, is refused whatever
        // the limit does with a missing key.
        let (extracted, plan_refused) = match plans.applies(limit.plan.as_ref(), head) {
            Ok(true) => (limit.key.extract(head, keys), false),
            Ok(false) => continue,
            Err(unknown_plan) => (Err(unknown_plan), true),
        };
        match extracted {
            Ok(()) => items.push(Item {
                limit: i,
                start,
                end: keys.len(),
                cost: limit.cost_of(head),
                defers: false,
            }),
            Err(e) => {
                keys.truncate(start);
                if e.kind() == KeyErrorKind::Misconfigured {
                    if let Some(suppressed) = state.log.admit(Event::KeyUnavailable) {
                        tracing::error!(rule = limit.rule.name(), error = %e, suppressed, "rate limit key unavailable");
                    }
                } else if limit.on_missing == MissingKey::Skip && !plan_refused {
                    continue;
                }
                if config.mode == Mode::Shadow || limit.shadow {
                    // Shadow mode reports and never refuses: the rule is left out.
                    if let Some(suppressed) = state.log.admit(Event::ShadowMissingKey) {
                        tracing::info!(rule = limit.rule.name(), error = %e, suppressed, "shadow: request would be refused for its key");
                    }
                    continue;
                }
                return Err(e);
            }
        }
    }
    Ok(items)
}

/// The tickets of a request's items whose limits count by outcome with a penalty (see
/// `charge::unsettled`), taken before the store decides: none for most requests. An item
/// checked while other requests of its limit and key are being checked or in flight
/// leaves its denial to the layer (`Item::defers`); one checked alone has it counted by the
/// store, at once, with the lock it may set in its answer.
fn tickets(
    config: &Config,
    state: &LayerState,
    route: Option<usize>,
    items: &mut [Item],
    keys: &KeyBuf,
) -> Tickets {
    let mut tickets = Tickets::new();
    if !config.defers_denials {
        return tickets;
    }
    for (i, item) in items.iter_mut().enumerate() {
        let Some(limit) = config.limit(route, item.limit) else {
            continue;
        };
        if !limit.defers_denials() {
            continue;
        }
        if let Some(key) = keys.as_bytes().get(item.start..item.end) {
            let (ticket, alone) = state.unsettled.start(&limit.rule, key);
            item.defers = !alone;
            tickets.push((i, ticket));
        }
    }
    tickets
}

/// The route-table entry of the request, if any. Without a route table, the path is not
/// even looked up.
///
/// On a nested router the table may be written with full paths or with the nested
/// router's own: both paths are matched, and the more specific route of the two applies
/// (the full path's among equals), so a catch-all matching the full path never hides a
/// strict route written for the nested one.
fn route_of<B>(config: &Config, request: &Request<B>) -> Option<usize> {
    if config.routes.is_empty() {
        return None;
    }
    let (original, seen) = (original_path(request), request.uri().path());
    let route = config.route_for(request.method(), original);
    if seen == original {
        return route;
    }
    let nested = config.route_for(request.method(), seen);
    let ranks = |i: usize| {
        config
            .routes
            .get(i)
            .into_iter()
            .flat_map(|r| r.pattern.ranks())
    };
    match (route, nested) {
        (Some(full), Some(own)) if ranks(own).lt(ranks(full)) => Some(own),
        (None, own) => own,
        (full, _) => full,
    }
}

/// The path the client sent. A router nested with axum's `Router::nest` hands its layers
/// the path without its prefix, and keeps the original in `OriginalUri`.
fn original_path<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(original) = request.extensions().get::<axum::extract::OriginalUri>() {
        return original.path();
    }
    request.uri().path()
}

/// The inner service that was driven to readiness, for a future that calls it later; a
/// clone (not ready yet) takes its place. See
/// <https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services>
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    mem::replace(inner, clone)
}

/// Asks a store that could not answer at once (`Store::try_check_now`) about a request's
/// batch, under the observation `call` started. The layer's own allocation for such a
/// request is the box around this future (its type cannot be named in `ResponseFuture` on
/// stable Rust).
async fn check<St: Store + Clone>(
    mut call: StoreCall<St>,
    observation: observe::Observation,
) -> Checked<St> {
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
        .reserve_outcome(&batch, call.max_wait)
        .instrument(observation.span.clone())
        .await;
    let tickets = std::mem::take(&mut call.tickets);
    let checked = call
        .as_ref()
        .checked(observation, limits, &batch, result, tickets);
    drop(batch);
    checked
}

/// What a store call for a request needs, owned by the future that asks a store that
/// cannot answer at once.
struct StoreCall<St> {
    limiter: Limiter<St>,
    config: Arc<Config>,
    state: Arc<LayerState>,
    route: Option<usize>,
    items: SmallVec<[Item; 4]>,
    keys: KeyBuf,
    max_wait: Duration,
    /// Dropped with the call if it ends before the store answers.
    tickets: Tickets,
}

impl<St> StoreCall<St> {
    fn as_ref(&self) -> StoreCallRef<'_, St> {
        StoreCallRef {
            limiter: &self.limiter,
            config: &self.config,
            state: &self.state,
            route: self.route,
            items: &self.items,
            keys: &self.keys,
            max_wait: self.max_wait,
        }
    }
}

/// A store call's parts, borrowed: a request decided at once keeps them on `call`'s stack,
/// and copies them only for what outlives `call` (a reservation the layer keeps).
struct StoreCallRef<'a, St> {
    limiter: &'a Limiter<St>,
    config: &'a Arc<Config>,
    state: &'a Arc<LayerState>,
    route: Option<usize>,
    items: &'a [Item],
    keys: &'a KeyBuf,
    max_wait: Duration,
}

impl<St: Store + Clone> StoreCallRef<'_, St> {
    /// The store's answer for `batch` (this call's items, at `limits` among the request's
    /// limits), observed; with a reservation when the layer may give units back.
    fn checked(
        &self,
        observation: observe::Observation,
        limits: SmallVec<[usize; 4]>,
        batch: &[Check<'_>],
        result: Result<Outcome, StoreError>,
        tickets: Tickets,
    ) -> Checked<St> {
        let health = self.limiter.health();
        let store_latency = observe::finish(
            observation,
            self.config,
            self.state,
            &limits,
            batch,
            &result,
            health,
        );
        let tickets = match &result {
            Ok(outcome) => self.defer_denials(outcome, tickets),
            Err(_) => Tickets::new(),
        };
        let (reservation, batch) = match &result {
            Ok(outcome) if self.keeps(outcome) => {
                let batch = Arc::new(LayerBatch {
                    config: Arc::clone(self.config),
                    state: Arc::clone(self.state),
                    route: self.route,
                    items: self.items.into(),
                    keys: self.keys.clone(),
                    _tickets: tickets,
                });
                let reservation = Reservation::of(
                    self.limiter.clone(),
                    batch.clone(),
                    outcome.clone(),
                    self.max_wait,
                    Some(Arc::clone(&self.state.log)),
                );
                (Some(Box::new(reservation)), Some(batch))
            }
            _ => (None, None),
        };
        Checked {
            result,
            route: self.route,
            limits,
            reservation,
            batch,
            health,
            store_latency,
        }
    }

    /// Each limit charged by outcome whose quota refused the request (in a refused batch,
    /// or a shadow limit in an admitted one) has its denial counted once the requests beside
    /// it have settled (see `charge::unsettled`); the tickets of the other limits, which
    /// settle with the request.
    fn defer_denials(&self, outcome: &Outcome, tickets: Tickets) -> Tickets {
        if tickets.is_empty() {
            return tickets;
        }
        let mut unsettled = Tickets::new();
        for (i, ticket) in tickets {
            let refused = outcome.rules.get(i).and_then(|r| r.decision.denial());
            let by_quota =
                refused.is_some_and(|d| d.reason == DenyReason::Limited && d.retry_after.is_some());
            let item = self.items.get(i);
            let limit = item.and_then(|item| self.config.limit(self.route, item.limit));
            let key = item.and_then(|item| self.keys.as_bytes().get(item.start..item.end));
            let (Some(item), Some(limit), Some(key)) = (item, limit, key) else {
                continue;
            };
            if !by_quota {
                unsettled.push((i, ticket));
            } else if item.defers {
                let most = limit.rule.penalty().map_or(0, |p| p.denials());
                let recount = recount(
                    self.limiter.clone(),
                    limit.rule.clone(),
                    key.into(),
                    item.cost,
                );
                ticket.defer(recount, usize::try_from(most).unwrap_or(usize::MAX));
            }
            // Otherwise decided alone: the store counted the denial.
        }
        unsettled
    }

    /// Whether the layer keeps a reservation of `outcome`: it may give units back for a
    /// request it holds, or settle them by its response, or count it at the release.
    fn keeps(&self, outcome: &Outcome) -> bool {
        outcome.is_admitted()
            && (outcome.decision != Decision::Allow
                || outcome.needs_confirmation()
                || settled_by_response(self.config, self.route, self.items))
    }
}

impl<S: Clone, St: Clone> Clone for RateLimit<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            config: self.config.clone(),
            state: Arc::clone(&self.state),
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
