//! Each admission counts at the instant it passes. Wait mode never over-admits: a
//! reservation takes units at a later instant without forgetting what still counts before
//! it (a fixed window and a sliding log keep the current window's admissions when a
//! reservation reaches past it). A batch with a leaky bucket passes when the bucket's queue
//! lets it go, and every rule on the bucket's key counts it then, in enforce and wait modes,
//! never in a window it does not pass in; rules on other keys are left to the release,
//! where the `Reservation` counts them when it is confirmed, so one client's queue never
//! dates a shared state.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::redis_server::{RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::{
    store::{MemoryStore, RedisOptions, RedisStore, Store},
    Check, Clock, Decision, Limiter, ManualClock, Outcome, Rate, Rule, RuleOutcome, StoreError,
};

const T0: u64 = crate::support::EPOCH;

/// Two admitted at t=5, a reservation at t=6 into the future, then a plain request at t=7:
/// with a limit of 2 per 10 µs it is denied.
async fn request_before_a_reservation_is_denied<S: Store + Clone>(
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
        // Held while the next request comes: dropped, it would give its unit back.
        let reserved = limiter.reserve(&batch, us(10)).await.unwrap();
        assert!(
            matches!(reserved.outcome().decision, Decision::Delay(_)),
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

/// [`request_before_a_reservation_is_denied`] on MemoryStore.
#[tokio::test]
async fn a_reservation_keeps_the_current_window_memory() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    request_before_a_reservation_is_denied(&limiter, &clock).await;
}

/// [`request_before_a_reservation_is_denied`] on a Redis server.
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
            // The reservations are held to the end: each keeps the units it took.
            let mut held = Vec::new();
            for &(advance, cost, wait) in &steps {
                clock.advance(std::time::Duration::from_micros(advance));
                let now = clock.now_micros_for_test();
                let reservation = rt
                    .block_on(limiter.reserve(&[Check::new(rule, b"k").with_cost(cost)], us(wait)))
                    .unwrap();
                let decision = reservation.outcome().decision;
                held.push(reservation);
                match decision {
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

/// The schedules below run in milliseconds: the tokio timer that ends a reservation's wait
/// has a resolution of 1 ms.
const MS: u64 = 1000;

/// The rules random batches draw from: two leaky buckets (1 unit per 10 ms and per 4 ms), a
/// fixed window and a sliding log (4 per 20 ms each).
fn batch_rules() -> [Rule; 4] {
    let ms = Duration::from_millis;
    [
        Rule::leaky_bucket("slow-queue", 3, Rate::new(1, ms(10))),
        Rule::leaky_bucket("fast-queue", 4, Rate::new(1, ms(4))),
        Rule::fixed_window("window", 4, ms(20)),
        Rule::sliding_log("log", 4, ms(20)),
    ]
}

/// One request: ms the clock moves first, each rule's cost (0: not in the batch), and
/// `max_wait` ms (0: enforce mode).
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

/// The store's clock: tokio's (paused) time, from `T0`, so that a reservation's wait and
/// the store's instants are one time line.
#[derive(Debug, Clone)]
struct TokioClock(tokio::time::Instant);

impl TokioClock {
    /// From now on tokio's clock (inside the runtime).
    fn starting_now() -> Self {
        Self(tokio::time::Instant::now())
    }
}

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        T0 + self.0.elapsed().as_micros() as u64
    }
}

/// Runs `call` with tokio's paused clock held still: while a blocking task is in flight the
/// clock does not auto-advance, so a round trip to Redis takes no time on it (and no
/// timeout fires for want of an answer).
async fn still<F: Future>(call: F) -> F::Output {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || {
        let _ = wait.recv();
    });
    let output = call.await;
    drop(done);
    holder.await.expect("the blocking task ends");
    output
}

tokio::task_local! {
    /// The request (its step's index) a store call is made for.
    static REQUEST: usize;
}

/// One decision the store gave for a request: at which instant (µs), whether the batch was
/// admitted, and per check (index in [`batch_rules`], cost, the delay its rule reported in
/// µs).
#[derive(Debug)]
struct Call {
    request: usize,
    at: u64,
    admitted: bool,
    rules: Vec<(usize, u64, u64)>,
}

