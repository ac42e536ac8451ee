//! Error types: small, named, with lower-case messages, so callers can `downcast_ref` them
//! once they are boxed at the edge.

use std::fmt;

/// A rule, rate or penalty that cannot work as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid rate limit configuration: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A store could not decide.
///
/// The request path never panics on these: the caller chooses what a failure means
/// (fail open, fail closed, or fall back to another store).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The batch itself is malformed (for example the same rule twice for one key).
    InvalidBatch(String),
    /// The store could not be reached or answered with an error.
    Unavailable(String),
    /// The store did not answer in time.
    Timeout,
    /// The store answered something this version does not understand.
    Protocol(String),
    /// A [`Breaker`](crate::store::Breaker) in front of the store is open after repeated
    /// failures: the call was not sent, so it failed at once instead of waiting.
    CircuitOpen,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::InvalidBatch(m) => write!(f, "invalid rate limit batch: {m}"),
            StoreError::Unavailable(m) => write!(f, "rate limit store unavailable: {m}"),
            StoreError::Timeout => f.write_str("rate limit store timed out"),
            StoreError::Protocol(m) => write!(f, "unexpected answer from rate limit store: {m}"),
            StoreError::CircuitOpen => f.write_str("rate limit store circuit open"),
        }
    }
}

impl std::error::Error for StoreError {}
