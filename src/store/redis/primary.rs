//! A primary the sentinels name after the first: checked as `connect` checked the first, and
//! announced in the log, because what the old primary held may not have come with it.

use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ErrorKind, RedisError};
use tokio::time::Instant;

use crate::error::StoreError;

use super::connection::Connection;
use super::script::Invocation;
use super::{setup, DEFAULT_TIMEOUT};

/// How often a primary that failed the checks is checked again: a grant given there, the
/// store decides on it without a restart.
pub(super) const RECHECK: Duration = Duration::from_secs(1);

/// The least time between two warnings about one primary while a condition lasts.
const REPEAT_WARNING: Duration = Duration::from_secs(5);

/// How long the checks of one primary may take, as at `connect`.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// What `connect` checked on the first primary, to check on each one named after it.
#[derive(Debug, Clone)]
pub(super) struct Checks {
    /// The prefix as the store writes it.
    pub(super) prefix: Vec<u8>,
    /// How the store calls its code.
    pub(super) route: Invocation,
}

impl Checks {
    /// Runs the checks on the primary `client` at `addr`: [`StoreError::Misconfigured`]
    /// when the store cannot decide there, another error when it did not answer.
    pub(super) async fn run(&self, client: &Client, addr: &str) -> Result<(), StoreError> {
        let run = async {
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(None)
                .set_connection_timeout(Some(DEFAULT_TIMEOUT))
                .set_number_of_retries(0);
            let manager = ConnectionManager::new_with_config(client.clone(), config)
                .await
                .map_err(|e| setup::setup_error(addr, &e))?;
            let mut conn = Connection::Standalone(manager);
            let info = setup::server_info(&mut conn, addr).await?;
            if let Some(refusal) = info.refusal(addr) {
                return Err(refusal);
            }
            let functions = self.route == Invocation::Function;
            let route = setup::check(&mut conn, addr, &self.prefix, functions).await?;
            // Before Redis 7 there are no functions, and calls fall back to the script there.
            if route != self.route && info.version.is_none_or(|v| v >= (7, 0)) {
                return Err(StoreError::Misconfigured(format!(
                    "redis at {addr}: the store calls tollgate's code as a function (FCALL), and \
                     the Redis user may not load or call functions here: grant it +fcall and \
                     +function|load"
                )));
            }
            Ok(())
        };
        tokio::time::timeout(CHECK_TIMEOUT, run)
            .await
            .unwrap_or(Err(StoreError::Timeout))
    }
}

/// The warning of a primary the sentinels name in place of another.
pub(super) fn failover(from: &str, to: &str) -> String {
    format!(
        "failover: the sentinels name a new primary {to} (was {from}); the counters, penalty \
         lockouts and held units that {from} kept are lost unless {to} replicated them, so \
         limits may admit more for a while"
    )
}

/// The warning of a primary that failed the checks.
pub(super) fn refused(addr: &str, error: &StoreError) -> String {
    format!(
        "the store does not decide on the primary the sentinels name, {addr}, which fails \
         connect's checks: calls fail with this error and health() is failing until it \
         passes them (checked again every {} s): {error}",
        RECHECK.as_secs()
    )
}

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

    /// The condition is over: the next warning is said at once.
    pub(super) fn clear(&self) {
        *self.last.lock() = None;
    }
}
