//! Each admission counts at the instant it passes. Wait mode never over-admits: a
//! reservation takes units at a later instant without forgetting what still counts before
//! it (regression: fixed window and sliding log used to drop the current window's
//! admissions when a reservation reached past it). A batch with a leaky bucket passes when
//! the bucket's queue lets it go, and every rule on the bucket's key counts it then, in
//! enforce and wait modes (regression: they counted it on arrival, in a window it did not
//! pass in); rules on other keys count it on arrival (or its reservation), so one client's
//! queue never dates a shared state.

mod common;

use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::redis_server::{RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::{
    Check, Decision, Limiter, ManualClock, MemoryStore, Outcome, Rate, RedisStore, Rule, Store,
};

const T0: u64 = 1_000_000_000;

/// Two admitted at t=5, a reservation at t=6 into the future, then a plain request at t=7:
/// with a limit of 2 per 10 µs it must be denied.
async fn request_before_a_reservation_is_denied<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let us = Duration::from_micros;
    for rule in [
        Rule::fixed_window("fw", 2, us(10)),
        Rule::sliding_window("sw", 2, us(10)),
        Rule::sliding_log("sl", 2, us(10)),
    ] {
        let batch = [Check::new(&rule, b"k")];
        clock.set_micros(T0 + 5);
        for _ in 0..2 {
            assert!(limiter.check(&batch).await.unwrap().is_admitted());
        }
        clock.set_micros(T0 + 6);
        let reserved = limiter.reserve(&batch, us(10)).await.unwrap();
        assert!(
            matches!(reserved.decision, Decision::Delay(_)),
            "{}",
            rule.name()
        );
        clock.set_micros(T0 + 7);
        let outcome = limiter.check(&batch).await.unwrap();
        assert!(
            !outcome.is_admitted(),
            "{}: a third unit before the window",
            rule.name()
        );
    }
}

#[tokio::test]
async fn a_reservation_keeps_the_current_window_memory() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    request_before_a_reservation_is_denied(&limiter, &clock).await;
}

#[tokio::test]
async fn a_reservation_keeps_the_current_window_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    request_before_a_reservation_is_denied(&limiter, &clock).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random traffic with and without waiting: no fixed window ever holds more than its
    /// limit, and no window-long interval more than a sliding log's limit, counting each
    /// admission at the instant it passes (now + its delay).
    #[test]
    fn wait_mode_never_over_admits(
        steps in proptest::collection::vec((0u64..40, 1u64..3, prop_oneof![Just(0u64), 0u64..60]), 1..80)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let us = Duration::from_micros;
        let (limit, window) = (4u64, 20u64);
        let rules = [
            Rule::fixed_window("fw", limit, us(window)),
            Rule::sliding_log("sl", limit, us(window)),
        ];
        for rule in &rules {
            let clock = ManualClock::new(T0);
            let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
            let mut passed: Vec<(u64, u64)> = Vec::new();
            for &(advance, cost, wait) in &steps {
                clock.advance_micros(advance);
                let now = clock.now_micros_for_test();
                let outcome = rt
                    .block_on(limiter.reserve(&[Check::new(rule, b"k").with_cost(cost)], us(wait)))
                    .unwrap();
                match outcome.decision {
                    Decision::Allow => passed.push((now, cost)),
                    Decision::Delay(d) => passed.push((now + d.as_micros() as u64, cost)),
                    Decision::Deny(_) => {}
                }
            }
            if rule.name() == "fw" {
                let mut per_window = std::collections::HashMap::new();
                for &(t, c) in &passed {
                    *per_window.entry(t / window).or_insert(0) += c;
                }
                for (w, n) in per_window {
                    prop_assert!(n <= limit, "fixed window {w} passed {n}");
                }
            } else {
                for &(start, _) in &passed {
                    let n: u64 = passed
                        .iter()
                        .filter(|(t, _)| *t >= start && *t < start + window)
                        .map(|(_, c)| c)
                        .sum();
                    prop_assert!(n <= limit, "{n} passed in [{start}, {start}+{window})");
                }
            }
        }
    }
}

