//! `Store::refund` on MemoryStore and RedisStore (standalone and Cluster): a held request's units go to the next
//! request, and a refund never gives back more than is exact when other requests were
//! admitted meanwhile. The store is driven directly (`Store::check`, then `Store::refund`
//! with the outcome it answered), and through the limiter's `Reservation`s
//! (`cancel`).

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Check, Decision, DenyReason, Limiter, ManualClock, Outcome, Penalty, Rate, Rule,
};

/// A multiple of every window below, so epoch-aligned windows start here.
const T0: u64 = crate::support::EPOCH;
const S: Duration = Duration::from_secs(1);

fn per_10s() -> Rate {
    Rate::new(1, 10 * S)
}

/// The store's answer to `batch` with a minute's wait: a reservation for a later instant
/// when it is admissible within it.
async fn reserve<S: Store>(limiter: &Limiter<S>, batch: &[Check<'_>]) -> Outcome {
    limiter.store().check(batch, 60 * S).await.unwrap()
}

/// Gives back the units `outcome` took for `batch`, in the store that answered it.
async fn refund<S: Store>(limiter: &Limiter<S>, batch: &[Check<'_>], outcome: &Outcome) {
    limiter.store().refund(batch, outcome).await.unwrap()
}

/// Every algorithm: one admitted, one held (reserved for later); the held reservation is
/// cancelled, and the next request gets the very slot it had.
async fn a_cancelled_reservation_goes_to_the_next_request<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rules = [
        Rule::fixed_window("fw", 1, 10 * S),
        Rule::sliding_window("sw", 1, 10 * S),
        Rule::sliding_log("sl", 1, 10 * S),
        Rule::token_bucket("tb", 1, per_10s()),
        Rule::leaky_bucket("lb", 1, per_10s()),
        Rule::gcra("gc", 1, per_10s()),
    ];
    for rule in &rules {
        clock.set_micros(T0 + 1_000_000);
        let batch = [Check::new(rule, b"a")];
        // Each reservation lives to the end of the turn: dropped, it would give back too.
        let first = limiter.reserve(&batch, 60 * S).await.unwrap();
        assert_eq!(first.outcome().decision, Decision::Allow, "{}", rule.name());
        let held = limiter.reserve(&batch, 60 * S).await.unwrap();
        let Decision::Delay(wait) = held.outcome().decision else {
            panic!("{}: {:?}", rule.name(), held.outcome().decision)
        };
        held.cancel().await.unwrap();
        let next = limiter.reserve(&batch, 60 * S).await.unwrap();
        assert_eq!(
            next.outcome().decision,
            Decision::Delay(wait),
            "{}: the given-back slot is the next request's",
            rule.name()
        );
    }
}

/// Token bucket and GCRA: once a later reservation was recorded, the earlier one's units
/// stay taken (the bucket would have filled up before the later one without it); the latest
/// one is still given back.
async fn a_refund_behind_a_later_admission_gives_nothing_back<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rules = [
        Rule::token_bucket("tb2", 1, per_10s()),
        Rule::gcra("gc2", 1, per_10s()),
    ];
    for rule in &rules {
        clock.set_micros(T0 + 1_000_000);
        let batch = [Check::new(rule, b"a")];
        assert_eq!(reserve(limiter, &batch).await.decision, Decision::Allow);
        let a = reserve(limiter, &batch).await;
        assert_eq!(a.decision, Decision::Delay(10 * S), "{}", rule.name());
        let b = reserve(limiter, &batch).await;
        assert_eq!(b.decision, Decision::Delay(20 * S), "{}", rule.name());

        refund(limiter, &batch, &a).await;
        let c = reserve(limiter, &batch).await;
        assert_eq!(
            c.decision,
            Decision::Delay(30 * S),
            "{}: a's units stay taken behind b",
            rule.name()
        );
        refund(limiter, &batch, &c).await;
        let d = reserve(limiter, &batch).await;
        assert_eq!(
            d.decision,
            Decision::Delay(30 * S),
            "{}: the latest is given back",
            rule.name()
        );
    }
}

