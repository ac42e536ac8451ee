//! Leases parked on Redis (`Store::lease`, `lua/parked.lua`): a bucket under a live lease
//! refills only to its burst less the lease, an ended lease gives its unused units back,
//! an expired one stops holding the bucket down, a reset keeps the parked units, a key no
//! lease touched keeps its record as it was; and random schedules of leases, ends, checks,
//! peeks, resets and reconfigurations answer as `MemoryStore` answers them, through a
//! function library and through scripts, on a server and on a Cluster.

use std::time::Duration;

use crate::support::redis_server::{prefixed, RedisCluster, RedisServer};
use crate::support::vectors::BASE_MICROS;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::{
    store::{MemoryStore, RedisOptions, RedisStore, Store},
    Check, ManualClock, Outcome, Rate, Refusal, Rule, StoredKey,
};

const MS: Duration = Duration::from_millis(1);

/// The rules that lease: a GCRA and token buckets of both refills, burst 10, one unit per
/// 100 ms.
fn leasing() -> [Rule; 3] {
    let rate = Rate::new(1, MS * 100);
    [
        Rule::gcra("g", 10, rate),
        Rule::token_bucket("t", 10, rate),
        Rule::token_bucket_stepped("s", 10, rate),
    ]
}

async fn store(url: &str, prefix: &str, clock: &ManualClock) -> RedisStore {
    prefixed(url, prefix).await.with_clock(clock.clone())
}

/// What a request of 1 would leave.
async fn remaining(store: &impl Store, rule: &Rule, key: &[u8]) -> u64 {
    store
        .peek(Check::new(rule, key).with_cost(0))
        .await
        .unwrap()
        .info
        .remaining
}

async fn lease(store: &impl Store, rule: &Rule, units: u64, term: Duration) -> Outcome {
    let outcome = store
        .lease(Check::new(rule, b"k").with_cost(units), term, None)
        .await
        .unwrap();
    assert!(outcome.is_admitted(), "{outcome:?}");
    outcome
}

async fn take(store: &impl Store, rule: &Rule, cost: u64) {
    let batch = [Check::new(rule, b"k").with_cost(cost)];
    assert!(store
        .check(&batch, Duration::ZERO)
        .await
        .unwrap()
        .is_admitted());
}

/// 4 leased and the other 6 used at once: while the lease lives the bucket refills to 6,
/// not 10; once it expires it refills on from there.
#[tokio::test]
async fn a_live_lease_holds_the_refill_down_until_it_expires() {
    let server = RedisServer::start();
    for rule in leasing() {
        let clock = ManualClock::new(BASE_MICROS);
        let store = store(&server.url(), rule.name(), &clock).await;
        lease(&store, &rule, 4, MS * 1_000).await;
        take(&store, &rule, 6).await;
        assert_eq!(remaining(&store, &rule, b"k").await, 0, "{rule:?}");
        clock.advance(MS * 900);
        assert_eq!(remaining(&store, &rule, b"k").await, 6, "{rule:?}");
        clock.advance(MS * 300);
        assert_eq!(remaining(&store, &rule, b"k").await, 8, "{rule:?}");
        clock.advance(MS * 200);
        assert_eq!(remaining(&store, &rule, b"k").await, 10, "{rule:?}");
    }
}

