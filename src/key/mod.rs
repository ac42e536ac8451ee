//! Keys: what a rule counts under — a client IP, a user id, a route, a constant.
//!
//! A [`KeyExtractor`] reads the head of a request (method, URI, headers, extensions) and
//! appends a key to a [`KeyBuf`], or says why it cannot ([`KeyError`]). The built-ins:
//!
//! | extractor | key |
//! |---|---|
//! | [`peer_ip`] | the TCP peer's address (axum `ConnectInfo`, a hyper `SocketAddr` extension, tonic `TcpConnectInfo`, also inside `TlsConnectInfo`) |
//! | [`client_ip`] | the client's address behind trusted proxies (`X-Forwarded-For`, `Forwarded` or `X-Real-IP`) |
//! | [`header`] | a header's value, e.g. `User-Id` (sent twice: no key, see [`Duplicates`]) |
//! | [`route`] | the matched route (`POST /sms/send`, `/pkg.Service/Method`) |
//! | [`method`] | the HTTP method (one key for all methods no registry lists) |
//! | [`global`], [`constant`] | one key for every request: a global limit |
//! | [`from_fn`] | a closure |
//! | `(A, B)`, `(A, B, C)` | the keys of several extractors, joined by the byte `0x1F` (which header values cannot contain; inside a part, `0x1F` and `0x10` are preceded by `0x10`, so no two tuples share a key) |
//! | [`KeyExtractor::or`] | the first extractor that finds a key, tagged with which one it was (see [`Or`] for the bytes) |
//!
//! Keys are what the client cannot choose, or they limit nothing (see
//! [the guide](crate::guide::api_limit_by_user_id)). IPv6 addresses are aggregated to a
//! prefix (default /64), since one host usually owns a whole /64. The
//! [`Limiter`](crate::Limiter) digests keys longer than 128 bytes, so a 64 KB header value
//! costs the store 33 bytes.
//!
//! ## Holders of whole IPv6 networks
//!
//! Providers hand out a /56 or a /48, so one holder can rotate through 256 or 65,536 /64s.
//! Add a second, coarser limit on the wider prefix to the same layer: both are decided as one
//! batch, so a request refused by either consumes neither. IPv4 clients are counted per
//! address by both rules; give the coarse one the larger quota.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Rule, store::MemoryStore};
//!
//! # fn main() -> Result<(), tollgate::ConfigError> {
//! let minute = Duration::from_secs(60);
//! let layer = RateLimitLayer::builder()
//!     // 60 a minute for each /64 (and each IPv4 address)…
//!     .limit(Limit::new(Rule::fixed_window("ip", 60, minute), key::peer_ip()))
//!     // …and 600 a minute for a whole /48, however many /64s it rotates through.
//!     .limit(Limit::new(
//!         Rule::fixed_window("ip-48", 600, minute),
//!         key::peer_ip().ipv6_prefix(48),
//!     ))
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```

mod error;
mod headers;
mod ip;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::{Extensions, HeaderMap, Method, Request, Uri};
use smallvec::SmallVec;

use crate::error::ConfigError;

pub use error::{KeyError, KeyErrorKind};
pub use headers::{header, Duplicates, Header};
pub use ip::{client_ip, peer_ip, ClientIp, ForwardedHeader, PeerIp};

/// The parts of a request a key (or a cost) can be read from.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
    route: Option<&'a str>,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`, with no matched route.
    pub fn from_request<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
            route: None,
        }
    }

    /// The same head with `route` as its matched route.
    pub(crate) fn with_route(mut self, route: Option<&'a str>) -> Self {
        self.route = route;
        self
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (connection info, axum's `MatchedPath`, …).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The route the request matched: the pattern of the layer's route table that matched
    /// it, else axum's `MatchedPath` (with the `axum` feature), else `None`.
    pub fn route(&self) -> Option<&'a str> {
        if self.route.is_some() {
            return self.route;
        }
        #[cfg(feature = "axum")]
        if let Some(path) = self.extensions.get::<axum::extract::MatchedPath>() {
            return Some(path.as_str());
        }
        None
    }
}

/// A key being built: bytes kept inline up to 128, so typical keys cost no allocation.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeyBuf {
    bytes: SmallVec<[u8; 128]>,
}

