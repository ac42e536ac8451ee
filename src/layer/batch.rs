//! A request's batch through the layer: built once in `call`, asked of the store, decided,
//! and kept by the reservation while the layer may still give units back.

use std::borrow::BorrowMut;
use std::sync::Arc;

use smallvec::SmallVec;

use super::charge::unsettled::Ticket;
use super::config::{Config, Limit, MissingKey, Mode};
use super::plans::select::RequestPlans;
use super::reload::source::Scope;
use super::state::LayerState;
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::key::{KeyBuf, KeyError, KeyErrorKind, RequestHead};
use crate::log::Event;
use crate::store::reservation::{Batch, Reservation};
use crate::store::{Check, Health, Store};
use crate::stored::KeyBytes;
use crate::Refusal;

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
    /// `charge::unsettled`), checked as [deferring its refusal](Refusal::Deferred).
    pub(crate) defers: bool,
}

/// The [`Ticket`]s of a request's items, each with its index in the batch.
pub(crate) type Tickets = SmallVec<[(usize, Ticket); 1]>;

/// A request's batch: the configuration it is decided under, its route, its items and
/// their keys. The one value that carries a request from `call` to its release.
pub(crate) struct LayerBatch {
    pub(crate) scope: Arc<Scope>,
    pub(crate) route: Option<usize>,
    pub(crate) items: SmallVec<[Item; 4]>,
    pub(crate) keys: KeyBuf,
    /// Per limit charged by outcome with a penalty: the request until it has settled, which
    /// it has when the batch is dropped (after its units were given back, if they were).
    pub(crate) tickets: Tickets,
}

impl Batch for LayerBatch {
    // Inline, and pushed one by one: the checks are made once per request, in place.
    #[inline(always)]
    fn checks(&self) -> SmallVec<[Check<'_>; 4]> {
        let mut checks = SmallVec::new();
        for (item, limit, key) in self.entries() {
            let refusal = if limit.shadow {
                Refusal::Shadow
            } else if item.defers {
                Refusal::Deferred
            } else {
                Refusal::Enforced
            };
            checks.push(Check {
                rule: &limit.rule,
                key: KeyBytes::of(key),
                cost: item.cost,
                refusal,
            });
        }
        checks
    }
}

impl LayerBatch {
    /// The batch of a request on `route`, of no items yet: made where it stays (each move of
    /// it is a copy), then [read](Self::read) from the request.
    pub(crate) fn new(scope: &Arc<Scope>, route: Option<usize>) -> Self {
        Self {
            scope: Arc::clone(scope),
            route,
            items: SmallVec::new(),
            keys: KeyBuf::new(),
            tickets: Tickets::new(),
        }
    }

    /// Reads the request's items: each of its limits that applies, with its key (read while
    /// the request is borrowed, into one inline buffer) and its cost; `false` when no limit
    /// applies. A limit without a key is left out, or the request is refused with the key's
    /// error, as the limit and the mode say.
    pub(crate) fn read(&mut self, head: &RequestHead<'_>) -> Result<bool, KeyError> {
        let (Scope { config, state }, keys) = (&*self.scope, &mut self.keys);
        let mut plans = RequestPlans::default();
        for (i, limit) in config.limits(self.route).enumerate() {
            let start = keys.len();
            // A request of no known plan, under `UnknownPlan::Reject`, is refused whatever
            // the limit does with a missing key.
            let applies = limit
                .plan
                .as_ref()
                .map_or(Ok(true), |p| plans.applies(p, head));
            let (extracted, plan_refused) = match applies {
                Ok(true) => (limit.key.extract(head, keys), false),
                Ok(false) => continue,
                Err(unknown_plan) => (Err(unknown_plan), true),
            };
            let Err(e) = extracted else {
                self.items.push(Item {
                    limit: i,
                    start,
                    end: keys.len(),
                    cost: limit.cost_of(head),
                    defers: false,
                });
                continue;
            };
            keys.truncate(start);
            if refuses_for_key(config, state, limit, &e, plan_refused) {
                return Err(e);
            }
        }
        Ok(!self.items.is_empty())
    }

