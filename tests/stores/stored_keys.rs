//! `peek` and `reset` with a `&StoredKey`: a key in the form the store keeps it (what a
//! `DecisionObserver` is given) reaches the same state `check` decides on, also for keys
//! kept as digests and past a `MemoryStore`'s bound.

use std::time::Duration;

use tollgate::{
    store::MemoryStore, Check, Decision, DenyReason, Limiter, ManualClock, Penalty, Rule, StoredKey,
};

const BASE: u64 = 20_000 * 86_400 * 1_000_000;
const HOUR: Duration = Duration::from_secs(3600);

fn login() -> Rule {
    Rule::fixed_window("login", 2, HOUR).with_penalty(Penalty::lock_for(Duration::from_secs(900)))
}

fn remaining_after_check(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) -> u64 {
    let outcome = limiter.check_now(&[Check::new(rule, key)]).unwrap();
    outcome.rules[0].info.remaining
}

/// A long key's stored form (its digest) peeks the state `check` left under the key, and
/// resetting it lifts the key's lock; a short key's stored form is the key.
#[tokio::test]
async fn a_stored_key_reaches_the_state_check_left() {
    let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(BASE)));
    let rule = login();
    let long = vec![b'k'; 500];
    let stored = StoredKey::of(&long);
    assert!(stored.is_digest());
    assert_eq!(remaining_after_check(&limiter, &rule, &long), 1);

    // Cost 0: what is left now, nothing asked of it.
    let peeked = limiter.peek(&rule, &stored, 0).await.unwrap();
    assert_eq!(peeked.info.remaining, 1);
    assert_eq!(peeked, limiter.peek(&rule, &long, 0).await.unwrap());

    // Used up, then locked by a denial.
    remaining_after_check(&limiter, &rule, &long);
    remaining_after_check(&limiter, &rule, &long);
    let locked = limiter.peek(&rule, &stored, 1).await.unwrap();
    assert!(matches!(locked.decision, Decision::Deny(d) if d.reason == DenyReason::Locked));

    limiter.reset(&rule, &stored).await.unwrap();
    let fresh = limiter.peek(&rule, &stored, 0).await.unwrap();
    assert_eq!((fresh.decision, fresh.info.remaining), (Decision::Allow, 2));
    assert!(limiter
        .check_now(&[Check::new(&rule, &long)])
        .unwrap()
        .is_admitted());

    // Bytes that no key is stored under are refused before they reach a store.
    assert!(StoredKey::from_stored(&long).is_none());
    assert_eq!(
        StoredKey::from_stored(b"alice"),
        Some(StoredKey::of(b"alice"))
    );
}

/// Past the bound, `peek` answers what `check` then finds: a key the store forgot is
/// fresh (and some were forgotten), a key it kept has its state; a locked key stays locked
/// until `reset` lifts it.
#[tokio::test]
async fn peek_and_reset_by_stored_key_follow_the_bound() {
    let store = MemoryStore::with_clock(ManualClock::new(BASE)).max_keys(1_000);
    let limiter = Limiter::new(store);
    let rule = login();
    let locked = b"locked".to_vec();
    for _ in 0..3 {
        remaining_after_check(&limiter, &rule, &locked);
    }
    let keys: Vec<Vec<u8>> = (0..20_000u32)
        .map(|i| format!("client-{i}").into_bytes())
        .collect();
    for key in &keys {
        remaining_after_check(&limiter, &rule, key);
    }
    let mut forgotten = 0;
    for key in keys.iter().step_by(97) {
        let peeked = limiter.peek(&rule, &StoredKey::of(key), 0).await.unwrap();
        let remaining = peeked.info.remaining;
        assert!(remaining == 1 || remaining == 2, "{remaining}");
        forgotten += usize::from(remaining == 2);
        assert_eq!(remaining_after_check(&limiter, &rule, key), remaining - 1);
    }
    assert!(
        forgotten > 0,
        "the flood should have made the store forget some keys"
    );

    let stored = StoredKey::of(&locked);
    let peeked = limiter.peek(&rule, &stored, 1).await.unwrap();
    assert!(matches!(peeked.decision, Decision::Deny(d) if d.reason == DenyReason::Locked));
    limiter.reset(&rule, &stored).await.unwrap();
    assert_eq!(remaining_after_check(&limiter, &rule, &locked), 1);
}
