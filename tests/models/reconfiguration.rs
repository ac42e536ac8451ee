//! One rule name, two configurations: a layer refuses a name bound
//! to two unequal rules, and a store never reads state written under other parameters as
//! its own, nor as empty. Each case runs on `MemoryStore` and on `RedisStore` (standalone,
//! started by the test).

use std::time::Duration;

use crate::support::redis_server::{prefixed, RedisServer};
use crate::support::specs::{spec_of, Kind, Spec, KINDS};
use crate::support::vectors::BASE_MICROS;
use proptest::prelude::*;
use tollgate::layer::{Limit, RateLimitLayer, RateLimitLayerBuilder};
use tollgate::{
    key,
    store::{MemoryStore, RedisOptions, RedisStore, Store},
    Check, Clock, Decision, DenyReason, Limiter, ManualClock, Rate, Rule,
};

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

/// How many of `rules`, checked in turn one unit at a time on one key at one instant
/// (`rounds` times around), are admitted.
async fn admitted_alternating<S: Store>(
    limiter: &Limiter<S>,
    rules: &[Rule],
    rounds: usize,
) -> u64 {
    let mut admitted = 0;
    for _ in 0..rounds {
        for rule in rules {
            if limiter.check_one(rule, b"k").await.unwrap().is_admitted() {
                admitted += 1;
            }
        }
    }
    admitted
}

/// A fixed window and a token bucket named alike, alternating on one key, admit one
/// request a minute in all, as each does alone: neither reads the other's state as none.
async fn fixed_window_and_token_bucket_alternating<S: Store>(limiter: Limiter<S>) {
    let window = Rule::fixed_window("per-user", 1, MINUTE);
    let bucket = Rule::token_bucket("per-user", 1, Rate::per_minute(1));
    let admitted = admitted_alternating(&limiter, &[window, bucket], 10).await;
    assert_eq!(admitted, 1, "both configurations allow 1 per minute");
}

/// Smooth and stepped refill store the level at different scales, and neither reads the
/// other's level as its own: after 5 of a capacity of 10, 5 more pass in the same
/// microsecond, whichever refill asks.
async fn token_bucket_smooth_then_stepped<S: Store>(limiter: Limiter<S>) {
    let smooth = Rule::token_bucket("tb", 10, Rate::per_second(10));
    let stepped = Rule::token_bucket_stepped("tb", 10, Rate::per_second(10));
    let first = limiter
        .check(&[Check::new(&smooth, b"k").with_cost(5)])
        .await
        .unwrap();
    assert!(first.is_admitted());
    let second = limiter
        .check(&[Check::new(&stepped, b"k").with_cost(10)])
        .await
        .unwrap();
    assert!(!second.is_admitted(), "10 more after 5 of a capacity of 10");
    let alternating = admitted_alternating(&limiter, &[stepped, smooth], 10).await;
    assert_eq!(
        alternating, 5,
        "5 of the capacity of 10 are left in this microsecond"
    );
}

/// A bucket whose refill period is shortened admits no more than its capacity at once,
/// though the stored (scaled) level would read as more tokens under the new period.
async fn token_bucket_period_shortened<S: Store>(limiter: Limiter<S>) {
    let slow = Rule::token_bucket("tb", 10, Rate::new(10, SECOND));
    let fast = Rule::token_bucket("tb", 10, Rate::new(10, SECOND / 10));
    let admitted = admitted_alternating(&limiter, std::slice::from_ref(&slow), 5).await
        + admitted_alternating(&limiter, &[fast, slow], 10).await;
    assert_eq!(
        admitted, 10,
        "a capacity of 10 admits 10 in one microsecond"
    );
}

/// A bucket whose drain period is lengthened queues no more than its capacity at once,
/// though the stored (scaled) water would read as less under the new period.
async fn leaky_bucket_period_lengthened<S: Store>(limiter: Limiter<S>) {
    let fast = Rule::leaky_bucket("lb", 10, Rate::new(10, SECOND / 10));
    let slow = Rule::leaky_bucket("lb", 10, Rate::new(10, SECOND));
    let admitted = admitted_alternating(&limiter, &[fast], 10).await
        + admitted_alternating(&limiter, &[slow], 10).await;
    assert_eq!(admitted, 10, "a queue of 10 admits 10 in one microsecond");
}

