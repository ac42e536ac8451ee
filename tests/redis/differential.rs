//! Differential property test: random schedules give identical outcomes (decisions,
//! retry-afters, delays, remaining, reset) from `MemoryStore` and `RedisStore` on the same
//! injected clock, including penalties, cost 0, costs over capacity, wait mode and batches
//! mixing a client's key with a shared one (each rule's counted instant in the admission),
//! costs settled after the admission (given back or overdrawn, `Reservation::settle`),
//! rules reconfigured under the same name (another configuration reading the state one
//! wrote), and the in-process store past its bound (floods of new keys between the steps,
//! each key after them decided on its own state).

use std::time::Duration;

use crate::support::redis_server::{prefixed, RedisCluster, RedisServer};
use crate::support::vectors::BASE_MICROS;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Check, Limiter, ManualClock, Penalty, Rate, Reservation, Rule,
};

fn rules() -> Vec<Rule> {
    let ms = Duration::from_millis;
    let lock = Penalty::lock_for(ms(700)).after(2).within(ms(500));
    vec![
        Rule::fixed_window("fw", 3, ms(100)),
        Rule::fixed_window_from_first_hit("ff", 4, ms(150)).with_penalty(lock),
        Rule::sliding_log("sl", 4, ms(200)),
        Rule::sliding_window("sw", 5, ms(120)),
        Rule::token_bucket("tb", 5, Rate::new(3, ms(100))),
        Rule::token_bucket_stepped("ts", 4, Rate::new(2, ms(90)))
            .with_penalty(Penalty::lock_for(ms(300))),
        Rule::leaky_bucket("lb", 4, Rate::new(3, ms(100))),
        Rule::gcra("gc", 3, Rate::new(3, ms(100))),
        // Other configurations of the names above: a rolling deploy's two versions.
        Rule::fixed_window("fw", 5, ms(150)),
        Rule::sliding_log("sl", 2, ms(300)),
        Rule::token_bucket("tb", 3, Rate::new(1, ms(50))).with_penalty(lock),
        Rule::leaky_bucket("lb", 2, Rate::new(1, ms(40))),
        Rule::gcra("gc", 5, Rate::new(2, ms(100))),
        Rule::sliding_window("sw", 3, ms(90)),
    ]
}

/// The flood rule: every key it writes is back to empty a microsecond later.
fn flood() -> Rule {
    Rule::fixed_window("flood", 1, Duration::from_micros(1))
}

/// The in-process store's bound: a flood fills half of it with live keys, so every shard
/// reaches its share after two floods and makes room from then on, always finding keys
/// back to empty to forget first.
const MAX_KEYS: usize = 4096;

#[derive(Debug, Clone)]
struct Step {
    advance_us: u64,
    key: u8,
    cost: u64,
    /// Indices into `rules()`, distinct.
    rules: Vec<usize>,
    /// Bit `j` set: the batch's `j`-th rule is on the shared key, not the client's.
    shared: u8,
    max_wait_us: u64,
    peek: bool,
    /// The cost every rule of this step's batch settles at, at the next step's instant.
    settle: Option<u64>,
    /// Whether a flood of new keys reaches the in-process store before the step.
    flood: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![Just(0u64), 0u64..2_000, 0u64..150_000, 0u64..600_000],
        0u8..3,
        prop_oneof![3 => 1u64..3, 1 => Just(0u64), 1 => 3u64..7],
        proptest::sample::subsequence((0..rules().len()).collect::<Vec<usize>>(), 1..4),
        prop_oneof![3 => Just(0u64), 1 => 0u64..300_000],
        proptest::bool::weighted(0.1),
        prop_oneof![1 => Just(0u8), 1 => 0u8..8],
        prop_oneof![2 => Just(None), 1 => (0u64..9).prop_map(Some)],
        proptest::bool::weighted(0.15),
    )
        .prop_map(
            |(advance_us, key, cost, rules, max_wait_us, peek, shared, settle, flood)| Step {
                advance_us,
                key,
                cost,
                rules,
                shared,
                max_wait_us,
                peek,
                settle,
                flood,
            },
        )
}

