//! The operator's view of a running [`tollgate`] layer: which rules it enforces,
//! how their decisions move, which keys they deny most and which they lock (until when),
//! the store's health (a circuit breaker's state, how full an in-process store is), the
//! keys a user name or an address finds, and an unblock; as a JSON API and one HTML page,
//! in an axum [`Router`] to mount behind the application's own authentication.
//!
//! It is built on tollgate's public seam only: an [`Activity`] recorder set on the layer as
//! its [`DecisionObserver`](tollgate::layer::DecisionObserver), the layer's
//! [`rules`](tollgate::layer::RateLimitLayer::rules), and
//! [`Limiter::peek`](tollgate::Limiter::peek) /
//! [`reset`](tollgate::Limiter::reset).
//!
//! ```
//! use std::time::Duration;
//! use axum::Router;
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Rule};
//! use tollgate_admin::{Activity, Admin};
//!
//! # fn main() -> Result<(), tollgate::ConfigError> {
//! let activity = Activity::new();
//! let (layer, _reload) = RateLimitLayer::builder()
//!     .limit(Limit::new(Rule::fixed_window("per-user", 100, Duration::from_secs(60)), key::header("user-id")))
//!     .observe(activity.clone())
//!     .build()?
//!     .reloadable();
//! let admin = Admin::new(&layer, &activity)
//!     .bearer_token("c3000dbcba30a94e90d4be5861183f6b") // openssl rand -hex 16
//!     .router()
//!     .expect("a random token");
//! let app: Router = Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .layer(layer)
//!     .nest_service("/admin", admin);
//! # let _ = app; Ok(()) }
//! ```
//!
//! Mount it with [`nest_service`](Router::nest_service): it serves the page at `/admin`
//! and `/admin/` alike, where axum's [`nest`](Router::nest) routes `/admin` only.
//!
//! # What it serves
//!
//! Relative to where it is mounted (`/admin` above):
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the page: the store's health, the locked keys with an unblock button, a form to look keys up (`?rule=&key=`), and per rule its chart of decisions over the last five minutes and its most denied keys |
//! | `POST /login` | the page's sign-in form (`token`): sets a session cookie |
//! | `POST /logout` | the page's sign-out button (`csrf`): ends the session |
//! | `POST /unblock` | the page's unblock button (`rule`, `key_hex`, `digested`, `csrf`) |
//! | `GET /api/rules` | each rule: algorithm, quota, penalty, routes, mode |
//! | `GET /api/decisions` | per rule, admitted, delayed and denied per second, oldest first, ending now |
//! | `GET /api/top?n=` | per rule, its most denied keys, their count's error, the bound, distinct keys |
//! | `GET /api/locked?n=` | per rule with a penalty, the keys it locks now and until when |
//! | `GET /api/health` | the store's health (a fallback deciding, a breaker open), a [breaker](Admin::breaker)'s state, an [in-process store](Admin::memory_store)'s fill |
//! | `GET /api/key?rule=&key=` | one key's state in the store (`key_hex=` for exact bytes) |
//! | `GET /api/find?key=&rule=` | the keys `key` names under the rule (any rule without `rule=`): itself, and the keys denied lately with it as a part (`alice` finds `203.0.113.7␟alice`), with their state |
//! | `POST /api/unblock?rule=&key=` | clears the key's state and lifts its lock, in the store for every instance |
//!
//! Decisions, top keys, and which keys were seen locked or denied are this instance's (see
//! [`Activity`]); a key's state, and whether a listed key is locked now, is the store's.
//! Locked keys are remembered sixteen times as many as other denied keys; past that, the
//! page and the API say how many locks were forgotten, and that the list (and a lookup by
//! a part) is not complete. Keys are shown so that none passes for another: characters
//! that show nothing are escaped (`\u{…}`), a key kept as a digest reads `sha256:` and its
//! hex (which the lookup takes back), and a key spelled so itself has its colon escaped.
//! The rules are the layer's current ones: a router made
//! from a [reloadable](tollgate::layer::RateLimitLayer::reloadable) layer follows its
//! reloads.
//!
//! # Who may use it
//!
//! Mount it behind the application's authentication, off the public network. With a
//! [`bearer_token`](Admin::bearer_token) (a random one, 32 characters at least) it also
//! asks for one itself;
//! with none, the router is made only if told so by name
//! ([`without_token`](Admin::without_token)). Scripts send `Authorization: Bearer …`;
//! browsers sign in through the page's form (taken only from the router's own origin),
//! which sets a session cookie (`HttpOnly`, `SameSite=Strict`, `Secure` unless
//! [`insecure_cookies`](Admin::insecure_cookies), scoped to the path the router is mounted
//! at, signed with a key random per router, valid 8 hours; the page's *Sign out* ends it).
//! Tokens are compared in constant time. After 10 failed attempts within 15 minutes, a
//! client (an IPv4 address or an IPv6 /64, from axum's `ConnectInfo`; one count for all
//! without it) has its attempts answered `429` without being checked until the window
//! ends, counted by tollgate itself in a store bounded to 65,536 clients. A session is
//! never refused, and failures from one client never refuse another; a browser that
//! signed in before carries a device cookie (signed, 30 days) and counts apart from its
//! address, so others sharing the address cannot make it wait to sign in anew.
//!
//! A change from a browser (an unblock) must carry the anti-forgery token the page puts in
//! its forms (the `csrf` field, or an `x-csrf-token` header), derived from a `SameSite=Strict`
//! cookie of the router's: another site can neither read it nor make the browser send it.
//! A request with the bearer token is not a browser's and needs none. Pages are sent with a
//! content security policy that forbids framing and other origins.

