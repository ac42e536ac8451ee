//! Where a layer finds its configuration: a fixed `Arc`, or the [`ArcSwap`] a
//! [`ReloadHandle`](super::ReloadHandle) swaps.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use crate::layer::config::Config;

/// Where a layer, and every service it makes, finds its configuration.
#[derive(Clone, Debug)]
pub(crate) enum ConfigSource {
    /// Built once, never changed: a plain `Arc`.
    Fixed(Arc<Config>),
    /// Swapped by a [`ReloadHandle`](super::ReloadHandle).
    Live(Arc<ArcSwap<Config>>),
}

/// The configuration a request runs under: borrowed from a fixed source, or a guard on the
/// live one (no reference count taken unless the request clones the `Arc`).
pub(crate) enum Current<'a> {
    Fixed(&'a Arc<Config>),
    Live(Guard<Arc<Config>>),
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
    type Target = Arc<Config>;

    fn deref(&self) -> &Arc<Config> {
        match self {
            Current::Fixed(config) => config,
            Current::Live(guard) => guard,
        }
    }
}
