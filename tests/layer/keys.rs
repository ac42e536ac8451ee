//! Keys over real TCP: forwarded-address spoofing, IPv6 aggregation, and bad input (non-UTF-8
//! and 64 KB header values, malformed `Forwarded`, missing headers, no connection info).

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{client_from, request, send, serve_axum};
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tollgate::key::{self, Duplicates, ForwardedHeader, KeyExtractor};
use tollgate::layer::{Limit, MissingKey, RateLimitLayer};
use tollgate::{store::MemoryStore, Limiter, Rule};

/// One request per minute per key (a window from the key's first request, so no minute
/// boundary falls between a test's requests).
fn one_per_minute(name: &str, key: impl key::KeyExtractor) -> Router {
    let layer = RateLimitLayer::builder()
        .limit(Limit::new(
            Rule::fixed_window_from_first_hit(name, 1, Duration::from_secs(60)),
            key,
        ))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A peer that is not a trusted proxy is keyed by its own address, whatever forwarded
/// address it sends.
#[tokio::test]
async fn an_untrusted_peer_cannot_choose_its_address() {
    // Only 127.0.0.1 is a trusted proxy; 127.0.0.2 is a client talking to us directly.
    let addr = serve_axum(one_per_minute("ip", key::client_ip(["127.0.0.1"]))).await;
    let client = client_from("127.0.0.2");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    assert_eq!(send(&client, xff("1.2.3.4")).await.status, StatusCode::OK);
    // A new made-up address does not make a new client.
    let reply = send(&client, xff("5.6.7.8")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = send(&client, request(addr, "GET", "/", &[])).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

/// Behind a trusted proxy, the client is the address the proxy appended: each forwarded
/// client has its own limit, and one prepending a fake address is still itself.
#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_address_is_the_client() {
    let addr = serve_axum(one_per_minute("ip", key::client_ip(["127.0.0.1"]))).await;
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    assert_eq!(send(&proxy, xff("1.2.3.4")).await.status, StatusCode::OK);
    assert_eq!(
        send(&proxy, xff("1.2.3.4")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the same proxy has its own limit.
    assert_eq!(send(&proxy, xff("5.6.7.8")).await.status, StatusCode::OK);
    // A client that prepends a fake address is still itself: the proxy appended the real one.
    assert_eq!(
        send(&proxy, xff("9.9.9.9, 1.2.3.4")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// IPv6 clients in one /64 share a limit; another /64 has its own.
#[tokio::test]
async fn ipv6_addresses_in_one_slash_64_share_a_limit() {
    let addr = serve_axum(one_per_minute("ip", key::client_ip(["127.0.0.1"]))).await;
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    assert_eq!(
        send(&proxy, xff("2001:db8:1:2::1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&proxy, xff("2001:db8:1:2:ffff:ffff:ffff:ffff"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&proxy, xff("2001:db8:1:3::1")).await.status,
        StatusCode::OK
    );
}

/// A malformed `Forwarded` header gets an answer, not a panic: an unreadable entry ends the
/// walk at the proxy, and a well-formed one still names the client.
#[tokio::test]
async fn malformed_forwarded_headers_get_an_answer_not_a_panic() {
    let extractor = key::client_ip(["127.0.0.1"]).header(ForwardedHeader::Forwarded);
    let addr = serve_axum(one_per_minute("ip", extractor)).await;
    let proxy = client_from("127.0.0.1");
    let fwd = |v: &'static [u8]| request(addr, "GET", "/", &[("forwarded", v)]);

    // Unreadable entries end the walk at the proxy: all of these count as the proxy.
    assert_eq!(send(&proxy, fwd(b"for=")).await.status, StatusCode::OK);
    for garbage in [
        &b"for=\"[::1"[..],
        b";;;,,,===",
        b"for=\xff\xfe\xfd",
        b"by=1.2.3.4",
        b"for=999.1.1.1",
    ] {
        let reply = send(&proxy, fwd(garbage)).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{garbage:?}");
    }
    // A well-formed one still works.
    assert_eq!(
        send(&proxy, fwd(b"for=\"[2001:db8::1]:4711\";proto=https"))
            .await
            .status,
        StatusCode::OK
    );
}

/// A header key may hold any bytes at any length: a non-UTF-8 value is a key, and a 64 KB
/// value is digested yet stays distinct from another that differs in one byte.
#[tokio::test]
async fn header_keys_take_any_bytes_and_any_length() {
    let addr = serve_axum(one_per_minute("user", key::header("user-id"))).await;
    let client = client_from("127.0.0.1");
    let user = |v: &[u8]| request(addr, "GET", "/", &[("user-id", v)]);

    // Not UTF-8: still a key.
    assert_eq!(
        send(&client, user(b"\xff\xfe\x80")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&client, user(b"\xff\xfe\x80")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // 64 KB: digested, but still the same client each time, and distinct from another.
    let big = vec![b'a'; 64 * 1024];
    let mut other = big.clone();
    other[40_000] = b'b';
    assert_eq!(send(&client, user(&big)).await.status, StatusCode::OK);
    assert_eq!(
        send(&client, user(&big)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&client, user(&other)).await.status, StatusCode::OK);
}

/// A missing or empty key follows the limit's policy: rejected with a 400 by default,
/// skipped with `MissingKey::Skip`, or replaced by the key an `or` falls back to.
#[tokio::test]
async fn a_missing_key_follows_the_rules_policy() {
    let limiter = Limiter::new(MemoryStore::new());
    let rule = || Rule::fixed_window("user", 1, Duration::from_secs(60));
    let reject = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(rule(), key::header("user-id")))
        .build()
        .unwrap();
    let skip = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(rule(), key::header("user-id")).on_missing_key(MissingKey::Skip))
        .build()
        .unwrap();
    let fallback = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            rule(),
            key::header("user-id").or(key::peer_ip()),
        ))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/reject", get(|| async { "ok" }).route_layer(reject))
        .route("/skip", get(|| async { "ok" }).route_layer(skip))
        .route("/fallback", get(|| async { "ok" }).route_layer(fallback));
    let addr = serve_axum(app).await;
    let client = client_from("127.0.0.1");

    let reply = send(&client, request(addr, "GET", "/reject", &[])).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body, "missing rate limit key: header user-id\n");
    // An empty value is missing too.
    let reply = send(
        &client,
        request(addr, "GET", "/reject", &[("user-id", b"")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    for _ in 0..3 {
        let reply = send(&client, request(addr, "GET", "/skip", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
    }

    // Without a user id, the address is the key.
    let anonymous = || request(addr, "GET", "/fallback", &[]);
    assert_eq!(send(&client, anonymous()).await.status, StatusCode::OK);
    assert_eq!(
        send(&client, anonymous()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A peer-IP key without connection info answers a generic 500 and keeps the cause off the
/// response.
#[tokio::test]
async fn a_peer_ip_key_without_connection_info_is_a_generic_500() {
    let app = one_per_minute("ip", key::peer_ip());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    // Served without `into_make_service_with_connect_info`: a configuration mistake.
    tokio::spawn(async move { axum::serve(listener, app).await });
    let reply = send(&client_from("127.0.0.1"), request(addr, "GET", "/", &[])).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    // The fix is for the operator (it is logged), not for the client.
    assert_eq!(reply.body, "internal server error\n");
}

/// The branches of an `or` key do not share a key space: a user whose id spells an address
/// or `global` is not the anonymous client keyed that way.
#[tokio::test]
async fn fallback_branches_do_not_share_a_key_space() {
    let by_user_else_address =
        one_per_minute("user-or-ip", key::header("user-id").or(key::peer_ip()));
    let by_user_else_global =
        one_per_minute("user-or-global", key::header("user-id").or(key::global()));
    let app = Router::new()
        .nest("/ip", by_user_else_address)
        .nest("/global", by_user_else_global);
    let addr = serve_axum(app).await;
    let client = client_from("127.0.0.1");

    // A user whose id spells the anonymous client's address…
    let reply = send(
        &client,
        request(addr, "GET", "/ip", &[("user-id", b"127.0.0.1")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // …does not use up that client's limit, nor the other way round.
    let anonymous = send(&client, request(addr, "GET", "/ip", &[])).await;
    assert_eq!(anonymous.status, StatusCode::OK);
    let reply = send(
        &client,
        request(addr, "GET", "/ip", &[("user-id", b"127.0.0.1")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);

    // A user named `global` is not every anonymous request.
    let reply = send(
        &client,
        request(addr, "GET", "/global", &[("user-id", b"global")]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let anonymous = send(&client, request(addr, "GET", "/global", &[])).await;
    assert_eq!(anonymous.status, StatusCode::OK);
    let anonymous = send(&client, request(addr, "GET", "/global", &[])).await;
    assert_eq!(anonymous.status, StatusCode::TOO_MANY_REQUESTS);
}

/// A key header sent more than once is refused with a 400 by default, so a client cannot
/// choose its key by sending its own value before the real one.
#[tokio::test]
async fn a_duplicated_key_header_is_refused_by_default() {
    let addr = serve_axum(one_per_minute("user", key::header("user-id"))).await;
    let client = client_from("127.0.0.1");
    // What a client sends through a gateway that appends the real id after the client's own.
    let appended = |own: &'static [u8]| {
        request(
            addr,
            "GET",
            "/",
            &[("user-id", own), ("user-id", b"real-user")],
        )
    };

    assert_eq!(
        send(
            &client,
            request(addr, "GET", "/", &[("user-id", b"real-user")])
        )
        .await
        .status,
        StatusCode::OK
    );
    for own in [&b"random-1"[..], b"random-2", b"real-user"] {
        let reply = send(&client, appended(own)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{own:?}");
        assert_eq!(
            reply.body,
            "invalid rate limit key: header user-id appears more than once\n"
        );
    }
}

/// A trusted proxy written as an IPv4-mapped IPv6 address or network trusts the IPv4 peer
/// it maps.
#[tokio::test]
async fn a_trusted_proxy_written_as_ipv4_mapped_ipv6_is_trusted() {
    for trusted in ["::ffff:127.0.0.1", "::ffff:127.0.0.0/104"] {
        let addr = serve_axum(one_per_minute("ip", key::client_ip([trusted]))).await;
        let proxy = client_from("127.0.0.1");
        let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

        assert_eq!(send(&proxy, xff("1.2.3.4")).await.status, StatusCode::OK);
        // Another client behind the proxy is not the proxy's bucket.
        assert_eq!(
            send(&proxy, xff("5.6.7.8")).await.status,
            StatusCode::OK,
            "{trusted}"
        );
        assert_eq!(
            send(&proxy, xff("5.6.7.8")).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// An IPv4-mapped address and its IPv4 form are one client, both as the peer and in the
/// forwarded chain.
#[tokio::test]
async fn a_mapped_address_and_its_ipv4_form_are_one_client() {
    // A dual-stack listener sees IPv4 peers as `::ffff:a.b.c.d`.
    let app = one_per_minute("ip", key::client_ip(["127.0.0.1"]));
    let listener = tokio::net::TcpListener::bind("[::]:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);

    // The mapped peer is the trusted proxy, and the forwarded client is the key.
    assert_eq!(send(&proxy, xff("1.2.3.4")).await.status, StatusCode::OK);
    assert_eq!(send(&proxy, xff("5.6.7.8")).await.status, StatusCode::OK);
    // A forwarded address written mapped is the same client as its IPv4 form.
    assert_eq!(
        send(&proxy, xff("::ffff:1.2.3.4")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A mapped hop of the proxy chain is trusted like its IPv4 form.
    assert_eq!(
        send(&proxy, xff("9.9.9.9, ::ffff:127.0.0.1")).await.status,
        StatusCode::OK
    );
}

#[cfg(feature = "tonic")]
#[path = "../../examples/tonic.rs"]
#[allow(dead_code)]
mod tonic_example;

/// `key::peer_ip` finds the client's address on a tonic server that terminates TLS itself
/// (`serve_with_incoming` over rustls streams), which puts `TlsConnectInfo<TcpConnectInfo>`
/// in the extensions, not `TcpConnectInfo`.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn peer_ip_reads_the_address_of_a_tls_connection_to_tonic() {
    use std::sync::Arc;

    use hyper_util::rt::TokioIo;
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(server));
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnector::from(Arc::new(client));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, incoming) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tls = acceptor.accept(tcp).await;
            if accepted.send(tls).await.is_err() {
                return;
            }
        }
    });
    let layer = tonic_example::limits(Limiter::new(MemoryStore::new())).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(
                tonic_example::helloworld::greeter_server::GreeterServer::new(
                    tonic_example::MyGreeter,
                ),
            )
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(incoming)),
    );

    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    let mut client = tonic_example::helloworld::greeter_client::GreeterClient::new(channel);
    let hello = || tonic_example::helloworld::HelloRequest { name: "ann".into() };
    // SayHello allows 3 calls a minute per address: the address was read, so the limit holds.
    for _ in 0..3 {
        let reply = client.say_hello(hello()).await.unwrap();
        assert_eq!(reply.into_inner().message, "hello, ann");
    }
    let status = client.say_hello(hello()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
}

/// A duplicated key header can be keyed by its first or last value; refused by default, it
/// is a missing key, so `or` falls back and `Skip` skips.
#[tokio::test]
async fn a_duplicated_key_header_can_count_its_first_or_last_value() {
    let limiter = Limiter::new(MemoryStore::new());
    let rule = |name| Rule::fixed_window_from_first_hit(name, 1, Duration::from_secs(60));
    let header = || key::header("user-id");
    let first = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            rule("first"),
            header().duplicates(Duplicates::First),
        ))
        .build()
        .unwrap();
    let last = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(
            rule("last"),
            header().duplicates(Duplicates::Last),
        ))
        .build()
        .unwrap();
    // A rejected duplicate is a missing key: `or` falls back, `Skip` skips.
    let fallback = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(rule("fallback"), header().or(key::peer_ip())))
        .build()
        .unwrap();
    let skip = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(rule("skip"), header()).on_missing_key(MissingKey::Skip))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/first", get(|| async { "ok" }).route_layer(first))
        .route("/last", get(|| async { "ok" }).route_layer(last))
        .route("/fallback", get(|| async { "ok" }).route_layer(fallback))
        .route("/skip", get(|| async { "ok" }).route_layer(skip));
    let addr = serve_axum(app).await;
    let client = client_from("127.0.0.1");
    let twice = |path, a: &'static [u8], b: &'static [u8]| {
        request(addr, "GET", path, &[("user-id", a), ("user-id", b)])
    };
    let status = |reply: crate::support::Reply| reply.status;

    assert_eq!(
        status(send(&client, twice("/first", b"a", b"x")).await),
        StatusCode::OK
    );
    assert_eq!(
        status(send(&client, twice("/first", b"a", b"y")).await),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(send(&client, twice("/first", b"b", b"x")).await),
        StatusCode::OK
    );

    assert_eq!(
        status(send(&client, twice("/last", b"x", b"a")).await),
        StatusCode::OK
    );
    assert_eq!(
        status(send(&client, twice("/last", b"y", b"a")).await),
        StatusCode::TOO_MANY_REQUESTS
    );
    // An empty chosen value is a missing key.
    assert_eq!(
        status(send(&client, twice("/last", b"a", b"")).await),
        StatusCode::BAD_REQUEST
    );

    // Duplicated: keyed by address, so new made-up ids do not make new clients.
    assert_eq!(
        status(send(&client, twice("/fallback", b"1", b"2")).await),
        StatusCode::OK
    );
    assert_eq!(
        status(send(&client, twice("/fallback", b"3", b"4")).await),
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(
            status(send(&client, twice("/skip", b"1", b"2")).await),
            StatusCode::OK
        );
    }
}

/// The documented pattern for IPv6 holders of whole /56 or /48 networks: a strict limit per
/// /64 and a coarser one per /48, in one layer, so one batch.
#[tokio::test]
async fn a_strict_slash_64_and_a_coarse_slash_48_limit_in_one_layer() {
    let layer = RateLimitLayer::builder()
        .limit(Limit::new(
            Rule::fixed_window_from_first_hit("ip", 1, Duration::from_secs(60)),
            key::client_ip(["127.0.0.1"]),
        ))
        .limit(Limit::new(
            Rule::fixed_window_from_first_hit("ip-48", 2, Duration::from_secs(60)),
            key::client_ip(["127.0.0.1"]).ipv6_prefix(48),
        ))
        .build()
        .unwrap();
    let addr = serve_axum(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let proxy = client_from("127.0.0.1");
    let xff = |v: &'static str| request(addr, "GET", "/", &[("x-forwarded-for", v.as_bytes())]);
    let status = |reply: crate::support::Reply| reply.status;

    assert_eq!(
        status(send(&proxy, xff("2001:db8:1:1::1")).await),
        StatusCode::OK
    );
    // The same /64: the strict limit.
    assert_eq!(
        status(send(&proxy, xff("2001:db8:1:1::2")).await),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another /64 of the same /48: its own strict limit, the second of the /48's two.
    assert_eq!(
        status(send(&proxy, xff("2001:db8:1:2::1")).await),
        StatusCode::OK
    );
    // Rotating through the /48's other /64s gets no further.
    for net in ["2001:db8:1:3::1", "2001:db8:1:ff::1", "2001:db8:1:ffff::1"] {
        let reply = send(&proxy, xff(net)).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{net}");
        assert!(
            reply.header("ratelimit").contains("\"ip-48\";r=0;"),
            "{reply:?}"
        );
    }
    // Another /48 is another holder.
    assert_eq!(
        status(send(&proxy, xff("2001:db8:2:1::1")).await),
        StatusCode::OK
    );
    // IPv4 clients are counted per address by both rules.
    assert_eq!(status(send(&proxy, xff("192.0.2.1")).await), StatusCode::OK);
    assert_eq!(status(send(&proxy, xff("192.0.2.2")).await), StatusCode::OK);
}

/// A cost the client writes (here `?units=N`) can be 0; `min_cost` makes every request count.
#[tokio::test]
async fn min_cost_makes_a_request_that_costs_nothing_count() {
    let units = |req: &key::RequestHead<'_>| {
        req.uri()
            .query()
            .and_then(|q| q.strip_prefix("units="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let rule = |name| Rule::fixed_window_from_first_hit(name, 3, Duration::from_secs(3600));
    let limiter = Limiter::new(MemoryStore::new());
    let clamped = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(
            Limit::new(rule("clamped"), key::global())
                .cost(units)
                .min_cost(1),
        )
        .build()
        .unwrap();
    // The rule's default cost is clamped too.
    let free_by_default = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(rule("free").with_cost(0), key::global()).min_cost(2))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/clamped", get(|| async { "ok" }).route_layer(clamped))
        .route("/free", get(|| async { "ok" }).route_layer(free_by_default));
    let addr = serve_axum(app).await;
    let client = client_from("127.0.0.1");
    let get_status = |path: &'static str| {
        let client = client.clone();
        async move { send(&client, request(addr, "GET", path, &[])).await.status }
    };

    for _ in 0..3 {
        assert_eq!(get_status("/clamped?units=0").await, StatusCode::OK);
    }
    assert_eq!(
        get_status("/clamped?units=0").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get_status("/clamped").await, StatusCode::TOO_MANY_REQUESTS);

    assert_eq!(get_status("/free").await, StatusCode::OK);
    assert_eq!(get_status("/free").await, StatusCode::TOO_MANY_REQUESTS);
}

/// Two parts of a tuple key never make one key out of another tuple's parts, whatever
/// bytes they hold: `("a\x1Fb", "c")` is not `("a", "b\x1Fc")`.
#[test]
fn a_tuple_key_is_never_another_tuples_key() {
    use tollgate::key::{KeyBuf, RequestHead};

    // The header `parts: a~b|c` stands for the parts "a\x1Fb" and "c" (`^` for 0x10).
    let part = |i: usize| {
        key::from_fn(move |req: &RequestHead<'_>| {
            let value = req.headers().get("parts")?.to_str().ok()?;
            let text = value
                .split('|')
                .nth(i)?
                .replace('~', "\x1F")
                .replace('^', "\x10");
            Some(text.into_bytes())
        })
    };
    let tuple = (part(0), part(1));
    let key_of = |parts: &str| {
        let request = http::Request::get("/").header("parts", parts).body(());
        let mut buf = KeyBuf::new();
        let head = request.unwrap();
        tuple
            .extract(&RequestHead::from_request(&head), &mut buf)
            .unwrap();
        buf.as_bytes().to_vec()
    };
    let tuples = ["a~b|c", "a|b~c", "a^|~c", "a|^~c", "a^~|c", "a~|^c", "a|c"];
    let keys: std::collections::HashSet<Vec<u8>> = tuples.iter().map(|t| key_of(t)).collect();
    assert_eq!(keys.len(), tuples.len(), "{keys:?}");
    // Parts without those bytes are joined as they are.
    assert_eq!(key_of("a|c"), b"a\x1Fc");
}
