//! Folding: the batches of one call on the same key share one read and one write of its
//! record (lua/call.lua), and each is still decided exactly as one call after another
//! decides it. Random rounds of batches on one hot key go out at once to a coalescing store
//! (one call for all but the first) and one at a time to a store that does not coalesce, on
//! keys of their own; the outcomes, the reservations' settlements, the quotas left and the
//! keys' TTLs agree, and so do a `MemoryStore`'s outcomes deciding the same batches in
//! order.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::support::redis_server::{prefixed, RedisServer};
use crate::support::vectors::BASE_MICROS;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::{
    store::{MemoryStore, RedisStore, Store},
    Check, Limiter, ManualClock, Outcome, Penalty, Rate, Reservation, Rule,
};

/// Every algorithm, with penalties, and other configurations of some names (a rolling
/// deploy's two versions, each reading the state the other wrote).
fn rules() -> Vec<Rule> {
    let ms = Duration::from_millis;
    let lock = Penalty::lock_for(ms(700)).after(2).within(ms(500));
    vec![
        Rule::gcra("gc", 6, Rate::new(3, ms(100))),
        Rule::fixed_window("fw", 5, ms(100)),
        Rule::fixed_window_from_first_hit("ff", 4, ms(150)).with_penalty(lock),
        Rule::sliding_log("sl", 4, ms(200)),
        Rule::sliding_window("sw", 5, ms(120)),
        Rule::token_bucket("tb", 5, Rate::new(3, ms(100))),
        Rule::token_bucket_stepped("ts", 4, Rate::new(2, ms(90)))
            .with_penalty(Penalty::lock_for(ms(300))),
        Rule::leaky_bucket("lb", 4, Rate::new(3, ms(100))),
        Rule::gcra("gc", 5, Rate::new(2, ms(100))).with_penalty(lock),
        Rule::sliding_log("sl", 2, ms(300)),
        Rule::token_bucket("tb", 3, Rate::new(1, ms(50))).with_penalty(lock),
        Rule::leaky_bucket("lb", 2, Rate::new(1, ms(40))),
    ]
}

#[derive(Debug, Clone)]
struct Step {
    /// Indices into `rules()`; of two configurations of a name, the batch keeps the first.
    rules: Vec<usize>,
    cost: u64,
    /// Bit `j` set: the batch's `j`-th rule is on a second key, not the hot one.
    other: u8,
    /// Bit `j` set: the batch's `j`-th rule is a shadow item.
    shadow: u8,
    max_wait_us: u64,
    /// A reservation settled at this cost after the round, else a plain check.
    settle: Option<u64>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        proptest::sample::subsequence((0..rules().len()).collect::<Vec<usize>>(), 1..4),
        prop_oneof![4 => 1u64..3, 1 => Just(0u64), 1 => 3u64..8],
        prop_oneof![3 => Just(0u8), 1 => 0u8..8],
        prop_oneof![4 => Just(0u8), 1 => 0u8..8],
        prop_oneof![3 => Just(0u64), 1 => 0u64..300_000],
        prop_oneof![3 => Just(None), 1 => (0u64..9).prop_map(Some)],
    )
        .prop_map(|(rules, cost, other, shadow, max_wait_us, settle)| Step {
            rules,
            cost,
            other,
            shadow,
            max_wait_us,
            settle,
        })
}

/// A round: batches at one instant, then the clock moves on.
fn round() -> impl Strategy<Value = (Vec<Step>, u64)> {
    (
        proptest::collection::vec(step(), 3..33),
        prop_oneof![Just(0u64), 0u64..50_000, 0u64..400_000],
    )
}

/// The checks of `step`, one configuration of a name per batch, as a layer's rules are.
fn batch<'a>(rules: &'a [Rule], step: &Step) -> Vec<Check<'a>> {
    let mut names = Vec::new();
    step.rules
        .iter()
        .filter(|&&r| {
            let fresh = !names.contains(&rules[r].name());
            names.push(rules[r].name());
            fresh
        })
        .enumerate()
        .map(|(j, &r)| {
            let key: &[u8] = if step.other & (1 << j) != 0 {
                b"other"
            } else {
                b"hot"
            };
            let mut check = Check::new(&rules[r], key).with_cost(step.cost);
            if step.shadow & (1 << j) != 0 {
                check.refusal = tollgate::Refusal::Shadow;
            }
            check
        })
        .collect()
}

type Decided<S> = (Outcome, Option<Reservation<S>>);

/// Decides `step` on `limiter`: a check, or a reservation kept for its settlement.
async fn decide<S: Store + Clone>(limiter: &Limiter<S>, rules: &[Rule], step: &Step) -> Decided<S> {
    let batch = batch(rules, step);
    let wait = Duration::from_micros(step.max_wait_us);
    if step.settle.is_some() {
        let r = limiter.reserve(&batch, wait).await.expect("reserved");
        (r.outcome().clone(), Some(r))
    } else {
        (
            limiter.store().check(&batch, wait).await.expect("decided"),
            None,
        )
    }
}

