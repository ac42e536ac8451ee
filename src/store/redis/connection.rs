//! The connection a [`RedisStore`](super::RedisStore) runs over, behind one `ConnectionLike`
//! so that the rest of the store does not tell the kinds apart.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Value};

use crate::error::StoreError;

use super::sentinel::SentinelConnection;

/// A standalone (reconnecting, multiplexed), Sentinel (following the primary) or Cluster
/// connection; all are cheap handles.
#[derive(Clone)]
pub(super) enum Connection {
    Standalone(ConnectionManager),
    Sentinel(SentinelConnection),
    Cluster(ClusterConnection),
}

/// How often a store sends its connection a `PING`: well within the shortest idle
/// `timeout` a server can set (1 s).
const KEEPALIVE: Duration = Duration::from_millis(500);

/// Keeps a store's connection from going idle (why: [`RedisStore`](super::RedisStore)'s
/// Connections) while any clone of the store holds this. Only the `PING`s are repeated: a
/// command is never sent again, so nothing is counted twice.
pub(super) struct KeepAlive;

impl KeepAlive {
    /// Starts the `PING`s on `conn`, on a task that ends once the returned handle, and
    /// every clone of it, is dropped; outside a tokio runtime, none.
    pub(super) fn start(conn: &Connection) -> Arc<Self> {
        let alive = Arc::new(KeepAlive);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(keep_alive(conn.clone(), Arc::downgrade(&alive)));
        }
        alive
    }
}

async fn keep_alive(conn: Connection, alive: Weak<KeepAlive>) {
    let mut ticks = tokio::time::interval(KEEPALIVE);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the store has just used the connection.
    ticks.tick().await;
    let ping = redis::cmd("PING");
    loop {
        ticks.tick().await;
        if alive.strong_count() == 0 {
            return;
        }
        let mut conn = conn.clone();
        // A failure is the requests' to report: the connection recovers as after theirs.
        let _ = tokio::time::timeout(KEEPALIVE, ping.query_async::<Value>(&mut conn)).await;
    }
}

impl Connection {
    /// Why the store does not decide on this connection's server, though it answers: a
    /// Sentinel primary that failed `connect`'s checks. Each call fails with this error,
    /// which names the fix, rather than with a raw refusal of each command.
    pub(super) fn refusal(&self) -> Option<StoreError> {
        match self {
            Connection::Sentinel(c) => c.refusal(),
            Connection::Standalone(_) | Connection::Cluster(_) => None,
        }
    }
}

/// A failed Redis call as the store reports it.
pub(super) fn unavailable(e: RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(c) => c.req_packed_command(cmd),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Sentinel(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(c) => c.get_db(),
            Connection::Sentinel(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}
