//! [`header`]: the key a request names in one of its headers, and which value counts
//! when it sends the header more than once.

use std::sync::Arc;

use http::header::HeaderName;

use crate::error::ConfigError;

use super::{KeyBuf, KeyError, KeyErrorKind, KeyExtractor, RequestHead};

/// The value of a header; see [`header`].
#[derive(Debug, Clone)]
pub struct Header {
    /// The name, or the text that is no header name (reported by `validate`).
    pub(super) name: Result<HeaderName, Arc<str>>,
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
/// The header must come from a gateway that authenticates the client and *replaces* it (see
/// [`Duplicates`]). Several values on one line (`User-Id: a, b`) are one value, `a, b`. The
/// name is any text (`"user-id"`, any case); one that is no header name is reported by
/// [`validate`](KeyExtractor::validate).
///
/// ```
/// use tollgate::key::{self, KeyExtractor};
///
/// assert!(key::header("user-id").validate().is_ok());
/// assert!(key::header("user id").validate().is_err());
/// ```
pub fn header(name: impl AsRef<str>) -> Header {
    let text = name.as_ref();
    let name = HeaderName::from_bytes(text.as_bytes()).map_err(|_| Arc::from(text));
    let shown = name.as_ref().map_or(text, HeaderName::as_str);
    Header {
        missing: format!("header {shown}").into(),
        duplicated: format!("header {shown} appears more than once").into(),
        duplicates: Duplicates::default(),
        name,
    }
}

impl Header {
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
        let name = self.name.as_ref().map_err(|_| {
            KeyError::new(
                KeyErrorKind::Misconfigured,
                "the key's header name is invalid (see the layer's build)",
            )
        })?;
        let mut values = req.headers().get_all(name).iter();
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

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |text| ConfigError::new(format!("{text:?} is not a valid header name"));
        self.name.as_ref().map(|_| ()).map_err(invalid)
    }
}
