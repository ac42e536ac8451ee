//! A request's batch through the layer: built once in `call` (its limits' items, their keys
//! in one buffer, the configuration they come from), asked of the store, decided, and kept
//! by the reservation while the layer may still give units back.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use smallvec::SmallVec;
use tracing::Instrument;

use super::charge::unsettled::Ticket;
use super::charge::{defer_denials, tickets};
use super::config::{Config, Limit, MissingKey, Mode};
use super::future::CheckFuture;
use super::observe::{self, Observation};
use super::plans::select::RequestPlans;
use super::state::LayerState;
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::key::{KeyBuf, KeyError, KeyErrorKind, RequestHead};
use crate::limiter::Limiter;
use crate::log::Event;
use crate::store::reservation::{Batch, Reservation};
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

/// The [`Ticket`]s of a request's items, each with its index in the batch.
pub(crate) type Tickets = SmallVec<[(usize, Ticket); 1]>;

/// A request's batch: the configuration it is decided under, its route, its items and
/// their keys. The one value that carries a request from `call` to its release.
pub(crate) struct LayerBatch {
    pub(crate) config: Arc<Config>,
    pub(crate) state: Arc<LayerState>,
    pub(crate) route: Option<usize>,
    pub(crate) items: SmallVec<[Item; 4]>,
    pub(crate) keys: KeyBuf,
    /// Per limit charged by outcome with a penalty: the request until it has settled, which
    /// it has when the batch is dropped (after its units were given back, if they were).
    pub(crate) tickets: Tickets,
}

impl Batch for LayerBatch {
    fn checks(&self) -> SmallVec<[Check<'_>; 4]> {
        self.entries()
            .map(|(item, limit, key)| Check {
                rule: &limit.rule,
                key: KeyBytes::of(key),
                cost: item.cost,
                shadow: limit.shadow,
                defers_denial: item.defers,
            })
            .collect()
    }
}

impl LayerBatch {
    /// The batch of a request on `route`: each of its limits that applies, with its key
    /// (read while the request is borrowed, into one inline buffer) and its cost; `None`
    /// when no limit applies. A limit without a key is left out, or the request is refused
    /// with the key's error, as the limit and the mode say.
    pub(crate) fn of(
        config: &Arc<Config>,
        state: &Arc<LayerState>,
        route: Option<usize>,
        head: &RequestHead<'_>,
    ) -> Result<Option<Self>, KeyError> {
        let mut keys = KeyBuf::new();
        let mut items: SmallVec<[Item; 4]> = SmallVec::new();
        let mut plans = RequestPlans::default();
        for (i, limit) in config.limits(route).enumerate() {
            let start = keys.len();
            // A request of no known plan, under `UnknownPlan::Reject`, is refused whatever
            // the limit does with a missing key.
            let (extracted, plan_refused) = match plans.applies(limit.plan.as_ref(), head) {
                Ok(true) => (limit.key.extract(head, &mut keys), false),
                Ok(false) => continue,
                Err(unknown_plan) => (Err(unknown_plan), true),
            };
            let Err(e) = extracted else {
                let (end, cost) = (keys.len(), limit.cost_of(head));
                let defers = false;
                items.push(Item {
                    limit: i,
                    start,
                    end,
                    cost,
                    defers,
                });
                continue;
            };
            keys.truncate(start);
            if !refuses_for_key(config, state, limit, &e, plan_refused) {
                continue;
            }
            return Err(e);
        }
        if items.is_empty() {
            return Ok(None);
        }
        let tickets = tickets(config, state, route, &mut items, &keys);
        let (config, state) = (Arc::clone(config), Arc::clone(state));
        Ok(Some(Self {
            config,
            state,
            route,
            items,
            keys,
            tickets,
        }))
    }