/// Leaky bucket: a request held by its shaping delay is given back while it is queued, and
/// not once it has started to drain (its release has passed).
async fn a_leaky_bucket_gives_back_what_is_still_queued<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rule = Rule::leaky_bucket("lb2", 2, per_10s());
    let batch = [Check::new(&rule, b"a")];
    clock.set_micros(T0 + 1_000_000);
    assert_eq!(
        limiter.check(&batch).await.unwrap().decision,
        Decision::Allow
    );
    let held = limiter.check(&batch).await.unwrap();
    assert_eq!(held.decision, Decision::Delay(10 * S));
    refund(limiter, &batch, &held).await;
    let peek = limiter.peek(&rule, b"a", 0).await.unwrap();
    assert_eq!(peek.info.remaining, 1, "the held unit left the queue");

    let held = limiter.check(&batch).await.unwrap();
    assert_eq!(held.decision, Decision::Delay(10 * S));
    // 11 s later it has been released (a request denied there by a rule on another key) and
    // 1 s of it has drained: the 0.9 unit still queued goes, nothing more.
    clock.set_micros(T0 + 12_000_000);
    refund(limiter, &batch, &held).await;
    let peek = limiter.peek(&rule, b"a", 0).await.unwrap();
    assert_eq!(
        peek.info.remaining, 2,
        "what was still queued of it went back"
    );
    let next = limiter.check(&batch).await.unwrap();
    assert_eq!(next.decision, Decision::Allow, "{next:?}");
}

/// A leaky bucket tells each queued request when it leaves: giving back the units of one
/// with another queued behind it would let the next request leave with the last one (two
/// at once from a queue that lets one out every 10 s). Only the queue's last admission can
/// go back.
async fn a_leaky_bucket_gives_back_only_the_end_of_its_queue<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rule = Rule::leaky_bucket("lb3", 4, per_10s());
    let batch = [Check::new(&rule, b"a")];
    clock.set_micros(T0 + 1_000_000);
    assert_eq!(
        limiter.check(&batch).await.unwrap().decision,
        Decision::Allow
    );
    let second = limiter.check(&batch).await.unwrap();
    assert_eq!(second.decision, Decision::Delay(10 * S));
    let third = limiter.check(&batch).await.unwrap();
    assert_eq!(third.decision, Decision::Delay(20 * S));
    // The second's units stay taken: the third leaves at 20 s whatever happens.
    refund(limiter, &batch, &second).await;
    let fourth = limiter.check(&batch).await.unwrap();
    assert_eq!(fourth.decision, Decision::Delay(30 * S), "{fourth:?}");
    // The last one's go back: the next request takes its place.
    refund(limiter, &batch, &fourth).await;
    let fifth = limiter.check(&batch).await.unwrap();
    assert_eq!(fifth.decision, Decision::Delay(30 * S), "{fifth:?}");
}

/// Counting algorithms: a refund takes back exactly its own units, whatever else was admitted
/// since.
async fn a_counting_refund_takes_back_exactly_its_own<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rules = [
        Rule::fixed_window("fw3", 5, 10 * S),
        Rule::sliding_window("sw3", 5, 10 * S),
        Rule::sliding_log("sl3", 5, 10 * S),
    ];
    for rule in &rules {
        clock.set_micros(T0 + 1_000_000);
        let two = [Check::new(rule, b"a").with_cost(2)];
        let one = [Check::new(rule, b"a")];
        let a = limiter.check(&two).await.unwrap();
        clock.set_micros(T0 + 2_000_000);
        assert!(limiter.check(&one).await.unwrap().is_admitted());
        refund(limiter, &two, &a).await;
        let peek = limiter.peek(rule, b"a", 0).await.unwrap();
        assert_eq!(peek.info.remaining, 4, "{}", rule.name());
    }
}

/// Buckets whose rate is not in lowest terms (10 per second is 1 per 100 ms): a refund
/// gives back exactly its own units in the scale the bucket keeps its level in, no more.
async fn a_bucket_refund_gives_back_its_own_units_at_any_rate<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rules = [
        Rule::token_bucket("tb4", 10, Rate::per_second(10)),
        Rule::leaky_bucket("lb4", 10, Rate::per_second(10)),
        Rule::gcra("gc4", 10, Rate::per_second(10)),
    ];
    for rule in &rules {
        clock.set_micros(T0 + 1_000_000);
        let five = [Check::new(rule, b"a").with_cost(5)];
        let three = [Check::new(rule, b"a").with_cost(3)];
        assert!(limiter.check(&five).await.unwrap().is_admitted());
        let taken = limiter.check(&three).await.unwrap();
        assert!(taken.is_admitted(), "{}", rule.name());
        refund(limiter, &three, &taken).await;
        let peek = limiter.peek(rule, b"a", 0).await.unwrap();
        assert_eq!(peek.info.remaining, 5, "{}", rule.name());
    }
}

