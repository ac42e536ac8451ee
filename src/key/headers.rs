//! [`header`]: the key a request names in one of its headers, and which value counts
//! when it sends the header more than once.

use std::sync::Arc;

use http::header::HeaderName;

use crate::error::ConfigError;

use super::{KeyBuf, KeyError, KeyErrorKind, KeyExtractor, RequestHead};

/// The value of a header; see [`header`].
#[derive(Debug, Clone)]
pub struct Header {
    pub(super) name: HeaderName,
    duplicates: Duplicates,
    /// The messages of a request without the header, and with it twice: made once, so a
    /// fallback costs no allocation.
    missing: Arc<str>,
    duplicated: Arc<str>,
}

/// Which value of a header that a request sends more than once is its key; see
/// [`Header::duplicates`].
///
/// A gateway that *appends* an identity header after the client's own, or keeps the
/// client's copy, would give a client sending `User-Id: random-$RANDOM` a fresh limit per
/// request, so the default refuses such a request. Gateways should *replace* identity
/// headers (nginx `proxy_set_header`, Envoy `OVERWRITE_IF_EXISTS_OR_ADD`, HAProxy
/// `http-request set-header`).
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
/// Put the service behind a gateway that authenticates the client and *replaces* the header
/// (see [`Duplicates`]), or the key is whatever the client says. Several values on one line
/// (`User-Id: a, b`) are one value, `a, b`.
///
/// The name is a literal (`"user-id"`, any case) or an [`http::HeaderName`]; for a name read
/// at run time, use [`try_header`].
///
/// # Panics
///
/// On a `&'static str` that is not a valid header name, as [`HeaderName::from_static`]
/// does: a literal is the program's own text. Names from configuration go through
/// [`try_header`].
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
