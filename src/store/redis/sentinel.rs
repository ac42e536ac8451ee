//! Redis Sentinel: the primary found through the sentinels, and followed when they fail it
//! over.
//!
//! A call that finds the connection lost or the server a replica (`READONLY`) marks it
//! broken; a call the store's timeout dropped marks it suspect; a watcher asks a sentinel
//! every [`WATCH`] which server is the primary, since a failed-over primary may go on
//! accepting writes until demoted. Each starts one background resolution (never on a
//! request's path), repeated every [`RETRY`] while broken. Promised behaviour:
//! [the Redis guide](crate::guide::redis_instances#sentinel).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, RedisError, RedisFuture, TlsMode, Value,
};
use tokio::time::Instant;

use crate::error::StoreError;

use super::options::RedisOptions;
use super::primary::{self, Checks, Warnings, RECHECK};
use super::DEFAULT_TIMEOUT;

/// The pause between resolutions while the connection is broken: with the sentinels'
/// `down-after-milliseconds`, it bounds how long after a promotion the store follows.
pub(super) const RETRY: Duration = Duration::from_millis(100);

/// How often the watcher asks a sentinel which server is the primary: the longest a
/// failover that leaves the old primary up goes unnoticed.
pub(super) const WATCH: Duration = Duration::from_millis(250);

/// How long one resolution (the sentinels, the new primary's `ROLE`, the connect) may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The least time between two resolutions started by suspect (timed-out) calls, so that a
/// slow primary under load costs the sentinels one question a second, not one per call.
const SUSPECT_INTERVAL: Duration = Duration::from_secs(1);

/// A `redis+sentinel://` deployment: where the sentinels are and what they watch.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Target {
    /// `host:port` of each sentinel.
    pub(super) sentinels: Vec<(String, u16)>,
    pub(super) service: String,
    /// TLS to the sentinels and the primary (`rediss+sentinel://`; `#insecure`: without
    /// verifying certificates).
    pub(super) tls: Option<TlsMode>,
    /// The primary's user (`None`: `default`), password and database.
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
    pub(super) db: i64,
}

/// `host[:port]` (`[v6]:port`; port 26379 by default), when `text` is nothing more.
fn host_and_port(text: &str) -> Option<(String, u16)> {
    let (name, port) = match text.strip_prefix('[') {
        Some(v6) => {
            let (name, rest) = v6.split_once(']')?;
            let port = match rest {
                "" => 26379,
                _ => rest.strip_prefix(':')?.parse().ok()?,
            };
            (name, port)
        }
        None => match text.rsplit_once(':') {
            Some((name, port)) => (name, port.parse().ok()?),
            None => (text, 26379),
        },
    };
    let bad = |c: char| c.is_whitespace() || c.is_control() || "/?#@,[]".contains(c);
    let plain = !name.is_empty() && !name.chars().any(bad);
    let v6 = text.starts_with('[') && name.parse::<std::net::Ipv6Addr>().is_ok();
    (plain && (v6 || !name.contains(':'))).then(|| (name.to_owned(), port))
}

