//! [`RejectionBody`]: the inner service's own body type, which a rejection is answered in.

use bytes::Bytes;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Either, Full};

/// A response body type [`RateLimit`](super::RateLimit) can answer a rejection in: the
/// middleware's responses have the inner service's body type, so a forwarded response passes
/// through untouched (axum does not box it again) and a service's type is the same with the
/// layer or without it.
///
/// Implemented for axum's and tonic's bodies (with their features), `http_body_util`'s
/// `Full<Bytes>`, `BoxBody` and `UnsyncBoxBody`, `Bytes` and `String`, and for
/// `http_body_util::Either<L, B>` whose left side is one of these (the rejection goes left),
/// so a body type from another crate (a tower-http middleware's, say) passes as its right
/// side:
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::{Either, Empty, Full};
/// use tollgate::layer::{Limit, RateLimitLayer};
/// use tollgate::{key, Rate, Rule};
/// use tower::{service_fn, ServiceBuilder};
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// // `Empty` stands for a body type tollgate does not know.
/// let inner = service_fn(|_: Request<()>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
/// });
/// let limit = Limit::new(Rule::gcra("all", 100, Rate::per_second(50)), key::global());
/// let service = ServiceBuilder::new()
///     .layer(RateLimitLayer::builder().limit(limit).build()?)
///     .map_response(|r: Response<Empty<Bytes>>| r.map(Either::<Full<Bytes>, _>::Right))
///     .service(inner);
/// # let _ = service;
/// # Ok(()) }
/// ```
///
/// For a body type of your own, build it from the rejection's bytes (a plain-text message
/// for HTTP, empty for gRPC):
///
/// ```
/// use bytes::Bytes;
/// use tollgate::layer::RejectionBody;
///
/// struct MyBody(Vec<u8>);
///
/// impl RejectionBody for MyBody {
///     fn from_rejection(bytes: Bytes) -> Self {
///         MyBody(bytes.to_vec())
///     }
/// }
/// # let _ = MyBody::from_rejection(Bytes::new());
/// ```
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

#[cfg(feature = "axum")]
impl RejectionBody for axum::body::Body {
    fn from_rejection(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
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
        #[cfg(feature = "axum")]
        assert_eq!(
            read(axum::body::Body::from_rejection(text.clone())).await,
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
