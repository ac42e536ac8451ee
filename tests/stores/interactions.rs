//! Features in combination (keys × quotas, keys × batches, holds × routes, …): each test
//! states what the combination does.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Check, Decision, Limiter, ManualClock, Outcome, Rate, Rule, RuleOutcome, StoreError,
};

/// A multiple of every window below.
const T0: u64 = 1_000_000_000_000;
const US: Duration = Duration::from_micros(1);

/// A Redis store on tokio's paused clock: the clock is held still while the store waits
/// for Redis (a blocking task in flight stops its auto-advance), so a round trip takes no
/// time on it and no timeout fires for want of an answer. Tests that wait on a
/// [`Reservation`](tollgate::Reservation) pause the clock; the store's time is a
/// `ManualClock`.
#[derive(Clone)]
struct Still<S>(S);

impl Still<RedisStore> {
    async fn connect(url: &str) -> Self {
        Self(still(RedisStore::connect(url)).await.expect("connect"))
    }

    async fn connect_cluster(urls: Vec<String>) -> Self {
        let store = still(RedisStore::connect_cluster(urls)).await;
        Self(store.expect("connect to the test cluster"))
    }

    fn with_clock(self, clock: ManualClock) -> Self {
        Self(self.0.with_clock(clock))
    }
}

/// Runs `call` with tokio's paused clock held still (see [`Still`]).
async fn still<F: std::future::Future>(call: F) -> F::Output {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || {
        let _ = wait.recv();
    });
    let output = call.await;
    drop(done);
    holder.await.expect("the blocking task ends");
    output
}

impl<S: Store> Store for Still<S> {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        still(self.0.check(batch, wait)).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        still(self.0.peek(check)).await
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        still(self.0.refund(batch, outcome)).await
    }
    async fn reset(&self, rule: &Rule, key: &[u8]) -> Result<(), StoreError> {
        still(self.0.reset(rule, key)).await
    }
}

fn memory() -> (Limiter<MemoryStore>, ManualClock) {
    let clock = ManualClock::new(T0);
    (Limiter::new(MemoryStore::with_clock(clock.clone())), clock)
}

/// ident × quotas: GCRA's state keeps a fraction of a µs in units of `1 / amount` (of the
/// rate in lowest terms), so its fingerprint names the rate itself, not only the emission
/// interval rounded to a whole µs: 3 per 5 µs and 1 per 2 µs (600,000/s and 500,000/s),
/// whose intervals round alike, have fingerprints of their own.
#[tokio::test]
async fn gcra_rates_with_the_same_rounded_interval_do_not_share_a_fingerprint() {
    let a = Rule::gcra("g", 10, Rate::new(3, 5 * US));
    let b = Rule::gcra("g", 10, Rate::new(1, 2 * US));
    assert_ne!(
        a.fingerprint(),
        b.fingerprint(),
        "different rates read their fractions differently"
    );
}

/// A GCRA rule reconfigured between two rates whose intervals round alike hands out no
/// more than the larger burst within one microsecond (the bound `Rule` documents): neither
/// configuration reads the other's fraction as its own.
#[tokio::test]
async fn a_gcra_reconfiguration_hands_out_no_second_burst_within_a_microsecond() {
    let (limiter, _clock) = memory();
    let a = Rule::gcra("g", 10, Rate::new(3, 5 * US));
    let b = Rule::gcra("g", 10, Rate::new(1, 2 * US));
    let mut admitted = 0;
    // The old configuration takes its whole burst, then the new one finds the key.
    for rule in std::iter::repeat_n(&a, 20).chain(std::iter::repeat_n(&b, 20)) {
        if limiter.check_one(rule, b"k").await.unwrap().is_admitted() {
            admitted += 1;
        }
    }
    assert!(
        admitted <= 10,
        "{admitted} admitted in one µs under two bursts of 10"
    );
}

/// ident × slog, and the Lua twin: a sliding log that finds another configuration's log
/// evaluates a fresh log that has just admitted the carried units (`Algorithm::adopt`);
/// the other configuration's entries still in the Redis set take no part in it, so the
/// carried units hold the key closed until the old log would have been empty, on both
/// stores.
async fn a_lowered_window_holds_the_carried_units<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let old = Rule::sliding_log("log", 5, 1000 * US);
    let new = Rule::sliding_log("log", 5, US);
    clock.set_micros(T0);
    let first = [Check::new(&old, b"k")];
    assert!(limiter.check(&first).await.unwrap().is_admitted());
    clock.set_micros(T0 + 1);
    let rest = [Check::new(&old, b"k").with_cost(4)];
    assert!(limiter.check(&rest).await.unwrap().is_admitted());

    // The old log is full until T0 + 1001: the new configuration holds its 5 units so long.
    let outcome = limiter.check_one(&new, b"k").await.unwrap();
    assert_eq!(
        outcome.decision,
        Decision::Deny(tollgate::Denial {
            reason: tollgate::DenyReason::Limited,
            retry_after: Some(1000 * US),
        }),
        "{outcome:?}"
    );
}

/// [`a_lowered_window_holds_the_carried_units`] on MemoryStore.
#[tokio::test]
async fn a_lowered_window_holds_the_carried_units_on_memory() {
    let (limiter, clock) = memory();
    a_lowered_window_holds_the_carried_units(&limiter, &clock).await;
}

