//! Connecting a [`RedisStore`]: a standalone server, a Cluster or a Sentinel deployment,
//! over TCP or TLS, checked before the store is handed out.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::{Client, TlsMode};

use crate::decision::StoreId;
use crate::error::StoreError;

use super::access;
use super::connection::{Connection, KeepAlive};
use super::dispatch::{Caller, Calls};
use super::invalidation::Servers;
use super::options::{install_crypto_provider, RedisOptions};
use super::script::Invocation;
use super::sentinel::{self, SentinelConnection};
use super::setup;
use super::{RedisStore, DEFAULT_TIMEOUT};

/// How long connecting, with its checks, may take before it fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisStore {
    /// Connects to Redis and checks that tollgate can work there: a deployment that cannot
    /// is an error now, not a failure on every request.
    ///
    /// `url` is one of:
    /// - one server, `redis://[user:password@]host:port/db`, or `rediss://…` for TLS
    ///   (verified as [`RedisOptions`] says). A server in cluster mode is connected to as a
    ///   Cluster seeded with it;
    /// - several Cluster nodes separated by commas (`redis://a:7000,redis://b:7001`; a
    ///   comma in a password is `%2C`);
    /// - a Sentinel deployment,
    ///   `redis+sentinel://[user:password@]host:port[,host:port…]/service_name[/db]`
    ///   (`rediss+sentinel://` for TLS to the sentinels and the primary).
    ///
    /// Before it returns (within a few seconds), the store loads its code, decides one empty
    /// batch, and runs each command its code uses once on a key of its own under the prefix
    /// (`tollgate`, or [`RedisOptions::prefix`]). It fails with
    /// [`StoreError::Unavailable`] when nothing answers (an outage, which may pass), and with
    /// [`StoreError::Misconfigured`], naming the address and the fix, when:
    /// - the URL is not one of the forms above, or the server there does not speak Redis;
    /// - the password is missing or refused;
    /// - the server's certificate does not verify (an unknown CA:
    ///   [`RedisOptions::ca_pem`]), or the server requires a client certificate
    ///   ([`RedisOptions::client_cert_pem`]);
    /// - the Redis user may not run tollgate's code, one of the commands it runs, or use
    ///   the keys or the channel under the prefix (the message names the permission; the
    ///   whole ACL is in the [Redis guide](crate::guide::redis_instances));
    /// - the server is a replica (it would refuse or lose the writes);
    /// - the server is older than Redis 5.0, or cannot run the script.
    ///
    /// # Sentinel
    ///
    /// The URL's credentials and database are the primary's. The store follows the primary
    /// the sentinels name through failovers (the
    /// [Redis guide](crate::guide::redis_instances#sentinel) says how), and checks each later
    /// primary as here: while one fails, every call fails with its
    /// [`StoreError::Misconfigured`] and [`health`](crate::Limiter::health) is
    /// [`Failing`](crate::store::Health::Failing).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, RedisOptions::new()).await
    }

    /// [`connect`](Self::connect), with what a URL cannot say ([`RedisOptions`]).
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        // `rediss+sentinel://` too.
        let tls = url.trim_start().starts_with("rediss");
        let certified = options.client.is_some();
        Self::open(url, options)
            .await
            .map_err(|e| perhaps_client_certificate(e, tls && !certified))
    }

    async fn open(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        if sentinel::is_sentinel_url(url) {
            return Self::sentinel(&sentinel::parse(url)?, options).await;
        }
        options.check_for_url(url)?;
        if url.contains(',') {
            let urls = url.split(',').map(str::trim).filter(|u| !u.is_empty());
            return Self::cluster(urls.map(str::to_owned).collect(), options).await;
        }
        let client = client(url, &options)?;
        // The address without the credentials the URL may carry.
        let addr = client.get_connection_info().addr().to_string();
        let connect = async {
            // A dead server fails the connect after a few quick retries, not the default many.
            let mut conn = standalone(client.clone(), 2, &addr).await?;
            let info = setup::server_info(&mut conn, &addr).await?;
            if let Some(refusal) = info.refusal(&addr) {
                return Err(refusal);
            }
            if info.cluster {
                return Ok(None);
            }
            let servers = Servers::Nodes(Arc::from(vec![client]));
            Self::ready(conn, &addr, &options, servers).await.map(Some)
        };
        match within(&addr, connect).await? {
            Some(store) => Ok(store),
            None => Self::cluster(vec![url.to_owned()], options).await,
        }
    }

    async fn sentinel(
        target: &sentinel::Target,
        options: RedisOptions,
    ) -> Result<Self, StoreError> {
        let client = sentinel::client(target, &options)?;
        let sentinels = target
            .sentinels
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let addr = format!("sentinels {sentinels} (service {})", target.service);
        let connect = async {
            let (sentinel, primary) =
                SentinelConnection::connect(client, &target.service, target.db)
                    .await
                    .map_err(|e| setup::setup_error(&addr, &e))?;
            let addr = format!("{addr}, primary {primary}");
            let mut conn = Connection::Sentinel(sentinel.clone());
            let info = setup::server_info(&mut conn, &addr).await?;
            if let Some(refusal) = info.refusal(&addr) {
                return Err(refusal);
            }
            Self::ready(conn, &addr, &options, Servers::Sentinel(sentinel)).await
        };
        within(&addr, connect).await
    }

    async fn cluster(urls: Vec<String>, options: RedisOptions) -> Result<Self, StoreError> {
        let clients = urls
            .iter()
            .map(|u| client(u, &options))
            .collect::<Result<Vec<_>, _>>()?;
        // The address for messages: the nodes without the credentials their URLs may carry.
        let addr = clients
            .iter()
            .map(|c| c.get_connection_info().addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let addr = format!("cluster {addr}");
        // The store's own per-call timeout governs, not the crate's default. No retries: a
        // script call whose connection dropped may have run, and sending it again would
        // count the request twice; the failure policy decides instead (see the type's docs).
        let mut builder = ClusterClient::builder(urls.clone())
            .response_timeout(Duration::from_secs(3600))
            .retries(0);
        if let Some(certs) = options.certificates() {
            if urls.iter().any(|u| u.ends_with("#insecure")) {
                builder = builder.tls(TlsMode::Insecure);
            }
            builder = builder.certs(certs);
        }
        let cluster = builder.build().map_err(|e| {
            StoreError::Misconfigured(format!("invalid redis Cluster URLs: {e} ({URL_FORMS})"))
        })?;
        let connect = async {
            let conn = cluster
                .get_async_connection()
                .await
                .map_err(|e| setup::setup_error(&addr, &e))?;
            let servers = Servers::Nodes(Arc::from(clients));
            Self::ready(Connection::Cluster(conn), &addr, &options, servers).await
        };
        within(&addr, connect).await
    }

    /// Checks the deployment on `conn` and makes the store.
    async fn ready(
        mut conn: Connection,
        addr: &str,
        options: &RedisOptions,
        servers: Servers,
    ) -> Result<Self, StoreError> {
        // A Cluster runs the script: its calls are not coalesced (each batch's keys route
        // to their own node), and a script needs no loading per node ahead of time.
        let cluster = matches!(conn, Connection::Cluster(_));
        let prefix = options.escaped_prefix();
        let functions = !cluster && !options.script_only;
        let route = access::check(&mut conn, addr, &prefix, functions).await?;
        if let Connection::Sentinel(sentinel) = &conn {
            let prefix: Arc<[u8]> = Arc::from(prefix.as_slice());
            sentinel.check_primaries_with(Box::new(move |client, addr| {
                Box::pin(check_primary(client, addr, Arc::clone(&prefix), route))
            }));
        }
        let calls = Calls::new(Caller::new(conn.clone(), route), !cluster);
        let keep_alive = KeepAlive::start(&conn);
        Ok(Self {
            conn,
            calls: Arc::new(calls),
            prefix: Arc::from(prefix),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
            servers,
            deny_cache: None,
            id: StoreId::new(),
            _keep_alive: keep_alive,
        })
    }
}

