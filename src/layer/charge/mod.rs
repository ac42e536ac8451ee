//! Charging by outcome: a [`Limit`](super::Limit) that counts only some responses (failed
//! logins, say) takes its units when the request is admitted, like any limit, and gives
//! them back once the response shows that this request does not count. A limit whose cost
//! the response settles ([`Limit::cost_from_response`](super::Limit::cost_from_response))
//! takes an estimate the same way, and the response gives back or takes the difference.
//!
//! Taking first and giving back later is what keeps it exact under concurrency: a request
//! in flight holds its units, so however many arrive at once, no more are admitted than the
//! limit allows, even if every one of them turns out to count. Asking only after the
//! response would let a burst of simultaneous failed logins all through before the first
//! one is counted.

pub(super) mod counts;
pub(super) mod unsettled;

use std::sync::Arc;

use http::Response;
use smallvec::SmallVec;

use super::batch::{settled_by_response, LayerBatch};
use super::observe::record;
use crate::decision::Decision;
use crate::reservation::Reservation;
use crate::store::Store;

/// An admitted request's charge by its response: its reservation, settled with the
/// response's head, which gives back the units of each limit that does not count the
/// response, and settles the cost of each limit that reads it from the response. Made only
/// for requests with such a limit (see `Limit::settles_by_response`).
pub(crate) struct Charging<St: Store + Clone> {
    reservation: Box<Reservation<St>>,
    batch: Arc<LayerBatch>,
}

impl<St: Store + Clone> Charging<St> {
    /// The charge of an admitted request, if one of its limits waits for the response.
    pub(crate) fn new(reservation: Box<Reservation<St>>, batch: Arc<LayerBatch>) -> Option<Self> {
        settled_by_response(&batch.config, batch.route, &batch.items)
            .then_some(Self { reservation, batch })
    }

    /// The inner service answered with `response`: each limit's units are settled at what
    /// the response makes its cost. Every rule of an admitted batch took its units, except
    /// a shadow rule that would have denied, which the reservation leaves out.
    pub(crate) fn settle<B>(self, response: Response<B>) -> Response<B> {
        let (parts, body) = response.into_parts();
        let LayerBatch {
            config,
            route,
            items,
            ..
        } = &*self.batch;
        let rules = &self.reservation.outcome().rules;
        let costs: SmallVec<[u64; 4]> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let took = rules
                    .get(i)
                    .is_some_and(|r| !matches!(r.decision, Decision::Deny(_)));
                match config.limit(*route, item.limit) {
                    Some(limit) if took => {
                        if !limit.charge.counts(parts.status) {
                            record::charge_refunded(&limit.metrics);
                        }
                        limit.settled_cost(item.cost, &parts)
                    }
                    _ => item.cost,
                }
            })
            .collect();
        self.reservation.settle_detached(&costs);
        Response::from_parts(parts, body)
    }
}
