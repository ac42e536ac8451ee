//! `RedisStore::connect` checks the deployment before it returns: a Cluster node becomes a
//! Cluster client, and a wrong URL, a user without script permissions or a replica are an
//! error at start naming the fix, not a silent fail-open on every request.

use crate::support::redis_server::{RedisCluster, RedisServer};
use crate::support::vectors::BASE_MICROS;
use tollgate::{
    store::{RedisOptions, RedisStore},
    Limiter, ManualClock, Rate, Rule, StoreError,
};

/// The quickstart's `/report` limit: bursts of 3, then 1 per second.
fn report_rule() -> Rule {
    Rule::token_bucket("report", 3, Rate::per_second(1))
}

/// The message of a connect that must fail.
async fn refusal(url: &str) -> String {
    match RedisStore::connect(url).await {
        Ok(store) => panic!("connect({url}) succeeded: {store:?}"),
        Err(e) => e.to_string(),
    }
}

/// Every client key gets exactly 3 of 8 at one instant, wherever its slot lives.
/// Whether `store` talks to a Cluster, as its `Debug` says.
fn is_cluster(store: &RedisStore) -> bool {
    format!("{store:?}").contains(r#"connection: "cluster""#)
}

async fn limits_every_key(store: RedisStore) {
    let limiter = Limiter::new(store.with_clock(ManualClock::new(BASE_MICROS)));
    let rule = report_rule();
    for client in 0..30 {
        let key = format!("client-{client}");
        let mut admitted = 0;
        for _ in 0..8 {
            let outcome = limiter
                .check_one(&rule, key.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            admitted += u32::from(outcome.is_admitted());
        }
        assert_eq!(admitted, 3, "{key}");
    }
}

/// Connecting to one or several cluster nodes gives a cluster client that discovers the
/// rest and has each key decided by its owner.
#[tokio::test]
async fn connect_to_one_cluster_node_becomes_a_cluster_client_and_limits() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();

    // One node's URL, as a user copies it: the other nodes are discovered.
    let store = RedisStore::connect(&urls[0]).await.expect("connect");
    assert!(is_cluster(&store), "{store:?}");
    for node in &cluster.nodes {
        node.must(&["CONFIG", "RESETSTAT"]);
    }
    limits_every_key(store).await;
    // 30 keys spread over every node's slots, each decided by its owner.
    for node in &cluster.nodes {
        assert!(node.calls("evalsha") > 0, "node {} got no call", node.port);
    }

    // Several nodes in one string, comma-separated.
    let options = RedisOptions::new().prefix("comma");
    let store = RedisStore::connect_with(&urls.join(","), options)
        .await
        .expect("connect");
    assert!(is_cluster(&store), "{store:?}");
    limits_every_key(store).await;
}

/// Connecting to a standalone server gives a standalone client, and the check on connect
/// touches no key.
#[tokio::test]
async fn connect_to_a_standalone_server_stays_standalone() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    assert!(!is_cluster(&store), "{store:?}");
    // The dry decision touched no key.
    assert_eq!(server.must(&["DBSIZE"]).trim(), "0");
    limits_every_key(store).await;
}

