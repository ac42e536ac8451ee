//! A primary the sentinels name after the first: checked as `connect` checked the first, and
//! announced in the log, because what the old primary held may not have come with it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Client, ErrorKind, RedisError};
use tokio::time::Instant;

use crate::error::StoreError;

/// How often a primary that failed the checks is checked again: a grant given there, the
/// store decides on it without a restart.
pub(super) const RECHECK: Duration = Duration::from_secs(1);

/// The least time between two warnings about one primary while a condition lasts.
const REPEAT_WARNING: Duration = Duration::from_secs(5);

/// `connect`'s checks, run on a primary named after the first (its client and address):
/// [`StoreError::Misconfigured`] when the store cannot decide there, another error when it
/// did not answer. Given by `connect`, which knows the checks, to the Sentinel connection.
pub(super) type Checks =
    Box<dyn Fn(Client, String) -> Pin<Box<dyn Future<Output = CheckResult> + Send>> + Send + Sync>;

type CheckResult = Result<(), StoreError>;

/// The warning of a resolution that found no primary: the one the sentinels name
/// (`named`, as last heard) and its error, or that they named none.
pub(super) fn unresolved(named: Option<&str>, error: &RedisError) -> String {
    match named {
        Some(addr) if error.kind() == ErrorKind::MasterNameNotFoundBySentinel => format!(
            "the sentinels name {addr} as the primary, and they find it down or it says it is \
             a replica (ROLE), as before a failover; calls fail until a primary answers"
        ),
        Some(addr) => format!(
            "the sentinels name {addr} as the primary, and it refuses: {error}; calls fail \
             until a primary answers"
        ),
        None => format!("no sentinel names a primary: {error}; calls fail until one does"),
    }
}

/// Warnings that repeat while their condition lasts (every resolution retried finds it
/// again): said when the primary they are about changes, else at most every
/// [`REPEAT_WARNING`] (its error may change on every retry during a failover).
#[derive(Default)]
pub(super) struct Warnings {
    last: Mutex<Option<(String, Instant)>>,
}

impl Warnings {
    /// Warns `message`, about the primary at `about` (empty for none).
    pub(super) fn warn(&self, about: &str, message: String) {
        let mut last = self.last.lock();
        let repeat =
            |(said, at): &(String, Instant)| said == about && at.elapsed() < REPEAT_WARNING;
        if last.as_ref().is_some_and(repeat) {
            return;
        }
        tracing::warn!(target: "tollgate::redis", "{message}");
        *last = Some((about.to_owned(), Instant::now()));
    }

    /// Says that the store takes the primary at `to` in place of the one at `from`, and
    /// whether it decides there (`refusal`: the error of the checks it failed).
    pub(super) fn adopted(&self, from: &str, to: &str, refusal: Option<&StoreError>) {
        if from != to {
            tracing::warn!(
                target: "tollgate::redis",
                "failover: the sentinels name a new primary {to} (was {from}); the counters, \
                 penalty lockouts and held units that {from} kept are lost unless {to} \
                 replicated them, so limits may admit more for a while"
            );
            *self.last.lock() = None;
        }
        match refusal {
            Some(e) => self.warn(
                to,
                format!(
                    "the store does not decide on the primary the sentinels name, {to}, which \
                     fails connect's checks: calls fail with this error and health() is \
                     failing until it passes them (checked again every {} s): {e}",
                    RECHECK.as_secs()
                ),
            ),
            None => {
                tracing::info!(target: "tollgate::redis", primary = %to, "deciding on the primary the sentinels name");
                *self.last.lock() = None;
            }
        }
    }
}
