//! Leases on a `MemoryStore` shared by several `Leased` instances (`store::Leased`): never
//! more than the store counts, unused units given back at the lease's end, a dead
//! instance's units refilled at the rule's rate, the store's exact answer when a lease
//! cannot answer, and the rules that cannot lease refused at build.

use std::time::Duration;

use tollgate::{
    store::{Leased, MemoryStore},
    Check, Clock, Limiter, ManualClock, Penalty, Rate, Rule,
};

const T0: u64 = crate::support::EPOCH;

fn instances(
    store: &MemoryStore,
    rule: &Rule,
    units: u64,
    n: usize,
) -> Vec<Limiter<Leased<MemoryStore>>> {
    (0..n)
        .map(|_| {
            let leased = Leased::new(store.clone()).lease(rule, units, Duration::from_millis(50));
            Limiter::new(leased.expect("a GCRA leases"))
        })
        .collect()
}

/// Three instances and a plain limiter see the same demand, 30 requests for each unit the
/// rule restores, for 2 s: the instances admit no more than the rule's burst plus its
/// refill (what the plain limiter admits), and no less than that less the units parked.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn several_instances_never_admit_more_than_a_plain_limiter() {
    let clock = ManualClock::new(T0);
    let rule = Rule::gcra("hot", 100, Rate::per_second(1_000));
    let store = MemoryStore::with_clock(clock.clone());
    let leased = instances(&store, &rule, 10, 3);
    let plain = Limiter::new(MemoryStore::with_clock(clock.clone()));
    let batch = [Check::new(&rule, b"all")];
    let (mut by_leases, mut by_plain) = (0u64, 0u64);
    for _ in 0..20_000 {
        for limiter in &leased {
            by_leases += u64::from(limiter.check(&batch).await.unwrap().is_admitted());
        }
        for _ in 0..3 {
            by_plain += u64::from(plain.check(&batch).await.unwrap().is_admitted());
        }
        clock.advance(Duration::from_micros(100));
        tokio::time::advance(Duration::from_micros(100)).await;
    }
    let bound = 100 + 2_000;
    assert!(by_plain <= bound && by_plain + 1 >= bound, "{by_plain}");
    assert!(by_leases <= by_plain, "{by_leases} > {by_plain}");
    assert!(
        by_leases + 3 * 10 >= by_plain,
        "{by_leases} + parked < {by_plain}"
    );
}

/// A hot key under its limit: nearly every decision is made in process, and the store is
/// asked about once per lease.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn under_its_limit_a_hot_key_is_decided_in_process() {
    let clock = ManualClock::new(T0);
    let rule = Rule::gcra("hot", 10_000, Rate::per_second(1_000_000));
    let store = MemoryStore::with_clock(clock.clone());
    let leased = instances(&store, &rule, 100, 3);
    let batch = [Check::new(&rule, b"all")];
    for _ in 0..1_000 {
        for limiter in &leased {
            assert!(limiter.check(&batch).await.unwrap().is_admitted());
        }
        clock.advance(Duration::from_micros(10));
    }
    // 3,000 decisions, 30 leases of 100: the store counts 3,000 units, no more.
    let peeked = Limiter::new(store).peek(&rule, b"all", 1).await.unwrap();
    assert!(peeked.info.remaining >= 10_000 - 3_000, "{peeked:?}");
}

/// At the end of its term a lease gives back the units it did not use, even with no
/// request to end it; the units it used stay taken.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn unused_units_go_back_when_the_term_ends() {
    let clock = ManualClock::new(T0);
    let rule = Rule::token_bucket("hot", 100, Rate::per_minute(1));
    let store = MemoryStore::with_clock(clock.clone());
    let limiter = Limiter::new(
        Leased::new(store.clone())
            .lease(&rule, 10, Duration::from_secs(1))
            .unwrap(),
    );
    let plain = Limiter::new(store);
    for _ in 0..3 {
        assert!(limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    }
    // What a request of 1 would leave: 100 less the lease's 10, less 1.
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 89);
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 96);
}