/// Whether `url` names a Sentinel deployment.
pub(super) fn is_sentinel_url(url: &str) -> bool {
    let url = url.trim_start();
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

/// Parses `redis+sentinel://[user:password@]host:port[,host:port…]/service_name[/db]`
/// (`rediss+sentinel://` for TLS, `#insecure` to skip verification).
pub(super) fn parse(url: &str) -> Result<Target, StoreError> {
    let invalid = |why: &str| {
        StoreError::Misconfigured(format!(
            "invalid redis URL: {why} (expected redis+sentinel://[user:password@]host:port\
             [,host:port…]/service_name[/db])"
        ))
    };
    let url = url.trim();
    let (tls, rest) = match url.split_once("://") {
        Some(("redis+sentinel", rest)) => (false, rest),
        Some(("rediss+sentinel", rest)) => (true, rest),
        _ => return Err(invalid("not a sentinel URL")),
    };
    let (rest, mode) = match rest.split_once('#') {
        Some((rest, "insecure")) if tls => (rest, TlsMode::Insecure),
        Some(_) => {
            return Err(invalid(
                "only #insecure, with rediss+sentinel://, may follow",
            ))
        }
        None => (rest, TlsMode::Secure),
    };
    let (authority, path) = rest
        .split_once('/')
        .ok_or_else(|| invalid("no service name"))?;
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let (mut user, mut password) = (None, None);
    if let Some(userinfo) = userinfo {
        let (name, secret) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        user = Some(percent_decode(name)?).filter(|u| !u.is_empty());
        password = Some(percent_decode(secret)?);
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        sentinels.push(host_and_port(host).ok_or_else(|| invalid("a bad port or host"))?);
    }
    if sentinels.is_empty() {
        return Err(invalid("no sentinel"));
    }
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let service = percent_decode(parts.next().ok_or_else(|| invalid("no service name"))?)?;
    let db = match parts.next() {
        Some(db) => db.parse().map_err(|_| invalid("a bad database number"))?,
        None => 0,
    };
    Ok(Target {
        sentinels,
        service,
        tls: tls.then_some(mode),
        user,
        password,
        db,
    })
}

/// `%XX` escapes decoded (a `@`, `:` or `,` in a password); a `%` not followed by two hex
/// digits is refused, where the crate would keep it as it is.
fn percent_decode(text: &str) -> Result<String, StoreError> {
    let hex = |s: &str| {
        s.get(..2)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    match percent_encoding::percent_decode_str(text).decode_utf8() {
        Ok(decoded) if text.split('%').skip(1).all(hex) => Ok(decoded.into_owned()),
        _ => Err(StoreError::Misconfigured(
            "invalid redis URL: a bad %-escape".into(),
        )),
    }
}

/// The sentinel client for `target`: its credentials and database go to the primary,
/// `options`' sentinel credentials to the sentinels, its certificates to both.
pub(super) fn client(
    target: &Target,
    options: &RedisOptions,
) -> Result<SentinelClient, StoreError> {
    let addrs = target
        .sentinels
        .iter()
        .map(|(host, port)| match target.tls {
            Some(mode) => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: mode == TlsMode::Insecure,
                tls_params: None,
            },
            None => ConnectionAddr::Tcp(host.clone(), *port),
        });
    let invalid = |e: RedisError| StoreError::Misconfigured(format!("invalid sentinel setup: {e}"));
    let mut builder =
        SentinelClientBuilder::new(addrs, &target.service, SentinelServerType::Master)
            .map_err(invalid)?
            .set_client_to_redis_db(target.db);
    if let Some(user) = &target.user {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = &target.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some((user, password)) = &options.sentinel_auth {
        if !user.is_empty() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(mode) = target.tls {
        super::options::install_crypto_provider();
        builder = builder
            .set_client_to_redis_tls_mode(mode)
            .set_client_to_sentinel_tls_mode(mode);
        if let Some(certs) = options.certificates() {
            builder = builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
    }
    builder.build().map_err(invalid)
}

/// A connection to whichever server the sentinels say is the primary; a cheap handle.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<Shared>,
    db: i64,
}

struct Shared {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    service: String,
    primary: Mutex<Primary>,
    resolving: AtomicBool,
    /// When the last resolution started, to space out those of suspect calls.
    last_resolution: Mutex<Instant>,
    /// `connect`'s checks, for each primary named after the first.
    checks: OnceLock<Checks>,
    /// Whether the primary failed them (its `refusal`), read on every call.
    refused: AtomicBool,
    /// The primary the sentinels named when the watcher last asked, for the log.
    named: Mutex<Option<String>>,
    warnings: Warnings,
}

#[derive(Clone)]
struct Primary {
    client: Client,
    conn: MultiplexedConnection,
    /// `host:port`.
    addr: String,
    broken: bool,
    /// The error of `connect`'s checks, which this primary failed.
    refusal: Option<StoreError>,
}

/// Connection settings: the store's own timeouts govern the calls.
fn config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(DEFAULT_TIMEOUT))
}

/// Asks the sentinels for the primary (its `ROLE` checked) and connects to it.
async fn find_primary(sentinels: &mut SentinelClient) -> Result<Primary, RedisError> {
    let client = sentinels.async_get_client().await?;
    let addr = client.get_connection_info().addr().to_string();
    let conn = client
        .get_multiplexed_async_connection_with_config(&config())
        .await?;
    Ok(Primary {
        client,
        conn,
        addr,
        broken: false,
        refusal: None,
    })
}

impl SentinelConnection {
    /// Asks the sentinels for the primary and connects to it; its address with the
    /// connection.
    pub(super) async fn connect(
        mut sentinels: SentinelClient,
        service: &str,
        db: i64,
    ) -> Result<(Self, String), RedisError> {
        let primary = find_primary(&mut sentinels).await?;
        let addr = primary.addr.clone();
        let shared = Arc::new(Shared {
            sentinels: tokio::sync::Mutex::new(sentinels),
            service: service.to_owned(),
            primary: Mutex::new(primary),
            resolving: AtomicBool::new(false),
            last_resolution: Mutex::new(Instant::now()),
            checks: OnceLock::new(),
            refused: AtomicBool::new(false),
            named: Mutex::new(Some(addr.clone())),
            warnings: Warnings::default(),
        });
        tokio::spawn(watch(Arc::downgrade(&shared)));
        Ok((Self { shared, db }, addr))
    }

    /// Has each primary named after this one checked with `checks` (those of `connect`).
    pub(super) fn check_primaries_with(&self, checks: Checks) {
        let _ = self.shared.checks.set(checks);
    }

    /// The error of `connect`'s checks, which the primary failed (see `Connection::refusal`).
    pub(super) fn refusal(&self) -> Option<StoreError> {
        if !self.shared.refused.load(Ordering::Acquire) {
            return None;
        }
        self.shared.primary.lock().refusal.clone()
    }

    /// A client for the primary as last resolved (for a pub/sub connection of its own).
    pub(super) fn primary_client(&self) -> Client {
        self.shared.primary.lock().client.clone()
    }

    /// Resolves again in the background; `broken` (lost, or a replica): until a primary answers.
    pub(super) fn suspect(&self, broken: bool) {
        if broken {
            self.shared.primary.lock().broken = true;
        } else {
            let mut last = self.shared.last_resolution.lock();
            if last.elapsed() < SUSPECT_INTERVAL {
                return;
            }
            *last = Instant::now();
        }
        self.shared.start_resolution();
    }
}

impl Shared {
    /// Starts one resolution in the background unless one is under way.
    fn start_resolution(self: &Arc<Self>) {
        if self.resolving.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.resolving.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(resolve(Arc::downgrade(self)));
    }
}

/// Asks a sentinel every [`WATCH`] which server is the primary, and starts a resolution
/// when it is not the one the store talks to; ends when the store is dropped.
async fn watch(shared: Weak<Shared>) {
    let mut sentinel: Option<MultiplexedConnection> = None;
    loop {
        tokio::time::sleep(WATCH).await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if sentinel.is_none() {
            let mut sentinels = strong.sentinels.lock().await;
            let client = sentinels.async_get_sentinel_client().await;
            drop(sentinels);
            if let Ok(client) = client {
                let config = config();
                let connect = client.get_multiplexed_async_connection_with_config(&config);
                let connected = tokio::time::timeout(RESOLVE_TIMEOUT, connect).await;
                sentinel = connected.ok().and_then(Result::ok);
            }
        }
        let Some(conn) = sentinel.as_mut() else {
            continue;
        };
        let mut ask = redis::cmd("SENTINEL");
        ask.arg("GET-MASTER-ADDR-BY-NAME").arg(&strong.service);
        let named = tokio::time::timeout(
            RESOLVE_TIMEOUT,
            ask.query_async::<Option<(String, u16)>>(conn),
        );
        let named = match named.await {
            Ok(Ok(Some((host, port)))) => Some(format!("{host}:{port}")),
            // Another sentinel next time.
            _ => {
                sentinel = None;
                None
            }
        };
        if named
            .as_ref()
            .is_some_and(|n| *n != strong.primary.lock().addr)
        {
            strong.start_resolution();
        }
        *strong.named.lock() = named;
    }
}

/// Resolves the primary once, and again every [`RETRY`] while the connection is broken (or
/// [`RECHECK`] while the primary fails `connect`'s checks); ends when the store is dropped.
async fn resolve(shared: Weak<Shared>) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let found = strong.find().await;
        let Some(pause) = strong.adopt(found) else {
            strong.resolving.store(false, Ordering::Release);
            return;
        };
        drop(strong);
        tokio::time::sleep(pause).await;
    }
}

