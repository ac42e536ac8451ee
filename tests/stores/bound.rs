//! `MemoryStore` past its bound on keys: every key decides on its own state however many
//! keys clients send, the entries whose state says least are forgotten, and a locked key
//! stays locked.

use std::time::Duration;

use tollgate::{
    store::MemoryStore, Check, Decision, Denial, DenyReason, Limiter, ManualClock, Penalty, Rule,
    StoreError,
};

/// 20,000 days after the epoch, so the windows below start here.
const BASE: u64 = 20_000 * 86_400 * 1_000_000;

const HOUR: Duration = Duration::from_secs(3600);
const LOCK: Duration = Duration::from_secs(15 * 60);

/// Two logins an hour per key; a key denied once is locked for 15 minutes.
fn login() -> Rule {
    Rule::fixed_window("login", 2, HOUR).with_penalty(Penalty::lock_for(LOCK))
}

fn decide(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) -> Result<Decision, StoreError> {
    limiter
        .check_now(&[Check::new(rule, key)])
        .map(|outcome| outcome.decision)
}

fn admitted(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) -> bool {
    decide(limiter, rule, key).is_ok_and(|d| d.is_admitted())
}

/// How many of the keys `{prefix}-{i}` (i < n) were forgotten: each used all but one unit
/// of `rule`, so one more passes and the next is denied, unless it starts afresh.
fn forgotten(limiter: &Limiter<MemoryStore>, rule: &Rule, prefix: &str, n: u32) -> usize {
    let afresh = |key: &[u8]| admitted(limiter, rule, key) && admitted(limiter, rule, key);
    (0..n)
        .filter(|i| afresh(format!("{prefix}-{i}").as_bytes()))
        .count()
}

fn reason(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) -> Option<DenyReason> {
    match decide(limiter, rule, key) {
        Ok(Decision::Deny(Denial { reason, .. })) => Some(reason),
        _ => None,
    }
}

/// A flood of one request per new key fills the bound many times over; then a thousand
/// new clients each pass their own limit (not a state the flood spent), a key that has
/// used its quota keeps it used, a locked key stays locked, and the store stays near its
/// bound, counting what it forgot.
#[test]
fn a_flood_of_new_keys_never_decides_for_new_clients() {
    let store = MemoryStore::with_clock(ManualClock::new(BASE)).max_keys(10_000);
    let limiter = Limiter::new(store.clone());
    let rule = login();
    assert!(admitted(&limiter, &rule, b"attacker") && admitted(&limiter, &rule, b"attacker"));
    assert_eq!(
        reason(&limiter, &rule, b"attacker"),
        Some(DenyReason::Locked)
    );
    assert!(admitted(&limiter, &rule, b"bob") && admitted(&limiter, &rule, b"bob"));

    for i in 0..50_000u32 {
        admitted(&limiter, &rule, format!("flood-{i}").as_bytes());
    }
    for i in 0..1_000u32 {
        let client = format!("client-{i}");
        assert!(
            admitted(&limiter, &rule, client.as_bytes()),
            "{client}'s first"
        );
        assert!(
            admitted(&limiter, &rule, client.as_bytes()),
            "{client}'s second"
        );
        let third = admitted(&limiter, &rule, client.as_bytes());
        assert!(!third, "{client}'s third, on its own state");
    }
    assert_eq!(
        reason(&limiter, &rule, b"attacker"),
        Some(DenyReason::Locked)
    );
    // Of the entries that say least (one unit each), none was bob's two.
    assert!(!admitted(&limiter, &rule, b"bob"), "bob's third");
    assert!(store.stats().keys <= 11_000, "{} keys", store.stats().keys);
    assert!(
        store.stats().evictions >= 40_000,
        "{} forgotten",
        store.stats().evictions
    );
}

/// A store whose every entry is locked forgets none of them: it grows to twice its bound
/// with new keys on their own state, then denies new keys until the first lock ends (never
/// lifting a lock), counting each refusal.
#[test]
fn a_store_full_of_locked_keys_never_lifts_a_lock() {
    let clock = ManualClock::new(BASE);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(1);
    let limiter = Limiter::new(store.clone());
    let rule = login();
    let mut locked = Vec::new();
    for i in 0..20_000u32 {
        let key = format!("attacker-{i}");
        for _ in 0..3 {
            let _ = decide(&limiter, &rule, key.as_bytes());
        }
        if reason(&limiter, &rule, key.as_bytes()) == Some(DenyReason::Locked) {
            locked.push(key);
        }
    }
    assert!(!locked.is_empty());
    let refused = store.stats().refusals;
    let newcomer = decide(&limiter, &rule, b"a newcomer");
    let Ok(Decision::Deny(Denial {
        reason: DenyReason::Limited,
        retry_after: Some(retry),
    })) = newcomer
    else {
        panic!("{newcomer:?}");
    };
    assert!(retry <= LOCK, "{retry:?}");
    assert_eq!(store.stats().refusals, refused + 1);
    for key in &locked {
        assert_eq!(
            reason(&limiter, &rule, key.as_bytes()),
            Some(DenyReason::Locked)
        );
    }
    assert_eq!(store.stats().evictions, 0);

    clock.advance(LOCK);
    assert!(admitted(&limiter, &rule, b"a newcomer"));
}

