//! Leases on one hot key (#38.3, #47): three instances, each its own connection to one
//! `redis-server`, 16 or 64 tasks each, deciding one GCRA rule on one key.
//!
//! `cargo bench -p tollgate-bench --bench lease` prints, for each concurrency, decisions
//! per second and Redis calls per 1,000 decisions (`INFO stats` `total_commands_processed`)
//! for three `Leased` instances, three plain `RedisStore` instances, and redis-cell's
//! `CL.THROTTLE` over three connections when `TOLLGATE_REDIS_CELL` names the module, in two
//! scenarios:
//! - far under its limit (every request admitted; leases of 500 units for 200 ms);
//! - at its limit (a burst of 1,000 at 50,000 per second; leases of 100 units for 50 ms):
//!   most requests are denied, and a checker reads when the admitted ones passed (each
//!   task's own list, merged after the run) and reports the worst burst over the three
//!   instances, the most `N(s, e) − rate × (e − s)` over windows `[s, e]`, against the
//!   rule's burst. A task knows a decision only within a round trip (sent, answered): "as
//!   answered" puts each pass at its answer (what a service behind the limiter sees, where
//!   a store's late answers bunch up), "certain" counts in a window only the passes sent
//!   and answered within it, so it never exceeds the true worst burst; a pass decided in
//!   process has both at once. The plain store and redis-cell, read the same way, show
//!   what the round trips alone add to "as answered" (and redis-cell's own clock to both).
//!
//! `TOLLGATE_BENCH_SECS` sets the seconds per measurement (default 2);
//! `TOLLGATE_BENCH_CONCURRENCY` (comma-separated) the tasks per instance (default 16,64).

#[path = "../../tests/support/redis_server.rs"]
#[allow(unreachable_pub)]
mod redis_server;
#[path = "../../tests/stores/exact_leases/reference.rs"]
#[allow(dead_code)]
mod reference;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::{Leased, RedisStore, Store};
use tollgate::{Check, Limiter, Rate, Rule};

use reference::Promise;

const INSTANCES: usize = 3;

/// One rule's load: its burst and rate (per second), and the leases the instances take.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    burst: u64,
    per_second: u64,
    units: u64,
    term: Duration,
    /// Whether the checker's worst burst is reported (a rule far under its limit has none
    /// to show).
    checked: bool,
}

/// At its limit first: `scripts/guard.sh` reads the last rows, far under the limit.
const SCENARIOS: [Scenario; 2] = [
    Scenario {
        name: "at its limit",
        burst: 1_000,
        per_second: 50_000,
        units: 100,
        term: Duration::from_millis(50),
        checked: true,
    },
    Scenario {
        name: "far under its limit",
        burst: 1_000_000,
        per_second: 10_000_000,
        units: 500,
        term: Duration::from_millis(200),
        checked: false,
    },
];

/// An admitted request as its task saw it: sent, answered; the store decided in between.
type Seen = (Instant, Instant);

/// What one path did: its decisions, its admissions as seen, how long.
struct Run {
    decided: u64,
    passes: Vec<Seen>,
    elapsed: Duration,
}

fn main() {
    let secs = tollgate_bench::bench_secs(2.0);
    let cell = tollgate_bench::redis_cell();
    let server = redis_server::RedisServer::start_with_module(cell.as_deref());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let run = Duration::from_secs_f64(secs);
    for tasks in list("TOLLGATE_BENCH_CONCURRENCY", &[16, 64]) {
        for scenario in SCENARIOS {
            println!(
                "\n{INSTANCES} instances x {tasks} tasks, one key {} (burst {}, {}/s):",
                scenario.name, scenario.burst, scenario.per_second
            );
            rt.block_on(paths(&server, &scenario, tasks, run, cell.is_some()));
        }
    }
}

/// The comma-separated numbers in `var`, else `default`.
fn list(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// The three paths on `scenario`, each on its own key.
async fn paths(
    server: &redis_server::RedisServer,
    scenario: &Scenario,
    tasks: usize,
    run: Duration,
    cell: bool,
) {
    let url = server.url();
    let rule = Rule::gcra("hot", scenario.burst, Rate::per_second(scenario.per_second));
    let mut leased = Vec::new();
    let mut plain = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::connect(&url).await.expect("connect");
        let store = Leased::new(store).lease(&rule, scenario.units, scenario.term);
        leased.push(Limiter::new(store.expect("lease")));
        plain.push(Limiter::new(
            RedisStore::connect(&url).await.expect("connect"),
        ));
    }
    let key = |path: &str| format!("{path}-{tasks}-{}", scenario.burst);
    let work = hammer(&leased, &rule, key("leased"), tasks, run);
    report("tollgate leased", server, scenario, work).await;
    let work = hammer(&plain, &rule, key("plain"), tasks, run);
    report("tollgate plain", server, scenario, work).await;
    if cell {
        let work = cell_hammer(&url, scenario, key("cell"), tasks, run);
        report("redis-cell", server, scenario, work).await;
    }
}

