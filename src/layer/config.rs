//! What a layer enforces: [`Limit`]s, the route table, the mode, the failure policy and
//! the hooks, shared by every clone of the service behind one `Arc`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};

use super::charge::counts::Charge;
use super::headers::policy_value;
use super::held::bounds::HeldLimits;
use super::observe::record::RuleMetrics;
use super::plans::select::PlanGuard;
use super::response::Rejection;
use super::routes::RoutePattern;
use crate::key::{KeyExtractor, RequestHead};
use crate::log::DEFAULT_LOG_INTERVAL;
use crate::rule::Rule;

/// A rule applied to requests: the [`Rule`], the key it counts under, what a request costs,
/// and what to do when a request has no key.
///
/// ```
/// use std::time::Duration;
/// use http::header::CONTENT_LENGTH;
/// use tollgate::layer::{Limit, MissingKey};
/// use tollgate::{key, Rule};
///
/// /// The size in MB of a file the server holds, from the server's own records.
/// fn size_mb(path: &str) -> Option<u64> {
///     # let _ = path; Some(7)
///     // …
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Downloads: 100 MB per user per hour. A request is admitted if the file it names fits
/// // (its size as the server knows it, at least 1), and costs what the response served.
/// let downloads = Limit::new(
///     Rule::fixed_window("download-mb", 100, Duration::from_secs(3600)),
///     key::header("user-id"),
/// )
/// // The name as the handler sees it: axum's `Path` percent-decodes, so `%61.iso` is `a.iso`.
/// .cost(|req| {
///     let raw = req.uri().path().strip_prefix("/files/").unwrap_or_default();
///     let name = percent_encoding::percent_decode_str(raw).decode_utf8();
///     name.ok().and_then(|name| size_mb(&name)).unwrap_or(0)
/// })
/// .min_cost(1)
/// // What was served settles the cost, whatever the estimate made of the path.
/// .cost_from_response(|res| {
///     let bytes: u64 = res.headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()?;
///     Some(bytes.div_ceil(1_000_000))
/// })
/// .on_missing_key(MissingKey::Reject);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limit {
    pub(crate) rule: Rule,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) min_cost: u64,
    /// What the response says the request cost (see [`Limit::cost_from_response`]).
    pub(crate) settled_cost: Option<Arc<SettledCostFn>>,
    pub(crate) on_missing: MissingKey,
    pub(crate) shadow: bool,
    pub(crate) charge: Charge,
    /// The limit's metric keys (with the `metrics` feature), made once here.
    pub(crate) metrics: RuleMetrics,
    /// Set when this limit is one plan of a [`Plans`](super::Plans): it applies to the
    /// requests of that plan only.
    pub(crate) plan: Option<PlanGuard>,
}

type CostFn = dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync;
type SettledCostFn = dyn Fn(&http::response::Parts) -> Option<u64> + Send + Sync;

impl Limit {
    /// `rule`, counted under the key `key` finds, at the rule's default cost; a request
    /// without a key is rejected with 400.
    pub fn new(rule: Rule, key: impl KeyExtractor) -> Self {
        Self::from_shared(rule, Arc::new(key))
    }

    /// [`new`](Self::new) with a key extractor already shared.
    pub(crate) fn from_shared(rule: Rule, key: Arc<dyn KeyExtractor>) -> Self {
        Self {
            metrics: RuleMetrics::new(&rule),
            rule,
            key,
            cost: None,
            min_cost: 0,
            settled_cost: None,
            on_missing: MissingKey::Reject,
            shadow: false,
            charge: Charge::default(),
            plan: None,
        }
    }

    /// Sets what a request costs (the download case: the size of what it fetches). A cost
    /// of 0 consumes nothing.
    ///
    /// Compute the cost from what the server knows (the stored file's size), never from a
    /// number the client writes: a client that writes `0` downloads without limit. Clamp a
    /// cost that can be 0 with [`min_cost`](Self::min_cost); where only the handler knows,
    /// let the response settle it: [`cost_from_response`](Self::cost_from_response).
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Sets the least a request costs (default 0): the [`cost`](Self::cost) function's
    /// answer, or the rule's default cost, is raised to `units`.
    pub fn min_cost(mut self, units: u64) -> Self {
        self.min_cost = units;
        self
    }