mod activity;
mod api;
mod auth;
mod page;
mod render;
mod text;
mod view;
mod watch;

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::{header, StatusCode};

pub use self::activity::Activity;
use self::activity::RuleActivities;
use self::auth::{guessable, Access, Attempt, CookieScope, Failures, Secrets};
use self::watch::{BreakerWatch, MemoryWatch};
use tollgate::layer::RateLimitLayer;
use tollgate::store::{Breaker, MemoryStore, Store};

/// The admin router of a [`RateLimitLayer`]; see the [crate docs](crate).
pub struct Admin<St> {
    layer: RateLimitLayer<St>,
    activity: Arc<RuleActivities>,
    token: Option<String>,
    without_token: bool,
    secure_cookies: bool,
    watched: Watched,
}

/// What the router was given to watch beside the limiter's health.
#[derive(Debug, Clone, Default)]
struct Watched {
    breaker: Option<BreakerWatch>,
    memory: Option<MemoryWatch>,
}

/// What every route of the router shares.
struct Shared<St> {
    layer: RateLimitLayer<St>,
    activity: Arc<RuleActivities>,
    secrets: Secrets,
    failures: Failures,
    secure_cookies: bool,
    watched: Watched,
}

impl<St> Shared<St> {
    /// How cookies are set for the router mounted at `base`.
    fn cookie_scope<'a>(&self, base: &'a str) -> CookieScope<'a> {
        CookieScope {
            path: base,
            secure: self.secure_cookies,
        }
    }
}

impl<St: Store> Shared<St> {
    /// The store's health, with what the router watches beside it.
    fn health(&self) -> view::HealthView {
        let watched = &self.watched;
        let health = self.layer.limiter().health();
        view::health(health, watched.breaker.as_ref(), watched.memory.as_ref())
    }
}

/// Why [`Admin::router`] refused to make a router: its door would not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError(String);

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AdminError {}

impl<St: Store + Clone> Admin<St> {
    /// The admin of `layer`: its limiter and its rules (followed across reloads when
    /// `layer` is [reloadable](RateLimitLayer::reloadable)), and the decisions `activity`
    /// records (set it on the layer with
    /// [`observe`](tollgate::layer::RateLimitLayerBuilder::observe)).
    pub fn new(layer: &RateLimitLayer<St>, activity: &Activity) -> Self {
        Self {
            layer: layer.clone(),
            activity: Arc::clone(&activity.0),
            token: None,
            without_token: false,
            secure_cookies: true,
            watched: Watched::default(),
        }
    }

    /// Shows the state of `breaker` (closed, or open while its [health](Store::health) is
    /// failing), the circuit breaker in the layer's store: the limiter's health says only
    /// that a store is away, not whether its breaker is open. Pass the breaker before it
    /// goes into the store (or a clone of it: clones share their state), e.g. the one
    /// around the primary store of a [`Fallback`](tollgate::store::Fallback).
    pub fn breaker<S: Store + Clone>(mut self, breaker: &Breaker<S>) -> Self {
        self.watched.breaker = Some(BreakerWatch::of(breaker));
        self
    }

    /// Shows how full `store` is: the keys it holds, and whether it is at its
    /// [bound](MemoryStore::max_keys), forgetting entries to make room for new keys (it
    /// [evicted](tollgate::store::MemoryStats::evictions) some in the last five minutes) or
    /// denying new keys for want of room ([refusals](tollgate::store::MemoryStats::refusals)),
    /// with what that means. Pass the in-process store the layer decides in, or the local
    /// store of a [`Fallback`](tollgate::store::Fallback) (a clone: clones share their state).
    pub fn memory_store(mut self, store: &MemoryStore) -> Self {
        self.watched.memory = Some(MemoryWatch::of(store));
        self
    }