/// Runs `futures` together, each polled in turn, in order: the first sends its call, the
/// others queue behind it in this order, and the store's dispatcher sends them as one.
async fn together<'a, T>(futures: Vec<Pin<Box<dyn Future<Output = T> + 'a>>>) -> Vec<T> {
    let mut futures = futures;
    let mut done: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, out) in futures.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    *out = Some(v);
                }
            }
        }
        if done.iter().all(Option::is_some) {
            Poll::Ready(done.iter_mut().filter_map(Option::take).collect())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// The keys under `prefix` with their PTTL in ms, the prefix taken off.
fn keys_and_ttls(server: &RedisServer, prefix: &str) -> Vec<(String, i64)> {
    let listed = server.must(&["KEYS", &format!("{prefix}:*")]);
    let mut keys: Vec<(String, i64)> = listed
        .lines()
        .filter(|k| !k.is_empty())
        .map(|k| {
            let ttl = server.must(&["PTTL", k]).trim().parse().expect("a PTTL");
            (k[prefix.len()..].to_owned(), ttl)
        })
        .collect();
    keys.sort();
    keys
}

/// One call carrying many batches on one key decides them as one call each would.
#[test]
fn batches_folded_on_one_key_decide_as_one_call_each() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let rules = rules();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&proptest::collection::vec(round(), 1..6), |rounds| {
            case.set(case.get() + 1);
            let (folded_prefix, alone_prefix) =
                (format!("f{}", case.get()), format!("a{}", case.get()));
            let clock = ManualClock::new(BASE_MICROS + 123_457);
            let with = |prefix: &str| {
                rt.block_on(prefixed(&url, prefix))
                    .with_clock(clock.clone())
            };
            let folded = Limiter::new(with(&folded_prefix));
            let alone = Limiter::new(with(&alone_prefix).with_coalescing(false));
            let memory = Limiter::new(MemoryStore::with_clock(clock.clone()));
            rt.block_on(async {
                for (r, (steps, advance_us)) in rounds.iter().enumerate() {
                    server.must(&["CONFIG", "RESETSTAT"]);
                    let started = std::time::Instant::now();
                    let at_once = steps
                        .iter()
                        .map(|s| {
                            Box::pin(decide(&folded, &rules, s)) as Pin<Box<dyn Future<Output = _>>>
                        })
                        .collect();
                    let folded_decided: Vec<Decided<RedisStore>> = together(at_once).await;
                    // Two calls (the first batch alone, the rest together) as a rule; on a
                    // loaded machine a round of 30 once took four.
                    prop_assert!(
                        server.script_calls() < steps.len() as u64,
                        "{} calls for a round of {}: not folded",
                        server.script_calls(),
                        steps.len()
                    );
                    let mut alone_decided = Vec::new();
                    for (i, s) in steps.iter().enumerate() {
                        let a = decide(&alone, &rules, s).await;
                        let m = decide(&memory, &rules, s).await;
                        prop_assert_eq!(
                            &folded_decided[i].0,
                            &a.0,
                            "round {} step {}: {:?}",
                            r,
                            i,
                            s
                        );
                        // What the client sees; a shadow item's `Taken` differs between the
                        // stores, folded or not (noticed in #38.1, left alone).
                        let seen = |o: &Outcome| (o.decision, o.rules.clone());
                        prop_assert_eq!(
                            seen(&m.0),
                            seen(&a.0),
                            "memory, round {} step {}: {:?}",
                            r,
                            i,
                            s
                        );
                        alone_decided.push((a.1, m.1, s.settle));
                    }
                    // The settlements: together on the folded store, in order on the others.
                    let settle_at_once = folded_decided
                        .into_iter()
                        .zip(steps)
                        .filter_map(|((_, f), s)| Some((f?, s.settle?)))
                        .map(|(f, cost)| {
                            Box::pin(async move {
                                let costs = vec![cost; f.outcome().rules.len()];
                                f.settle(&costs).await.expect("settled");
                            }) as Pin<Box<dyn Future<Output = ()>>>
                        })
                        .collect();
                    together(settle_at_once).await;
                    for (a, m, settle) in alone_decided {
                        if let (Some(a), Some(m), Some(cost)) = (a, m, settle) {
                            let costs = vec![cost; a.outcome().rules.len()];
                            a.settle(&costs).await.expect("settled");
                            m.settle(&costs).await.expect("settled");
                        }
                    }
                    for rule in &rules {
                        for key in [&b"hot"[..], b"other"] {
                            let f = folded.peek(rule, key, 0).await.unwrap();
                            let a = alone.peek(rule, key, 0).await.unwrap();
                            prop_assert_eq!(f, a, "round {}: {} after the round", r, rule.name());
                        }
                    }
                    let (f, a) = (
                        keys_and_ttls(&server, &folded_prefix),
                        keys_and_ttls(&server, &alone_prefix),
                    );
                    let slack = started.elapsed().as_millis() as i64 + 2;
                    prop_assert_eq!(f.len(), a.len(), "keys {:?} against {:?}", f, a);
                    for ((fk, ft), (ak, at)) in f.iter().zip(&a) {
                        // The TTLs count from the same injected instant; each is read as
                        // long after its write as the round's real time allows at most.
                        prop_assert!(
                            fk == ak && (ft - at).abs() <= slack,
                            "{:?} against {:?}",
                            f,
                            a
                        );
                    }
                    clock.advance(Duration::from_micros(*advance_us));
                }
                Ok(())
            })
        })
        .unwrap();
}
