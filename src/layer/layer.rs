use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::config::{Config, FailurePolicy, Limit, Mode, Route};
use super::observe::observer::{DecisionObserver, Observers};
use super::reload::source::{ConfigSource, Scope, Shared};
use super::response::Rejection;
use super::routes::RoutePattern;
use super::service::RateLimit;
use super::state::LayerState;
use crate::error::ConfigError;
use crate::key::RequestHead;
use crate::limiter::Limiter;
use crate::rule::Rule;
use crate::store::{Health, MemoryStore, Store};

/// Applies [`Limit`]s to the requests of a service; see the [module docs](super). Made by
/// [`RateLimitLayer::builder`]; not tower's `RateLimitLayer` (see
/// [tower's `RateLimit`](super#towers-ratelimit)).
#[derive(Clone, Debug)]
pub struct RateLimitLayer<St = MemoryStore> {
    pub(super) shared: Arc<Shared<St>>,
}

impl RateLimitLayer {
    /// A builder for a layer with no limits yet, deciding on an in-process store of its own
    /// (a [`MemoryStore`]); [`limiter`](RateLimitLayerBuilder::limiter) sets another.
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::on(Limiter::new(MemoryStore::new()))
    }
}

/// The configuration of a [`RateLimitLayer`], checked as a whole by [`build`](Self::build):
///
/// ```
/// use tollgate::layer::{Limit, RateLimitLayer};
/// use tollgate::{key, Rate, Rule};
///
/// let err = RateLimitLayer::builder()
///     .limit(Limit::new(Rule::gcra("global", 1000, Rate::per_second(0)), key::global()))
///     .route("post /sms/send", [])
///     .build()
///     .unwrap_err();
/// assert_eq!(err.problems().count(), 2);
/// assert!(err.to_string().contains("rule \"global\""));
/// assert!(err.to_string().contains("route \"post /sms/send\""));
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayerBuilder<St = MemoryStore> {
    limiter: Limiter<St>,
    /// Everything but the route table, whose patterns `build` parses.
    config: Config,
    routes: Vec<(Box<str>, Vec<Limit>)>,
    /// Layer state rather than configuration: a reload keeps the running layer's.
    observers: Observers,
}

impl<St: Store> RateLimitLayerBuilder<St> {
    /// A builder deciding with `limiter`, with no limits yet.
    pub(crate) fn on(limiter: Limiter<St>) -> Self {
        Self {
            limiter,
            config: Config::default(),
            routes: Vec::new(),
            observers: Observers::default(),
        }
    }

    /// Decides with `limiter` (its store: a `RedisStore` shared by several instances, a
    /// [`Fallback`](crate::store::Fallback)…) instead of the builder's own in-process store.
    pub fn limiter<S2: Store>(self, limiter: Limiter<S2>) -> RateLimitLayerBuilder<S2> {
        RateLimitLayerBuilder {
            limiter,
            config: self.config,
            routes: self.routes,
            observers: self.observers,
        }
    }

