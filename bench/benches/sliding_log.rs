//! Server time per sliding-log decision in Redis as the log grows: 10, 10^3, 10^5 and 10^6
//! entries.
//!
//! `cargo bench -p tollgate-bench --bench sliding_log` starts its own `redis-server` (from
//! `PATH`, or `TOLLGATE_REDIS_SERVER`) on a free port. For each size n it fills the log of a
//! rule of limit n per hour with n entries of one unit spread evenly over the window (written
//! with `ZADD` in the format of `lua/sliding_log.lua`, so filling 10^6 entries takes seconds,
//! not a million script calls), checks that tollgate reads it as full, then measures through
//! `Limiter::check` on a `RedisStore` with a manual clock:
//! - denied, cost 1: the log is full (the common denial: the oldest entry frees the unit);
//! - denied, cost n/2: half the log must age out (a binary search over the log);
//! - peek, cost 0: the quota as it stands;
//! - admitted, cost 1: the clock moves one spacing per call, so each call finds one entry
//!   expired, prunes it and logs its own: the log stays at n entries, as under a client
//!   sending exactly at its limit.
//!
//! Each row reports `usec_per_call` of `EVALSHA` from `INFO commandstats` (wall time of the
//! whole script, Redis commands inside it included), the Redis main thread's CPU time per
//! call from `INFO cpu` (which, unlike wall time, a loaded machine does not inflate; it
//! includes reading the request and writing the reply), the log's size and
//! `MEMORY USAGE` afterwards. Before each size, a row measures an admitted one-rule GCRA
//! check the same way: the floor every script call pays whatever the algorithm, read again
//! each time because a shared machine's load moves it.
//! `TOLLGATE_BENCH_CALLS` sets the calls per measurement (default 2000).

#[path = "../../tests/support/redis_server.rs"]
#[allow(unreachable_pub)]
mod redis_server;

use std::time::Duration;

use redis::aio::ConnectionManager;
use tollgate::{
    store::{RedisOptions, RedisStore},
    Check, Decision, Limiter, ManualClock, Rate, Rule,
};

const WINDOW: Duration = Duration::from_secs(3600);
/// 20,000 days after the epoch, as in the test vectors.
const T0: u64 = 20_000 * 86_400 * 1_000_000;

