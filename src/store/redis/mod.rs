//! [`RedisStore`]: rule state in Redis, standalone or Cluster, decided by Lua scripts.

mod access;
mod cluster;
mod connect;
mod connection;
mod deny_cache;
mod dispatch;
mod invalidation;
mod keys;
mod options;
mod primary;
mod script;
mod sentinel;
mod setup;

pub use options::RedisOptions;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::Value;
use smallvec::SmallVec;

use crate::algorithm::MAX_SCALED;
use crate::clock::{duration_to_micros, Clock};
use crate::decision::{Outcome, RuleOutcome, StoreId};
use crate::error::StoreError;
use crate::store::batch;
use crate::store::check::{Check, Health, Store};
use crate::stored::StoredKey;
use crate::Rule;

use connection::{unavailable, Connection};
use deny_cache::DenyCache;
use dispatch::{within, Calls};
use invalidation::{listen, subscribe, Servers};
use script::{Call, Encoded, Op, Reply};

/// How long a call may take before it fails with [`StoreError::Timeout`], unless changed
/// with [`RedisStore::with_timeout`].
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The key prefix unless changed with [`RedisOptions::prefix`].
pub(crate) const DEFAULT_PREFIX: &str = "tollgate";

/// With an injected clock the script's instants are not the server's, so TTLs (garbage
/// collection only) get this much slack: a test's virtual time may lag the real time that
/// passes between its steps.
const CLOCK_OVERRIDE_SLACK_MS: u64 = 60_000;

/// Rule state kept in Redis (standalone or Cluster), shared by every instance of a service.
///
/// Each request's batch of rules is decided by one call of tollgate's Lua code, all or
/// nothing, on the server (the Lua twins of the Rust models). On Redis 7 and later
/// (standalone) the code is a function library called with `FCALL`; elsewhere (older
/// servers, a Cluster, [`RedisOptions::functions(false)`](RedisOptions::functions)) a script run with
/// `EVALSHA`. Either is loaded again when Redis lost it (a flush, a restart, a failover): the
/// call that found it missing did not run, and is sent again.
///
/// **Time** comes from the Redis server (`TIME`, read once per batch), so instances whose
/// clocks disagree share one timeline; [`with_clock`](Self::with_clock) overrides it.
///
/// **Keys** are `{prefix}:{<key>}:<rule>` (the rule's state and the fingerprint of the
/// configuration that wrote it) and, for a sliding log, `{prefix}:{<key>}:<rule>/log` (a
/// sorted set; `/` is not in a rule name's alphabet). The extracted key is the hash tag, so a
/// client's rules live in one Cluster slot; `{`, `}` and `\` are escaped and an empty key is
/// written `\0`, so distinct keys never share state. Every key's TTL ends once its state is
/// back to empty (a rule with a penalty's 3 s later, for a refusal counted late).
///
/// **Connections**: a standalone store runs over one multiplexed, reconnecting
/// [`ConnectionManager`](redis::aio::ConnectionManager), shared by cheap clones. The
/// connection (on a Cluster, each primary's) gets a `PING` every 500 ms, so that a server's
/// idle `timeout` never closes it and a dead one is replaced before a request needs it.
///
/// **Timeouts and retries**: a call past the timeout fails with [`StoreError::Timeout`] and
/// the caller's failure policy decides (the layer's
/// [`FailurePolicy`](crate::layer::FailurePolicy), or a [`Fallback`](super::Fallback)).
/// Redis may still have run it, so a failed request may be counted once; never twice, since
/// no script call is sent again (the Cluster connection is built without retries; the one
/// repeat, after `NOSCRIPT` or a missing function, follows a call that did not run). Put a
/// [`Breaker`](super::Breaker) in front so that an outage does not cost every request the
/// timeout.
///
/// **Redis Cluster**: a batch whose keys share a
/// slot (the usual case) is one script call, as atomic as on a standalone server. A batch
/// spanning slots is split per slot and the parts decided one after another; if a part
/// denies, the parts already admitted are refunded by a compensating call. What holds:
/// - A denied batch consumes nothing once `check` has returned `Ok`. With no other admission
///   of the same key between, the refund is the exact inverse of the admission. A part that
///   would count the request later than now (a reservation, a queue's release) is tried
///   first, writing nothing, and committed once every part has admitted.
/// - Between a part's admission and its refund (one round trip), other requests see those
///   units as taken. A token bucket, leaky bucket or GCRA that refills them within that
///   round trip may get them back once too many: the only over-admission, by at most the
///   batch's cost, and only at thousands per second per key.
/// - A [shadow](crate::Refusal::Shadow) item never makes its part deny.
/// - A denied batch's decisions, quotas and `Retry-After` are what one node would report;
///   penalties count exactly as on one node. A refunded part whose rule took over another
///   configuration's state (see [`Rule`](crate::Rule#reconfiguring-a-rule)) keeps it, so its
///   key may admit no more, perhaps later, than on one node.
/// - A call failing half-way refunds what it can and `check` returns the error; a part whose
///   refund failed stays consumed until its state expires (errs towards limiting).
/// - Each part reads its own node's time; parts compare delays, not instants. Every part
///   counts the request at the batch's reservation, as on one node: parts that disagree are
///   refunded and decided again (after two rounds, the batch is denied).
/// - Not a transaction: a concurrent reader can see admitted units before their refund. Keep
///   a request's rules on one hash tag where that matters.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::store::{RedisOptions, RedisStore};
/// use tollgate::{Limiter, Rule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let options = RedisOptions::new().prefix("myapp");
/// let store = RedisStore::connect_with("redis://127.0.0.1/", options).await?
///     .with_timeout(Duration::from_millis(200));
/// let limiter = Limiter::new(store);
/// let rule = Rule::fixed_window("login", 5, Duration::from_secs(60));
/// let outcome = limiter.check_one(&rule, b"alice").await?;
/// println!("admitted: {}", outcome.is_admitted());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    /// Script calls: their route and, on a standalone server, their coalescing.
    calls: Arc<Calls>,
    prefix: Arc<[u8]>,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    /// Where an invalidation channel can be subscribed (see
    /// [`with_deny_cache`](Self::with_deny_cache)).
    servers: Servers,
    deny_cache: Option<Arc<DenyCache>>,
    /// The name its admissions give it (see `Taken::store`).
    id: StoreId,
    /// Keeps the connection from going idle while any clone of the store lives.
    _keep_alive: Arc<connection::KeepAlive>,
}