/// [`a_lowered_window_holds_the_carried_units`] on a Redis server.
#[tokio::test]
async fn a_lowered_window_holds_the_carried_units_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    a_lowered_window_holds_the_carried_units(&limiter, &clock).await;
}

/// batchtime × leaky bucket: a batch held by one client's leaky-bucket queue leaves the
/// rules on other keys to the request's release instead of recording it there like a
/// wait-mode reservation (which would close their state until then: nothing is admitted
/// before a reservation's instant). So one client's queue never closes a shared bucket
/// with room to spare to the other clients: in check mode they are admitted.
#[tokio::test]
async fn one_clients_queue_does_not_close_a_shared_bucket() {
    let (limiter, clock) = memory();
    let per_user = Rule::leaky_bucket("per-user", 10, Rate::new(1, Duration::from_millis(100)));
    let global = Rule::token_bucket("global", 100, Rate::per_second(100));
    let batch = |user: &'static [u8]| [Check::new(&per_user, user), Check::new(&global, b"all")];

    assert_eq!(
        limiter.check(&batch(b"a")).await.unwrap().decision,
        Decision::Allow
    );
    // a's second request queues behind its first for 100 ms.
    let queued = limiter.check(&batch(b"a")).await.unwrap();
    assert_eq!(queued.decision, Decision::Delay(Duration::from_millis(100)));

    // b has an empty queue and the global bucket 98 tokens.
    clock.set_micros(T0 + 1);
    let b = limiter.check(&batch(b"b")).await.unwrap();
    assert_eq!(b.decision, Decision::Allow, "{b:?}");
}

/// ident × penalty: "the penalty survives a reconfiguration unchanged" (`Rule` docs): an
/// entry written by a configuration without the penalty (a rolling deploy adding one)
/// keeps the lock another configuration set until the lock ends, whatever the writer's own
/// expiry (`Entry::expires_at` on MemoryStore; the TTL `store` sets in batch.lua).
#[tokio::test]
async fn a_lock_outlives_a_write_by_a_configuration_without_the_penalty() {
    let (limiter, clock) = memory();
    let locking = Rule::fixed_window("login", 1, 1000 * US)
        .with_penalty(tollgate::Penalty::lock_for(Duration::from_secs(1)));
    let plain = Rule::fixed_window("login", 1, 1000 * US);
    assert!(limiter
        .check_one(&locking, b"k")
        .await
        .unwrap()
        .is_admitted());
    // The second attempt is denied and locks the key for a second.
    assert!(!limiter
        .check_one(&locking, b"k")
        .await
        .unwrap()
        .is_admitted());
    // A process without the penalty admits in the next window (it does not know the lock).
    clock.set_micros(T0 + 1000);
    assert!(limiter.check_one(&plain, b"k").await.unwrap().is_admitted());
    clock.set_micros(T0 + 3000);
    let before = limiter.peek(&locking, b"k", 1).await.unwrap();
    assert!(
        matches!(before.decision, Decision::Deny(d) if d.reason == tollgate::DenyReason::Locked),
        "{before:?}"
    );
    limiter.store().purge_expired();
    let outcome = limiter.check_one(&locking, b"k").await.unwrap();
    assert!(
        matches!(
            outcome.decision,
            Decision::Deny(tollgate::Denial {
                reason: tollgate::DenyReason::Locked,
                ..
            })
        ),
        "the lock set at T0 for 1 s still holds at T0 + 3 ms: {outcome:?}"
    );
}

/// The same on Redis, on the server's clock: the record's TTL keeps the lock.
#[tokio::test]
async fn a_lock_outlives_a_write_by_a_configuration_without_the_penalty_on_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::new(RedisStore::connect(&server.url()).await.expect("connect"));
    let window = Duration::from_millis(100);
    let locking = Rule::fixed_window("login", 1, window)
        .with_penalty(tollgate::Penalty::lock_for(Duration::from_secs(30)));
    let plain = Rule::fixed_window("login", 1, window);
    // Denied once (whatever window the calls fall in): locked for 30 s.
    while limiter
        .check_one(&locking, b"k")
        .await
        .unwrap()
        .is_admitted()
    {}
    // A process without the penalty admits in a later window.
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if limiter.check_one(&plain, b"k").await.unwrap().is_admitted() {
            break;
        }
    }
    let ttl: i64 = server
        .must(&["PTTL", "tollgate:{k}:login"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 20_000, "the record lives {ttl} ms, the lock 30 s");
}

mod held {
    //! held × routes / batchtime: what a held request counts under for `max_held_per_key`.

    use std::convert::Infallible;
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use tollgate::layer::{Limit, Mode, RateLimitLayer};
    use tollgate::{key, store::MemoryStore, Limiter, ManualClock, Rate, Rule};
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    const T0: u64 = 1_700_000_000_000_000;
    const S: Duration = Duration::from_secs(1);

    fn request(user: &str) -> Request<String> {
        Request::get("/")
            .header("user-id", user)
            .header("tenant", "acme")
            .body(String::new())
            .unwrap()
    }

