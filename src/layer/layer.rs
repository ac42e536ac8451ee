use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::config::{Config, DecisionEvent, FailurePolicy, Limit, Mode, Route};
use super::routes::RoutePattern;
use super::service::RateLimit;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::response::Rejection;
use crate::store::{MemoryStore, Store};

/// Applies [`Limit`]s to the requests of a service; see the [module docs](super).
///
/// The layer holds a [`Limiter`] (a cheap handle on the store) and its configuration behind
/// an `Arc`: every service it makes, and every clone of those, enforces the same limits.
#[derive(Clone)]
pub struct RateLimitLayer<St = MemoryStore> {
    limiter: Limiter<St>,
    config: Arc<Config>,
}

impl<St: Store> RateLimitLayer<St> {
    /// A layer with no limits yet, deciding with `limiter`.
    pub fn new(limiter: Limiter<St>) -> Self {
        Self {
            limiter,
            config: Arc::new(Config::default()),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Applies `limit` to every request. A request's limits (the layer's and its route's)
    /// are decided as one batch: if one denies, none consumes.
    pub fn limit(mut self, limit: Limit) -> Result<Self, ConfigError> {
        self.config_mut().global.push(limit);
        self.validate()?;
        Ok(self)
    }

    /// Applies `limits` to requests matching `pattern`, in addition to the layer's own
    /// limits. Patterns: `"POST /sms/send"` (method and path), `"/pkg.Service/Method"` (any
    /// method: gRPC), `"GET /files/{id}"` (`{id}` is any one segment), `"/api/*"` or
    /// `"/api/{*rest}"` (a prefix). A request takes the first route that matches, so declare
    /// specific routes before the prefixes that contain them. Paths are matched as sent
    /// (not percent-decoded), with empty segments ignored: `/sms/send/` is `/sms/send`; a
    /// `GET` route also covers `HEAD`.
    pub fn route(
        mut self,
        pattern: &str,
        limits: impl IntoIterator<Item = Limit>,
    ) -> Result<Self, ConfigError> {
        let route = Route {
            pattern: RoutePattern::parse(pattern)?,
            limits: limits.into_iter().collect(),
        };
        self.config_mut().routes.push(route);
        self.validate()?;
        Ok(self)
    }

    /// Sets the mode (default [`Mode::Enforce`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.config_mut().mode = mode;
        self
    }

    /// Holds at most `n` requests at once (default [`DEFAULT_MAX_HELD`](super::DEFAULT_MAX_HELD)): requests waiting
    /// out a leaky bucket's delay or a wait-mode reservation. A request beyond it is refused
    /// as if denied (429 with `Retry-After` = its delay, rounded up), and the units reserved
    /// for it are given back. The count is shared by every service the layer makes (and by
    /// clones of the layer). `0` never holds a request: every delay is refused. The
    /// [`on_decision`](Self::on_decision) hook sees the store's decision (the delay); the
    /// refusal itself is logged with `tracing::debug!`.
    ///
    /// A held request costs memory until it is released: some 2 KB of the layer's own with
    /// a `MemoryStore`, 3 KB with a `RedisStore`, plus the request and a clone of the inner
    /// service; see the [module docs](super#held-requests).
    pub fn max_held(mut self, n: usize) -> Self {
        self.config_mut().held.max = n;
        self
    }

    /// Holds at most `n` requests at once per key that delays them (default: no bound per
    /// key): one client cannot take every place [`max_held`](Self::max_held) allows. A
    /// request counts under each (rule, key) of its batch whose rule delays it; with a
    /// global rule doing the delaying, the bound applies to all requests it delays.
    /// Beyond it a request is refused as with `max_held`.
    pub fn max_held_per_key(mut self, n: usize) -> Self {
        self.config_mut().held.max_per_key = Some(n);
        self
    }

    /// Sets what happens when the store fails (default [`FailurePolicy::FailOpen`]).
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.config_mut().on_failure = policy;
        self
    }

    /// Also writes `RateLimit-Policy` and `RateLimit` on admitted responses (rejections
    /// always carry them).
    pub fn headers_on_allowed(mut self, yes: bool) -> Self {
        self.config_mut().headers.on_allowed = yes;
        self
    }

    /// Also writes the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now), describing the rule with the least left.
    pub fn legacy_headers(mut self, yes: bool) -> Self {
        self.config_mut().headers.legacy = yes;
        self
    }

    /// Builds rejections with `f` instead of the default (status, headers, body). Start
    /// from [`Rejection::default_response`] to keep the standard headers:
    ///
    /// ```
    /// use tollgate::layer::RateLimitLayer;
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let layer = RateLimitLayer::new(Limiter::new(MemoryStore::new())).on_reject(|rejection| {
    ///     let mut response = rejection.default_response();
    ///     if !rejection.is_grpc() {
    ///         *response.body_mut() = format!("{{\"error\":\"{}\"}}", rejection.message()).into();
    ///         response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    ///     }
    ///     response
    /// });
    /// ```
    pub fn on_reject<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.config_mut().on_reject = Some(Arc::new(f));
        self
    }

    /// Calls `f` with every decision (admitted, delayed or denied; in every mode), for
    /// metrics or audit logs. It runs on the request path: keep it short.
    pub fn on_decision<F>(mut self, f: F) -> Self
    where
        F: Fn(&DecisionEvent<'_>) + Send + Sync + 'static,
    {
        self.config_mut().on_decision = Some(Arc::new(f));
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<St> {
        &self.limiter
    }

    /// A rule name may appear once per request: the layer's limits and each route's are
    /// one batch, and a batch that checks one rule twice would count one state twice.
    fn validate(&self) -> Result<(), ConfigError> {
        let config = &*self.config;
        let batches = std::iter::once(None).chain((0..config.routes.len()).map(Some));
        for route in batches {
            let mut seen = HashSet::new();
            for limit in config.limits(route) {
                if !seen.insert(limit.rule.name()) {
                    let place = config.route_pattern(route).unwrap_or("every request");
                    return Err(ConfigError::new(format!(
                        "rule {:?} is applied twice to {place}; give each limit its own rule name",
                        limit.rule.name()
                    )));
                }
            }
        }
        Ok(())
    }
}

impl<S, St: Store + Clone> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_parts(inner, self.limiter.clone(), self.config.clone())
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimitLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("config", &self.config)
            .finish()
    }
}
