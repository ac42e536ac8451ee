//! tollgate's benchmarks and tooling, kept out of the main crate so that its examples and
//! tests build without criterion, the charts' plotting stack or a protobuf compiler.
//!
//! - `cargo bench -p tollgate-bench` runs the benchmarks (`--bench NAME` picks one).
//! - `cargo run -p tollgate-bench --bin algorithms_chart` draws `docs/algorithms.png`.
//! - `cargo run -p tollgate-bench --bin bench_chart -- IN.csv OUT.png` draws a bench's CSV.
//! - `cargo run -p tollgate-bench --bin proto` regenerates `proto/helloworld.rs`.

use std::path::{Path, PathBuf};

pub mod chart;
pub mod proto;

/// The repository's root (the main crate's directory), where `docs/`, `proto/` and the
/// workspace's `target/` are.
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The seconds each measurement runs: `TOLLGATE_BENCH_SECS`, else `default`.
pub fn bench_secs(default: f64) -> f64 {
    std::env::var("TOLLGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The redis-cell module to load into the benches' server: `TOLLGATE_REDIS_CELL`, if set.
pub fn redis_cell() -> Option<String> {
    std::env::var("TOLLGATE_REDIS_CELL").ok()
}

/// A file under the workspace's `target/`, where the benches write their CSVs and charts.
pub fn target_file(name: &str) -> PathBuf {
    repo_root().join("target").join(name)
}
