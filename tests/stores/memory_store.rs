//! `MemoryStore` as a user sees it: memory reclaimed (purge and amortised self-sweeping at a
//! million keys), reset, peek, invalid batches, huge keys, and clones sharing one state.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sha2::Digest;
use tollgate::{
    store::{MemoryStore, Store},
    Check, Decision, Denial, DenyReason, Limiter, ManualClock, Penalty, Rule, RuleOutcome,
    StoreError,
};

/// 20,000 days after the epoch: a whole number of seconds, minutes, hours and days, so
/// epoch-aligned windows start here.
const BASE: u64 = 20_000 * 86_400 * 1_000_000;

const MINUTE: Duration = Duration::from_secs(60);

/// Polls a future once: `MemoryStore` decides synchronously, so its futures are ready at once.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a MemoryStore future was not ready at once"),
    }
}

/// A store whose bound on keys is well above the million the tests below hold.
fn store_at(now: u64) -> (ManualClock, MemoryStore) {
    let clock = ManualClock::new(now);
    (
        clock.clone(),
        MemoryStore::with_clock(clock).max_keys(4_000_000),
    )
}

/// One unit for `key` straight on the store (no `Limiter`).
fn hit(store: &MemoryStore, rule: &Rule, key: &[u8]) -> bool {
    ready(store.check(&[Check::new(rule, key)], Duration::ZERO))
        .unwrap()
        .is_admitted()
}

/// One unit for each of the keys `keys` (as 4-byte integers), straight on the store, four
/// keys per batch (a batch of distinct keys is four independent admissions, in a quarter of
/// the calls): the fast path for the million-key tests. Asserts every one is admitted.
fn hit_all(store: &MemoryStore, rule: &Rule, keys: std::ops::Range<u32>) {
    assert_eq!(keys.len() % 4, 0);
    for first in keys.step_by(4) {
        let k = [first, first + 1, first + 2, first + 3].map(u32::to_le_bytes);
        let batch = k.each_ref().map(|key| Check::new(rule, key));
        let outcome = ready(store.check(&batch, Duration::ZERO)).unwrap();
        assert_eq!(outcome.decision, Decision::Allow, "keys {first}..");
    }
}

fn check(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) -> Decision {
    ready(limiter.check_one(rule, key)).unwrap().decision
}

fn peek(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8], cost: u64) -> RuleOutcome {
    ready(limiter.peek(rule, key, cost)).unwrap()
}

fn denial(decision: Decision) -> Denial {
    match decision {
        Decision::Deny(d) => d,
        other => panic!("expected a denial, got {other:?}"),
    }
}

const MILLION: u32 = 1_000_000;

/// A million distinct keys, one request each in the same one-second window: all are held
/// until the window ends, and at that instant (not a microsecond before) `purge_expired`
/// removes every one of them.
#[test]
fn purge_expired_removes_a_million_idle_keys() {
    let (clock, store) = store_at(BASE);
    let rule = Rule::fixed_window("ip", 10, Duration::from_secs(1));
    hit_all(&store, &rule, 0..MILLION);
    // Nothing has expired, so self-sweeping kept everything.
    assert_eq!(store.stats().keys, MILLION as usize);

    clock.set_micros(BASE + 999_999);
    assert_eq!(store.purge_expired(), 0);
    assert_eq!(store.stats().keys, MILLION as usize);

    clock.set_micros(BASE + 1_000_000);
    assert_eq!(store.purge_expired(), MILLION as usize);
    assert_eq!(store.stats().keys, 0);

    // A purged key starts afresh.
    let outcome = ready(store.check(&[Check::new(&rule, &7u32.to_le_bytes())], Duration::ZERO));
    assert_eq!(outcome.unwrap().rules[0].info.remaining, 9);
}

