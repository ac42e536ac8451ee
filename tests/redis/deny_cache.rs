//! The deny cache of `RedisStore` (`with_deny_cache`): exact (the same schedule with the
//! cache on and off gives identical decisions), cheap under abuse (script calls per
//! rejected request), cleared everywhere by a reset on any instance, and bounded.

use std::time::Duration;

use crate::support::redis_server::{prefixed, RedisServer};
use crate::support::vectors::BASE_MICROS;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::{
    store::{RedisStore, Store},
    Check, Decision, Limiter, ManualClock, Outcome, Penalty, Rate, Rule,
};

fn rules() -> Vec<Rule> {
    let ms = Duration::from_millis;
    vec![
        Rule::fixed_window("fw", 3, ms(100)),
        Rule::fixed_window_from_first_hit("ff", 4, ms(150))
            .with_penalty(Penalty::lock_for(ms(700)).after(2).within(ms(500))),
        Rule::sliding_log("sl", 4, ms(200)),
        Rule::sliding_window("sw", 5, ms(120)),
        Rule::token_bucket("tb", 5, Rate::new(3, ms(100))),
        Rule::token_bucket_stepped("ts", 4, Rate::new(2, ms(90)))
            .with_penalty(Penalty::lock_for(ms(300))),
        Rule::leaky_bucket("lb", 4, Rate::new(3, ms(100))),
        Rule::gcra("gc", 3, Rate::new(3, ms(100))),
        // A lock shorter than the algorithm's own retry: not cacheable as a lock.
        Rule::fixed_window("fl", 2, ms(400)).with_penalty(Penalty::lock_for(ms(50))),
    ]
}

#[derive(Debug, Clone)]
enum Action {
    Check {
        key: u8,
        cost: u64,
        /// Indices into `rules()`, distinct.
        rules: Vec<usize>,
        max_wait_us: u64,
        shadow_last: bool,
    },
    Reset {
        key: u8,
        rule: usize,
    },
}

#[derive(Debug, Clone)]
struct Step {
    advance_us: u64,
    action: Action,
}

fn step() -> impl Strategy<Value = Step> {
    let n = rules().len();
    let check = (
        0u8..2,
        prop_oneof![6 => 1u64..4, 1 => Just(0u64), 1 => 4u64..7],
        prop_oneof![
            3 => proptest::sample::subsequence((0..n).collect::<Vec<usize>>(), 1..2),
            1 => proptest::sample::subsequence((0..n).collect::<Vec<usize>>(), 1..4),
        ],
        prop_oneof![5 => Just(0u64), 1 => 0u64..300_000],
        proptest::bool::weighted(0.1),
    )
        .prop_map(
            |(key, cost, rules, max_wait_us, shadow_last)| Action::Check {
                key,
                cost,
                rules,
                max_wait_us,
                shadow_last,
            },
        );
    let reset = (0u8..2, 0..n).prop_map(|(key, rule)| Action::Reset { key, rule });
    (
        prop_oneof![3 => Just(0u64), 3 => 0u64..5_000, 2 => 0u64..150_000, 1 => 0u64..800_000],
        prop_oneof![12 => check, 1 => reset],
    )
        .prop_map(|(advance_us, action)| Step { advance_us, action })
}

/// Runs `steps` on `limiter`, moving `clock`; the decisions, batch and per rule.
async fn run<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    rules: &[Rule],
    steps: &[Step],
) -> Vec<(Decision, Vec<Decision>)> {
    let mut decisions = Vec::new();
    for s in steps {
        clock.advance(std::time::Duration::from_micros(s.advance_us));
        match &s.action {
            Action::Check {
                key,
                cost,
                rules: which,
                max_wait_us,
                shadow_last,
            } => {
                let key = [b'k', *key];
                let mut batch: Vec<Check<'_>> = which
                    .iter()
                    .map(|&r| Check::new(&rules[r], &key).with_cost(*cost))
                    .collect();
                if *shadow_last && batch.len() > 1 {
                    if let Some(last) = batch.last_mut() {
                        last.refusal = tollgate::Refusal::Shadow;
                    }
                }
                let wait = Duration::from_micros(*max_wait_us);
                let outcome: Outcome = limiter.store().check(&batch, wait).await.expect("check");
                let each = outcome.rules.iter().map(|r| r.decision).collect();
                decisions.push((outcome.decision, each));
            }
            Action::Reset { key, rule } => {
                limiter
                    .reset(&rules[*rule], &[b'k', *key])
                    .await
                    .expect("reset");
            }
        }
    }
    decisions
}

