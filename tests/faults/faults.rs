//! Redis outages under concurrent load: real `redis-server` processes stopped (SIGSTOP),
//! killed and restarted, their scripts and data flushed, a Cluster master killed. The
//! limiter stays fast (a circuit breaker), keeps limits (a local fallback) and goes back to
//! Redis when it returns.
//!
//! Each test prints its per-second table (`--nocapture`): the figures in BENCHMARKS.md.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::store::RedisStore;
use tollgate::store::{Breaker, Fallback};
use tollgate::{
    store::{Health, Store},
    Check, Limiter, Rule,
};

use crate::support::redis_server::{RedisCluster, RedisServer};

/// The store's per-call timeout in these tests (a production setting would be similar:
/// a few times the usual round trip).
const TIMEOUT: Duration = Duration::from_millis(200);
/// A request this slow waited on Redis, not on the machine.
const SLOW: Duration = Duration::from_millis(100);
/// How long the breaker stays open before a probe.
const OPEN_FOR: Duration = Duration::from_millis(200);
/// Concurrent clients.
const CLIENTS: usize = 6;
/// Each client's pause between requests: some 1,000 requests/s in all.
const PACE: Duration = Duration::from_millis(5);
/// The quota of the hot key: 30 per minute, exact (sliding log).
const HOT_LIMIT: u64 = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Admitted,
    Refused,
    Error,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When the request started, from the start of the run.
    at: Duration,
    latency: Duration,
    answer: Answer,
    hot: bool,
}

/// Runs `CLIENTS` clients against `limiter` for `length`: every other request on the hot
/// key, the rest spread over a few others. A request that takes 5 s fails the test (a hang).
async fn load<S: Store + Clone>(
    limiter: Limiter<S>,
    start: Instant,
    length: Duration,
) -> Vec<Sample> {
    let rule = Arc::new(Rule::sliding_log(
        "per-key",
        HOT_LIMIT,
        Duration::from_secs(60),
    ));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let limiter = limiter.clone();
        let rule = rule.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut n = 0u64;
            while start.elapsed() < length {
                n += 1;
                let hot = n.is_multiple_of(2);
                let key = if hot {
                    "hot".to_owned()
                } else {
                    format!("user-{client}-{}", n % 7)
                };
                let began = Instant::now();
                let result = tokio::time::timeout(
                    Duration::from_secs(5),
                    limiter.check(&[Check::new(&rule, key.as_bytes())]),
                )
                .await
                .expect("a request hung");
                let answer = match result {
                    Ok(o) if o.is_admitted() => Answer::Admitted,
                    Ok(_) => Answer::Refused,
                    Err(_) => Answer::Error,
                };
                samples.push(Sample {
                    at: began - start,
                    latency: began.elapsed(),
                    answer,
                    hot,
                });
                tokio::time::sleep(PACE).await;
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("a client panicked"));
    }
    all.sort_by_key(|s| s.at);
    all
}

