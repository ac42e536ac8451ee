//! Start-up checks: a deployment that cannot work is an error when the store connects, with
//! the fix in its message, never a silent fail-open on every request.

use redis::{RedisError, Value};

use crate::error::StoreError;

use super::connection::Connection;
use super::dispatch::Caller;
use super::script::{self, Call, Encoded, Invocation, Op};

/// The oldest Redis the script runs on: it reads `TIME` and then writes, which needs
/// effects replication, the default from 5.0 on (and `UNLINK`, from 4.0).
const MIN_VERSION: (u32, u32) = (5, 0);

/// What `INFO` says about the server the store talks to; `None`s when it would not say
/// (an ACL user without `INFO`): the dry decision still runs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct ServerInfo {
    /// `redis_version` as major, minor.
    pub(super) version: Option<(u32, u32)>,
    /// `cluster_enabled:1`.
    pub(super) cluster: bool,
    /// `role:slave`: a replica, read-only or not; writes there are lost or refused.
    pub(super) replica: bool,
}

impl ServerInfo {
    /// Parses the text of `INFO` (default sections: server, replication, cluster…).
    pub(super) fn parse(info: &str) -> Self {
        let mut facts = Self::default();
        for line in info.lines() {
            let Some((field, value)) = line.trim().split_once(':') else {
                continue;
            };
            match field {
                "redis_version" => facts.version = parse_version(value),
                "cluster_enabled" => facts.cluster = value == "1",
                "role" => facts.replica = value == "slave" || value == "replica",
                _ => {}
            }
        }
        facts
    }

