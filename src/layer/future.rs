//! [`ResponseFuture`]: the states of a rate-limited request, from the store's answer to the
//! response. What each answer means is decided in `decide`; holds live in `held`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::batch::Checked;
use super::body::RejectionBody;
use super::charge::Outbound;
use super::decide::{decide, Next};
use super::held::{HoldFuture, Released};
use crate::store::{MemoryStore, Store};

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

/// The store's answer for a request, as a future.
pub(crate) type CheckFuture<St> = Pin<Box<dyn Future<Output = Checked<St>> + Send>>;

/// What a request carries through the states until it is forwarded: the request, and the
/// inner service to call with it (its batch travels with the store's answer).
struct Passengers<S, ReqB> {
    request: Request<ReqB>,
    inner: S,
}

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit): asks the store, then forwards the
    /// request (after holding it, for a delay), or answers with the rejection.
    pub struct ResponseFuture<S, ReqB, St = MemoryStore>
    where
        S: Service<Request<ReqB>>,
        St: Store,
        St: Clone,
    {
        #[pin]
        state: Step<S, ReqB, St>,
    }
}

pin_project! {
    #[project = StepProj]
    enum Step<S, ReqB, St>
    where
        S: Service<Request<ReqB>>,
        St: Store,
        St: Clone,
    {
        Checking {
            check: CheckFuture<St>,
            passengers: Option<Passengers<S, ReqB>>,
        },
        Holding {
            hold: HoldFuture<St>,
            passengers: Option<Passengers<S, ReqB>>,
        },
        Readying {
            passengers: Option<Passengers<S, ReqB>>,
            outbound: Option<Outbound<St>>,
        },
        Forwarding {
            #[pin]
            future: S::Future,
            outbound: Option<Outbound<St>>,
        },
        Rejected {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB, St> ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>> + Clone,
    St: Store + Clone,
{
    /// Waits for the store's answer. `inner` is the service driven to readiness.
    pub(crate) fn checking(check: CheckFuture<St>, request: Request<ReqB>, inner: S) -> Self {
        let passengers = Some(Passengers { request, inner });
        let state = Step::Checking { check, passengers };
        Self { state }
    }

    /// Acts on a decision taken in `call`: `inner` is the service driven to readiness,
    /// called for a request forwarded now; a held request takes an idle clone, driven to
    /// readiness after the hold, and the ready one stays for the next call.
    #[inline]
    pub(crate) fn decided(next: Next<St>, request: Request<ReqB>, inner: &mut S) -> Self {
        // Each state is made in the future it returns: a state made apart is copied into it.
        match next {
            Next::Forward(outbound) => Self {
                state: Step::Forwarding {
                    future: inner.call(request),
                    outbound: Some(outbound),
                },
            },
            Next::Hold(hold) => Self {
                state: Step::Holding {
                    hold,
                    passengers: Some(Passengers {
                        request,
                        inner: inner.clone(),
                    }),
                },
            },
            Next::Reject(response) => Self::rejected(response),
        }
    }

    /// Forwards the request at once, unlimited.
    pub(crate) fn forwarding(future: S::Future) -> Self {
        let outbound = None;
        let state = Step::Forwarding { future, outbound };
        Self { state }
    }

    /// Answers with a rejection made in `call`.
    pub(crate) fn rejected(response: Response<Bytes>) -> Self {
        let response = Some(response);
        let state = Step::Rejected { response };
        Self { state }
    }
}

impl<S, ReqB, St> Step<S, ReqB, St>
where
    S: Service<Request<ReqB>> + Clone,
    St: Store + Clone,
{
    /// The state after a decision. `ready` says whether the passengers' service was driven
    /// to readiness: the one that was may hold a permit (`ConcurrencyLimit`, `Buffer`), so
    /// a held request gives it up for an idle clone rather than keep it through the hold.
    fn after(next: Next<St>, mut passengers: Passengers<S, ReqB>, ready: bool) -> Self {
        match next {
            Next::Forward(outbound) if ready => Step::Forwarding {
                future: passengers.inner.call(passengers.request),
                outbound: Some(outbound),
            },
            Next::Forward(outbound) => Step::Readying {
                passengers: Some(passengers),
                outbound: Some(outbound),
            },
            Next::Hold(hold) => {
                if ready {
                    passengers.inner = passengers.inner.clone();
                }
                Step::Holding {
                    hold,
                    passengers: Some(passengers),
                }
            }
            Next::Reject(response) => Step::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqB, ResB, St> Future for ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: RejectionBody,
    St: Store + Clone,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StepProj::Checking { check, passengers } => {
                    let mut checked = ready!(check.as_mut().poll(cx));
                    let passengers = passengers.take().expect(POLLED_AFTER_COMPLETION);
                    let next = decide(&mut checked, &passengers.request);
                    Step::after(next, passengers, true)
                }
                StepProj::Holding { hold, passengers } => {
                    let released = ready!(hold.as_mut().poll(cx));
                    let passengers = passengers.take().expect(POLLED_AFTER_COMPLETION);
                    let next = match released {
                        Released::Pass(outbound) => Next::Forward(outbound),
                        Released::Counted(mut checked) => decide(&mut checked, &passengers.request),
                    };
                    Step::after(next, passengers, false)
                }
                StepProj::Readying {
                    passengers,
                    outbound,
                } => {
                    let ready = passengers.as_mut().expect(POLLED_AFTER_COMPLETION);
                    ready!(ready.inner.poll_ready(cx))?;
                    let mut passengers = passengers.take().expect(POLLED_AFTER_COMPLETION);
                    Step::Forwarding {
                        future: passengers.inner.call(passengers.request),
                        outbound: outbound.take(),
                    }
                }
                StepProj::Forwarding { future, outbound } => {
                    // An error of the inner service counts (see `Charge`): `?` drops the
                    // charge unsettled, and its units (an estimate too) stay taken.
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(outbound) = outbound.take() {
                        response = outbound.apply(response);
                    }
                    return Poll::Ready(Ok(response));
                }
                StepProj::Rejected { response } => {
                    let response = response.take().expect(POLLED_AFTER_COMPLETION);
                    return Poll::Ready(Ok(response.map(ResB::from_rejection)));
                }
            };
            state.set(next);
        }
    }
}

impl<S, ReqB, St> fmt::Debug for ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>>,
    St: Store + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            Step::Checking { .. } => "checking",
            Step::Holding { .. } => "holding",
            Step::Readying { .. } => "readying",
            Step::Forwarding { .. } => "forwarding",
            Step::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