/// An instance that dies never ends its lease: its units stay parked until the lease's
/// term ends (the bucket refills only to its burst less them), then count as used and
/// refill at the rule's rate from where the bucket stood.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dead_instances_lease_holds_its_units_until_its_term_ends() {
    let clock = ManualClock::new(T0);
    let rule = Rule::gcra("hot", 20, Rate::per_second(10));
    let store = MemoryStore::with_clock(clock.clone());
    let dead = Limiter::new(
        Leased::new(store.clone())
            .lease(&rule, 10, Duration::from_secs(60))
            .unwrap(),
    );
    assert!(dead.check_one(&rule, b"k").await.unwrap().is_admitted());
    // Its process is gone: its timer never runs (tokio's clock does not move here).
    drop(dead);
    let plain = Limiter::new(store);
    // What a request of 1 would leave.
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 9);
    clock.advance(Duration::from_secs(30));
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 9);
    // The term ends at 60 s: half a second later, 5 more refilled.
    clock.advance(Duration::from_millis(30_500));
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 14);
    clock.advance(Duration::from_secs(1));
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 19);
}

/// A request no lease can answer gets the store's own decision: the same denial and
/// Retry-After the store gives a plain limiter at that instant.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_a_lease_cannot_answer_gets_the_stores_answer() {
    let clock = ManualClock::new(T0);
    let rule = Rule::gcra("hot", 10, Rate::per_second(1));
    let store = MemoryStore::with_clock(clock.clone());
    let [a, b]: [_; 2] = instances(&store, &rule, 4, 2).try_into().ok().unwrap();
    let plain = Limiter::new(store);
    for _ in 0..3 {
        assert!(a.check_one(&rule, b"k").await.unwrap().is_admitted());
    }
    assert!(b.check_one(&rule, b"k").await.unwrap().is_admitted());
    // 8 units leased, 2 left in the store: b decides 3 from its lease, its next lease of
    // 4 is denied, and its requests are the store's: 2 admitted, then denied.
    for _ in 0..5 {
        assert!(b.check_one(&rule, b"k").await.unwrap().is_admitted());
    }
    let denied = b.check_one(&rule, b"k").await.unwrap();
    assert_eq!(
        denied.decision.denial().unwrap().retry_after,
        Some(Duration::from_secs(1))
    );
    // A cost above the lease and a wait go to the store too.
    let costly = [Check::new(&rule, b"k").with_cost(5)];
    assert_eq!(
        a.check(&costly).await.unwrap(),
        plain.check(&costly).await.unwrap()
    );
}

/// Only a token bucket or GCRA without a penalty leases, a share of 1 to its burst, for a
/// term longer than zero, once: the others are refused at build, naming the rule.
#[test]
fn rules_that_cannot_lease_are_refused_at_build() {
    let term = Duration::from_millis(100);
    let second = Duration::from_secs(1);
    let lease = |rule: &Rule, units| Leased::new(MemoryStore::new()).lease(rule, units, term);
    for rule in [
        Rule::sliding_log("log", 100, second),
        Rule::fixed_window("window", 100, second),
        Rule::sliding_window("sliding", 100, second),
        Rule::leaky_bucket("queue", 100, Rate::per_second(100)),
    ] {
        let error = lease(&rule, 10).unwrap_err().to_string();
        assert!(
            error.contains(&format!("rule {:?}", rule.name())),
            "{error}"
        );
        assert!(error.contains("only a token bucket or GCRA"), "{error}");
    }
    let locked = Rule::gcra("locked", 100, Rate::per_second(100))
        .with_penalty(Penalty::lock_for(second).after(3).within(second));
    assert!(lease(&locked, 10)
        .unwrap_err()
        .to_string()
        .contains("penalty"));
    let gcra = Rule::gcra("g", 100, Rate::per_second(100));
    assert!(lease(&gcra, 0).is_err());
    assert!(lease(&gcra, 101).is_err());
    assert!(lease(
        &Rule::token_bucket_stepped("s", 100, Rate::per_second(1)),
        100
    )
    .is_ok());
    let twice = lease(&gcra, 10)
        .unwrap()
        .lease(&gcra, 10, term)
        .unwrap_err();
    assert!(twice.to_string().contains("leased twice"), "{twice}");
    let zero = Leased::new(MemoryStore::new()).lease(&gcra, 10, Duration::ZERO);
    assert!(zero.is_err());
}

