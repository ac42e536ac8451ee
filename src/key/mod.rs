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
//! | [`method`] | the HTTP method |
//! | [`global`], [`constant`] | one key for every request: a global limit |
//! | [`from_fn`] | a closure |
//! | `(A, B)`, `(A, B, C)` | the keys of several extractors, joined |
//! | [`KeyExtractor::or`] | the first extractor that finds a key, tagged with which one it was |
//!
//! ```
//! use tollgate::key::{self, KeyBuf, KeyExtractor, RequestHead};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_user = key::header("user-id").or(key::global());
//! let request = http::Request::get("/").header("user-id", "42").body(())?;
//! let mut buf = KeyBuf::new();
//! per_user.extract(&RequestHead::from_request(&request), &mut buf)?;
//! // Tagged as found by the first branch of `or`.
//! assert_eq!(buf.as_bytes(), b"\x0142");
//! # Ok(()) }
//! ```
//!
//! Keys are what the client cannot choose, or they limit nothing. A header key is only as good
//! as the gateway in front: it must authenticate the client and *replace* the header, and
//! a request that carries it twice (the client's copy and the gateway's) is refused unless
//! [`Header::duplicates`] says which copy counts. Forwarding headers are read only from
//! trusted proxies, from the right. The two branches of [`KeyExtractor::or`] never share a
//! key: the user `203.0.113.7` is not the anonymous client at that address.
//!
//! IPv6 addresses are aggregated to a prefix (default /64): one host usually owns a whole
//! /64, so limiting single addresses would let it rotate through 2^64 of them. IPv4-mapped
//! addresses (`::ffff:192.0.2.1`, what a dual-stack listener reports for IPv4 clients) are
//! their IPv4 address, as peers, as trusted proxies and as keys. Keys longer
//! than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes are digested by the [`Limiter`](crate::Limiter),
//! so a client sending a 64 KB header value costs the store 33 bytes.
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
//! use tollgate::{key, Limiter, MemoryStore, Rule};
//!
//! # fn main() -> Result<(), tollgate::ConfigError> {
//! let minute = Duration::from_secs(60);
//! let layer = RateLimitLayer::builder(Limiter::new(MemoryStore::new()))
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

mod ip;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use http::{Extensions, HeaderMap, Method, Request, Uri};
use smallvec::SmallVec;

use crate::error::ConfigError;

pub use ip::{client_ip, peer_ip, try_client_ip, ClientIp, ForwardedHeader, PeerIp};

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
    pub fn with_route(mut self, route: Option<&'a str>) -> Self {
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
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Drops everything after the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.bytes.truncate(len);
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

/// What kind of problem kept an extractor from finding a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyErrorKind {
    /// The request lacks what the key is read from (a header, for instance). The rule's
    /// [`MissingKey`](crate::layer::MissingKey) policy decides: reject with 400 or skip it.
    Missing,
    /// The request has it, but it cannot be read (an unparsable address, say) or does not
    /// name one client (a key header sent twice). Treated like [`Missing`](Self::Missing).
    Invalid,
    /// The server is set up so that the key can never be found (no connection info for a
    /// peer-IP key). Answered with 500 and a message naming the fix, whatever the policy.
    Misconfigured,
}

/// Why an extractor found no key.
#[derive(Debug, Clone)]
pub struct KeyError {
    kind: KeyErrorKind,
    message: Message,
}

/// A [`KeyError`]'s message: given by the caller, or shared by an extractor that gives it on
/// every request without its key (an `Arc` clone, so a fallback costs no allocation).
#[derive(Clone)]
enum Message {
    Given(Cow<'static, str>),
    Shared(Arc<str>),
}

impl Message {
    fn as_str(&self) -> &str {
        match self {
            Message::Given(m) => m,
            Message::Shared(m) => m,
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Errors are equal when their kind and text are, however the text is held.
impl PartialEq for KeyError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message() == other.message()
    }
}

impl Eq for KeyError {}

impl KeyError {
    /// The request lacks the key (`message` says what is missing).
    pub fn missing(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(KeyErrorKind::Missing, message)
    }

    /// The request's key cannot be read.
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(KeyErrorKind::Invalid, message)
    }

    /// The server cannot provide the key; `message` should name the fix.
    pub fn misconfigured(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(KeyErrorKind::Misconfigured, message)
    }

    fn new(kind: KeyErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: Message::Given(message.into()),
        }
    }

    /// An error of `kind` whose `message` is shared, not copied.
    fn shared(kind: KeyErrorKind, message: &Arc<str>) -> Self {
        Self {
            kind,
            message: Message::Shared(Arc::clone(message)),
        }
    }