    /// One request per user per 10 s, waited for; beside it a per-tenant window with room
    /// to spare, which never delays anything on its own.
    async fn two_users_of_one_tenant_are_held_each(tenant_limit: Limit) {
        let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(T0)));
        let per_user = Rule::gcra("per-user", 1, Rate::new(1, 10 * S));
        let layer = RateLimitLayer::builder()
            .limiter(limiter)
            .limit(Limit::new(per_user, key::header("user-id")))
            .limit(tenant_limit)
            .mode(Mode::Wait { max_wait: 60 * S })
            .max_held_per_key(1)
            .build()
            .unwrap();
        let svc =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_req: Request<String>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }));
        for user in ["a", "b"] {
            let first = svc.clone().oneshot(request(user)).await.unwrap();
            assert_eq!(first.status(), StatusCode::OK);
        }
        let held_a = tokio::spawn(svc.clone().oneshot(request("a")));
        tokio::task::yield_now().await;
        assert!(!held_a.is_finished(), "a's second request is held");
        // b's own key holds nothing yet: only the per-user rule delays its request.
        let held_b = tokio::spawn(svc.clone().oneshot(request("b")));
        tokio::task::yield_now().await;
        if held_b.is_finished() {
            let response = held_b.await.unwrap().unwrap();
            panic!(
                "b's request was refused ({}), its place taken by the tenant's key",
                response.status()
            );
        }
        for held in [held_a, held_b] {
            assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
        }
    }

    fn per_tenant() -> Rule {
        Rule::fixed_window("per-tenant", 1000, 60 * S)
    }

    /// A trial limit never denies: its key takes no place under `max_held_per_key`, though
    /// with batchtime every rule of a reserved batch reports `Delay`, a trial rule too.
    #[tokio::test(start_paused = true)]
    async fn a_shadow_limit_takes_no_place_under_max_held_per_key() {
        let tenant = Limit::new(per_tenant(), key::header("tenant")).shadow();
        two_users_of_one_tenant_are_held_each(tenant).await;
    }
}

mod twins {
    //! MemoryStore and RedisStore (the Lua twin) on the same scripts of reservations,
    //! confirmations and cancellations, across the merged features: every outcome is the
    //! same.

    use std::time::Duration;

    use super::Still;
    use crate::support::redis_server::RedisServer;
    use tollgate::{
        store::{MemoryStore, Store},
        Check, Limiter, ManualClock, Rate, Reservation, Rule,
    };

    const T0: u64 = 1_000_000_000_000;
    const US: Duration = Duration::from_micros(1);
    /// The unit of the scripts that confirm: tokio's timer, which ends a reservation's
    /// wait, has a resolution of 1 ms.
    const MS: Duration = Duration::from_millis(1);

