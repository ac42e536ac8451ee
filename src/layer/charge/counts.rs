//! Which responses a limit counts: the [`Charge`] a [`Limit`](crate::layer::Limit) is
//! configured with. What the layer does with it at run time is the folder's root.

use std::fmt;
use std::sync::Arc;

use http::StatusCode;

/// Which responses a [`Limit`](crate::layer::Limit) counts
/// ([`Limit::charge`](crate::layer::Limit::charge)); by default, every one.
///
/// A limit with a charge takes its units when the request is admitted, as every limit does,
/// and gives them back ([`Store::refund`](crate::store::Store::refund), as exactly as it says
/// for the rule's algorithm) when the response has a status the charge does not count. So,
/// under any concurrency, the requests that count never exceed the limit; requests that
/// will not count can be refused while requests in flight hold the quota, never more (a
/// fixed window or a sliding log gives back whatever was admitted meanwhile). A refund from
/// Redis runs as a task after the response is returned. An **error of the inner service**
/// and a **response that never comes** count; a rejection by the layer consumed nothing.
/// Only the HTTP status is read: a gRPC service's `grpc-status` trailer is not seen.
///
/// With a [`Penalty`](crate::Penalty) on the rule, a burst of successful logins never locks
/// its user out; a burst of failed ones does. A request checked alone (no other of its limit
/// and key being checked or in flight on this instance) is decided as usual. One checked
/// beside others has its refusal counted once they have answered (at most 2 s), if the
/// quota as it stands then refused it at the instant it was refused. Not seen: requests in
/// flight on **other instances** (a refusal they cause is counted); refusals beyond the
/// penalty's count while others wait for the same limit and key, and refusals at a held
/// request's release ([`Reservation::confirm`](crate::Reservation::confirm)) decided beside
/// others (not counted). A lock this later count sets is not in the refusal's own answer.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::layer::{Charge, Limit, RateLimitLayer};
/// use tollgate::{key, Limiter, Rule, store::MemoryStore};
/// use tower::{service_fn, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 3 failed logins per user per 15 minutes; successful logins do not count.
/// let layer = RateLimitLayer::builder()
///     .route("POST /login", [Limit::new(
///         Rule::fixed_window("failed-logins", 3, Duration::from_secs(900)),
///         key::header("user"),
///     )
///     .charge(Charge::failures())])
///     .build()?;
/// let login = tower::ServiceBuilder::new().layer(layer).service(service_fn(|req: Request<String>| async move {
///     let status = if req.body() == "right" { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
///     Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(String::new()).unwrap())
/// }));
/// let attempt = |password: &str| {
///     Request::post("/login").header("user", "alice").body(password.to_owned())
/// };
/// for _ in 0..10 {
///     assert_eq!(login.clone().oneshot(attempt("right")?).await?.status(), StatusCode::OK);
/// }
/// for _ in 0..3 {
///     assert_eq!(login.clone().oneshot(attempt("wrong")?).await?.status(), StatusCode::UNAUTHORIZED);
/// }
/// // The fourth failure is not even tried.
/// assert_eq!(login.oneshot(attempt("wrong")?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Charge(Option<(&'static str, Counts)>);

/// Whether a response of a status counts.
type Counts = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

impl Charge {
    /// Only `401 Unauthorized` and `403 Forbidden` count: failed logins, bad API keys. A
    /// client that signs in correctly never uses up the quota of failed attempts.
    pub fn failures() -> Self {
        let failed = |s| s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN;
        Self(Some(("failures()", Arc::new(failed))))
    }

    /// Every response but a server error (`5xx`) counts, so that a failing backend does not
    /// use up its clients' quotas.
    pub fn except_server_errors() -> Self {
        let counts = |s: StatusCode| !s.is_server_error();
        Self(Some(("except_server_errors()", Arc::new(counts))))
    }

    /// The responses for which `counts` says `true` count.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::StatusCode;
    /// use tollgate::layer::{Charge, Limit};
    /// use tollgate::{key, Rule};
    ///
    /// // 20 rejected uploads (4xx) per client per hour; accepted ones do not count.
    /// let rejected = Charge::when(|status: StatusCode| status.is_client_error());
    /// let uploads = Limit::new(Rule::sliding_log("bad-uploads", 20, Duration::from_secs(3600)), key::peer_ip())
    ///     .charge(rejected);
    /// # let _ = uploads;
    /// ```
    pub fn when<F>(counts: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        Self(Some(("when(..)", Arc::new(counts))))
    }

    /// Whether a response with `status` counts.
    pub(crate) fn counts(&self, status: StatusCode) -> bool {
        self.0.as_ref().is_none_or(|(_, counts)| counts(status))
    }

    /// Whether every response counts (nothing is ever given back).
    pub(crate) fn counts_all(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let made = self.0.as_ref().map_or("default()", |(made, _)| made);
        write!(f, "Charge::{made}")
    }
}