    /// Applies `limit` to every request, in one batch with its route's limits.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.config.global.push(limit);
        self
    }

    /// Applies each of `limits` to every request, as [`limit`](Self::limit) does: a
    /// [`Plans`](super::Plans), say.
    pub fn limits(mut self, limits: impl IntoIterator<Item = Limit>) -> Self {
        self.config.global.extend(limits);
        self
    }

    /// Applies `limits` to requests matching `pattern`, in addition to the layer's own
    /// limits. Patterns: `"POST /sms/send"` (method and path), `"/pkg.Service/Method"` (any
    /// method: gRPC), `"GET /files/{id}"` (`{id}` is any one segment), `"/api/*"` or
    /// `"/api/{*rest}"` (a prefix). A request takes the route axum's router would: segment
    /// by segment, a literal before a parameter before a wildcard (`"/sms/premium/{x}"`
    /// before `"/sms/{provider}/send"`), whatever the order of declaration; among routes of
    /// the same shape, the first declared. Paths are matched as sent
    /// (not percent-decoded), with empty segments ignored: `/sms/send/` is `/sms/send`; a
    /// `GET` route also covers `HEAD`. Under axum's `Router::nest` patterns are full paths as
    /// clients send them (the layer reads `OriginalUri`), and the nested router's own path is
    /// matched too: of the two, the more specific route applies.
    ///
    /// A pattern no request can match is a [`build`](Self::build) error rather than a route
    /// that silently runs unlimited: a lower-case method (`"post /x"`: methods are
    /// case-sensitive) or one no client sends (`"POTS"`), a `?` or `#`, characters clients
    /// percent-encode, `.`/`..` segments, axum 0.7's `:name` and `*name`, and a route of the
    /// same shape as an earlier one that matches all its requests (`"/files/{id}"` before
    /// `"GET /files/{name}"`).
    pub fn route(mut self, pattern: &str, limits: impl IntoIterator<Item = Limit>) -> Self {
        self.routes
            .push((pattern.into(), limits.into_iter().collect()));
        self
    }

    /// The layer, if its configuration can work; otherwise every problem found, each naming
    /// the rule or route it concerns:
    ///
    /// - a rule that cannot work (see [`Rule::checked`]), or a key that cannot
    ///   ([`KeyExtractor::validate`](crate::key::KeyExtractor::validate));
    /// - a limit whose every request costs more than its rule admits at once (a
    ///   [`min_cost`](Limit::min_cost), or the rule's default cost, above its capacity);
    /// - a route pattern no request can match, or one an earlier route shadows;
    /// - a rule name applied twice to one request (its batch would count one state twice);
    /// - a rule name bound to two unequal rules anywhere in the layer (see
    ///   [One name, one configuration](crate::Rule#one-name-one-configuration));
    /// - [`FailurePolicy::Fallback`] over a store whose calls fail while Redis is away (see
    ///   [`Store::outage_health`]): it would let every request of an outage through.
    pub fn build(self) -> Result<RateLimitLayer<St>, ConfigError> {
        let (limiter, mut config) = (self.limiter, self.config);
        let limits = config
            .global
            .iter()
            .chain(self.routes.iter().flat_map(|r| &r.1));
        let mut problems = limits_problems(limits);
        for (pattern, limits) in self.routes {
            let pattern = match RoutePattern::parse(&pattern) {
                Ok(pattern) => pattern,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            if let Some(earlier) = config.routes.iter().find(|r| r.pattern.covers(&pattern)) {
                let (later, earlier) = (pattern.as_str(), earlier.pattern.as_str());
                problems.push(ConfigError::new(format!(
                    "route {later:?} can never match: the earlier route {earlier:?} takes every request it would, since both have the same shape"
                )));
            }
            config.routes.push(Route { pattern, limits });
        }
        problems.extend(names_problems(&config));
        problems.extend(fallback_problem(&config, limiter.store()));
        if config.held.max == 0 || config.held.max_per_key == Some(0) {
            problems.push(ConfigError::new(
                "max_held(0) or max_held_per_key(0) holds no request, so every delayed request is refused: use Mode::Enforce without a leaky bucket, or allow at least 1",
            ));
        }
        config.cache_derived();
        match ConfigError::collect(problems) {
            Some(e) => Err(e),
            None => Ok(RateLimitLayer {
                shared: Arc::new(Shared {
                    limiter,
                    config: ConfigSource::Fixed(Arc::new(Scope {
                        state: LayerState::new(&config, self.observers),
                        config,
                    })),
                }),
            }),
        }
    }

    /// Sets the mode (default [`Mode::Enforce`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.config.mode = mode;
        self
    }

    /// Holds at most `n` requests at once (default 10,000), across every service and clone
    /// of the layer; `0` is a [`build`](Self::build) error. [Observers](Self::observe) see
    /// the store's delay of a request refused beyond it. See
    /// [held requests](crate::guide::waiting_for_a_permit#held-requests).
    pub fn max_held(mut self, n: usize) -> Self {
        self.config.held.max = n;
        self
    }

    /// Holds at most `n` requests at once per (rule, key) that delays them (default: a tenth
    /// of [`max_held`](Self::max_held), at least 1), so one client cannot take every place;
    /// raise it for a rule on one key for all (a global leaky bucket). Beyond it a request is
    /// refused as with `max_held`. A key holding `n` takes another place only while fewer
    /// than `max_held × (1 − n / max_held_per_key)` are taken, so the last places go to the
    /// keys holding least.
    pub fn max_held_per_key(mut self, n: usize) -> Self {
        self.config.held.max_per_key = Some(n);
        self
    }

    /// Adds `observer`, told of every decision after those added before (and the `metrics`
    /// feature's). A [reload](super::ReloadHandle::reload) keeps the running layer's.
    pub fn observe(mut self, observer: impl DecisionObserver) -> Self {
        self.observers.add(observer);
        self
    }

    /// Sets what happens when the store fails (default [`FailurePolicy::FailOpen`]).
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.config.on_failure = policy;
        self
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` too (default
    /// `true`, so that a client slows down before it meets a 429; rejections always carry
    /// them). `false` suits a limit clients should not plan around, and saves rendering a
    /// header per admitted response. Rules in shadow are never advertised.
    pub fn headers_on_allowed(mut self, yes: bool) -> Self {
        self.config.headers_on_allowed = yes;
        self
    }

    /// Also writes the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now), describing on a rejection the rule that
    /// decided `Retry-After`, otherwise the rule with the least left.
    pub fn legacy_headers(mut self, yes: bool) -> Self {
        self.config.legacy_headers = yes;
        self
    }

    /// Builds rejections with `f` instead of the default. Start from
    /// [`Rejection::default_response`] to keep the standard headers (and the gRPC answer);
    /// the [`Rejection`]'s request head lets the answer suit the route and the client. Here
    /// an API route answers `application/problem+json` (RFC 9457):
    ///
    /// ```
    /// use http::{header::CONTENT_TYPE, HeaderValue};
    /// use tollgate::layer::RateLimitLayer;
    ///
    /// # fn main() -> Result<(), tollgate::ConfigError> {
    /// let layer = RateLimitLayer::builder().on_reject(|rejection| {
    ///     let mut response = rejection.default_response();
    ///     if rejection.request.uri().path().starts_with("/api/") {
    ///         let detail = rejection.message();
    ///         let problem = format!(r#"{{"title":"Too Many Requests","detail":"{detail}"}}"#);
    ///         *response.body_mut() = problem.into();
    ///         let json = HeaderValue::from_static("application/problem+json");
    ///         response.headers_mut().insert(CONTENT_TYPE, json);
    ///     }
    ///     response
    /// })
    /// .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn on_reject<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.config.on_reject = Some(Arc::new(f));
        self
    }

    /// Logs each kind of event (a store failure, a shadow denial, a key the server cannot
    /// provide…) at most once per `interval` (default 10 s): the first at once, then, when
    /// an `interval` ends with events left out, one line with their number (`suppressed`)
    /// and, for store failures, the `last_error`. `Duration::ZERO` logs every event.
    pub fn log_interval(mut self, interval: Duration) -> Self {
        self.config.log_interval = interval;
        self
    }

    /// Lets requests for which `is_exempt` says `true` through without any limit: health
    /// checks, an allow-list of addresses or API keys. It is asked before any key is
    /// extracted: an exempt request needs no key, consumes nothing, is seen by no
    /// [observer](Self::observe) and gets no `RateLimit` headers. Called again, each
    /// predicate is tried in turn.
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use tollgate::key::{self, KeyBuf, KeyExtractor};
    /// use tollgate::layer::RateLimitLayer;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // The office's addresses, as the client-IP key writes them.
    /// let office: HashSet<&[u8]> = [&b"203.0.113.7"[..], b"203.0.113.8"].into();
    /// let client = key::client_ip(["10.0.0.0/8"]);
    /// let layer = RateLimitLayer::builder()
    ///     .exempt(|head| head.uri().path() == "/health")
    ///     .exempt(move |head| {
    ///         // A `KeyBuf` keeps an address inline: no allocation per request.
    ///         let mut ip = KeyBuf::new();
    ///         client.extract(head, &mut ip).is_ok() && office.contains(ip.as_bytes())
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn exempt<F>(mut self, is_exempt: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.config.exempt = Some(match self.config.exempt.take() {
            None => Arc::new(is_exempt),
            Some(earlier) => {
                Arc::new(move |head: &RequestHead<'_>| earlier(head) || is_exempt(head))
            }
        });
        self
    }
}