    pub(super) enum Op {
        /// At a time after T0: the items (rule index, key, cost, shadow), max_wait.
        Check(u64, Vec<(usize, &'static str, u64, bool)>, u64),
        /// At a time after T0: cancel the reservation of the op at this index (a check, or a
        /// confirmation of one).
        Refund(u64, usize),
        /// At a time after T0: confirm the reservation of the op at this index (a check, or
        /// a confirmation of one) (`Reservation::confirm`, which waits for the release of
        /// the request it holds).
        Confirm(u64, usize),
    }

    /// The index of the check behind op `i` (a check, or a confirmation or refund of one).
    fn check_behind(ops: &[Op], i: usize) -> usize {
        match &ops[i] {
            Op::Check(..) => i,
            Op::Confirm(_, j) | Op::Refund(_, j) => check_behind(ops, *j),
        }
    }

    fn batch<'r>(rules: &'r [Rule], items: &[(usize, &'static str, u64, bool)]) -> Vec<Check<'r>> {
        items
            .iter()
            .map(|&(r, k, cost, shadow)| Check {
                shadow,
                ..Check::new(&rules[r], k.as_bytes()).with_cost(cost)
            })
            .collect()
    }

    /// Runs `ops`, whose times and waits are in `unit`s, on `limiter`: the store on `clock`,
    /// set to each op's time, and tokio's paused clock following it (never back), so that a
    /// reservation's wait and what is left of its `max_wait` are the script's.
    async fn run<S: Store + Clone>(
        limiter: &Limiter<S>,
        clock: &ManualClock,
        unit: Duration,
        rules: &[Rule],
        ops: &[Op],
    ) -> Vec<String> {
        let start = tokio::time::Instant::now();
        let units = |n: u64| Duration::from_micros(unit.as_micros() as u64 * n);
        let mut seen = Vec::new();
        // Per op, the reservation of a check (until it is cancelled).
        let mut held: Vec<Option<Reservation<S>>> = Vec::new();
        for op in ops {
            let (Op::Check(t, ..) | Op::Refund(t, _) | Op::Confirm(t, _)) = op;
            clock.set_micros(T0 + units(*t).as_micros() as u64);
            let now = tokio::time::Instant::now();
            if start + units(*t) > now {
                tokio::time::advance(start + units(*t) - now).await;
            }
            match op {
                Op::Check(_, items, max_wait) => {
                    let batch = batch(rules, items);
                    let reservation = limiter.reserve(&batch, units(*max_wait)).await.unwrap();
                    let outcome = reservation.outcome();
                    seen.push(format!("{:?} {:?}", outcome.decision, outcome.rules));
                    held.push(Some(reservation));
                }
                Op::Confirm(_, i) => {
                    let i = check_behind(ops, *i);
                    let Some(reservation) = held[i].as_mut() else {
                        panic!("op {i} holds no reservation to confirm")
                    };
                    let outcome = reservation.confirm().await.unwrap();
                    seen.push(format!(
                        "confirmed: {:?} {:?}",
                        outcome.decision, outcome.rules
                    ));
                    held.push(None);
                }
                Op::Refund(_, i) => {
                    let i = check_behind(ops, *i);
                    let Some(reservation) = held[i].take() else {
                        panic!("op {i} holds no reservation to cancel")
                    };
                    reservation.cancel().await.unwrap();
                    seen.push("cancelled".into());
                    held.push(None);
                }
            }
        }
        seen
    }

    /// Memory and a Redis server, on the script `ops` in `unit`s.
    pub(super) async fn same(name: &str, unit: Duration, rules: &[Rule], ops: &[Op]) {
        let clock = ManualClock::new(T0);
        let memory = run(
            &Limiter::new(MemoryStore::with_clock(clock.clone())),
            &clock,
            unit,
            rules,
            ops,
        )
        .await;
        let server = RedisServer::start();
        let clock = ManualClock::new(T0);
        let store = Still::connect(&server.url()).await;
        let redis = run(
            &Limiter::new(store.with_clock(clock.clone())),
            &clock,
            unit,
            rules,
            ops,
        )
        .await;
        for (i, m) in memory.iter().enumerate() {
            println!("{name} {i}: {m}");
        }
        for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
            assert_eq!(
                m, r,
                "{name}: op {i}: memory (left) and Redis (right) differ"
            );
        }
    }

    /// Memory and a 3-node Cluster, whose cross-slot batches are decided slot by slot
    /// (realigned to the release, refunded when a later slot denies).
    pub(super) async fn same_on_cluster(name: &str, unit: Duration, rules: &[Rule], ops: &[Op]) {
        let clock = ManualClock::new(T0);
        let memory = run(
            &Limiter::new(MemoryStore::with_clock(clock.clone())),
            &clock,
            unit,
            rules,
            ops,
        )
        .await;
        let cluster = crate::support::redis_server::RedisCluster::start();
        let clock = ManualClock::new(T0);
        let store = Still::connect_cluster(cluster.urls()).await;
        let redis = run(
            &Limiter::new(store.with_clock(clock.clone())),
            &clock,
            unit,
            rules,
            ops,
        )
        .await;
        for (i, m) in memory.iter().enumerate() {
            println!("{name} {i}: {m}");
        }
        for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
            assert_eq!(
                m, r,
                "{name}: op {i}: memory (left) and Cluster (right) differ"
            );
        }
    }

    /// Cross-slot batches with a queue, shadow items, waits and cancellations: each slot's
    /// part is decided, realigned and given back as MemoryStore decides the whole batch.
    #[tokio::test(start_paused = true)]
    async fn cross_slot_batches_with_queues_shadows_and_refunds() {
        let rules = [
            Rule::leaky_bucket("lb", 5, rate(1, 100)),
            Rule::fixed_window("fw", 3, US * 1000),
            Rule::sliding_log("sl", 3, US * 1000),
            Rule::gcra("g", 2, rate(3, 5)),
            Rule::token_bucket("tb", 3, rate(1, 100)),
        ];
        use Op::*;
        let ops = [
            Check(0, vec![(0, "a", 2, false)], 0),
            Check(
                0,
                vec![(1, "b", 1, false), (0, "a", 1, false), (2, "c", 1, false)],
                0,
            ),
            Check(
                1,
                vec![(1, "b", 1, false), (2, "c", 1, true), (0, "a", 1, false)],
                0,
            ),
            Refund(2, 2),
            Check(
                3,
                vec![(3, "d", 2, false), (4, "e", 1, false), (0, "a", 1, true)],
                0,
            ),
            Check(4, vec![(3, "d", 1, false), (4, "e", 1, false)], 500),
            Refund(5, 5),
            Check(6, vec![(3, "d", 1, false), (4, "e", 1, false)], 500),
            Check(
                7,
                vec![(1, "b", 1, false), (2, "c", 2, false), (0, "a", 1, false)],
                2000,
            ),
            Refund(8, 8),
            Check(9, vec![(1, "b", 1, false), (2, "c", 1, false)], 0),
            Check(
                1200,
                vec![(1, "b", 3, false), (2, "c", 3, false), (4, "e", 3, true)],
                0,
            ),
        ];
        same_on_cluster("cross-slot", US, &rules, &ops).await;
    }

    /// Rules on other keys than a leaky bucket are pending while it holds
    /// the request and count it at its release; denied there, the queue's slot goes back.
    fn shaped_with_shared_rules() -> (Vec<Rule>, Vec<Op>) {
        let rules = vec![
            Rule::leaky_bucket("queue", 5, rate_ms(1, 100)),
            Rule::fixed_window("window", 2, MS * 1000),
            Rule::token_bucket("bucket", 3, rate_ms(1, 300)),
            Rule::sliding_log("log", 2, MS * 600),
            Rule::gcra("g", 2, rate_ms(1, 200)),
        ];
        use Op::*;
        let ops = vec![
            // 0, 1: a's queue holds its second request 100 ms; the window is pending.
            Check(900, vec![(0, "a", 1, false), (1, "all", 1, false)], 0),
            Check(950, vec![(0, "a", 1, false), (1, "all", 1, false)], 0),
            // 2: b takes the window's last unit in [0, 1000).
            Check(960, vec![(0, "b", 1, false), (1, "all", 1, false)], 0),
            // 3: a's request passes at 1000, counted in [1000, 2000).
            Confirm(1000, 1),
            // 4, 5: c queues behind its first; a shared bucket and a log on another key.
            Check(
                1100,
                vec![
                    (0, "c", 1, false),
                    (2, "shared", 1, false),
                    (3, "l", 1, false),
                ],
                0,
            ),
            Check(
                1110,
                vec![
                    (0, "c", 2, false),
                    (2, "shared", 1, false),
                    (3, "l", 1, false),
                ],
                0,
            ),
            // 6: d takes the bucket and log while c's request is held; a trial rule on
            // another key counts on arrival.
            Check(
                1150,
                vec![
                    (2, "shared", 2, false),
                    (3, "l", 1, false),
                    (4, "t", 1, true),
                ],
                0,
            ),
            // 7: at c's release the log is full: denied, c's queue slot given back.
            Confirm(1200, 5),
            // 8: so c's next request queues only behind its first.
            Check(1210, vec![(0, "c", 1, false), (4, "g", 1, false)], 0),
            Confirm(1300, 8),
            // 10, 11: wait mode: a pending GCRA reserves a later slot at the release.
            Check(1300, vec![(0, "e", 1, false), (4, "g", 1, false)], 0),
            Check(1310, vec![(0, "e", 1, false), (4, "g", 1, false)], 1000),
            Confirm(1400, 11),
            Confirm(1600, 12),
            Refund(1600, 12),
            Check(1700, vec![(4, "g", 1, false)], 0),
        ];
        (rules, ops)
    }

    /// [`shaped_with_shared_rules`] on MemoryStore and a Redis server: the same answers.
    #[tokio::test(start_paused = true)]
    async fn shaped_requests_with_shared_rules_confirmed_at_release() {
        let (rules, ops) = shaped_with_shared_rules();
        same("shaped", MS, &rules, &ops).await;
    }

    /// Queues in two slots: the one that holds the request longer decides its release, and
    /// the other slot's rules (its empty queue too) are pending until then.
    fn queues_in_two_places() -> (Vec<Rule>, Vec<Op>) {
        let rules = vec![
            Rule::leaky_bucket("q", 5, rate_ms(1, 100)),
            Rule::leaky_bucket("tq", 5, rate_ms(1, 100)),
            Rule::fixed_window("tfw", 1, MS * 1000),
        ];
        use Op::*;
        let ops = vec![
            Check(900, vec![(0, "a", 1, false)], 0),
            Check(
                950,
                vec![(0, "a", 1, false), (1, "t", 1, false), (2, "t", 1, false)],
                0,
            ),
            Check(1000, vec![(2, "t", 1, false)], 0),
            Confirm(1000, 1),
            Check(1020, vec![(1, "t", 1, false), (0, "b", 1, false)], 0),
            Check(
                1030,
                vec![(1, "t", 2, false), (0, "b", 1, false), (2, "u", 1, false)],
                0,
            ),
            Confirm(1200, 5),
        ];
        (rules, ops)
    }

    /// [`queues_in_two_places`] on MemoryStore and a Redis server: the same answers.
    #[tokio::test(start_paused = true)]
    async fn queues_in_two_places_leave_the_other_rules_pending() {
        let (rules, ops) = queues_in_two_places();
        same("two queues", MS, &rules, &ops).await;
    }

    /// [`queues_in_two_places`] on MemoryStore and a Redis Cluster: the same answers.
    #[tokio::test(start_paused = true)]
    async fn queues_in_two_places_leave_the_other_rules_pending_on_cluster() {
        let (rules, ops) = queues_in_two_places();
        same_on_cluster("two queues (cluster)", MS, &rules, &ops).await;
    }

    /// [`shaped_with_shared_rules`] on MemoryStore and a Redis Cluster: the same answers.
    #[tokio::test(start_paused = true)]
    async fn shaped_requests_with_shared_rules_confirmed_at_release_on_cluster() {
        let (rules, ops) = shaped_with_shared_rules();
        same_on_cluster("shaped (cluster)", MS, &rules, &ops).await;
    }

    fn rate(amount: u64, us: u64) -> Rate {
        Rate::new(amount, US * us as u32)
    }

    fn rate_ms(amount: u64, ms: u64) -> Rate {
        Rate::new(amount, MS * ms as u32)
    }

    /// GCRA at a rate with a fraction of a µs per unit: cancelled reservations give back
    /// (or keep, behind a later one) the same units on both stores.
    #[tokio::test(start_paused = true)]
    async fn gcra_refunds_with_fractions() {
        let rules = [Rule::gcra("g", 2, rate(3, 5))];
        use Op::*;
        let ops = [
            Check(0, vec![(0, "k", 1, false)], 0),
            Check(0, vec![(0, "k", 1, false)], 0),
            Check(0, vec![(0, "k", 1, false)], 100),
            Check(0, vec![(0, "k", 2, false)], 100),
            Refund(1, 2),
            Check(1, vec![(0, "k", 1, false)], 100),
            Refund(1, 3),
            Check(2, vec![(0, "k", 1, false)], 100),
            Check(2, vec![(0, "k", 1, false)], 100),
        ];
        same("gcra", US, &rules, &ops).await;
    }

    /// A sliding log gives back a reservation's entries amid later entries and after
    /// pruning, alike on both stores.
    #[tokio::test(start_paused = true)]
    async fn sliding_log_refunds_amid_later_entries_and_pruning() {
        let rules = [Rule::sliding_log("l", 3, US * 100)];
        use Op::*;
        let ops = [
            Check(0, vec![(0, "k", 1, false)], 0),
            Check(10, vec![(0, "k", 2, false)], 0),
            Check(20, vec![(0, "k", 1, false)], 500),
            Check(30, vec![(0, "k", 1, false)], 500),
            Refund(40, 2),
            Check(50, vec![(0, "k", 1, false)], 500),
            Check(150, vec![(0, "k", 1, false)], 500),
            Refund(150, 3),
            Check(160, vec![(0, "k", 3, false)], 500),
            Check(400, vec![(0, "k", 1, false)], 0),
        ];
        same("sliding log", US, &rules, &ops).await;
    }

    /// A leaky bucket reconfigured between two drain rates (its level carried over) behind
    /// another queue's release: a cancelled reservation gives back alike on both stores.
    #[tokio::test(start_paused = true)]
    async fn carried_leaky_bucket_behind_another_release() {
        let rules = [
            Rule::leaky_bucket("queue", 10, rate(1, 100)),
            Rule::leaky_bucket("shaper", 10, rate(1, 200)),
            Rule::leaky_bucket("shaper", 10, rate(1, 100)),
            Rule::fixed_window("window", 2, US * 1000),
        ];
        use Op::*;
        let ops = [
            Check(0, vec![(0, "k", 6, false)], 0),
            Check(0, vec![(1, "k", 5, false)], 0),
            Check(
                0,
                vec![(0, "k", 1, false), (2, "k", 1, false), (3, "k", 1, false)],
                0,
            ),
            Refund(10, 2),
            Check(
                20,
                vec![(0, "k", 1, false), (2, "k", 1, false), (3, "k", 1, false)],
                0,
            ),
            Check(30, vec![(2, "k", 1, false)], 0),
        ];
        same("carried leaky bucket", US, &rules, &ops).await;
    }

    /// A leaky bucket on trial beside a waiting GCRA: what the trial item took goes back
    /// with the reservation, alike on both stores.
    #[tokio::test(start_paused = true)]
    async fn shadow_leaky_bucket_behind_a_reservation() {
        let rules = [
            Rule::gcra("g", 1, rate(1, 100)),
            Rule::leaky_bucket("lb", 3, rate(1, 50)),
        ];
        use Op::*;
        let ops = [
            Check(0, vec![(0, "k", 1, false), (1, "k", 2, true)], 0),
            Check(1, vec![(0, "k", 1, false), (1, "k", 1, true)], 500),
            Check(2, vec![(1, "k", 1, false)], 0),
            Refund(3, 1),
            Check(4, vec![(1, "k", 1, false)], 0),
            Check(5, vec![(0, "k", 1, false), (1, "k", 3, true)], 500),
            Refund(6, 5),
            Check(7, vec![(1, "k", 1, false)], 0),
        ];
        same("shadow leaky bucket", US, &rules, &ops).await;
    }

    /// A reservation cancelled after its rule was reconfigured (and used) in between gives
    /// back the same on both stores.
    #[tokio::test(start_paused = true)]
    async fn refund_after_a_reconfiguration_in_between() {
        let rules = [
            Rule::token_bucket("b", 4, rate(1, 100)),
            Rule::token_bucket("b", 5, rate(1, 100)),
            Rule::leaky_bucket("q", 4, rate(1, 100)),
            Rule::leaky_bucket("q", 5, rate(1, 100)),
        ];
        use Op::*;
        let ops = [
            Check(0, vec![(0, "k", 4, false)], 0),
            Check(0, vec![(0, "k", 1, false)], 1000),
            Check(1, vec![(1, "k", 1, false)], 1000),
            Check(2, vec![(0, "k", 1, false)], 1000),
            Refund(3, 1),
            Check(4, vec![(0, "k", 1, false)], 1000),
            Check(0, vec![(2, "k", 3, false)], 0),
            Check(10, vec![(3, "k", 1, false)], 0),
            Check(20, vec![(2, "k", 1, false)], 0),
            Refund(30, 8),
            Check(40, vec![(2, "k", 1, false)], 0),
        ];
        same("reconfigured refunds", US, &rules, &ops).await;
    }
}

/// A multiple of a minute.
const T60: u64 = 1_200_000_000_000;

/// On the `Limiter`, a global fixed window (1 a minute) beside a per-user
/// leaky bucket (5 units, one per 10 s) counts a shaped request in the window it passes in,
/// not the one it queues in: the window is left to the release, where confirming the
/// `Reservation` counts it. A request whose window filled up while it was held is denied at
/// its release, and its queue slot goes back. The store's clock is the test's; tokio's
/// paused clock ends each reservation's wait.
async fn a_shaped_request_counts_where_it_passes<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
) {
    let s = |secs: u64| T60 + secs * 1_000_000;
    let queue = Rule::leaky_bucket("per-user", 5, Rate::new(1, Duration::from_secs(10)));
    let global = Rule::fixed_window("global", 1, Duration::from_secs(60));
    let request = |user: &'static [u8]| [Check::new(&queue, user), Check::new(&global, b"all")];
    let queue_only = |user: &'static [u8]| [Check::new(&queue, user)];

    clock.set_micros(s(50));
    assert_eq!(
        limiter.check(&request(b"a")).await.unwrap().decision,
        Decision::Allow
    );
    // a's next request queues until 60 s: the window is left to the release.
    clock.set_micros(s(55));
    let mut held = limiter
        .reserve(&request(b"a"), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        held.outcome().decision,
        Decision::Delay(Duration::from_secs(5)),
        "{held:?}"
    );
    // [0, 60 s) is full with a's first request: b is denied.
    clock.set_micros(s(58));
    assert!(!limiter.check(&request(b"b")).await.unwrap().is_admitted());
    clock.set_micros(s(60));
    let passed = held.confirm().await.unwrap();
    assert_eq!(passed.decision, Decision::Allow, "{passed:?}");
    // a's held request counts in [60 s, 120 s), where it passed: b waits for 120 s.
    clock.set_micros(s(61));
    let b = limiter.check(&request(b"b")).await.unwrap();
    assert_eq!(
        b.decision,
        Decision::Deny(tollgate::Denial {
            reason: tollgate::DenyReason::Limited,
            retry_after: Some(Duration::from_secs(59)),
        }),
        "{b:?}"
    );

    // a queues a request on its own until 180 s, then one that needs the window too.
    clock.set_micros(s(170));
    assert!(limiter
        .check(&queue_only(b"a"))
        .await
        .unwrap()
        .is_admitted());
    clock.set_micros(s(175));
    let mut held = limiter
        .reserve(&request(b"a"), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        held.outcome().decision,
        Decision::Delay(Duration::from_secs(5)),
        "{held:?}"
    );
    // b takes [180 s, 240 s) while a's request is held.
    clock.set_micros(s(180));
    assert_eq!(
        limiter.check(&request(b"b")).await.unwrap().decision,
        Decision::Allow
    );
    // Confirmed a little after its release, as a layer's timer does.
    clock.set_micros(s(180) + 1_000);
    let denied = held.confirm().await.unwrap();
    assert_eq!(
        denied.decision,
        Decision::Deny(tollgate::Denial {
            reason: tollgate::DenyReason::Limited,
            retry_after: Some(Duration::from_micros(59_999_000)),
        }),
        "{denied:?}"
    );
    // Its queue slot went back: a's next request (alone) is not queued behind it.
    let next = limiter.check(&queue_only(b"a")).await.unwrap();
    assert_eq!(next.decision, Decision::Allow, "{next:?}");
    // Cancelling the denied reservation gives nothing back twice.
    held.cancel().await.unwrap();
    let after = limiter.check(&queue_only(b"a")).await.unwrap();
    assert_eq!(
        after.decision,
        Decision::Delay(Duration::from_secs(10)),
        "{after:?}"
    );
}

/// [`a_shaped_request_counts_where_it_passes`] on MemoryStore.
#[tokio::test(start_paused = true)]
async fn a_shaped_request_counts_where_it_passes_on_memory() {
    let clock = ManualClock::new(T60);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    a_shaped_request_counts_where_it_passes(&limiter, &clock).await;
}

/// [`a_shaped_request_counts_where_it_passes`] on a Redis server.
#[tokio::test(start_paused = true)]
async fn a_shaped_request_counts_where_it_passes_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T60);
    let store = Still::connect(&server.url()).await;
    let limiter = Limiter::new(store.with_clock(clock.clone()));
    a_shaped_request_counts_where_it_passes(&limiter, &clock).await;
}