/// The differential property: the same schedule with the cache on and off gives identical
/// decisions (reason, retry-after, delay), batch and per rule, on one Redis, one clock per
/// run; and the cached run calls the script less.
#[test]
fn decisions_are_identical_with_the_cache_on_and_off() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let rules = rules();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    let (calls_off, calls_on) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
    runner
        .run(&proptest::collection::vec(step(), 1..60), |steps| {
            case.set(case.get() + 1);
            rt.block_on(async {
                let clock_off = ManualClock::new(BASE_MICROS + 123_457);
                let off = prefixed(&url, format!("off{}", case.get())).await;
                let off = Limiter::new(off.with_clock(clock_off.clone()));
                let before = server.script_calls();
                let expected = run(&off, &clock_off, &rules, &steps).await;
                let middle = server.script_calls();

                let clock_on = ManualClock::new(BASE_MICROS + 123_457);
                let on = Limiter::new(
                    prefixed(&url, format!("on{}", case.get()))
                        .await
                        .with_clock(clock_on.clone())
                        .with_deny_cache(64)
                        .await
                        .expect("subscribe"),
                );
                // After the connect's dry decision.
                let start = server.script_calls();
                let got = run(&on, &clock_on, &rules, &steps).await;
                calls_off.set(calls_off.get() + middle - before);
                calls_on.set(calls_on.get() + server.script_calls() - start);
                for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
                    prop_assert_eq!(e, g, "decision {} of {:?}", i, steps);
                }
                Ok(())
            })
        })
        .unwrap();
    assert!(
        calls_on.get() < calls_off.get(),
        "the cache answered nothing: {} script calls with it, {} without",
        calls_on.get(),
        calls_off.get()
    );
}

/// A client sending 95 % of its requests over its limit, at 100 requests per second: with
/// the cache, at most 0.1 script calls per rejected request (from `INFO commandstats`), and
/// the same decisions as without it.
#[test]
fn abuse_costs_redis_few_calls_and_changes_no_decision() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = Duration::from_secs;
        let abusive = [
            Rule::fixed_window("fixed", 5, s(1)),
            Rule::sliding_log("log", 5, s(1)),
            Rule::token_bucket("bucket", 5, Rate::per_second(5)),
            Rule::gcra("gcra", 5, Rate::per_second(5)),
            Rule::sliding_window("window", 5, s(1))
                .with_penalty(Penalty::lock_for(s(30)).after(3).within(s(1))),
        ];
        for rule in &abusive {
            let mut runs = Vec::new();
            for cached in [false, true] {
                let clock = ManualClock::new(BASE_MICROS);
                let mut store = prefixed(&server.url(), format!("{}-{cached}", rule.name()))
                    .await
                    .with_clock(clock.clone());
                if cached {
                    store = store.with_deny_cache(1_000).await.expect("subscribe");
                }
                let limiter = Limiter::new(store);
                let before = server.script_calls();
                let mut decisions = Vec::new();
                // 100 requests per second for 20 s: 5 per second are within the limit.
                for _ in 0..2_000 {
                    let outcome = limiter.check_one(rule, b"abuser").await.expect("check");
                    decisions.push(outcome.decision);
                    clock.advance(Duration::from_millis(10));
                }
                let calls = server.script_calls() - before;
                let rejected = decisions.iter().filter(|d| !d.is_admitted()).count();
                runs.push((decisions, calls, rejected));
            }
            let (off, on) = (&runs[0], &runs[1]);
            eprintln!(
                "{}: {} rejected of 2000; script calls {} without the cache, {} with it",
                rule.name(),
                on.2,
                off.1,
                on.1
            );
            assert_eq!(
                off.0,
                on.0,
                "{}: decisions differ with the cache",
                rule.name()
            );
            assert!(
                off.2 >= 1_850,
                "{}: only {} of 2000 rejected",
                rule.name(),
                off.2
            );
            // Every admitted request is one script call, cache or not; the rest were made
            // for rejected requests.
            let admitted = (on.0.len() - on.2) as u64;
            let per_rejected = (on.1 - admitted) as f64 / on.2 as f64;
            assert!(
                per_rejected <= 0.1,
                "{}: {} script calls for {} admitted and {} rejected requests",
                rule.name(),
                on.1,
                admitted,
                on.2
            );
        }
    });
}