/// Ending a lease gives its unused units back at once, even under the cap, and only once;
/// a cost of 0 just ends it; an expired lease's end gives nothing.
#[tokio::test]
async fn an_ended_lease_gives_its_unused_units_back() {
    let server = RedisServer::start();
    for rule in leasing() {
        let clock = ManualClock::new(BASE_MICROS);
        let store = store(&server.url(), rule.name(), &clock).await;
        let first = lease(&store, &rule, 4, MS * 1_000).await;
        take(&store, &rule, 6).await;
        clock.advance(MS * 900);
        let unused = [Check::new(&rule, b"k").with_cost(3)];
        store.refund(&unused, &first).await.unwrap();
        assert_eq!(remaining(&store, &rule, b"k").await, 9, "{rule:?}");
        store.refund(&unused, &first).await.unwrap();
        assert_eq!(
            remaining(&store, &rule, b"k").await,
            9,
            "ended once: {rule:?}"
        );
        // A lease of 0 unused ends without giving back: the bucket refills on from 9.
        let second = lease(&store, &rule, 5, MS * 1_000).await;
        assert_eq!(remaining(&store, &rule, b"k").await, 4, "{rule:?}");
        store
            .refund(&[Check::new(&rule, b"k").with_cost(0)], &second)
            .await
            .unwrap();
        clock.advance(MS * 600);
        assert_eq!(remaining(&store, &rule, b"k").await, 10, "{rule:?}");
        // Past its term a lease's end finds nothing: its units count as used.
        let third = lease(&store, &rule, 5, MS * 100).await;
        clock.advance(MS * 100);
        store
            .refund(&[Check::new(&rule, b"k").with_cost(5)], &third)
            .await
            .unwrap();
        assert_eq!(remaining(&store, &rule, b"k").await, 5, "{rule:?}");
    }
}

/// A reset forgets the state and keeps the live leases: the fresh bucket holds the burst
/// less the units parked.
#[tokio::test]
async fn a_reset_keeps_the_parked_units() {
    let server = RedisServer::start();
    for rule in leasing() {
        let clock = ManualClock::new(BASE_MICROS);
        let store = store(&server.url(), rule.name(), &clock).await;
        lease(&store, &rule, 3, MS * 1_000).await;
        take(&store, &rule, 7).await;
        store.reset(&rule, &StoredKey::of(b"k")).await.unwrap();
        assert_eq!(remaining(&store, &rule, b"k").await, 7, "{rule:?}");
        // Once it ends its units count as used: the bucket refills from there.
        clock.advance(MS * 1_000);
        assert_eq!(remaining(&store, &rule, b"k").await, 7, "{rule:?}");
        clock.advance(MS * 300);
        assert_eq!(remaining(&store, &rule, b"k").await, 10, "{rule:?}");
        // Without a lease a reset leaves no key behind.
        let plain = [Check::new(&rule, b"plain")];
        store.check(&plain, Duration::ZERO).await.unwrap();
        store.reset(&rule, &StoredKey::of(b"plain")).await.unwrap();
        let key = format!("{}:{{plain}}:{}", rule.name(), rule.name());
        let exists = server.cli(&["EXISTS", &key]).unwrap();
        assert_eq!(exists.trim(), "0", "{rule:?}");
    }
}

/// A key under a lease keeps its ledger after its record, and lives at least until the
/// lease ends; once no lease is left its record is byte for byte that of a key no lease
/// touched.
#[tokio::test]
async fn records_without_a_ledger_are_unchanged() {
    let server = RedisServer::start();
    let [gcra, ..] = leasing();
    let clock = ManualClock::new(BASE_MICROS);
    let store = store(&server.url(), "r", &clock).await;
    let key = |k: &str| format!("r:{{{k}}}:g");
    let cli = |args: &[&str]| server.cli(args).unwrap().trim().to_owned();
    let leased = lease(&store, &gcra, 2, Duration::from_secs(600)).await;
    assert_eq!(cli(&["STRLEN", &key("k")]), (64 + 3 * 8 + 8).to_string());
    let ttl: u64 = cli(&["PTTL", &key("k")]).parse().unwrap();
    assert!(ttl >= 600_000, "{ttl}");
    take(&store, &gcra, 2).await;
    // One of the lease's units used: 3 taken in all, as by one check of 3 on a twin.
    store
        .refund(&[Check::new(&gcra, b"k").with_cost(1)], &leased)
        .await
        .unwrap();
    let twin = [Check::new(&gcra, b"twin").with_cost(3)];
    store.check(&twin, Duration::ZERO).await.unwrap();
    assert_eq!(cli(&["STRLEN", &key("k")]), "64");
    assert_eq!(cli(&["GET", &key("k")]), cli(&["GET", &key("twin")]));
}

