//! The operator's view of a running [`tollgate`] layer: which rules it enforces,
//! how their decisions move, which keys they deny most, the store's health, one key's
//! state, and an unblock; as a JSON API and one HTML page, in an axum [`Router`] to mount
//! behind the application's own authentication.
//!
//! It is built on tollgate's public seam only: an [`Activity`] recorder set on the layer as
//! its [`DecisionObserver`](tollgate::layer::DecisionObserver), the layer's
//! [`rules`](tollgate::layer::RateLimitLayer::rules), and
//! [`Limiter::peek_stored`](tollgate::Limiter::peek_stored) /
//! [`reset_stored`](tollgate::Limiter::reset_stored).
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
//!     .bearer_token("a secret of 16 characters or more")
//!     .router();
//! let app: Router = Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .layer(layer)
//!     .nest("/admin", admin);
//! # let _ = app; Ok(()) }
//! ```
//!
//! # What it serves
//!
//! Relative to where it is mounted (`/admin` above):
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the page: per rule its chart of decisions over the last five minutes and its most denied keys with an unblock button, the store's health, a form to look a key up (`?rule=&key=`) |
//! | `POST /login` | the page's sign-in form (`token`): sets a session cookie |
//! | `POST /unblock` | the page's unblock button (`rule`, `key_hex`, `digested`, `csrf`) |
//! | `GET /api/rules` | each rule: algorithm, quota, penalty, routes, mode |
//! | `GET /api/decisions` | per rule, admitted, delayed and denied per second, oldest first, ending now |
//! | `GET /api/top?n=` | per rule, its most denied keys, their count's error, the bound, distinct keys |
//! | `GET /api/health` | the store's health (a fallback deciding, a breaker open) |
//! | `GET /api/key?rule=&key=` | one key's state in the store (`key_hex=` for exact bytes) |
//! | `POST /api/unblock?rule=&key=` | clears the key's state and lifts its lock, in the store for every instance |
//!
//! Decisions and top keys are this instance's (see [`Activity`]); a key's state is the
//! store's. The rules are the layer's current ones: a router made
//! from a [reloadable](tollgate::layer::RateLimitLayer::reloadable) layer follows its
//! reloads.
//!
//! # Who may use it
//!
//! Mount it behind the application's authentication, off the public network. With a
//! [`bearer_token`](Admin::bearer_token) it also asks for one itself: scripts send
//! `Authorization: Bearer …`, browsers sign in through the page's form, which sets a
//! session cookie (`HttpOnly`, `SameSite=Strict`, signed with a key random per router).
//! Tokens are compared in constant time; after 10 failed attempts within 15 minutes a
//! client address (axum's `ConnectInfo`, or one count for all without it) is refused
//! everything until the window ends, counted by tollgate itself.
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
use self::auth::{Access, Failures, Secrets};
use tollgate::layer::RateLimitLayer;
use tollgate::store::Store;

/// The admin router of a [`RateLimitLayer`]; see the [crate docs](crate).
pub struct Admin<St> {
    layer: RateLimitLayer<St>,
    activity: Arc<RuleActivities>,
    token: Option<String>,
}

/// What every route of the router shares.
struct Shared<St> {
    layer: RateLimitLayer<St>,
    activity: Arc<RuleActivities>,
    secrets: Secrets,
    failures: Failures,
}

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
        }
    }

    /// Asks for `token` too: as `Authorization: Bearer <token>`, or once in the page's
    /// sign-in form. Use a long random secret.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The router, to [`nest`](Router::nest) where the application wants it.
    pub fn router(self) -> Router {
        let shared = Arc::new(Shared {
            layer: self.layer,
            activity: self.activity,
            secrets: Secrets::new(self.token.as_deref().map(str::as_bytes)),
            failures: Failures::new(),
        });
        Router::new()
            .route("/", get(page::index::<St>))
            .route("/login", post(page::login::<St>))
            .route("/unblock", post(page::unblock::<St>))
            .route("/api/rules", get(api::rules::<St>))
            .route("/api/decisions", get(api::decisions::<St>))
            .route("/api/top", get(api::top::<St>))
            .route("/api/health", get(api::health::<St>))
            .route("/api/key", get(api::key::<St>))
            .route("/api/unblock", post(api::unblock::<St>))
            .layer(middleware::from_fn_with_state(shared.clone(), guard::<St>))
            .with_state(shared)
    }
}

/// Lets a request in as its credentials say, refusing a client address that failed too
/// often; only the page and its sign-in form are served to a request without any.
async fn guard<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let address = Failures::address(&request);
    if shared.failures.locked_out(&address).await {
        let body = "too many failed attempts: try again later\n";
        return (StatusCode::TOO_MANY_REQUESTS, body).into_response();
    }
    let access = match shared.secrets.access(request.headers()) {
        Ok(access) => access,
        Err(()) => {
            shared.failures.fail(&address).await;
            return unauthorized();
        }
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
            .finish()
    }
}
