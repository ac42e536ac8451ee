//! Live reconfiguration: [`ReloadHandle`] swaps the configuration of a running layer.
//!
//! A reloadable layer keeps its configuration's `Arc` in an [`ArcSwap`]: a request loads the
//! current one and keeps an `Arc` of it as long as it needs (store call, hold, refund).

pub(super) mod source;

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use self::source::ConfigSource;
use super::config::Config;
use super::layer::{RateLimitLayer, RateLimitLayerBuilder};
use super::state::LayerState;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::store::Store;

/// Replaces the configuration of a running [`RateLimitLayer`] — its limits, route table,
/// mode, policies and hooks — atomically, in every service the layer made and every clone
/// of them; made by [`RateLimitLayer::reloadable`].
///
/// - **Atomic.** A request runs under the configuration current when the service was
///   called, from start to end (decided, held, forwarded); the next call sees the new one.
/// - **No lock on the request path.** A request reads the configuration with one atomic
///   load ([`arc_swap`]); a reload never waits for requests, nor they for it.
/// - **Checked first.** [`reload`](Self::reload) builds the new configuration with the same
///   [`build`](RateLimitLayerBuilder::build) as any layer and installs it only if it can
///   work: on an error the running configuration stays, and the error says why.
/// - **The same limiter and state.** The layer keeps its own [`Limiter`] (its store), which
///   [`builder`](Self::builder) starts from, and its state:
///   [`max_held`](RateLimitLayerBuilder::max_held) bounds the requests held under both
///   configurations together, a refusal of a limit charged by outcome still waits for the
///   requests beside it, and the log's intervals carry on.
///
/// State is kept by rule name in the store, so a rule that keeps its name and parameters
/// across a reload keeps its counts; a rule whose parameters change under the same name is
/// converted as [Reconfiguring a rule](crate::Rule#reconfiguring-a-rule) describes (never a
/// fresh quota); a new name starts fresh.
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
/// // A configuration that cannot work is refused; the running one stays.
/// let broken = handle.builder().limit(Limit::new(Rule::fixed_window("per-user", 0, minute), key::global()));
/// assert!(handle.reload(broken).is_err());
/// assert_eq!(service.clone().oneshot(request()?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
///
/// // Every service the layer made sees the new rules at once.
/// handle.reload(handle.builder())?;
/// assert_eq!(service.oneshot(request()?).await?.status(), StatusCode::OK);
/// # Ok(()) }
/// ```
pub struct ReloadHandle<St> {
    limiter: Limiter<St>,
    config: Arc<ArcSwap<Config>>,
    state: Arc<LayerState>,
}

impl<St: Store + Clone> RateLimitLayer<St> {
    /// This layer, made reloadable, and the [`ReloadHandle`] that replaces its
    /// configuration. Services the layer made before this call keep the configuration they
    /// have; make the services from the returned layer.
    pub fn reloadable(self) -> (Self, ReloadHandle<St>) {
        let live = match self.config {
            ConfigSource::Live(live) => live,
            ConfigSource::Fixed(config) => Arc::new(ArcSwap::new(config)),
        };
        let handle = ReloadHandle {
            limiter: self.limiter.clone(),
            config: live.clone(),
            state: Arc::clone(&self.state),
        };
        let layer = RateLimitLayer {
            limiter: self.limiter,
            config: ConfigSource::Live(live),
            state: self.state,
        };
        (layer, handle)
    }
}

impl<St: Store + Clone> ReloadHandle<St> {
    /// A builder on the layer's limiter, with no limits yet, for [`reload`](Self::reload).
    /// Everything it sets is replaced, hooks ([`on_reject`](RateLimitLayerBuilder::on_reject),
    /// exemptions) included, but not the observers: make the base builder in one function,
    /// used at start-up and for every reload.
    pub fn builder(&self) -> RateLimitLayerBuilder<St> {
        RateLimitLayerBuilder::on(self.limiter.clone())
    }

    /// Builds `builder` and installs it in the running layer; on error (every problem, as
    /// [`build`](RateLimitLayerBuilder::build) reports) the running configuration stays.
    pub fn reload(&self, builder: RateLimitLayerBuilder<St>) -> Result<(), ConfigError> {
        self.replace(builder.build()?);
        Ok(())
    }

    /// Installs the configuration of `layer`, already built (say by the `serde` feature's
    /// `rules_file::Loader`), in the running layer, which keeps its own limiter.
    pub fn replace(&self, layer: RateLimitLayer<St>) {
        let config = match layer.config {
            ConfigSource::Fixed(config) => config,
            ConfigSource::Live(live) => live.load_full(),
        };
        // The running layer's state stays; `layer`'s own is dropped.
        self.state.follow(&config);
        self.config.store(config);
    }
}

impl<St> Clone for ReloadHandle<St>
where
    Limiter<St>: Clone,
{
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            config: self.config.clone(),
            state: Arc::clone(&self.state),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for ReloadHandle<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadHandle")
            .field("limiter", &self.limiter)
            .field("config", &self.config.load())
            .finish()
    }
}