    /// Sets what a request costs by its response: `cost` reads the response's head (its
    /// `Content-Length`, or a value the handler puts in its extensions) and says the cost,
    /// or `None` to keep the estimate it was admitted on ([`cost`](Self::cost)'s answer or
    /// the rule's cost, raised to [`min_cost`](Self::min_cost)). The settled cost, raised to
    /// `min_cost` too, is charged whole:
    /// - **less than the estimate**: the difference is given back, as exactly as a
    ///   [`Charge`] gives back (see [`Store::refund`](crate::store::Store::refund));
    /// - **more**: the difference is taken without a check, however far above the limit: the
    ///   key is refused until the rule's own rate has paid the debt, and the retry-after names
    ///   that instant.
    ///
    /// The estimate decides admission: an upper bound keeps the requests in flight within the
    /// limit; a low one lets them overrun it by what the estimates in flight leave uncounted.
    /// An error of the inner service, or a response that never comes, keeps the estimate; a
    /// response the [`charge`](Self::charge) does not count gives back everything. On Redis
    /// the settlement runs as a task once the response is returned, after its `RateLimit`
    /// header was written.
    ///
    /// Only the head is read: a streamed body's size is what the handler says. On axum,
    /// `Content-Length` of a known-size body is added after `Router::layer` and `route_layer`
    /// layers see the response: behind them, the handler sets the header or an extension.
    /// How to choose the estimate, with an example: the
    /// [download guide](crate::guide::download_by_cost).
    pub fn cost_from_response<F>(mut self, cost: F) -> Self
    where
        F: Fn(&http::response::Parts) -> Option<u64> + Send + Sync + 'static,
    {
        self.settled_cost = Some(Arc::new(cost));
        self
    }

    /// Sets what happens to a request the key extractor finds no key for (default
    /// [`MissingKey::Reject`]). To try another extractor instead, combine them with
    /// [`KeyExtractor::or`].
    pub fn on_missing_key(mut self, policy: MissingKey) -> Self {
        self.on_missing = policy;
        self
    }

