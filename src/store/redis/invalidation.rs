//! The invalidation channel of the deny caches: a store publishes there what moved a
//! rule's state under the caches (a reset, a refund), and a cached store listens on a
//! connection of its own.

use std::sync::Arc;
use std::time::Duration;

use redis::Client;

use crate::error::StoreError;
use crate::Rule;

use super::connection::unavailable;
use super::deny_cache::{self, DenyCache};
use super::sentinel::SentinelConnection;
use super::{within, RedisStore, DEFAULT_TIMEOUT};

impl RedisStore {
    /// Tells every instance's deny cache (this one's at once) that `rule`'s state for
    /// `key` moved under it.
    pub(super) async fn invalidate(&self, rule: &Rule, key: &[u8]) -> Result<(), StoreError> {
        if let Some(cache) = &self.deny_cache {
            cache.invalidate(rule.name(), key);
        }
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(self.channel())
            .arg(deny_cache::id(rule.name(), key));
        super::command(self.conn.clone(), cmd, self.timeout).await
    }
}

/// Where the invalidation channel can be subscribed: the servers the store was given (with
/// their TLS settings), or the primary the sentinels name now.
#[derive(Clone)]
pub(super) enum Servers {
    Nodes(Arc<[Client]>),
    Sentinel(SentinelConnection),
}

/// A connection subscribed to `channel` on the first of `servers` that answers (on a
/// Cluster, a message published on any node reaches every node).
pub(super) async fn subscribe(
    servers: &Servers,
    channel: &[u8],
) -> Result<redis::aio::PubSubStream, StoreError> {
    let mut last = StoreError::Unavailable("no server to subscribe to".into());
    let clients = match servers {
        Servers::Nodes(clients) => clients.to_vec(),
        Servers::Sentinel(conn) => vec![conn.primary_client()],
    };
    for client in clients {
        let attempt = async {
            let mut pubsub = client.get_async_pubsub().await.map_err(unavailable)?;
            pubsub.subscribe(channel).await.map_err(unavailable)?;
            Ok::<_, StoreError>(pubsub.into_on_message())
        };
        match attempt.await {
            Ok(messages) => return Ok(messages),
            Err(e) => last = e,
        }
    }
    // The primary may have moved: the sentinels are asked again for the next attempt.
    if let Servers::Sentinel(conn) = servers {
        conn.suspect(true);
    }
    Err(last)
}

/// Applies the invalidations published on `channel` to `cache` for as long as it lives;
/// while the subscription is lost, the cache is emptied and bypassed.
pub(super) async fn listen(
    cache: std::sync::Weak<DenyCache>,
    servers: Servers,
    channel: Vec<u8>,
    mut messages: redis::aio::PubSubStream,
) {
    use futures_core::Stream;
    // False once the cache is gone (its drop also aborts this task).
    let set_live = |live: bool| cache.upgrade().map(|c| c.set_live(live)).is_some();
    loop {
        while let Some(message) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut messages).poll_next(cx)).await
        {
            let Some(cache) = cache.upgrade() else { return };
            cache.on_message(message.get_payload_bytes());
        }
        if !set_live(false) {
            return;
        }
        messages = loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Ok(resubscribed) = within(DEFAULT_TIMEOUT, subscribe(&servers, &channel)).await {
                break resubscribed;
            }
        };
        if !set_live(true) {
            return;
        }
    }
}
