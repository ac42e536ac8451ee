//! A gRPC service limited per method with tonic.
//!
//! `hello.Greeter/SayHello` allows 3 calls per minute per client address, `SayGoodbye` 10.
//! A limited call fails with `Code::ResourceExhausted` and a message saying when to retry.
//!
//! The service is written the way tonic's code generator writes it (a `prost` message, a
//! `UnaryService`, `tonic::server::Grpc`), so the example needs no `protoc` and no build
//! script. Run `cargo run --example tonic`: it starts the server, calls it five times and
//! prints what the client sees.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, ConfigError, Limiter, MemoryStore, Rule, Store};
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The messages, as `prost-build` would generate them from
/// `message HelloRequest { string name = 1; }` and `message HelloReply { string message = 1; }`.
pub mod hello {
    /// A greeting request.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HelloRequest {
        /// Who to greet.
        #[prost(string, tag = "1")]
        pub name: String,
    }

    /// A greeting.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HelloReply {
        /// The greeting.
        #[prost(string, tag = "1")]
        pub message: String,
    }
}

use hello::{HelloReply, HelloRequest};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The `hello.Greeter` service.
#[derive(Debug, Clone, Default)]
pub struct Greeter;

impl NamedService for Greeter {
    const NAME: &'static str = "hello.Greeter";
}

/// One unary method: answers `"{greeting}, {name}"`.
struct Greet(&'static str);

impl UnaryService<HelloRequest> for Greet {
    type Response = HelloReply;
    type Future = BoxFuture<Result<Response<HelloReply>, Status>>;

    fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
        let message = format!("{}, {}", self.0, request.into_inner().name);
        Box::pin(async move { Ok(Response::new(HelloReply { message })) })
    }
}

impl tower::Service<http::Request<Body>> for Greeter {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = match request.uri().path() {
            "/hello.Greeter/SayHello" => Greet("hello"),
            "/hello.Greeter/SayGoodbye" => Greet("goodbye"),
            _ => {
                return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) })
            }
        };
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// The limits, per method and per client address.
pub fn limits<St: Store>(limiter: Limiter<St>) -> Result<RateLimitLayer<St>, ConfigError> {
    let minute = Duration::from_secs(60);
    RateLimitLayer::builder(limiter)
        .route(
            "/hello.Greeter/SayHello",
            [Limit::new(
                Rule::fixed_window("say-hello", 3, minute),
                key::peer_ip(),
            )],
        )
        .route(
            "/hello.Greeter/SayGoodbye",
            [Limit::new(
                Rule::fixed_window("say-goodbye", 10, minute),
                key::peer_ip(),
            )],
        )
        .build()
}

/// Serves the limited greeter on `listener`.
pub async fn serve<St: Store + Clone>(
    listener: tokio::net::TcpListener,
    limiter: Limiter<St>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .layer(limits(limiter)?)
        .add_service(Greeter)
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// Calls `method` (`SayHello` or `SayGoodbye`) on the server at `addr`.
pub async fn call(
    channel: tonic::transport::Channel,
    method: &'static str,
    name: &str,
) -> Result<String, Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(method);
    let request = Request::new(HelloRequest { name: name.into() });
    let codec = ProstCodec::<HelloRequest, HelloReply>::default();
    let response = client.unary(request, path, codec).await?;
    Ok(response.into_inner().message)
}

/// Connects a channel to `addr`.
pub async fn connect(
    addr: SocketAddr,
) -> Result<tonic::transport::Channel, Box<dyn std::error::Error + Send + Sync>> {
    let endpoint = tonic::transport::Channel::from_shared(format!("http://{addr}"))?;
    Ok(endpoint.connect().await?)
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, Limiter::new(MemoryStore::new())));
    println!("gRPC server on {addr}: SayHello allows 3 calls a minute per address");
    let channel = connect(addr).await?;
    for i in 1..=5 {
        match call(channel.clone(), "/hello.Greeter/SayHello", "tollgate").await {
            Ok(message) => println!("call {i}: {message}"),
            Err(status) => println!("call {i}: {:?}: {}", status.code(), status.message()),
        }
    }
    Ok(())
}