impl RedisStore {
    /// The code this store sends, for the benchmarks: a script when `library` is `None`,
    /// else a function library of that name; `text` gives each Lua file's text from its name
    /// (`"prelude"`, …) and the text built in.
    #[doc(hidden)]
    pub fn lua_source(
        library: Option<&str>,
        text: impl Fn(&str, &'static str) -> String,
    ) -> String {
        script::source(library, text)
    }

    /// Whether the batches of requests that wait for Redis at the same moment go out as one
    /// call (default: yes, on a standalone server; a Redis Cluster never coalesces).
    ///
    /// A lone request is sent at once; under load one call decides many batches. Each batch
    /// is still decided all or nothing on its own, in queue order; an error fails that batch
    /// only, and a request that timed out before its call left is never sent.
    pub fn with_coalescing(mut self, enabled: bool) -> Self {
        let coalesce = enabled && !matches!(self.conn, Connection::Cluster(_));
        self.calls = Arc::new(Calls::new(self.calls.caller().clone(), coalesce));
        self
    }

    /// Bounds every call to Redis (default 1 second); a call that takes longer
    /// fails with [`StoreError::Timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Decides at the instants of `clock` instead of the server's `TIME`: for deterministic
    /// tests and simulations. Every instance sharing the keys must use the same clock.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Keeps the denials Redis gives in this instance and answers them again until they
    /// end, without calling Redis: a client hammering a key it is denied on is answered
    /// locally. At most `capacity` rule-and-key entries are kept.
    ///
    /// Exact: a request is answered from the cache only when Redis would deny it too, with
    /// the same reason and the same Retry-After (up to one round trip shorter, never longer).
    /// A denial answers the same cost (any cost up to the limit for a fixed window); a penalty
    /// lock answers every cost; a rule with an unlocked penalty is always asked (its denials
    /// count); a batch is answered only when each of its rules is and it has no shadow item;
    /// a wait-mode request that could wait is asked. A cached denial reports `remaining` as
    /// Redis last did (it may read low). Another instance admitting a cheaper request only
    /// moves the real retry later, so the answer stays a denial.
    ///
    /// What moves a retry earlier drops the entry on every instance: resets, refunds, and an
    /// admission by another configuration of the rule. Stores publish them on the channel
    /// `{prefix}:deny-cache`, which a cached store listens to on a connection of its own
    /// (subscribed before this returns); while that connection is lost, the cache is emptied
    /// and bypassed. Give every instance sharing the keys the same prefix.
    ///
    /// Fails when the channel cannot be subscribed. Call it after
    /// [`with_clock`](Self::with_clock): a copy given another clock later does not use the
    /// cache.
    ///
    /// ```no_run
    /// use tollgate::store::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1/").await?
    ///     .with_deny_cache(100_000)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn with_deny_cache(mut self, capacity: usize) -> Result<Self, StoreError> {
        let cache = Arc::new(DenyCache::new(capacity, self.clock.clone()));
        let channel = self.channel();
        let servers = self.servers.clone();
        let messages = within(DEFAULT_TIMEOUT * 5, subscribe(&servers, &channel))
            .await
            .map_err(|e| access::subscribe_refusal(&channel, e))?;
        cache.set_live(true);
        let listener = tokio::spawn(listen(Arc::downgrade(&cache), servers, channel, messages));
        cache.set_listener(listener.abort_handle());
        self.deny_cache = Some(cache);
        Ok(self)
    }