/// The rules random batches draw from: two leaky buckets (1 unit per 10 µs and per 4 µs), a
/// fixed window and a sliding log (4 per 20 µs each).
fn batch_rules() -> [Rule; 4] {
    let us = Duration::from_micros;
    [
        Rule::leaky_bucket("slow-queue", 3, Rate::new(1, us(10))),
        Rule::leaky_bucket("fast-queue", 4, Rate::new(1, us(4))),
        Rule::fixed_window("window", 4, us(20)),
        Rule::sliding_log("log", 4, us(20)),
    ]
}

/// One request: µs the clock moves first, each rule's cost (0: not in the batch), and
/// `max_wait` µs (0: enforce mode).
type BatchStep = (u64, [u64; 4], u64);

fn batch_steps() -> impl Strategy<Value = Vec<BatchStep>> {
    let cost = prop_oneof![2 => Just(0u64), 3 => Just(1u64), 1 => Just(2u64)];
    let max_wait = prop_oneof![3 => Just(0u64), 2 => 1u64..80];
    proptest::collection::vec(
        (
            prop_oneof![3 => Just(0u64), 3 => 1u64..10, 1 => 10u64..60],
            [cost.clone(), cost.clone(), cost.clone(), cost],
            max_wait,
        ),
        1..60,
    )
}

/// Runs `steps` on `limiter` (rule `i` on `keys[i]`) and checks every rule against the units
/// it counts at each instant (`now` + the delay it reports: a leaky bucket's own queue; for
/// the rules on a leaky bucket's key, the instant the request passes there, the longest
/// delay on that key; for the rules on other keys, the reservation, which is one instant
/// for all of them, across Cluster slots too, or, when a queue holds the request longer,
/// the release, where they are confirmed as the layer does: `Limiter::confirm`, run when
/// the clock reaches it). Only requests that pass count: one denied at its release counts
/// nowhere. No fixed window and no window-long interval of the sliding log holds more than
/// 4, and each leaky bucket lets units leave no faster than it drains (in any `[a, b]`, the
/// units beside the largest are at most `(b − a) / period`).
/// A request held to confirm at its release: (release, costs, max_wait, outcome, the
/// instants its rules counted at so far).
type Held = (u64, [u64; 4], u64, Outcome, [Option<u64>; 4]);

