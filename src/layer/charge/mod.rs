//! Charging by outcome: a [`Limit`](super::Limit) that counts only some responses (failed
//! logins, say) takes its units when the request is admitted, like any limit, and gives
//! them back once the response shows that this request does not count.
//!
//! Taking first and giving back later is what keeps it exact under concurrency: a request
//! in flight holds its units, so however many arrive at once, no more are admitted than the
//! limit allows, even if every one of them turns out to count. Asking only after the
//! response would let a burst of simultaneous failed logins all through before the first
//! one is counted.

pub(super) mod counts;
pub(super) mod unsettled;

use std::sync::Arc;

use http::StatusCode;
use smallvec::SmallVec;

use super::batch::{charges_by_outcome, LayerBatch};
use super::observe::record;
use crate::decision::Decision;
use crate::reservation::Reservation;
use crate::store::Store;

/// An admitted request's charge by outcome: its reservation, settled with the response's
/// status, which gives back the units of each limit that does not count the response. Made
/// only for requests with a limit whose charge is not [`Charge::all`](counts::Charge::all).
pub(crate) struct Charging<St: Store + Clone> {
    reservation: Box<Reservation<St>>,
    batch: Arc<LayerBatch>,
}

impl<St: Store + Clone> Charging<St> {
    /// The charge of an admitted request, if one of its limits counts by outcome.
    pub(crate) fn new(reservation: Box<Reservation<St>>, batch: Arc<LayerBatch>) -> Option<Self> {
        charges_by_outcome(&batch.config, batch.route, &batch.items)
            .then_some(Self { reservation, batch })
    }

    /// The inner service answered with `status`: give back what does not count. Every rule
    /// of an admitted batch took its units, except a trial rule that would have denied.
    pub(crate) fn settle(self, status: StatusCode) {
        let LayerBatch {
            config,
            route,
            items,
            ..
        } = &*self.batch;
        let rules = &self.reservation.outcome().rules;
        let refunded: SmallVec<[usize; 4]> = items
            .iter()
            .enumerate()
            .filter(|&(i, item)| {
                rules
                    .get(i)
                    .is_some_and(|r| !matches!(r.decision, Decision::Deny(_)))
                    && config
                        .limit(*route, item.limit)
                        .is_some_and(|l| !l.charge.counts(status))
            })
            .map(|(i, _)| i)
            .collect();
        refunded
            .iter()
            .filter_map(|&i| config.limit(*route, items.get(i)?.limit))
            .for_each(|limit| record::charge_refunded(&limit.metrics));
        self.reservation.cancel_rules(&refunded);
    }
}