/// A million keys expire; a million others arrive; no one calls `purge_expired`.
///
/// The sweep rule (store/memory): a shard sweeps its expired entries when its length reaches
/// `max(2 × its length after the last sweep, 1024)`. In the first phase nothing expires, so
/// a shard holding `n₁` keys last swept at `L = 1024 · 2^j ≤ n₁` and sweeps next at
/// `2L > n₁`. In the second phase every old key has expired, so a shard reaching `2L` removes
/// all `n₁` of them at once; it reaches `2L` after `2L − n₁ ≤ n₁` new keys, i.e. (with keys
/// spread evenly, `n₂ ≈ n₁`) before the phase ends. Hence:
/// - at every moment of the second phase a shard holds at most `max(2L, n₂)` entries: in
///   total about `2^20 ≈ 1.05 N` for `N = 10^6` (each shard's `2L` is the power of two just
///   above `N / shards`), far from the `2 N` a store without sweeping holds (the samples
///   below peak at about 1.016 N on a 2-core machine);
/// - at the end only the new keys remain: exactly `N`.
///
/// The bound asserted, `N + N / 4`, leaves room for uneven shards; a store that swept only
/// on `purge_expired` ends at `2 N` and fails it.
#[test]
fn shards_sweep_themselves_without_purge() {
    let n = MILLION as usize;
    let bound = n + n / 4;
    let (clock, store) = store_at(BASE);
    let rule = Rule::fixed_window("ip", 10, Duration::from_secs(1));
    hit_all(&store, &rule, 0..MILLION);
    assert_eq!(store.stats().keys, n);

    clock.set_micros(BASE + 1_000_000);
    let mut peak = 0;
    let step = 1 << 14;
    for first in (MILLION..2 * MILLION).step_by(step) {
        hit_all(&store, &rule, first..(first + step as u32).min(2 * MILLION));
        peak = peak.max(store.stats().keys);
    }
    let len = store.stats().keys;
    assert!(
        peak <= bound,
        "{peak} entries held during the second million"
    );
    assert!(len <= bound, "{len} entries held after the second million");
    // Every new key is live and kept.
    assert!(len >= n, "only {len} entries: live keys were dropped");
    // What is left to purge is whatever old keys the shards have not swept yet.
    assert_eq!(store.purge_expired(), len - n);
    assert_eq!(store.stats().keys, n);
}

/// `reset` lifts a penalty lock and clears the state: the key starts afresh at once.
#[tokio::test(flavor = "current_thread")]
async fn reset_lifts_a_penalty_lock() {
    let (clock, store) = store_at(BASE);
    let limiter = Limiter::new(store.clone());
    let rule = Rule::fixed_window("login", 2, MINUTE)
        .with_penalty(Penalty::lock_for(Duration::from_secs(600)));
    let user = b"mallory";
    assert!(limiter.check_one(&rule, user).await.unwrap().is_admitted());
    assert!(limiter.check_one(&rule, user).await.unwrap().is_admitted());
    // The first denial locks (after(1) is the default) for ten minutes.
    let locked = denial(limiter.check_one(&rule, user).await.unwrap().decision);
    assert_eq!(locked.reason, DenyReason::Locked);
    assert_eq!(locked.retry_after, Some(Duration::from_secs(600)));

    // The window turns over, the lock holds.
    clock.advance(Duration::from_secs(61));
    let still = denial(limiter.check_one(&rule, user).await.unwrap().decision);
    assert_eq!(still.reason, DenyReason::Locked);
    assert_eq!(still.retry_after, Some(Duration::from_secs(600 - 61)));

    limiter.reset(&rule, user).await.unwrap();
    assert_eq!(store.stats().keys, 0);
    let outcome = limiter.check_one(&rule, user).await.unwrap();
    assert_eq!(outcome.decision, Decision::Allow);
    assert_eq!(outcome.rules[0].info.remaining, 1);

    // Reset of a key that has nothing is fine and changes nothing else.
    limiter.reset(&rule, b"nobody").await.unwrap();
    assert_eq!(peek(&limiter, &rule, user, 0).info.remaining, 1);
}

