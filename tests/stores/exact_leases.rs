//! Exact leases (issue #47): three `Leased` instances over one store never admit more than
//! the rule's promise, a token bucket of its burst refilled at its rate, checked by the
//! instants requests pass at against a reference written apart from the models
//! (`reference`). The store parks a lease's units: the bucket refills only up to the burst
//! less the units of live leases, so units used late never make a bigger burst. A dead
//! instance's units stop capping the bucket when its lease expires; a reset forgives what
//! came before it, never more; a reloaded rule is kept from the store's first write of it,
//! with the old rule's parked units counted. Each schedule runs on a `MemoryStore` and on a
//! Redis server.

mod drive;
mod reference;
mod schedule;

use std::ops::Range;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::store::{Leased, MemoryStore, RedisStore, Store};
use tollgate::{Limiter, Rule};

use crate::support::redis_server::RedisServer;
use crate::support::still::{still, Still};
use crate::support::switch::Switch;
use drive::{Algo, Config, Fleet, TokioClock};
use schedule::{play, verify, Event, Extras, Plan};

/// Where the instances' store lives.
enum Backend {
    Memory,
    Redis(String),
}

/// A Redis store on `url` whose clock reads tokio's from `origin`, held still while it
/// waits for Redis (see `Still`); no call times out for want of tokio's time moving on.
async fn redis_store(url: &str, origin: Instant) -> Still<RedisStore> {
    let store = still(RedisStore::connect(url)).await.expect("connect");
    let store = store.with_clock(TokioClock(origin));
    Still(store.with_timeout(Duration::from_secs(3_600)))
}

/// Plays `plan` on three instances over `store`, whose clock reads `origin`: whether the
/// passes keep their promises, and the leases each instance took.
async fn run<S: Store + Clone>(
    plan: &Plan,
    store: S,
    origin: Instant,
) -> (Result<(), String>, Vec<u64>) {
    let mut fleet = Fleet::new(&store, origin, &plan.config, 3);
    let key = format!("hot-{}", plan.seed);
    let segments = play(&mut fleet, plan, key.as_bytes()).await;
    // Every lease ends (or expires) before the next schedule starts.
    fleet.advance_to(fleet.now() + 2 * plan.config.term).await;
    (verify(&fleet, plan, &segments), fleet.leases())
}

/// Plays `plan` on a fresh store of `backend`.
async fn run_on(backend: &Backend, plan: &Plan) -> (Result<(), String>, Vec<u64>) {
    let origin = Instant::now();
    match backend {
        Backend::Memory => run(plan, MemoryStore::with_clock(TokioClock(origin)), origin).await,
        Backend::Redis(url) => run(plan, redis_store(url, origin).await, origin).await,
    }
}

/// The schedules of `seeds` over `terms` lease terms each keep their promises on
/// `backend`; the instances take leases (a schedule that never leases proves nothing), at
/// least `renewals` each.
async fn schedules_keep_the_promise(
    backend: &Backend,
    seeds: Range<u64>,
    terms: u64,
    extras: Extras,
    renewals: u64,
) {
    let (mut failures, mut idle) = (Vec::new(), Vec::new());
    for seed in seeds.clone() {
        let plan = Plan::new(seed, terms, extras);
        let (kept, leases) = run_on(backend, &plan).await;
        let dead = plan.events.iter().find_map(|&(_, e)| match e {
            Event::Death { instance } => Some(instance),
            _ => None,
        });
        for (i, &n) in leases.iter().enumerate() {
            let least = if Some(i) == dead { 1 } else { renewals };
            if n < least {
                idle.push(format!("seed {seed}: instance {i} took {n} leases"));
            }
        }
        if let Err(e) = kept {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} schedules exceed the promise:\n{}",
        failures.len(),
        seeds.count(),
        failures.join("\n")
    );
    assert!(idle.is_empty(), "too few leases: {idle:?}");
}

const SEEDS: Range<u64> = 0..24;
const REDIS_SEEDS: Range<u64> = 0..6;

#[tokio::test(start_paused = true)]
async fn three_instances_keep_the_promise() {
    schedules_keep_the_promise(&Backend::Memory, SEEDS, 12, Extras::default(), 1).await;
}