/// The memory and Redis stores answer every sequence of checks and peeks alike.
#[test]
fn memory_and_redis_decide_alike() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let rules = rules();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&proptest::collection::vec(step(), 1..40), |steps| {
            case.set(case.get() + 1);
            let clock = ManualClock::new(BASE_MICROS + 123_457);
            let memory = Limiter::new(MemoryStore::with_clock(clock.clone()).max_keys(MAX_KEYS));
            let mut flooded = 0u32;
            let store = rt.block_on(prefixed(&url, format!("case{}", case.get())));
            let redis = Limiter::new(store.with_clock(clock.clone()));
            rt.block_on(async {
                // The reservations of the step before, in both stores, and what they settle at.
                let mut unsettled: Option<(_, _, Vec<u64>)> = None;
                for (i, s) in steps.iter().enumerate() {
                    clock.advance(std::time::Duration::from_micros(s.advance_us));
                    if s.flood {
                        flood_memory(memory.store(), &mut flooded).await;
                        clock.advance(Duration::from_micros(1));
                    }
                    if let Some((m, r, costs)) = unsettled.take() {
                        settle(m, r, &costs).await;
                    }
                    let key = [b'k', s.key];
                    // One configuration of a name per batch, as a layer's rules are.
                    let mut names = Vec::new();
                    let picked: Vec<usize> = s
                        .rules
                        .iter()
                        .copied()
                        .filter(|&r| {
                            let fresh = !names.contains(&rules[r].name());
                            names.push(rules[r].name());
                            fresh
                        })
                        .collect();
                    let batch: Vec<Check<'_>> = picked
                        .iter()
                        .enumerate()
                        .map(|(j, &r)| {
                            let key: &[u8] = if s.shared & (1 << j) != 0 {
                                b"shared"
                            } else {
                                &key
                            };
                            Check::new(&rules[r], key).with_cost(s.cost)
                        })
                        .collect();
                    if s.peek {
                        let m = memory.store_peek(batch[0]).await;
                        let r = redis.store_peek(batch[0]).await;
                        prop_assert_eq!(m, r, "peek at step {}", i);
                        continue;
                    }
                    let wait = Duration::from_micros(s.max_wait_us);
                    if let Some(cost) = s.settle {
                        let m = memory.reserve(&batch, wait).await.unwrap();
                        let r = redis.reserve(&batch, wait).await.unwrap();
                        prop_assert_eq!(
                            refunded(&batch, m.outcome().clone(), &mut Vec::new()),
                            refunded(&batch, r.outcome().clone(), &mut Vec::new()),
                            "step {}: {:?}",
                            i,
                            s
                        );
                        unsettled = Some((m, r, vec![cost; batch.len()]));
                        continue;
                    }
                    let m = memory.store().check(&batch, wait).await.unwrap();
                    let r = redis.store().check(&batch, wait).await.unwrap();
                    prop_assert_eq!(m, r, "step {}: {:?}", i, s);
                }
                prop_assert_eq!(
                    memory.store().stats().evictions,
                    0,
                    "past its bound the store forgot only keys back to empty"
                );
                if let Some((m, r, costs)) = unsettled.take() {
                    settle(m, r, &costs).await;
                    for (j, rule) in rules.iter().enumerate() {
                        for key in [&b"k\x00"[..], b"k\x01", b"k\x02", b"shared"] {
                            let m = memory.peek(rule, key, 0).await.unwrap();
                            let r = redis.peek(rule, key, 0).await.unwrap();
                            prop_assert_eq!(m, r, "rule {} after the last settlement", j);
                        }
                    }
                }
                Ok(())
            })
        })
        .unwrap();
}