/// State written under other parameters is not empty: the units it had in use count until
/// it would have been back to empty, with an exact retry-after, and then the new
/// configuration starts fresh.
async fn foreign_state_counts_until_it_expires<S: Store>(limiter: Limiter<S>, clock: ManualClock) {
    // 3 of 5 used in the minute window that started at BASE.
    let old = Rule::fixed_window("r", 5, MINUTE);
    let new = Rule::token_bucket("r", 4, Rate::per_second(4));
    clock.advance(Duration::from_secs(10));
    for _ in 0..3 {
        assert!(limiter.check_one(&old, b"k").await.unwrap().is_admitted());
    }
    // The bucket of 4 sees 3 in use: one left, and the units do not come back before the
    // old window ends, 50 s from now.
    let outcome = limiter
        .check(&[Check::new(&new, b"k").with_cost(2)])
        .await
        .unwrap();
    assert_eq!(
        outcome.decision,
        Decision::Deny(tollgate::Denial {
            reason: DenyReason::Limited,
            retry_after: Some(Duration::from_secs(50)),
        })
    );
    assert_eq!(outcome.rules[0].info.remaining, 1);
    let peek = limiter.peek(&new, b"k", 1).await.unwrap();
    assert_eq!(peek.decision, Decision::Allow);
    assert_eq!(peek.info.remaining, 0);

    clock.advance(Duration::from_secs(50) - Duration::from_micros(1));
    let early = limiter
        .check(&[Check::new(&new, b"k").with_cost(2)])
        .await
        .unwrap();
    assert!(
        !early.is_admitted(),
        "one microsecond before the retry-after"
    );
    clock.advance(std::time::Duration::from_micros(1));
    let on_time = limiter
        .check(&[Check::new(&new, b"k").with_cost(4)])
        .await
        .unwrap();
    assert!(
        on_time.is_admitted(),
        "the old window is over: a full bucket"
    );
}

/// The old configuration reading the new one's state sees its units too (a rolling
/// deploy goes both ways).
async fn both_directions_count<S: Store>(limiter: Limiter<S>) {
    let old = Rule::sliding_log("r", 4, MINUTE);
    let new = Rule::gcra("r", 6, Rate::per_minute(6));
    assert_eq!(
        admitted_alternating(&limiter, std::slice::from_ref(&old), 3).await,
        3
    );
    // GCRA sees 3 of its burst of 6 in use.
    assert_eq!(
        admitted_alternating(&limiter, std::slice::from_ref(&new), 5).await,
        3
    );
    // The log sees the 6 the GCRA had in use: its limit of 4 is used up.
    assert_eq!(admitted_alternating(&limiter, &[old, new], 3).await, 0);
}

/// A penalty lock is independent of the algorithm's state and survives a reconfiguration.
async fn penalty_survives_reconfiguration<S: Store>(limiter: Limiter<S>) {
    let lock = tollgate::Penalty::lock_for(MINUTE);
    let old = Rule::fixed_window("r", 1, SECOND).with_penalty(lock);
    let new = Rule::fixed_window("r", 100, SECOND).with_penalty(lock);
    assert!(limiter.check_one(&old, b"k").await.unwrap().is_admitted());
    let denied = limiter.check_one(&old, b"k").await.unwrap();
    assert!(!denied.is_admitted());
    let outcome = limiter.check_one(&new, b"k").await.unwrap();
    let Decision::Deny(denial) = outcome.decision else {
        panic!("the lock holds under the new configuration: {outcome:?}");
    };
    assert_eq!(denial.reason, DenyReason::Locked);
}

fn memory() -> (ManualClock, Limiter<MemoryStore>) {
    let clock = ManualClock::new(BASE_MICROS);
    (clock.clone(), Limiter::new(MemoryStore::with_clock(clock)))
}

async fn redis(server: &RedisServer, prefix: &str) -> (ManualClock, Limiter<RedisStore>) {
    let clock = ManualClock::new(BASE_MICROS);
    let store = RedisStore::connect_with(&server.url(), RedisOptions::new().prefix(prefix))
        .await
        .expect("connect to the test redis-server")
        .with_clock(clock.clone());
    (clock, Limiter::new(store))
}

/// In memory, a fixed window and a token bucket under one name on one key never read each
/// other's state as none.
#[tokio::test]
async fn memory_fixed_window_and_token_bucket_alternating() {
    fixed_window_and_token_bucket_alternating(memory().1).await;
}

/// In memory, smooth and stepped refill never read each other's token level as their own.
#[tokio::test]
async fn memory_token_bucket_smooth_then_stepped() {
    token_bucket_smooth_then_stepped(memory().1).await;
}

