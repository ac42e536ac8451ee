//! Plain hyper 1.x: one layer with a route table carries a global limit and different
//! limits for different routes.
//!
//! Run `cargo run --example hyper`, then try the printed curl lines.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{
    key,
    store::{MemoryStore, Store},
    ConfigError, Limiter, Rate, Rule,
};
use tower::ServiceBuilder;

/// The limits: 100 requests per second per address everywhere; SMS one per minute per
/// user; file downloads 30 a minute per user, across all files.
pub fn limits<St: Store>(limiter: Limiter<St>) -> Result<RateLimitLayer<St>, ConfigError> {
    RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::gcra("per-ip", 100, Rate::per_second(100)),
            key::peer_ip(),
        ))
        .route(
            "POST /sms/send",
            [Limit::new(
                Rule::fixed_window("sms", 1, Duration::from_secs(60)),
                key::header("user-id"),
            )],
        )
        .route(
            "GET /files/{id}",
            [Limit::new(
                Rule::sliding_window("files", 30, Duration::from_secs(60)),
                key::header("user-id"),
            )],
        )
        .build()
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = format!("{} {}\n", req.method(), req.uri().path());
    Ok(Response::new(Full::new(Bytes::from(body))))
}

/// Serves `handle` behind `layer` on `listener`, one task per connection.
pub async fn serve(
    listener: tokio::net::TcpListener,
    layer: RateLimitLayer<MemoryStore>,
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        // `key::peer_ip` reads the peer's address from the request's extensions.
        let service = ServiceBuilder::new()
            .map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert::<SocketAddr>(peer);
                req
            })
            .layer(layer.clone())
            .service_fn(handle);
        tokio::spawn(async move {
            let service = TowerToHyperService::new(service);
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection from {peer}: {e}");
            }
        });
    }
}

#[allow(dead_code)] // Tests include this file.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG` picks what is printed (default: info, so store failures and the layer's
    // warnings show); without a subscriber they would go nowhere.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
                .from_env_lossy(),
        )
        .init();
    let layer = limits(Limiter::new(MemoryStore::new()))?;
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  curl -i -X POST -H 'User-Id: 7' http://{addr}/sms/send   # twice: 429");
    println!("  curl -i -H 'User-Id: 7' http://{addr}/files/1");
    serve(listener, layer).await?;
    Ok(())
}