/// A clock that follows tokio's (paused) time, from `T60`.
#[derive(Debug, Clone)]
struct TokioClock(tokio::time::Instant);

impl tollgate::Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        T60 + self.0.elapsed().as_micros() as u64
    }
}

/// The instants (since `start`) at which requests reached the inner service.
type Passed = std::sync::Arc<std::sync::Mutex<Vec<Duration>>>;

/// A per-user leaky bucket (5 units, one per 10 s) beside a global fixed window of 2 a
/// minute, in `mode`, over a service that records when each request reaches it.
fn shaping_service<St: Store + Clone>(
    limiter: Limiter<St>,
    mode: tollgate::layer::Mode,
    start: tokio::time::Instant,
) -> (
    impl tower::Service<
            http::Request<String>,
            Response = http::Response<tollgate::layer::RateLimitBody<String>>,
            Error = std::convert::Infallible,
            Future = impl Send,
        > + Clone
        + Send
        + 'static,
    Passed,
) {
    use tollgate::key;
    use tollgate::layer::{Limit, RateLimitLayer};
    use tower::{service_fn, ServiceBuilder};

    let passed = Passed::default();
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::leaky_bucket("per-user", 5, Rate::new(1, Duration::from_secs(10))),
            key::header("user-id"),
        ))
        .limit(Limit::new(
            Rule::fixed_window("global", 2, Duration::from_secs(60)),
            key::global(),
        ))
        .mode(mode)
        .build()
        .expect("valid layer");
    let seen = passed.clone();
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        move |_req: http::Request<String>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(start.elapsed());
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }
        },
    ));
    (service, passed)
}

