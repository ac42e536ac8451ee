//! RedisStore throughput and latency against the raw ceiling, measured in the same run.
//!
//! `cargo bench --bench redis` starts its own `redis-server` (from `PATH`, or
//! `TOLLGATE_REDIS_SERVER`) on a free port and, for concurrency 1, 16 and 64 and for one and
//! three rules per request, measures:
//! - tollgate: `Limiter::check` through `RedisStore` (server time, every request admitted,
//!   so every rule writes);
//! - raw script: the same Lua script called straight through `redis::Script` with the same
//!   keys and arguments, no tollgate code;
//! - raw INCR: a plain `INCR` per request.
//!
//! Each line reports decisions per second, p50 / p99 latency, and the client process's CPU
//! time (user + system, from `/proc/self/stat`) divided by the requests.
//! `TOLLGATE_BENCH_SECS` sets the seconds per measurement (default 2).

#[path = "../tests/common/redis_server.rs"]
#[allow(unreachable_pub)]
mod redis_server;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tollgate::{Check, Limiter, Rate, RedisStore, Rule};

const KEYS: usize = 1000;

fn main() {
    let secs: f64 = std::env::var("TOLLGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let server = redis_server::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(&server, Duration::from_secs_f64(secs)));
}

struct Measured {
    /// Server-side µs per command of the measured path (`INFO commandstats`).
    server_us: f64,
    requests: u64,
    elapsed: Duration,
    cpu: Duration,
    latencies: Vec<Duration>,
}

impl Measured {
    fn per_sec(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }

    fn cpu_per_request_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.requests as f64
    }
}

/// The client process's user + system CPU time.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name and state.
    let total = ticks(11) + ticks(12);
    // Linux reports in USER_HZ, 100 per second on every common configuration.
    Duration::from_millis(total * 10)
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

/// Runs `concurrency` tasks, each calling `op(task, i)` back to back for `run_for`.
async fn measure<F, Fut>(
    server: &redis_server::RedisServer,
    command: &str,
    concurrency: usize,
    run_for: Duration,
    op: F,
) -> Measured
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    // Warm up (connections, script cache, allocator).
    for t in 0..concurrency {
        op(t, 0).await;
    }
    server.must(&["CONFIG", "RESETSTAT"]);
    let deadline = Instant::now() + run_for;
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 16);
            let mut i = 1;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                op(t, i).await;
                latencies.push(t0.elapsed());
                i += 1;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("bench task"));
    }
    let elapsed = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    latencies.sort_unstable();
    let server_us = server_usec_per_call(server, command);
    Measured {
        server_us,
        requests: latencies.len() as u64,
        elapsed,
        cpu,
        latencies,
    }
}

fn rules(n: usize) -> Vec<Rule> {
    let big = 1 << 30;
    let all = vec![
        Rule::gcra("api", Rate::per_second(big), big),
        Rule::fixed_window("minute", big, Duration::from_secs(60)),
        Rule::token_bucket("burst", big, Rate::per_second(big)),
    ];
    all.into_iter().take(n).collect()
}

fn key_of(task: usize, i: u64) -> Vec<u8> {
    format!("user-{}", (task * 7919 + i as usize) % KEYS).into_bytes()
}

