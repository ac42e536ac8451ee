//! `rediss://`: a standalone server and a Cluster over TLS, with certificates made in the
//! test. The server's certificate is verified (against the system's roots by default, or a
//! CA of the user's choice), a client certificate is sent where the server asks for one,
//! and verification is skipped only when the URL says `#insecure`.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::support::redis_server::{redis_cli_bin, RedisServer, TlsFiles};
use tollgate::store::{RedisOptions, RedisStore};
use tollgate::{Limiter, Rule};

/// The message of a connect that must fail.
async fn refused(url: &str, options: RedisOptions) -> String {
    match RedisStore::connect_with(url, options).await {
        Ok(store) => panic!("connect({url}) succeeded: {store:?}"),
        Err(e) => e.to_string(),
    }
}

/// Two of three requests of one key pass a limit of 2: decisions really run over `store`.
async fn decides(store: RedisStore) {
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("tls", 2, Duration::from_secs(60));
    let mut admitted = 0;
    for _ in 0..3 {
        let outcome = limiter.check_one(&rule, b"k").await.expect("a decision");
        admitted += u32::from(outcome.is_admitted());
    }
    assert_eq!(admitted, 2);
}

/// A server whose certificate a test CA signed: refused without that CA (not in the
/// system's roots), accepted with it, and with `#insecure` (asked for by name) without it.
#[tokio::test]
async fn the_server_certificate_is_verified_against_the_ca_given() {
    let tls = Arc::new(TlsFiles::new());
    let server = RedisServer::start_tls(&tls, false, &[]);
    let url = server.url();
    assert!(url.starts_with("rediss://"), "{url}");

    let msg = refused(&url, RedisOptions::new()).await;
    assert!(
        msg.contains("certificate") || msg.contains("UnknownIssuer"),
        "{msg}"
    );
    assert!(msg.contains(&format!("127.0.0.1:{}", server.port)), "{msg}");

    let store = RedisStore::connect_with(&url, RedisOptions::new().ca_pem(tls.ca_pem()))
        .await
        .expect("connect with the CA");
    decides(store).await;

    // Skipping verification only by name.
    let options = RedisOptions::new().prefix("insecure");
    let store = RedisStore::connect_with(&format!("{url}#insecure"), options)
        .await
        .expect("connect #insecure");
    decides(store).await;

    // Plain TCP to a TLS port gets no answer it understands.
    let plain = url.replace("rediss://", "redis://");
    assert!(RedisStore::connect(&plain).await.is_err());
    // A CA for a URL without TLS is a mistake, named.
    let msg = refused(&plain, RedisOptions::new().ca_pem(tls.ca_pem())).await;
    assert!(msg.contains("rediss://"), "{msg}");
}

/// Mutual TLS: a server that asks for a client certificate refuses a client without one
/// and accepts one the CA signed; the deny cache's own connection presents it too.
#[tokio::test]
async fn a_client_certificate_is_sent_where_the_server_asks_for_one() {
    let tls = Arc::new(TlsFiles::new());
    let server = RedisServer::start_tls(&tls, true, &[]);
    let url = server.url();
    assert!(
        RedisStore::connect_with(&url, RedisOptions::new().ca_pem(tls.ca_pem()))
            .await
            .is_err()
    );

    let (cert, key) = tls.client_pem();
    let options = RedisOptions::new()
        .ca_pem(tls.ca_pem())
        .client_cert_pem(cert, key);
    let store = RedisStore::connect_with(&url, options)
        .await
        .expect("connect with a client certificate")
        .with_deny_cache(100)
        .await
        .expect("the deny cache subscribes over mutual TLS");
    decides(store).await;
}

/// With no CA given, the system's roots decide: the test CA, made a system root through
/// `SSL_CERT_FILE` (which the platform's certificate loader honours) in a child process,
/// verifies the server there. The child is this test binary, running only this test.
#[tokio::test]
async fn without_a_ca_the_system_roots_verify_the_server() {
    if let Ok(url) = std::env::var("TOLLGATE_TLS_CHILD_URL") {
        let store = RedisStore::connect(&url)
            .await
            .expect("system roots verify");
        decides(store).await;
        return;
    }
    let tls = Arc::new(TlsFiles::new());
    let server = RedisServer::start_tls(&tls, false, &[]);
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "tls::without_a_ca_the_system_roots_verify_the_server",
            "--nocapture",
        ])
        .env("TOLLGATE_TLS_CHILD_URL", server.url())
        .env("SSL_CERT_FILE", &tls.ca_cert)
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Cluster of three TLS-only nodes (`tls-cluster yes`): connected through one node with
/// the CA, the store discovers the others over TLS and decides keys on every node.
#[tokio::test]
async fn a_cluster_over_tls_decides_on_every_node() {
    let tls = Arc::new(TlsFiles::new());
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_tls(
                &tls,
                false,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--tls-cluster",
                    "yes",
                ],
            )
        })
        .collect();
    let mut create = Command::new(redis_cli_bin());
    create
        .arg("--tls")
        .arg("--cacert")
        .arg(&tls.ca_cert)
        .args(["--cluster", "create"]);
    for node in &nodes {
        create.arg(format!("127.0.0.1:{}", node.port));
    }
    let out = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !nodes.iter().all(|n| {
        n.cli(&["CLUSTER", "INFO"])
            .is_some_and(|i| i.contains("cluster_state:ok"))
    }) {
        assert!(std::time::Instant::now() < deadline, "cluster not ok");
        std::thread::sleep(Duration::from_millis(50));
    }

    let options = RedisOptions::new().ca_pem(tls.ca_pem());
    let store = RedisStore::connect_with(&nodes[0].url(), options)
        .await
        .expect("connect to the TLS cluster");
    assert!(format!("{store:?}").contains(r#"connection: "cluster""#));
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("tls", 1, Duration::from_secs(60));
    for client in 0..30 {
        let key = format!("client-{client}");
        let first = limiter
            .check_one(&rule, key.as_bytes())
            .await
            .expect("decide");
        let second = limiter
            .check_one(&rule, key.as_bytes())
            .await
            .expect("decide");
        assert!(first.is_admitted() && !second.is_admitted(), "{key}");
    }
    for node in &nodes {
        assert!(node.script_calls() > 0, "node {} got no call", node.port);
    }
}