    /// Each item with its limit and its key's bytes. Always all of them: the items were
    /// made from these limits and this buffer.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&Item, &Limit, &[u8])> + Clone {
        self.items.iter().filter_map(|item| {
            let limit = self.config.limit(self.route, item.limit)?;
            let key = self.keys.as_bytes().get(item.start..item.end)?;
            Some((item, limit, key))
        })
    }

    /// Each item's limit, in order.
    pub(crate) fn limits(&self) -> impl Iterator<Item = &Limit> + Clone {
        self.entries().map(|(_, limit, _)| limit)
    }

    /// Whether one of the batch's limits waits for the response to settle its units: it
    /// counts by outcome, or reads its cost from the response.
    pub(crate) fn settled_by_response(&self) -> bool {
        self.limits().any(Limit::settles_by_response)
    }

    /// Whether the layer keeps a reservation of `outcome`: it may give units back for a
    /// request it holds, or settle them by its response, or count it at the release.
    fn keeps(&self, outcome: &Outcome) -> bool {
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

/// The store's answer for a request's batch, with what the layer keeps of it.
pub(crate) struct Checked<St: Store + Clone> {
    pub(crate) result: Result<Outcome, StoreError>,
    /// The store's health right after it answered.
    pub(crate) health: Health,
    pub(crate) kept: Kept<St>,
}

/// A decided batch, and the reservation of its units if the layer keeps one.
pub(crate) enum Kept<St: Store + Clone> {
    /// Nothing the layer may give back, settle or confirm: the batch, in place.
    Batch(LayerBatch),
    /// The batch shared with the reservation that owns its units: an admitted request the
    /// layer holds, whose response settles it, or that counts at its release. `None` once a
    /// confirmation refused it (its units went back).
    Reserved(Arc<LayerBatch>, Option<Box<Reservation<St>>>),
}

impl<St: Store + Clone> Kept<St> {
    pub(crate) fn batch(&self) -> &LayerBatch {
        match self {
            Kept::Batch(batch) => batch,
            Kept::Reserved(batch, _) => batch,
        }
    }
}

/// Asks the store about `batch` at once (`Store::try_check_now`): an in-process store
/// answers, and the request is decided without a future. A store that cannot answer yet
/// hands the batch back, for [`check`].
pub(crate) fn check_now<St: Store + Clone>(
    limiter: &Limiter<St>,
    batch: LayerBatch,
    observation: Observation,
) -> Result<Checked<St>, (LayerBatch, Observation)> {
    let checks = batch.checks();
    let max_wait = batch.config.mode.max_wait();
    let now = {
        let _entered = observation.span.enter();
        limiter.reserve_now(&checks, max_wait)
    };
    let Some(result) = now else {
        drop(checks);
        return Err((batch, observation));
    };
    let health = limiter.health();
    observe::finish(observation, &batch, None, &checks, &result, health);
    drop(checks);
    Ok(Checked::new(limiter, batch, result, health))
}

/// Asks a store that could not answer at once, as a future (boxed: its type cannot be
/// named in `ResponseFuture` on stable Rust). A store may still answer on its first poll
/// (a local deny cache, a fallback while its breaker is open): that poll is made here,
/// with no waker to wake.
pub(crate) fn check<St: Store + Clone>(
    limiter: Limiter<St>,
    batch: LayerBatch,
    observation: Observation,
) -> Result<Checked<St>, CheckFuture<St>> {
    let mut future: CheckFuture<St> = Box::pin(async move {
        let checks = batch.checks();
        let max_wait = batch.config.mode.max_wait();
        let result = limiter
            .reserve_outcome(&checks, max_wait)
            .instrument(observation.span.clone())
            .await;
        let health = limiter.health();
        observe::finish(observation, &batch, None, &checks, &result, health);
        drop(checks);
        Checked::new(&limiter, batch, result, health)
    });
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(checked) => Ok(checked),
        Poll::Pending => Err(future),
    }
}

impl<St: Store + Clone> Checked<St> {
    /// The store's answer for `batch`: a limit charged by outcome whose quota refused the
    /// request has its denial counted once the requests beside it settle, and the batch is
    /// kept with a reservation when the layer may still give its units back.
    fn new(
        limiter: &Limiter<St>,
        mut batch: LayerBatch,
        result: Result<Outcome, StoreError>,
        health: Health,
    ) -> Self {
        let outcome = match &result {
            Ok(outcome) => outcome,
            Err(_) => {
                batch.tickets.clear();
                let kept = Kept::Batch(batch);
                return Self {
                    result,
                    health,
                    kept,
                };
            }
        };
        defer_denials(limiter, &mut batch, outcome);
        let kept = if batch.keeps(outcome) {
            let (max_wait, log) = (batch.config.mode.max_wait(), Arc::clone(&batch.state.log));
            let batch = Arc::new(batch);
            let store = limiter.store().clone();
            let reservation =
                Reservation::of(store, batch.clone(), outcome.clone(), max_wait, Some(log));
            Kept::Reserved(batch, Some(Box::new(reservation)))
        } else {
            Kept::Batch(batch)
        };
        Self {
            result,
            health,
            kept,
        }
    }
}
