//! Property tests on random schedules: the invariants the design promises, checked black-box
//! through the public API.
//!
//! - a sliding log never admits more than `limit` units in any window-long interval, and
//!   never denies a request that fits;
//! - a denied batch changes no state;
//! - Retry-After is exact for every algorithm (a retry at that instant is admitted, one
//!   microsecond earlier is denied), and `None` exactly when the cost exceeds the capacity;
//! - `MemoryStore` decides exactly as the bare models (`Algorithm::evaluate` / `apply`);
//! - `MemoryStore` admits exactly the model's total under 8 contending threads;
//! - wait mode (reservations mixed with plain checks, one rule or two) never lets through more
//!   than a rule allows, counting each admission when it is due; never delays past
//!   `max_wait`; never refuses a batch whose retry-after is within `max_wait`; and a refused
//!   reservation consumes nothing;
//! - large configurations whose rate or window weight is rounded never admit more than the
//!   exact rate or estimate would, and lose at most one rounding step doing so.

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::specs::{params, spec, Kind, Spec, KINDS};
use proptest::prelude::*;
use tollgate::algorithm::{Algorithm, Eval, State, Verdict};
use tollgate::{
    Check, Decision, Denial, DenyReason, Limiter, ManualClock, MemoryStore, Outcome, Rate,
    RateLimitInfo, Rule, RuleOutcome, Store,
};

/// 20,000 days after the epoch: a realistic instant.
const BASE: u64 = 20_000 * 86_400 * 1_000_000;

/// Keys used by the multi-key properties (`key(i)`).
const KEYS: [&[u8]; 2] = [b"alice", b"bob"];

/// Polls a future once: `MemoryStore` decides synchronously, so its futures are ready at once
/// (and a future that is not would be a bug worth failing on).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a MemoryStore future was not ready at once"),
    }
}

// ---------------------------------------------------------------------------------------------
// Rules and schedules

/// Microseconds to move the clock before a step: often not at all or a little (to hit the
/// limits), sometimes a window or two, now and then long enough for every state to expire.
fn advance() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        4 => 1..=100u64,
        2 => 1..=3_000u64,
        1 => 3_000..=20_000u64,
    ]
}

/// Microseconds to move the clock, scaled to a window of `window` µs, with the instants
/// around an entry's expiry (one window after it) likely.
fn advance_within(window: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        1 => Just(1u64),
        1 => Just(window - 1),
        1 => Just(window),
        3 => 0..=window / 4,
        2 => 0..=2 * window,
    ]
}

/// Units a request costs: mostly 1, sometimes 0 or a few, now and then more than any
/// generated capacity (6).
fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => Just(1u64),
        3 => 0..=4u64,
        1 => 0..=8u64,
    ]
}

/// A batch as (rule index, key index, cost); indices are reduced modulo the pool sizes and
/// repeated (rule, key) pairs dropped by [`dedup`].
type Item = (usize, usize, u64);

fn batch() -> impl Strategy<Value = Vec<Item>> {
    prop::collection::vec((0..4usize, 0..KEYS.len(), cost()), 1..=4)
}

/// The batch over a pool of `rules` rules, with each (rule, key) at most once (the store
/// refuses repeats; that is tested in `tests/memory_store.rs`).
fn dedup(items: &[Item], rules: usize) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    for &(r, k, c) in items {
        let r = r % rules;
        if !out.iter().any(|&(r2, k2, _)| (r2, k2) == (r, k)) {
            out.push((r, k, c));
        }
    }
    out
}

fn checks<'a>(rules: &'a [Rule], items: &[Item]) -> Vec<Check<'a>> {
    items
        .iter()
        .map(|&(r, k, c)| Check::new(&rules[r], KEYS[k]).with_cost(c))
        .collect()
}

fn store_at(now: u64) -> (ManualClock, Limiter<MemoryStore>) {
    let clock = ManualClock::new(now);
    (clock.clone(), Limiter::new(MemoryStore::with_clock(clock)))
}

/// What a request of `cost` gets from `rule` for `key` right now, without consuming.
fn peek(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8], cost: u64) -> RuleOutcome {
    ready(limiter.peek(rule, key, cost)).expect("MemoryStore never fails")
}

/// Everything observable about the pool without consuming: each rule and key, peeked at
/// cost 0 (the quota as it stands), 1, and up to one more than the largest capacity.
fn snapshot(limiter: &Limiter<MemoryStore>, rules: &[Rule]) -> Vec<RuleOutcome> {
    let mut out = Vec::new();
    for rule in rules {
        for key in KEYS {
            for cost in [0, 1, 2, 3, 7] {
                out.push(peek(limiter, rule, key, cost));
            }
        }
    }
    out
}

/// Admitted batches as (instant, items, max_wait µs): with rules without penalties, a denied
/// batch changes nothing, so these alone rebuild a store's state.
type History = Vec<(u64, Vec<Item>, u64)>;

