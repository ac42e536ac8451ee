//! RedisStore throughput and latency against the raw ceiling, measured in the same run.
//!
//! `cargo bench -p tollgate-bench --bench redis` starts its own `redis-server` (from `PATH`, or
//! `TOLLGATE_REDIS_SERVER`) on a free port and, for concurrency 1, 4, 16 and 64 and for one
//! and three rules per request, measures:
//! - tollgate per call: `Limiter::check` through a `RedisStore` with coalescing off (one
//!   `FCALL` per request; server time, every request admitted, so every rule writes);
//! - tollgate coalesced: the same through a default `RedisStore` (the batches of requests
//!   waiting at the same moment go out as one `FCALL`);
//! - raw same script: the same code as a script (`EVALSHA`, one batch per call) with the
//!   same keys and arguments, through `redis::Script`, no tollgate code;
//! - raw INCR: a plain `INCR` per request;
//! - redis-cell: `CL.THROTTLE` (a GCRA inside Redis, one rule), only when
//!   `TOLLGATE_REDIS_CELL=/path/libredis_cell.so` names the module to load.
//!
//! Each line reports decisions per second, p50 / p99 latency, the client process's CPU
//! time (user + system, from `/proc/self/stat`) divided by the decisions, and Redis's own
//! time in the measured commands (`INFO commandstats`) and the redis-server process's CPU
//! time (all of its work: sockets, parsing, commands), each divided by the decisions. The rows also go to
//! `target/bench-redis.csv` (path, rules, concurrency, decisions/s, …) for a chart.
//! `TOLLGATE_BENCH_SECS` sets the seconds per measurement (default 2);
//! `TOLLGATE_BENCH_CONCURRENCY` and `TOLLGATE_BENCH_RULES` (comma-separated) pick some of the
//! concurrencies (1, 4, 16, 64) and rule counts (1, 3). The requests spread over 1000 keys;
//! `TOLLGATE_BENCH_KEYS=1` puts every one on one hot key (a global limit: coalesced batches
//! on one key fold into one read and one write, lua/call.lua), its rows marked "one key";
//! `TOLLGATE_BENCH_KEYS=1000,1` measures both.

#[path = "support/redis_args.rs"]
mod redis_args;
#[path = "../../tests/support/redis_server.rs"]
#[allow(unreachable_pub)]
mod redis_server;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tollgate::{store::RedisStore, Check, Limiter, Rule};

use redis_args::{rules, sent_argument};

fn main() {
    let secs = tollgate_bench::bench_secs(2.0);
    let cell = tollgate_bench::redis_cell();
    let server = redis_server::RedisServer::start_with_module(cell.as_deref());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(&server, Duration::from_secs_f64(secs), cell.is_some()));
}

struct Measured {
    /// Redis's µs in the measured commands (`INFO commandstats`), in total.
    server_us: f64,
    requests: u64,
    elapsed: Duration,
    cpu: Duration,
    /// The redis-server process's CPU time over the run: unlike `server_us`, not inflated
    /// when the machine is busy and Redis is descheduled mid-command.
    redis_cpu: Duration,
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

    fn server_us_per_decision(&self) -> f64 {
        self.server_us / self.requests as f64
    }

    fn redis_cpu_per_request_us(&self) -> f64 {
        self.redis_cpu.as_secs_f64() * 1e6 / self.requests as f64
    }

    fn cpu_per_request_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.requests as f64
    }
}

