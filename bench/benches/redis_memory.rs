//! Redis memory per key for each of the six algorithms, to size a Redis for tollgate.
//!
//! `cargo bench -p tollgate-bench --bench redis_memory` starts its own `redis-server` and,
//! per algorithm, decides one request on each of 10,000 client keys (1,000 for the
//! 100-request log), then prints:
//! - `MEMORY USAGE` of one rule's key (`SAMPLES 0`: the key, its value and Redis's object
//!   overhead, not the dictionary entries around it);
//! - the growth of `used_memory` divided by the keys: what a key really costs, with the
//!   keyspace and expiry dictionary entries (every tollgate key carries a TTL);
//! - for the sliding log, the same with 1 and with 100 requests logged per key (its sorted
//!   set holds one member per distinct instant).
//!
//! Keys are `tollgate:{user-NNNNN}:<rule>` (a 10-byte client key, a short rule name), so
//! longer client keys add their length (twice: key name, and a log's second key).

#[path = "../../tests/support/redis_server.rs"]
#[allow(unreachable_pub)]
mod redis_server;

use std::time::Duration;

use tollgate::{store::RedisStore, Limiter, Penalty, Rate, Rule};

const KEYS: usize = 10_000;

fn main() {
    let server = redis_server::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(&server));
}

fn used_memory(server: &redis_server::RedisServer) -> i64 {
    let info = server.must(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.trim().strip_prefix("used_memory:"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn key(i: usize) -> Vec<u8> {
    format!("user-{i:05}").into_bytes()
}

async fn run(server: &redis_server::RedisServer) {
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store);
    let hour = Duration::from_secs(3600);
    let rows: Vec<(&str, Rule, usize)> = vec![
        ("fixed window", Rule::fixed_window("r", 1000, hour), 1),
        ("sliding window", Rule::sliding_window("r", 1000, hour), 1),
        (
            "token bucket",
            Rule::token_bucket("r", 1000, Rate::per_hour(1000)),
            1,
        ),
        (
            "leaky bucket",
            Rule::leaky_bucket("r", 1000, Rate::per_hour(1000)),
            1,
        ),
        ("GCRA", Rule::gcra("r", 1000, Rate::per_hour(1000)), 1),
        (
            "GCRA + penalty",
            Rule::gcra("r", 1000, Rate::per_hour(1000))
                .with_penalty(Penalty::lock_for(hour).after(5).within(hour)),
            1,
        ),
        (
            "sliding log, 1 logged",
            Rule::sliding_log("r", 1000, hour),
            1,
        ),
        (
            "sliding log, 100 logged",
            Rule::sliding_log("r", 1000, hour),
            100,
        ),
    ];
    println!("| algorithm | MEMORY USAGE of the rule's key (bytes) | log key (bytes) | used_memory per client key (bytes) |");
    println!("|---|---:|---:|---:|");
    for (name, rule, per_key) in rows {
        server.must(&["FLUSHALL"]);
        let before = used_memory(server);
        // Fewer keys where each logs many requests (a round trip apart, so each is a
        // member of its own).
        let keys = if per_key > 1 { KEYS / 10 } else { KEYS };
        for i in 0..keys {
            let k = key(i);
            for _ in 0..per_key {
                let outcome = limiter.check_one(&rule, &k).await.expect("decided");
                assert!(outcome.is_admitted());
            }
        }
        let after = used_memory(server);
        let one = "tollgate:{user-00042}:r";
        let usage = server.must(&["MEMORY", "USAGE", one, "SAMPLES", "0"]);
        let log = server.must(&[
            "MEMORY",
            "USAGE",
            "tollgate:{user-00042}:r/log",
            "SAMPLES",
            "0",
        ]);
        let log = if log.trim().is_empty() {
            "-".to_owned()
        } else {
            log.trim().to_owned()
        };
        println!(
            "| {name} | {} | {log} | {} |",
            usage.trim(),
            (after - before) / keys as i64
        );
    }
}