fn from_user(user: &str) -> http::Request<String> {
    http::Request::get("/")
        .header("user-id", user)
        .body(String::new())
        .unwrap()
}

/// The shaped-request schedule, through the layer: a global fixed window
/// of 2 per minute beside a per-user leaky bucket (5 units, one per 10 s). a's request at
/// 55 s queues behind its 50 s one until 60 s; b sends at 60 s and 60.5 s. The layer
/// counts a's held request in the window it passes in ([60 s, 120 s)), so no more than 2
/// pass in any minute: b's second request is refused.
async fn shaped_requests_pass_within_the_global_limit<St: Store + Clone>(limiter: Limiter<St>) {
    use tower::ServiceExt;

    let start = tokio::time::Instant::now();
    let (service, passed) = shaping_service(limiter, tollgate::layer::Mode::Enforce, start);
    let send = |user: &'static str, at: Duration| {
        let service = service.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + at).await;
            let response = service.oneshot(from_user(user)).await.unwrap();
            response.status()
        })
    };
    let ms = Duration::from_millis;
    let requests = [
        send("a", ms(50_000)),
        send("a", ms(55_000)),
        send("b", ms(60_000)),
        send("b", ms(60_500)),
    ];
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    let passed = passed.lock().unwrap().clone();
    for window in 0..3u64 {
        let range = Duration::from_secs(60 * window)..Duration::from_secs(60 * (window + 1));
        let n = passed.iter().filter(|t| range.contains(t)).count();
        assert!(
            n <= 2,
            "{n} passed in {range:?} against a limit of 2: {passed:?}"
        );
    }
    // Not over-strict either: a's first two and b's first pass.
    assert_eq!(passed.len(), 3, "{passed:?}");
}

