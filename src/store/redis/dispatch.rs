//! How script calls reach Redis: as a function (`FCALL`) or a script (`EVALSHA`), reloaded
//! when Redis lost the code, and, on a standalone server, coalesced: the batches of requests
//! that wait at the same moment go out as one call.
//!
//! Coalescing: at most [`MAX_IN_FLIGHT`] calls are in flight at once. A request that finds
//! no call in flight and nobody queued sends its call itself, at once. Otherwise it queues,
//! and the dispatcher task sends everything queued as one call when a slot frees. Sending
//! alone while another call is in flight would settle the calls into one of one batch and
//! one of all the others, each side idle while the other works on the large one. The
//! promises to callers are on [`RedisStore::with_coalescing`](super::RedisStore::with_coalescing).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::Value;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::StoreError;

use super::connection::{unavailable, Connection};
use super::script::{self, Encoded, Invocation};

/// Calls in flight at once on a coalescing store: while they are, Redis works on one and
/// the next is on its way, and the requests arriving meanwhile queue for the call after.
const MAX_IN_FLIGHT: usize = 2;

/// Batches one call decides at most: a call stays short next to other clients' commands,
/// and the calls in flight share the waiting requests about evenly.
const MAX_BATCHES_PER_CALL: usize = 32;

/// What a call answers per batch: the script's integers, or that batch's error.
type BatchReply = Result<Vec<i64>, StoreError>;

/// Sends calls on one connection, by the route it was told to use.
#[derive(Clone)]
pub(super) struct Caller {
    conn: Connection,
    /// Whether calls go through `FCALL` (else `EVALSHA`); cleared for good if the server
    /// stops knowing `FCALL` (a failover to an older server).
    functions: Arc<AtomicBool>,
}

impl Caller {
    pub(super) fn new(conn: Connection, route: Invocation) -> Self {
        Self {
            conn,
            functions: Arc::new(AtomicBool::new(route == Invocation::Function)),
        }
    }

    pub(super) fn route(&self) -> Invocation {
        if self.functions.load(Ordering::Relaxed) {
            Invocation::Function
        } else {
            Invocation::Script
        }
    }

    /// One call deciding `batches`, in order; the code is loaded again if Redis lost it.
    pub(super) async fn call(&self, batches: &[&Encoded]) -> Result<Vec<BatchReply>, StoreError> {
        if let Some(refusal) = self.conn.refusal() {
            return Err(refusal);
        }
        let mut conn = self.conn.clone();
        let mut route = self.route();
        let mut cmd = script::command(route, batches);
        let mut reloaded = false;
        loop {
            match cmd.query_async::<Value>(&mut conn).await {
                Ok(value) => return script::split_reply(value, batches.iter().map(|b| b.rules())),
                // Neither ran the call: it is sent again, once.
                Err(e) if !reloaded && script::is_not_loaded(route, &e) => {
                    script::load_command(route)
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(unavailable)?;
                    reloaded = true;
                }
                Err(e) if route == Invocation::Function && is_unknown_command(&e) => {
                    self.functions.store(false, Ordering::Relaxed);
                    route = Invocation::Script;
                    cmd = script::command(route, batches);
                }
                Err(e) => return Err(unavailable(e)),
            }
        }
    }
}

fn is_unknown_command(e: &redis::RedisError) -> bool {
    e.to_string().contains("unknown command")
}

/// A standalone store's calls: sent by the requesting task, or coalesced.
pub(super) struct Calls {
    caller: Caller,
    coalesce: bool,
    /// Free call slots (`MAX_IN_FLIGHT` of them).
    slots: Arc<Semaphore>,
    /// Requests queued and not yet taken by the dispatcher.
    queued: Arc<AtomicUsize>,
    /// The dispatcher's queue, started on first use (inside the caller's runtime).
    queue: OnceLock<mpsc::UnboundedSender<Pending>>,
}

struct Pending {
    batch: Encoded,
    reply: oneshot::Sender<BatchReply>,
}

impl Calls {
    pub(super) fn new(caller: Caller, coalesce: bool) -> Self {
        Self {
            caller,
            coalesce,
            slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            queued: Arc::new(AtomicUsize::new(0)),
            queue: OnceLock::new(),
        }
    }

    pub(super) fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Decides `batch`, within `timeout`.
    pub(super) async fn decide(&self, batch: Encoded, timeout: Duration) -> BatchReply {
        // Alone when not coalescing, or when no call is in flight (see the module's docs).
        let idle = self.coalesce
            && self.queued.load(Ordering::Acquire) == 0
            && self.slots.available_permits() == MAX_IN_FLIGHT;
        let slot = idle
            .then(|| Arc::clone(&self.slots).try_acquire_owned().ok())
            .flatten();
        if !self.coalesce || slot.is_some() {
            // The slot, if taken, is held until the call is answered.
            return within(timeout, one(&self.caller, &batch)).await;
        }
        let (reply, answer) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue().send(Pending { batch, reply }).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::Unavailable(
                "the store's call dispatcher has stopped".into(),
            ));
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the call deciding this request was dropped".into(),
            )),
            Err(_) => Err(StoreError::Timeout),
        }
    }

    fn queue(&self) -> &mpsc::UnboundedSender<Pending> {
        self.queue.get_or_init(|| {
            let (queue, pending) = mpsc::unbounded_channel();
            tokio::spawn(dispatch(
                pending,
                self.caller.clone(),
                Arc::clone(&self.slots),
                Arc::clone(&self.queued),
            ));
            queue
        })
    }
}

/// `call`, failing with [`StoreError::Timeout`] past `timeout`.
pub(super) async fn within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| StoreError::Timeout)?
}

/// One batch, one call.
async fn one(caller: &Caller, batch: &Encoded) -> BatchReply {
    caller
        .call(&[batch])
        .await?
        .pop()
        .ok_or_else(|| StoreError::Protocol("a call answered no batch".into()))?
}

/// The dispatcher: waits for a free call slot, then sends everything queued as one call.
/// Ends when the store (the queue's sender) is dropped.
async fn dispatch(
    mut pending: mpsc::UnboundedReceiver<Pending>,
    caller: Caller,
    slots: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
) {
    while let Some(first) = pending.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut call = Vec::with_capacity(8);
        call.push(first);
        while call.len() < MAX_BATCHES_PER_CALL {
            match pending.try_recv() {
                Ok(p) => call.push(p),
                Err(_) => break,
            }
        }
        queued.fetch_sub(call.len(), Ordering::AcqRel);
        // A request that stopped waiting (its timeout) is not decided.
        call.retain(|p| !p.reply.is_closed());
        if call.is_empty() {
            continue;
        }
        tokio::spawn(send(caller.clone(), call, slot));
    }
}

async fn send(caller: Caller, call: Vec<Pending>, slot: OwnedSemaphorePermit) {
    let batches: Vec<&Encoded> = call.iter().map(|p| &p.batch).collect();
    let mut replies = caller.call(&batches).await.map(Vec::into_iter);
    drop(slot);
    for p in call {
        let reply = match &mut replies {
            Ok(replies) => replies.next(),
            Err(e) => Some(Err(e.clone())),
        };
        // A request that stopped waiting meanwhile is told nothing.
        let _ = reply.map(|reply| p.reply.send(reply));
    }
}
