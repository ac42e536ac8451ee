//! A gRPC service limited per method with tonic, the way tonic services are written: a
//! `.proto` file (`proto/helloworld.proto`), the server and client code tonic generates
//! from it, and tollgate's layer on the server.
//!
//! `helloworld.Greeter/SayHello` allows 3 calls per minute per client address, `SayGoodbye`
//! 10. A limited call fails with `RESOURCE_EXHAUSTED`, a message saying when to retry, and
//! the rich error model (`google.rpc.RetryInfo`, `google.rpc.QuotaFailure`) that gRPC
//! clients' retry policies read.
//!
//! ```sh
//! cargo run --example tonic --features tonic            # a server on 127.0.0.1:50051, to Ctrl-C
//! cargo run --example tonic --features tonic -- client  # another terminal: 5 calls, 2 refused
//! grpcurl -plaintext -import-path proto -proto helloworld.proto \
//!     -d '{"name": "ann"}' 127.0.0.1:50051 helloworld.Greeter/SayHello
//! ```
//!
//! `PORT` picks another port for both. The generated code is checked in as
//! `proto/helloworld.rs` rather than built by a build script, so that users of tollgate do not
//! compile a protobuf compiler; `cargo run -p tollgate-bench --bin proto` regenerates it, and
//! `tests/integrations/proto.rs` fails when it is out of date with the `.proto` file.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{
    key,
    store::{MemoryStore, Store},
    ConfigError, Limiter, Rule,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_types::StatusExt;

/// The code tonic-prost-build generates from `proto/helloworld.proto`.
pub mod helloworld {
    include!("../proto/helloworld.rs");
}

use helloworld::greeter_client::GreeterClient;
use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::{HelloReply, HelloRequest};

/// The greeter: what the service does, with no rate limiting in it.
#[derive(Debug, Default)]
pub struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let message = format!("hello, {}", request.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }

    async fn say_goodbye(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let message = format!("goodbye, {}", request.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }
}

/// The limits, per method and per client address. A gRPC method's route is its path,
/// `/package.Service/Method`.
pub fn limits<St: Store>(limiter: Limiter<St>) -> Result<RateLimitLayer<St>, ConfigError> {
    let minute = Duration::from_secs(60);
    RateLimitLayer::builder()
        .limiter(limiter)
        .route(
            "/helloworld.Greeter/SayHello",
            [Limit::new(
                Rule::fixed_window("say-hello", 3, minute),
                key::peer_ip(),
            )],
        )
        .route(
            "/helloworld.Greeter/SayGoodbye",
            [Limit::new(
                Rule::fixed_window("say-goodbye", 10, minute),
                key::peer_ip(),
            )],
        )
        .build()
}

/// Serves the limited greeter on `listener` until the process stops.
pub async fn serve<St: Store + Clone>(
    listener: tokio::net::TcpListener,
    limiter: Limiter<St>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .layer(limits(limiter)?)
        .add_service(GreeterServer::new(MyGreeter))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// A generated client connected to the server at `addr`.
pub async fn connect(addr: SocketAddr) -> Result<GreeterClient<Channel>, tonic::transport::Error> {
    GreeterClient::connect(format!("http://{addr}")).await
}

/// What a client makes of a refused call: the code, the message, and the retry delay from
/// the `RetryInfo` detail (exact, where the `retry-after` metadata is whole seconds).
pub fn describe(status: &Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(delay) = status.get_details_retry_info().and_then(|r| r.retry_delay) {
        text += &format!("; RetryInfo: retry in {delay:.3?}");
    }
    if let Some(quota) = status.get_details_quota_failure() {
        for violation in &quota.violations {
            text += &format!(
                "; QuotaFailure: {} ({})",
                violation.subject, violation.description
            );
        }
    }
    text
}

fn addr() -> SocketAddr {
    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(50051);
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn run_server(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("gRPC server on {addr} (Ctrl-C stops it): SayHello allows 3 calls a minute per address, SayGoodbye 10");
    println!("try, in another terminal:");
    println!("  cargo run --example tonic --features tonic -- client");
    println!(
        "  grpcurl -plaintext -import-path proto -proto helloworld.proto -d '{{\"name\": \"ann\"}}' {addr} helloworld.Greeter/SayHello"
    );
    serve(listener, Limiter::new(MemoryStore::new())).await
}

async fn run_client(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut client = connect(addr).await.map_err(|e| {
        format!("no server on {addr} ({e}): start one with `cargo run --example tonic --features tonic`")
    })?;
    for i in 1..=5 {
        let request = HelloRequest {
            name: "tollgate".into(),
        };
        match client.say_hello(request).await {
            Ok(reply) => println!("SayHello {i}: {}", reply.into_inner().message),
            Err(status) => println!("SayHello {i}: {}", describe(&status)),
        }
    }
    Ok(())
}

#[allow(dead_code)] // Tests include this file.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // `RUST_LOG` picks what is printed (default: info, so store failures and the layer's
    // warnings show); without a subscriber they would go nowhere.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
                .from_env_lossy(),
        )
        .init();
    match std::env::args().nth(1).as_deref() {
        None | Some("server") => run_server(addr()).await,
        Some("client") => run_client(addr()).await,
        Some(other) => {
            Err(format!("unknown mode {other:?}: `server` (the default) or `client`").into())
        }
    }
}