async fn every_rule_counts_where_it_says<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    keys: [&[u8]; 4],
    steps: &[BatchStep],
) -> Result<(), TestCaseError> {
    let rules = batch_rules();
    let mut passed: [Vec<(u64, u64)>; 4] = Default::default();
    let mut held: Vec<Held> = Vec::new();
    let batch_of = |costs: [u64; 4]| -> Vec<Check<'_>> {
        rules
            .iter()
            .zip(costs)
            .zip(keys)
            .filter(|((_, cost), _)| *cost > 0)
            .map(|((rule, cost), key)| Check::new(rule, key).with_cost(cost))
            .collect()
    };
    // Each rule's delay in `outcome` (indexed by rule, `None` if not in the batch).
    let delays_of = |costs: [u64; 4], outcome: &Outcome| {
        let mut delays = [None; 4];
        let included = (0..4).filter(|&i| costs[i] > 0);
        for (i, rule) in included.zip(&outcome.rules) {
            delays[i] = Some(match rule.decision {
                Decision::Delay(d) => d.as_micros() as u64,
                _ => 0,
            });
        }
        delays
    };
    let steps = steps.iter().map(Some).chain([None]);
    for step in steps {
        let target = match step {
            Some(&(advance, _, _)) => clock.now_micros_for_test() + advance,
            None => u64::MAX,
        };
        // The held requests released by then, in order.
        while let Some(next) = held
            .iter()
            .enumerate()
            .filter(|(_, h)| h.0 <= target)
            .min_by_key(|(_, h)| h.0)
            .map(|(i, _)| i)
        {
            let (release, costs, wait, outcome, mut counted) = held.remove(next);
            clock.set_micros(release);
            let batch = batch_of(costs);
            let now = limiter
                .confirm(&batch, &outcome, Duration::from_micros(wait))
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            if !now.is_admitted() {
                continue;
            }
            let pending: Vec<usize> = outcome.admission.iter().flat_map(|a| a.pending()).collect();
            let included: Vec<usize> = (0..4).filter(|&i| costs[i] > 0).collect();
            for (k, &i) in included.iter().enumerate() {
                if pending.contains(&k) {
                    let delay = match now.rules[k].decision {
                        Decision::Delay(d) => d.as_micros() as u64,
                        _ => 0,
                    };
                    counted[i] = Some(release + delay);
                }
            }
            if now.needs_confirmation() {
                let d = match now.decision {
                    Decision::Delay(d) => d.as_micros() as u64,
                    _ => 0,
                };
                held.push((release + d, costs, wait, now, counted));
            } else {
                for i in 0..4 {
                    if let Some(t) = counted[i] {
                        passed[i].push((t, costs[i]));
                    }
                }
            }
        }
        let Some(&(_, costs, wait)) = step else { break };
        clock.set_micros(target);
        let now = target;
        let batch = batch_of(costs);
        if batch.is_empty() {
            continue;
        }
        let outcome = limiter
            .reserve(&batch, Duration::from_micros(wait))
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if !outcome.is_admitted() {
            continue;
        }
        let delays = delays_of(costs, &outcome);
        let mut reserved = None;
        for i in 2..4 {
            let Some(delay) = delays[i] else { continue };
            let on_key = || (0..4).filter(|&j| keys[j] == keys[i]);
            if on_key().any(|j| j < 2 && delays[j].is_some()) {
                // Beside a leaky bucket on its key: counted when the request passes there.
                let passes = on_key().filter_map(|j| delays[j]).max();
                prop_assert_eq!(Some(delay), passes, "{} counts at its key's release", i);
            } else {
                // The reservation, or the release where it is pending: one instant for the
                // batch, whatever the queues hold.
                prop_assert_eq!(*reserved.get_or_insert(delay), delay, "one reservation");
            }
        }
        let mut counted = [None; 4];
        for i in 0..4 {
            counted[i] = delays[i].map(|d| now + d);
        }
        if outcome.needs_confirmation() {
            let pending: Vec<usize> = outcome.admission.iter().flat_map(|a| a.pending()).collect();
            let included: Vec<usize> = (0..4).filter(|&i| costs[i] > 0).collect();
            for k in pending {
                counted[included[k]] = None;
            }
            let d = match outcome.decision {
                Decision::Delay(d) => d.as_micros() as u64,
                _ => 0,
            };
            held.push((now + d, costs, wait, outcome, counted));
            continue;
        }
        for i in 0..4 {
            if let Some(t) = counted[i] {
                passed[i].push((t, costs[i]));
            }
        }
    }
    for log in &mut passed {
        log.sort_unstable();
    }
    let units = |log: &[(u64, u64)], from: u64, to: u64| -> u64 {
        log.iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|(_, c)| c)
            .sum()
    };
    for (queue, period) in [(0, 10), (1, 4)] {
        let log = &passed[queue];
        for (i, &(a, _)) in log.iter().enumerate() {
            let (mut n, mut largest) = (0, 0);
            for &(b, c) in &log[i..] {
                n += c;
                largest = largest.max(c);
                prop_assert!(
                    n - largest <= (b - a) / period,
                    "{}: {} units leave in [{}, {}]",
                    rules[queue].name(),
                    n,
                    a - T0,
                    b - T0
                );
            }
        }
    }
    for &(t, _) in &passed[2] {
        let start = t - t % 20;
        let n = units(&passed[2], start, start + 20);
        prop_assert!(n <= 4, "fixed window [{}, +20) passed {}", start - T0, n);
    }
    for &(a, _) in &passed[3] {
        let n = units(&passed[3], a, a + 20);
        prop_assert!(n <= 4, "sliding log passed {} in [{}, +20)", n, a - T0);
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `cases` random schedules on the rules' `keys` through
/// [`every_rule_counts_where_it_says`], each on a fresh store `store_for(clock, case)` makes
/// (a Redis store: under a prefix of its own), on `rt` (the one a Redis store was connected on).
fn run_schedules<S: Store>(
    rt: &tokio::runtime::Runtime,
    cases: u32,
    keys: impl Strategy<Value = [&'static [u8]; 4]>,
    store_for: impl Fn(ManualClock, usize) -> S,
) {
    let case = AtomicUsize::new(0);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
    .run(&(keys, batch_steps()), |(keys, steps)| {
        let clock = ManualClock::new(T0);
        let store = store_for(clock.clone(), case.fetch_add(1, Ordering::Relaxed));
        rt.block_on(every_rule_counts_where_it_says(
            &Limiter::new(store),
            &clock,
            keys,
            &steps,
        ))
    })
    .unwrap();
}

fn on_redis(store: &RedisStore) -> impl Fn(ManualClock, usize) -> RedisStore + '_ {
    move |clock, case| {
        store
            .clone()
            .with_clock(clock)
            .with_prefix(format!("case{case}"))
    }
}

/// Every rule on one key: one script call per batch on Redis.
const ONE_KEY: [&[u8]; 4] = [b"k"; 4];

#[test]
fn batches_with_a_leaky_bucket_count_each_rule_where_it_says_memory() {
    run_schedules(&runtime(), 256, Just(ONE_KEY), |clock, _| {
        MemoryStore::with_clock(clock)
    });
}

#[test]
fn batches_with_a_leaky_bucket_count_each_rule_where_it_says_redis() {
    let server = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .expect("connect");
    run_schedules(&rt, 48, Just(ONE_KEY), on_redis(&store));
}

/// The keys a mixed batch puts its rules on: the slow queue on the client's key, each other
/// rule on the client's key or on a shared one.
fn mixed_keys() -> impl Strategy<Value = [&'static [u8]; 4]> {
    let key = || prop_oneof![Just(&b"client"[..]), Just(&b"shared"[..])];
    (key(), key(), key()).prop_map(|(fast, window, log)| [&b"client"[..], fast, window, log])
}

#[test]
fn mixed_key_batches_with_a_leaky_bucket_count_each_rule_where_it_says_memory() {
    run_schedules(&runtime(), 256, mixed_keys(), |clock, _| {
        MemoryStore::with_clock(clock)
    });
}

#[test]
fn mixed_key_batches_with_a_leaky_bucket_count_each_rule_where_it_says_redis() {
    let server = RedisServer::start();
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .expect("connect");
    run_schedules(&rt, 48, mixed_keys(), on_redis(&store));
}

/// The same on a Redis Cluster: the two keys lie in different slots, so a mixed batch is
/// two script calls, and a leaky bucket's queue in one must not move the other.
#[test]
fn mixed_key_batches_count_each_rule_where_it_says_cluster() {
    let slot = |k: &[u8]| redis::cluster_routing::Slot::for_key([b"{", k, b"}"].concat());
    assert_ne!(slot(b"client"), slot(b"shared"), "the keys span slots");
    let cluster = RedisCluster::start();
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect_cluster(cluster.urls()))
        .expect("connect to the test cluster");
    run_schedules(&rt, 24, mixed_keys(), on_redis(&store));
}

/// The same on a Redis Cluster with each rule on a key of its own, so a batch spans slots
/// and each slot's part is one script call: the parts must still reserve one instant.
#[test]
fn cross_slot_batches_count_each_rule_where_it_says_cluster() {
    let keys: [&[u8]; 4] = [b"alpha", b"beta", b"gamma", b"delta"];
    let slots: std::collections::HashSet<_> = keys
        .iter()
        .map(|k| redis::cluster_routing::Slot::for_key([b"{", *k, b"}"].concat()))
        .collect();
    assert!(slots.len() >= 3, "the keys span slots");
    let cluster = RedisCluster::start();
    let rt = runtime();
    let store = rt
        .block_on(RedisStore::connect_cluster(cluster.urls()))
        .expect("connect to the test cluster");
    run_schedules(&rt, 24, Just(keys), on_redis(&store));
}

trait NowForTest {
    fn now_micros_for_test(&self) -> u64;
}

impl NowForTest for ManualClock {
    fn now_micros_for_test(&self) -> u64 {
        tollgate::Clock::now_micros(self)
    }
}