/// In memory, a token bucket whose refill period is shortened admits no more than its
/// capacity at once.
#[tokio::test]
async fn memory_token_bucket_period_shortened() {
    token_bucket_period_shortened(memory().1).await;
}

/// In memory, a leaky bucket whose drain period is lengthened queues no more than its
/// capacity at once.
#[tokio::test]
async fn memory_leaky_bucket_period_lengthened() {
    leaky_bucket_period_lengthened(memory().1).await;
}

/// In memory, state written under another configuration counts until it would have emptied,
/// and then the new configuration starts fresh.
#[tokio::test]
async fn memory_foreign_state_counts_until_it_expires() {
    let (clock, limiter) = memory();
    foreign_state_counts_until_it_expires(limiter, clock).await;
}

/// In memory, the old configuration counts the new one's units as the new counts the old's.
#[tokio::test]
async fn memory_both_directions_count() {
    both_directions_count(memory().1).await;
}

/// In memory, a penalty lock survives a reconfiguration of its rule.
#[tokio::test]
async fn memory_penalty_survives_reconfiguration() {
    penalty_survives_reconfiguration(memory().1).await;
}

/// The Redis store never reads state written under another configuration as its own, and a
/// penalty lock survives a reconfiguration.
#[tokio::test]
async fn redis_store_never_reads_another_configuration_as_its_own() {
    let server = RedisServer::start();
    fixed_window_and_token_bucket_alternating(redis(&server, "a").await.1).await;
    token_bucket_smooth_then_stepped(redis(&server, "b").await.1).await;
    token_bucket_period_shortened(redis(&server, "c").await.1).await;
    leaky_bucket_period_lengthened(redis(&server, "d").await.1).await;
    let (clock, limiter) = redis(&server, "e").await;
    foreign_state_counts_until_it_expires(limiter, clock).await;
    both_directions_count(redis(&server, "f").await.1).await;
    penalty_survives_reconfiguration(redis(&server, "g").await.1).await;
}

// ---------------------------------------------------------------------------------------------
// Build time: a layer refuses a name bound to two unequal rules.

fn layer() -> RateLimitLayerBuilder<MemoryStore> {
    RateLimitLayer::builder()
}

fn per_user(rule: Rule) -> Limit {
    Limit::new(rule, key::header("user-id"))
}

/// A layer refuses one rule name for two different rules anywhere in it, naming both
/// places, and allows one rule shared by several routes.
#[test]
fn a_layer_refuses_one_name_for_two_rules() {
    let window = Rule::fixed_window("per-user", 1, MINUTE);
    let bucket = Rule::token_bucket("per-user", 1, Rate::per_minute(1));

    // The layer's own limits and a route.
    let err = layer()
        .limit(per_user(window.clone()))
        .route("POST /sms/send", [per_user(bucket.clone())])
        .build()
        .unwrap_err()
        .to_string();
    for part in ["\"per-user\"", "every request", "POST /sms/send"] {
        assert!(err.contains(part), "{err:?} names {part}");
    }

    // Two routes, in either order of declaration.
    let err = layer()
        .route("/a", [per_user(window.clone())])
        .route("/b", [per_user(bucket.clone())])
        .build()
        .unwrap_err()
        .to_string();
    for part in ["\"per-user\"", "/a", "/b"] {
        assert!(err.contains(part), "{err:?} names {part}");
    }
    let err = layer()
        .route("/a", [per_user(window.clone())])
        .limit(per_user(bucket.clone()))
        .build()
        .unwrap_err()
        .to_string();
    for part in ["\"per-user\"", "/a", "every request"] {
        assert!(err.contains(part), "{err:?} names {part}");
    }

    // Same algorithm, other parameters.
    let bigger = Rule::fixed_window("per-user", 2, MINUTE);
    assert!(layer()
        .route("/a", [per_user(window.clone())])
        .route("/b", [per_user(bigger)])
        .build()
        .is_err());

    // One rule on several routes is one limit shared by them: allowed.
    assert!(layer()
        .route("/a", [per_user(window.clone())])
        .route("/b", [per_user(window.clone())])
        .build()
        .is_ok());
}

