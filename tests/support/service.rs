//! The layer as a tower service with no sockets: an inner service that answers `ok`, a
//! limiter on a manual clock, one call, and the headers of a response.

use std::convert::Infallible;

use http::{Request, Response};
use tollgate::layer::{DecisionEvent, DecisionObserver, RateLimitLayer};
use tollgate::{
    store::{MemoryStore, Store},
    Limiter, ManualClock,
};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

/// A layered service, cloned for each call.
pub type Svc = BoxCloneService<Request<String>, Response<String>, Infallible>;

/// `layer` around a service that answers 200 `ok` to every request.
pub fn with<St: Store + Clone>(layer: RateLimitLayer<St>) -> Svc {
    BoxCloneService::new(layer.layer(service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    })))
}

/// A limiter on a `MemoryStore` whose clock moves only when a test moves it.
pub fn limiter() -> Limiter<MemoryStore> {
    Limiter::new(MemoryStore::with_clock(ManualClock::new(
        crate::support::EPOCH,
    )))
}

/// `request` through a clone of `svc`.
pub async fn call(svc: &Svc, request: Request<String>) -> Response<String> {
    svc.clone().oneshot(request).await.unwrap()
}

/// All values of header `name`, joined as one list; empty when there is none.
pub fn header(res: &Response<impl Sized>, name: &str) -> String {
    res.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The response's `RateLimit-Policy` header, or an empty string when it has none.
pub fn policy(res: &Response<impl Sized>) -> String {
    res.headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A test's closure as a [`DecisionObserver`]: told of each decision.
pub struct Watch<F>(pub F);

impl<F: Fn(&DecisionEvent<'_>) + Send + Sync + 'static> DecisionObserver for Watch<F> {
    fn on_decision(&self, event: &DecisionEvent<'_>) {
        (self.0)(event);
    }
}