impl Shared {
    /// Asks the sentinels for the primary, and gives one new to the store (or one that
    /// failed them) `connect`'s checks; `Err` says why none was found, and about which.
    async fn find(&self) -> Result<Primary, (String, String)> {
        let found = {
            let mut sentinels = self.sentinels.lock().await;
            tokio::time::timeout(RESOLVE_TIMEOUT, find_primary(&mut sentinels)).await
        };
        let mut found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                let named = self.named.lock().clone();
                let message = primary::unresolved(named.as_deref(), &e);
                return Err((named.unwrap_or_default(), message));
            }
            Err(_) => return Err((String::new(), "the sentinels did not answer in time".into())),
        };
        let unchecked = {
            let primary = self.primary.lock();
            found.addr != primary.addr || primary.refusal.is_some()
        };
        if let Some(checks) = self.checks.get().filter(|_| unchecked) {
            match checks(found.client.clone(), found.addr.clone()).await {
                Ok(()) => {}
                Err(e @ StoreError::Misconfigured(_)) => found.refusal = Some(e),
                Err(e) => {
                    let message = format!("the primary {} did not answer: {e}", found.addr);
                    return Err((found.addr, message));
                }
            }
        }
        Ok(found)
    }

    /// Takes a resolution's result (replacing the connection where needed): `None` when the
    /// store decides on the primary now, else the pause before the next resolution.
    fn adopt(&self, found: Result<Primary, (String, String)>) -> Option<Duration> {
        let mut primary = self.primary.lock();
        match found {
            Ok(found)
                if found.addr != primary.addr || primary.broken || primary.refusal.is_some() =>
            {
                let refusal = found.refusal.as_ref();
                self.warnings.adopted(&primary.addr, &found.addr, refusal);
                self.refused
                    .store(found.refusal.is_some(), Ordering::Release);
                *primary = found;
            }
            Ok(_) => {}
            Err((about, why)) => self.warnings.warn(&about, why),
        }
        match (primary.broken, &primary.refusal) {
            (false, None) => None,
            (false, Some(_)) => Some(RECHECK),
            (true, _) => Some(RETRY),
        }
    }
}

