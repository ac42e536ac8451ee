//! Every start-up mistake names its fix: an unknown CA, a missing client certificate, a
//! malformed URL, a server that is not Redis, a missing or wrong password. A mistake of
//! configuration reads as one (`StoreError::Misconfigured`), not as an outage.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::redis_server::{RedisServer, TlsFiles};
use tollgate::store::{RedisOptions, RedisStore};
use tollgate::StoreError;

/// The error of a connect that must fail, checked to be a configuration error.
async fn misconfigured(url: &str, options: RedisOptions) -> String {
    match RedisStore::connect_with(url, options).await {
        Ok(store) => panic!("connect({url}) succeeded: {store:?}"),
        Err(e @ StoreError::Misconfigured(_)) => {
            let msg = e.to_string();
            assert!(msg.starts_with("rate limit store misconfigured: "), "{msg}");
            msg
        }
        Err(e) => panic!("connect({url}): not a configuration error: {e:#?}"),
    }
}

/// A server whose certificate no trusted CA signed: the fix names `RedisOptions::ca_pem`.
#[tokio::test]
async fn an_unknown_ca_names_the_option_that_trusts_one() {
    let tls = Arc::new(TlsFiles::new());
    let server = RedisServer::start_tls(&tls, false, &[]);
    let msg = misconfigured(&server.url(), RedisOptions::new()).await;
    assert!(
        msg.contains("not signed by a CA this client trusts"),
        "{msg}"
    );
    assert!(msg.contains("RedisOptions::ca_pem"), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{}", server.port)), "{msg}");
}

/// A server that requires a client certificate, connected to without one: the fix names
/// `RedisOptions::client_cert_pem`.
#[tokio::test]
async fn a_missing_client_certificate_names_the_option_that_sends_one() {
    let tls = Arc::new(TlsFiles::new());
    let server = RedisServer::start_tls(&tls, true, &[]);
    let options = RedisOptions::new().ca_pem(tls.ca_pem());
    let msg = misconfigured(&server.url(), options).await;
    assert!(
        msg.contains("the server requires a client certificate"),
        "{msg}"
    );
    assert!(msg.contains("RedisOptions::client_cert_pem"), "{msg}");
}

/// A URL that is not one names the forms `connect` takes.
#[tokio::test]
async fn a_malformed_url_names_the_forms_connect_takes() {
    for url in [
        "http://127.0.0.1:6379/",
        "redis//127.0.0.1:6379",
        "127.0.0.1:6379",
    ] {
        let msg = misconfigured(url, RedisOptions::new()).await;
        assert!(
            msg.contains("redis://[user:password@]host[:port][/db]"),
            "{url}: {msg}"
        );
        assert!(
            msg.contains("rediss://") && msg.contains("redis+sentinel://"),
            "{msg}"
        );
    }
}

/// A server that answers like HTTP (a Redis URL pointed at a web port) is named as one
/// that does not speak the Redis protocol, not as raw parser text.
#[tokio::test]
async fn a_server_that_is_not_redis_is_named_as_such() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a port");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0; 1024];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    let msg = misconfigured(&format!("redis://127.0.0.1:{port}/"), RedisOptions::new()).await;
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(
        msg.contains("does not speak the Redis protocol (is it the right port?)"),
        "{msg}"
    );
}

/// A server that requires a password: without credentials the fix is to put them in the
/// URL; with wrong ones in the URL, to check them (they are there already).
#[tokio::test]
async fn a_password_missing_or_wrong_names_which() {
    let server = RedisServer::start();
    server.must(&["CONFIG", "SET", "requirepass", "right"]);
    let url = format!("redis://127.0.0.1:{}/", server.port);
    let msg = misconfigured(&url, RedisOptions::new()).await;
    assert!(msg.contains("the server requires a password"), "{msg}");
    assert!(msg.contains("redis://user:password@"), "{msg}");
    assert!(!msg.contains("refused the credentials"), "{msg}");

    let url = format!("redis://default:wrong@127.0.0.1:{}/", server.port);
    let msg = misconfigured(&url, RedisOptions::new()).await;
    assert!(msg.contains("the server refused the credentials"), "{msg}");
    assert!(msg.contains("check the user and password"), "{msg}");
    assert!(!msg.contains("wrong"), "{msg}");
}