    /// What kind of problem it is.
    pub fn kind(&self) -> KeyErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        self.message.as_str()
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            KeyErrorKind::Missing => write!(f, "missing rate limit key: {}", self.message()),
            KeyErrorKind::Invalid => write!(f, "invalid rate limit key: {}", self.message()),
            KeyErrorKind::Misconfigured => {
                write!(f, "rate limit key unavailable: {}", self.message())
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// Turns a request into the key a rule counts under.
///
/// Implementations append to `key` and must not panic on any request; return a
/// [`KeyError`] instead. On an error the caller discards whatever was appended.
///
/// ```
/// use tollgate::key::{KeyBuf, KeyError, KeyExtractor, RequestHead};
///
/// /// The tenant from the first path segment: `/acme/orders` → `acme`.
/// struct Tenant;
///
/// impl KeyExtractor for Tenant {
///     fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
///         match req.uri().path().split('/').nth(1) {
///             Some(tenant) if !tenant.is_empty() => Ok(key.push(tenant.as_bytes())),
///             _ => Err(KeyError::missing("tenant in the path")),
///         }
///     }
/// }
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// Appends the key of `req` to `key`.
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError>;

    /// Whether this extractor's configuration can work: a layer's
    /// [`build`](crate::layer::RateLimitLayerBuilder::build) calls it for every limit and
    /// reports the problems with the rule they key. The built-in extractors whose
    /// constructors take literals without a `?` ([`client_ip`], `ipv6_prefix`) record their
    /// problems for this; an extractor used with a problem finds no key
    /// ([`KeyErrorKind::Misconfigured`]). The default: nothing to check.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// `self`, or `other` when `self` finds no key ([`KeyErrorKind::Missing`] or
    /// [`KeyErrorKind::Invalid`]): `key::header("user-id").or(key::peer_ip())` limits signed-in users
    /// by id and everyone else by address.
    ///
    /// The two branches count in separate key spaces: the user `203.0.113.7` is not the
    /// anonymous client at 203.0.113.7, and a user named `global` is not every anonymous
    /// request of `.or(key::global())`. See [`Or`] for the bytes.
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
/// The key is tagged with the branch that found it: [`OR_FIRST`] and the first extractor's key,
/// or [`OR_SECOND`] and the second's. One byte, so the key stays inline and a fallback
/// allocates nothing; a fixed-length tag, so no key of one branch can spell a key of the other,
/// whatever bytes the extractors write. (Pass the tagged bytes to
/// [`Limiter::reset`](crate::Limiter::reset) to unblock a key by hand.)
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
pub const OR_FIRST: u8 = 0x01;

/// The byte before a key found by the second extractor of an [`Or`].
pub const OR_SECOND: u8 = 0x02;

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
pub const KEY_SEPARATOR: u8 = 0x1F;

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
                    $name.extract(req, key)?;
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

/// The value of a header; see [`header`].
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    duplicates: Duplicates,
    /// The messages of a request without the header, and with it twice: made once, so a
    /// fallback costs no allocation.
    missing: Arc<str>,
    duplicated: Arc<str>,
}

/// Which value of a header that a request sends more than once is its key; see
/// [`Header::duplicates`].
///
/// A gateway that *appends* an identity header after the client's own leaves the client's
/// value first, and one that keeps the client's copy lets it through untouched: with either,
/// a client that sends `User-Id: random-$RANDOM` would get a fresh limit per request. So the
/// default refuses such a request. Gateways must *replace* identity headers (nginx
/// `proxy_set_header`, Envoy `request_headers_to_add` with `OVERWRITE_IF_EXISTS_OR_ADD`,
/// HAProxy `http-request set-header`), and then every request carries exactly one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Duplicates {
    /// A request with the header more than once has no key
    /// ([`KeyErrorKind::Invalid`], `header user-id appears more than once`): the limit's
    /// [`MissingKey`](crate::layer::MissingKey) policy applies (400 by default), and
    /// [`KeyExtractor::or`] falls back to its other extractor. The default.
    #[default]
    Reject,
    /// The first value counts: only right when the client cannot add values of its own.
    First,
    /// The last value counts: for a gateway that appends its value after the client's on
    /// every request (one that only sometimes adds it leaves the client's value last).
    Last,
}

/// The value of header `name` (any bytes; an absent or empty header is
/// [`KeyErrorKind::Missing`]). A request that sends the header more than once has no key
/// ([`KeyErrorKind::Invalid`]) unless [`Header::duplicates`] says which value counts.
///
/// The client writes this header: put the service behind a gateway that authenticates the
/// client and *replaces* the header (see [`Duplicates`]), or the key is whatever the client
/// says. Several values on one line (`User-Id: a, b`) are one value, `a, b`.
///
/// The name is a literal (`"user-id"`, any case) or an [`http::HeaderName`]; for a name read
/// at run time, use [`try_header`].
///
/// # Panics
///
/// On a `&'static str` that is not a valid header name, as [`HeaderName::from_static`]
/// does: a literal is the program's own text, and the first start of the service shows the
/// mistake. Names from configuration go through [`try_header`], which returns the error.
pub fn header(name: impl IntoHeaderName) -> Header {
    Header::named(name.into_header_name())
}