    /// Rule-and-key entries the deny cache holds (0 without one): for tests and metrics.
    pub fn deny_cache_len(&self) -> usize {
        self.deny_cache.as_ref().map_or(0, |c| c.len())
    }

    /// The deny cache, unless this copy was given another clock than the one it keeps.
    fn cache(&self) -> Option<&Arc<DenyCache>> {
        self.deny_cache.as_ref().filter(|c| c.serves(&self.clock))
    }

    fn call(&self, max_wait: u64, mode: Op) -> Call {
        Call {
            now: self.clock.as_ref().map(|c| c.now_micros()),
            max_wait,
            mode,
            slack_ms: self.clock.as_ref().map_or(0, |_| CLOCK_OVERRIDE_SLACK_MS),
            ..Call::default()
        }
    }

    /// `checks` encoded for `call`, `taken` in place of its floors.
    fn encode(&self, call: Call, checks: &[&Check<'_>], taken: Option<&[u8]>) -> Encoded {
        Encoded::new(call, checks, |c, log| self.key(c, log), taken)
    }

    /// One script call for `checks` (which must share a slot on a Cluster), `taken` in place
    /// of its floors (see [`encode`](Self::encode)). A call that gives units back or takes a
    /// debt moved its rules' retries away from what a deny cache may hold, and so did a rule
    /// that adopted another configuration's state: every instance's cache is told of them.
    async fn run(
        &self,
        call: Call,
        checks: &[&Check<'_>],
        taken: Option<&[u8]>,
    ) -> Result<Reply, StoreError> {
        // A lease that ends with nothing unused gives nothing back.
        let moves = match call.mode {
            Op::Refund | Op::RefundHeld | Op::Overdraw => true,
            Op::End => checks.iter().any(|c| c.cost > 0),
            _ => false,
        };
        let batch = self.encode(call, checks, taken);
        let values = self.calls.decide(batch, self.timeout).await?;
        let reply = script::parse(&values, checks)?;
        let moved = checks.iter().zip(&reply.adopted);
        let moved = moved.filter(|&(_, &adopted)| moves || adopted);
        self.tell_caches(moved.map(|(c, _)| *c)).await;
        Ok(reply)
    }

    /// Drops the cached denials of `checks` on every instance. The state moved whatever
    /// happens here: a lost message only leaves another instance denying until its cached
    /// denial ends (never admitting more), so it is a warning, not a failed call.
    async fn tell_caches<'a, 'c: 'a>(&self, checks: impl Iterator<Item = &'a Check<'c>>) {
        // A shadow rule's refund gives nothing back.
        for check in checks.filter(|c| !c.in_shadow()) {
            if let Err(error) = self.invalidate(check.rule, check.key()).await {
                tracing::warn!(rule = check.rule.name(), %error, "deny caches not told of a moved state");
            }
        }
    }

    /// Decides a batch [`check`](Store::check) has validated.
    async fn decide(&self, batch: &[Check<'_>], max_wait: u64) -> Result<Outcome, StoreError> {
        if let Connection::Cluster(_) = self.conn {
            let groups = self.slot_groups(batch);
            if groups.len() > 1 {
                let outcome = self.decide_across_slots(batch, &groups, max_wait).await?;
                return Ok(outcome.taken_by(self.id));
            }
        }
        let checks: SmallVec<[&Check<'_>; 4]> = batch.iter().collect();
        let reply = self
            .run(self.call(max_wait, Op::Decide), &checks, None)
            .await?;
        Ok(outcome_of(reply, batch).taken_by(self.id))
    }

    /// The indices of `batch` grouped by slot (one group on a standalone server), each
    /// group one script call.
    fn slot_groups(&self, batch: &[Check<'_>]) -> SmallVec<[SmallVec<[usize; 4]>; 2]> {
        let cluster = matches!(self.conn, Connection::Cluster(_));
        let mut groups: SmallVec<[SlotGroup; 2]> = SmallVec::new();
        for (i, check) in batch.iter().enumerate() {
            let slot = cluster.then(|| Slot::for_key(self.key(check, false)));
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((slot, smallvec::smallvec![i])),
            }
        }
        groups.into_iter().map(|(_, members)| members).collect()
    }

    /// One `op` call per slot for `batch` (no packed refunds), with `wait` as its max_wait
    /// (for `Op::Deny`, the µs since the refusals were made).
    async fn run_per_slot(&self, batch: &[Check<'_>], op: Op, wait: u64) -> Result<(), StoreError> {
        batch::validate(batch)?;
        for members in self.slot_groups(batch) {
            let checks: SmallVec<[&Check<'_>; 4]> = members.iter().map(|&i| &batch[i]).collect();
            self.run(self.call(wait, op), &checks, None).await?;
        }
        Ok(())
    }

    /// Sends the end of lease `ended` (`unused` of its units left) and `lease` in one
    /// call; the lease's integers. Units given back are told to the deny caches.
    async fn renew(
        &self,
        check: &Check<'_>,
        ended: &Outcome,
        unused: u64,
        lease: &Encoded,
    ) -> Result<Vec<i64>, StoreError> {
        let taken = ended.admission.iter().flat_map(|a| a.taken.iter().copied());
        let packed = script::packed_taken(taken);
        let end = [&check.with_cost(unused)];
        let end = self.encode(self.call(0, Op::End), &end, Some(&packed));
        let caller = self.calls.caller();
        let replies = within(self.timeout, caller.call(&[&end, lease])).await?;
        let [ended, leased] = <[_; 2]>::try_from(replies)
            .map_err(|_| StoreError::Protocol("a renewal got other than two replies".into()))?;
        if let Err(error) = &ended {
            tracing::warn!(%error, "could not end a lease: its units stay parked until its term");
        } else if unused > 0 {
            self.tell_caches(std::iter::once(check)).await;
        }
        leased
    }
}

/// The indices of a batch's checks that share a slot (`None` on one server).
type SlotGroup = (Option<Slot>, SmallVec<[usize; 4]>);

/// The outcome of a batch decided in one script call.
fn outcome_of(reply: Reply, batch: &[Check<'_>]) -> Outcome {
    let admission = reply.admission();
    let mut outcome = script::combine(reply.rules, batch);
    outcome.admission = admission;
    outcome
}

/// `cmd` on `conn`, bounded by `timeout`; refused while the server fails `connect`'s checks.
async fn command(
    mut conn: Connection,
    cmd: redis::Cmd,
    timeout: Duration,
) -> Result<(), StoreError> {
    if let Some(refusal) = conn.refusal() {
        return Err(refusal);
    }
    let sent = async {
        cmd.query_async::<Value>(&mut conn)
            .await
            .map_err(unavailable)
    };
    within(timeout, sent).await.map(drop)
}

/// A lease's id: random (a fresh `RandomState`'s keys), so that instances never pick the
/// same, and of 52 bits, so that the script's doubles hold it exactly.
fn lease_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::hash::RandomState::new().build_hasher().finish() & ((1 << 52) - 1)
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            Connection::Standalone(_) => "standalone",
            Connection::Sentinel(_) => "sentinel",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("timeout", &self.timeout)
            .field("clock", &self.clock)
            .field("deny_cache", &self.deny_cache)
            .finish()
    }
}

impl Store for RedisStore {
    /// From the deny cache where it holds the answer, else from Redis.
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        let max_wait = duration_to_micros(max_wait);
        // Validated once, here: the cache's answer and `decide` both rely on it.
        batch::validate(batch)?;
        let Some(cache) = self.cache() else {
            return self.decide(batch, max_wait).await;
        };
        let sent_at = cache.now();
        if let Some(outcome) = cache.answer(batch, max_wait, sent_at) {
            return Ok(outcome);
        }
        let epoch = cache.epoch();
        let outcome = self.decide(batch, max_wait).await?;
        cache.record(batch, max_wait, &outcome, sent_at, epoch);
        Ok(outcome)
    }

    /// One `Op::Lease` call, parking the units under an id chosen here (the script keeps
    /// the key's ledger, `lua/parked.lua`); the lease it renews ends in the same call, as an
    /// `Op::End` batch before it.
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        batch::validate_lease(&check)?;
        let ending = ending.filter(|(lease, _)| {
            let taken = lease.admission.as_ref().map(|a| a.taken(0));
            taken.is_some_and(|t| t.lease && t.store == self.id)
        });
        // The term stays within the exact range of the script's instants.
        let call = self.call(duration_to_micros(term).min(MAX_SCALED), Op::Lease);
        let mut id = itoa::Buffer::new();
        let id = id.format(lease_id()).as_bytes();
        let lease = self.encode(call, &[&check], Some(id));
        let values = match ending {
            None => self.calls.decide(lease, self.timeout).await?,
            Some((ended, unused)) => self.renew(&check, ended, unused, &lease).await?,
        };
        let reply = script::parse(&values, &[&check])?;
        if reply.adopted.contains(&true) {
            self.tell_caches(std::iter::once(&check)).await;
        }
        let mut outcome = outcome_of(reply, std::slice::from_ref(&check)).taken_by(self.id);
        if let Some(admission) = &mut outcome.admission {
            // The script says the id as the admission's mark.
            admission.taken.iter_mut().for_each(|t| t.lease = true);
        }
        Ok(outcome)
    }

    /// A denial the deny cache holds, answered without a future (the common answer under
    /// abuse, so [`Limiter::check`](crate::Limiter::check) boxes no future for it);
    /// `None` leaves every other batch to [`check`](Store::check), which asks Redis.
    #[inline]
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        let cache = self.cache()?;
        if let Err(e) = batch::validate(batch) {
            return Some(Err(e));
        }
        cache
            .answer(batch, duration_to_micros(max_wait), cache.now())
            .map(Ok)
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        batch::validate(std::slice::from_ref(&check))?;
        let reply = self.run(self.call(0, Op::Peek), &[&check], None).await?;
        reply
            .rules
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Protocol("peek got no decision".into()))
    }