/// What leases admit is what the rule admits in one process, at every instant: the
/// admissions of three instances, replayed at their instants into a plain limiter of the
/// rule, are all admitted, though leases are taken from a full bucket and used once it
/// could have refilled (the store parks their units).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn leases_never_exceed_the_rules_burst() {
    for rule in [
        Rule::gcra("hot", 100, Rate::per_second(1_000)),
        Rule::token_bucket("hot", 100, Rate::per_second(1_000)),
    ] {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let leased = instances(&store, &rule, 10, 3);
        let mut admitted = Vec::new();
        // Quiet spells long enough for the bucket to refill between a lease's uses, then
        // bursts from one instance; pseudo-random, the same each run.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..400 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let (who, burst) = ((seed % 3) as usize, 1 + (seed >> 8) % 60);
            for _ in 0..burst {
                let batch = [Check::new(&rule, b"all")];
                if leased[who].check(&batch).await.unwrap().is_admitted() {
                    admitted.push(clock.now_micros());
                }
            }
            let pause = if step % 7 == 0 {
                20_000
            } else {
                (seed >> 20) % 3_000
            };
            clock.advance(Duration::from_micros(pause));
            tokio::time::advance(Duration::from_micros(pause)).await;
        }
        let replay = |rule: Rule| {
            let admitted = admitted.clone();
            async move {
                let clock = ManualClock::new(T0);
                let reference = Limiter::new(MemoryStore::with_clock(clock.clone()));
                let mut refused = 0;
                for at in admitted {
                    clock.set_micros(at);
                    let batch = [Check::new(&rule, b"all")];
                    refused += usize::from(!reference.check(&batch).await.unwrap().is_admitted());
                }
                refused
            }
        };
        assert_eq!(replay(rule.clone()).await, 0, "{}", rule.name());
    }
}

/// A batch with a leased rule beside rules of its own (a global limit and a per-user one,
/// as a route with two limits asks): the leased rule is decided from the lease, the others
/// by the store, and a request the per-user rule refuses uses none of the lease.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_batch_decides_its_leased_rule_from_the_lease() {
    let clock = ManualClock::new(T0);
    let global = Rule::gcra("global", 1_000, Rate::per_minute(1));
    let user = Rule::fixed_window("user", 3, Duration::from_secs(60));
    let store = MemoryStore::with_clock(clock.clone());
    let limiter = Limiter::new(
        Leased::new(store.clone())
            .lease(&global, 100, Duration::from_secs(10))
            .unwrap(),
    );
    let request = |who: &'static [u8]| [Check::new(&global, b"all"), Check::new(&user, who)];
    let mut admitted = Vec::new();
    for _ in 0..5 {
        admitted.push(limiter.check(&request(b"u1")).await.unwrap().is_admitted());
    }
    assert_eq!(admitted, [true, true, true, false, false]);
    // The store counted one lease of the global rule and u1's three.
    let plain = Limiter::new(store);
    assert_eq!(
        plain.peek(&global, b"all", 1).await.unwrap().info.remaining,
        899
    );
    assert_eq!(plain.peek(&user, b"u1", 1).await.unwrap().info.remaining, 0);
    // u1's two refusals gave their units back to the lease: 96 left after u2's request.
    let next = limiter.check(&request(b"u2")).await.unwrap();
    assert!(next.is_admitted());
    assert_eq!(next.rules[0].info.remaining, 900 + 96, "{next:?}");
    assert_eq!(next.rules[1].info.remaining, 2, "{next:?}");
}