/// Whether a plain check of `items` at `t` (no earlier than the history) is admitted by a
/// store that saw `history`: asks a replayed copy, so the store under test is untouched. The
/// batch as a whole, not each rule on its own: a leaky bucket's queue moves the instant
/// every other rule counts the request at.
fn batch_admits_at(rules: &[Rule], history: &History, items: &[Item], t: u64) -> bool {
    let (clock, limiter) = store_at(BASE);
    for (at, admitted, max_wait) in history {
        clock.set_micros(*at);
        let batch = checks(rules, admitted);
        let outcome = ready(
            limiter
                .store()
                .check(&batch, Duration::from_micros(*max_wait)),
        );
        assert!(
            outcome.is_ok_and(|o| o.is_admitted()),
            "the replay diverged"
        );
    }
    clock.set_micros(t);
    ready(limiter.check(&checks(rules, items)))
        .expect("MemoryStore never fails")
        .is_admitted()
}

fn denial(reason: DenyReason, retry_micros: Option<u64>) -> Decision {
    Decision::Deny(Denial {
        reason,
        retry_after: retry_micros.map(Duration::from_micros),
    })
}

// ---------------------------------------------------------------------------------------------
// The bare models, as a reference

/// Keeps one model state per (rule, key) and answers batches as the design says a store
/// must: all or nothing, Deny beats Delay beats Allow, the longest retry-after (`None`:
/// never) decides; an admitted batch applies each item (a cost of 0 consumes nothing) at
/// the instant the request passes on its key: the leaky bucket whose queue on that key
/// drains last counts it on arrival and holds it until then, every other rule on that key
/// counts it then. The rules on keys the batch releases earlier (the other keys of a batch
/// whose queue holds it) are pending: evaluated at the batch's release and not applied
/// (`Limiter::confirm` counts them then).
/// Penalties are not modelled: the properties use rules without them.
#[derive(Default)]
struct Reference {
    states: HashMap<(usize, usize), State>,
}

impl Reference {
    fn state(&self, r: usize, k: usize) -> State {
        self.states.get(&(r, k)).cloned().unwrap_or_default()
    }

    /// How many states are not yet back to empty at `now`.
    fn live(&self, rules: &[Rule], now: u64) -> usize {
        self.states
            .iter()
            .filter(|((r, _), state)| rules[*r].algorithm().expires_at(state) > now)
            .count()
    }

    fn check(&mut self, rules: &[Rule], items: &[Item], now: u64) -> Outcome {
        // When each rule lets the request go: a leaky bucket once the water before it drained.
        let lets_go = |&(r, k, c): &Item| match rules[r].algorithm() {
            queue @ Algorithm::LeakyBucket(_) if c > 0 => {
                queue.expires_at(&self.state(r, k)).max(now)
            }
            _ => now,
        };
        // The rules on one key wait for its queues; rules on other keys do not.
        let release = |key: usize| {
            items
                .iter()
                .filter(|&&(_, k, _)| k == key)
                .map(lets_go)
                .fold(now, u64::max)
        };
        let last = items.iter().map(|i| release(i.1)).fold(now, u64::max);
        let pending: Vec<bool> = items
            .iter()
            .map(|item| lets_go(item) == now && release(item.1) < last && item.2 > 0)
            .collect();
        let counted_at: Vec<u64> = items
            .iter()
            .zip(&pending)
            .map(|(item, &pending)| {
                let release = release(item.1);
                if pending {
                    last
                } else if lets_go(item) == release {
                    now
                } else {
                    release
                }
            })
            .collect();
        let evals: Vec<Eval> = items
            .iter()
            .zip(&counted_at)
            .map(|(&(r, k, c), &at)| rules[r].algorithm().evaluate(&self.state(r, k), at, c))
            .collect();
        let admitted = evals.iter().all(Eval::is_admitted);
        let mut outcomes = Vec::new();
        for ((&(r, k, _), eval), &at) in items.iter().zip(&evals).zip(&counted_at) {
            let algorithm = rules[r].algorithm();
            let info = |e: &Eval| RateLimitInfo {
                limit: algorithm.quota().0,
                remaining: e.remaining,
                reset: Duration::from_micros(e.reset_micros),
            };
            let outcome = if admitted {
                let decision = match eval.verdict {
                    Verdict::Admit { delay_micros } if at - now + delay_micros > 0 => {
                        Decision::Delay(Duration::from_micros(at - now + delay_micros))
                    }
                    _ => Decision::Allow,
                };
                // Evaluated where the rule counts the request; its reset counts from now.
                let from_now = Eval {
                    reset_micros: eval.reset_micros + (at - now),
                    ..*eval
                };
                RuleOutcome {
                    decision,
                    info: info(&from_now),
                }
            } else {
                let decision = match eval.verdict {
                    Verdict::Admit { .. } => Decision::Allow,
                    Verdict::Reject { retry_micros: None } => {
                        denial(DenyReason::CostExceedsCapacity, None)
                    }
                    Verdict::Reject { retry_micros } => {
                        denial(DenyReason::Limited, retry_micros.map(|r| at - now + r))
                    }
                };
                // Nothing consumed: the quota as it stands.
                let standing = algorithm.evaluate(&self.state(r, k), now, 0);
                RuleOutcome {
                    decision,
                    info: info(&standing),
                }
            };
            outcomes.push(outcome);
        }
        if admitted {
            for ((&(r, k, c), &at), &pending) in items.iter().zip(&counted_at).zip(&pending) {
                if c > 0 && !pending {
                    let state = self.states.entry((r, k)).or_default();
                    rules[r].algorithm().apply(state, at, c);
                }
            }
        }
        // The model's own combination, not the crate's.
        let decision = combine(&outcomes);
        let mut outcome = Outcome::new(outcomes.into());
        outcome.decision = decision;
        outcome
    }
}