fn p99(samples: &[&Sample]) -> Duration {
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort();
    latencies
        .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn within(samples: &[Sample], from: Duration, to: Duration) -> Vec<&Sample> {
    samples
        .iter()
        .filter(|s| s.at >= from && s.at < to)
        .collect()
}

/// Per 500 ms of the run: answered (admitted), refused, errors, p99 latency.
fn table(title: &str, samples: &[Sample], length: Duration) {
    println!(
        "\n{title}\n| t (s) | admitted | refused | errors | p99 (ms) |\n|---|---|---|---|---|"
    );
    let step = Duration::from_millis(500);
    let mut from = Duration::ZERO;
    while from < length {
        let part = within(samples, from, from + step);
        let count = |a| part.iter().filter(|s| s.answer == a).count();
        println!(
            "| {:.1} | {} | {} | {} | {:.1} |",
            from.as_secs_f64(),
            count(Answer::Admitted),
            count(Answer::Refused),
            count(Answer::Error),
            p99(&part).as_secs_f64() * 1000.0
        );
        from += step;
    }
}

async fn redis(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_timeout(TIMEOUT)
}

fn resilient(redis: RedisStore) -> Limiter<Fallback<Breaker<RedisStore>>> {
    Limiter::new(Fallback::new(
        Breaker::new(redis).failures(3).open_for(OPEN_FOR),
    ))
}

/// Waits (polling, from `from`) until `limiter` is healthy; how long after `from` it took.
async fn healthy_after<S: Store>(limiter: &Limiter<S>, from: Instant) -> Duration {
    while limiter.health() != Health::Healthy {
        assert!(
            from.elapsed() < Duration::from_secs(5),
            "the limiter never recovered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    from.elapsed()
}

/// What every outage test asserts about the requests in `[opened, back)`: the breaker is
/// open, the local store decides, no request waits as a call to Redis would (half the
/// timeout, `SLOW`: the machine's other tests delay a request by tens of ms). Returns (p99,
/// slowest) of those requests.
fn assert_fast_and_limited(
    samples: &[Sample],
    opened: Duration,
    back: Duration,
) -> (Duration, Duration) {
    let outage = within(samples, opened, back);
    assert!(
        outage.len() > 200,
        "too few requests in the outage: {}",
        outage.len()
    );
    assert!(
        outage.iter().all(|s| s.answer != Answer::Error),
        "an error reached a client"
    );
    // No client's request is the probe: the breaker probes Redis on its own, so every
    // request is answered locally, none waits for Redis. Latencies are measured by each
    // client around its own call, so they include any scheduling delay of a loaded machine.
    let p99 = p99(&outage);
    let slowest = outage.iter().map(|s| s.latency).max().unwrap_or_default();
    let slow = outage.iter().filter(|s| s.latency >= SLOW).count();
    assert!(
        slow == 0,
        "{slow} requests took {SLOW:?} or more while the breaker was open (slowest {slowest:?}, p99 {p99:?})"
    );
    // The local store enforces the hot key's quota on its own.
    let hot_admitted = outage
        .iter()
        .filter(|s| s.hot && s.answer == Answer::Admitted)
        .count();
    let hot_refused = outage
        .iter()
        .filter(|s| s.hot && s.answer == Answer::Refused)
        .count();
    assert!(
        hot_admitted as u64 <= HOT_LIMIT,
        "{hot_admitted} admitted locally"
    );
    assert!(
        hot_refused > 0,
        "the hot key was never limited during the outage"
    );
    (p99, slowest)
}

/// With a breaker and a fallback, a stopped Redis adds no latency, the local store keeps
/// the limits, and Redis decides again soon after it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_costs_no_latency_and_keeps_limits() {
    let server = RedisServer::start();
    let limiter = resilient(redis(&server).await);
    let length = Duration::from_millis(5500);
    let (fault, back) = (Duration::from_secs(1), Duration::from_secs(4));
    let start = Instant::now();
    let run = tokio::spawn(load(limiter.clone(), start, length));

    tokio::time::sleep_until(start + fault).await;
    server.pause();
    tokio::time::sleep_until(start + back).await;
    server.resume();
    let recovered = healthy_after(&limiter, Instant::now()).await;
    let samples = run.await.unwrap();
    table(
        "Redis stopped (SIGSTOP) from 1.0 s to 4.0 s, breaker and fallback",
        &samples,
        length,
    );

    // Within one timeout of the fault (plus slack for a loaded machine) the breaker is open.
    // Up to SIGCONT: no request waits on a probe, not even the last ones.
    let (p99, slowest) =
        assert_fast_and_limited(&samples, fault + TIMEOUT + Duration::from_millis(100), back);
    assert!(
        recovered < Duration::from_secs(1),
        "Redis used again {recovered:?} after SIGCONT"
    );
    assert!(samples.iter().all(|s| s.answer != Answer::Error));
    println!(
        "outage p99 {p99:?}, slowest {slowest:?}, Redis used again {recovered:?} after SIGCONT"
    );
}

/// Without a breaker, a fallback still answers every request during an outage, but each one
/// waits out the store's timeout first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_breaker_every_request_waits_the_timeout() {
    let server = RedisServer::start();
    let limiter = Limiter::new(Fallback::new(redis(&server).await));
    let length = Duration::from_millis(3000);
    let (fault, back) = (Duration::from_millis(500), Duration::from_millis(2500));
    let start = Instant::now();
    let run = tokio::spawn(load(limiter.clone(), start, length));
    tokio::time::sleep_until(start + fault).await;
    server.pause();
    // Requests sent before the signal took effect were answered by Redis: the outage
    // starts once `pause` has returned (sending SIGSTOP takes a process spawn).
    let paused = start.elapsed();
    tokio::time::sleep_until(start + back).await;
    server.resume();
    let samples = run.await.unwrap();
    table(
        "Redis stopped (SIGSTOP) from 0.5 s to 2.5 s, fallback without a breaker",
        &samples,
        length,
    );
    let outage = within(&samples, paused, back - TIMEOUT);
    assert!(outage.iter().all(|s| s.answer != Answer::Error));
    // What the breaker saves: every request pays the timeout before the local decision.
    let fast = outage.iter().filter(|s| s.latency < TIMEOUT).count();
    assert!(
        fast <= CLIENTS,
        "{fast} requests did not wait for the timeout"
    );
}

/// With a breaker and a fallback, a killed Redis adds no latency, and a restarted one is
/// reconnected to and decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_costs_no_latency_and_reconnects() {
    let mut server = RedisServer::start();
    let limiter = resilient(redis(&server).await);
    let length = Duration::from_millis(4000);
    let (fault, back) = (Duration::from_secs(1), Duration::from_millis(2500));
    let start = Instant::now();
    let run = tokio::spawn(load(limiter.clone(), start, length));

    tokio::time::sleep_until(start + fault).await;
    server.kill();
    tokio::time::sleep_until(start + back).await;
    let restarted = tokio::task::block_in_place(|| {
        server.restart();
        Instant::now()
    });
    let recovered = healthy_after(&limiter, restarted).await;
    let samples = run.await.unwrap();
    table(
        "Redis killed at 1.0 s, restarted at 2.5 s, breaker and fallback",
        &samples,
        length,
    );

    let (p99, slowest) =
        assert_fast_and_limited(&samples, fault + TIMEOUT + Duration::from_millis(100), back);
    assert!(
        recovered < Duration::from_secs(1),
        "Redis used again {recovered:?} after the restart"
    );
    assert!(samples.iter().all(|s| s.answer != Answer::Error));
    // And it is Redis that decides again: the restarted server holds the hot key.
    assert!(server.must(&["EXISTS", "tollgate:{hot}:per-key"]).trim() == "1");
    println!(
        "outage p99 {p99:?}, slowest {slowest:?}, Redis used again {recovered:?} after the restart"
    );
}