/// Runs `work`, printing its decisions per second, Redis's commands per 1,000 of them and,
/// for a checked scenario, the share admitted and the worst burst seen.
async fn report(
    name: &str,
    server: &redis_server::RedisServer,
    scenario: &Scenario,
    work: impl std::future::Future<Output = Run>,
) {
    let before = commands(server);
    let run = work.await;
    let calls = commands(server).saturating_sub(before);
    let mut line = format!(
        "{name:<16} {:>10.0} decisions/s  {:>8.1} Redis calls per 1,000 decisions",
        run.decided as f64 / run.elapsed.as_secs_f64(),
        calls as f64 * 1_000.0 / run.decided.max(1) as f64
    );
    if scenario.checked {
        let admitted = run.passes.len() as f64 / run.elapsed.as_secs_f64();
        let (certain, answered) = worst_bursts(scenario, run.passes);
        line += &format!(
            "  {admitted:>8.0} admitted/s  worst burst: certain {certain:>7.1}, as answered \
             {answered:>7.1} (burst {})",
            scenario.burst
        );
    }
    println!("{line}");
}

/// The worst burst over `passes` (every admission costs 1) at `scenario`'s rate: certain
/// (a lower bound) and as answered.
fn worst_bursts(scenario: &Scenario, mut passes: Vec<Seen>) -> (f64, f64) {
    passes.sort_unstable();
    let Some(&(first, _)) = passes.first() else {
        return (0.0, 0.0);
    };
    let us = |t: Instant| t.duration_since(first).as_micros() as u64;
    let promise = Promise {
        burst: scenario.burst,
        amount: scenario.per_second,
        period: 1_000_000,
    };
    let mut answered: Vec<(u64, u64)> = passes.iter().map(|&(_, a)| (us(a), 1)).collect();
    answered.sort_unstable();
    let seen: Vec<(u64, u64)> = passes.iter().map(|&(s, a)| (us(s), us(a))).collect();
    (certain(&promise, &seen), promise.worst_burst(&answered))
}

/// A lower bound of the worst burst: windows from a pass's sending to the latest answer
/// of the passes sent from then on (in order of sending), counting only those, each of
/// which was decided within the window. Windows of up to a few bursts' passes: a longer
/// one only lowers the bound's reach, never raises it above the truth.
fn certain(promise: &Promise, seen: &[(u64, u64)]) -> f64 {
    let (amount, period) = (i128::from(promise.amount), i128::from(promise.period));
    let reach = 4 * promise.burst as usize;
    let mut worst = 0i128;
    for (i, &(start, _)) in seen.iter().enumerate() {
        let mut end = 0;
        for (n, &(_, answer)) in seen[i..].iter().take(reach).enumerate() {
            end = end.max(answer);
            let count = n as i128 + 1;
            worst = worst.max(count * period - amount * i128::from(end - start));
        }
    }
    worst as f64 / period as f64
}

fn commands(server: &redis_server::RedisServer) -> u64 {
    let stats = server.must(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// `tasks` tasks per instance deciding `rule` for `key` for `run`.
async fn hammer<S: Store + Clone>(
    instances: &[Limiter<S>],
    rule: &Rule,
    key: String,
    tasks: usize,
    run: Duration,
) -> Run {
    let key: Arc<[u8]> = key.into_bytes().into();
    let started = Instant::now();
    let mut handles = Vec::new();
    for limiter in instances {
        for _ in 0..tasks {
            let (limiter, rule, key) = (limiter.clone(), rule.clone(), key.clone());
            handles.push(tokio::spawn(async move {
                let batch = [Check::new(&rule, &key)];
                let (mut decided, mut passes) = (0, Vec::new());
                while started.elapsed() < run {
                    let sent = Instant::now();
                    if limiter.check(&batch).await.expect("decide").is_admitted() {
                        passes.push((sent, Instant::now()));
                    }
                    decided += 1;
                }
                (decided, passes)
            }));
        }
    }
    gather(handles, started).await
}

/// The tasks' decisions and passes, merged.
async fn gather(handles: Vec<tokio::task::JoinHandle<(u64, Vec<Seen>)>>, started: Instant) -> Run {
    let (mut decided, mut passes) = (0, Vec::new());
    for handle in handles {
        let (n, mut seen) = handle.await.expect("task");
        decided += n;
        passes.append(&mut seen);
    }
    Run {
        decided,
        passes,
        elapsed: started.elapsed(),
    }
}

/// redis-cell's `CL.THROTTLE` on the same rule (its burst is `max_burst + 1`), `tasks`
/// tasks per connection.
async fn cell_hammer(
    url: &str,
    scenario: &Scenario,
    key: String,
    tasks: usize,
    run: Duration,
) -> Run {
    let args = [
        key,
        (scenario.burst - 1).to_string(),
        scenario.per_second.to_string(),
        "1".to_owned(),
        "1".to_owned(),
    ];
    let args = Arc::new(args);
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..INSTANCES {
        let client = redis::Client::open(url).expect("url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        for _ in 0..tasks {
            let (mut conn, args) = (conn.clone(), args.clone());
            handles.push(tokio::spawn(async move {
                let (mut decided, mut passes) = (0, Vec::new());
                while started.elapsed() < run {
                    let sent = Instant::now();
                    let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
                        .arg(&args[..])
                        .query_async(&mut conn)
                        .await
                        .expect("CL.THROTTLE");
                    if reply.first() == Some(&0) {
                        passes.push((sent, Instant::now()));
                    }
                    decided += 1;
                }
                (decided, passes)
            }));
        }
    }
    gather(handles, started).await
}