/// [`shaped_requests_pass_within_the_global_limit`] on MemoryStore, on tokio's clock.
#[tokio::test(start_paused = true)]
async fn shaped_requests_pass_within_the_global_limit_on_memory() {
    let clock = TokioClock(tokio::time::Instant::now());
    shaped_requests_pass_within_the_global_limit(Limiter::new(MemoryStore::with_clock(clock)))
        .await;
}

/// A held request whose client goes away gives its queue slot back, and the global window,
/// left to its release, never counted it: a's next request takes the slot and the
/// window's second unit.
#[tokio::test(start_paused = true)]
async fn a_dropped_shaped_request_is_counted_nowhere() {
    use tower::ServiceExt;

    let start = tokio::time::Instant::now();
    let limiter = Limiter::new(MemoryStore::with_clock(TokioClock(start)));
    let (service, passed) = shaping_service(limiter, tollgate::layer::Mode::Enforce, start);
    let s = Duration::from_secs;
    let ok = |r: http::Response<_>| r.status().as_u16();
    assert_eq!(
        ok(service.clone().oneshot(from_user("a")).await.unwrap()),
        200
    );
    tokio::time::sleep(s(1)).await;
    let dropped = tokio::spawn(service.clone().oneshot(from_user("a")));
    tokio::time::sleep(s(4)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    tokio::time::sleep(s(1)).await;
    // At 6 s: behind the first request only (it drains at 10 s), not behind the dropped one.
    let next = tokio::spawn(service.clone().oneshot(from_user("a")));
    assert_eq!(ok(next.await.unwrap().unwrap()), 200);
    // b at 11 s: the window has a's two requests that passed.
    tokio::time::sleep_until(start + s(11)).await;
    assert_eq!(
        ok(service.clone().oneshot(from_user("b")).await.unwrap()),
        429
    );
    assert_eq!(*passed.lock().unwrap(), [s(0), s(10)]);
}

/// Wait mode: a held request whose global window filled up while it queued waits again at
/// its release, for the next window, instead of being refused.
#[tokio::test(start_paused = true)]
async fn in_wait_mode_a_shaped_request_waits_again_at_its_release() {
    use tower::ServiceExt;

    let start = tokio::time::Instant::now();
    let limiter = Limiter::new(MemoryStore::with_clock(TokioClock(start)));
    let mode = tollgate::layer::Mode::Wait {
        max_wait: Duration::from_secs(120),
    };
    let (service, passed) = shaping_service(limiter, mode, start);
    let s = Duration::from_secs;
    let send = |user: &'static str, at: Duration| {
        let service = service.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + at).await;
            service
                .oneshot(from_user(user))
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    // a queues its second request until 55 s; b and c fill the window at 50 s and 52 s.
    let requests = [
        send("a", s(45)),
        send("a", s(46)),
        send("b", s(50)),
        send("c", s(52)),
    ];
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap());
    }
    assert_eq!(statuses, [200; 4]);
    let passed = passed.lock().unwrap().clone();
    // a's first and b pass in [0, 60 s) (c waits, a's second too, for the next minute).
    assert_eq!(
        passed.iter().filter(|t| **t < s(60)).count(),
        2,
        "{passed:?}"
    );
    assert_eq!(
        passed
            .iter()
            .filter(|t| **t >= s(60) && **t < s(120))
            .count(),
        2,
        "{passed:?}"
    );
}

/// Shadow mode holds nothing, so the rules left to a shaped request's release count it at
/// once: the global window of 2 a minute would refuse a's third to fifth requests.
#[tokio::test(start_paused = true)]
async fn in_shadow_mode_shaped_requests_count_on_every_rule() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tollgate::key;
    use tollgate::layer::{Limit, Mode, RateLimitLayer};
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    let start = tokio::time::Instant::now();
    let limiter = Limiter::new(MemoryStore::with_clock(TokioClock(start)));
    let would_deny = Arc::new(AtomicUsize::new(0));
    let seen = would_deny.clone();
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(
            Rule::leaky_bucket("per-user", 5, Rate::new(1, Duration::from_secs(10))),
            key::header("user-id"),
        ))
        .limit(Limit::new(
            Rule::fixed_window("global", 2, Duration::from_secs(60)),
            key::global(),
        ))
        .mode(Mode::Shadow)
        .on_decision(move |event| {
            if !event.outcome().is_admitted() {
                seen.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .expect("valid layer");
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        |_req: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        },
    ));
    for _ in 0..5 {
        let response = service.clone().oneshot(from_user("a")).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(would_deny.load(Ordering::Relaxed), 3);
}