/// Script, function and data flushes under load reach no client: the code reloads itself
/// and a flushed key starts with its whole quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_function_and_data_flushes_mid_load_reach_no_client() {
    let server = RedisServer::start();
    // No fallback, no breaker: the store itself must absorb these.
    let limiter = Limiter::new(redis(&server).await);
    let length = Duration::from_millis(2000);
    let start = Instant::now();
    let run = tokio::spawn(load(limiter.clone(), start, length));
    for (at, commands) in [
        (500, &[&["SCRIPT", "FLUSH"][..]][..]),
        (750, &[&["FUNCTION", "FLUSH"][..]][..]),
        (1000, &[&["FLUSHALL"][..]][..]),
        (
            1500,
            &[
                &["SCRIPT", "FLUSH"][..],
                &["FUNCTION", "FLUSH"][..],
                &["FLUSHALL"][..],
            ][..],
        ),
    ] {
        tokio::time::sleep_until(start + Duration::from_millis(at)).await;
        tokio::task::block_in_place(|| {
            for args in commands {
                server.must(args);
            }
        });
    }
    let samples = run.await.unwrap();
    table(
        "SCRIPT FLUSH at 0.5 s, FUNCTION FLUSH at 0.75 s, FLUSHALL at 1.0 s, all at 1.5 s",
        &samples,
        length,
    );
    let errors = samples.iter().filter(|s| s.answer == Answer::Error).count();
    assert_eq!(errors, 0, "{errors} errors reached clients");
    assert!(server.calls("fcall") > 0);
    // Loaded when the store connected, then again after each FUNCTION FLUSH (once per call
    // that found it missing at the same moment: at least once per flush).
    assert!(
        server.calls("function|load") >= 3,
        "the library was not reloaded after FUNCTION FLUSH"
    );

    // Limits restart cleanly: after a flush the hot key has its whole quota again.
    server.must(&["FLUSHALL"]);
    let rule = Rule::sliding_log("per-key", HOT_LIMIT, Duration::from_secs(60));
    let outcome = limiter.check_one(&rule, b"hot").await.unwrap();
    assert!(outcome.is_admitted());
    assert_eq!(outcome.rules[0].info.remaining, HOT_LIMIT - 1);
}

