//! Many clients on one key: tasks over several connections, and two OS processes, admit
//! exactly the limit (no over-admission from races, no under-admission from lost updates).

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::vectors::BASE_MICROS;
use tollgate::{store::RedisStore, Limiter, ManualClock, Rule};

const WORKER_ENV: &str = "TOLLGATE_CONCURRENCY_WORKER_URL";
const START_ENV: &str = "TOLLGATE_CONCURRENCY_WORKER_START_MS";

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Each of `tasks` tasks (spread over the given limiters) tries `attempts` times; returns
/// how many were admitted.
async fn hammer(
    limiters: &[Limiter<RedisStore>],
    rule: &Rule,
    tasks: usize,
    attempts: usize,
) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let limiter = limiters[t % limiters.len()].clone();
        let rule = rule.clone();
        let admitted = admitted.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..attempts {
                let outcome = limiter.check_one(&rule, b"hot").await.expect("decided");
                if outcome.is_admitted() {
                    admitted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    admitted.load(Ordering::SeqCst)
}

async fn limiters(
    server: &RedisServer,
    n: usize,
    clock: Option<&ManualClock>,
) -> Vec<Limiter<RedisStore>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let store = RedisStore::connect(&server.url()).await.expect("connect");
        out.push(Limiter::new(match clock {
            Some(c) => store.with_clock(c.clone()),
            None => store,
        }));
    }
    out
}

fn rules(limit: u64) -> [Rule; 2] {
    let hour = Duration::from_secs(3600);
    [
        // First-hit anchored, so no window boundary falls inside the test.
        Rule::fixed_window_from_first_hit("fixed", limit, hour),
        Rule::sliding_log("log", limit, hour),
    ]
}

/// Many tasks over several connections admit exactly the limit, whether their requests
/// spread over time or share one instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_over_four_connections_admit_exactly_the_limit() {
    let server = RedisServer::start();
    // Server time: requests spread over real microseconds.
    let on_server_time = limiters(&server, 4, None).await;
    for rule in rules(60) {
        let admitted = hammer(&on_server_time, &rule, 16, 8).await;
        assert_eq!(admitted, 60, "{}", rule.name());
    }
    // One frozen instant: every request shares a microsecond (sliding log entries merge).
    server.must(&["FLUSHALL"]);
    let clock = ManualClock::new(BASE_MICROS);
    let frozen = limiters(&server, 4, Some(&clock)).await;
    for rule in rules(60) {
        let admitted = hammer(&frozen, &rule, 16, 8).await;
        assert_eq!(admitted, 60, "{} at one instant", rule.name());
    }
}

/// Two processes on one Redis share one limit: together they admit exactly its quota.
#[test]
fn two_processes_share_one_limit() {
    let server = RedisServer::start();
    let exe = std::env::current_exe().expect("test binary path");
    // Both start at the same instant, so their requests interleave on the server.
    let start_at = unix_millis() + 500;
    let spawned: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .arg(crate::support::test_name(module_path!(), "worker_process"))
                .args(["--exact", "--nocapture", "--test-threads=1"])
                .env(WORKER_ENV, server.url())
                .env(START_ENV, start_at.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    let children: Vec<_> = spawned
        .into_iter()
        .map(|c| c.wait_with_output().expect("worker output"))
        .collect();
    let mut total = 0;
    for out in &children {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "worker failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("admitted=").map(|(_, n)| n))
            .unwrap_or_else(|| panic!("worker printed no count: {stdout}"));
        total += line.trim().parse::<u64>().expect("a count");
    }
    // Each rule: 2 processes × 8 tasks × 10 attempts = 160 tries for 50 units.
    assert_eq!(total, 2 * 50);
}

/// The body of one process of `two_processes_share_one_limit`; does nothing unless that test
/// started it (it needs the server's address).
#[test]
fn worker_process() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let admitted = rt.block_on(async {
        let mut limiters = Vec::new();
        for _ in 0..2 {
            limiters.push(Limiter::new(
                RedisStore::connect(&url).await.expect("connect"),
            ));
        }
        let start_ms: u64 = std::env::var(START_ENV).map_or(0, |s| s.parse().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(
            start_ms.saturating_sub(unix_millis()),
        ))
        .await;
        let mut total = 0;
        for rule in rules(50) {
            total += hammer(&limiters, &rule, 8, 10).await;
        }
        total
    });
    println!("admitted={admitted}");
}
