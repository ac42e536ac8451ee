//! Live reconfiguration: [`ReloadHandle`] swaps the configuration of a running layer.

pub(super) mod source;

use std::sync::Arc;

use arc_swap::ArcSwap;

use self::source::{ConfigSource, Scope, Shared};
use super::layer::{RateLimitLayer, RateLimitLayerBuilder};
use crate::store::Store;

/// Replaces the configuration of a running [`RateLimitLayer`] — its limits, route table,
/// mode, policies and hooks — atomically, in every service the layer made and every clone
/// of them; made by [`RateLimitLayer::reloadable`].
///
/// - **Atomic, no lock.** A request reads the configuration with one atomic load
///   ([`arc_swap`]) and keeps it from start to end (decided, held, forwarded); the next
///   call sees the new one. A reload never waits for requests, nor they for it.
/// - **Checked first.** [`reload`](Self::reload) takes a built layer: a configuration that
///   cannot work never reaches the running layer.
/// - **The same limiter and state.** The running layer keeps its [`Limiter`](crate::Limiter),
///   its observers and its state: [`max_held`](RateLimitLayerBuilder::max_held) bounds the
///   requests held under both configurations together, and the log's intervals carry on.
///
/// State is kept by rule name in the store: a rule that keeps its name and parameters keeps
/// its counts; one whose parameters change under the same name is converted as
/// [Reconfiguring a rule](crate::Rule#reconfiguring-a-rule) describes; a new name starts fresh.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::layer::{Limit, RateLimitLayer};
/// use tollgate::{key, Limiter, Rule, store::MemoryStore};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let minute = Duration::from_secs(60);
/// let (layer, handle) = RateLimitLayer::builder()
///     .limit(Limit::new(Rule::fixed_window("per-user", 1, minute), key::header("user-id")))
///     .build()?
///     .reloadable();
/// let service = layer.layer(service_fn(|_req: Request<String>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
/// }));
/// let request = || Request::get("/").header("user-id", "7").body(String::new());
/// assert_eq!(service.clone().oneshot(request()?).await?.status(), StatusCode::OK);
/// assert_eq!(service.clone().oneshot(request()?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
///
/// // Every service the layer made sees the new rules at once.
/// handle.reload(handle.builder().build()?);
/// assert_eq!(service.oneshot(request()?).await?.status(), StatusCode::OK);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ReloadHandle<St> {
    /// The running layer, whose configuration is `live`.
    layer: RateLimitLayer<St>,
    live: Arc<ArcSwap<Scope>>,
}

impl<St: Store + Clone> RateLimitLayer<St> {
    /// This layer, made reloadable, and the [`ReloadHandle`] that replaces its
    /// configuration. Services the layer made before this call keep the configuration they
    /// have; make the services from the returned layer.
    pub fn reloadable(self) -> (Self, ReloadHandle<St>) {
        let live = match &self.shared.config {
            ConfigSource::Live(live) => Arc::clone(live),
            ConfigSource::Fixed(scope) => Arc::new(ArcSwap::new(Arc::clone(scope))),
        };
        let (limiter, config) = (
            self.shared.limiter.clone(),
            ConfigSource::Live(live.clone()),
        );
        let shared = Arc::new(Shared { limiter, config });
        let layer = RateLimitLayer { shared };
        (layer.clone(), ReloadHandle { layer, live })
    }
}

impl<St: Store + Clone> ReloadHandle<St> {
    /// A builder on the layer's limiter, with no limits yet, for [`reload`](Self::reload).
    /// Everything it sets is replaced, hooks ([`on_reject`](RateLimitLayerBuilder::on_reject),
    /// exemptions) included, but not the observers: make the base builder in one function,
    /// used at start-up and for every reload.
    pub fn builder(&self) -> RateLimitLayerBuilder<St> {
        RateLimitLayerBuilder::on(self.layer.shared.limiter.clone())
    }

    /// Installs the configuration of `layer` (from [`builder`](Self::builder), or a rules
    /// file's loader) in the running layer, which keeps its own limiter, observers and state.
    pub fn reload(&self, layer: RateLimitLayer<St>) {
        let config = layer.shared.config.current().config.clone();
        let state = self.live.load().state.clone();
        state.log.set_interval(config.log_interval);
        self.live.store(Arc::new(Scope { config, state }));
    }
}
