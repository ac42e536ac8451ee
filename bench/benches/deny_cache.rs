//! The deny cache's cached denials per second in one process: a `RedisStore` with
//! `with_deny_cache` on a `redis-server` started here, one GCRA rule, one key pushed into
//! denial (its denial cached for an hour), then `Limiter::check` on that key timed, every
//! answer a cached denial (no Redis call: the server's `total_commands_processed` is read
//! before and after to show it).
//!
//! `cargo bench -p tollgate-bench --bench deny_cache`; `TOLLGATE_BENCH_N` requests per
//! round (default 2,000,000), `TOLLGATE_BENCH_ROUNDS` rounds (default 5),
//! `TOLLGATE_BENCH_KEYS` denied keys cycled through (default 1), `TOLLGATE_BENCH_KEY_LEN`
//! bytes per key (default 1; a long key is kept as its digest), `TOLLGATE_BENCH_TASKS`
//! tasks sharing the limiter on as many runtime threads (default 1: a current-thread
//! runtime).

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{store::RedisStore, Check, Limiter, Rate, Rule};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n = env("TOLLGATE_BENCH_N", 2_000_000);
    let rounds = env("TOLLGATE_BENCH_ROUNDS", 5);
    let server = redis_server::RedisServer::start();
    let tasks = env("TOLLGATE_BENCH_TASKS", 1).max(1);
    let rt = if tasks == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(tasks as usize)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    rt.block_on(async {
        let store = RedisStore::connect(&server.url())
            .await
            .expect("connect")
            .with_deny_cache(1 << 20)
            .await
            .expect("subscribe");
        let limiter = Limiter::new(store);
        let rule = Arc::new(Rule::gcra(
            "deny",
            1,
            Rate::new(1, Duration::from_secs(3_600)),
        ));
        let keys: Arc<Vec<Vec<u8>>> = Arc::new(
            (0..env("TOLLGATE_BENCH_KEYS", 1))
                .map(|i| {
                    let mut key = format!("k{i}").into_bytes();
                    key.resize(
                        env("TOLLGATE_BENCH_KEY_LEN", 1).max(key.len() as u64) as usize,
                        b'.',
                    );
                    key
                })
                .collect(),
        );
        for key in keys.iter() {
            let batch = [Check::new(&rule, key)];
            assert!(limiter.check(&batch).await.expect("decided").is_admitted());
            assert!(!limiter.check(&batch).await.expect("decided").is_admitted());
        }
        let commands = || {
            let out = std::process::Command::new(
                std::env::var("TOLLGATE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into()),
            )
            .args(["-p", &server.port.to_string(), "INFO", "stats"])
            .output()
            .expect("redis-cli");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("total_commands_processed:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let before = commands();
        for round in 0..rounds {
            let start = Instant::now();
            let mut handles = Vec::new();
            for _ in 0..tasks {
                let (limiter, rule, keys) = (limiter.clone(), Arc::clone(&rule), Arc::clone(&keys));
                handles.push(tokio::spawn(async move {
                    let mut denied = 0u64;
                    for i in 0..n / tasks {
                        let key = &keys[i as usize % keys.len()];
                        let batch = [Check::new(&rule, black_box(key))];
                        let outcome = limiter.check(black_box(&batch)).await.expect("decided");
                        denied += u64::from(!outcome.is_admitted());
                    }
                    denied
                }));
            }
            let mut denied = 0u64;
            for handle in handles {
                denied += handle.await.expect("task");
            }
            let n = n / tasks * tasks;
            let secs = start.elapsed().as_secs_f64();
            assert_eq!(denied, n, "every answer a denial");
            println!(
                "round {round}: {:.2}M cached denials/s ({:.1} ns each)",
                n as f64 / secs / 1e6,
                secs * 1e9 / n as f64
            );
        }
        // One INFO call between the two reads is counted.
        println!(
            "Redis commands during the rounds: {}",
            commands() - before - 1
        );
    });
}
