//! What a layer keeps for as long as it lives, beside the configuration a reload swaps: what
//! enforcing it has left in this instance. A request held, a refusal waiting or a log line
//! left out under the old rules is still one under the new.

use std::fmt;
use std::sync::Arc;

use super::charge::unsettled::Unsettled;
use super::config::Config;
use super::held::bounds::HeldCounts;
use super::observe::observer::Observers;
use crate::log::EventLog;

/// The long-lived state of one layer, shared by every service it makes, every clone of
/// those, and its [`ReloadHandle`](super::ReloadHandle). A clone shares it (each part is
/// shared): each configuration in force holds one beside it.
#[derive(Clone)]
pub(crate) struct LayerState {
    pub(crate) held: Arc<HeldCounts>,
    pub(crate) unsettled: Arc<Unsettled>,
    /// The rate limiter of the layer's log lines.
    pub(crate) log: Arc<EventLog>,
    /// What watches the layer's decisions, set when the layer was first built.
    pub(crate) observers: Observers,
}

impl LayerState {
    /// The state of a layer first built with `config`.
    pub(crate) fn new(config: &Config, observers: Observers) -> Self {
        Self {
            held: Arc::default(),
            unsettled: Arc::default(),
            log: Arc::new(EventLog::new(config.log_interval)),
            observers,
        }
    }
}

impl fmt::Debug for LayerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerState")
            .field("held", &self.held.total())
            .field("unsettled", &self.unsettled)
            .field("observers", &self.observers)
            .finish_non_exhaustive()
    }
}