/// Deny beats Delay beats Allow; among denials the longest wait (a `None` wait is forever),
/// the first of equals.
fn combine(rules: &[RuleOutcome]) -> Decision {
    let waits_longer = |a: &Denial, b: &Denial| match (a.retry_after, b.retry_after) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(x), Some(y)) => x > y,
    };
    let mut deny: Option<Denial> = None;
    let mut delay: Option<Duration> = None;
    for rule in rules {
        match rule.decision {
            Decision::Deny(d) => {
                if deny.is_none_or(|best| waits_longer(&d, &best)) {
                    deny = Some(d);
                }
            }
            Decision::Delay(d) => delay = Some(delay.map_or(d, |e| e.max(d))),
            Decision::Allow => {}
        }
    }
    match (deny, delay) {
        (Some(d), _) => Decision::Deny(d),
        (None, Some(d)) => Decision::Delay(d),
        (None, None) => Decision::Allow,
    }
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Sliding log is exact: no window-long interval `[a, a + window)` holds more than `limit`
    /// admitted units (checking each interval that starts at an admission covers them all,
    /// since sliding an interval's start forward to the next admission only drops units),
    /// and a request is denied only if it would not fit in the window ending at it.
    #[test]
    fn sliding_log_never_admits_more_than_limit_in_any_window(
        (limit, window, steps) in (1..=10u64, 1..=1_000u64).prop_flat_map(|(limit, window)| {
            let steps = prop::collection::vec((advance_within(window), 0..=limit + 1), 1..=200);
            (Just(limit), Just(window), steps)
        }),
    ) {
        let (clock, limiter) = store_at(BASE);
        let rule = Rule::sliding_log("log", limit, Duration::from_micros(window));
        let mut now = BASE;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for &(dt, cost) in &steps {
            now += dt;
            clock.set_micros(now);
            let outcome = ready(limiter.check(&[Check::new(&rule, b"k").with_cost(cost)])).unwrap();
            // Units still counting at `now`: admitted in (now − window, now].
            let live: u64 = admitted.iter().filter(|(t, _)| t + window > now).map(|(_, c)| c).sum();
            if outcome.is_admitted() {
                prop_assert_eq!(outcome.decision, Decision::Allow);
                if cost > 0 {
                    admitted.push((now, cost));
                }
            } else if cost <= limit {
                prop_assert!(
                    live + cost > limit,
                    "denied {} unit(s) at +{} with only {} of {} used in the window",
                    cost, now - BASE, live, limit
                );
            }
        }
        for &(a, _) in &admitted {
            let in_window: u64 = admitted
                .iter()
                .filter(|(t, _)| *t >= a && *t < a + window)
                .map(|(_, c)| c)
                .sum();
            prop_assert!(
                in_window <= limit,
                "{} units admitted in [+{}, +{}) with limit {}",
                in_window, a - BASE, a - BASE + window, limit
            );
        }
    }

    /// A denied batch changes no state: every rule and key peeks exactly as before, and a
    /// second store that only ever sees the admitted batches (the history without the
    /// denials) answers those the same and stays indistinguishable from the first. The
    /// batch's retry-after is exact too: at it every item admits, a microsecond before it
    /// some item still denies.
    #[test]
    fn a_denied_batch_changes_no_state(
        specs in prop::collection::vec(spec(), 1..=3),
        steps in prop::collection::vec((advance(), batch()), 1..=60),
    ) {
        let rules: Vec<Rule> = specs.iter().enumerate().map(|(i, s)| s.rule(&format!("r{i}"))).collect();
        let (clock, limiter) = store_at(BASE);
        let (shadow_clock, shadow) = store_at(BASE);
        let mut history = History::new();
        let mut now = BASE;
        for (dt, items) in &steps {
            now += dt;
            clock.set_micros(now);
            shadow_clock.set_micros(now);
            let items = dedup(items, rules.len());
            let batch = checks(&rules, &items);

            let before = snapshot(&limiter, &rules);
            prop_assert_eq!(&before, &snapshot(&shadow, &rules));
            let outcome = ready(limiter.check(&batch)).unwrap();
            if outcome.is_admitted() {
                let replayed = ready(shadow.check(&batch)).unwrap();
                prop_assert_eq!(&replayed, &outcome);
                history.push((now, items, 0));
                continue;
            }
            prop_assert_eq!(&snapshot(&limiter, &rules), &before, "a denied batch {:?} changed state", items);

            let Decision::Deny(Denial { retry_after: Some(retry), .. }) = outcome.decision else {
                continue;
            };
            let retry = u64::try_from(retry.as_micros()).unwrap();
            prop_assert!(retry > 0);
            let admits_at = |t: u64| batch_admits_at(&rules, &history, &items, t);
            prop_assert!(!admits_at(now + retry - 1), "batch {:?} admitted before its retry-after", items);
            prop_assert!(admits_at(now + retry), "batch {:?} denied at its retry-after", items);
        }
    }

    /// Retry-After is exact for every rule constructor: when a check is denied with
    /// `retry_after = r`, the same request is still denied at `now + r − 1 µs` and admitted at
    /// `now + r` (denials consume nothing, so peeking the store at those instants sees the
    /// state as it was). A cost over the capacity is denied with `CostExceedsCapacity` and no
    /// retry-after; any other denial is `Limited` with one.
    #[test]
    fn retry_after_is_exact_for_every_algorithm(
        (quota, amount, period) in params(),
        steps in prop::collection::vec((advance(), cost()), 1..=80),
    ) {
        for kind in KINDS {
            let rule = Spec { kind, quota, amount, period }.rule("r");
            let capacity = rule.algorithm().quota().0;
            prop_assert_eq!(capacity, quota);
            let (clock, limiter) = store_at(BASE);
            let mut now = BASE;
            for &(dt, cost) in &steps {
                now += dt;
                clock.set_micros(now);
                let outcome = ready(limiter.check(&[Check::new(&rule, b"k").with_cost(cost)])).unwrap();
                let Decision::Deny(denial) = outcome.decision else {
                    prop_assert!(cost <= capacity, "{:?}: admitted cost {} over capacity", kind, cost);
                    continue;
                };
                if cost > capacity {
                    prop_assert_eq!(denial.reason, DenyReason::CostExceedsCapacity);
                    prop_assert_eq!(denial.retry_after, None);
                    continue;
                }
                prop_assert_eq!(denial.reason, DenyReason::Limited, "{:?}", kind);
                let Some(retry) = denial.retry_after else {
                    return Err(TestCaseError::fail(format!("{kind:?}: no retry-after for cost {cost}")));
                };
                let retry = u64::try_from(retry.as_micros()).unwrap();
                prop_assert!(retry > 0, "{:?}: denied with a zero retry-after", kind);
                clock.set_micros(now + retry - 1);
                let early = peek(&limiter, &rule, b"k", cost).decision;
                clock.set_micros(now + retry);
                let on_time = peek(&limiter, &rule, b"k", cost).decision;
                clock.set_micros(now);
                prop_assert!(
                    !early.is_admitted(),
                    "{:?}: cost {} at +{} told to retry after {} µs, admitted 1 µs earlier",
                    kind, cost, now - BASE, retry
                );
                prop_assert!(
                    on_time.is_admitted(),
                    "{:?}: cost {} at +{} told to retry after {} µs, denied then ({:?})",
                    kind, cost, now - BASE, retry, on_time
                );
            }
        }
    }

    /// `MemoryStore` with a `ManualClock` answers random batches over several rules and keys
    /// exactly (decisions, delays, retry-afters, remaining and reset of every rule) as the
    /// bare models driven through `Algorithm::evaluate` / `apply`. The long advances let
    /// states expire, and `purge_expired` runs now and then: it must remove exactly the
    /// states the models hold as expired, and change no answer.
    #[test]
    fn memory_store_decides_as_the_bare_models(
        specs in prop::collection::vec(spec(), 1..=3),
        steps in prop::collection::vec((advance(), batch(), prop::bool::weighted(0.2)), 1..=80),
    ) {
        let rules: Vec<Rule> = specs.iter().enumerate().map(|(i, s)| s.rule(&format!("r{i}"))).collect();
        let (clock, limiter) = store_at(BASE);
        let mut reference = Reference::default();
        let mut now = BASE;
        for (step, (dt, items, purge)) in steps.iter().enumerate() {
            now += dt;
            clock.set_micros(now);
            if *purge {
                limiter.store().purge_expired();
                prop_assert_eq!(limiter.store().len(), reference.live(&rules, now), "step {}", step);
            }
            let items = dedup(items, rules.len());
            let expected = reference.check(&rules, &items, now);
            let outcome = ready(limiter.check(&checks(&rules, &items))).unwrap();
            // The model keeps no refund marks: compare what it decides.
            prop_assert_eq!((outcome.decision, outcome.rules), (expected.decision, expected.rules), "step {} at +{}: {:?}", step, now - BASE, items);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Contention

/// How many of `attempts` unit requests the bare model admits at one frozen instant.
fn model_total(rule: &Rule, attempts: usize) -> usize {
    let mut state = State::default();
    let mut admitted = 0;
    for _ in 0..attempts {
        if rule.algorithm().evaluate(&state, BASE, 1).is_admitted() {
            rule.algorithm().apply(&mut state, BASE, 1);
            admitted += 1;
        }
    }
    admitted
}

/// Runs `attempts` checks of `batch` on each of `threads` OS threads at once (each thread on
/// its own current-thread tokio runtime), all on one frozen clock; returns how many passed.
fn contend(
    limiter: &Limiter<MemoryStore>,
    batch: &[Check<'_>],
    threads: usize,
    attempts: usize,
) -> usize {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    start.wait();
                    runtime.block_on(async {
                        let mut admitted = 0;
                        for _ in 0..attempts {
                            if limiter.check(batch).await.unwrap().is_admitted() {
                                admitted += 1;
                            }
                        }
                        admitted
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// 8 threads × 500 requests on one key: exactly the model's total passes (1000), for fixed
/// window, sliding log, token bucket and GCRA; no thread's check sees another's half-done.
#[test]
fn memory_store_admits_exactly_the_model_total_under_8_threads() {
    let window = Duration::from_secs(60);
    let rules = [
        Rule::fixed_window("fixed", 1000, window),
        Rule::sliding_log("log", 1000, window),
        Rule::token_bucket("bucket", 1000, Rate::per_second(10)),
        Rule::gcra("gcra", Rate::per_second(10), 1000),
    ];
    for rule in &rules {
        let (_clock, limiter) = store_at(BASE);
        let expected = model_total(rule, 8 * 500);
        assert_eq!(expected, 1000, "{}", rule.name());
        let admitted = contend(&limiter, &[Check::new(rule, b"hot")], 8, 500);
        assert_eq!(
            admitted,
            expected,
            "{}: admitted {admitted} under contention",
            rule.name()
        );
        let after = peek(&limiter, rule, b"hot", 0);
        assert_eq!(after.info.remaining, 0, "{}", rule.name());
    }
}

/// Two rules in one batch under contention: exactly the tighter limit passes, and the looser
/// rule consumed only for the admitted batches (the 3,300 denied ones took nothing from it),
/// even when the rules live in different shards.
#[test]
fn contended_batches_are_all_or_nothing() {
    let window = Duration::from_secs(60);
    let loose = Rule::fixed_window("loose", 1000, window);
    let tight = Rule::sliding_log("tight", 700, window);
    let (_clock, limiter) = store_at(BASE);
    let batch = [
        Check::new(&loose, b"user-1"),
        Check::new(&tight, b"10.0.0.1"),
    ];
    let admitted = contend(&limiter, &batch, 8, 500);
    assert_eq!(admitted, 700);
    assert_eq!(peek(&limiter, &loose, b"user-1", 0).info.remaining, 300);
    assert_eq!(peek(&limiter, &tight, b"10.0.0.1", 0).info.remaining, 0);
}

// ---------------------------------------------------------------------------------------------
// Wait mode: what each rule lets through, counted when it is due

/// A reservation or a plain check: the clock advance before it, each rule's cost (a single
/// rule uses the first), and `max_wait` µs (0, often, is a plain check).
type WaitStep = (u64, [u64; 2], u64);

fn max_wait() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        2 => 1..=2_000u64,
        1 => 2_000..=10_000u64,
    ]
}

fn wait_steps() -> impl Strategy<Value = Vec<WaitStep>> {
    prop::collection::vec((advance(), [cost(), cost()], max_wait()), 1..=100)
}

/// Microseconds in `d`.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

/// The delay a decision holds a request for (0 for `Allow`); `None` for a denial.
fn delay_of(decision: Decision) -> Option<u64> {
    match decision {
        Decision::Allow => Some(0),
        Decision::Delay(d) => Some(micros(d)),
        Decision::Deny(_) => None,
    }
}

/// The units admitted under each rule, as `(instant due µs, cost)`: a request admitted with
/// `Delay(d)` at `now` reaches the service at `now + d`, so that is when it counts.
type Dues = Vec<Vec<(u64, u64)>>;

/// Runs `steps` through `reserve` on one store with the batch of `specs` (one key, one rule
/// each), checking each decision as it comes:
/// - a delay never exceeds `max_wait` (plus, with a leaky bucket in the batch, its shaping
///   delay, at most the time its full queue takes to drain), and every rule is due at the
///   same instant, the one the request passes at;
/// - a denied batch changes no state (every rule peeks as before), was denied only because
///   it could not be admitted within `max_wait`, and its retry-after is exact (a microsecond
///   earlier some rule denies, at it every rule admits).
///
/// Returns each rule's due admissions.
fn run_wait_schedule(specs: &[Spec], steps: &[WaitStep]) -> Result<Dues, TestCaseError> {
    let rules: Vec<Rule> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| s.rule(&format!("r{i}")))
        .collect();
    let (clock, limiter) = store_at(BASE);
    let mut dues: Dues = vec![Vec::new(); rules.len()];
    let mut history = History::new();
    let mut now = BASE;
    // The longest a full queue of the batch's leaky buckets takes to drain.
    let shaping = specs
        .iter()
        .filter(|s| s.kind == Kind::LeakyBucket)
        .map(|s| (s.quota * s.period).div_ceil(s.amount))
        .max()
        .unwrap_or(0);
    for (step, &(dt, costs, max_wait)) in steps.iter().enumerate() {
        now += dt;
        clock.set_micros(now);
        let items: Vec<Item> = (0..rules.len()).map(|i| (i, 0, costs[i])).collect();
        let batch = checks(&rules, &items);
        let before = snapshot(&limiter, &rules);
        let outcome = ready(
            limiter
                .store()
                .check(&batch, Duration::from_micros(max_wait)),
        )
        .unwrap();
        let at = format!(
            "step {step} at +{}: costs {costs:?}, max_wait {max_wait}",
            now - BASE
        );

        let Some(delay) = delay_of(outcome.decision) else {
            prop_assert_eq!(
                &snapshot(&limiter, &rules),
                &before,
                "{}: a denied batch changed state",
                at
            );
            if let Some(retry) = outcome.decision.denial().and_then(|d| d.retry_after) {
                prop_assert!(
                    micros(retry) > max_wait,
                    "{}: denied with a retry-after of {:?}, within max_wait",
                    at,
                    retry
                );
                // Exact, with reservations in the states too: a microsecond early the batch
                // is still denied, on time it is admitted.
                let retry = micros(retry);
                let admits_at = |t: u64| batch_admits_at(&rules, &history, &items, t);
                prop_assert!(
                    !admits_at(now + retry - 1),
                    "{}: admitted before its retry-after",
                    at
                );
                prop_assert!(admits_at(now + retry), "{}: denied at its retry-after", at);
            }
            continue;
        };
        history.push((now, items, max_wait));
        prop_assert!(
            delay <= max_wait + shaping,
            "{}: delayed {} µs, more than max_wait and a full queue's drain ({})",
            at,
            delay,
            shaping
        );
        for (i, rule_outcome) in outcome.rules.iter().enumerate() {
            let Some(rule_delay) = delay_of(rule_outcome.decision) else {
                return Err(TestCaseError::fail(format!(
                    "{at}: rule {i} denies in an admitted batch"
                )));
            };
            // Every rule counts the request when it passes, so each says the batch's delay.
            prop_assert_eq!(
                rule_delay,
                delay,
                "{}: rule {} ({:?}) counts the request at another instant",
                at,
                i,
                specs[i].kind
            );
            if costs[i] > 0 {
                dues[i].push((now + rule_delay, costs[i]));
            }
        }
    }
    for log in &mut dues {
        log.sort_unstable();
    }
    Ok(dues)
}

/// The first way `dues` (sorted by instant) lets through more than the rule of `spec` allows,
/// counting each unit when it is due:
/// - fixed window (epoch): no more than `limit` in any window `[k·w, (k+1)·w)`;
/// - fixed window (first hit): a window opens at the first unit due after the previous one
///   closed and holds no more than `limit`. Windows don't overlap, so a window-long interval
///   meets at most two: 2 × `limit`, the documented boundary burst (`limit` units at the last
///   instant of one window, `limit` at the first of the next), and no more;
/// - sliding log: no more than `limit` in any `[a, a + w)`;
/// - sliding window: at each due instant `t` in window `k`, the estimate
///   `P × (w − (t − k·w)) + C × w ≤ limit × w`, with `P` the units due in window `k − 1` and
///   `C` those due in `[k·w, t]`;
/// - token bucket: in any `[a, b]`, no more than `capacity + ⌊(b − a) × amount / period⌋`
///   (smooth) or `capacity + amount × ⌈(b − a) / period⌉` (stepped: at most that many steps
///   end in `(a, b]`);
/// - GCRA: in any `[a, b]`, no more than `burst + ⌊(b − a) × amount / period⌋` (its
///   emission interval keeps its fraction of a µs, so this is the token bucket's bound);
/// - leaky bucket: in any `[a, b]`, the units beside the largest request are no more than
///   `⌊(amount × (b − a) + amount − 1) / period⌋`: a request leaves once the water queued
///   before it has drained, at the next whole microsecond.
fn over_admission(spec: &Spec, dues: &[(u64, u64)]) -> Option<String> {
    let (limit, w) = (spec.quota, spec.period);
    let units = |from: u64, to: u64| -> u64 {
        dues.iter()
            .filter(|(t, _)| (from..=to).contains(t))
            .map(|(_, c)| c)
            .sum()
    };
    let show = |t: u64| t - BASE;
    match spec.kind {
        Kind::FixedWindow => dues.iter().find_map(|&(t, _)| {
            let start = t - t % w;
            let n = units(start, start + w - 1);
            (n > limit).then(|| {
                format!(
                    "{n} units due in window [+{}, +{})",
                    show(start),
                    show(start + w)
                )
            })
        }),
        Kind::FixedWindowFromFirstHit => {
            let mut window: Option<(u64, u64)> = None;
            for &(t, c) in dues {
                let (start, n) = match window {
                    Some((start, n)) if t < start + w => (start, n + c),
                    _ => (t, c),
                };
                if n > limit {
                    return Some(format!(
                        "{n} units due in the window opened at +{}",
                        show(start)
                    ));
                }
                window = Some((start, n));
            }
            None
        }
        Kind::SlidingLog => dues.iter().find_map(|&(a, _)| {
            let n = units(a, a + w - 1);
            (n > limit).then(|| format!("{n} units due in [+{}, +{})", show(a), show(a + w)))
        }),
        Kind::SlidingWindow => dues.iter().find_map(|&(t, _)| {
            let start = t - t % w;
            let previous = start.checked_sub(w).map_or(0, |p| units(p, start - 1));
            let current = units(start, t);
            let estimate = previous * (w - (t - start)) + current * w;
            (estimate > limit * w).then(|| {
                format!(
                    "at +{}: {previous} units in the previous window and {current} in this one",
                    show(t)
                )
            })
        }),
        Kind::TokenBucket | Kind::TokenBucketStepped | Kind::Gcra | Kind::LeakyBucket => {
            let (amount, period) = (spec.amount, spec.period);
            let bound = |span: u64, largest: u64| match spec.kind {
                Kind::TokenBucket | Kind::Gcra => limit + span * amount / period,
                Kind::TokenBucketStepped => limit + amount * span.div_ceil(period),
                _ => largest + (amount * span + amount - 1) / period,
            };
            for (i, &(a, _)) in dues.iter().enumerate() {
                let (mut n, mut largest) = (0, 0);
                for &(b, c) in &dues[i..] {
                    n += c;
                    largest = largest.max(c);
                    if n > bound(b - a, largest) {
                        return Some(format!(
                            "{n} units due in [+{}, +{}], more than {}",
                            show(a),
                            show(b),
                            bound(b - a, largest)
                        ));
                    }
                }
            }
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Wait mode never lets through more than a rule allows, counting each admission when it
    /// is due (`now + delay`): mixed plain checks and reservations of random costs and
    /// `max_wait`s, for every rule constructor on its own (see [`over_admission`] for the
    /// bound of each, and [`run_wait_schedule`] for the checks on every decision).
    #[test]
    fn reservations_never_over_admit_any_algorithm(
        (quota, amount, period) in params(),
        steps in wait_steps(),
    ) {
        for kind in KINDS {
            let spec = Spec { kind, quota, amount, period };
            let dues = run_wait_schedule(&[spec], &steps)?;
            if let Some(excess) = over_admission(&spec, &dues[0]) {
                return Err(TestCaseError::fail(format!("{kind:?} {spec:?}: {excess}")));
            }
        }
    }

    /// The same for batches of two rules: a reservation waits for the slower rule and
    /// commits both at that instant, so the faster rule's state moves ahead of the clock;
    /// neither rule may then let through more than it allows.
    #[test]
    fn reservations_of_two_rule_batches_never_over_admit(
        specs in [spec(), spec()],
        steps in wait_steps(),
    ) {
        let dues = run_wait_schedule(&specs, &steps)?;
        for (spec, dues) in specs.iter().zip(&dues) {
            if let Some(excess) = over_admission(spec, dues) {
                return Err(TestCaseError::fail(format!("{spec:?}: {excess}")));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Large configurations: rounded, never more

/// A quota, amount and period (µs) large enough that `quota × period / gcd(amount, period)`
/// often exceeds 2^52, so the rate or the window's weight is rounded.
fn large_params() -> impl Strategy<Value = (u64, u64, u64)> {
    (
        prop_oneof![1 => 1..=1_000u64, 3 => 1_000_000..=1_000_000_000u64],
        prop_oneof![1 => 1..=1_000u64, 3 => 1_000..=1_000_000_000u64],
        prop_oneof![
            1 => 1_000..=1_000_000u64,
            3 => 1_000_000..=366 * 86_400_000_000u64,
        ],
    )
}

/// Steps of (µs to advance, cost, to the brim): costs from one unit to the whole quota, or
/// (to the brim) exactly what the model says remains, or one unit more, so that the edge of
/// the quota is hit where rounding would show; advances from nothing to a few times `unit`
/// (the time one unit takes) to `whole` (the time the whole quota takes).
fn large_steps(quota: u64, unit: u64, whole: u64) -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![
                2 => Just(0u64),
                2 => 0..=1_000u64,
                3 => 0..=4 * unit.max(1),
                1 => 0..=whole.clamp(1, 1 << 50),
            ],
            prop_oneof![3 => Just(1u64), 2 => 1..=quota.min(1_000), 1 => 1..=quota],
            any::<bool>(),
        ),
        1..60,
    )
}

/// The cost of a step: as generated, or to the brim (what remains, or one more).
fn step_cost(alg: &Algorithm, state: &State, now: u64, cost: u64, to_the_brim: bool) -> u64 {
    if to_the_brim {
        alg.evaluate(state, now, 0).remaining.max(1) + cost % 2
    } else {
        cost
    }
}

/// Units `amount` per `period` µs lets through in `micros` µs (exactly, rounded down).
fn exact_refill(amount: u64, period: u64, micros: u64) -> u128 {
    u128::from(micros) * u128::from(amount) / u128::from(period)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A token bucket (smooth), leaky bucket or GCRA whose rate is rounded to stay exact is
    /// never faster than the rate asked for: the units admitted from any admission instant `s`
    /// to any later one `t` never exceed the quota plus what the exact rate refills in
    /// `t − s`. The rate enforced is slower by less than 1 µs per unit, and exactly the rate
    /// in lowest terms wherever that fits; Retry-After stays exact.
    #[test]
    fn rounded_rates_never_admit_more_than_the_exact_rate(
        ((quota, amount, period), steps) in large_params()
            .prop_flat_map(|(q, a, p)| {
                let unit = p.div_ceil(a);
                (Just((q, a, p)), large_steps(q, unit, unit.saturating_mul(q)))
            }),
        kind in prop::sample::select(vec![Kind::TokenBucket, Kind::LeakyBucket, Kind::Gcra]),
    ) {
        let spec = Spec { kind, quota, amount, period };
        let rate = Rate::new(amount, Duration::from_micros(period));
        let built = match kind {
            Kind::TokenBucket => Rule::token_bucket("r", quota, rate),
            Kind::LeakyBucket => Rule::leaky_bucket("r", quota, rate),
            _ => Rule::gcra("r", rate, quota),
        }
        .checked();
        // Only buckets that take about 2^52 µs or more to fill are refused.
        let Ok(rule) = built else {
            let fill = u128::from(quota) * u128::from(period) / u128::from(amount);
            prop_assert!(fill + u128::from(quota) > 1 << 52, "{spec:?} refused: {built:?}");
            return Ok(());
        };
        let enforced = match rule.algorithm() {
            Algorithm::TokenBucket(m) => m.enforced_refill(),
            Algorithm::LeakyBucket(m) => m.enforced_drain(),
            Algorithm::Gcra(m) => m.enforced_rate(),
            other => unreachable!("{other:?}"),
        };
        // n units per p' µs against a per p: 0 ≤ p'/n − p/a < 1/n µs per unit.
        let (n, p2) = (u128::from(enforced.amount()), u128::from(enforced.period_micros()));
        let (a, p) = (u128::from(amount), u128::from(period));
        prop_assert!(p2 * a >= p * n, "{spec:?}: enforced {enforced:?} is faster");
        prop_assert!(p2 * a - p * n < a, "{spec:?}: enforced {enforced:?} is 1 µs per unit slower or more");
        // Exact wherever the arithmetic allows.
        let g = gcd(amount, period);
        if u128::from(quota) * p / u128::from(g) <= 1 << 52 {
            prop_assert_eq!((n, p2), (a / u128::from(g), p / u128::from(g)), "{:?}", spec);
        }

        let alg = rule.algorithm();
        let mut state = State::default();
        let mut now = BASE;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for &(advance, cost, brim) in &steps {
            now += advance;
            let cost = step_cost(alg, &state, now, cost, brim);
            let eval = alg.evaluate(&state, now, cost);
            if let Verdict::Reject { retry_micros: Some(retry) } = eval.verdict {
                prop_assert!(alg.evaluate(&state, now + retry, cost).is_admitted(), "{spec:?}: retry {retry} at {now}");
                prop_assert!(!alg.evaluate(&state, now + retry - 1, cost).is_admitted(), "{spec:?}: retry {retry} at {now} is late");
            }
            if eval.is_admitted() {
                alg.apply(&mut state, now, cost);
                admitted.push((now, cost));
            }
        }
        for (i, &(s, _)) in admitted.iter().enumerate() {
            let mut units = 0u128;
            for &(t, cost) in &admitted[i..] {
                units += u128::from(cost);
                let allowed = u128::from(quota) + exact_refill(amount, period, t - s);
                prop_assert!(
                    units <= allowed,
                    "{spec:?}: {units} units admitted in [{s}, {t}], the exact rate allows {allowed}"
                );
            }
        }
    }

    /// A sliding window whose weight moves in steps never admits what the exact estimate
    /// (`previous × (window − elapsed) / window + current`, in integers) would deny, and
    /// admits whatever the exact estimate admits two steps of the weight earlier (the steps
    /// cover `⌈window / step⌉ × step` µs, up to one step more than the window); its
    /// Retry-After is exact (admitted then, denied a microsecond earlier).
    #[test]
    fn stepped_sliding_windows_never_admit_more_than_the_exact_estimate(
        ((limit, window), steps) in large_params()
            .prop_flat_map(|(q, _, p)| (Just((q, p)), large_steps(q, p / q, 2 * p))),
    ) {
        let rule = Rule::sliding_window("r", limit, Duration::from_micros(window));
        let Algorithm::SlidingWindow(model) = rule.algorithm() else { unreachable!() };
        let step = model.weight_step_micros();
        let alg = rule.algorithm();
        let mut state = State::default();
        let mut now = BASE;
        // Units admitted per epoch-aligned window.
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for &(advance, cost, brim) in &steps {
            now += advance;
            let cost = step_cost(alg, &state, now, cost, brim);
            let index = now / window;
            let elapsed = now % window;
            let current = counts.get(&index).copied().unwrap_or(0);
            let previous = index.checked_sub(1).and_then(|i| counts.get(&i)).copied().unwrap_or(0);
            let exact_admits = |elapsed: u64| {
                let w = u128::from(window);
                u128::from(previous) * (w - u128::from(elapsed))
                    + u128::from(current + cost) * w
                    <= u128::from(limit) * w
            };
            let eval = alg.evaluate(&state, now, cost);
            let admits = eval.is_admitted();
            // Retry-After stays exact at the step's resolution.
            if let Verdict::Reject { retry_micros: Some(retry) } = eval.verdict {
                prop_assert!(alg.evaluate(&state, now + retry, cost).is_admitted(), "retry {retry} at {now}");
                prop_assert!(retry == 0 || !alg.evaluate(&state, now + retry - 1, cost).is_admitted(), "retry {retry} at {now} is late");
            }
            prop_assert!(!admits || exact_admits(elapsed), "admitted past the exact estimate at {now}");
            prop_assert!(
                admits || !exact_admits(elapsed.saturating_sub(2 * step)),
                "denied at {now} what the exact estimate admits two steps ({step} µs) earlier"
            );
            if admits {
                alg.apply(&mut state, now, cost);
                *counts.entry(index).or_default() += cost;
            }
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
