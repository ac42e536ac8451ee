//! The connection a [`RedisStore`](super::RedisStore) runs over: one standalone server, the
//! primary of a Sentinel deployment, or a Cluster, behind one `ConnectionLike` so that the
//! rest of the store does not tell them apart.

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
