//! A request's batch as the layer keeps it (its limits' items, their keys in one buffer,
//! the configuration they come from), and the store's answer for it.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::charge::unsettled::Ticket;
use super::config::Config;
use super::state::LayerState;
use crate::decision::Outcome;
use crate::error::StoreError;
use crate::key::KeyBuf;
use crate::reservation::{Batch, Reservation};
use crate::store::{Check, Health, Store};
use crate::stored::KeyBytes;

/// One limit of a request's batch: its index among the request's limits, its key's bytes in
/// the shared key buffer, its cost, and whether the store leaves its denials to the layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub(crate) limit: usize,
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) cost: u64,
    /// A limit charged by outcome with a penalty, checked while other requests of its key
    /// are being checked or in flight: its denial waits for them (see
    /// `charge::unsettled`), checked as [deferring its denial](Check::defers_denial).
    pub(crate) defers: bool,
}

/// A request's batch as the layer keeps it: the configuration it was checked under, its
/// route, and its keys in one buffer.
pub(crate) struct LayerBatch {
    pub(crate) config: Arc<Config>,
    pub(crate) state: Arc<LayerState>,
    pub(crate) route: Option<usize>,
    pub(crate) items: SmallVec<[Item; 4]>,
    pub(crate) keys: KeyBuf,
    /// Per limit charged by outcome with a penalty: the request until it has settled, which
    /// it has when the batch is dropped (after its units were given back, if they were).
    /// Held for that drop only.
    pub(crate) _tickets: Tickets,
}

/// The [`Ticket`]s of a request's items, each with its index in the batch.
pub(crate) type Tickets = SmallVec<[(usize, Ticket); 1]>;

impl Batch for LayerBatch {
    fn checks(&self) -> SmallVec<[Check<'_>; 4]> {
        batch_of(&self.config, self.route, &self.items, &self.keys, None)
    }
}

/// Whether one of `items`' limits waits for the response to settle its units: it counts
/// by outcome, or reads its cost from the response.
pub(crate) fn settled_by_response(config: &Config, route: Option<usize>, items: &[Item]) -> bool {
    items.iter().any(|item| {
        config
            .limit(route, item.limit)
            .is_some_and(|l| l.settles_by_response())
    })
}

/// The batch of a request's items: each limit's rule, its key's bytes, the cost; and, if
/// asked, each item's index among the request's limits.
pub(crate) fn batch_of<'a>(
    config: &'a Config,
    route: Option<usize>,
    items: &[Item],
    keys: &'a KeyBuf,
    mut limits: Option<&mut SmallVec<[usize; 4]>>,
) -> SmallVec<[Check<'a>; 4]> {
    let mut batch = SmallVec::new();
    for item in items {
        // Always present: the items were made from these limits and this buffer.
        let limit = config.limit(route, item.limit);
        let key = keys.as_bytes().get(item.start..item.end);
        if let (Some(limit), Some(key)) = (limit, key) {
            if let Some(limits) = limits.as_deref_mut() {
                limits.push(item.limit);
            }
            batch.push(Check {
                rule: &limit.rule,
                key: KeyBytes::of(key),
                cost: item.cost,
                shadow: limit.shadow,
                defers_denial: item.defers,
            });
        }
    }
    batch
}

/// The store's answer for a request's batch.
pub(crate) struct Checked<St: Store + Clone> {
    pub(crate) result: Result<Outcome, StoreError>,
    pub(crate) route: Option<usize>,
    /// The index (among the request's limits) of each item of the batch, in order.
    pub(crate) limits: SmallVec<[usize; 4]>,
    /// For an admitted request whose units the layer may still give back (it is held, or a
    /// limit waits for its response): the reservation that owns them.
    pub(crate) reservation: Option<Box<Reservation<St>>>,
    /// The batch the reservation was made of.
    pub(crate) batch: Option<Arc<LayerBatch>>,
    /// The store's health right after it answered.
    pub(crate) health: Health,
    /// How long the store took, if timed (see `observe`).
    pub(crate) store_latency: Option<Duration>,
}