/// The problems of each limit: its rule (once per rule), its key, a cost no request fits,
/// and its group of plans.
fn limits_problems<'a>(limits: impl Iterator<Item = &'a Limit>) -> Vec<ConfigError> {
    let mut problems = Vec::new();
    let mut checked: Vec<&Rule> = Vec::new();
    for limit in limits {
        if !checked.contains(&&limit.rule) {
            checked.push(&limit.rule);
            problems.extend(limit.rule.validate().err());
        }
        problems.extend(costs_problem(limit));
        problems.extend(limit.plan.as_ref().and_then(|plan| plan.problem()));
        let name = limit.rule.name();
        let key = limit.key.validate().err();
        problems.extend(key.map(|e| e.within(format_args!("the key of rule {name:?}"))));
    }
    problems
}

/// A `min_cost` or default cost above the rule's capacity: every request refused.
fn costs_problem(limit: &Limit) -> Option<ConfigError> {
    limit.rule.validate().ok()?;
    let capacity = limit.rule.algorithm().quota().0;
    let least = match limit.cost {
        Some(_) => limit.min_cost,
        None => limit.rule.cost().max(limit.min_cost),
    };
    (least > capacity).then(|| {
        ConfigError::new(format!(
            "rule {:?}: every request costs at least {least}, more than the {capacity} it admits at once, so every request would be refused",
            limit.rule.name()
        ))
    })
}