/// Three instances deciding batches of a leased global rule and a per-user rule never
/// admit more than the global rule's burst plus its refill, nor more than a user's limit,
/// and no fewer than that less the units parked in leases.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn batches_with_a_leased_rule_never_admit_more_than_its_limit() {
    let clock = ManualClock::new(T0);
    let global = Rule::gcra("global", 100, Rate::per_second(1_000));
    let user = Rule::fixed_window("user", 1_000, Duration::from_secs(60));
    let store = MemoryStore::with_clock(clock.clone());
    let leased = instances(&store, &global, 10, 3);
    let users: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
    let mut by_user = [0u64; 4];
    for step in 0..3_000usize {
        for (n, limiter) in leased.iter().enumerate() {
            let who = (step + n) % users.len();
            let batch = [Check::new(&global, b"all"), Check::new(&user, users[who])];
            if limiter.check(&batch).await.unwrap().is_admitted() {
                by_user[who] += 1;
            }
        }
        clock.advance(Duration::from_micros(500));
        tokio::time::advance(Duration::from_micros(500)).await;
    }
    // 1.5 s: 100 + 1,500 at most for the global rule, each user 1,000 in the minute.
    let all: u64 = by_user.iter().sum();
    assert!(all <= 100 + 1_500 && all + 3 * 10 >= 100 + 1_500, "{all}");
    assert!(by_user.iter().all(|&n| n <= 1_000), "{by_user:?}");
}

/// Through the layer: a route with a global limit that leases and a per-user limit answers
/// each user's fourth request with 429, and the global limit is decided from the lease (the
/// store counts one lease, not each request).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_route_with_a_leased_limit_and_a_per_user_one() {
    use crate::support::service::{call, with};
    use tollgate::key;
    use tollgate::layer::{Limit, RateLimitLayer};

    let clock = ManualClock::new(T0);
    let global = Rule::gcra("global", 1_000, Rate::per_minute(1));
    let user = Rule::fixed_window("user", 3, Duration::from_secs(60));
    let store = MemoryStore::with_clock(clock.clone());
    let leased = Leased::new(store.clone())
        .lease(&global, 50, Duration::from_secs(10))
        .unwrap();
    let layer = RateLimitLayer::builder()
        .limiter(Limiter::new(leased))
        .limit(Limit::new(global.clone(), key::global()))
        .limit(Limit::new(user.clone(), key::header("user-id")))
        .build()
        .unwrap();
    let svc = with(layer);
    let request = |who: &str| {
        http::Request::builder()
            .uri("/api")
            .header("user-id", who)
            .body(String::new())
            .unwrap()
    };
    for who in ["ann", "bob"] {
        let statuses: Vec<u16> = {
            let mut seen = Vec::new();
            for _ in 0..4 {
                seen.push(call(&svc, request(who)).await.status().as_u16());
            }
            seen
        };
        assert_eq!(statuses, [200, 200, 200, 429], "{who}");
    }
    let plain = Limiter::new(store);
    let global_left = plain
        .peek(&global, b"global", 1)
        .await
        .unwrap()
        .info
        .remaining;
    assert_eq!(global_left, 1_000 - 50 - 1, "one lease of 50 counted");
}

/// A store whose refunds take 100 ms: a lease's end, which gives its unused units back,
/// holds its key's slot that long.
#[derive(Clone)]
pub(super) struct SlowRefunds(pub(super) MemoryStore);