    /// Asks for `token`: as `Authorization: Bearer <token>`, or once in the page's sign-in
    /// form. It must be random: 32 visible ASCII characters at least, neither a repeated
    /// part nor too regular (`openssl rand -hex 32` writes one); [`router`](Self::router)
    /// refuses a token that could be guessed.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Asks for no token: the application's own authentication in front of the router
    /// decides who reaches it. Without this or a [`bearer_token`](Self::bearer_token),
    /// [`router`](Self::router) refuses to make an open door by omission.
    pub fn without_token(mut self) -> Self {
        self.without_token = true;
        self
    }

    /// Sets the session and anti-forgery cookies without `Secure`, for a router served
    /// over plain HTTP off `localhost` (behind a proxy that terminates TLS elsewhere, or in
    /// development). By default they are `Secure`: a browser sends them over HTTPS only
    /// (and to `http://localhost`).
    pub fn insecure_cookies(mut self) -> Self {
        self.secure_cookies = false;
        self
    }

    /// The router, to mount with [`nest_service`](Router::nest_service) where the
    /// application wants it (see the [crate docs](crate)); refused when a
    /// token could be guessed (the error says why and how to make one), or when neither a token nor
    /// [`without_token`](Self::without_token) was given.
    pub fn router(self) -> Result<Router, AdminError> {
        if let Some(why) = self.token.as_deref().and_then(guessable) {
            return Err(AdminError(format!(
                "tollgate-admin: the bearer token {why}: it could be guessed; use a random one of 32 characters or more, such as `openssl rand -hex 32` writes"
            )));
        }
        match (&self.token, self.without_token) {
            (Some(_), true) => {
                return Err(AdminError(
                    "tollgate-admin: bearer_token and without_token both given; choose one".into(),
                ));
            }
            (None, false) => {
                return Err(AdminError(
                    "tollgate-admin: no bearer_token given; if the application's own authentication guards the router, say so with without_token()".into(),
                ));
            }
            _ => {}
        }
        let shared = Arc::new(Shared {
            layer: self.layer,
            activity: self.activity,
            secrets: Secrets::new(self.token.as_deref().map(str::as_bytes)),
            failures: Failures::new(),
            secure_cookies: self.secure_cookies,
            watched: self.watched,
        });
        Ok(Router::new()
            .route("/", get(page::index::<St>))
            .route("/login", post(page::login::<St>))
            .route("/logout", post(page::logout::<St>))
            .route("/unblock", post(page::unblock::<St>))
            .route("/api/rules", get(api::rules::<St>))
            .route("/api/decisions", get(api::decisions::<St>))
            .route("/api/top", get(api::top::<St>))
            .route("/api/locked", get(api::locked::<St>))
            .route("/api/health", get(api::health::<St>))
            .route("/api/key", get(api::key::<St>))
            .route("/api/find", get(api::find::<St>))
            .route("/api/unblock", post(api::unblock::<St>))
            .layer(middleware::from_fn_with_state(shared.clone(), guard::<St>))
            .with_state(shared))
    }
}

/// Lets a request in as its credentials say; only the page and its sign-in form are served
/// to a request without any. A bearer token is an [attempt](Failures::attempt): checked
/// only while its client is under the limit on failures, refused with `429` past it.
async fn guard<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let access = match shared.secrets.offered(request.headers()) {
        Some(given) => {
            let attempter = shared.secrets.attempter(&request);
            let right = || shared.secrets.token_matches(given);
            match shared.failures.attempt(&attempter, right).await {
                Attempt::Right => Access::Bearer,
                Attempt::Wrong => return unauthorized(),
                Attempt::Refused => {
                    let body = "too many failed attempts: try again later\n";
                    return (StatusCode::TOO_MANY_REQUESTS, body).into_response();
                }
            }
        }
        None => shared.secrets.access(request.headers()),
    };
    let path = request.uri().path();
    let sign_in = path == "/" || path.is_empty() || path == "/login";
    if access == Access::Denied && !sign_in {
        return unauthorized();
    }
    request.extensions_mut().insert(access);
    next.run(request).await
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "unauthorized\n",
    )
        .into_response()
}

impl<St: fmt::Debug> fmt::Debug for Admin<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("layer", &self.layer)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("without_token", &self.without_token)
            .field("secure_cookies", &self.secure_cookies)
            .field("watched", &self.watched)
            .finish()
    }
}

/// The README's example compiles as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
