//! The checks on connect of a server the store decides on: the Redis user may do everything
//! the store does (each command tollgate's code runs, on a key of its own under the prefix,
//! and a publish on the deny caches' channel), and the code loads and runs. A missing
//! permission is an error naming it, at start, rather than a failure of the first decision
//! that needs it.

use redis::Value;

use crate::error::StoreError;

use super::connection::Connection;
use super::script::Invocation;
use super::setup;

/// Runs each command tollgate's code runs, under `prefix` (as the store writes it), then the
/// dry decision ([`setup::dry_decision`], with `functions`): an error naming the first
/// permission the user lacks, else the route that worked.
pub(super) async fn check(
    conn: &mut Connection,
    addr: &str,
    prefix: &[u8],
    functions: bool,
) -> Result<Invocation, StoreError> {
    let key = &[prefix, b":{acl-check}:/check"].concat()[..];
    let log = &[key, b"/log"].concat()[..];
    let channel = &[prefix, b":deny-cache"].concat()[..];
    // Arguments harmless on `key` and `log`: a key and a sorted set under the prefix that no
    // rule can name (`/` is not in a rule name's alphabet), deleted at the end.
    let commands: [(&str, &[&[u8]]); 17] = [
        ("TIME", &[]),
        ("GET", &[key]),
        ("PSETEX", &[key, b"60000", b"acl-check"]),
        ("PEXPIRE", &[key, b"60000"]),
        ("DEL", &[key]),
        ("UNLINK", &[key]),
        ("ZADD", &[log, b"0", b"m"]),
        ("ZCARD", &[log]),
        ("ZCOUNT", &[log, b"0", b"1"]),
        ("ZRANGE", &[log, b"0", b"0"]),
        ("ZRANGEBYSCORE", &[log, b"0", b"1"]),
        ("ZREVRANGEBYSCORE", &[log, b"1", b"0"]),
        ("ZREM", &[log, b"m"]),
        ("ZREMRANGEBYRANK", &[log, b"0", b"0"]),
        ("DEL", &[log]),
        // An empty message: deny caches ignore it.
        ("PUBLISH", &[channel, b""]),
        ("PING", &[]),
    ];
    for (name, args) in commands {
        if let Err(e) = redis::cmd(name)
            .arg(args)
            .query_async::<Value>(&mut *conn)
            .await
        {
            return Err(refusal(addr, name, prefix, &e));
        }
    }
    // The commands first: a command denied inside the code is reported without its name.
    setup::dry_decision(conn, addr, functions).await
}

/// The error for `command` failing at `addr` with `e`; for a missing permission, the
/// permission to grant.
fn refusal(addr: &str, command: &str, prefix: &[u8], e: &redis::RedisError) -> StoreError {
    let prefix = String::from_utf8_lossy(prefix);
    let text = e.to_string();
    if e.code() != Some("NOPERM") && !text.contains("NOPERM") {
        return setup::setup_error(addr, e);
    }
    let grant = if text.contains("channel") {
        format!("&{prefix}:deny-cache (the deny caches' channel)")
    } else if text.contains("key") {
        format!("~{prefix}:* (the keys under the store's prefix)")
    } else {
        format!(
            "+{} (a command tollgate's code runs)",
            command.to_ascii_lowercase()
        )
    };
    StoreError::Misconfigured(format!(
        "redis at {addr}: the Redis user may not run {command} as tollgate does ({text}): \
         grant it {grant}; the whole ACL is in tollgate's Redis guide"
    ))
}

/// The error for a subscription to the deny caches' `channel` refused at `addr`.
pub(super) fn subscribe_refusal(channel: &[u8], e: StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) | StoreError::Misconfigured(m)
            if m.to_ascii_uppercase().contains("NOPERM") =>
        {
            StoreError::Misconfigured(format!(
                "{m}: the deny cache subscribes to {0}; grant the Redis user +subscribe and &{0}",
                String::from_utf8_lossy(channel)
            ))
        }
        e => e,
    }
}
