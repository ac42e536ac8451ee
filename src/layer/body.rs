//! [`RateLimitBody`]: the inner service's body, or the body of a rejection.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The response body of [`RateLimit`](super::RateLimit): the inner service's body for a
    /// forwarded request, the rejection's bytes otherwise. Any inner body type works, as in
    /// tower-http's middlewares that answer by themselves.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Source<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Source<B> {
        Inner {
            #[pin]
            body: B,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Source::Inner { body },
        }
    }

    /// A complete body of `data` (a rejection).
    pub(crate) fn full(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            kind: Source::Full { data },
        }
    }
}

impl<B> Default for RateLimitBody<B> {
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Source::Inner { body } => body.is_end_stream(),
            Source::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Source::Inner { body } => body.size_hint(),
            Source::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Source::Inner { .. } => f.write_str("RateLimitBody::Inner"),
            Source::Full { data } => f.debug_tuple("RateLimitBody::Full").field(data).finish(),
        }
    }
}