/// A server that renamed `INFO` away (`rename-command INFO ""`, as managed services do with
/// commands they keep to themselves) is used all the same: `INFO` is optional, and the dry
/// decision is the check.
#[tokio::test]
async fn a_server_without_info_is_used_all_the_same() {
    let server = RedisServer::start_with(&["--rename-command", "INFO", ""]);
    assert!(server
        .cli(&["INFO"])
        .is_none_or(|o| o.contains("unknown command")));
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect without INFO");
    assert!(!is_cluster(&store), "{store:?}");
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("r", 1, std::time::Duration::from_secs(60));
    assert!(limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    assert!(!limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
}

/// Connecting where nothing listens is an error naming the address, and a URL that is not
/// Redis is an error saying so.
#[tokio::test]
async fn nothing_listening_is_an_error_naming_the_address() {
    // A port that had a server a moment ago and has none now.
    let port = {
        let server = RedisServer::start();
        server.port
    };
    let msg = refusal(&format!("redis://127.0.0.1:{port}/")).await;
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");

    let msg = refusal("http://127.0.0.1:6379/").await;
    assert!(msg.contains("invalid redis URL"), "{msg}");
}

/// A user who may not call functions (or not load them) runs the script instead: the
/// fallback works, and no decision goes through `FCALL`.
#[tokio::test]
async fn a_user_allowed_scripts_only_runs_the_script() {
    let server = RedisServer::start();
    for (user, denied) in [
        ("nocall", &["-fcall"][..]),
        ("nofunction", &["-function"][..]),
    ] {
        let mut acl = vec!["ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all"];
        acl.extend_from_slice(denied);
        server.must(&acl);
        let url = format!("redis://{user}:secret@127.0.0.1:{}/", server.port);
        let store = RedisStore::connect(&url).await.expect("connect");
        server.must(&["CONFIG", "RESETSTAT"]);
        let limiter = Limiter::new(store);
        let rule = Rule::fixed_window("r", 2, std::time::Duration::from_secs(60));
        let outcome = limiter.check_one(&rule, user.as_bytes()).await.unwrap();
        assert!(outcome.is_admitted());
        assert_eq!(outcome.rules[0].info.remaining, 1);
        assert_eq!(server.calls("fcall"), 0);
        assert_eq!(server.calls("evalsha"), 1);
    }
}

/// A user who may not run or load the scripts is refused on connect, naming the permission
/// to grant and never the password; a user denied only INFO works.
#[tokio::test]
async fn a_user_who_may_not_run_scripts_is_an_error_naming_the_permission() {
    let server = RedisServer::start();
    // Everything but EVALSHA and FCALL: the code loads, but no decision could ever run.
    server.must(&[
        "ACL", "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all", "-evalsha", "-fcall",
    ]);
    let url = format!("redis://limited:secret@127.0.0.1:{}/", server.port);
    let msg = refusal(&url).await;
    assert!(
        msg.contains("NOPERM") || msg.contains("permission"),
        "{msg}"
    );
    assert!(msg.contains("+evalsha"), "{msg}");
    // The password stays out of the message.
    assert!(!msg.contains("secret"), "{msg}");

    // Without SCRIPT LOAD and FUNCTION LOAD either.
    server.must(&[
        "ACL",
        "SETUSER",
        "noload",
        "on",
        ">secret",
        "~*",
        "&*",
        "+@all",
        "-script",
        "-function",
    ]);
    let url = format!("redis://noload:secret@127.0.0.1:{}/", server.port);
    let msg = refusal(&url).await;
    assert!(msg.contains("+script|load"), "{msg}");
    // Refused even where another user has loaded the script: after a flush, a restart or a
    // failover this user could not load it again.
    let script_only = RedisOptions::new().functions(false);
    RedisStore::connect_with(&server.url(), script_only)
        .await
        .expect("connect");
    let msg = refusal(&url).await;
    assert!(msg.contains("+script|load"), "{msg}");

    // A user denied INFO (so the server cannot be inspected) who may run the script works:
    // the dry decision is the check.
    server.must(&[
        "ACL", "SETUSER", "noinfo", "on", ">secret", "~*", "&*", "+@all", "-info",
    ]);
    let url = format!("redis://noinfo:secret@127.0.0.1:{}/", server.port);
    let store = RedisStore::connect(&url).await.expect("connect");
    limits_every_key(store).await;
}

/// Connecting to a replica is a configuration error that says to use the primary.
#[tokio::test]
async fn a_replica_is_an_error_naming_the_primary() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    replica.must(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    let msg = refusal(&replica.url()).await;
    assert!(msg.contains("replica") && msg.contains("primary"), "{msg}");
    assert!(matches!(
        RedisStore::connect(&replica.url()).await,
        Err(StoreError::Misconfigured(_))
    ));
}

/// A wrong password is an error naming the address and the fix, without the password.
#[tokio::test]
async fn a_wrong_password_is_an_error_naming_the_fix() {
    let server = RedisServer::start();
    server.must(&[
        "ACL", "SETUSER", "someone", "on", ">right", "~*", "&*", "+@all",
    ]);
    let url = format!("redis://someone:wrong@127.0.0.1:{}/", server.port);
    let msg = refusal(&url).await;
    assert!(msg.contains(&format!("127.0.0.1:{}", server.port)), "{msg}");
    assert!(msg.contains("check the user and password"), "{msg}");
    assert!(!msg.contains("wrong@"), "{msg}");
}

/// Connecting as a cluster (several URLs) to a standalone server is an error pointing to
/// `RedisStore::connect` with its URL alone.
#[tokio::test]
async fn cluster_urls_naming_a_standalone_server_name_connect() {
    let server = RedisServer::start();
    let urls = [server.url(), server.url()].join(",");
    let msg = match RedisStore::connect(&urls).await {
        Ok(store) => panic!("connected as a cluster: {store:?}"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("RedisStore::connect"), "{msg}");
}