/// `peek` answers as a check would, but consumes nothing, counts no denial toward a
/// penalty, and creates no entry.
#[test]
fn peek_consumes_nothing_and_counts_no_denial() {
    let (_clock, store) = store_at(BASE);
    let limiter = Limiter::new(store.clone());
    let rule = Rule::fixed_window("otp", 3, MINUTE).with_penalty(
        Penalty::lock_for(Duration::from_secs(600))
            .after(2)
            .within(MINUTE),
    );
    let key = b"+8613800000000";

    for _ in 0..100 {
        let seen = peek(&limiter, &rule, key, 1);
        assert_eq!(seen.decision, Decision::Allow);
        assert_eq!(seen.info.remaining, 2);
    }
    assert_eq!(store.stats().keys, 0, "peek created an entry");

    for left in [2, 1, 0] {
        let outcome = ready(limiter.check_one(&rule, key)).unwrap();
        assert_eq!(outcome.decision, Decision::Allow);
        assert_eq!(outcome.rules[0].info.remaining, left);
    }

    // Exhausted: peek says Limited (not Locked) however often it is asked...
    for _ in 0..100 {
        let seen = denial(peek(&limiter, &rule, key, 1).decision);
        assert_eq!(seen.reason, DenyReason::Limited);
    }
    // ...so the first real denial is the first counted one (the penalty needs two)...
    assert_eq!(
        denial(check(&limiter, &rule, key)).reason,
        DenyReason::Limited
    );
    // ...and the second locks.
    assert_eq!(
        denial(check(&limiter, &rule, key)).reason,
        DenyReason::Locked
    );
    // Peek sees the lock, even at cost 0.
    assert_eq!(
        denial(peek(&limiter, &rule, key, 0).decision).reason,
        DenyReason::Locked
    );
}

/// The same rule twice for one key in one batch would read one state twice; the store
/// refuses the batch and consumes nothing for it. The same rule for two keys, or two rules
/// for one key, is fine.
#[test]
fn the_same_rule_twice_for_one_key_is_an_invalid_batch() {
    let (_clock, store) = store_at(BASE);
    let limiter = Limiter::new(store.clone());
    let rule = Rule::fixed_window("r", 5, MINUTE);
    let other = Rule::sliding_log("s", 5, MINUTE);

    let twice = [
        Check::new(&rule, b"k"),
        Check::new(&rule, b"k").with_cost(2),
    ];
    match ready(limiter.check(&twice)) {
        Err(StoreError::InvalidBatch(message)) => assert!(message.contains("\"r\""), "{message}"),
        other => panic!("expected InvalidBatch, got {other:?}"),
    }
    // Not adjacent, among other items, straight on the store: still refused.
    let spread = [
        Check::new(&rule, b"k"),
        Check::new(&other, b"k"),
        Check::new(&rule, b"k"),
    ];
    assert!(matches!(
        ready(store.check(&spread, Duration::ZERO)),
        Err(StoreError::InvalidBatch(_))
    ));
    // Two huge keys with the same digest are the same key.
    let huge = vec![b'k'; 200];
    let huge_twice = [Check::new(&rule, &huge), Check::new(&rule, &huge)];
    assert!(matches!(
        ready(limiter.check(&huge_twice)),
        Err(StoreError::InvalidBatch(_))
    ));
    assert_eq!(store.stats().keys, 0, "a refused batch wrote state");
    assert_eq!(peek(&limiter, &rule, b"k", 0).info.remaining, 5);

    let two_keys = [Check::new(&rule, b"k"), Check::new(&rule, b"j")];
    assert!(ready(limiter.check(&two_keys)).unwrap().is_admitted());
    let two_rules = [Check::new(&rule, b"k"), Check::new(&other, b"k")];
    assert!(ready(limiter.check(&two_rules)).unwrap().is_admitted());
    assert_eq!(peek(&limiter, &rule, b"k", 0).info.remaining, 3);
}

