//! Redis Sentinel: `redis+sentinel://` (and `rediss+sentinel://` over TLS) finds the primary
//! through the sentinels, never writes to the replica, and follows `SENTINEL FAILOVER`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::redis_ha::{SentinelGroup, SERVICE};
use crate::support::redis_server::TlsFiles;
use tollgate::store::{RedisOptions, RedisStore};
use tollgate::{Limiter, Rule};

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
    assert!(!store.is_cluster());
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

/// `connect_sentinel` takes the parts of the URL, credentials and database included.
#[tokio::test]
async fn connect_sentinel_takes_the_parts_of_the_url() {
    let group = SentinelGroup::start(None);
    let primary = &group.servers[group.primary().expect("a primary")];
    primary.must(&["ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"]);
    let sentinels: Vec<String> = group
        .sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let options = RedisOptions::new().auth("app", "pw").db(3);
    let store = RedisStore::connect_sentinel(&sentinels, SERVICE, options)
        .await
        .expect("connect_sentinel");
    let rule = Rule::fixed_window("parts", 1, Duration::from_secs(60));
    assert!(Limiter::new(store)
        .check_one(&rule, b"k")
        .await
        .expect("decide")
        .is_admitted());
    assert_eq!(primary.must(&["-n", "3", "DBSIZE"]).trim(), "1");

    let wrong = RedisOptions::new().auth("app", "wrong");
    let msg = RedisStore::connect_sentinel(&sentinels, SERVICE, wrong)
        .await
        .expect_err("a wrong password");
    assert!(!msg.to_string().contains("wrong"), "{msg}");
}