    /// The batch, leaving in its place one of no items.
    pub(crate) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::new(&self.scope, self.route))
    }

    /// The configuration the batch is decided under.
    pub(crate) fn config(&self) -> &Config {
        &self.scope.config
    }

    /// The state of the layer that decides it.
    pub(crate) fn state(&self) -> &LayerState {
        &self.scope.state
    }

    /// Each item with its limit and its key's bytes. Always all of them: the items were
    /// made from these limits and this buffer.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&Item, &Limit, &[u8])> + Clone {
        self.items.iter().filter_map(|item| {
            let limit = self.config().limit(self.route, item.limit)?;
            let key = self.keys.as_bytes().get(item.start..item.end)?;
            Some((item, limit, key))
        })
    }

    /// Each item's limit, in order.
    pub(crate) fn limits(&self) -> impl Iterator<Item = &Limit> + Clone {
        let limit = |item: &Item| self.config().limit(self.route, item.limit);
        self.items.iter().filter_map(limit)
    }

    /// Whether one of the batch's limits waits for the response to settle its units: it
    /// counts by outcome, or reads its cost from the response.
    pub(crate) fn settled_by_response(&self) -> bool {
        let derived = self.config().derived(self.route);
        derived.is_none_or(|d| d.settles_by_response)
            && self.limits().any(Limit::settles_by_response)
    }

    /// Whether the layer keeps a reservation of `outcome`: it may give units back for a
    /// request it holds, or settle them by its response, or count it at the release.
    pub(crate) fn keeps(&self, outcome: &Outcome) -> bool {
        outcome.is_admitted()
            && (outcome.decision != Decision::Allow
                || outcome.needs_confirmation()
                || self.settled_by_response())
    }
}

/// Whether a limit whose key could not be read refuses the request. A key the server
/// cannot provide is logged; shadow mode and shadow limits report and never refuse.
fn refuses_for_key(
    config: &Config,
    state: &LayerState,
    limit: &Limit,
    e: &KeyError,
    plan_refused: bool,
) -> bool {
    if e.kind() == KeyErrorKind::Misconfigured {
        if let Some(suppressed) = state.log.admit(Event::KeyUnavailable) {
            tracing::error!(rule = limit.rule.name(), error = %e, suppressed, "rate limit key unavailable");
        }
    } else if limit.on_missing == MissingKey::Skip && !plan_refused {
        return false;
    }
    if config.mode == Mode::Shadow || limit.shadow {
        if let Some(suppressed) = state.log.admit(Event::ShadowMissingKey) {
            tracing::info!(rule = limit.rule.name(), error = %e, suppressed, "shadow: request would be refused for its key");
        }
        return false;
    }
    true
}

/// The store's answer for a request's batch, with what the layer keeps of it. The batch is
/// held as `B`: owned by a future, or borrowed where `call` built it (each move of it is a
/// copy).
pub(crate) struct Checked<St: Store + Clone, B = LayerBatch> {
    pub(crate) result: Result<Outcome, StoreError>,
    /// The store's health right after it answered.
    pub(crate) health: Health,
    pub(crate) kept: Kept<St, B>,
}

/// A decided batch, and the reservation of its units if the layer keeps one.
pub(crate) enum Kept<St: Store + Clone, B = LayerBatch> {
    /// Nothing the layer may give back, settle or confirm: the batch, where it is.
    Batch(B),
    /// The batch shared with the reservation that owns its units: an admitted request the
    /// layer holds, whose response settles it, or that counts at its release. `None` once a
    /// confirmation refused it (its units went back).
    Reserved(Arc<LayerBatch>, Option<Box<Reservation<St>>>),
}

impl<St: Store + Clone, B: BorrowMut<LayerBatch>> Kept<St, B> {
    pub(crate) fn take_reserved(&mut self) -> Option<(Arc<LayerBatch>, Box<Reservation<St>>)> {
        let Kept::Reserved(batch, reservation) = self else {
            return None;
        };
        Some((Arc::clone(batch), reservation.take()?))
    }

    pub(crate) fn batch(&self) -> &LayerBatch {
        match self {
            Kept::Batch(batch) => batch.borrow(),
            Kept::Reserved(batch, _) => batch,
        }
    }
}