impl KeyBuf {
    /// An empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `bytes`.
    pub fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// The key so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Drops everything after the first `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.bytes.truncate(len);
    }

    /// Escapes the bytes from `start` on as one part of a tuple's key: each
    /// [`KEY_SEPARATOR`] or [`KEY_ESCAPE`] is preceded by [`KEY_ESCAPE`]. Parts holding
    /// neither (the usual case) are not copied.
    fn escape_part(&mut self, start: usize) {
        let special = |b: &u8| matches!(*b, KEY_SEPARATOR | KEY_ESCAPE);
        let part = self.bytes.get(start..).unwrap_or_default();
        if !part.iter().any(special) {
            return;
        }
        let part: SmallVec<[u8; 128]> = part.into();
        self.bytes.truncate(start);
        for b in part {
            if special(&b) {
                self.bytes.push(KEY_ESCAPE);
            }
            self.bytes.push(b);
        }
    }
}

impl fmt::Write for KeyBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

impl fmt::Debug for KeyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyBuf({:?})", String::from_utf8_lossy(&self.bytes))
    }
}

/// Turns a request into the key a rule counts under.
///
/// Implementations append to `key` and must not panic on any request; return a
/// [`KeyError`] instead. On an error the caller discards whatever was appended.
///
/// ```
/// use tollgate::key::{KeyBuf, KeyError, KeyErrorKind, KeyExtractor, RequestHead};
///
/// /// The tenant from the first path segment: `/acme/orders` → `acme`.
/// struct Tenant;
///
/// impl KeyExtractor for Tenant {
///     fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
///         match req.uri().path().split('/').nth(1) {
///             Some(tenant) if !tenant.is_empty() => Ok(key.push(tenant.as_bytes())),
///             _ => Err(KeyError::new(KeyErrorKind::Missing, "tenant in the path")),
///         }
///     }
/// }
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// Appends the key of `req` to `key`.
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError>;

    /// Whether this extractor's configuration can work: a layer's
    /// [`build`](crate::layer::RateLimitLayerBuilder::build) reports the problems with the
    /// rule they key. An extractor used with a problem finds no key
    /// ([`KeyErrorKind::Misconfigured`]). The default: nothing to check.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// `self`, or `other` when `self` finds no key ([`KeyErrorKind::Missing`] or
    /// [`KeyErrorKind::Invalid`]): `key::header("user-id").or(key::peer_ip())` limits signed-in users
    /// by id and everyone else by address. The two branches never share a key (see [`Or`]):
    /// the user `203.0.113.7` is not the anonymous client at 203.0.113.7.
    fn or<E: KeyExtractor>(self, other: E) -> Or<Self, E>
    where
        Self: Sized,
    {
        Or {
            first: self,
            second: other,
        }
    }
}

impl<E: KeyExtractor + ?Sized> KeyExtractor for Arc<E> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        (**self).extract(req, key)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        (**self).validate()
    }
}

impl<E: KeyExtractor + ?Sized> KeyExtractor for Box<E> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        (**self).extract(req, key)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        (**self).validate()
    }
}

/// The first extractor that finds a key; see [`KeyExtractor::or`].
///
/// The key is tagged with the branch that found it: the byte `0x01` and the first
/// extractor's key, or `0x02` and the second's, so no key of one branch can spell a key of
/// the other (pass the tagged bytes to [`Limiter::reset`](crate::Limiter::reset)).
///
/// ```
/// use tollgate::key::{self, KeyBuf, KeyExtractor, RequestHead};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_user = key::header("user-id").or(key::global());
/// let key_of = |request: &http::Request<()>| {
///     let mut buf = KeyBuf::new();
///     per_user.extract(&RequestHead::from_request(request), &mut buf).map(|()| buf)
/// };
/// let named_global = http::Request::get("/").header("user-id", "global").body(())?;
/// let anonymous = http::Request::get("/").body(())?;
/// assert_eq!(key_of(&named_global)?.as_bytes(), b"\x01global");
/// assert_eq!(key_of(&anonymous)?.as_bytes(), b"\x02global");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

/// The byte before a key found by the first extractor of an [`Or`].
pub(crate) const OR_FIRST: u8 = 0x01;

/// The byte before a key found by the second extractor of an [`Or`].
pub(crate) const OR_SECOND: u8 = 0x02;

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        let start = key.len();
        key.push(&[OR_FIRST]);
        match self.first.extract(req, key) {
            Err(e) if e.kind() != KeyErrorKind::Misconfigured => {
                key.truncate(start);
                key.push(&[OR_SECOND]);
                self.second.extract(req, key)
            }
            other => other,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let problems = [self.first.validate(), self.second.validate()];
        ConfigError::collect(problems.into_iter().filter_map(Result::err)).map_or(Ok(()), Err)
    }
}

