//! [`RejectionBody`]: the inner service's own body type, which a rejection is answered in.

use bytes::Bytes;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Either, Full};

/// A response body type [`RateLimit`](super::RateLimit) answers a rejection in: its responses
/// have the inner service's body type, so a forwarded one passes untouched (axum does not box
/// it again). Implemented for axum's body, tonic's (feature `tonic`), `Full<Bytes>`, `BoxBody`
/// and `UnsyncBoxBody` of `http_body_util`, `Bytes`, `String`, and `Either<L, B>` with `L` one
/// of these: the rejection goes left, and another crate's body passes on the right. A body
/// type of your own implements it from the rejection's bytes (text for HTTP, none for gRPC).
///
/// ```
/// # use bytes::Bytes; use http::Response; use http_body_util::{Either, Empty, Full};
/// # use tollgate::{key, layer::{Limit, RateLimitLayer}, Rate, Rule};
/// # let layer = RateLimitLayer::builder().limit(Limit::new(Rule::gcra("all", 9, Rate::per_second(9)), key::global())).build().unwrap();
/// // `Empty` stands for a body type tollgate does not know.
/// let inner = tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
/// });
/// let service = tower::ServiceBuilder::new()
///     .layer(layer)
///     .map_response(|r: Response<Empty<Bytes>>| r.map(Either::<Full<Bytes>, _>::Right))
///     .service(inner);
/// ```
#[diagnostic::on_unimplemented(
    message = "the layer cannot answer a rejection in a `{Self}` body",
    label = "the inner service's response body",
    note = "tonic's `Body` needs tollgate's `tonic` feature; a body of another crate passes as \
            the right side of `http_body_util::Either<Full<Bytes>, _>` (see `RejectionBody`)"
)]
pub trait RejectionBody {
    /// The body of a rejection whose content is `bytes`.
    fn from_rejection(bytes: Bytes) -> Self;
}

impl RejectionBody for Bytes {
    fn from_rejection(bytes: Bytes) -> Self {
        bytes
    }
}

/// The rejection's text (a default rejection is UTF-8; other bytes are replaced).
impl RejectionBody for String {
    fn from_rejection(bytes: Bytes) -> Self {
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl RejectionBody for Full<Bytes> {
    fn from_rejection(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<E: 'static> RejectionBody for BoxBody<Bytes, E> {
    fn from_rejection(bytes: Bytes) -> Self {
        BoxBody::new(Full::new(bytes).map_err(|never| match never {}))
    }
}

impl<E: 'static> RejectionBody for UnsyncBoxBody<Bytes, E> {
    fn from_rejection(bytes: Bytes) -> Self {
        UnsyncBoxBody::new(Full::new(bytes).map_err(|never| match never {}))
    }
}

impl<L: RejectionBody, R> RejectionBody for Either<L, R> {
    fn from_rejection(bytes: Bytes) -> Self {
        Either::Left(L::from_rejection(bytes))
    }
}

impl RejectionBody for axum_core::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        axum_core::body::Body::from(bytes)
    }
}

#[cfg(feature = "tonic")]
impl RejectionBody for tonic::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        if bytes.is_empty() {
            return tonic::body::Body::default();
        }
        tonic::body::Body::new(Full::new(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every body a rejection is answered in reads back as the rejection's bytes.
    #[tokio::test]
    async fn each_body_carries_the_rejection() {
        let text = Bytes::from_static(b"rate limit exceeded; retry after 42 s\n");
        async fn read<B: http_body::Body<Data = Bytes>>(body: B) -> Bytes
        where
            B::Error: std::fmt::Debug,
        {
            body.collect().await.expect("a body").to_bytes()
        }
        let boxed = BoxBody::<Bytes, std::io::Error>::from_rejection(text.clone());
        let unsync = UnsyncBoxBody::<Bytes, std::io::Error>::from_rejection(text.clone());
        assert_eq!(read(boxed).await, text);
        assert_eq!(read(unsync).await, text);
        assert_eq!(read(Full::from_rejection(text.clone())).await, text);
        assert_eq!(String::from_rejection(text.clone()).as_bytes(), &text[..]);
        assert_eq!(Bytes::from_rejection(text.clone()), text);
        let either =
            Either::<Full<Bytes>, http_body_util::Empty<Bytes>>::from_rejection(text.clone());
        assert_eq!(read(either).await, text);
        assert_eq!(
            read(axum_core::body::Body::from_rejection(text.clone())).await,
            text
        );
        #[cfg(feature = "tonic")]
        {
            assert_eq!(
                read(tonic::body::Body::from_rejection(text.clone())).await,
                text
            );
            let empty = tonic::body::Body::from_rejection(Bytes::new());
            assert!(http_body::Body::is_end_stream(&empty));
        }
    }
}
