//! Support shared by the test binaries: each binary's `main.rs` declares it once as
//! `mod support;`, and its modules use it as `crate::support`. Here: a real server on an
//! ephemeral port and a real HTTP client.
#![allow(dead_code)]

/// The crate under test, under the name the files shared with its unit tests use for it.
use tollgate as tg;

pub mod down;
pub mod log;
pub mod promise_checks;
pub mod promise_driver;
pub mod promise_schedule;
pub mod promise_verbs;
pub mod promises;
pub mod redis_ha;
pub mod redis_server;
pub mod service;
pub mod specs;
pub mod still;
pub mod switch;
pub mod tls;
pub mod vectors;

use std::net::{IpAddr, SocketAddr};

/// The instant every test's clock starts at: 20,000 days after the Unix epoch, a multiple
/// of every day, hour, minute and second (the shared vectors' `BASE_MICROS`).
pub const EPOCH: u64 = vectors::BASE_MICROS;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Serves `app` on 127.0.0.1 with connection info; returns its address.
pub async fn serve_axum(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    addr
}

/// An HTTP/1 client whose connections come from `from` (any 127.x.y.z on Linux), so tests
/// can be different peers.
pub fn client_from(from: &str) -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(from.parse::<IpAddr>().unwrap()));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// A response with its body read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// All values of header `name`, joined as one list.
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .parse()
            .unwrap_or_else(|_| panic!("no Retry-After in {self:?}"))
    }
}

pub async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Reply {
    let response: Response<_> = client.request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `method uri` on `addr` with `headers`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, http::HeaderValue::from_bytes(value).unwrap());
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// The harness's name for test `name` in module `module` (a `module_path!()`): the path
/// without the binary's own name, which a child process given `--exact` must match.
pub fn test_name(module: &str, name: &str) -> String {
    let path = module.split_once("::").map_or("", |(_, rest)| rest);
    format!("{path}::{name}")
}