    /// Makes this a shadow limit: decided in the same batch as the enforced limits, keeping
    /// its state as if enforced, but it never rejects or holds a request, and is not
    /// advertised in the `RateLimit` headers. A request it would deny consumes none of its
    /// quota and counts towards its penalty, and one the enforced limits deny consumes
    /// nothing of it; the would-be denial is reported through `tracing` and to
    /// [observers](super::DecisionObserver). A missing key is logged and the limit left out,
    /// whatever [`on_missing_key`](Self::on_missing_key) says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::layer::{Limit, RateLimitLayer};
    /// use tollgate::{key, Limiter, Rule, store::MemoryStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .limit(Limit::new(Rule::fixed_window("per-user", 100, Duration::from_secs(60)), key::header("user-id")))
    ///     // Would 20 a minute be too strict? Watch its denials before enforcing it.
    ///     .limit(Limit::new(Rule::fixed_window("per-user-shadow", 20, Duration::from_secs(60)), key::header("user-id")).shadow())
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Sets which requests count, by the status of their response (by default every
    /// request): failed logins only, say ([`Charge::failures`]). See [`Charge`].
    pub fn charge(mut self, charge: Charge) -> Self {
        self.charge = charge;
        self
    }

    /// Whether a refusal of this limit counts towards its penalty only once the requests
    /// of its key in flight have settled (see `charge::unsettled`): a limit charged by
    /// outcome with a penalty, enforced (a shadow limit's refusal refuses nothing).
    pub(crate) fn defers_denials(&self) -> bool {
        !self.charge.counts_all() && self.rule.penalty().is_some() && !self.shadow
    }

    pub(crate) fn cost_of(&self, req: &RequestHead<'_>) -> u64 {
        let cost = self.cost.as_ref().map_or(self.rule.cost(), |f| f(req));
        cost.max(self.min_cost)
    }

    /// Whether a request's units wait for its response to settle them: the limit counts
    /// by outcome, or reads its cost from the response.
    pub(crate) fn settles_by_response(&self) -> bool {
        !self.charge.counts_all() || self.settled_cost.is_some()
    }

    /// What a request that took `taken` units costs by its response's head: nothing if the
    /// charge does not count the response, what the response says (raised to `min_cost`)
    /// if the limit reads its cost from it and it says, else what was taken.
    pub(crate) fn settled_cost(&self, taken: u64, response: &http::response::Parts) -> u64 {
        if !self.charge.counts(response.status) {
            return 0;
        }
        self.settled_cost
            .as_ref()
            .and_then(|f| f(response))
            .map_or(taken, |cost| cost.max(self.min_cost))
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("rule", &self.rule.name())
            .field("cost_fn", &self.cost.is_some())
            .field("min_cost", &self.min_cost)
            .field("cost_from_response", &self.settled_cost.is_some())
            .field("on_missing", &self.on_missing)
            .field("shadow", &self.shadow)
            .field("charge", &self.charge)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// What a limit does with a request that has no key (a missing `User-Id` header, say).
/// A key the server can never provide (a peer-IP key without connection info) is always a
/// 500, whatever the policy; the message naming the fix is logged, not sent to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Refuse the request: 400 Bad Request naming the missing key (gRPC
    /// `INVALID_ARGUMENT`). The default.
    #[default]
    Reject,
    /// Let the request through without this limit (other limits still apply).
    Skip,
}

/// How the layer acts on decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Reject denied requests; hold delayed ones (leaky-bucket shaping) for their delay.
    #[default]
    Enforce,
    /// Decide and record as in enforce mode, but never reject or hold a request: for
    /// rolling out a layer safely. Denials are reported as a [`Limit::shadow`]'s are; a
    /// request without a key, or a failed store, is logged and let through too.
    Shadow,
    /// Hold a request until it is admitted, if that is within `max_wait`: its units are
    /// reserved atomically at once (no polling), and the request is forwarded when they come
    /// due. A request that would wait longer is rejected as in enforce mode.
    Wait {
        /// The longest a request is held.
        max_wait: Duration,
    },
}

impl Mode {
    /// The longest a request is held for its units to come due: `max_wait` in
    /// [`Mode::Wait`], zero otherwise.
    pub(crate) fn max_wait(self) -> Duration {
        match self {
            Mode::Wait { max_wait } => max_wait,
            _ => Duration::ZERO,
        }
    }
}

/// What the layer does when the store fails (unreachable, timed out); logged at most once
/// per [`log_interval`](super::RateLimitLayerBuilder::log_interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through unlimited. The default: an outage of the limiter should not
    /// become an outage of the service.
    #[default]
    FailOpen,
    /// Refuse the request with 503 (gRPC `UNAVAILABLE`).
    FailClosed,
    /// Decide from a local store while the shared one is away: build the limiter on a
    /// [`store::Fallback`](crate::store::Fallback), with a
    /// [`store::Breaker`](crate::store::Breaker) in front of Redis so that no request waits
    /// on it while it is away. If the local store fails too, the request is let through, and
    /// logged. [`build`](super::RateLimitLayerBuilder::build) refuses this policy over a
    /// store whose calls fail while Redis is away
    /// ([`Store::outage_health`](crate::store::Store::outage_health)). See
    /// [When Redis is away](crate::guide::when_redis_is_away).
    Fallback,
}

pub(crate) type RejectFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type ExemptFn = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

/// One entry of the route table.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) pattern: RoutePattern,
    pub(crate) limits: Vec<Limit>,
}

/// Everything a layer enforces.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) global: Vec<Limit>,
    pub(crate) routes: Vec<Route>,
    pub(crate) mode: Mode,
    pub(crate) on_failure: FailurePolicy,
    /// Whether admitted responses carry the rate-limit headers too (rejections always do).
    pub(crate) headers_on_allowed: bool,
    /// Whether responses carry the legacy `X-RateLimit-*` headers too.
    pub(crate) legacy_headers: bool,
    pub(crate) on_reject: Option<Arc<RejectFn>>,
    pub(crate) exempt: Option<Arc<ExemptFn>>,
    /// How often the layer's log writes each kind of event (see `log_interval`).
    pub(crate) log_interval: Duration,
    pub(crate) held: HeldLimits,
    /// Per route (no route first), what its limits imply ([`Config::cache_derived`]).
    pub(crate) routes_derived: Vec<Derived>,
}