/// `connect`, bounded by [`CONNECT_TIMEOUT`].
async fn within<T>(
    addr: &str,
    connect: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| no_answer(addr))?
}

/// A reconnecting connection to `client`'s server, tried `retries` times more. The store's
/// own per-call timeout governs, not the redis crate's default.
async fn standalone(client: Client, retries: usize, addr: &str) -> Result<Connection, StoreError> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(DEFAULT_TIMEOUT))
        .set_number_of_retries(retries)
        .set_max_delay(Duration::from_millis(500));
    let manager = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| setup::setup_error(addr, &e))?;
    Ok(Connection::Standalone(manager))
}

/// `connect`'s checks on a later primary, as [`Checks`](super::primary::Checks) says.
async fn check_primary(
    client: Client,
    addr: String,
    prefix: Arc<[u8]>,
    route: Invocation,
) -> Result<(), StoreError> {
    let addr = addr.as_str();
    let check = async {
        let mut conn = standalone(client, 0, addr).await?;
        let info = setup::server_info(&mut conn, addr).await?;
        // Demoted since the sentinels named it (a failover under way): ask them again.
        if info.replica {
            return Err(StoreError::Unavailable(format!("{addr} is a replica now")));
        }
        if let Some(refusal) = info.refusal(addr) {
            return Err(refusal);
        }
        let functions = route == Invocation::Function;
        let found = access::check(&mut conn, addr, &prefix, functions).await?;
        // Before Redis 7 there are no functions, and calls fall back to the script there.
        if found != route && info.version.is_none_or(|v| v >= (7, 0)) {
            return Err(StoreError::Misconfigured(format!(
                "redis at {addr}: the store calls tollgate's code as a function (FCALL), and \
                 the Redis user may not load or call functions here: grant it +fcall and \
                 +function|load"
            )));
        }
        Ok(())
    };
    super::within(CONNECT_TIMEOUT, check).await
}

