//! Error types: small, named, with lower-case messages, so callers can `downcast_ref` them
//! once they are boxed at the edge.

use std::fmt;

/// A configuration that cannot work: a rule, rate, key or route, or a layer whose parts do
/// not fit together.
///
/// A layer's [`build`](crate::layer::RateLimitLayerBuilder::build) reports every problem it
/// finds at once, each naming the rule or route it concerns; `Display` writes them one per
/// line, and [`problems`](Self::problems) lists them. `Debug` writes the same, so a `main`
/// that returns the error prints sentences (`{:#?}` shows the fields).
#[derive(Clone, PartialEq, Eq)]
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

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f
                .debug_struct("ConfigError")
                .field("problems", &self.problems)
                .finish();
        }
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for ConfigError {}

/// A store could not decide.
///
/// The request path never panics on these: the caller chooses what a failure means
/// (fail open, fail closed, or fall back to another store). `Debug` writes what `Display`
/// does (`{:#?}` shows the variant).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The batch itself is malformed: the same rule twice for one key, or a rule whose
    /// configuration cannot work (see [`Rule::checked`](crate::Rule::checked)), named in
    /// the message. Nothing is decided.
    InvalidBatch(String),
    /// The store could not be reached or answered with an error: an outage, which may pass.
    Unavailable(String),
    /// The store cannot work as configured (URL, credentials, certificates, permissions,
    /// server), found when connecting or on a later Sentinel primary. The message names the
    /// fix; retrying does not help until the configuration changes.
    Misconfigured(String),
    /// The store did not answer in time.
    Timeout,
    /// The store answered something this version does not understand.
    Protocol(String),
    /// A [`Breaker`](crate::store::Breaker) in front of the store is open after repeated
    /// failures: the call was not sent, so it failed at once instead of waiting.
    CircuitOpen,
}

impl StoreError {
    /// Whether the store failed: any error but a malformed batch (the caller's mistake).
    pub(crate) fn is_failure(&self) -> bool {
        !matches!(self, StoreError::InvalidBatch(_))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::InvalidBatch(m) => write!(f, "invalid rate limit batch: {m}"),
            StoreError::Unavailable(m) => write!(f, "rate limit store unavailable: {m}"),
            StoreError::Misconfigured(m) => write!(f, "rate limit store misconfigured: {m}"),
            StoreError::Timeout => f.write_str("rate limit store timed out"),
            StoreError::Protocol(m) => write!(f, "unexpected answer from rate limit store: {m}"),
            StoreError::CircuitOpen => f.write_str("rate limit store circuit open"),
        }
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(self, f);
        }
        match self {
            StoreError::InvalidBatch(m) => f.debug_tuple("InvalidBatch").field(m).finish(),
            StoreError::Unavailable(m) => f.debug_tuple("Unavailable").field(m).finish(),
            StoreError::Misconfigured(m) => f.debug_tuple("Misconfigured").field(m).finish(),
            StoreError::Timeout => f.write_str("Timeout"),
            StoreError::Protocol(m) => f.debug_tuple("Protocol").field(m).finish(),
            StoreError::CircuitOpen => f.write_str("CircuitOpen"),
        }
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `fn main() -> Result<(), Box<dyn Error>>` prints after `Error: `.
    fn as_main_prints(error: impl std::error::Error + 'static) -> String {
        let boxed: Box<dyn std::error::Error> = Box::new(error);
        format!("{boxed:?}")
    }

    #[test]
    fn a_config_error_debugs_as_its_sentences_one_problem_a_line() {
        let error = ConfigError::collect([
            ConfigError::new("rule \"sms\": window: \"1 hour\" is not a duration"),
            ConfigError::new("rule \"login\": limit must be at least 1"),
        ])
        .unwrap();
        let printed = as_main_prints(error.clone());
        assert_eq!(printed, error.to_string());
        assert_eq!(
            printed.lines().collect::<Vec<_>>(),
            [
                "invalid rate limit configuration (2 problems):",
                "  rule \"sms\": window: \"1 hour\" is not a duration",
                "  rule \"login\": limit must be at least 1",
            ]
        );
        assert!(format!("{error:#?}").starts_with("ConfigError {"));
    }

    #[test]
    fn a_store_error_debugs_as_its_sentence() {
        let error = StoreError::Unavailable("connection refused".into());
        assert_eq!(
            as_main_prints(error.clone()),
            "rate limit store unavailable: connection refused"
        );
        assert_eq!(
            format!("{:?}", StoreError::Timeout),
            "rate limit store timed out"
        );
        assert_eq!(
            format!("{error:#?}"),
            "Unavailable(\n    \"connection refused\",\n)"
        );
    }
}