/// What a route's limits imply, worked out once so that a request does not go through
/// them again: a request's limits are a subsequence of its route's.
#[derive(Debug, Clone)]
pub(crate) struct Derived {
    /// The number of its enforced limits, and their `RateLimit-Policy` value.
    enforced: usize,
    policy: Option<HeaderValue>,
    /// Whether any of its limits is in shadow, waits for the response
    /// ([`Limit::settles_by_response`]), leaves its denials to the layer
    /// ([`Limit::defers_denials`]): a request on a route with none skips that walk.
    pub(crate) shadow: bool,
    pub(crate) settles_by_response: bool,
    pub(crate) defers_denials: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            global: Vec::new(),
            routes: Vec::new(),
            mode: Mode::default(),
            on_failure: FailurePolicy::default(),
            headers_on_allowed: true,
            legacy_headers: false,
            on_reject: None,
            exempt: None,
            log_interval: DEFAULT_LOG_INTERVAL,
            held: HeldLimits::default(),
            routes_derived: Vec::new(),
        }
    }
}

impl Config {
    /// The route of a request: of the patterns that match it, the one axum's router would
    /// take (a literal segment before a parameter before a wildcard), the first declared
    /// among equals.
    pub(crate) fn route_for(&self, method: &http::Method, path: &str) -> Option<usize> {
        let pattern = |i: usize| &self.routes[i].pattern;
        (0..self.routes.len())
            .filter(|&i| pattern(i).matches(method, path))
            .min_by(|&a, &b| pattern(a).ranks().cmp(pattern(b).ranks()))
    }

    /// The limits of a request on `route`: the layer's own, then the route's.
    pub(crate) fn limits(&self, route: Option<usize>) -> impl Iterator<Item = &Limit> + Clone {
        let routed = route
            .and_then(|r| self.routes.get(r))
            .map_or(&[][..], |r| &r.limits[..]);
        self.global.iter().chain(routed)
    }

    /// The `i`-th limit of [`limits`](Self::limits).
    pub(crate) fn limit(&self, route: Option<usize>, i: usize) -> Option<&Limit> {
        match i.checked_sub(self.global.len()) {
            None => self.global.get(i),
            Some(j) => self.routes.get(route?)?.limits.get(j),
        }
    }

    /// Every batch a request can get: the layer's limits alone (`None`), then each route's.
    pub(crate) fn batches(&self) -> impl Iterator<Item = Option<usize>> + use<> {
        std::iter::once(None).chain((0..self.routes.len()).map(Some))
    }

    /// Works out once what the final limits imply: each route's [`Derived`].
    pub(crate) fn cache_derived(&mut self) {
        self.routes_derived = self
            .batches()
            .map(|route| {
                let enforced = || self.limits(route).filter(|l| !l.shadow);
                Derived {
                    enforced: enforced().count(),
                    policy: policy_value(enforced().map(|l| &l.rule)),
                    shadow: self.limits(route).any(|l| l.shadow),
                    settles_by_response: self.limits(route).any(Limit::settles_by_response),
                    defers_denials: self.limits(route).any(Limit::defers_denials),
                }
            })
            .collect();
    }

    /// What the limits of `route` imply; `None` before [`cache_derived`](Self::cache_derived).
    pub(crate) fn derived(&self, route: Option<usize>) -> Option<&Derived> {
        self.routes_derived.get(route.map_or(0, |r| r + 1))
    }

    /// The cached `RateLimit-Policy` value for a response on `route` that advertises
    /// `enforced` rules: it applies when they are all of the route's enforced limits (they
    /// are then the same rules in the same order, as a request's are a subsequence of its
    /// route's).
    pub(crate) fn policy(&self, route: Option<usize>, enforced: usize) -> Option<&HeaderValue> {
        let derived = self.derived(route).filter(|d| d.enforced == enforced)?;
        derived.policy.as_ref()
    }

    pub(crate) fn route_pattern(&self, route: Option<usize>) -> Option<&str> {
        route
            .and_then(|r| self.routes.get(r))
            .map(|r| r.pattern.as_str())
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("global", &self.global)
            .field("routes", &self.routes)
            .field("mode", &self.mode)
            .field("on_failure", &self.on_failure)
            .field("headers_on_allowed", &self.headers_on_allowed)
            .field("legacy_headers", &self.legacy_headers)
            .field("on_reject", &self.on_reject.is_some())
            .field("exempt", &self.exempt.is_some())
            .field("held", &self.held)
            .finish()
    }
}