/// [`FailurePolicy::Fallback`] over a store that fails in an outage: every request passes.
fn fallback_problem(config: &Config, store: &impl Store) -> Option<ConfigError> {
    let fails = store.outage_health() == Health::Failing;
    (config.on_failure == FailurePolicy::Fallback && fails).then(|| {
        ConfigError::new(
            "on_failure(FailurePolicy::Fallback) needs a store that decides locally while Redis is away, \
             but this store's calls then fail, so every request of an outage would pass unlimited: \
             build the limiter on store::Fallback::new(Breaker::new(store)) (a store wrapping one \
             forwards Store::outage_health), or choose FailurePolicy::FailOpen or FailClosed",
        )
    })
}

/// A rule name may appear once per request, and a name stands for one rule in the whole
/// layer (see [`RateLimitLayerBuilder::build`]).
fn names_problems(config: &Config) -> Vec<ConfigError> {
    let mut problems = Vec::new();
    let mut bound: HashMap<&str, (&Rule, Option<usize>)> = HashMap::new();
    let mut reported: HashSet<&str> = HashSet::new();
    for route in config.batches() {
        let place = |route| config.route_pattern(route).unwrap_or("every request");
        let mut seen = HashSet::new();
        for limit in config.limits(route) {
            let name = limit.rule.name();
            let (first, first_route) = *bound.entry(name).or_insert((&limit.rule, route));
            if *first != limit.rule && reported.insert(name) {
                problems.push(ConfigError::new(format!(
                    "rule name {name:?} is bound to two different rules, {first:?} on {} and {:?} on {}; \
                     a name is one limit (its state is stored under the name): give each configuration its own name",
                    place(first_route),
                    limit.rule,
                    place(route),
                )));
            }
            if !seen.insert(name) {
                problems.push(ConfigError::new(format!(
                    "rule {name:?} is applied twice to {}; give each limit its own rule name",
                    place(route)
                )));
            }
        }
    }
    problems
}

impl<S, St: Store + Clone> Layer<S> for RateLimitLayer<St> {
    type Service = RateLimit<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}