    /// One `Op::RefundHeld` call per slot (one call on a standalone server), each rule
    /// given back at its own instant where its mark says that is exact; a lease's rules
    /// in an `Op::End` call of their own, which ends each lease.
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        let Some(admission) = &outcome.admission else {
            return Ok(());
        };
        batch::validate(batch)?;
        // A shadow rule's units are not given back: it may have taken nothing; a pending rule
        // took nothing yet; units another store took are not this store's to give.
        let gives = |&i: &usize| {
            let taken = admission.taken(i);
            !batch[i].in_shadow() && !taken.pending && taken.store == self.id
        };
        for members in self.slot_groups(batch) {
            let (leases, members): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) = members
                .into_iter()
                .filter(gives)
                .partition(|&i| admission.taken(i).lease);
            for (members, op) in [(members, Op::RefundHeld), (leases, Op::End)] {
                if members.is_empty() {
                    continue;
                }
                let checks: SmallVec<[&Check<'_>; 4]> =
                    members.iter().map(|&i| &batch[i]).collect();
                let packed = script::packed_taken(members.iter().map(|&i| admission.taken(i)));
                self.run(self.call(0, op), &checks, Some(&packed)).await?;
            }
        }
        Ok(())
    }

    /// One `Op::Overdraw` call per slot.
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.run_per_slot(batch, Op::Overdraw, 0).await
    }

    /// One `Op::Deny` call per slot, judged `ago` before the server's now.
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        let batch = batch::undeferred(batch);
        self.run_per_slot(&batch, Op::Deny, duration_to_micros(ago))
            .await
    }

    /// One `Op::Reset` call: the script keeps the key's live leases.
    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        let check = Check::stored(rule, key.as_bytes());
        self.run(self.call(0, Op::Reset), &[&check], None).await?;
        self.invalidate(rule, key.as_bytes()).await
    }

    /// A `PING`. On a Cluster it goes to every master and succeeds only if all answer: a
    /// breaker closed while one master still hangs would make that master's requests wait
    /// the timeout again.
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        Some(command(self.conn.clone(), redis::cmd("PING"), self.timeout))
    }

    /// [`Failing`](Health::Failing) while a Sentinel primary fails `connect`'s checks (the
    /// store does not decide there), else [`Healthy`](Health::Healthy): an outage shows
    /// only as errors.
    fn health(&self) -> Health {
        match self.conn.refusal() {
            Some(_) => Health::Failing,
            None => Health::Healthy,
        }
    }
}
