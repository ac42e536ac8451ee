//! Rules from a file, changed live: an axum server whose limits come from
//! `examples/rules.toml` (or the file `RULES` names), reloaded when the file changes (its
//! modification time is polled once a second) or, on unix, on `SIGHUP`. A file with a
//! mistake is refused and logged with the file, line and field of each problem; the running
//! rules stay until a good file replaces them. Requests in flight finish under the rules
//! they started with.
//!
//! Run `cargo run --example reload`, then try the printed curl lines, edit the file (change
//! `sms-min`'s limit to 3, say, or break it on purpose) and watch the log. `PORT` picks the
//! port (default 3000); `RUST_LOG` what is logged (default `info`).
//!
//! The file names one key extractor the code provides, `api-key`: closures cannot come
//! from a file, so the code registers them on the `Loader` by name.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use axum::routing::{get, post};
use axum::Router;
use tollgate::layer::rules_file::Loader;
use tollgate::layer::{RateLimitLayer, ReloadHandle};
use tollgate::{
    key,
    store::{MemoryStore, Store},
    ConfigError, Limiter,
};

/// What the code gives the file: the key extractors (and plan lookups) it names.
pub fn loader() -> Loader {
    Loader::new().key("api-key", key::header("x-api-key"))
}

/// The layer of the rules in `path`, reloadable, and its handle.
pub fn load<St: Store + Clone>(
    loader: &Loader,
    path: &Path,
    limiter: Limiter<St>,
) -> Result<(RateLimitLayer<St>, ReloadHandle<St>), ConfigError> {
    Ok(loader
        .load(path, RateLimitLayer::builder().limiter(limiter))?
        .reloadable())
}

/// Reads `path` again and installs its rules; a file with a problem is logged and the
/// running rules stay. Whether the rules were replaced.
pub fn reload<St: Store + Clone>(loader: &Loader, path: &Path, handle: &ReloadHandle<St>) -> bool {
    match loader.load(path, handle.builder()) {
        Ok(layer) => {
            handle.reload(layer);
            tracing::info!(path = %path.display(), "rate limit rules reloaded");
            true
        }
        Err(error) => {
            tracing::error!(%error, "rate limit rules not reloaded; the running rules stay");
            false
        }
    }
}

/// What tells one version of the file from the next.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Reloads `path` whenever its modification time or length changes (checked every
/// `interval`) and, on unix, on `SIGHUP`. Runs until the task is dropped.
pub async fn watch<St: Store + Clone>(
    loader: Loader,
    path: PathBuf,
    handle: ReloadHandle<St>,
    interval: Duration,
) {
    // The first tick (at once) reloads: the file may have changed since it was loaded.
    // Rules that did not change keep their state (state is kept by rule name).
    let mut seen = None;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    #[cfg(unix)]
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| tracing::warn!(error = %e, "no SIGHUP reloads: cannot listen for it"))
        .ok();
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hangups.as_mut() {
                Some(signals) => signals.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<Option<()>>();
        tokio::select! {
            _ = ticks.tick() => {
                let now = stamp(&path);
                if now != seen {
                    seen = now;
                    reload(&loader, &path, &handle);
                }
            }
            _ = hangup => {
                seen = stamp(&path);
                reload(&loader, &path, &handle);
            }
        }
    }
}

/// The rules file beside this example (whose package, tollgate-examples, is examples-build/).
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/rules.toml");

#[allow(dead_code)] // Tests include this file for `load`, `reload` and `watch`.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let path = std::env::var_os("RULES").map_or_else(|| PathBuf::from(RULES), PathBuf::from);
    let loader = loader();
    // At start, a file with a problem stops the server with every problem listed.
    let (limits, handle) = load(&loader, &path, Limiter::new(MemoryStore::new()))?;
    tokio::spawn(watch(loader, path.clone(), handle, Duration::from_secs(1)));

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/sms/send", post(|| async { "sent\n" }))
        .route("/api/{*rest}", get(|| async { "api\n" }))
        .layer(limits);
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "rules from {}; edit it, or send SIGHUP, to reload",
        path.display()
    );
    println!("try: curl -i -X POST -H 'user-id: 42' http://127.0.0.1:{port}/sms/send");
    println!("     curl -i -H 'x-api-key: k1' -H 'x-plan: pro' http://127.0.0.1:{port}/api/x");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