/// A rule's fingerprint is its algorithm and exact parameters, not its name, penalty or
/// cost, and is stable across processes and versions.
#[test]
fn the_fingerprint_is_the_parameters_not_the_name_or_penalty() {
    let a = Rule::fixed_window("a", 5, MINUTE);
    let b = Rule::fixed_window("b", 5, MINUTE)
        .with_penalty(tollgate::Penalty::lock_for(MINUTE))
        .with_cost(2);
    assert_eq!(a.fingerprint(), b.fingerprint());
    let c = Rule::fixed_window("a", 6, MINUTE);
    assert_ne!(a.fingerprint(), c.fingerprint());
    let d = Rule::fixed_window_from_first_hit("a", 5, MINUTE);
    assert_ne!(a.fingerprint(), d.fingerprint());
    let e = Rule::sliding_log("a", 5, MINUTE);
    assert_ne!(a.fingerprint(), e.fingerprint());
    // Two GCRA rates whose emission intervals round to the same whole microsecond keep
    // their states at different scales (a fraction in 1/amount µs): different configurations.
    let fast = Rule::gcra("g", 10, Rate::per_second(600_000));
    let slow = Rule::gcra("g", 10, Rate::per_second(500_000));
    assert_ne!(fast.fingerprint(), slow.fingerprint());
    // The same rate written two ways is one configuration: 3 per second is 6 per 2 seconds.
    let three = Rule::token_bucket("t", 3, Rate::per_second(3));
    let six = Rule::token_bucket("t", 3, Rate::new(6, 2 * SECOND));
    assert_eq!(three.fingerprint(), six.fingerprint());
    // Exact in a Lua double, and the same in every process and version.
    assert!(a.fingerprint() < 1 << 52);
    assert_eq!(
        Rule::token_bucket("x", 10, Rate::per_second(10)).fingerprint(),
        FINGERPRINT_OF_TOKEN_BUCKET_10_PER_SECOND
    );
}

/// Pinned: a change of the encoding (`Algorithm::code_and_params`) would make every deployed
/// record foreign.
const FINGERPRINT_OF_TOKEN_BUCKET_10_PER_SECOND: u64 = 1_342_366_245_264_369;

// ---------------------------------------------------------------------------------------------
// Property: a reconfiguration hands out no second quota.

/// The test's configurations share one rule name.
fn rule_of(spec: &Spec) -> Rule {
    spec.rule("shared-name")
}

/// The most units this configuration alone admits in `t` consecutive microseconds
/// (`t ≥ 1`), from any state: its quota at once, plus what its windows, refill or drain
/// add over the `t − 1` µs that follow.
fn most_in(spec: &Spec, t: u64) -> u64 {
    let (q, a, p) = (spec.quota, spec.amount, spec.period);
    let after = t - 1;
    match spec.kind {
        // One window per `p` µs, plus the one the interval starts in (the boundary
        // burst); the sliding counter never admits more than a fixed window would.
        Kind::FixedWindow | Kind::FixedWindowFromFirstHit | Kind::SlidingWindow => {
            q * (after.div_ceil(p) + 1)
        }
        // At most `q` in any `p` consecutive microseconds.
        Kind::SlidingLog => q * t.div_ceil(p),
        // GCRA keeps the fraction of its emission interval: a token bucket in virtual time.
        Kind::TokenBucket | Kind::LeakyBucket | Kind::Gcra => q + after * a / p,
        // A step of `a` tokens at most every `p` µs.
        Kind::TokenBucketStepped => q + a * after.div_ceil(p),
    }
}

fn any_spec() -> impl Strategy<Value = Spec> {
    prop::sample::select(KINDS.to_vec()).prop_flat_map(spec_of)
}

/// Two configurations of one name: of the same algorithm with other parameters (or another
/// refill), or of two algorithms.
fn pair() -> impl Strategy<Value = (Spec, Spec)> {
    prop_oneof![
        any_spec().prop_flat_map(|a| (Just(a), spec_of(a.kind))),
        (any_spec(), any_spec()),
    ]
}

/// One request: move the clock, maybe switch to the other configuration, check `cost`.
#[derive(Debug, Clone, Copy)]
struct Step {
    advance: u64,
    switch: bool,
    cost: u64,
}

/// Schedules: a rolling deploy (the configuration changes at about every other request)
/// or a deploy now and then.
fn schedule(steps: usize) -> impl Strategy<Value = Vec<Step>> {
    (prop_oneof![Just(0.5), Just(0.1)]).prop_flat_map(move |p| {
        prop::collection::vec(
            (
                prop_oneof![
                    3 => Just(0u64),
                    4 => 1..=100u64,
                    2 => 1..=3_000u64,
                    1 => 3_000..=20_000u64,
                ],
                prop::bool::weighted(p),
                prop_oneof![5 => Just(1u64), 2 => 0..=3u64, 1 => 4..=7u64],
            )
                .prop_map(|(advance, switch, cost)| Step {
                    advance,
                    switch,
                    cost,
                }),
            1..steps,
        )
    })
}