/// A dead instance's lease never reaches the store again: its units are used as far as
/// the store knows, and the promise holds.
#[tokio::test(start_paused = true)]
async fn three_instances_keep_the_promise_when_one_dies() {
    let extras = Extras {
        death: true,
        ..Extras::default()
    };
    schedules_keep_the_promise(&Backend::Memory, SEEDS, 12, extras, 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_reset_forgives_what_came_before_it_and_no_more() {
    let extras = Extras {
        reset: true,
        ..Extras::default()
    };
    schedules_keep_the_promise(&Backend::Memory, SEEDS, 12, extras, 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_reloaded_rule_is_kept_with_the_old_leases_counted() {
    let extras = Extras {
        reload: true,
        ..Extras::default()
    };
    schedules_keep_the_promise(&Backend::Memory, SEEDS, 12, extras, 1).await;
}

/// Long schedules: each instance renews its lease many times over.
#[tokio::test(start_paused = true)]
async fn renewals_keep_the_promise() {
    schedules_keep_the_promise(&Backend::Memory, 100..104, 150, Extras::default(), 20).await;
}

/// The same schedules on Redis, each extra in turn.
#[tokio::test(start_paused = true)]
async fn three_instances_keep_the_promise_on_redis() {
    let server = RedisServer::start();
    let backend = Backend::Redis(server.url());
    let extras = |death, reset, reload| Extras {
        death,
        reset,
        reload,
    };
    for extras in [
        extras(false, false, false),
        extras(true, false, false),
        extras(false, true, false),
        extras(false, false, true),
    ] {
        schedules_keep_the_promise(&backend, REDIS_SEEDS, 12, extras, 1).await;
    }
}

/// The case the issue names: an instance takes a lease, idles while the bucket refills,
/// and spends it right before its term ends while the others drain the bucket. Counted
/// when taken, its units would come on top of a full bucket.
fn spent_at_the_end_of_its_term(algo: Algo) -> Plan {
    let config = Config {
        algo,
        burst: 10,
        amount: 10,
        period: 1_000_000,
        units: 4,
        term: 1_000_000,
    };
    let request = |instance| Event::Request { instance, cost: 1 };
    // Instance 0 takes a lease of 4 and uses 1, then the 3 left just before its term ends.
    let mut events = vec![(0, request(0))];
    events.extend((0..3).map(|_| (999_999, request(0))));
    events.extend((0..12).flat_map(|_| [(999_999, request(1)), (999_999, request(2))]));
    Plan {
        seed: 0,
        config,
        reloaded: config,
        events,
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_spent_as_its_term_ends_stays_within_the_burst() {
    for algo in [Algo::Gcra, Algo::Bucket] {
        let (kept, _) = run_on(&Backend::Memory, &spent_at_the_end_of_its_term(algo)).await;
        kept.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_spent_as_its_term_ends_stays_within_the_burst_on_redis() {
    let server = RedisServer::start();
    let backend = Backend::Redis(server.url());
    for algo in [Algo::Gcra, Algo::Bucket] {
        let (kept, _) = run_on(&backend, &spent_at_the_end_of_its_term(algo)).await;
        kept.unwrap();
    }
}

/// The same, with a reset by another instance while the lease is live: after it, the
/// lease's units and the fresh bucket together are one burst.
#[tokio::test(start_paused = true)]
async fn a_reset_while_a_lease_is_live_forgives_no_more_than_the_burst() {
    for algo in [Algo::Gcra, Algo::Bucket] {
        let mut plan = spent_at_the_end_of_its_term(algo);
        plan.events.insert(1, (500_000, Event::Reset { by: 1 }));
        let (kept, _) = run_on(&Backend::Memory, &plan).await;
        kept.unwrap();
    }
}

/// A dead instance holds 4 of a burst of 10 and the others drain the bucket: until its
/// lease expires the bucket refills only to 6; from its expiry it refills on to 10.
#[tokio::test(start_paused = true)]
async fn a_dead_instances_units_cap_the_bucket_until_its_lease_expires() {
    let secs = Duration::from_secs_f64;
    for algo in [Algo::Gcra, Algo::Bucket] {
        let origin = Instant::now();
        let rule = Config {
            algo,
            burst: 10,
            amount: 10,
            period: 1_000_000,
            units: 4,
            term: 1_000_000,
        }
        .rule();
        let store = MemoryStore::with_clock(TokioClock(origin));
        let line = Switch::new(store.clone());
        let dying = Leased::new(line.clone()).lease(&rule, 4, secs(1.0));
        let dying = Limiter::new(dying.unwrap());
        assert!(dying.check_one(&rule, b"k").await.unwrap().is_admitted());
        line.set_down(true);
        drain(&store, &rule).await;
        let left = |at: f64| remaining_at(&store, &rule, origin + secs(at));
        // Refilled to the burst less the dead lease's units, and no further.
        assert_eq!(left(0.8).await, 6, "{algo:?}");
        assert_eq!(left(0.999_999).await, 6, "{algo:?}");
        // Its lease expired at 1 s: the refill goes on from 6 at the rule's rate.
        assert_eq!(left(1.2).await, 8, "{algo:?}");
        assert_eq!(left(1.4).await, 10, "{algo:?}");
        assert_eq!(left(5.0).await, 10, "{algo:?}");
    }
}

/// Two live instances, leasing 2 units for 100 ms, take everything the store admits.
async fn drain(store: &MemoryStore, rule: &Rule) {
    for _ in 0..2 {
        let leased = Leased::new(store.clone()).lease(rule, 2, Duration::from_millis(100));
        let limiter = Limiter::new(leased.unwrap());
        while limiter.check_one(rule, b"k").await.unwrap().is_admitted() {}
    }
}

/// The units the store holds for `rule`'s key at `at` (a peek of 1 leaves one fewer).
async fn remaining_at(store: &MemoryStore, rule: &Rule, at: Instant) -> u64 {
    tokio::time::advance(at - Instant::now()).await;
    let peek = Limiter::new(store.clone())
        .peek(rule, b"k", 1)
        .await
        .unwrap();
    assert!(peek.decision.is_admitted(), "{peek:?}");
    peek.info.remaining + 1
}
