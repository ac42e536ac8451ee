//! Differential property test: random schedules give identical outcomes (decisions,
//! retry-afters, delays, remaining, reset) from `MemoryStore` and `RedisStore` on the same
//! injected clock, including penalties, cost 0, costs over capacity, wait mode and batches
//! mixing a client's key with a shared one (each rule's counted instant in the admission),
//! and costs settled after the admission (given back or overdrawn, `Reservation::settle`).

use std::time::Duration;

use crate::support::redis_server::RedisServer;
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
    ]
}

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
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![Just(0u64), 0u64..2_000, 0u64..150_000, 0u64..600_000],
        0u8..3,
        prop_oneof![3 => 1u64..3, 1 => Just(0u64), 1 => 3u64..7],
        proptest::sample::subsequence((0..8).collect::<Vec<usize>>(), 1..4),
        prop_oneof![3 => Just(0u64), 1 => 0u64..300_000],
        proptest::bool::weighted(0.1),
        prop_oneof![1 => Just(0u8), 1 => 0u8..8],
        prop_oneof![2 => Just(None), 1 => (0u64..9).prop_map(Some)],
    )
        .prop_map(
            |(advance_us, key, cost, rules, max_wait_us, peek, shared, settle)| Step {
                advance_us,
                key,
                cost,
                rules,
                shared,
                max_wait_us,
                peek,
                settle,
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
    let base = rt
        .block_on(RedisStore::connect(&server.url()))
        .expect("connect");
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
            let memory = Limiter::new(MemoryStore::with_clock(clock.clone()));
            let redis = Limiter::new(
                base.clone()
                    .with_clock(clock.clone())
                    .with_prefix(format!("case{}", case.get())),
            );
            rt.block_on(async {
                // The reservations of the step before, in both stores, and what they settle at.
                let mut unsettled: Option<(_, _, Vec<u64>)> = None;
                for (i, s) in steps.iter().enumerate() {
                    clock.advance(std::time::Duration::from_micros(s.advance_us));
                    if let Some((m, r, costs)) = unsettled.take() {
                        settle(m, r, &costs).await;
                    }
                    let key = [b'k', s.key];
                    let batch: Vec<Check<'_>> = s
                        .rules
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
                        prop_assert_eq!(m.outcome(), r.outcome(), "step {}: {:?}", i, s);
                        unsettled = Some((m, r, vec![cost; batch.len()]));
                        continue;
                    }
                    let m = memory.store().check(&batch, wait).await.unwrap();
                    let r = redis.store().check(&batch, wait).await.unwrap();
                    prop_assert_eq!(m, r, "step {}: {:?}", i, s);
                }
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
        self.peek(check.rule, check.key, check.cost).await.unwrap()
    }
}
