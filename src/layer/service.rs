use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::batch::LayerBatch;
use super::body::RejectionBody;
use super::charge::take_tickets;
use super::check::check;
use super::config::Config;
use super::decide::reject;
use super::future::ResponseFuture;
use super::observe;
use super::reload::source::Shared;
use super::response::RejectionKind;
use crate::key::RequestHead;
use crate::store::{MemoryStore, Store};

/// Rate limits the requests of an inner service; made by
/// [`RateLimitLayer`](super::RateLimitLayer). `Clone` shares the limiter, the configuration
/// and the layer's state: every clone enforces the same limits.
#[derive(Clone, Debug)]
pub struct RateLimit<S, St = MemoryStore> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared<St>>,
}

impl<S, St> RateLimit<S, St> {
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
    ResB: RejectionBody,
    St: Store + Clone,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The store is asked in `call`, per request; readiness is the inner service's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // One configuration for the whole request, however often a reload swaps it.
        let Shared { limiter, config } = &*self.shared;
        let scope = config.current();
        let config = &scope.config;
        let route = route_of(config, &request);
        let head = RequestHead::from_request(&request).with_route(config.route_pattern(route));
        // A request no limit applies to never makes a batch (its reference count is atomic).
        let unlimited = config.limits(route).next().is_none();
        if unlimited || config.exempt.as_ref().is_some_and(|exempt| exempt(&head)) {
            return ResponseFuture::forwarding(self.inner.call(request));
        }
        // Borrowed where it is made: each move of the batch is a copy.
        let mut batch = LayerBatch::new(&scope, route);
        match batch.read(&head) {
            Ok(true) => {}
            Ok(false) => return ResponseFuture::forwarding(self.inner.call(request)),
            Err(e) => {
                let rejection = reject(config, RejectionKind::Key(&e), head, &[]);
                return ResponseFuture::rejected(rejection);
            }
        }
        let tickets = config.derived(route).is_none_or(|d| d.defers_denials);
        drop(scope);
        if tickets {
            take_tickets(&mut batch);
        }
        // A store that answers at once (in process) is decided here and the ready inner
        // service called directly; another is asked by a boxed future.
        let observation = observe::start(&batch);
        match check(limiter, &mut batch, observation, &request) {
            Ok(next) => ResponseFuture::decided(next, request, &mut self.inner),
            Err(check) => ResponseFuture::checking(check, request, take_ready(&mut self.inner)),
        }
    }
}

/// The route-table entry of the request, if any. On a nested router both the full and the
/// nested path are matched, and the more specific route applies (the full path's among
/// equals), so a catch-all on the full path never hides a route for the nested one.
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