/// A batch beside a leaky bucket: the rules on the bucket's key counted the request when it
/// passes (the next minute), the rule on another key is left to the release (nothing to
/// give back); a refund gives each back in the window it counted in, and so does a Cluster
/// part refunded because a later slot denied.
async fn each_rule_is_given_back_at_the_instant_it_counted<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let minute = 60 * S;
    let queue = Rule::leaky_bucket("lb5", 5, per_10s());
    let own = Rule::fixed_window("fw5", 1, minute);
    let log = Rule::sliding_log("sl5", 1, minute);
    let shared = Rule::fixed_window("fw5-shared", 1, minute);
    let start = T0 - T0 % 60_000_000 + 60_000_000;
    clock.set_micros(start + 50_000_000);
    let fill = [Check::new(&queue, b"c").with_cost(4)];
    assert_eq!(
        limiter.check(&fill).await.unwrap().decision,
        Decision::Allow
    );

    clock.set_micros(start + 55_000_000);
    let batch = [
        Check::new(&queue, b"c"),
        Check::new(&own, b"c"),
        Check::new(&log, b"c"),
        Check::new(&shared, b"g"),
    ];
    let held = limiter.check(&batch).await.unwrap();
    assert_eq!(held.decision, Decision::Delay(35 * S), "{held:?}");
    // The shared window is left to the release: nothing is counted in it, in the minute
    // the request would pass in either.
    clock.set_micros(start + 90_000_000);
    let pending = limiter.peek(&shared, b"g", 0).await.unwrap();
    assert_eq!(pending.info.remaining, 1, "shared: {pending:?}");
    clock.set_micros(start + 55_000_000);
    refund(limiter, &batch, &held).await;
    // It has nothing to give back, and its minute is untouched.
    let again = limiter.check(&[Check::new(&shared, b"g")]).await.unwrap();
    assert_eq!(again.decision, Decision::Allow, "shared: {again:?}");
    // The client's rules counted it in the next minute (at 90 s), and have it back: the
    // window from 60 s, the log from 90 s (a refund reopens no key before the admission's
    // instant).
    clock.set_micros(start + 60_000_000);
    let window = limiter.check(&[Check::new(&own, b"c")]).await.unwrap();
    assert_eq!(window.decision, Decision::Allow, "fw5: {window:?}");
    clock.set_micros(start + 90_000_000);
    let entry = limiter.check(&[Check::new(&log, b"c")]).await.unwrap();
    assert_eq!(entry.decision, Decision::Allow, "sl5: {entry:?}");

    // The shared window is full where the request would pass: the batch is denied, and on
    // a Cluster the client's slot, decided first, is refunded at the instants it counted at.
    let fresh = Rule::fixed_window("fw6", 1, minute);
    clock.set_micros(start + 121_000_000);
    let fill = limiter.check(&[Check::new(&shared, b"g")]).await.unwrap();
    assert_eq!(fill.decision, Decision::Allow, "shared: {fill:?}");
    // The queue holds the next request 40 s: fw6 would count it at 161 s, the shared window
    // at its release too, in the same full minute.
    let queued = limiter
        .check(&[Check::new(&queue, b"c").with_cost(4)])
        .await
        .unwrap();
    assert_eq!(queued.decision, Decision::Allow, "lb5: {queued:?}");
    let denied = [
        Check::new(&queue, b"c"),
        Check::new(&fresh, b"c"),
        Check::new(&shared, b"g"),
    ];
    let outcome = limiter.check(&denied).await.unwrap();
    assert!(!outcome.is_admitted(), "{outcome:?}");
    clock.set_micros(start + 122_000_000);
    let after = limiter.check(&[Check::new(&fresh, b"c")]).await.unwrap();
    assert_eq!(after.decision, Decision::Allow, "fw6: {after:?}");
}

/// A first-hit window: a reservation waiting for the next window, cancelled, leaves the
/// key as closed as it was until that window (a refund never reopens a key earlier than
/// the admission's instant), and the next window's units go to the next request.
async fn a_cancelled_reservation_keeps_the_first_hit_window<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rule = Rule::fixed_window_from_first_hit("ff7", 2, 10 * S);
    let batch = [Check::new(&rule, b"a")];
    clock.set_micros(T0 + 1_000_000);
    for _ in 0..2 {
        assert_eq!(reserve(limiter, &batch).await.decision, Decision::Allow);
    }
    for _ in 0..3 {
        clock.advance(Duration::from_millis(1));
        let held = reserve(limiter, &batch).await;
        assert!(matches!(held.decision, Decision::Delay(_)), "{held:?}");
        refund(limiter, &batch, &held).await;
    }
    let now = limiter.check(&batch).await.unwrap();
    assert!(
        !now.is_admitted(),
        "the window of the first two is still full: {now:?}"
    );
    clock.set_micros(T0 + 11_000_000);
    for _ in 0..2 {
        let next = limiter.check(&batch).await.unwrap();
        assert_eq!(next.decision, Decision::Allow, "the next window: {next:?}");
    }
}