/// Separates the parts of a tuple extractor's key (the ASCII unit separator, which header
/// values cannot contain).
pub(crate) const KEY_SEPARATOR: u8 = 0x1F;

/// Precedes a [`KEY_SEPARATOR`] or itself inside one part of a tuple's key (the ASCII data
/// link escape, which header values cannot contain either).
pub(crate) const KEY_ESCAPE: u8 = 0x10;

macro_rules! tuple_extractor {
    ($($name:ident),+) => {
        impl<$($name: KeyExtractor),+> KeyExtractor for ($($name,)+) {
            #[allow(non_snake_case)]
            fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
                let ($($name,)+) = self;
                let mut first = true;
                $(
                    if !std::mem::take(&mut first) {
                        key.push(&[KEY_SEPARATOR]);
                    }
                    let start = key.len();
                    $name.extract(req, key)?;
                    key.escape_part(start);
                )+
                Ok(())
            }

            #[allow(non_snake_case)]
            fn validate(&self) -> Result<(), ConfigError> {
                let ($($name,)+) = self;
                let problems = [$($name.validate()),+];
                ConfigError::collect(problems.into_iter().filter_map(Result::err)).map_or(Ok(()), Err)
            }
        }
    };
}

tuple_extractor!(A, B);
tuple_extractor!(A, B, C);
tuple_extractor!(A, B, C, D);

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MethodKey;

/// The HTTP method (`GET`, `POST`, …); every method the IANA registry does not list is one
/// key, `(other)`: methods clients invent never make keys of their own.
pub fn method() -> impl KeyExtractor + Clone + fmt::Debug {
    MethodKey
}

/// The methods of the IANA registry of HTTP methods, and `PURGE` (sent to caches,
/// unregistered): any other is invented (a route naming one, most likely a typo).
pub(crate) const KNOWN_METHODS: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "CONNECT",
    "OPTIONS",
    "TRACE",
    "PATCH",
    "QUERY",
    "ACL",
    "BASELINE-CONTROL",
    "BIND",
    "CHECKIN",
    "CHECKOUT",
    "COPY",
    "LABEL",
    "LINK",
    "LOCK",
    "MERGE",
    "MKACTIVITY",
    "MKCALENDAR",
    "MKCOL",
    "MKREDIRECTREF",
    "MKWORKSPACE",
    "MOVE",
    "ORDERPATCH",
    "PRI",
    "PROPFIND",
    "PROPPATCH",
    "REBIND",
    "REPORT",
    "SEARCH",
    "UNBIND",
    "UNCHECKOUT",
    "UNLINK",
    "UNLOCK",
    "UPDATE",
    "UPDATEREDIRECTREF",
    "VERSION-CONTROL",
    "PURGE",
];

impl KeyExtractor for MethodKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        let method = req.method().as_str();
        let known = KNOWN_METHODS.contains(&method);
        key.push(if known { method } else { "(other)" }.as_bytes());
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RouteKey;

/// The matched route: the pattern of the layer's route table that matched the request
/// (`POST /sms/send`, `/pkg.Service/Method`), else axum's `MatchedPath` (with the `axum`
/// feature; `/files/{id}`, so all files share one key), else one key for every request no
/// route matched: paths clients invent never make keys of their own. For gRPC, list the
/// methods (or `/pkg.Service/*`) in the route table.
pub fn route() -> impl KeyExtractor + Clone + fmt::Debug {
    RouteKey
}

impl KeyExtractor for RouteKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        // Not a pattern: patterns start with a method or a '/'.
        let route = req.route().unwrap_or("(no route)");
        key.push(route.as_bytes());
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Constant {
    key: Cow<'static, [u8]>,
}

/// The key `key` for every request: one shared limit.
pub fn constant(key: impl Into<Cow<'static, [u8]>>) -> impl KeyExtractor + Clone + fmt::Debug {
    Constant { key: key.into() }
}

/// The key `global` for every request: a limit on the whole service (or, in a
/// `route_layer`, on the whole route).
pub fn global() -> impl KeyExtractor + Clone + fmt::Debug {
    constant(&b"global"[..])
}

