//! Where a layer finds its configuration: a fixed `Arc`, or the [`ArcSwap`] a
//! [`ReloadHandle`](super::ReloadHandle) swaps; each with the layer's state, which a reload
//! keeps.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use crate::layer::config::Config;
use crate::layer::state::LayerState;
use crate::limiter::Limiter;

/// What a layer and every service it makes share, behind one reference count: a service
/// is cloned per request by some routers (axum's), and each count is an atomic operation.
#[derive(Debug)]
pub(crate) struct Shared<St> {
    pub(crate) limiter: Limiter<St>,
    pub(crate) config: ConfigSource,
}

/// A configuration in force in a layer, with the layer's state: what a request is decided
/// under, held by its batch through one reference count and read one pointer away (the
/// request path finds it out of cache: each pointer more is a miss more).
#[derive(Debug)]
pub(crate) struct Scope {
    pub(crate) config: Config,
    pub(crate) state: LayerState,
}

/// Where a layer, and every service it makes, finds its configuration.
#[derive(Clone, Debug)]
pub(crate) enum ConfigSource {
    /// Built once, never changed: a plain `Arc`.
    Fixed(Arc<Scope>),
    /// Swapped by a [`ReloadHandle`](super::ReloadHandle).
    Live(Arc<ArcSwap<Scope>>),
}

/// The configuration a request runs under: borrowed from a fixed source, or a guard on the
/// live one (no reference count taken unless the request clones the `Arc`).
pub(crate) enum Current<'a> {
    Fixed(&'a Arc<Scope>),
    Live(Guard<Arc<Scope>>),
}

impl ConfigSource {
    /// The configuration now.
    pub(crate) fn current(&self) -> Current<'_> {
        match self {
            ConfigSource::Fixed(config) => Current::Fixed(config),
            ConfigSource::Live(config) => Current::Live(config.load()),
        }
    }
}

impl Deref for Current<'_> {
    type Target = Arc<Scope>;

    fn deref(&self) -> &Arc<Scope> {
        match self {
            Current::Fixed(config) => config,
            Current::Live(guard) => guard,
        }
    }
}