/// A refusal deferred at its check (`Refusal::Deferred`) is counted by
/// `Store::count_denials` given the batch as it was checked, flag and all: the flag is
/// about the check, and a count counts.
async fn a_deferred_refusal_counts_given_as_checked<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let rule = Rule::fixed_window("fw8", 1, 10 * S).with_penalty(Penalty::lock_for(60 * S));
    clock.set_micros(T0 + 1_000_000);
    let check = Check::new(&rule, b"a");
    assert!(limiter.check(&[check]).await.unwrap().is_admitted());
    let check = deferred(check);
    let refused = limiter
        .store()
        .check(&[check], Duration::ZERO)
        .await
        .unwrap();
    assert!(!refused.is_admitted());
    let peek = limiter.peek(&rule, b"a", 1).await.unwrap();
    assert_ne!(
        peek.decision.denial().map(|d| d.reason),
        Some(DenyReason::Locked)
    );
    limiter
        .store()
        .count_denials(&[check], Duration::ZERO)
        .await
        .unwrap();
    let peek = limiter.peek(&rule, b"a", 1).await.unwrap();
    assert_eq!(
        peek.decision.denial().map(|d| d.reason),
        Some(DenyReason::Locked),
        "{peek:?}"
    );
}

async fn all<S: Store + Clone>(limiter: &Limiter<S>, clock: &ManualClock) {
    each_rule_is_given_back_at_the_instant_it_counted(limiter, clock).await;
    a_cancelled_reservation_goes_to_the_next_request(limiter, clock).await;
    a_refund_behind_a_later_admission_gives_nothing_back(limiter, clock).await;
    a_leaky_bucket_gives_back_what_is_still_queued(limiter, clock).await;
    a_leaky_bucket_gives_back_only_the_end_of_its_queue(limiter, clock).await;
    a_counting_refund_takes_back_exactly_its_own(limiter, clock).await;
    a_bucket_refund_gives_back_its_own_units_at_any_rate(limiter, clock).await;
    a_cancelled_reservation_keeps_the_first_hit_window(limiter, clock).await;
    a_deferred_refusal_counts_given_as_checked(limiter, clock).await;
}

/// Every refund rule above holds on MemoryStore.
#[tokio::test]
async fn refunds_on_memory_store() {
    let clock = ManualClock::new(T0);
    all(
        &Limiter::new(MemoryStore::with_clock(clock.clone())),
        &clock,
    )
    .await;
}

/// Every refund rule above holds on a Redis server (the Lua twin).
#[tokio::test]
async fn refunds_on_redis_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    all(&Limiter::new(store.with_clock(clock.clone())), &clock).await;
}

/// Every refund rule above holds on a Redis Cluster, and a reservation across slots
/// gives its units back slot by slot: the next request gets the very slot it had.
#[tokio::test]
async fn refunds_on_redis_cluster() {
    let cluster = crate::support::redis_server::RedisCluster::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&cluster.url()).await.expect("connect");
    all(&Limiter::new(store.with_clock(clock.clone())), &clock).await;

    // A batch across slots is given back slot by slot.
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("connect")
        .with_clock(clock.clone());
    let limiter = Limiter::new(store);
    let rule = Rule::gcra("gc-x", 1, per_10s());
    clock.set_micros(T0 + 1_000_000);
    let batch = [Check::new(&rule, b"left"), Check::new(&rule, b"right")];
    let first = limiter.reserve(&batch, 60 * S).await.unwrap();
    assert_eq!(first.outcome().decision, Decision::Allow);
    let held = limiter.reserve(&batch, 60 * S).await.unwrap();
    assert_eq!(held.outcome().decision, Decision::Delay(10 * S));
    held.cancel().await.unwrap();
    let next = limiter.reserve(&batch, 60 * S).await.unwrap();
    assert_eq!(next.outcome().decision, Decision::Delay(10 * S));
}