/// A settlement that takes units for a key the store does not hold, past its bound, takes
/// them in the key's own entry: that key is charged, and another new key is not.
#[tokio::test]
async fn past_its_bound_an_overdraft_is_taken_in_the_keys_own_entry() {
    let store = MemoryStore::with_clock(ManualClock::new(BASE)).max_keys(256);
    let limiter = Limiter::new(store.clone());
    let filler = Rule::fixed_window("filler", 1, HOUR);
    for i in 0..10_000u32 {
        admitted(&limiter, &filler, &i.to_be_bytes());
    }
    let rule = Rule::fixed_window("per-key", 5, HOUR);
    // Admitted on nothing, settled at 5: the whole limit, in the newcomer's own entry.
    let estimate = [Check::new(&rule, b"a newcomer").with_cost(0)];
    let reservation = limiter.reserve(&estimate, Duration::ZERO).await.unwrap();
    reservation.settle(&[5]).await.unwrap();
    assert_eq!(
        reason(&limiter, &rule, b"a newcomer"),
        Some(DenyReason::Limited)
    );
    assert!(admitted(&limiter, &rule, b"another newcomer"));
    assert!(store.stats().keys <= 300, "{} keys", store.stats().keys);
}

/// Past the bound, an entry kept only for a refusal counted late (its state ended, its
/// penalty counting nothing) is forgotten before a live key, however many units its state
/// recorded: the live keys keep their used units through a flood.
#[test]
fn an_ended_state_kept_for_a_late_count_goes_before_a_live_key() {
    let clock = ManualClock::new(BASE);
    let store = MemoryStore::with_clock(clock.clone()).max_keys(10_000);
    let limiter = Limiter::new(store.clone());
    let refused = Rule::fixed_window("refused", 5, Duration::from_secs(1))
        .with_penalty(Penalty::lock_for(LOCK).after(100));
    for i in 0..6_000u32 {
        let key = format!("kept-{i}");
        for _ in 0..5 {
            assert!(admitted(&limiter, &refused, key.as_bytes()));
        }
        let mut deferred = Check::new(&refused, key.as_bytes());
        deferred.refusal = tollgate::Refusal::Deferred;
        assert!(!limiter.check_now(&[deferred]).unwrap().is_admitted());
    }
    clock.advance(Duration::from_secs(1));
    let rule = login();
    for i in 0..2_000u32 {
        assert!(admitted(&limiter, &rule, format!("live-{i}").as_bytes()));
    }
    for i in 0..4_000u32 {
        admitted(&limiter, &rule, format!("flood-{i}").as_bytes());
    }
    assert!(store.stats().evictions >= 2_000);
    // A live key used one of its two: one more passes, then it is denied.
    let forgotten = forgotten(&limiter, &rule, "live", 2_000);
    assert_eq!(forgotten, 0, "live keys forgotten before ended ones");
}

/// Past the bound, the entries forgotten are the ones that say least wherever they sit in
/// the table: a flood of one-unit keys, arriving while half the store holds clients that
/// used two units, takes its room from the flood's own earlier keys round after round, and
/// every client keeps its two units used.
#[test]
fn rounds_of_eviction_keep_taking_the_least() {
    let store = MemoryStore::with_clock(ManualClock::new(BASE)).max_keys(10_000);
    let limiter = Limiter::new(store.clone());
    let rule = Rule::fixed_window("api", 3, HOUR);
    for i in 0..5_000u32 {
        let key = format!("client-{i}");
        assert!(
            admitted(&limiter, &rule, key.as_bytes()) && admitted(&limiter, &rule, key.as_bytes())
        );
    }
    for i in 0..30_000u32 {
        admitted(&limiter, &rule, format!("flood-{i}").as_bytes());
    }
    assert!(store.stats().evictions >= 20_000);
    // A client that kept its two units used passes once more, then is denied.
    let forgotten = forgotten(&limiter, &rule, "client", 5_000);
    assert_eq!(forgotten, 0, "clients forgotten while flood keys were kept");
}