/// A client for `url`, with `options`' certificates for a `rediss://` URL.
fn client(url: &str, options: &RedisOptions) -> Result<Client, StoreError> {
    let invalid = |e: redis::RedisError| {
        StoreError::Misconfigured(format!("invalid redis URL: {e} ({URL_FORMS})"))
    };
    if url.trim_start().starts_with("rediss") {
        install_crypto_provider();
    }
    match options.certificates() {
        Some(certs) => Client::build_with_tls(url, certs).map_err(invalid),
        None => Client::open(url).map_err(invalid),
    }
}

/// The URLs [`RedisStore::connect`] takes, for the error of one that is not one of them.
const URL_FORMS: &str = "expected redis://[user:password@]host[:port][/db], rediss://… for \
     TLS, several Cluster nodes as redis://host:port,redis://host:port, or \
     redis+sentinel://[user:password@]host[:port][,host:port…]/service_name[/db]";

/// A TLS server that requires a client certificate may drop the connection before its
/// alert is read, or go silent: for such an error without one, say what it may be.
fn perhaps_client_certificate(e: StoreError, uncertified: bool) -> StoreError {
    const SIGNS: [&str; 5] = ["reset", "closed", "broken pipe", "eof", "did not answer"];
    match e {
        StoreError::Unavailable(m)
            if uncertified && SIGNS.iter().any(|s| m.to_ascii_lowercase().contains(s)) =>
        {
            StoreError::Unavailable(format!(
                "{m} (if the server requires a client certificate, pass one with \
                 RedisOptions::client_cert_pem)"
            ))
        }
        e => e,
    }
}

/// The error of a connect that got no answer within [`CONNECT_TIMEOUT`].
fn no_answer(addr: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "redis at {addr} did not answer within {} s: check the URL and that the server is up",
        CONNECT_TIMEOUT.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS connection lost or silent, without a client certificate, may be a server that
    /// requires one: the error says so; with one, or without TLS, it does not.
    #[test]
    fn a_lost_tls_connection_without_a_client_certificate_names_the_option() {
        let lost = || StoreError::Unavailable("redis at h:1: Connection reset by peer".into());
        let msg = perhaps_client_certificate(lost(), true).to_string();
        assert!(msg.contains("RedisOptions::client_cert_pem"), "{msg}");
        assert_eq!(perhaps_client_certificate(lost(), false), lost());
        let refused = StoreError::Unavailable("redis at h:1: Connection refused".into());
        assert_eq!(perhaps_client_certificate(refused.clone(), true), refused);
        let silent = perhaps_client_certificate(no_answer("h:1"), true).to_string();
        assert!(silent.contains("client_cert_pem"), "{silent}");
    }
}
