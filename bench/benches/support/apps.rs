//! The app and the rules the HTTP benchmarks share (`benches/http.rs` over loopback,
//! `benches/layer_profile.rs` in process under callgrind), so both measure the same thing.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::{Rate, Rule};

/// The axum hello-world: `GET /` answers `"hello"`.
pub fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// A rule no benchmark load reaches, and one that refuses all but the first request.
pub fn roomy() -> Rule {
    Rule::token_bucket("roomy", 1_000_000_000, Rate::per_second(1_000_000_000))
}

/// Refuses every request but the first of the hour.
pub fn tight() -> Rule {
    Rule::fixed_window("tight", 1, Duration::from_secs(3600))
}