/// Leases on a Cluster (a lease is one key: one slot) and through scripts rather than a
/// function library park and end as on one server.
#[tokio::test]
async fn leases_park_on_a_cluster_and_through_scripts() {
    let cluster = RedisCluster::start();
    let server = RedisServer::start();
    let scripts = RedisOptions::new().prefix("s").functions(false);
    let [gcra, ..] = leasing();
    let clock = ManualClock::new(BASE_MICROS);
    let on_cluster = RedisStore::connect(&cluster.url()).await.unwrap();
    let by_script = RedisStore::connect_with(&server.url(), scripts)
        .await
        .unwrap();
    for store in [on_cluster, by_script] {
        let store = store.with_clock(clock.clone());
        let leased = lease(&store, &gcra, 4, MS * 1_000).await;
        take(&store, &gcra, 6).await;
        clock.advance(MS * 900);
        assert_eq!(remaining(&store, &gcra, b"k").await, 6);
        let unused = [Check::new(&gcra, b"k").with_cost(4)];
        store.refund(&unused, &leased).await.unwrap();
        assert_eq!(remaining(&store, &gcra, b"k").await, 10);
        store.reset(&gcra, &StoredKey::of(b"k")).await.unwrap();
    }
}

/// A rule that cannot lease, or a shadow check, is refused as `MemoryStore` refuses it.
#[tokio::test]
async fn only_an_enforced_token_bucket_or_gcra_leases() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let redis = store(&server.url(), "n", &clock).await;
    let memory = MemoryStore::with_clock(clock.clone());
    let window = Rule::fixed_window("w", 10, MS * 100);
    let [gcra, ..] = leasing();
    for check in [Check::new(&window, b"k").with_cost(2), {
        let mut shadow = Check::new(&gcra, b"k").with_cost(2);
        shadow.refusal = Refusal::Shadow;
        shadow
    }] {
        let r = redis.lease(check, MS * 100, None).await.unwrap_err();
        let m = memory.lease(check, MS * 100, None).await.unwrap_err();
        assert_eq!(r.to_string(), m.to_string());
    }
}