/// A 1 MB key works: the store holds it under its 33-byte digest (the byte 0xFF and the
/// key's SHA-256, the same on every instance), check,
/// peek and reset all find it there, and keys differing in one byte anywhere keep separate
/// limits.
#[test]
fn a_one_megabyte_key_is_stored_digested() {
    let (_clock, store) = store_at(BASE);
    let limiter = Limiter::new(store.clone());
    let rule = Rule::fixed_window("header", 2, MINUTE);
    let a = vec![b'x'; 1 << 20];
    let mut middle = a.clone();
    middle[1 << 19] = b'y';
    let mut last = a.clone();
    *last.last_mut().unwrap() = b'z';

    assert!(check(&limiter, &rule, &a).is_admitted());
    assert!(check(&limiter, &rule, &a).is_admitted());
    assert_eq!(
        denial(check(&limiter, &rule, &a)).reason,
        DenyReason::Limited
    );
    // Distinct keys, distinct limits.
    assert!(check(&limiter, &rule, &middle).is_admitted());
    assert!(check(&limiter, &rule, &last).is_admitted());
    assert_eq!(store.stats().keys, 3);

    // Stored digested: a check carries the digest, so the store asked directly finds the
    // key's state, and a key spelling the digest is another key.
    let digest = [&[0xFF][..], &sha2::Sha256::digest(&a)].concat();
    assert_eq!(Check::new(&rule, &a).key(), &digest[..]);
    let direct = ready(store.peek(Check::new(&rule, &a))).unwrap();
    assert!(!direct.decision.is_admitted());
    assert_eq!(direct.info.remaining, 0);
    let spelled = ready(store.peek(Check::new(&rule, &digest).with_cost(0))).unwrap();
    assert_eq!(spelled.info.remaining, 2);

    // The limiter's peek digests as its check does.
    assert!(!peek(&limiter, &rule, &a, 1).decision.is_admitted());
    assert_eq!(peek(&limiter, &rule, &middle, 0).info.remaining, 1);

    // And so does its reset.
    ready(limiter.reset(&rule, &a)).unwrap();
    assert_eq!(store.stats().keys, 2);
    assert!(check(&limiter, &rule, &a).is_admitted());
    assert_eq!(peek(&limiter, &rule, &last, 0).info.remaining, 1);
}

/// Clones of a `MemoryStore` and of a `Limiter` are handles on one state: a request through
/// any of them counts for all of them.
#[test]
fn clones_share_limits() {
    let (clock, store) = store_at(BASE);
    let limiter = Limiter::new(store.clone());
    let limiter_clone = limiter.clone();
    let via_store_clone = Limiter::new(store.clone());
    let rule = Rule::fixed_window("api", 3, MINUTE);

    assert!(check(&limiter, &rule, b"k").is_admitted());
    assert!(check(&limiter_clone, &rule, b"k").is_admitted());
    assert!(check(&via_store_clone, &rule, b"k").is_admitted());
    for l in [&limiter, &limiter_clone, &via_store_clone] {
        assert!(!check(l, &rule, b"k").is_admitted());
        assert_eq!(peek(l, &rule, b"k", 0).info.remaining, 0);
    }
    assert!(hit(&store.clone(), &rule, b"k2"));
    assert_eq!(store.stats().keys, 2);
    assert_eq!(limiter_clone.store().stats().keys, 2);

    // A reset through one clone unblocks for all.
    ready(via_store_clone.reset(&rule, b"k")).unwrap();
    assert_eq!(peek(&limiter, &rule, b"k", 0).info.remaining, 3);

    // They share the clock too: the next window is fresh for every clone.
    for _ in 0..3 {
        assert!(check(&limiter_clone, &rule, b"k").is_admitted());
    }
    clock.advance(MINUTE);
    assert_eq!(peek(&via_store_clone, &rule, b"k", 0).info.remaining, 3);
}

/// Reservations with an unbounded `max_wait` (`Duration::MAX`, "wait however long it takes")
/// cannot push a state's instants past what a `u64` of microseconds holds: a GCRA one unit
/// per 2^50 µs (a valid configuration), reserved again and again, stops admitting once the
/// wait would leave the supported range (2^50 µs, some 35 years) instead of overflowing.
#[test]
fn reservations_waiting_forever_do_not_overflow_the_clock() {
    let (_clock, store) = store_at(BASE);
    let limiter = Limiter::new(store);
    let rule = Rule::gcra(
        "slow",
        1,
        tollgate::Rate::new(1, Duration::from_micros(1 << 50)),
    );
    let batch = [Check::new(&rule, b"k")];
    let mut admitted = 0;
    for _ in 0..20_000 {
        if ready(limiter.store().check(&batch, Duration::MAX))
            .unwrap()
            .is_admitted()
        {
            admitted += 1;
        }
    }
    // Now, and one reservation 2^50 µs ahead; the next would wait 2 × 2^50 µs.
    assert_eq!(admitted, 2);
}