/// [`header`] for a name read at run time: an invalid header name is a configuration error.
///
/// ```
/// use tollgate::key;
///
/// assert!(key::try_header("user-id").is_ok());
/// assert!(key::try_header("user id").is_err());
/// ```
pub fn try_header(name: &str) -> Result<Header, ConfigError> {
    HeaderName::from_bytes(name.as_bytes())
        .map(Header::named)
        .map_err(|_| ConfigError::new(format!("{name:?} is not a valid header name")))
}

/// A header name [`header`] accepts without a `?`: an [`http::HeaderName`], or a
/// `&'static str` literal (checked as [`HeaderName::from_static`] checks one, but in any
/// case).
pub trait IntoHeaderName {
    /// The name; see [`header`] for what an invalid literal does.
    fn into_header_name(self) -> HeaderName;
}

impl IntoHeaderName for HeaderName {
    fn into_header_name(self) -> HeaderName {
        self
    }
}

impl IntoHeaderName for &HeaderName {
    fn into_header_name(self) -> HeaderName {
        self.clone()
    }
}

impl IntoHeaderName for &'static str {
    fn into_header_name(self) -> HeaderName {
        match HeaderName::from_bytes(self.as_bytes()) {
            Ok(name) => name,
            // A literal in the program's source, not input: the documented panic of
            // `key::header`, as `HeaderName::from_static`'s.
            Err(_) => panic!("{self:?} is not a valid header name; use key::try_header for names read at run time"),
        }
    }
}

impl Header {
    fn named(name: HeaderName) -> Self {
        Self {
            missing: format!("header {name}").into(),
            duplicated: format!("header {name} appears more than once").into(),
            duplicates: Duplicates::default(),
            name,
        }
    }

    /// Which value counts when a request sends the header more than once (default
    /// [`Duplicates::Reject`]: none).
    ///
    /// ```
    /// use tollgate::key::{self, Duplicates};
    ///
    /// # fn main() -> Result<(), tollgate::ConfigError> {
    /// // Behind a gateway that appends the authenticated id after whatever the client sent.
    /// let user = key::header("user-id").duplicates(Duplicates::Last);
    /// # Ok(()) }
    /// ```
    pub fn duplicates(mut self, duplicates: Duplicates) -> Self {
        self.duplicates = duplicates;
        self
    }
}

impl KeyExtractor for Header {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        let mut values = req.headers().get_all(&self.name).iter();
        let value = match self.duplicates {
            Duplicates::Reject => {
                let first = values.next();
                if values.next().is_some() {
                    return Err(KeyError::shared(KeyErrorKind::Invalid, &self.duplicated));
                }
                first
            }
            Duplicates::First => values.next(),
            Duplicates::Last => values.next_back(),
        };
        match value {
            Some(value) if !value.is_empty() => {
                key.push(value.as_bytes());
                Ok(())
            }
            _ => Err(KeyError::shared(KeyErrorKind::Missing, &self.missing)),
        }
    }
}

/// The HTTP method; see [`method`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodKey;

/// The HTTP method (`GET`, `POST`, …).
pub fn method() -> MethodKey {
    MethodKey
}

impl KeyExtractor for MethodKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        key.push(req.method().as_str().as_bytes());
        Ok(())
    }
}

/// The matched route; see [`route`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

/// The matched route: the pattern of the layer's route table that matched the request
/// (`POST /sms/send`, `/pkg.Service/Method`), else axum's `MatchedPath` (with the `axum`
/// feature; `/files/{id}`, so all files share one key), else the URI path — which for gRPC is
/// the method (`/pkg.Service/Method`), and for other requests can take as many values as
/// clients send paths.
pub fn route() -> Route {
    Route
}

impl KeyExtractor for Route {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        let route = req.route().unwrap_or_else(|| req.uri().path());
        key.push(route.as_bytes());
        Ok(())
    }
}

/// The same key for every request; see [`constant`] and [`global`].
#[derive(Debug, Clone)]
pub struct Constant {
    key: Cow<'static, [u8]>,
}

/// The key `key` for every request: one shared limit.
pub fn constant(key: impl Into<Cow<'static, [u8]>>) -> Constant {
    Constant { key: key.into() }
}

/// The key `global` for every request: a limit on the whole service (or, in a
/// `route_layer`, on the whole route).
pub fn global() -> Constant {
    constant(&b"global"[..])
}

impl KeyExtractor for Constant {
    fn extract(&self, _: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        key.push(&self.key);
        Ok(())
    }
}

/// A closure as an extractor; see [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F> {
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
pub fn from_fn<F, K>(f: F) -> FromFn<F>
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
            None => Err(KeyError::missing("key from the extractor function")),
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
        assert!(try_header("bad header").is_err());
        assert_eq!(header(http::header::USER_AGENT).name, "user-agent");
        assert_eq!(header("User-Id").name, "user-id");
    }

    #[test]
    fn route_falls_back_to_the_path() {
        let req = Request::post("/pkg.Svc/Method").body(()).unwrap();
        assert_eq!(extract(&route(), &req).unwrap(), b"/pkg.Svc/Method");
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