/// The node (index into `cluster.nodes`) that serves `key`'s hash tag.
fn owner(cluster: &RedisCluster, key: &str) -> usize {
    let slot: u16 = cluster.nodes[0]
        .must(&["CLUSTER", "KEYSLOT", key])
        .trim()
        .parse()
        .unwrap();
    cluster
        .nodes
        .iter()
        .position(|node| {
            let nodes = node.must(&["CLUSTER", "NODES"]);
            let me = nodes.lines().find(|l| l.contains("myself")).unwrap_or_default();
            me.split_whitespace().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
            })
        })
        .expect("a node serves every slot")
}

/// A killed cluster master affects only the keys in its slots: the others are still decided
/// by Redis, and its own fall back at once without waiting for the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_master_affects_only_its_slots() {
    let mut cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect")
        .with_timeout(TIMEOUT);
    let limiter = Limiter::new(Fallback::new(store.clone()));
    // Keys on two different nodes: one to kill.
    let keys: Vec<String> = (0..50).map(|i| format!("client-{i}")).collect();
    let dead = owner(&cluster, &keys[0]);
    let live = keys
        .iter()
        .find(|k| owner(&cluster, k) != dead)
        .unwrap()
        .clone();
    let doomed = keys[0].clone();
    let rule = Arc::new(Rule::sliding_log(
        "per-key",
        1_000_000,
        Duration::from_secs(60),
    ));

    let length = Duration::from_millis(3000);
    let fault = Duration::from_secs(1);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (limiter, rule) = (limiter.clone(), rule.clone());
        let key = if client.is_multiple_of(2) {
            live.clone()
        } else {
            doomed.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            while start.elapsed() < length {
                let began = Instant::now();
                let result = tokio::time::timeout(
                    Duration::from_secs(5),
                    limiter.check(&[Check::new(&rule, key.as_bytes())]),
                )
                .await
                .expect("a request hung");
                let answer = match result {
                    Ok(o) if o.is_admitted() => Answer::Admitted,
                    Ok(_) => Answer::Refused,
                    Err(_) => Answer::Error,
                };
                samples.push(Sample {
                    at: began - start,
                    latency: began.elapsed(),
                    answer,
                    hot: client.is_multiple_of(2),
                });
                tokio::time::sleep(PACE).await;
            }
            samples
        }));
    }
    tokio::time::sleep_until(start + fault).await;
    tokio::task::block_in_place(|| cluster.nodes[dead].kill());
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await.expect("a client panicked"));
    }
    samples.sort_by_key(|s| s.at);
    let (live_samples, dead_samples): (Vec<Sample>, Vec<Sample>) =
        samples.iter().partition(|s| s.hot);
    table(
        "Cluster: the master of one key killed at 1.0 s (keys on live masters)",
        &live_samples,
        length,
    );
    table(
        "Cluster: the master of one key killed at 1.0 s (keys on the killed master)",
        &dead_samples,
        length,
    );

    assert!(
        samples.iter().all(|s| s.answer == Answer::Admitted),
        "a request was refused or failed"
    );
    // Every request on the live key was decided by Redis: it counted each of them.
    let admitted_live = live_samples.len() as u64;
    let remaining = Limiter::new(store)
        .peek(&rule, &live, 0)
        .await
        .unwrap()
        .info
        .remaining;
    assert_eq!(
        1_000_000 - remaining,
        admitted_live,
        "the live master missed decisions"
    );
    let after = within(&live_samples, fault, length);
    println!("live key after the kill: p99 {:?}", p99(&after));
    let after = within(&dead_samples, fault + TIMEOUT, length);
    let dead_p99 = p99(&after);
    println!(
        "dead key after the kill: p99 {dead_p99:?}, slowest {:?}",
        after.iter().map(|s| s.latency).max()
    );
    // Refused connections fail at once and are decided locally: no waiting for the timeout
    // (the cluster client does not retry them; see `a_cluster_call_whose_connection_drops_…`).
    assert!(
        after.len() > 50,
        "too few requests on the dead key: {}",
        after.len()
    );
    assert!(
        dead_p99 < TIMEOUT,
        "requests on the dead master wait: p99 {dead_p99:?}"
    );
}