/// Half the bound's worth of new keys on `memory` alone, each back to empty a microsecond
/// later: Redis holds no bound, so the stores still agree on every other key.
async fn flood_memory(memory: &MemoryStore, flooded: &mut u32) {
    let rule = flood();
    for _ in 0..MAX_KEYS / 2 {
        *flooded += 1;
        let key = flooded.to_le_bytes();
        let batch = [Check::new(&rule, &key)];
        assert!(memory
            .check(&batch, Duration::ZERO)
            .await
            .unwrap()
            .is_admitted());
    }
}

/// Settles a reservation of each store at `costs`.
async fn settle(memory: Reservation<MemoryStore>, redis: Reservation<RedisStore>, costs: &[u64]) {
    memory.settle(costs).await.unwrap();
    redis.settle(costs).await.unwrap();
}

/// `Limiter::peek` takes a rule and a key; this takes the check as built.
trait PeekCheck {
    async fn store_peek(&self, check: Check<'_>) -> tollgate::RuleOutcome;
}

impl<S: tollgate::store::Store> PeekCheck for Limiter<S> {
    async fn store_peek(&self, check: Check<'_>) -> tollgate::RuleOutcome {
        self.store().peek(check).await.unwrap()
    }
}

/// Rules for the Cluster schedules: queues of two sizes beside the rules a cross-slot
/// batch leaves pending to a queue's release, some with penalties. One configuration per
/// name: a refunded part that took over another configuration's state keeps it taken over
/// (`RedisStore`'s docs), which one node never does; the promise schedules
/// (`promises.rs`) check a Cluster under reconfiguration against what the rules promise.
fn queue_rules() -> Vec<Rule> {
    let ms = Duration::from_millis;
    let lock = Penalty::lock_for(ms(400)).after(2).within(ms(300));
    vec![
        Rule::leaky_bucket("q", 4, Rate::new(3, ms(100))),
        Rule::leaky_bucket("p", 2, Rate::new(1, ms(40))),
        Rule::fixed_window("fw", 2, ms(100)),
        Rule::fixed_window_from_first_hit("ff", 3, ms(150)).with_penalty(lock),
        Rule::sliding_log("sl", 2, ms(200)),
        Rule::sliding_window("sw", 3, ms(120)),
        Rule::token_bucket("tb", 3, Rate::new(2, ms(100))),
        Rule::gcra("gc", 2, Rate::new(3, ms(100))),
        // Penalties beside the queues.
        Rule::fixed_window("fl", 2, ms(150)).with_penalty(lock),
        Rule::token_bucket("tl", 2, Rate::new(1, ms(50))).with_penalty(Penalty::lock_for(ms(200))),
        Rule::leaky_bucket("ql", 2, Rate::new(1, ms(60))).with_penalty(lock),
    ]
}

/// One step of a Cluster schedule: a batch whose items each take the client's key, a
/// shared one or another client's (so its parts land in different slots).
#[derive(Debug, Clone)]
struct ClusterStep {
    advance_us: u64,
    key: u8,
    cost: u64,
    /// Indices into `queue_rules()`, distinct.
    rules: Vec<usize>,
    /// Per item, two bits: 0 the client's key, 1 "shared", 2 "other", 3 the client's.
    keys: u8,
    max_wait_us: u64,
    /// Whether the batch is reserved and its reservation cancelled at once.
    cancel: bool,
}

fn cluster_step() -> impl Strategy<Value = ClusterStep> {
    (
        prop_oneof![Just(0u64), 0u64..2_000, 0u64..60_000, 0u64..300_000],
        0u8..3,
        prop_oneof![3 => 1u64..3, 1 => Just(0u64), 1 => 3u64..5],
        proptest::sample::subsequence((0..queue_rules().len()).collect::<Vec<usize>>(), 1..4),
        any::<u8>(),
        prop_oneof![3 => Just(0u64), 1 => 0u64..300_000],
        proptest::bool::weighted(0.15),
    )
        .prop_map(
            |(advance_us, key, cost, rules, keys, max_wait_us, cancel)| ClusterStep {
                advance_us,
                key,
                cost,
                rules,
                keys,
                max_wait_us,
                cancel,
            },
        )
}

/// MemoryStore and a 3-node Cluster answer every schedule of cross-slot batches with
/// queues alike: each part decided in its slot, realigned to the batch's release, refunded
/// when another denies, gives one node's answer.
#[test]
fn memory_and_cluster_with_queues_decide_alike() {
    let cluster = RedisCluster::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = cluster.url();
    let rules = queue_rules();
    let mut runner = TestRunner::new(Config {
        cases: 400,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&proptest::collection::vec(cluster_step(), 1..24), |steps| {
            case.set(case.get() + 1);
            let clock = ManualClock::new(BASE_MICROS + 123_457);
            let memory = Limiter::new(MemoryStore::with_clock(clock.clone()));
            let store = rt.block_on(prefixed(&url, format!("cluster{}", case.get())));
            let redis = Limiter::new(store.with_clock(clock.clone()));
            rt.block_on(async {
                let mut refunded_logs = Vec::new();
                for (i, s) in steps.iter().enumerate() {
                    clock.advance(Duration::from_micros(s.advance_us));
                    let client = [b'k', s.key];
                    // One configuration of a name per batch, as a layer's rules are.
                    let mut names = Vec::new();
                    let batch: Vec<Check<'_>> = s
                        .rules
                        .iter()
                        .filter(|&&r| {
                            let fresh = !names.contains(&rules[r].name());
                            names.push(rules[r].name());
                            fresh
                        })
                        .enumerate()
                        .map(|(j, &r)| {
                            let key: &[u8] = match (s.keys >> (2 * j)) & 3 {
                                1 => b"shared",
                                2 => b"other",
                                _ => &client,
                            };
                            Check::new(&rules[r], key).with_cost(s.cost)
                        })
                        .collect();
                    let wait = Duration::from_micros(s.max_wait_us);
                    if s.cancel {
                        let m = memory.reserve(&batch, wait).await.unwrap();
                        let r = redis.reserve(&batch, wait).await.unwrap();
                        prop_assert_eq!(
                            refunded(&batch, m.outcome().clone(), &mut refunded_logs.clone()),
                            refunded(&batch, r.outcome().clone(), &mut refunded_logs),
                            "step {}: {:?}",
                            i,
                            s
                        );
                        m.cancel().await.unwrap();
                        r.cancel().await.unwrap();
                        continue;
                    }
                    let m = memory.store().check(&batch, wait).await.unwrap();
                    let r = redis.store().check(&batch, wait).await.unwrap();
                    prop_assert_eq!(
                        refunded(&batch, m, &mut refunded_logs.clone()),
                        refunded(&batch, r, &mut refunded_logs),
                        "step {}: {:?}",
                        i,
                        s
                    );
                }
                Ok(())
            })
        })
        .unwrap();
}

/// `outcome` without what a Cluster's refund of a denied batch's admitted slot leaves
/// behind by design (see `RedisStore`'s docs): a sliding log's refunded entry stays,
/// without units, until it expires, so the quota it reports reads that entry's reset (in
/// the denied batch, later while the log holds no units but that entry, and while it holds
/// others, whose reset that entry may outlast: on the keys noted in `refunded_logs`, which
/// this batch's refund adds to).
fn refunded(
    batch: &[Check<'_>],
    mut outcome: tollgate::Outcome,
    refunded_logs: &mut Vec<Vec<u8>>,
) -> tollgate::Outcome {
    let denied = !outcome.is_admitted();
    for (check, rule) in batch.iter().zip(outcome.rules.iter_mut()) {
        let refunded = denied && rule.decision == tollgate::Decision::Allow;
        let unused = rule.info.remaining == rule.info.limit;
        let earlier = refunded_logs.iter().any(|k| k[..] == *check.key());
        if check.rule.name() == "sl" && (refunded || unused || earlier) {
            rule.info.reset = Duration::ZERO;
            if refunded && !earlier {
                refunded_logs.push(check.key().to_vec());
            }
        }
    }
    outcome
}