/// `check` with its denial deferred (`Refusal::Deferred`), as the layer's charge by outcome
/// checks.
fn deferred(mut check: Check<'_>) -> Check<'_> {
    check.refusal = tollgate::Refusal::Deferred;
    check
}

/// A penalty locking at the second denial within a minute.
fn locking() -> Penalty {
    Penalty::lock_for(60 * S).after(2).within(60 * S)
}

/// The first request of `rule`'s window on key `a`, admitted, then one refused with its
/// denial deferred (`Refusal::Deferred`, as the layer's charge by outcome checks).
async fn admit_then_defer<S: Store>(limiter: &Limiter<S>, rule: &Rule, between: impl Fn()) {
    let check = Check::new(rule, b"a");
    assert!(limiter.check(&[check]).await.unwrap().is_admitted());
    between();
    let refused = limiter
        .store()
        .check(&[deferred(check)], Duration::ZERO)
        .await;
    assert!(!refused.unwrap().is_admitted());
}

/// Counts the deferred refusal `ago` after it; then the next window admits one request and
/// the second is the second denial: `Locked`.
async fn counted_late_it_locks<S: Store>(limiter: &Limiter<S>, rule: &Rule, ago: Duration) {
    let check = Check::new(rule, b"a");
    limiter
        .store()
        .count_denials(&[deferred(check)], ago)
        .await
        .unwrap();
    assert!(limiter.check(&[check]).await.unwrap().is_admitted());
    let denied = limiter.check(&[check]).await.unwrap();
    let reason = denied.decision.denial().map(|d| d.reason);
    assert_eq!(reason, Some(DenyReason::Locked), "{denied:?}");
}

/// A refusal deferred near its window's end and counted once the window's state has
/// ended and been swept still counts (`Store::count_denials`: a window turned since
/// leaves the refusal standing): a key a penalty refused is kept past its state's end, so
/// the next window's refusal is the second denial and locks the key.
#[tokio::test]
async fn a_refusal_counted_after_its_state_was_swept_still_counts() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let limiter = Limiter::new(store.clone());
    let rule = Rule::fixed_window_from_first_hit("fw9", 1, S).with_penalty(locking());
    admit_then_defer(&limiter, &rule, || clock.set_micros(T0 + 900_000)).await;
    clock.set_micros(T0 + 1_050_000);
    store.purge_expired();
    counted_late_it_locks(&limiter, &rule, Duration::from_millis(150)).await;
}

/// The same on Redis's own time, for a window's record and a sliding log's set: each
/// outlasts its state by what a late count needs, so the refusal counted after the
/// window's end finds it.
#[tokio::test]
async fn a_refusal_counted_after_its_record_expired_still_counts_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store);
    let window = S;
    for rule in [
        Rule::fixed_window_from_first_hit("fw10", 1, window),
        Rule::sliding_log("sl10", 1, window),
    ] {
        let rule = rule.with_penalty(locking());
        let first = std::time::Instant::now();
        let between = || std::thread::sleep(Duration::from_millis(100));
        admit_then_defer(&limiter, &rule, between).await;
        let refused = std::time::Instant::now();
        // Past the window's end, and the TTLs its state alone would set.
        let past = first + window + Duration::from_millis(200);
        tokio::time::sleep(past.saturating_duration_since(std::time::Instant::now())).await;
        counted_late_it_locks(&limiter, &rule, refused.elapsed()).await;
    }
}

/// A store gives back only the units it took: another store's outcome, though it names
/// the same rule, key, instant and state, gives nothing back here.
#[tokio::test]
async fn a_store_gives_back_only_the_units_it_took() {
    let clock = ManualClock::new(T0 + 1_000_000);
    let (a, b) = (
        MemoryStore::with_clock(clock.clone()),
        MemoryStore::with_clock(clock.clone()),
    );
    let rule = Rule::gcra("gc", 1, per_10s());
    let batch = [Check::new(&rule, b"k")];
    let mut held = Vec::new();
    for store in [&a, &b] {
        assert_eq!(
            store.check(&batch, 60 * S).await.unwrap().decision,
            Decision::Allow
        );
        held.push(store.check(&batch, 60 * S).await.unwrap());
    }
    let answer = |o: &Outcome| (o.decision, o.rules.clone());
    assert_eq!(
        answer(&held[0]),
        answer(&held[1]),
        "the same answer from both"
    );
    b.refund(&batch, &held[0]).await.unwrap();
    let next = b.check(&batch, 60 * S).await.unwrap();
    assert_eq!(
        next.decision,
        Decision::Delay(20 * S),
        "a's units: nothing back in b"
    );
    a.refund(&batch, &held[0]).await.unwrap();
    let next = a.check(&batch, 60 * S).await.unwrap();
    assert_eq!(
        next.decision,
        Decision::Delay(10 * S),
        "a's own units go back"
    );
}