fn main() {
    let calls: u64 = std::env::var("TOLLGATE_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let server = redis_server::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(&server, calls));
}

/// `usec_per_call` of `command` in `INFO commandstats`.
fn server_usec_per_call(server: &redis_server::RedisServer, command: &str) -> f64 {
    let stats = server.must(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Seconds of CPU the Redis main thread has used (user + system).
fn server_main_thread_cpu(server: &redis_server::RedisServer) -> f64 {
    let info = server.must(&["INFO", "cpu"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    field("used_cpu_user_main_thread:") + field("used_cpu_sys_main_thread:")
}

/// Server time of `calls` script calls made by `op`: (wall µs per call from
/// `INFO commandstats`, main-thread CPU µs per call).
async fn server_time<F, Fut>(
    server: &redis_server::RedisServer,
    calls: u64,
    mut op: F,
) -> (f64, f64)
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    server.must(&["CONFIG", "RESETSTAT"]);
    let cpu_before = server_main_thread_cpu(server);
    for i in 0..calls {
        op(i).await;
    }
    let cpu = server_main_thread_cpu(server) - cpu_before;
    (
        server_usec_per_call(server, "evalsha"),
        cpu * 1e6 / calls as f64,
    )
}

/// Writes `n` one-unit entries, `spacing` µs apart from `T0`, as `lua/sliding_log.lua`
/// stores them: member `<instant>:<cost>:<running total>` scored by the instant.
async fn fill(conn: &mut ConnectionManager, key: &str, n: u64, spacing: u64) {
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("del");
    let mut i = 0;
    while i < n {
        let end = (i + 10_000).min(n);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(key);
        for j in i..end {
            let at = T0 + j * spacing;
            zadd.arg(at).arg(format!("{at}:1:{}", j + 1));
        }
        let _: u64 = zadd.query_async(conn).await.expect("zadd");
        i = end;
    }
}

async fn zcard(conn: &mut ConnectionManager, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("zcard")
}

async fn memory_usage(conn: &mut ConnectionManager, key: &str) -> u64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .unwrap_or(0)
}

fn row(n: &str, what: &str, (wall, cpu): (f64, f64), entries: u64, bytes: u64) {
    println!(
        "| {n} | {what} | {wall:.1} | {cpu:.1} | {entries} | {:.1} |",
        bytes as f64 / (1 << 20) as f64
    );
}

async fn run(server: &redis_server::RedisServer, calls: u64) {
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect_with(&server.url(), RedisOptions::new().prefix("bench"))
        .await
        .expect("connect to the bench redis-server")
        .with_clock(clock.clone());
    let limiter = Limiter::new(store);
    let client = redis::Client::open(server.url()).expect("client");
    let mut conn = ConnectionManager::new(client)
        .await
        .expect("raw connection");
    let window = WINDOW.as_micros() as u64;

    println!(
        "| entries | call | server µs/call (wall) | server CPU µs/call | entries after | log MiB after |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    let big = 1 << 30;
    let floor = Rule::gcra("floor", big, Rate::per_second(big));
    let limiter_ref = &limiter;

    for n in [10u64, 1_000, 100_000, 1_000_000] {
        let rule = Rule::sliding_log("log", n, WINDOW);
        let user = format!("n{n}");
        let key = format!("bench:{{{user}}}:log/log");
        let spacing = window / n;
        fill(&mut conn, &key, n, spacing).await;
        let full_at = T0 + window - 1;

        // The filled log reads as full, and a retry is exact: the oldest entry frees a unit
        // one µs later.
        clock.set_micros(full_at);
        let outcome = limiter.check_one(&rule, &user).await.expect("decided");
        match outcome.decision {
            Decision::Deny(d) => assert_eq!(d.retry_after, Some(Duration::from_micros(1))),
            other => panic!("a full log of {n} admitted: {other:?}"),
        }

        let (rule_ref, user_ref) = (&rule, &user);
        let denied = |cost: u64| {
            server_time(server, calls, move |_| async move {
                let outcome = limiter_ref
                    .check(&[Check::new(rule_ref, user_ref.as_bytes()).with_cost(cost)])
                    .await
                    .expect("decided");
                assert!(!outcome.is_admitted(), "a full log admitted cost {cost}");
            })
        };
        let size = n.to_string();
        // The floor again before every size: the machine's load moves it.
        let gcra = server_time(server, calls, |i| {
            let (floor, clock) = (&floor, &clock);
            async move {
                clock.set_micros(T0 + i);
                let outcome = limiter_ref
                    .check_one(floor, "floor")
                    .await
                    .expect("decided");
                assert!(outcome.is_admitted());
            }
        })
        .await;
        row(&size, "GCRA, admitted (floor)", gcra, 0, 0);
        let entries = zcard(&mut conn, &key).await;
        let bytes = memory_usage(&mut conn, &key).await;
        row(&size, "denied, cost 1", denied(1).await, entries, bytes);
        row(
            &size,
            "denied, cost n/2",
            denied(n / 2).await,
            entries,
            bytes,
        );
        let peek = server_time(server, calls, |_| async move {
            let info = limiter_ref
                .peek(rule_ref, user_ref, 0)
                .await
                .expect("peeked");
            assert_eq!(info.info.remaining, 0);
        })
        .await;
        row(&size, "peek, cost 0", peek, entries, bytes);

        let admitted = server_time(server, calls, |i| {
            let clock = &clock;
            async move {
                clock.set_micros(T0 + window + i * spacing);
                let outcome = limiter_ref
                    .check_one(rule_ref, user_ref)
                    .await
                    .expect("decided");
                assert!(outcome.is_admitted(), "call {i} on a log of {n}");
            }
        })
        .await;
        let entries = zcard(&mut conn, &key).await;
        let bytes = memory_usage(&mut conn, &key).await;
        row(&size, "admitted, cost 1", admitted, entries, bytes);
        let _: () = redis::cmd("UNLINK")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("unlink");
    }
}