/// A script call whose connection drops may have run: it must not be sent again (the
/// request would count twice). Connections are killed under load; Redis's count for the
/// key can then exceed the admitted requests only by the requests that failed (each counted
/// at most once), never by a re-sent one.
async fn dropped_connections_count_each_request_once(
    limiter: Limiter<RedisStore>,
    node: &RedisServer,
) {
    let rule = Arc::new(Rule::sliding_log(
        "per-key",
        1_000_000,
        Duration::from_secs(60),
    ));
    let length = Duration::from_millis(2500);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS * 2 {
        let (limiter, rule) = (limiter.clone(), rule.clone());
        tasks.push(tokio::spawn(async move {
            let (mut admitted, mut failed) = (0u64, 0u64);
            while start.elapsed() < length {
                match limiter.check(&[Check::new(&rule, b"k")]).await {
                    Ok(o) => admitted += u64::from(o.is_admitted()),
                    Err(_) => failed += 1,
                }
            }
            (admitted, failed)
        }));
    }
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::task::block_in_place(|| node.cli(&["CLIENT", "KILL", "TYPE", "normal"]));
    }
    let (mut admitted, mut failed) = (0, 0);
    for task in tasks {
        let (a, f) = task.await.unwrap();
        admitted += a;
        failed += f;
    }
    // A peek counts nothing, so trying it again is safe: the first call after the last
    // kill finds its connection dropped.
    let mut peeked = limiter.peek(&rule, b"k", 0).await;
    for _ in 0..20 {
        if peeked.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        peeked = limiter.peek(&rule, b"k", 0).await;
    }
    let counted = 1_000_000 - peeked.expect("Redis answers again").info.remaining;
    println!("admitted {admitted}, failed {failed}, counted by Redis {counted}");
    assert!(
        counted <= admitted + failed,
        "{} requests counted twice",
        counted - admitted - failed
    );
    assert!(counted >= admitted);
    assert!(failed > 0, "no connection was dropped mid-call");
}

/// A cluster script call whose connection drops is never sent again, so no request counts
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_call_whose_connection_drops_is_never_sent_again() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect")
        .with_timeout(Duration::from_secs(2));
    let node = owner(&cluster, "k");
    dropped_connections_count_each_request_once(Limiter::new(store), &cluster.nodes[node]).await;
}

/// A standalone script call whose connection drops is never sent again, so no request
/// counts twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_call_whose_connection_drops_is_never_sent_again() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_timeout(Duration::from_secs(2));
    dropped_connections_count_each_request_once(Limiter::new(store), &server).await;
}

/// The breaker's own probe of Redis: a `PING` bounded by the store's timeout, which on a
/// Cluster fails while any master is away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_answers_only_when_every_server_does() {
    let server = RedisServer::start();
    let store = redis(&server).await;
    let ping = || store.probe().expect("RedisStore probes on its own");
    assert_eq!(ping().await, Ok(()));
    server.pause();
    assert_eq!(ping().await, Err(tollgate::StoreError::Timeout));
    server.resume();
    assert_eq!(ping().await, Ok(()));

    let mut cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect")
        .with_timeout(TIMEOUT);
    assert_eq!(store.probe().expect("a probe").await, Ok(()));
    tokio::task::block_in_place(|| cluster.nodes[1].kill());
    assert!(store.probe().expect("a probe").await.is_err());
}