/// A limiter on a cached store at `url` (prefix `prefix`), on `clock`.
async fn cached(url: &str, clock: &ManualClock, prefix: &str) -> Limiter<RedisStore> {
    let store = prefixed(url, prefix)
        .await
        .with_clock(clock.clone())
        .with_deny_cache(100)
        .await
        .expect("subscribe");
    Limiter::new(store)
}

/// Waits (bounded) until `limiter`'s cache is empty: an invalidation travels through Redis.
async fn until_emptied(limiter: &Limiter<RedisStore>) {
    for _ in 0..500 {
        if limiter.store().deny_cache_len() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Two limiters on cached stores of `cluster`, each subscribed through a different node.
async fn cached_on_cluster(
    cluster: &crate::support::redis_server::RedisCluster,
    clock: &ManualClock,
) -> [Limiter<RedisStore>; 2] {
    let mut instances = Vec::new();
    for first in 0..2 {
        let mut order = cluster.urls();
        order.rotate_left(first);
        let store = RedisStore::connect(&order.join(","))
            .await
            .expect("connect")
            .with_clock(clock.clone())
            .with_deny_cache(100)
            .await
            .expect("subscribe");
        instances.push(Limiter::new(store));
    }
    instances.try_into().map_err(|_| ()).expect("two instances")
}

/// A reset on one instance clears the cached denial on another (published on the
/// invalidation channel): the other admits again instead of denying until the window ends.
#[tokio::test]
async fn a_reset_on_one_instance_clears_the_denial_on_every_instance() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let a = cached(&server.url(), &clock, "shared").await;
    let b = cached(&server.url(), &clock, "shared").await;
    let rule = Rule::fixed_window("login", 1, Duration::from_secs(3600));
    assert!(a.check_one(&rule, b"alice").await.unwrap().is_admitted());
    assert!(!a.check_one(&rule, b"alice").await.unwrap().is_admitted());
    assert_eq!(a.store().deny_cache_len(), 1, "the denial is cached on a");

    b.reset(&rule, b"alice").await.unwrap();
    until_emptied(&a).await;
    assert_eq!(a.store().deny_cache_len(), 0, "the reset on b reached a");
    assert!(a.check_one(&rule, b"alice").await.unwrap().is_admitted());
}

/// When the invalidation channel's connection is lost, a reset may be missed: the cache is
/// emptied and bypassed, and it caches again once subscribed again.
#[tokio::test]
async fn a_lost_subscription_empties_the_cache_until_it_is_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_clock(clock.clone())
        .with_deny_cache(100)
        .await
        .expect("subscribe");
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("r", 1, Duration::from_secs(3600));
    assert!(limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    assert!(!limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    assert_eq!(limiter.store().deny_cache_len(), 1);

    server.must(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let mut emptied = false;
    for _ in 0..500 {
        if limiter.store().deny_cache_len() == 0 {
            emptied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        emptied,
        "the cache was not emptied when its channel was lost"
    );

    // Subscribed again (the listener retries), denials are cached again.
    let mut cached_again = false;
    for _ in 0..500 {
        assert!(!limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
        if limiter.store().deny_cache_len() == 1 {
            cached_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(cached_again, "the cache never came back");
}

/// Denials of many keys never hold more entries than the capacity (rounded up to the
/// shards), and ended entries make room.
#[tokio::test]
async fn the_cache_holds_at_most_its_capacity() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_clock(clock.clone())
        .with_deny_cache(32)
        .await
        .expect("subscribe");
    let limiter = Limiter::new(store);
    let rule = Rule::fixed_window("r", 1, Duration::from_secs(1));
    for i in 0..1_000u32 {
        let key = i.to_be_bytes();
        assert!(limiter.check_one(&rule, key).await.unwrap().is_admitted());
        assert!(!limiter.check_one(&rule, key).await.unwrap().is_admitted());
        assert!(limiter.store().deny_cache_len() <= 32);
    }
    assert!(limiter.store().deny_cache_len() > 0);
    // Once the window has ended, new denials replace the ended ones.
    clock.advance(Duration::from_secs(1));
    for i in 0..1_000u32 {
        let key = (i + 1_000).to_be_bytes();
        assert!(limiter.check_one(&rule, key).await.unwrap().is_admitted());
        assert!(!limiter.check_one(&rule, key).await.unwrap().is_admitted());
        assert!(limiter.store().deny_cache_len() <= 32);
    }
    assert!(limiter.store().deny_cache_len() > 16);
}

/// What a cached denial answers, per algorithm: the same cost; a dearer request on a token
/// bucket would be denied for longer, a cheaper one may pass; on a fixed window every cost
/// up to the limit waits for the window's end.
#[tokio::test]
async fn a_denial_answers_what_it_exactly_decides() {
    let server = RedisServer::start();
    let mut runs = Vec::new();
    for cached in [false, true] {
        let clock = ManualClock::new(BASE_MICROS);
        let mut store = prefixed(&server.url(), format!("exact-{cached}"))
            .await
            .with_clock(clock.clone());
        if cached {
            store = store.with_deny_cache(100).await.expect("subscribe");
        }
        let limiter = Limiter::new(store);
        let bucket = Rule::token_bucket("bucket", 4, Rate::per_second(1));
        let window = Rule::fixed_window("window", 4, Duration::from_secs(10));
        let mut decisions = Vec::new();
        for (rule, costs) in [(&bucket, [3, 2, 2, 3, 1, 4]), (&window, [3, 2, 2, 4, 1, 3])] {
            for cost in costs {
                let check = [Check::new(rule, b"k").with_cost(cost)];
                decisions.push(limiter.check(&check).await.unwrap().decision);
                clock.advance(Duration::from_millis(100));
            }
        }
        runs.push((decisions, server.script_calls()));
    }
    assert_eq!(runs[0].0, runs[1].0);
}

/// A copy of a cached store given another clock does not use the cache.
#[tokio::test]
async fn a_copy_with_another_clock_does_not_use_the_cache() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let cached = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_clock(clock.clone())
        .with_deny_cache(100)
        .await
        .expect("subscribe");
    let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
    let limiter = Limiter::new(cached.clone().with_clock(clock.clone()));
    let before = server.script_calls();
    for _ in 0..3 {
        limiter.check_one(&rule, b"k").await.unwrap();
    }
    assert_eq!(server.script_calls() - before, 3);
    assert_eq!(limiter.store().deny_cache_len(), 0);
}

/// A held request's refund on one instance gives units back: the denial another instance
/// cached is dropped there too, and it admits again.
#[tokio::test]
async fn a_refund_on_one_instance_clears_the_denial_on_every_instance() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let (a, b) = (
        cached(&server.url(), &clock, "tollgate").await,
        cached(&server.url(), &clock, "tollgate").await,
    );
    let rule = Rule::fixed_window("download", 1, Duration::from_secs(3600));
    let batch = [Check::new(&rule, b"alice")];
    let held = b.reserve(&batch, Duration::ZERO).await.unwrap();
    assert!(held.outcome().is_admitted());
    assert!(!a.check(&batch).await.unwrap().is_admitted());
    assert_eq!(a.store().deny_cache_len(), 1);

    // The held request's client went away: its unit goes back.
    held.cancel().await.unwrap();
    until_emptied(&a).await;
    assert_eq!(a.store().deny_cache_len(), 0, "the refund on b reached a");
    assert!(a.check(&batch).await.unwrap().is_admitted());
}

/// On a Cluster, a reset published through any node reaches the instance subscribed on
/// another.
#[tokio::test]
async fn a_reset_reaches_every_instance_on_a_cluster() {
    let cluster = crate::support::redis_server::RedisCluster::start();
    let clock = ManualClock::new(BASE_MICROS);
    let [a, b] = &cached_on_cluster(&cluster, &clock).await;
    let rule = Rule::fixed_window("login", 1, Duration::from_secs(3600));
    assert!(a.check_one(&rule, b"alice").await.unwrap().is_admitted());
    assert!(!a.check_one(&rule, b"alice").await.unwrap().is_admitted());
    assert_eq!(a.store().deny_cache_len(), 1);

    b.reset(&rule, b"alice").await.unwrap();
    until_emptied(a).await;
    assert_eq!(a.store().deny_cache_len(), 0, "the reset on b reached a");
    assert!(a.check_one(&rule, b"alice").await.unwrap().is_admitted());
}

/// How instance y, running a changed `api` rule (a larger quota over two seconds), takes
/// over the state x's rule wrote.
enum TakeOver {
    /// An admission.
    Admit,
    /// A settlement of a request admitted on nothing, at one unit.
    Settle,
}

/// x caches an hour's denial of `api`; y takes over the state it was read from in `how`, so
/// that state is gone in two seconds; x must then ask Redis (which admits) instead of
/// denying for the hour.
async fn another_configuration_clears_the_denial(how: TakeOver) {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let (x, y) = (
        cached(&server.url(), &clock, "tollgate").await,
        cached(&server.url(), &clock, "tollgate").await,
    );
    let old = Rule::fixed_window("api", 1, Duration::from_secs(3600));
    let new = Rule::fixed_window("api", 10, Duration::from_secs(2));
    assert!(x.check_one(&old, b"alice").await.unwrap().is_admitted());
    assert!(!x.check_one(&old, b"alice").await.unwrap().is_admitted());
    assert_eq!(x.store().deny_cache_len(), 1, "the denial is cached on x");

    match how {
        TakeOver::Admit => assert!(y.check_one(&new, b"alice").await.unwrap().is_admitted()),
        TakeOver::Settle => {
            let estimate = [Check::new(&new, b"alice").with_cost(0)];
            let reservation = y.reserve(&estimate, Duration::ZERO).await.unwrap();
            reservation.settle(&[1]).await.unwrap();
        }
    }
    until_emptied(&x).await;
    clock.advance(Duration::from_secs(3));
    assert!(
        x.check_one(&old, b"alice").await.unwrap().is_admitted(),
        "Redis admits once the adopted state has ended; x's cache must not deny"
    );
}

/// A cached denial answers only while no other configuration of its rule moved the state:
/// an admission under another configuration clears it on every instance.
#[tokio::test]
async fn another_configuration_admitting_clears_the_denial_on_every_instance() {
    another_configuration_clears_the_denial(TakeOver::Admit).await;
}

/// A settlement that takes units on a key whose state another configuration wrote adopts
/// that state, as an admission does, and clears the cached denials read from it.
#[tokio::test]
async fn another_configuration_settling_clears_the_denial_on_every_instance() {
    another_configuration_clears_the_denial(TakeOver::Settle).await;
}

/// A denial the cache holds is answered at once, without a future (`try_check_now`, which
/// `Limiter::check` asks first), as `check` answers it; a batch the cache cannot answer is
/// left to `check`, which asks Redis.
#[tokio::test(flavor = "current_thread")]
async fn a_cached_denial_is_answered_without_a_future() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_deny_cache(100)
        .await
        .expect("subscribe");
    let rule = Rule::gcra("hourly", 1, Rate::per_hour(1));
    let batch = [Check::new(&rule, b"alice")];
    assert!(
        store.try_check_now(&batch, Duration::ZERO).is_none(),
        "nothing cached yet"
    );
    let first = store.check(&batch, Duration::ZERO).await.expect("decided");
    assert!(first.is_admitted());
    let denied = store.check(&batch, Duration::ZERO).await.expect("decided");
    assert!(!denied.is_admitted());
    let cached = store
        .try_check_now(&batch, Duration::ZERO)
        .expect("the cached denial, at once")
        .expect("no error");
    assert!(!cached.is_admitted());
    assert_eq!(
        cached.rules[0].info.remaining,
        denied.rules[0].info.remaining
    );
    let (Decision::Deny(a), Decision::Deny(b)) = (cached.decision, denied.decision) else {
        panic!("{cached:?} {denied:?}")
    };
    assert_eq!(a.reason, b.reason);
    assert!(a.retry_after <= b.retry_after, "{a:?} after {b:?}");
    // Another key is not in the cache: Redis decides it.
    let bob = [Check::new(&rule, b"bob")];
    assert!(store.try_check_now(&bob, Duration::ZERO).is_none());
    // A batch that cannot work is refused at once, as `check` refuses it.
    let bad = Rule::fixed_window("bad", 0, Duration::from_secs(1));
    let invalid = [Check::new(&bad, b"alice")];
    assert!(matches!(
        store.try_check_now(&invalid, Duration::ZERO),
        Some(Err(tollgate::StoreError::InvalidBatch(_)))
    ));
    assert!(store.check(&invalid, Duration::ZERO).await.is_err());
}

/// A settlement above the estimate on one instance moves the key's retry later: the denial
/// another instance cached is dropped, and its next answer is Redis's later retry.
#[tokio::test]
async fn an_overdraft_on_one_instance_clears_the_denial_on_every_instance() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let (a, b) = (
        cached(&server.url(), &clock, "tollgate").await,
        cached(&server.url(), &clock, "tollgate").await,
    );
    let rule = Rule::token_bucket("export", 1, Rate::new(1, Duration::from_millis(100)));
    let batch = [Check::new(&rule, b"alice")];
    let held = b.reserve(&batch, Duration::ZERO).await.unwrap();
    assert!(held.outcome().is_admitted());
    let retry = |o: Outcome| o.decision.denial().and_then(|d| d.retry_after);
    let denied = a.check(&batch).await.unwrap();
    assert_eq!(retry(denied), Some(Duration::from_millis(100)));
    assert_eq!(a.store().deny_cache_len(), 1);

    // The export wrote three units: two more are owed, 200 ms of refill.
    held.settle(&[3]).await.unwrap();
    until_emptied(&a).await;
    let again = a.check(&batch).await.unwrap();
    assert_eq!(
        retry(again),
        Some(Duration::from_millis(300)),
        "the cached denial's retry is Redis's"
    );
}

/// A cached denial reports what Redis would: a bucket refills while a dearer request waits
/// for its retry, so the units it reports as remaining grow, and so does the cache's answer.
#[tokio::test]
async fn a_cached_denial_reports_what_redis_would() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let cached = cached(&server.url(), &clock, "cached").await;
    let plain = prefixed(&server.url(), "plain").await;
    let plain = Limiter::new(plain.with_clock(clock.clone()));
    let rule = Rule::token_bucket("bulk", 4, Rate::new(1, Duration::from_millis(100)));
    let (all, three) = (
        [Check::new(&rule, b"k").with_cost(4)],
        [Check::new(&rule, b"k").with_cost(3)],
    );
    for limiter in [&cached, &plain] {
        assert!(limiter.check(&all).await.unwrap().is_admitted());
        assert!(!limiter.check(&three).await.unwrap().is_admitted());
    }
    for _ in 0..3 {
        clock.advance(Duration::from_millis(110));
        let (c, p) = (
            cached.check(&three).await.unwrap(),
            plain.check(&three).await.unwrap(),
        );
        assert_eq!(c, p, "the cache answers what Redis does");
    }
}
