//! Property tests on random schedules: the invariants the design promises, checked black-box
//! through the public API.
//!
//! - a sliding log never admits more than `limit` units in any window-long interval, and
//!   never denies a request that fits;
//! - a denied batch changes no state;
//! - Retry-After is exact for every algorithm (a retry at that instant is admitted, one
//!   microsecond earlier is denied), and `None` exactly when the cost exceeds the capacity;
//! - `MemoryStore` admits under 8 contending threads exactly what it admits sequentially;
//! - wait mode (reservations mixed with plain checks, one rule or two) never lets through more
//!   than a rule allows, counting each admission when it is due; never delays past
//!   `max_wait`; never refuses a batch whose retry-after is within `max_wait`; and a refused
//!   reservation consumes nothing.
//!
//! The properties that need the bare models (`MemoryStore` decides exactly as they do;
//! rounded rates and stepped sliding windows never admit more than the exact ones) are the
//! crate's unit tests, in `src/algorithm/proptests.rs`.

#[path = "support/mod.rs"]
mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use support::specs::{
    advance, batch, checks, cost, dedup, params, spec, Item, Kind, Spec, KEYS, KINDS,
};
use tollgate::{
    store::{MemoryStore, Store},
    Check, Decision, Denial, DenyReason, Limiter, ManualClock, Rate, Rule, RuleOutcome,
};

/// 20,000 days after the epoch: a realistic instant.
const BASE: u64 = 20_000 * 86_400 * 1_000_000;

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
// Schedules (the shared ones are in `support::specs`)

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
            let (clock, limiter) = store_at(BASE);
            let capacity = peek(&limiter, &rule, b"k", 0).info.limit;
            prop_assert_eq!(capacity, quota);
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
}

// ---------------------------------------------------------------------------------------------
// Contention

/// How many of `attempts` unit requests a store admits at one frozen instant when they come
/// one after another (`MemoryStore` decides exactly as the bare models: the crate's unit
/// tests check that in `src/algorithm/proptests.rs`).
fn sequential_total(rule: &Rule, attempts: usize) -> usize {
    let (_clock, limiter) = store_at(BASE);
    let check = [Check::new(rule, b"hot")];
    (0..attempts)
        .filter(|_| ready(limiter.check(&check)).unwrap().is_admitted())
        .count()
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

/// 8 threads × 500 requests on one key: exactly the sequential total passes (1000), for fixed
/// window, sliding log, token bucket and GCRA; no thread's check sees another's half-done.
#[test]
fn memory_store_admits_exactly_the_sequential_total_under_8_threads() {
    let window = Duration::from_secs(60);
    let rules = [
        Rule::fixed_window("fixed", 1000, window),
        Rule::sliding_log("log", 1000, window),
        Rule::token_bucket("bucket", 1000, Rate::per_second(10)),
        Rule::gcra("gcra", 1000, Rate::per_second(10)),
    ];
    for rule in &rules {
        let (_clock, limiter) = store_at(BASE);
        let expected = sequential_total(rule, 8 * 500);
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