/// The per-rule arguments tollgate sends for `rules` (see lua/batch.lua: nine
/// little-endian doubles), written out by hand.
fn raw_args(rules: &[Rule]) -> Vec<Vec<u8>> {
    let big = (1u64 << 30) as f64;
    rules
        .iter()
        .map(|r| {
            let fields: [f64; 9] = match r.name() {
                "api" => [6.0, 1.0, big, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                "minute" => [1.0, 1.0, big, 60e6, 0.0, 0.0, 0.0, 0.0, 0.0],
                _ => [4.0, 1.0, big, big, 1e6, 0.0, 0.0, 0.0, 0.0],
            };
            fields.iter().flat_map(|f| f.to_le_bytes()).collect()
        })
        .collect()
}

fn script() -> redis::Script {
    redis::Script::new(concat!(
        include_str!("../lua/prelude.lua"),
        include_str!("../lua/fixed_window.lua"),
        include_str!("../lua/sliding_log.lua"),
        include_str!("../lua/sliding_window.lua"),
        include_str!("../lua/token_bucket.lua"),
        include_str!("../lua/leaky_bucket.lua"),
        include_str!("../lua/gcra.lua"),
        include_str!("../lua/penalty.lua"),
        include_str!("../lua/batch.lua"),
    ))
}

fn row(what: &str, conc: usize, rules: &str, m: &Measured) {
    println!(
        "| {what} | {conc} | {rules} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
        m.per_sec(),
        m.percentile(0.50).as_secs_f64() * 1e6,
        m.percentile(0.99).as_secs_f64() * 1e6,
        m.cpu_per_request_us(),
        m.server_us,
    );
}

async fn run(server: &redis_server::RedisServer, run_for: Duration) {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the bench redis-server");
    let client = redis::Client::open(server.url()).expect("client");
    let raw = ConnectionManager::new(client)
        .await
        .expect("raw connection");
    let script = Arc::new(script());

    println!(
        "| path | concurrency | rules | decisions/s | p50 µs | p99 µs | client CPU µs/decision | server µs/call |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for conc in [1usize, 16, 64] {
        for n in [1usize, 3] {
            let rules = Arc::new(rules(n));
            let limiter = Limiter::new(store.clone());
            let tollgate = {
                let rules = rules.clone();
                measure(server, "evalsha", conc, run_for, move |t, i| {
                    let limiter = limiter.clone();
                    let rules = rules.clone();
                    async move {
                        let key = key_of(t, i);
                        let batch: Vec<Check<'_>> =
                            rules.iter().map(|r| Check::new(r, &key)).collect();
                        let outcome = limiter.check(&batch).await.expect("decided");
                        assert!(outcome.is_admitted());
                    }
                })
                .await
            };
            let args = Arc::new(raw_args(&rules));
            let names: Vec<String> = rules.iter().map(|r| r.name().to_owned()).collect();
            let raw_script = {
                let (raw, script) = (raw.clone(), script.clone());
                measure(server, "evalsha", conc, run_for, move |t, i| {
                    let (mut raw, script, args) = (raw.clone(), script.clone(), args.clone());
                    let key = String::from_utf8(key_of(t, i)).expect("ascii");
                    let keys: Vec<String> =
                        names.iter().map(|n| format!("raw:{{{key}}}:{n}")).collect();
                    async move {
                        let mut inv = script.prepare_invoke();
                        inv.arg("").arg(0).arg(0).arg(0).arg(0);
                        for (k, a) in keys.iter().zip(args.iter()) {
                            inv.key(k);
                            inv.arg(&a[..]);
                        }
                        let reply: Vec<i64> = inv.invoke_async(&mut raw).await.expect("raw");
                        assert_eq!(reply[0], 1);
                    }
                })
                .await
            };
            row("tollgate RedisStore", conc, &n.to_string(), &tollgate);
            row("raw same script", conc, &n.to_string(), &raw_script);
            ratios.push((conc, n, tollgate.per_sec() / raw_script.per_sec()));
        }
        let incr = {
            let raw = raw.clone();
            measure(server, "incr", conc, run_for, move |t, i| {
                let mut raw = raw.clone();
                let key = key_of(t, i);
                async move {
                    let _: i64 = redis::cmd("INCR")
                        .arg(key)
                        .query_async(&mut raw)
                        .await
                        .expect("incr");
                }
            })
            .await
        };
        row("raw INCR", conc, "-", &incr);
    }
    println!();
    for (conc, n, ratio) in ratios {
        println!("tollgate / raw same script, concurrency {conc}, {n} rule(s): {ratio:.2}x");
    }
}
