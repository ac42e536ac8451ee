//! [`KeyError`]: why an extractor found no key, and what kind of problem that is.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

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

/// A [`KeyError`]'s message: given by the caller, or shared by an extractor (an `Arc`
/// clone, so a fallback costs no allocation).
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
    /// An error of `kind`; `message` says what is missing or unreadable, or, for
    /// [`Misconfigured`](KeyErrorKind::Misconfigured), names the fix.
    pub fn new(kind: KeyErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: Message::Given(message.into()),
        }
    }

    /// An error of `kind` whose `message` is shared, not copied.
    pub(super) fn shared(kind: KeyErrorKind, message: &Arc<str>) -> Self {
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