/// A store that logs each decision it gives for a request (made in [`REQUEST`]'s scope),
/// keeps tokio's clock still while its inner store answers, and takes one call at a time:
/// a schedule's decisions follow one another as its steps say, the releases confirmed on
/// tasks of their own included, so a Cluster's cross-slot batch is decided part by part
/// with no other decision in between.
#[derive(Clone)]
struct Recorded<S> {
    inner: S,
    clock: TokioClock,
    calls: Arc<Mutex<Vec<Call>>>,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl<S: Store + Clone> Store for Recorded<S> {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        let _turn = self.turn.lock().await;
        let at = self.clock.now_micros();
        let outcome = still(self.inner.check(batch, wait)).await?;
        if let Ok(request) = REQUEST.try_with(|r| *r) {
            let names = batch_rules().map(|r| r.name().to_owned());
            let rules = batch
                .iter()
                .zip(&outcome.rules)
                .map(|(check, rule)| {
                    let index = names.iter().position(|n| n == check.rule.name());
                    let delay = match rule.decision {
                        Decision::Delay(d) => d.as_micros() as u64,
                        _ => 0,
                    };
                    (index.expect("a rule of batch_rules"), check.cost, delay)
                })
                .collect();
            self.calls.lock().unwrap().push(Call {
                request,
                at,
                admitted: outcome.is_admitted(),
                rules,
            });
        }
        Ok(outcome)
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        let _turn = self.turn.lock().await;
        still(self.inner.lease(check, term, ending)).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        let _turn = self.turn.lock().await;
        still(self.inner.peek(check)).await
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        let _turn = self.turn.lock().await;
        still(self.inner.refund(batch, outcome)).await
    }
    async fn reset(&self, rule: &Rule, key: &tollgate::StoredKey<'_>) -> Result<(), StoreError> {
        let _turn = self.turn.lock().await;
        still(self.inner.reset(rule, key)).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), tollgate::StoreError> {
        self.inner.overdraw(batch).await
    }
    async fn count_denials(
        &self,
        batch: &[Check<'_>],
        ago: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.inner.count_denials(batch, ago).await
    }
    fn health(&self) -> tollgate::store::Health {
        self.inner.health()
    }
}

/// Runs `steps` on `store` (rule `i` on `keys[i]`), holding each admitted request in its
/// `Reservation` and confirming it at its release as the layer does (on a task of its own,
/// while the next requests come), and checks every rule of each request that passes
/// against the instant it passes (its confirmation lets it go then): no fixed window and no
/// window-long interval of the sliding log holds more than 4, and each leaky bucket lets
/// units leave no faster than it drains (in any `[a, b]`, the units beside the largest are
/// at most `(b − a) / period`), whichever other queue holds the request longer. The store's
/// decision that counted each rule says that instant too (`now` + the delay the rule
/// reports: the reservation, or the confirmation at the release for a rule left pending).
/// Only requests that pass count: one denied at its release counts nowhere.
async fn every_rule_counts_where_it_says<S: Store + Clone>(
    store: S,
    clock: TokioClock,
    keys: [&'static [u8]; 4],
    steps: &[BatchStep],
) -> Result<(), TestCaseError> {
    let rules = batch_rules();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let limiter = Limiter::new(Recorded {
        inner: store,
        clock: clock.clone(),
        calls: calls.clone(),
        turn: Arc::default(),
    });
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
    let fail = |e: StoreError| TestCaseError::fail(e.to_string());
    let mut releases = Vec::new();
    let mut elapsed = 0;
    for (request, &(advance, costs, wait)) in steps.iter().enumerate() {
        elapsed += advance * MS;
        tokio::time::sleep_until(clock.0 + Duration::from_micros(elapsed)).await;
        let batch = batch_of(costs);
        if batch.is_empty() {
            continue;
        }
        let max_wait = Duration::from_micros(wait * MS);
        let mut reservation = REQUEST
            .scope(request, limiter.reserve(&batch, max_wait))
            .await
            .map_err(fail)?;
        if !reservation.outcome().is_admitted() {
            continue;
        }
        let delays = delays_of(costs, reservation.outcome());
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
        let clock = clock.clone();
        releases.push(tokio::spawn(REQUEST.scope(request, async move {
            let released = reservation.confirm().await;
            let passed = released.map(|outcome| outcome.is_admitted().then(|| clock.now_micros()));
            (request, passed)
        })));
    }
    // Each request that passed, with the instant it did.
    let mut passed_requests = HashMap::new();
    for release in releases {
        let (request, passed) = release.await.expect("the release task ends");
        if let Some(at) = passed.map_err(fail)? {
            passed_requests.insert(request, at);
        }
    }
    // Each rule of a request that passed, at the instant the request passed, and the first
    // rule that counted it elsewhere (the last decision that included it says where: the
    // reservation, or the confirmation that counted it at the release).
    let mut passed: [Vec<(u64, u64)>; 4] = Default::default();
    let mut elsewhere = None;
    {
        let calls = calls.lock().unwrap();
        for (&request, &at) in &passed_requests {
            let mut counted = [None; 4];
            for call in calls.iter().filter(|c| c.request == request) {
                prop_assert!(call.admitted, "request {} passed: {:?}", request, call);
                for &(i, cost, delay) in &call.rules {
                    counted[i] = Some((call.at + delay, cost));
                }
            }
            for (i, &counted) in counted.iter().enumerate() {
                let Some((t, cost)) = counted else { continue };
                if t != at && elsewhere.is_none() {
                    elsewhere = Some(format!(
                        "request {request}: {} counts it at +{} µs, it passes at +{} µs",
                        rules[i].name(),
                        t - T0,
                        at - T0
                    ));
                }
                passed[i].push((at, cost));
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
    for (queue, period) in [(0, 10 * MS), (1, 4 * MS)] {
        let log = &passed[queue];
        for (i, &(a, _)) in log.iter().enumerate() {
            let (mut n, mut largest) = (0, 0);
            for &(b, c) in &log[i..] {
                n += c;
                largest = largest.max(c);
                prop_assert!(
                    n - largest <= (b - a) / period,
                    "{}: {} units leave in [{}, {}] µs",
                    rules[queue].name(),
                    n,
                    a - T0,
                    b - T0
                );
            }
        }
    }
    let window = 20 * MS;
    for &(t, _) in &passed[2] {
        let start = t - t % window;
        let n = units(&passed[2], start, start + window);
        prop_assert!(
            n <= 4,
            "fixed window [{} µs, +20 ms) passed {}",
            start - T0,
            n
        );
    }
    for &(a, _) in &passed[3] {
        let n = units(&passed[3], a, a + window);
        prop_assert!(
            n <= 4,
            "sliding log passed {} in [{} µs, +20 ms)",
            n,
            a - T0
        );
    }
    match elsewhere {
        Some(elsewhere) => Err(TestCaseError::fail(elsewhere)),
        None => Ok(()),
    }
}

/// A runtime on tokio's paused clock: time moves only to the next timer, when every task
/// waits for one.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Runs `cases` random schedules on the rules' `keys` through
/// [`every_rule_counts_where_it_says`], each on a fresh store `store_for(clock, case)` makes
/// (a Redis store: under a prefix of its own), on `rt` (the one a Redis store was connected on).
fn run_schedules<S: Store + Clone, F: std::future::Future<Output = S>>(
    rt: &tokio::runtime::Runtime,
    cases: u32,
    keys: impl Strategy<Value = [&'static [u8]; 4]>,
    store_for: impl Fn(TokioClock, usize) -> F,
) {
    let case = AtomicUsize::new(0);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
    .run(&(keys, batch_steps()), |(keys, steps)| {
        rt.block_on(async {
            let clock = TokioClock::starting_now();
            let store = store_for(clock.clone(), case.fetch_add(1, Ordering::Relaxed)).await;
            every_rule_counts_where_it_says(store, clock, keys, &steps).await
        })
    })
    .unwrap();
}

/// A store of `url` per case, under a prefix of its own.
fn on_redis(url: String) -> impl Fn(TokioClock, usize) -> BoxFuture<RedisStore> {
    move |clock, case| {
        let options = RedisOptions::new().prefix(format!("case{case}"));
        let url = url.clone();
        Box::pin(async move {
            let store = still(RedisStore::connect_with(&url, options)).await;
            store.expect("connect").with_clock(clock)
        })
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T>>>;

/// Every rule on one key: one script call per batch on Redis.
const ONE_KEY: [&[u8]; 4] = [b"k"; 4];

/// Random batches with every rule on one key count each rule where it says
/// ([`every_rule_counts_where_it_says`]), on MemoryStore.
#[test]
fn batches_with_a_leaky_bucket_count_each_rule_where_it_says_memory() {
    run_schedules(&runtime(), 256, Just(ONE_KEY), |clock, _| {
        std::future::ready(MemoryStore::with_clock(clock))
    });
}

/// The same on a Redis server: one script call per batch.
#[test]
fn batches_with_a_leaky_bucket_count_each_rule_where_it_says_redis() {
    let server = RedisServer::start();
    let rt = runtime();
    run_schedules(&rt, 48, Just(ONE_KEY), on_redis(server.url()));
}

/// The keys a mixed batch puts its rules on: the slow queue on the client's key, each other
/// rule on the client's key or on a shared one.
fn mixed_keys() -> impl Strategy<Value = [&'static [u8]; 4]> {
    let key = || prop_oneof![Just(&b"client"[..]), Just(&b"shared"[..])];
    (key(), key(), key()).prop_map(|(fast, window, log)| [&b"client"[..], fast, window, log])
}

/// Random batches whose rules lie on the client's key or a shared one count each rule
/// where it says, on MemoryStore: the shared rules beside a client's queue are counted at
/// the release.
#[test]
fn mixed_key_batches_with_a_leaky_bucket_count_each_rule_where_it_says_memory() {
    run_schedules(&runtime(), 256, mixed_keys(), |clock, _| {
        std::future::ready(MemoryStore::with_clock(clock))
    });
}

/// The same on a Redis server.
#[test]
fn mixed_key_batches_with_a_leaky_bucket_count_each_rule_where_it_says_redis() {
    let server = RedisServer::start();
    let rt = runtime();
    run_schedules(&rt, 48, mixed_keys(), on_redis(server.url()));
}

/// The same on a Redis Cluster: the two keys lie in different slots, so a mixed batch is
/// two script calls, and a leaky bucket's queue in one does not move the other.
#[test]
fn mixed_key_batches_count_each_rule_where_it_says_cluster() {
    let slot = |k: &[u8]| redis::cluster_routing::Slot::for_key([b"{", k, b"}"].concat());
    assert_ne!(slot(b"client"), slot(b"shared"), "the keys span slots");
    let cluster = RedisCluster::start();
    let rt = runtime();
    run_schedules(&rt, 24, mixed_keys(), on_redis(cluster.url()));
}

/// The keys of a batch with a queue on each of two keys: the slow queue on the client's
/// key, the fast one on a shared key, each other rule on either.
fn two_queue_keys() -> impl Strategy<Value = [&'static [u8]; 4]> {
    let key = || prop_oneof![Just(&b"client"[..]), Just(&b"shared"[..])];
    (key(), key()).prop_map(|(window, log)| [&b"client"[..], &b"shared"[..], window, log])
}

/// Random batches with a leaky bucket on each of two keys: the queue that would release a
/// request earlier lets it go when the other one does, and its own outflow never exceeds
/// its rate for it, on MemoryStore.
#[test]
fn queues_on_two_keys_never_drain_faster_than_their_rate_memory() {
    run_schedules(&runtime(), 256, two_queue_keys(), |clock, _| {
        std::future::ready(MemoryStore::with_clock(clock))
    });
}

/// The same on a Redis server: the script decides both queues in one call.
#[test]
fn queues_on_two_keys_never_drain_faster_than_their_rate_redis() {
    let server = RedisServer::start();
    let rt = runtime();
    run_schedules(&rt, 48, two_queue_keys(), on_redis(server.url()));
}

/// The same on a Redis Cluster: the two queues lie in different slots, each decided by a
/// script call of its own.
#[test]
fn queues_on_two_keys_never_drain_faster_than_their_rate_cluster() {
    let cluster = RedisCluster::start();
    let rt = runtime();
    run_schedules(&rt, 24, two_queue_keys(), on_redis(cluster.url()));
}

/// The same on a Redis Cluster with each rule on a key of its own, so a batch spans slots
/// and each slot's part is one script call: the parts still reserve one instant.
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
    run_schedules(&rt, 24, Just(keys), on_redis(cluster.url()));
}

trait NowForTest {
    fn now_micros_for_test(&self) -> u64;
}

impl NowForTest for ManualClock {
    fn now_micros_for_test(&self) -> u64 {
        tollgate::Clock::now_micros(self)
    }
}

/// A reservation denied at its release has given the other rules' units back when
/// `confirm` answers, however long the store takes to refund: the next request sees
/// them, on a Cluster whose parts refund slot by slot as on one node.
#[tokio::test(start_paused = true)]
async fn a_release_denied_has_given_back_when_confirm_answers() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let limiter = Limiter::new(super::leases::SlowRefunds(store.clone()));
    let queue = Rule::leaky_bucket("q", 5, Rate::new(1, Duration::from_millis(100)));
    let window = Rule::fixed_window("w", 1, Duration::from_secs(1));
    let first = [Check::new(&queue, b"a")];
    assert!(limiter.check(&first).await.unwrap().is_admitted());
    let before = limiter.peek(&queue, b"a", 1).await.unwrap().info;

    let both = [Check::new(&queue, b"a"), Check::new(&window, b"t")];
    let mut held = limiter
        .reserve(&both, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(held.outcome().decision, Decision::Delay(_)));
    // Another request takes the window's unit before the held one is released.
    let other = [Check::new(&window, b"t")];
    assert!(limiter.check(&other).await.unwrap().is_admitted());

    assert!(!held.confirm().await.unwrap().is_admitted());
    let after = limiter.peek(&queue, b"a", 1).await.unwrap().info;
    assert_eq!(
        after.remaining, before.remaining,
        "the queue's unit is back"
    );
}