/// Runs `steps` on `limiter` under `rules` (starting with the first) and returns the
/// admissions as (instant, units) and every outcome.
async fn run_schedule<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    rules: &[Rule; 2],
    steps: &[Step],
) -> (Vec<(u64, u64)>, Vec<tollgate::Outcome>) {
    let mut current = 0;
    let mut admitted = Vec::new();
    let mut outcomes = Vec::new();
    for step in steps {
        clock.advance(std::time::Duration::from_micros(step.advance));
        current ^= usize::from(step.switch);
        let outcome = limiter
            .check(&[Check::new(&rules[current], b"k").with_cost(step.cost)])
            .await
            .expect("the store decides");
        if outcome.is_admitted() && step.cost > 0 {
            admitted.push((clock.now_micros(), step.cost));
        }
        outcomes.push(outcome);
    }
    (admitted, outcomes)
}

/// The bound a reconfiguration must keep. For two configurations `a` and `b` of one name,
/// let `most_a(t)` be the most units `a` alone admits in `t` consecutive microseconds (its
/// quota plus what its windows, refill or drain add over the rest; see [`most_in`]).
/// Then, however requests alternate between `a` and `b` on one key, the units admitted in
/// any `t` consecutive microseconds never exceed
///
/// ```text
/// most_a(t) + most_b(t) − min(quota_a, quota_b)
/// ```
///
/// At `t = 1` that is `max(quota_a, quota_b)`: within one microsecond, switching hands out
/// no second quota (reading the other configuration's state as empty, or at another
/// scale, admitted 15 of a capacity of 10, or 20 of 20 where both allow 1). Over longer
/// intervals the old configuration may have freed units the new one would still count (a
/// token bucket that refilled them, a window that ended): no stored summary can know them,
/// so the bound allows each configuration its own refill on top, never a second burst
/// beyond the larger quota.
fn assert_bound(a: &Spec, b: &Spec, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    for (i, &(start, _)) in admitted.iter().enumerate() {
        let mut units = 0;
        for &(at, cost) in &admitted[i..] {
            units += cost;
            let t = at - start + 1;
            let bound = most_in(a, t) + most_in(b, t) - a.quota.min(b.quota);
            prop_assert!(
                units <= bound,
                "{units} units in {t} µs from {start}, more than {bound}: {admitted:?}"
            );
        }
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// See [`assert_bound`]: on `MemoryStore`, for random pairs and schedules.
    #[test]
    fn memory_store_reconfiguration_never_hands_out_a_second_quota(
        (a, b) in pair(),
        steps in schedule(60),
    ) {
        let rt = runtime();
        let (clock, limiter) = memory();
        let rules = [rule_of(&a), rule_of(&b)];
        let (admitted, _) = rt.block_on(run_schedule(&limiter, &clock, &rules, &steps));
        assert_bound(&a, &b, &admitted)?;
    }
}

/// The same property against `RedisStore` (fewer cases: one server, one case at a time),
/// which must also decide exactly as `MemoryStore` does on the same schedule: the Lua twin
/// of the reconfiguration rule.
#[test]
fn redis_store_reconfiguration_never_hands_out_a_second_quota_and_matches_memory() {
    use proptest::test_runner::{Config, TestRunner};
    let server = RedisServer::start();
    let rt = runtime();
    let url = server.url();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&(pair(), schedule(40)), |((a, b), steps)| {
            case.set(case.get() + 1);
            let rules = [rule_of(&a), rule_of(&b)];
            let (memory_clock, memory) = memory();
            let redis_clock = ManualClock::new(BASE_MICROS);
            let store = rt.block_on(prefixed(&url, format!("case{}", case.get())));
            let redis = Limiter::new(store.with_clock(redis_clock.clone()));
            let (m_admitted, m_outcomes) =
                rt.block_on(run_schedule(&memory, &memory_clock, &rules, &steps));
            let (r_admitted, r_outcomes) =
                rt.block_on(run_schedule(&redis, &redis_clock, &rules, &steps));
            prop_assert_eq!(&m_outcomes, &r_outcomes);
            prop_assert_eq!(&m_admitted, &r_admitted);
            assert_bound(&a, &b, &r_admitted)
        })
        .unwrap();
}