/// Whether `e` says this connection cannot serve the store any more: lost, or the server
/// is no longer the primary.
fn is_broken(e: &RedisError) -> bool {
    e.is_unrecoverable_error()
        || e.is_connection_dropped()
        || e.is_io_error()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
        || e.to_string().contains("READONLY")
}

/// Watches one call: a call dropped before its answer (timed out) makes the connection
/// suspect; an answer that says it is broken, broken.
struct Watch<'a> {
    conn: &'a SentinelConnection,
    answered: bool,
}

impl Watch<'_> {
    fn answered<T>(mut self, result: Result<T, RedisError>) -> Result<T, RedisError> {
        self.answered = true;
        if result.as_ref().is_err_and(is_broken) {
            self.conn.suspect(true);
        }
        result
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.conn.suspect(false);
        }
    }
}

impl SentinelConnection {
    /// The primary's connection, and the watch of one call on it.
    fn watched(&self) -> (MultiplexedConnection, Watch<'_>) {
        let primary = self.shared.primary.lock().conn.clone();
        let watch = Watch {
            conn: self,
            answered: false,
        };
        (primary, watch)
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut primary, watch) = self.watched();
            watch.answered(primary.req_packed_command(cmd).await)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut primary, watch) = self.watched();
            watch.answered(primary.req_packed_commands(cmd, offset, count).await)
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The URL form of python's `limits`: credentials, several sentinels, the service and
    /// a database; TLS and `#insecure`; mistakes named.
    #[test]
    fn sentinel_urls_parse_into_their_parts() {
        let target = parse("redis+sentinel://app:p%40ss@10.0.0.1:26379,10.0.0.2:26380/mymaster/2")
            .expect("parses");
        assert_eq!(
            target,
            Target {
                sentinels: vec![("10.0.0.1".into(), 26379), ("10.0.0.2".into(), 26380)],
                service: "mymaster".into(),
                tls: None,
                user: Some("app".into()),
                password: Some("p@ss".into()),
                db: 2,
            }
        );

        let target = parse("rediss+sentinel://:pw@s1/svc#insecure").expect("parses");
        assert_eq!(target.tls, Some(TlsMode::Insecure));
        assert_eq!(target.sentinels, vec![("s1".into(), 26379),]);
        assert_eq!(
            (target.user, target.password.as_deref()),
            (None, Some("pw"))
        );
        let target = parse("redis+sentinel://[::1]:26380,s2/m").expect("parses");
        assert_eq!(
            target.sentinels,
            vec![("::1".into(), 26380), ("s2".into(), 26379)]
        );

        for (url, why) in [
            ("redis+sentinel://s1:26379", "no service name"),
            ("redis+sentinel:///svc", "no sentinel"),
            ("redis+sentinel://s1:x/svc", "a bad port"),
            ("redis+sentinel://s1/svc/x", "a bad database number"),
            ("redis+sentinel://s1/svc#insecure", "only #insecure"),
            ("redis+sentinel://u:p%zz@s1/svc", "a bad %-escape"),
            ("redis+sentinel://u:p%4@s1/svc", "a bad %-escape"),
            ("redis+sentinel://u:p%ff@s1/svc", "a bad %-escape"),
        ] {
            let msg = match parse(url) {
                Ok(parsed) => panic!("{url} parsed: {parsed:?}"),
                Err(e) => e.to_string(),
            };
            assert!(msg.contains(why), "{url}: {msg}");
        }
    }
}