/// The leasing rules of the differential schedules, and other configurations of their
/// names (a rolling deploy's two versions).
fn rules() -> Vec<Rule> {
    vec![
        Rule::gcra("gc", 6, Rate::new(3, MS * 100)),
        Rule::token_bucket("tb", 7, Rate::new(3, MS * 100)),
        Rule::token_bucket_stepped("ts", 5, Rate::new(2, MS * 90)),
        Rule::gcra("gc", 4, Rate::new(2, MS * 100)),
        Rule::token_bucket("tb", 5, Rate::new(1, MS * 50)),
        Rule::token_bucket_stepped("ts", 3, Rate::new(1, MS * 40)),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Lease {
        rule: usize,
        units: u64,
        term_ms: u64,
    },
    /// Ends the `which`-th lease still held (modulo their count), `unused` of its units.
    End {
        which: usize,
        unused: u64,
    },
    Check {
        rule: usize,
        cost: u64,
        wait_ms: u64,
    },
    Peek {
        rule: usize,
        cost: u64,
    },
    Overdraw {
        rule: usize,
        cost: u64,
    },
    Reset {
        rule: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let rule = 0..rules().len();
    prop_oneof![
        3 => (rule.clone(), 1u64..5, prop_oneof![Just(40u64), Just(250), Just(2_000)])
            .prop_map(|(rule, units, term_ms)| Op::Lease { rule, units, term_ms }),
        2 => (0usize..8, 0u64..6).prop_map(|(which, unused)| Op::End { which, unused }),
        4 => (rule.clone(), 0u64..4, prop_oneof![3 => Just(0u64), 1 => 0u64..300])
            .prop_map(|(rule, cost, wait_ms)| Op::Check { rule, cost, wait_ms }),
        2 => (rule.clone(), 0u64..4).prop_map(|(rule, cost)| Op::Peek { rule, cost }),
        1 => (rule.clone(), 1u64..4).prop_map(|(rule, cost)| Op::Overdraw { rule, cost }),
        1 => rule.prop_map(|rule| Op::Reset { rule }),
    ]
}

/// A schedule's steps: µs to advance, then what to do.
fn schedule() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let advance = prop_oneof![Just(0u64), 0u64..5_000, 0u64..120_000, 0u64..700_000];
    proptest::collection::vec((advance, op()), 1..40)
}

/// What two stores said alike: a lease's id is the store's own (a counter in process, a
/// random one on Redis), so outcomes are compared without their admissions.
fn said(outcome: &Outcome) -> (tollgate::Decision, Vec<tollgate::RuleOutcome>) {
    (outcome.decision, outcome.rules.iter().copied().collect())
}

/// Runs `steps` on both stores at once, comparing each answer.
async fn run_alike(
    memory: &MemoryStore,
    redis: &RedisStore,
    clock: &ManualClock,
    steps: &[(u64, Op)],
) -> Result<(), TestCaseError> {
    let rules = rules();
    // The leases and admissions held: their rule and both stores' outcomes.
    let mut held: Vec<(usize, Outcome, Outcome)> = Vec::new();
    for (i, (advance, op)) in steps.iter().enumerate() {
        clock.advance(Duration::from_micros(*advance));
        let check = |rule: usize, cost: u64| Check::new(&rules[rule], b"k").with_cost(cost);
        match *op {
            Op::Lease {
                rule,
                units,
                term_ms,
            } => {
                let term = MS * term_ms as u32;
                let m = memory.lease(check(rule, units), term, None).await.unwrap();
                let r = redis.lease(check(rule, units), term, None).await.unwrap();
                prop_assert_eq!(said(&m), said(&r), "step {}: {:?}", i, op);
                if m.is_admitted() {
                    held.push((rule, m, r));
                }
            }
            Op::End { which, unused } => {
                if held.is_empty() {
                    continue;
                }
                let (rule, m, r) = held.remove(which % held.len());
                let batch = [check(rule, unused)];
                memory.refund(&batch, &m).await.unwrap();
                redis.refund(&batch, &r).await.unwrap();
            }
            Op::Check {
                rule,
                cost,
                wait_ms,
            } => {
                let batch = [check(rule, cost)];
                let wait = MS * wait_ms as u32;
                let m = memory.check(&batch, wait).await.unwrap();
                let r = redis.check(&batch, wait).await.unwrap();
                prop_assert_eq!(&m, &r, "step {}: {:?}", i, op);
                if m.is_admitted() {
                    held.push((rule, m, r));
                }
            }
            Op::Peek { rule, cost } => {
                let m = memory.peek(check(rule, cost)).await.unwrap();
                let r = redis.peek(check(rule, cost)).await.unwrap();
                prop_assert_eq!(m, r, "step {}: {:?}", i, op);
            }
            Op::Overdraw { rule, cost } => {
                memory.overdraw(&[check(rule, cost)]).await.unwrap();
                redis.overdraw(&[check(rule, cost)]).await.unwrap();
            }
            Op::Reset { rule } => {
                memory
                    .reset(&rules[rule], &StoredKey::of(b"k"))
                    .await
                    .unwrap();
                redis
                    .reset(&rules[rule], &StoredKey::of(b"k"))
                    .await
                    .unwrap();
            }
        }
    }
    // What every configuration reads at the end, at once and once every lease ended.
    for later in [0, 3_000] {
        clock.advance(MS * later);
        for (j, rule) in rules.iter().enumerate() {
            let m = memory.peek(Check::new(rule, b"k")).await.unwrap();
            let r = redis.peek(Check::new(rule, b"k")).await.unwrap();
            prop_assert_eq!(m, r, "rule {} {} ms after the last step", j, later);
        }
    }
    Ok(())
}

/// `MemoryStore` and `RedisStore` answer every schedule of leases alike.
#[test]
fn leases_answer_as_in_process() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&schedule(), |steps| {
            case.set(case.get() + 1);
            let clock = ManualClock::new(BASE_MICROS + 123_457);
            let memory = MemoryStore::with_clock(clock.clone());
            rt.block_on(async {
                let redis = store(&url, &format!("case{}", case.get()), &clock).await;
                run_alike(&memory, &redis, &clock, &steps).await
            })
        })
        .unwrap();
}
