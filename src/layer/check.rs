//! Asking the store about a request's batch: at once when it can answer (an in-process
//! store, then decided here), else through a boxed future; and what the layer keeps of its
//! answer.

use std::borrow::BorrowMut;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Request;
use tracing::Instrument;

use super::batch::{Checked, Kept, LayerBatch};
use super::charge::defer_denials;
use super::decide::{decide, Next};
use super::future::CheckFuture;
use super::observe::{self, Observation};
use crate::limiter::Limiter;
use crate::store::reservation::{Batch, Reservation};
use crate::store::Store;

/// Asks the store about `request`'s `batch` and decides its answer at once if the store can
/// give it (`Store::try_check_now`), the batch borrowed where it was built (each move of it
/// is a copy); else takes the batch into a boxed future of the answer (its type cannot be
/// named in `ResponseFuture` on stable Rust), polled once here with no waker, since a
/// store may still answer on its first poll (a local deny cache, a fallback while its
/// breaker is open).
pub(crate) fn check<St: Store + Clone, B>(
    limiter: &Limiter<St>,
    batch: &mut LayerBatch,
    observation: Option<Observation>,
    request: &Request<B>,
) -> Result<Next<St>, CheckFuture<St>> {
    let max_wait = batch.config().mode.max_wait();
    let now = {
        let _entered = observation.as_ref().map(|o| o.span.enter());
        limiter.reserve_now(&batch.checks(), max_wait)
    };
    if let Some(result) = now {
        let mut checked = Checked {
            result,
            health: limiter.health(),
            kept: Kept::Batch(batch),
        };
        answered(limiter, &mut checked, observation);
        return Ok(decide(&mut checked, request));
    }
    let (limiter, batch) = (limiter.clone(), batch.take());
    let mut future: CheckFuture<St> = Box::pin(async move {
        let result = limiter
            .reserve_outcome(&batch.checks(), max_wait)
            .instrument(observe::span_of(&observation))
            .await;
        let mut checked = Checked {
            result,
            health: limiter.health(),
            kept: Kept::Batch(batch),
        };
        answered(&limiter, &mut checked, observation);
        checked
    });
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(mut checked) => Ok(decide(&mut checked, request)),
        Poll::Pending => Err(future),
    }
}

/// The store's answer, observed, and what the layer keeps of it, changed in place (the
/// answer is large, and each move of it is a copy): a limit charged by outcome whose quota
/// refused the request has its denial counted once the requests beside it settle, and the
/// batch is kept with a reservation when the layer may still give its units back.
fn answered<St: Store + Clone, K: BorrowMut<LayerBatch>>(
    limiter: &Limiter<St>,
    checked: &mut Checked<St, K>,
    observation: Option<Observation>,
) {
    let (result, health) = (&checked.result, checked.health);
    if let Some(observation) = observation {
        observe::finish(observation, checked.kept.batch(), None, result, health);
    }
    let Kept::Batch(batch) = &mut checked.kept else {
        return;
    };
    let batch = batch.borrow_mut();
    let Ok(outcome) = &checked.result else {
        batch.tickets.clear();
        return;
    };
    if !batch.tickets.is_empty() {
        defer_denials(limiter, batch, outcome);
    }
    if batch.keeps(outcome) {
        let max_wait = batch.config().mode.max_wait();
        let log = Arc::clone(&batch.state().log);
        let batch = Arc::new(batch.take());
        let (store, outcome) = (limiter.store().clone(), outcome.clone());
        let reservation = Reservation::of(store, batch.clone(), outcome, max_wait, Some(log));
        checked.kept = Kept::Reserved(batch, Some(Box::new(reservation)));
    }
}
