//! Charging by outcome ([`Charge`](super::Charge)) and by response
//! ([`Limit::cost_from_response`](super::Limit::cost_from_response)): units are taken at
//! admission and settled by the response. Taking first keeps it exact under concurrency;
//! asking only after the response would let a burst of failed logins all through.

pub(super) mod counts;
pub(super) mod unsettled;

use std::sync::Arc;

use http::Response;
use smallvec::SmallVec;

use self::unsettled::recount;
use super::batch::{LayerBatch, Tickets};
use super::headers::RateLimitHeaders;
use super::observe::record;
use super::reload::source::Scope;
use crate::decision::{Decision, DenyReason, Outcome};
use crate::limiter::Limiter;
use crate::store::reservation::Reservation;
use crate::store::Store;

/// What a forwarded request's response gets: its `RateLimit` headers, and the charge its
/// head settles.
pub(crate) struct Outbound<St: Store + Clone> {
    pub(crate) headers: Option<RateLimitHeaders>,
    pub(crate) charge: Option<Charging<St>>,
}

impl<St: Store + Clone> Outbound<St> {
    /// With `headers` and no charge.
    pub(crate) fn headers(headers: Option<RateLimitHeaders>) -> Self {
        let charge = None;
        Self { headers, charge }
    }

    /// The inner service answered with `response`: the charge is settled with its head, and
    /// the headers are added.
    pub(crate) fn apply<B>(self, mut response: Response<B>) -> Response<B> {
        if let Some(charge) = self.charge {
            response = charge.settle(response);
        }
        if let Some(ours) = self.headers {
            ours.merge_into(response.headers_mut());
        }
        response
    }
}

/// An admitted request's charge by its response: its reservation, settled with the
/// response's head. Made only for requests with such a limit (`Limit::settles_by_response`).
pub(crate) struct Charging<St: Store + Clone> {
    reservation: Box<Reservation<St>>,
    batch: Arc<LayerBatch>,
}

impl<St: Store + Clone> Charging<St> {
    /// The charge of an admitted request, if one of its limits waits for the response.
    pub(crate) fn new(reservation: Box<Reservation<St>>, batch: Arc<LayerBatch>) -> Option<Self> {
        batch
            .settled_by_response()
            .then_some(Self { reservation, batch })
    }

    /// The inner service answered with `response`: each limit's units are settled at what
    /// the response makes its cost. Every rule of an admitted batch took its units, except
    /// a shadow rule that would have denied, which the reservation leaves out.
    pub(crate) fn settle<B>(self, response: Response<B>) -> Response<B> {
        let (parts, body) = response.into_parts();
        let rules = &self.reservation.outcome().rules;
        let costs: SmallVec<[u64; 4]> = self
            .batch
            .entries()
            .enumerate()
            .map(|(i, (item, limit, _))| {
                let took = rules
                    .get(i)
                    .is_some_and(|r| !matches!(r.decision, Decision::Deny(_)));
                if !took {
                    return item.cost;
                }
                if !limit.charge.counts(parts.status) {
                    record::charge_refunded(&limit.metrics);
                }
                limit.settled_cost(item.cost, &parts)
            })
            .collect();
        self.reservation.settle_detached(&costs);
        Response::from_parts(parts, body)
    }
}

/// Takes the tickets of a batch's items whose limits count by outcome with a penalty (see
/// `unsettled`), before the store decides; called on a route with such a limit only. An
/// item not alone leaves its denial to the layer (`Item::defers`).
pub(crate) fn take_tickets(batch: &mut LayerBatch) {
    let (Scope { config, state }, route) = (&*batch.scope, batch.route);
    for (i, item) in batch.items.iter_mut().enumerate() {
        let limit = config.limit(route, item.limit);
        let Some(limit) = limit.filter(|l| l.defers_denials()) else {
            continue;
        };
        if let Some(key) = batch.keys.as_bytes().get(item.start..item.end) {
            let (ticket, alone) = state.unsettled.start(&limit.rule, key);
            item.defers = !alone;
            batch.tickets.push((i, ticket));
        }
    }
}

/// Each limit charged by outcome whose quota refused the request (in a refused batch, or a
/// shadow limit in an admitted one) has its denial counted once the requests beside it
/// have settled (see `unsettled`); the batch keeps the tickets of the other limits, which
/// settle with the request. Called only for a batch holding tickets.
pub(crate) fn defer_denials<St: Store + Clone>(
    limiter: &Limiter<St>,
    batch: &mut LayerBatch,
    outcome: &Outcome,
) {
    let mut unsettled = Tickets::new();
    for (i, ticket) in std::mem::take(&mut batch.tickets) {
        let refused = outcome.rules.get(i).and_then(|r| r.decision.denial());
        let by_quota =
            refused.is_some_and(|d| d.reason == DenyReason::Limited && d.retry_after.is_some());
        let Some((item, limit, _)) = batch.entries().nth(i) else {
            continue;
        };
        if !by_quota {
            unsettled.push((i, ticket));
        } else if item.defers {
            let most = limit.rule.penalty().map_or(0, |p| p.denials());
            let key = ticket.key().into();
            let recount = recount(limiter.clone(), limit.rule.clone(), key, item.cost);
            ticket.defer(recount, usize::try_from(most).unwrap_or(usize::MAX));
        }
        // Otherwise decided alone: the store counted the denial.
    }
    batch.tickets = unsettled;
}