impl KeyExtractor for Constant {
    fn extract(&self, _: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        key.push(&self.key);
        Ok(())
    }
}

#[derive(Clone)]
pub(crate) struct FromFn<F> {
    f: F,
}

/// A closure as an extractor: `None` is [`KeyErrorKind::Missing`].
///
/// ```
/// use tollgate::key::{self, KeyBuf, KeyExtractor, RequestHead};
///
/// // The API key from the query string: /search?api_key=abc
/// let api_key = key::from_fn(|req: &RequestHead<'_>| {
///     req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix("api_key=")).map(str::to_owned)
/// });
/// let request = http::Request::get("/search?q=x&api_key=abc").body(()).unwrap();
/// let mut buf = KeyBuf::new();
/// api_key.extract(&RequestHead::from_request(&request), &mut buf).unwrap();
/// assert_eq!(buf.as_bytes(), b"abc");
/// ```
pub fn from_fn<F, K>(f: F) -> impl KeyExtractor
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: AsRef<[u8]>,
{
    FromFn { f }
}

impl<F, K> KeyExtractor for FromFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: AsRef<[u8]>,
{
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        match (self.f)(req) {
            Some(k) => {
                key.push(k.as_ref());
                Ok(())
            }
            None => Err(KeyError::new(
                KeyErrorKind::Missing,
                "key from the extractor function",
            )),
        }
    }
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extract(e: &impl KeyExtractor, req: &Request<()>) -> Result<Vec<u8>, KeyError> {
        let mut buf = KeyBuf::new();
        e.extract(&RequestHead::from_request(req), &mut buf)?;
        Ok(buf.as_bytes().to_vec())
    }

    /// A header key reads one header, a tuple joins its parts, a missing header is
    /// `Missing`, and each branch of a fallback is tagged so two branches never share a
    /// key.
    #[test]
    fn header_tuple_and_fallback() {
        let req = Request::post("/sms/send")
            .header("user-id", "u1")
            .body(())
            .unwrap();
        let user = header("user-id");
        assert_eq!(extract(&user, &req).unwrap(), b"u1");
        assert_eq!(
            extract(&(method(), user.clone()), &req).unwrap(),
            b"POST\x1fu1"
        );
        let bare = Request::get("/").body(()).unwrap();
        let err = extract(&user, &bare).unwrap_err();
        assert_eq!(err.kind(), KeyErrorKind::Missing);
        assert_eq!(err.to_string(), "missing rate limit key: header user-id");
        // Each branch of a fallback is tagged, so the two cannot share a key.
        assert_eq!(
            extract(&user.clone().or(global()), &bare).unwrap(),
            b"\x02global"
        );
        assert_eq!(extract(&user.or(global()), &req).unwrap(), b"\x01u1");
        assert!(header("bad header").validate().is_err());
        assert!(extract(&header("bad header"), &req).is_err());
        assert_eq!(header(http::header::USER_AGENT).name.unwrap(), "user-agent");
        assert_eq!(header("User-Id").name.unwrap(), "user-id");
    }

    /// Methods no registry lists are one key: a client inventing `FOO1`, `FOO2`, … gets no
    /// fresh quota per name; the registered methods keep a key each.
    #[test]
    fn an_invented_method_is_one_key() {
        let with = |m: &str| Request::builder().method(m).uri("/").body(()).unwrap();
        let key = |m: &str| extract(&method(), &with(m)).unwrap();
        assert_eq!(key("FOO1"), key("FOO2"));
        assert_eq!(key("FOO1"), b"(other)");
        assert_ne!(key("GET"), key("POST"));
        assert_eq!(key("PATCH"), b"PATCH");
    }

    /// A request no route matched has the one key of all such requests, never its path.
    #[test]
    fn route_without_a_match_is_one_key() {
        let req = Request::post("/pkg.Svc/Method").body(()).unwrap();
        let other = Request::get("/anything/else").body(()).unwrap();
        assert_eq!(extract(&route(), &req).unwrap(), b"(no route)");
        assert_eq!(extract(&route(), &other).unwrap(), b"(no route)");
        let mut buf = KeyBuf::new();
        route()
            .extract(
                &RequestHead::from_request(&req).with_route(Some("POST /pkg.Svc/*")),
                &mut buf,
            )
            .unwrap();
        assert_eq!(buf.as_bytes(), b"POST /pkg.Svc/*");
    }
}
