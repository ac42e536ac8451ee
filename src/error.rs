//! Error types: small, named, with lower-case messages, so callers can `downcast_ref` them
//! once they are boxed at the edge.

use std::fmt;

/// A configuration that cannot work: a rule, rate, key or route, or a layer whose parts do
/// not fit together.
///
/// A layer's [`build`](crate::layer::RateLimitLayerBuilder::build) reports every problem it
/// finds at once, each naming the rule or route it concerns; `Display` writes them one per
/// line, and [`problems`](Self::problems) lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Never empty.
    problems: Vec<String>,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            problems: vec![message.into()],
        }
    }

    /// All of `errors`' problems in one error, or `None` when there are none.
    pub(crate) fn collect(errors: impl IntoIterator<Item = ConfigError>) -> Option<Self> {
        let problems: Vec<String> = errors.into_iter().flat_map(|e| e.problems).collect();
        (!problems.is_empty()).then_some(Self { problems })
    }

    /// The same problems, each prefixed with `context` (`rule "sms-min"`, say).
    pub(crate) fn within(self, context: impl fmt::Display) -> Self {
        Self {
            problems: self
                .problems
                .into_iter()
                .map(|p| format!("{context}: {p}"))
                .collect(),
        }
    }

    /// Each problem, one sentence naming the rule, route or key it concerns.
    pub fn problems(&self) -> impl ExactSizeIterator<Item = &str> {
        self.problems.iter().map(String::as_str)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problems[..] {
            [one] => write!(f, "invalid rate limit configuration: {one}"),
            many => {
                write!(
                    f,
                    "invalid rate limit configuration ({} problems):",
                    many.len()
                )?;
                many.iter().try_for_each(|p| write!(f, "\n  {p}"))
            }
        }
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
    /// The batch itself is malformed: the same rule twice for one key, or a rule whose
    /// configuration cannot work (see [`Rule::validate`](crate::Rule::validate)), named in
    /// the message. Nothing is decided.
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
