use std::future::Future;
use std::time::Duration;

use proptest::prelude::*;

use super::key::INLINE_KEY;
use super::*;
use crate::{ManualClock, Penalty, Rate};

/// A rule of one of the six algorithms (both token-bucket refills) with small numbers,
/// perhaps with a penalty; `variant` picks another configuration of the same name.
fn rule(kind: u8, quota: u64, period: u64, penalty: bool) -> Rule {
    let rule = crate::rule::sample(kind, quota, period);
    if penalty {
        rule.with_penalty(Penalty::lock_for(Duration::from_micros(period)).after(2))
    } else {
        rule
    }
}

/// (advance µs, which of the two configurations, cost, shadow, max wait µs, refund it)
type Step = (u64, bool, u64, bool, u64, bool);

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![Just(0u64), 0..300u64, 0..5_000u64],
        proptest::bool::weighted(0.2),
        prop_oneof![4 => Just(1u64), 1 => 0..5u64],
        proptest::bool::weighted(0.1),
        prop_oneof![Just(0u64), Just(700), Just(10_000)],
        proptest::bool::weighted(0.1),
    )
}

fn ready<F: Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    match std::pin::pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
    }
}

/// Every entry with its expiry, by name ‖ key: what two stores hold, comparable
/// whatever their hashers.
fn entries(store: &MemoryStore) -> Vec<(Vec<u8>, Entry, u64)> {
    let mut all: Vec<_> = store
        .shared
        .shards
        .iter()
        .flat_map(|s| {
            s.lock()
                .map
                .iter()
                .map(|s| {
                    let (rule, key) = s.key.parts();
                    ([rule, key].concat(), s.entry.clone(), s.entry.expires_at())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// What a key costs in the map: the boxed form's 32 bytes, inline or not, and its entry
/// 64 (the penalty on the heap, the expiry read from what the entry holds anyway), in a
/// bucket aligned to 32 bytes so that it spans two cache lines, never three.
#[test]
fn a_stored_key_takes_96_bytes() {
    assert_eq!(std::mem::size_of::<StoreKey>(), 32);
    assert_eq!(std::mem::size_of::<Entry>(), 64);
    assert_eq!(std::mem::size_of::<(StoreKey, Entry)>(), 96);
    assert_eq!(std::mem::align_of::<(StoreKey, Entry)>(), 32);
}

/// Keys held inline and on the heap (either side of `INLINE_KEY`), and a name ‖ key
/// that spells another pair's bytes, are each their own key with their own quota.
#[test]
fn keys_inline_and_on_the_heap_are_distinct() {
    let store = MemoryStore::with_clock(ManualClock::new(1_000_000));
    let window = Duration::from_secs(60);
    let (a, ab) = (
        Rule::fixed_window("a", 1, window),
        Rule::fixed_window("ab", 1, window),
    );
    let mut checks = vec![Check::new(&ab, b"c"), Check::new(&a, b"bc")];
    let long: Vec<Vec<u8>> = (INLINE_KEY - 3..INLINE_KEY + 3)
        .flat_map(|n| [vec![b'x'; n], vec![b'y'; n]])
        .collect();
    checks.extend(long.iter().map(|k| Check::new(&a, k)));
    for check in &checks {
        let first = ready(store.check(std::slice::from_ref(check), Duration::ZERO));
        assert!(first.unwrap().is_admitted(), "{check:?}");
    }
    assert_eq!(store.stats().keys, checks.len());
    for check in &checks {
        let again = ready(store.check(std::slice::from_ref(check), Duration::ZERO));
        assert!(!again.unwrap().is_admitted(), "{check:?}");
    }
}

/// The map rehashes its keys as it grows: a stored key must hash as a lookup of the
/// same pair does, inline (short) or on the heap (long), or the grown map would lose it.
#[test]
fn keys_are_found_after_the_map_has_grown() {
    let store = MemoryStore::with_clock(ManualClock::new(1_000_000));
    let rule = Rule::fixed_window("a", 1, Duration::from_secs(60));
    let keys: Vec<Vec<u8>> = (0..3000)
        .map(|i| format!("{i}{}", "x".repeat(i % 40)).into_bytes())
        .collect();
    for key in &keys {
        let first = ready(store.check(&[Check::new(&rule, key)], Duration::ZERO));
        assert!(first.unwrap().is_admitted());
    }
    for key in &keys {
        let again = ready(store.check(&[Check::new(&rule, key)], Duration::ZERO));
        assert!(!again.unwrap().is_admitted());
    }
    assert_eq!(store.stats().keys, keys.len());
}

/// A clock whose readings on different threads may come out of order, as
/// `MonotonicClock`'s can (one core's counter a fraction of a µs behind another's).
#[derive(Debug)]
struct Skewed(ManualClock);

impl Clock for Skewed {
    fn now_micros(&self) -> u64 {
        self.0.now_micros()
    }
    fn ordered_across_threads(&self) -> bool {
        false
    }
}

/// A reading a microsecond behind the last decision in the shard is taken as that
/// decision's instant: a roomy bucket keeps admitting (read as is, the state would lie
/// in the future and deny as a reservation), through both paths and a refund.
#[test]
fn a_clock_out_of_order_across_threads_never_moves_a_shard_back() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::with_clock(Skewed(clock.clone()));
    let rule = Rule::token_bucket("r", 1 << 20, Rate::per_second(1));
    let other = Rule::gcra("g", 1 << 20, Rate::per_second(1));
    let one = [Check::new(&rule, b"k")];
    let two = [Check::new(&rule, b"k"), Check::new(&other, b"k")];
    for i in 0..10 {
        clock.set_micros(1_000_000 - i % 2);
        let outcome = ready(store.check(&one, Duration::ZERO)).unwrap();
        assert_eq!(outcome.decision, crate::Decision::Allow, "{i}");
        let both = ready(store.check(&two, Duration::ZERO)).unwrap();
        assert_eq!(both.decision, crate::Decision::Allow, "{i}");
        ready(store.refund(&two, &both)).unwrap();
    }
    // Read as they are, the same readings deny.
    let store = MemoryStore::with_clock(clock.clone());
    clock.set_micros(1_000_000);
    assert!(ready(store.check(&one, Duration::ZERO))
        .unwrap()
        .is_admitted());
    clock.set_micros(999_999);
    assert!(!ready(store.check(&one, Duration::ZERO))
        .unwrap()
        .is_admitted());
}

/// A sweep's instant is one the shard's decisions never go back from: a reading behind it
/// decides at it, so an entry swept as expired is not made fresh at an earlier instant (a
/// token bucket of 1 a second admits at 1 s, at the sweep's 2.000005 s, and not again
/// before 3.000005 s; fresh at 1.99999 s, it would admit again at 2.999995 s: three in
/// under two seconds).
#[test]
fn a_sweep_on_an_unordered_clock_never_reopens_a_bucket() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::with_clock(Skewed(clock.clone()));
    let rule = Rule::token_bucket("r", 1, Rate::per_second(1));
    let one = [Check::new(&rule, b"k")];
    let admits = || {
        ready(store.check(&one, Duration::ZERO))
            .unwrap()
            .is_admitted()
    };
    assert!(admits());
    clock.set_micros(2_000_005);
    assert_eq!(store.purge_expired(), 1);
    clock.set_micros(1_999_990);
    assert!(admits());
    clock.set_micros(2_999_995);
    assert!(!admits());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The path for a batch of one decides exactly as the general path on every
    /// schedule: the same outcomes (decision, per-rule info, admission) step by step,
    /// under reconfiguration, penalties, shadow items, costs, reservations and refunds.
    #[test]
    fn a_batch_of_one_decides_as_the_general_path(
        kinds in (0u8..7, 0u8..7),
        quotas in (1u64..5, 1u64..5),
        periods in (100u64..3_000, 100u64..3_000),
        penalties in (any::<bool>(), any::<bool>()),
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let rules = [
            rule(kinds.0, quotas.0, periods.0, penalties.0),
            rule(kinds.1, quotas.1, periods.1, penalties.1),
        ];
        let start = 1_700_000_000_000_000;
        let (fast_clock, general_clock) = (ManualClock::new(start), ManualClock::new(start));
        let fast = MemoryStore::with_clock(fast_clock.clone());
        let general = MemoryStore::with_clock(general_clock.clone());
        for (advance, second, cost, shadow, max_wait, refund) in steps {
            fast_clock.advance(std::time::Duration::from_micros(advance));
            general_clock.advance(std::time::Duration::from_micros(advance));
            let mut check = Check::new(&rules[usize::from(second)], b"k").with_cost(cost);
            if shadow {
                check.refusal = crate::Refusal::Shadow;
            }
            let batch = [check];
            let a = fast.decide_one(&check, max_wait).unwrap();
            let b = general.decide_batch(&batch, max_wait, None).unwrap();
            prop_assert_eq!(&a, &b);
            // The same entries too, expiry included (which only a sweep would show).
            prop_assert_eq!(entries(&fast), entries(&general));
            if refund {
                for (store, outcome) in [(&fast, a), (&general, b)] {
                    if let Some(admission) = &outcome.taken_by(store.shared.id).admission {
                        store.refund_admission(&batch, admission).unwrap();
                    }
                }
            }
        }
        prop_assert_eq!(fast.stats().keys, general.stats().keys);
    }
}

/// Past its bound a store keeps no state that keys share: a key decided there (its entry
/// made by forgetting others) gets back what a refund, a cancellation or a settlement
/// below the estimate gives, exactly as on a store far below its bound, and a login
/// limited to 2 a minute never passes a third time within the minute.
#[tokio::test]
async fn units_given_back_past_the_bound_leave_what_they_leave_below_it() {
    let start = 1_700_000_000_000_000;
    let clock = ManualClock::new(start);
    let below = crate::Limiter::new(MemoryStore::with_clock(clock.clone()));
    let shards = MemoryStore::new().shared.shards.len();
    // Sixteen keys a shard: a flood of hundreds keeps every shard at its share.
    let past = crate::Limiter::new(MemoryStore::with_clock(clock.clone()).max_keys(shards * 16));
    let login = Rule::fixed_window("login", 2, Duration::from_secs(60));
    let flood = Rule::fixed_window("flood", 1, Duration::from_millis(1));
    let alice = [Check::new(&login, b"alice")];
    let mut flooded = 0u32;
    // `n` new keys on `past` that are back to empty a millisecond later: every shard stays
    // at its share, and each key after makes room by forgetting those first.
    let mut flood_past = |n: u32| {
        for _ in 0..n {
            flooded += 1;
            let key = flooded.to_le_bytes();
            let outcome = ready(
                past.store()
                    .check(&[Check::new(&flood, &key)], Duration::ZERO),
            );
            assert!(outcome.unwrap().is_admitted());
        }
        clock.advance(Duration::from_millis(2));
    };
    let same = |step: &str| {
        let b = ready(below.peek(&login, b"alice", 1)).unwrap();
        let p = ready(past.peek(&login, b"alice", 1)).unwrap();
        assert_eq!(b, p, "after {step}");
    };
    // More keys than the bound at once: live keys are forgotten.
    flood_past(shards as u32 * 32);
    let mut estimates = Vec::new();
    for limiter in [&below, &past] {
        let mut held = limiter.reserve(&alice, Duration::ZERO).await.unwrap();
        assert!(held.confirm().await.unwrap().is_admitted());
        estimates.push(held);
    }
    assert!(
        past.store().stats().evictions > 0,
        "alice was decided past the bound"
    );
    same("a login held");
    flood_past(200);
    // A failed login charged by outcome: nothing counts (settled at 0).
    for held in estimates.drain(..) {
        held.settle(&[0]).await.unwrap();
    }
    same("a settlement below the estimate");
    flood_past(200);
    for limiter in [&below, &past] {
        let held = limiter.reserve(&alice, Duration::ZERO).await.unwrap();
        held.cancel().await.unwrap();
    }
    same("a cancellation");
    for limiter in [&below, &past] {
        for _ in 0..2 {
            flood_past(200);
            assert!(limiter.check(&alice).await.unwrap().is_admitted());
        }
    }
    same("two logins");
    for _ in 0..50 {
        flood_past(200);
        for limiter in [&below, &past] {
            assert!(!limiter.check(&alice).await.unwrap().is_admitted());
        }
        same("a third login");
    }
}

/// A decision on a shard held long (a sweep or a table growing under the lock) waits until
/// it is released, then decides: nothing is lost or decided twice.
#[test]
fn a_decision_waits_out_a_shard_held_long() {
    let store = MemoryStore::with_clock(ManualClock::new(1_000_000));
    let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
    let shared = &*store.shared;
    let held = lock(&shared.shards[shared.shard_of(shared.hash(&rule, b"k"))]);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| store.decide(&[Check::new(&rule, b"k")], 0));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "decided while the shard was held");
        drop(held);
        let outcome = waiter.join().expect("waiter").expect("decided");
        assert!(outcome.is_admitted());
    });
    let again = store.decide(&[Check::new(&rule, b"k")], 0).unwrap();
    assert!(!again.is_admitted(), "the waiter's admission counted");
}