impl tollgate::store::Store for SlowRefunds {
    async fn check(
        &self,
        batch: &[Check<'_>],
        wait: Duration,
    ) -> Result<tollgate::Outcome, tollgate::StoreError> {
        self.0.check(batch, wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&tollgate::Outcome, u64)>,
    ) -> Result<tollgate::Outcome, tollgate::StoreError> {
        self.0.lease(check, term, ending).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<tollgate::RuleOutcome, tollgate::StoreError> {
        self.0.peek(check).await
    }
    async fn refund(
        &self,
        batch: &[Check<'_>],
        outcome: &tollgate::Outcome,
    ) -> Result<(), tollgate::StoreError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.0.refund(batch, outcome).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), tollgate::StoreError> {
        self.0.overdraw(batch).await
    }
    async fn count_denials(
        &self,
        batch: &[Check<'_>],
        ago: Duration,
    ) -> Result<(), tollgate::StoreError> {
        self.0.count_denials(batch, ago).await
    }
    async fn reset(
        &self,
        rule: &Rule,
        key: &tollgate::StoredKey<'_>,
    ) -> Result<(), tollgate::StoreError> {
        self.0.reset(rule, key).await
    }
    fn health(&self) -> tollgate::store::Health {
        tollgate::store::Health::Healthy
    }
}

/// A request that waits for a lease's term to end (its unused units on their way back)
/// takes the key's next lease where the next requests find it: one instance parks one
/// lease of a key at a time, never two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ending_under_a_waiting_request_is_not_doubled() {
    let clock = ManualClock::new(T0);
    let rule = Rule::token_bucket("hot", 100, Rate::per_minute(1));
    let store = MemoryStore::with_clock(clock.clone());
    let leased = Leased::new(SlowRefunds(store.clone()))
        .lease(&rule, 4, Duration::from_millis(50))
        .expect("a token bucket leases");
    let limiter = Limiter::new(leased);
    let batch = [Check::new(&rule, b"all")];
    assert!(limiter.check(&batch).await.unwrap().is_admitted());
    // The term ends at 50 ms; its 3 unused units are on their way back until 150 ms.
    tokio::time::sleep(Duration::from_millis(70)).await;
    assert!(limiter.check(&batch).await.unwrap().is_admitted());
    assert!(limiter.check(&batch).await.unwrap().is_admitted());
    let plain = Limiter::new(store);
    let remaining = plain.peek(&rule, b"all", 0).await.unwrap().info.remaining;
    assert_eq!(
        remaining,
        100 - 1 - 4,
        "the first lease's one used unit and one lease of 4 parked"
    );
}

/// A bounded store full of other keys never forgets a key with a live lease: forgetting it
/// would free the units parked there while their holder may still use them.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_store_keeps_a_key_with_a_live_lease() {
    let clock = ManualClock::new(T0);
    let rule = Rule::gcra("hot", 10, Rate::per_second(1));
    let store = MemoryStore::with_clock(clock.clone()).max_keys(64);
    let leased = Limiter::new(
        Leased::new(store.clone())
            .lease(&rule, 4, Duration::from_secs(60))
            .unwrap(),
    );
    assert!(leased.check_one(&rule, b"k").await.unwrap().is_admitted());
    let plain = Limiter::new(store.clone());
    // Other keys, each holding more than the leased one: worth more to keep.
    let wide = Rule::gcra("wide", 100, Rate::per_second(1));
    for i in 0..2_000 {
        let key = format!("flood-{i}");
        let batch = [Check::new(&wide, key.as_bytes()).with_cost(50)];
        plain.check(&batch).await.unwrap();
    }
    assert!(
        store.stats().evictions > 0,
        "the flood made the store forget keys"
    );
    // What a request of 1 would leave: 10 less the 4 parked, less 1.
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 5);
}

/// Leasing through a `Fallback` whose primary is down: the local store parks the lease and
/// takes its unused units back when the lease ends.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lease_from_a_fallbacks_local_store_ends_there() {
    let clock = ManualClock::new(T0);
    let rule = Rule::token_bucket("hot", 100, Rate::per_minute(1));
    let local = MemoryStore::with_clock(clock.clone());
    let fallback = tollgate::store::Fallback::with_local(crate::support::down::Down, local.clone());
    let leased = Limiter::new(
        Leased::new(fallback)
            .lease(&rule, 10, Duration::from_secs(1))
            .unwrap(),
    );
    for _ in 0..3 {
        assert!(leased.check_one(&rule, b"k").await.unwrap().is_admitted());
    }
    let plain = Limiter::new(local);
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 89);
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 96);
}

/// A dead instance's lease that outlives its state's own refill keeps its key past its
/// expiry: the units it held down count as used, refilling from then, and forgetting the
/// key at the expiry would bring the bucket back full.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_expired_lease_keeps_its_key_until_the_bucket_refilled() {
    let clock = ManualClock::new(T0);
    let rule = Rule::gcra("hot", 10, Rate::new(1, Duration::from_millis(100)));
    let store = MemoryStore::with_clock(clock.clone());
    let dead = Limiter::new(
        Leased::new(store.clone())
            .lease(&rule, 4, Duration::from_secs(1))
            .unwrap(),
    );
    assert!(dead.check_one(&rule, b"k").await.unwrap().is_admitted());
    drop(dead);
    clock.advance(Duration::from_millis(1_050));
    store.purge_expired();
    let plain = Limiter::new(store);
    // The bucket stood at 6 when the lease expired; 50 ms later it holds 6.5.
    assert_eq!(plain.peek(&rule, b"k", 1).await.unwrap().info.remaining, 5);
}
