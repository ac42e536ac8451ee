//! Held requests: the bounds on how many the layer holds, and the hold itself, with the
//! [`Reservation`] the store's answer made (see [`HoldFuture`]).

pub(super) mod bounds;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use smallvec::SmallVec;
use tracing::Instrument;

use self::bounds::{HeldCounts, HeldSlot};
use super::batch::{Checked, Kept, LayerBatch};
use super::charge::{Charging, Outbound};
use super::headers::RateLimitHeaders;
use super::observe;
use crate::decision::{Decision, Outcome};
use crate::store::reservation::Reservation;
use crate::store::{Check, Store};

/// A held request: its reservation, its place under the layer's bounds, and the headers
/// it is forwarded with when nothing is counted at its release.
pub(crate) struct Hold<St: Store + Clone> {
    pub(crate) reservation: Box<Reservation<St>>,
    pub(crate) slot: HeldSlot,
    pub(crate) headers: Option<RateLimitHeaders>,
    pub(crate) batch: Arc<LayerBatch>,
}

/// What the end of a hold says.
pub(crate) enum Released<St: Store + Clone> {
    /// Nothing was counted at the release: the request passes as it was decided.
    Pass(Outbound<St>),
    /// The rules that wait for the release counted it: the layer decides on their answer
    /// (boxed: a hold's future is as small as its common case, `Pass`).
    Counted(Box<Checked<St>>),
}

/// The hold of a request, as a future: waits until the request is due, confirms it, and
/// frees its place once the confirmation has answered. Dropped before that, the
/// reservation gives the units back.
pub(crate) type HoldFuture<St> = Pin<Box<dyn Future<Output = Released<St>> + Send>>;

impl<St: Store + Clone> Hold<St> {
    pub(crate) fn release(self) -> HoldFuture<St> {
        Box::pin(async move {
            let Hold {
                mut reservation,
                slot,
                headers,
                batch,
            } = self;
            let pending: SmallVec<[usize; 4]> = reservation.pending().collect();
            tokio::time::sleep_until(reservation.due()).await;
            if pending.is_empty() {
                // Nothing waits for the release: the request passes with what it took.
                reservation.pass();
                drop(slot);
                let charge = Charging::new(reservation, batch);
                return Released::Pass(Outbound { headers, charge });
            }
            let observation = observe::start(&batch);
            let result = reservation
                .confirm()
                .instrument(observe::span_of(&observation))
                .await;
            // The place under the bounds lasts until the confirmation has answered.
            drop(slot);
            let checked = counted(batch, reservation, &pending, observation, result);
            Released::Counted(Box::new(checked))
        })
    }
}

/// The layer's view of a confirmation: observed (metrics, span) for the rules counted at
/// the release only, the others were when the request was checked.
fn counted<St: Store + Clone>(
    batch: Arc<LayerBatch>,
    reservation: Box<Reservation<St>>,
    pending: &[usize],
    observation: Option<observe::Observation>,
    result: Result<Outcome, crate::StoreError>,
) -> Checked<St> {
    let health = reservation.health();
    let counted_now = result.as_ref().map(|outcome| Outcome {
        decision: outcome.decision,
        rules: pending
            .iter()
            .filter_map(|&i| outcome.rules.get(i).copied())
            .collect(),
        admission: None,
    });
    let counted_now = counted_now.map_err(|e| e.clone());
    if let Some(observation) = observation {
        observe::finish(observation, &batch, Some(pending), &counted_now, health);
    }
    let admitted = result.as_ref().is_ok_and(|o| o.is_admitted());
    let reservation = admitted.then_some(reservation);
    let kept = Kept::Reserved(batch, reservation);
    Checked {
        result,
        health,
        kept,
    }
}

/// For a request the layer will hold, what it counts under for `max_held_per_key`: each
/// (rule, key) whose rule delays it, once. Neither a shadow rule (else it could refuse a
/// request) nor a rule pending to the release (another rule holds the request) takes a place.
pub(crate) fn held_keys(
    counts: &HeldCounts,
    batch: &[Check<'_>],
    outcome: &Outcome,
) -> SmallVec<[u64; 4]> {
    let mut keys = SmallVec::new();
    let admission = outcome.admission.as_ref();
    let pending = |i: usize| admission.is_some_and(|a| a.taken(i).pending);
    for (i, (check, rule)) in batch.iter().zip(&outcome.rules).enumerate() {
        if !check.in_shadow() && matches!(rule.decision, Decision::Delay(_)) && !pending(i) {
            let key = counts.key_of(check.rule.name(), check.key());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    keys
}