    /// An error for a server tollgate cannot run on as a standalone store at `addr`; a
    /// Cluster node is not one (the caller connects as a Cluster client instead).
    pub(super) fn refusal(&self, addr: &str) -> Option<StoreError> {
        if let Some(version) = self.version.filter(|&v| v < MIN_VERSION) {
            return Some(StoreError::Misconfigured(format!(
                "redis at {addr} is version {}.{}, tollgate's script needs Redis {}.{} or newer",
                version.0, version.1, MIN_VERSION.0, MIN_VERSION.1
            )));
        }
        if self.replica && !self.cluster {
            return Some(StoreError::Misconfigured(format!(
                "redis at {addr} is a replica (INFO role:slave): tollgate writes its state on \
                 every decision, point the store at the primary"
            )));
        }
        None
    }
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Asks the server at `addr` what it is. Where `INFO` is denied or renamed away, only
/// `CLUSTER INFO` is asked, and the dry decision is the check.
pub(super) async fn server_info(
    conn: &mut Connection,
    addr: &str,
) -> Result<ServerInfo, StoreError> {
    match redis::cmd("INFO").query_async::<Value>(conn).await {
        Ok(Value::BulkString(bytes)) => Ok(ServerInfo::parse(&String::from_utf8_lossy(&bytes))),
        Ok(Value::VerbatimString { text, .. }) => Ok(ServerInfo::parse(&text)),
        Ok(Value::SimpleString(text)) => Ok(ServerInfo::parse(&text)),
        Ok(_) => Ok(ServerInfo::default()),
        Err(e) if unavailable_command(&e) => {
            // A Cluster still has to be told apart: a keyless dry decision runs on any node.
            let cluster = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async::<Value>(conn)
                .await
                .is_ok();
            Ok(ServerInfo {
                cluster,
                ..ServerInfo::default()
            })
        }
        Err(e) => Err(setup_error(addr, &e)),
    }
}

/// Whether `e` says the command is not there for this client: denied by its ACL user,
/// unknown to the server's version, or renamed away (`rename-command`).
fn unavailable_command(e: &RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("unknown command")
}

/// Decides one empty batch in peek mode (touching no key): the code loads, runs here for
/// this user, and its reply is understood. With `functions`, as a function library where
/// Redis 7+ and the user allow it, else as a script. Returns the route that worked.
pub(super) async fn dry_decision(
    conn: &mut Connection,
    addr: &str,
    functions: bool,
) -> Result<Invocation, StoreError> {
    if functions {
        // A user who may not load functions runs the script.
        match script::load_command(Invocation::Function)
            .query_async::<Value>(&mut *conn)
            .await
        {
            Ok(_) => match dry_call(conn, addr, Invocation::Function).await {
                // A user who may load functions but not call them: the script will do.
                Err(StoreError::Misconfigured(m)) if m.to_ascii_uppercase().contains("NOPERM") => {}
                found => return found,
            },
            // Redis before 7, or a user who may not load functions: the script will do.
            Err(e) if unavailable_command(&e) => {}
            Err(e) => return Err(setup_error(addr, &e)),
        }
    }
    // Loaded here even where it is cached already: a user who may not load it would fail
    // every call after a flush, a restart or a failover.
    script::load_command(Invocation::Script)
        .query_async::<Value>(&mut *conn)
        .await
        .map_err(|e| setup_error(addr, &e))?;
    dry_call(conn, addr, Invocation::Script).await
}

/// The empty peek of [`dry_decision`] through `route`; the route that answered.
async fn dry_call(
    conn: &Connection,
    addr: &str,
    route: Invocation,
) -> Result<Invocation, StoreError> {
    let call = Call {
        mode: Op::Peek,
        ..Call::default()
    };
    let batch = Encoded::new(call, &[], |_, _| Vec::new(), None);
    let caller = Caller::new(conn.clone(), route);
    let mut replies = caller.call(&[&batch]).await.map_err(|e| match e {
        StoreError::Unavailable(message) if message.to_ascii_uppercase().contains("NOPERM") => {
            StoreError::Misconfigured(format!("redis at {addr}: {NOPERM_FIX} ({message})"))
        }
        StoreError::Unavailable(message) => {
            StoreError::Unavailable(format!("redis at {addr}: {message}"))
        }
        e => e,
    })?;
    let values = replies
        .pop()
        .ok_or_else(|| StoreError::Protocol(format!("redis at {addr} answered no batch")))??;
    let reply = script::parse(&values, &[])?;
    if !reply.admitted || reply.now == 0 {
        return Err(StoreError::Protocol(format!(
            "redis at {addr} answered a dry decision with {values:?}"
        )));
    }
    Ok(caller.route())
}

const NOPERM_FIX: &str = "the Redis user may not run tollgate's code: grant it FCALL and \
     FUNCTION LOAD, or EVALSHA and SCRIPT LOAD \
     (ACL SETUSER <user> +fcall +function|load +evalsha +script|load) and the keys \
     under the store's prefix (~tollgate:*)";

/// The fix for a permission `e` says the user lacks, when it names a command other than
/// those that run or load tollgate's code (`ROLE`, say).
fn noperm_fix(e: &RedisError) -> String {
    let text = e.to_string();
    let command = text
        .split_once("run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command.to_ascii_lowercase());
    match command {
        Some(command)
            if !["evalsha", "eval", "fcall", "function|load", "script|load"]
                .contains(&command.as_str()) =>
        {
            let name = command.to_ascii_uppercase().replace('|', " ");
            format!("the Redis user may not run {name}: grant it +{command}; the whole ACL is in tollgate's Redis guide")
        }
        _ => NOPERM_FIX.to_owned(),
    }
}

/// A start-up failure at `addr`: a configuration error naming the fix where `e` says what
/// to fix (its code, its kind or its words, where rustls' and the parser's verdicts show),
/// else an outage.
pub(super) fn setup_error(addr: &str, e: &RedisError) -> StoreError {
    let config =
        |fix: &str| StoreError::Misconfigured(format!("redis at {addr}: {fix} ({})", brief(e)));
    let outage = |fix: &str| StoreError::Unavailable(format!("redis at {addr}: {e} ({fix})"));
    match e.code() {
        Some("NOPERM") => return config(&noperm_fix(e)),
        Some("READONLY") => {
            return config("this is a read-only replica: point the store at the primary")
        }
        Some("MOVED" | "ASK" | "CROSSSLOT") => return config(CLUSTER_NODE),
        Some("CLUSTERDOWN") => return outage("the Cluster does not serve every slot"),
        Some("NOAUTH") => return config(NO_PASSWORD),
        Some("WRONGPASS") => return config(WRONG_PASSWORD),
        _ => {}
    }
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return config(WRONG_PASSWORD);
    }
    const SAID: [(&str, &str); 6] = [
        (
            "UnknownIssuer",
            "the server's certificate is not signed by a CA this client trusts: pass the CA \
             with RedisOptions::ca_pem to RedisStore::connect_with (or trust it system-wide)",
        ),
        (
            "CertificateRequired",
            "the server requires a client certificate: pass one signed by a CA the server \
             trusts with RedisOptions::client_cert_pem to RedisStore::connect_with",
        ),
        (
            "invalid peer certificate",
            "the server's certificate does not verify: check the host name in the URL and \
             the CA given with RedisOptions::ca_pem",
        ),
        (
            "InvalidContentType",
            "the server does not speak TLS there: use redis:// rather than rediss://, or the \
             server's TLS port",
        ),
        (
            "Parse error",
            "the server does not speak the Redis protocol (is it the right port?)",
        ),
        (
            "cluster support disabled",
            "this server is not a Redis Cluster node: give RedisStore::connect its URL alone",
        ),
    ];
    let text = e.to_string();
    if let Some((_, fix)) = SAID.iter().find(|(said, _)| text.contains(said)) {
        return config(fix);
    }
    if e.is_connection_refusal() {
        return outage("nothing listens there: check the URL");
    }
    StoreError::Unavailable(format!("redis at {addr}: {e}"))
}

const CLUSTER_NODE: &str =
    "this is a Redis Cluster node: RedisStore::connect detects a Cluster from its URL";
const NO_PASSWORD: &str = "the server requires a password: put it in the URL \
     (redis://user:password@host:port/, redis+sentinel://user:password@host:port/service)";
const WRONG_PASSWORD: &str = "the server refused the credentials given (the URL's \
     user:password): check the user and password";

/// `e`'s text on one line: a parser's error lists each unexpected byte on a line of its own.
fn brief(e: &RedisError) -> String {
    e.to_string().trim().replace('\n', "; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// INFO gives the server's version, cluster mode and role, and a 7.0 cluster primary is
    /// accepted.
    #[test]
    fn info_says_version_cluster_and_role() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_mode:cluster\r\n\
                    # Replication\r\nrole:master\r\n# Cluster\r\ncluster_enabled:1\r\n";
        let facts = ServerInfo::parse(info);
        assert_eq!(
            facts,
            ServerInfo {
                version: Some((7, 0)),
                cluster: true,
                replica: false
            }
        );
        assert_eq!(facts.refusal("a:1"), None);
    }

    /// A server older than 5.0 or a replica is refused with the reason; a server whose INFO
    /// says nothing is not refused here.
    #[test]
    fn an_old_server_or_a_replica_is_refused_with_the_reason() {
        let old = ServerInfo::parse("redis_version:4.0.14\r\nrole:master\r\ncluster_enabled:0");
        let msg = old
            .refusal("h:6380")
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("version 4.0") && msg.contains("5.0 or newer"),
            "{msg}"
        );

        let replica = ServerInfo::parse("redis_version:7.2.4\r\nrole:slave\r\ncluster_enabled:0");
        let msg = replica
            .refusal("h:6380")
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("replica") && msg.contains("primary"), "{msg}");

        // Nothing known (INFO denied): nothing refused here; the dry decision decides.
        assert_eq!(ServerInfo::parse("").refusal("h:1"), None);
    }
}
