//! Leases on one hot key (#38.3): three instances, each its own connection to one
//! `redis-server`, 16 tasks each, deciding one GCRA rule on one key far under its limit.
//!
//! `cargo bench -p tollgate-bench --bench lease` prints decisions per second and Redis calls
//! per 1,000 decisions (`INFO stats` `total_commands_processed`) for: three `Leased`
//! instances (leases of 500 units, 200 ms), three plain `RedisStore` instances, and
//! redis-cell's `CL.THROTTLE` over three connections, when `TOLLGATE_REDIS_CELL` names the
//! module. `TOLLGATE_BENCH_SECS` sets the seconds per measurement (default 2).

#[path = "../../tests/support/redis_server.rs"]
#[allow(unreachable_pub)]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::{Leased, RedisStore, Store};
use tollgate::{Check, Limiter, Rate, Rule};

const INSTANCES: usize = 3;
const TASKS: usize = 16;

fn main() {
    let secs = tollgate_bench::bench_secs(2.0);
    let cell = tollgate_bench::redis_cell();
    let server = redis_server::RedisServer::start_with_module(cell.as_deref());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let run = Duration::from_secs_f64(secs);
    rt.block_on(async {
        let url = server.url();
        let rule = Rule::gcra("hot", 1_000_000, Rate::per_second(10_000_000));
        let mut leased = Vec::new();
        let mut plain = Vec::new();
        for _ in 0..INSTANCES {
            let store = RedisStore::connect(&url).await.expect("connect");
            let store = Leased::new(store).lease(&rule, 500, Duration::from_millis(200));
            leased.push(Limiter::new(store.expect("lease")));
            plain.push(Limiter::new(
                RedisStore::connect(&url).await.expect("connect"),
            ));
        }
        report("tollgate leased", &server, hammer(&leased, &rule, run)).await;
        report("tollgate plain", &server, hammer(&plain, &rule, run)).await;
        if cell.is_some() {
            report("redis-cell", &server, cell_hammer(&url, run)).await;
        }
    });
}

/// Runs `work`, printing its decisions per second and Redis's commands per 1,000 of them.
async fn report(
    name: &str,
    server: &redis_server::RedisServer,
    work: impl std::future::Future<Output = (u64, Duration)>,
) {
    let before = commands(server);
    let (decided, elapsed) = work.await;
    let calls = commands(server).saturating_sub(before);
    println!(
        "{name:<16} {:>10.0} decisions/s  {:>8.1} Redis calls per 1,000 decisions",
        decided as f64 / elapsed.as_secs_f64(),
        calls as f64 * 1_000.0 / decided.max(1) as f64
    );
}

fn commands(server: &redis_server::RedisServer) -> u64 {
    let stats = server.must(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

async fn hammer<S: Store + Clone>(
    instances: &[Limiter<S>],
    rule: &Rule,
    run: Duration,
) -> (u64, Duration) {
    let decided = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for limiter in instances {
        for _ in 0..TASKS {
            let (limiter, rule, decided) = (limiter.clone(), rule.clone(), decided.clone());
            tasks.push(tokio::spawn(async move {
                let batch = [Check::new(&rule, b"all")];
                let mut n = 0;
                while started.elapsed() < run {
                    assert!(limiter.check(&batch).await.expect("decide").is_admitted());
                    n += 1;
                }
                decided.fetch_add(n, Ordering::Relaxed);
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    (decided.load(Ordering::Relaxed), started.elapsed())
}

async fn cell_hammer(url: &str, run: Duration) -> (u64, Duration) {
    let decided = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let client = redis::Client::open(url).expect("url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        for _ in 0..TASKS {
            let (mut conn, decided) = (conn.clone(), decided.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while started.elapsed() < run {
                    let _: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg(&["cell-hot", "1000000", "10000000", "1", "1"])
                        .query_async(&mut conn)
                        .await
                        .expect("CL.THROTTLE");
                    n += 1;
                }
                decided.fetch_add(n, Ordering::Relaxed);
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    (decided.load(Ordering::Relaxed), started.elapsed())
}
