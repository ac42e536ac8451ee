//! Redis Sentinel: `redis+sentinel://` (and `rediss+sentinel://` over TLS) finds the primary
//! through the sentinels, never writes to the replica, and follows `SENTINEL FAILOVER`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::log::Captured;
use crate::support::redis_ha::{SentinelGroup, SERVICE};
use crate::support::redis_server::{RedisServer, TlsFiles};
use tollgate::store::{Health, RedisOptions, RedisStore};
use tollgate::{Limiter, Rule, StoreError};

/// Over TLS end to end (sentinels, primary, replica, with a CA and a client certificate
/// made here; the sentinels require the certificate): decisions go
/// to the primary only; after `SENTINEL FAILOVER` they go to the promoted replica, and
/// none reaches the demoted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_finds_the_primary_and_follows_a_failover() {
    let tls = Arc::new(TlsFiles::new());
    let group = SentinelGroup::start(Some(&tls));
    // The sentinels ask for a client certificate (`tls-auth-clients` defaults to yes).
    let (cert, key) = tls.client_pem();
    let options = || {
        RedisOptions::new()
            .ca_pem(tls.ca_pem())
            .client_cert_pem(cert.clone(), key.clone())
    };
    let url = group.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");

    let wrong = url.replace(SERVICE, "nosuch");
    assert!(RedisStore::connect_with(&wrong, options()).await.is_err());

    let store = RedisStore::connect_with(&url, options())
        .await
        .expect("connect through the sentinels")
        .with_timeout(Duration::from_millis(200));
    assert!(format!("{store:?}").contains(r#"connection: "sentinel""#));
    let old = group.primary().expect("a primary");
    let new = 1 - old;
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("s", 1_000_000, Duration::from_secs(3600));
    for _ in 0..10 {
        limiter.check_one(&rule, b"k").await.expect("decide");
    }
    assert!(group.servers[old].script_calls() >= 10);
    assert_eq!(
        group.servers[new].script_calls(),
        0,
        "a replica got a decision"
    );

    group.sentinels[0].must(&["SENTINEL", "FAILOVER", SERVICE]);
    let started = Instant::now();
    while !(limiter.check_one(&rule, b"k").await.is_ok() && group.servers[new].script_calls() > 0) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not following the failover"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("SENTINEL FAILOVER followed after {:?}", started.elapsed());
    assert_eq!(group.named_primary_port(), Some(group.servers[new].port));
    // The old primary decides nothing any more, though the sentinels demote it only later
    // (until then it would still take writes the new primary never sees).
    let before = group.servers[old].script_calls();
    for _ in 0..20 {
        limiter.check_one(&rule, b"k").await.expect("decide");
    }
    assert_eq!(group.servers[old].script_calls(), before);
    // The state moved with the failover (replicated before it was asked for).
    let outcome = limiter.check_one(&rule, b"k").await.expect("decide");
    assert!(outcome.rules[0].info.remaining <= 1_000_000 - 31);
}

/// A `redis+sentinel://` URL carries the primary's credentials and database.
#[tokio::test]
async fn a_sentinel_url_carries_the_primarys_credentials_and_database() {
    let group = SentinelGroup::start(None);
    let primary = &group.servers[group.primary().expect("a primary")];
    primary.must(&["ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"]);
    let url = group.url().replace("://", "://app:pw@");
    let store = RedisStore::connect(&format!("{url}/3"))
        .await
        .expect("connect through the sentinels");
    let rule = Rule::fixed_window("parts", 1, Duration::from_secs(60));
    assert!(Limiter::new(store)
        .check_one(&rule, b"k")
        .await
        .expect("decide")
        .is_admitted());
    assert_eq!(primary.must(&["-n", "3", "DBSIZE"]).trim(), "1");

    let wrong = url.replace("app:pw@", "app:wrong@");
    let msg = RedisStore::connect(&wrong)
        .await
        .expect_err("a wrong password");
    assert!(!msg.to_string().contains("wrong"), "{msg}");
}

/// `host:port` of `server`, as the store's messages write it.
fn addr(server: &RedisServer) -> String {
    format!("127.0.0.1:{}", server.port)
}

/// A primary the sentinels name later (here by `SENTINEL MONITOR` naming another server)
/// gets the checks `connect` gave the first: its user lacks `@scripting`, so the store
/// says so (each decision's error and `health()`, not raw `NOPERM` text) and warns with
/// the fix, after a warning that the failover may have lost the old primary's state; once
/// the grant is there, the store decides on the new primary without a restart.
#[tokio::test]
async fn a_primary_named_later_gets_the_checks_of_connect() {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    let group = SentinelGroup::start(None);
    let first = &group.servers[group.primary().expect("a primary")];
    first.must(&["ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"]);
    let next = RedisServer::start();
    next.must(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-@scripting",
    ]);
    let url = group.url().replace("://", "://app:pw@");
    let store = RedisStore::connect(&url)
        .await
        .expect("connect through the sentinels")
        .with_timeout(Duration::from_millis(500));
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("later", 100, Duration::from_secs(3600));
    limiter.check_one(&rule, b"k").await.expect("decide");
    assert_eq!(limiter.health(), Health::Healthy);

    let port = next.port.to_string();
    for sentinel in &group.sentinels {
        sentinel.must(&["SENTINEL", "REMOVE", SERVICE]);
        sentinel.must(&["SENTINEL", "MONITOR", SERVICE, "127.0.0.1", &port, "2"]);
    }
    let started = Instant::now();
    let msg = loop {
        match limiter.check_one(&rule, b"k").await {
            Err(e @ StoreError::Misconfigured(_)) => break e.to_string(),
            other => assert!(
                started.elapsed() < Duration::from_secs(10),
                "no check of the new primary: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        msg.contains(&addr(&next)) && msg.contains("+evalsha"),
        "{msg}"
    );
    assert!(!msg.contains("unavailable"), "{msg}");
    assert_eq!(limiter.health(), Health::Failing);
    let lines = captured.lines();
    let warned = |what: &[&str]| {
        lines
            .iter()
            .any(|l| l.starts_with("WARN") && what.iter().all(|w| l.contains(w)))
    };
    assert!(
        warned(&["failover", &addr(&next), &addr(first), "lost"]),
        "{lines:#?}"
    );
    assert!(warned(&[&addr(&next), "+evalsha"]), "{lines:#?}");

    next.must(&["ACL", "SETUSER", "app", "+@scripting"]);
    while limiter.check_one(&rule, b"k").await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not recovering once granted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limiter.health(), Health::Healthy);
    assert!(next.script_calls() > 0);
}

/// While the sentinels are up and the primary they name refuses (it is down and no
/// replica can replace it), the log says that, naming the primary and its error, once and
/// then at most every few seconds, not on every retry.
#[tokio::test]
async fn a_refusing_primary_is_named_in_the_log_without_repeats() {
    let mut group = SentinelGroup::start(None);
    let store = RedisStore::connect(&group.url())
        .await
        .expect("connect")
        .with_timeout(Duration::from_millis(200));
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("refusing", 100, Duration::from_secs(3600));
    limiter.check_one(&rule, b"k").await.expect("decide");
    let primary = group.primary().expect("a primary");
    let named = addr(&group.servers[primary]);

    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.clone());
    group.servers[1 - primary].kill();
    group.servers[primary].kill();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert!(limiter.check_one(&rule, b"k").await.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warnings: Vec<String> = captured
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("WARN"))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|l| l.contains(&named) && l.contains("refused")),
        "{warnings:#?}"
    );
    assert!(
        !warnings.iter().any(|l| l.contains("named no primary")),
        "{warnings:#?}"
    );
    assert!(warnings.len() <= 2, "{warnings:#?}");
}