/// The user + system CPU time of the process `pid` (`"self"`: the client).
fn process_cpu(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
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

/// `usec` (total µs) of `commands` in `INFO commandstats`.
fn server_usec(server: &redis_server::RedisServer, commands: &[&str]) -> f64 {
    let stats = server.must(&["INFO", "commandstats"]);
    commands
        .iter()
        .map(|command| {
            let prefix = format!("cmdstat_{command}:");
            stats
                .lines()
                .find_map(|l| l.trim().strip_prefix(&prefix))
                .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("usec=")))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum()
}

/// Runs `concurrency` tasks, each calling `op(task, i)` back to back for `run_for`.
async fn measure<F, Fut>(
    server: &redis_server::RedisServer,
    commands: &[&str],
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
    let redis_pid = server.pid().to_string();
    let cpu_before = process_cpu("self");
    let redis_cpu_before = process_cpu(&redis_pid);
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
    let cpu = process_cpu("self").saturating_sub(cpu_before);
    let redis_cpu = process_cpu(&redis_pid).saturating_sub(redis_cpu_before);
    latencies.sort_unstable();
    let server_us = server_usec(server, commands);
    Measured {
        server_us,
        requests: latencies.len() as u64,
        elapsed,
        cpu,
        redis_cpu,
        latencies,
    }
}

/// Task `task`'s `i`-th key of `keys`.
fn key_of(keys: usize, task: usize, i: u64) -> Vec<u8> {
    format!("user-{}", (task * 7919 + i as usize) % keys).into_bytes()
}

/// The store's own code as a script.
fn script() -> redis::Script {
    redis::Script::new(&RedisStore::lua_source(None, |_, text| text.to_owned()))
}

struct Rows {
    csv: String,
}

impl Rows {
    fn row(&mut self, what: &str, conc: usize, rules: &str, m: &Measured) {
        println!(
            "| {what} | {conc} | {rules} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} |",
            m.per_sec(),
            m.percentile(0.50).as_secs_f64() * 1e6,
            m.percentile(0.99).as_secs_f64() * 1e6,
            m.cpu_per_request_us(),
            m.server_us_per_decision(),
            m.redis_cpu_per_request_us(),
        );
        self.csv.push_str(&format!(
            "{what},{rules},{conc},{:.0},{:.1},{:.1},{:.3},{:.3},{:.3}\n",
            m.per_sec(),
            m.percentile(0.50).as_secs_f64() * 1e6,
            m.percentile(0.99).as_secs_f64() * 1e6,
            m.cpu_per_request_us(),
            m.server_us_per_decision(),
            m.redis_cpu_per_request_us(),
        ));
    }
}

/// The comma-separated numbers in the environment variable `var`, or `default`.
fn list(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// One request through `limiter` for task `t`'s `i`-th key of `keys`, every rule admitted.
async fn check(limiter: Limiter<RedisStore>, rules: Arc<Vec<Rule>>, keys: usize, t: usize, i: u64) {
    let key = key_of(keys, t, i);
    let batch: Vec<Check<'_>> = rules.iter().map(|r| Check::new(r, &key)).collect();
    let outcome = limiter.check(&batch).await.expect("decided");
    assert!(outcome.is_admitted());
}

/// What every measurement shares: the server, the stores and the raw connection.
struct Bench<'a> {
    server: &'a redis_server::RedisServer,
    run_for: Duration,
    cell: bool,
    per_call: RedisStore,
    store: RedisStore,
    raw: ConnectionManager,
    script: Arc<redis::Script>,
}

async fn run(server: &redis_server::RedisServer, run_for: Duration, cell: bool) {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the bench redis-server");
    // The connect's dry decision went through FCALL.
    assert!(
        server.calls("fcall") > 0,
        "the bench needs Redis 7 (functions)"
    );
    let client = redis::Client::open(server.url()).expect("client");
    let bench = Bench {
        server,
        run_for,
        cell,
        per_call: store.clone().with_coalescing(false),
        store,
        raw: ConnectionManager::new(client)
            .await
            .expect("raw connection"),
        script: Arc::new(script()),
    };
    let mut rows = Rows {
        csv: "path,rules,concurrency,decisions_per_s,p50_us,p99_us,client_cpu_us,redis_us,redis_cpu_us\n"
            .to_owned(),
    };

    println!(
        "| path | concurrency | rules | decisions/s | p50 µs | p99 µs | client CPU µs/decision | Redis µs/decision | Redis CPU µs/decision |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for keys in list("TOLLGATE_BENCH_KEYS", &[1000]) {
        for conc in list("TOLLGATE_BENCH_CONCURRENCY", &[1, 4, 16, 64]) {
            bench.rows_at(keys, conc, &mut rows, &mut ratios).await;
        }
    }
    if !cell {
        println!(
            "\n(redis-cell row skipped: set TOLLGATE_REDIS_CELL=/path/libredis_cell.so to load it)"
        );
    }
    println!();
    for (what, conc, n, ratio) in ratios {
        println!(
            "tollgate coalesced / per call{what}, concurrency {conc}, {n} rule(s): {ratio:.2}x"
        );
    }
    let csv = tollgate_bench::target_file("bench-redis.csv");
    match std::fs::write(&csv, &rows.csv) {
        Ok(()) => println!("rows written to {}", csv.display()),
        Err(e) => println!("could not write {}: {e}", csv.display()),
    }
}

impl Bench<'_> {
    /// Every path's row at `conc` tasks on `keys` keys.
    async fn rows_at(
        &self,
        keys: usize,
        conc: usize,
        rows: &mut Rows,
        ratios: &mut Vec<(&'static str, usize, usize, f64)>,
    ) {
        let (server, run_for) = (self.server, self.run_for);
        // The rows on one hot key say so.
        let on = if keys == 1 { " (one key)" } else { "" };
        for n in list("TOLLGATE_BENCH_RULES", &[1, 3]) {
            let rules = Arc::new(rules(n));
            let mut tollgate = Vec::new();
            for s in [&self.per_call, &self.store] {
                let limiter = Limiter::new(s.clone());
                let rules = rules.clone();
                tollgate.push(
                    measure(server, &["fcall"], conc, run_for, move |t, i| {
                        check(limiter.clone(), rules.clone(), keys, t, i)
                    })
                    .await,
                );
            }
            let argument = Arc::new(sent_argument(&server.url(), &rules).await);
            let names: Vec<String> = rules.iter().map(|r| r.name().to_owned()).collect();
            let raw_script = {
                let (raw, script) = (self.raw.clone(), self.script.clone());
                measure(server, &["evalsha"], conc, run_for, move |t, i| {
                    let (mut raw, script) = (raw.clone(), script.clone());
                    let argument = argument.clone();
                    let key = String::from_utf8(key_of(keys, t, i)).expect("ascii");
                    let keys: Vec<String> =
                        names.iter().map(|n| format!("raw:{{{key}}}:{n}")).collect();
                    async move {
                        let mut inv = script.prepare_invoke();
                        for k in &keys {
                            inv.key(k);
                        }
                        inv.arg(argument.as_slice());
                        // One flat array for the call (lua/call.lua), here of one batch:
                        // its opening (odd: admitted; over 4, the values per rule), now, the
                        // wait, then per rule its values (lua/record.lua's reply).
                        let reply: Vec<i64> = inv.invoke_async(&mut raw).await.expect("raw");
                        let width = reply[0] as usize / 4;
                        assert_eq!(reply.len(), 3 + width * keys.len(), "{reply:?}");
                        assert_eq!(reply[0] % 2, 1, "{reply:?}");
                    }
                })
                .await
            };
            let n_text = n.to_string();
            rows.row(
                &format!("tollgate per call{on}"),
                conc,
                &n_text,
                &tollgate[0],
            );
            rows.row(
                &format!("tollgate coalesced{on}"),
                conc,
                &n_text,
                &tollgate[1],
            );
            rows.row(&format!("raw same script{on}"), conc, &n_text, &raw_script);
            ratios.push((on, conc, n, tollgate[1].per_sec() / tollgate[0].per_sec()));
        }
        let incr = {
            let raw = self.raw.clone();
            measure(server, &["incr"], conc, run_for, move |t, i| {
                let mut raw = raw.clone();
                let key = key_of(keys, t, i);
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
        rows.row(&format!("raw INCR{on}"), conc, "-", &incr);
        if self.cell {
            let raw = self.raw.clone();
            let cell = measure(server, &["cl.throttle"], conc, run_for, move |t, i| {
                let mut raw = raw.clone();
                let key = key_of(keys, t, i);
                async move {
                    // max_burst 2^30, 1,000,000 per second: never limited here, and an
                    // emission interval (1 µs) redis-cell can hold in whole nanoseconds
                    // (2^30 per second rounds to 0, which it refuses).
                    let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg(key)
                        .arg(1u64 << 30)
                        .arg(1_000_000)
                        .arg(1)
                        .query_async(&mut raw)
                        .await
                        .expect("CL.THROTTLE");
                    assert_eq!(reply[0], 0, "redis-cell limited");
                }
            })
            .await;
            rows.row(&format!("redis-cell CL.THROTTLE{on}"), conc, "1", &cell);
        }
    }
}
