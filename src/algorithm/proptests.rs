//! Property tests against the bare models, which are not public: `MemoryStore` decides
//! random batches exactly as the models driven through `evaluate` / `apply`, and large
//! configurations whose rate or window weight is rounded never admit more than the exact rate
//! or estimate would, losing at most one rounding step doing so. The black-box properties are
//! in `tests/proptests.rs`; the rule configurations and schedules are shared with it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;

use super::{Algorithm, Eval, State, Verdict};
use crate as tg;
use crate::decision::{Decision, Denial, DenyReason, Outcome, RateLimitInfo, RuleOutcome};
use crate::{store::MemoryStore, Limiter, ManualClock, Rate, Rule};

#[path = "../../tests/support/specs.rs"]
#[allow(unreachable_pub)]
mod specs;

use specs::{advance, batch, checks, dedup, spec, Item, Kind, Spec};

/// 20,000 days after the epoch: a realistic instant.
const BASE: u64 = 20_000 * 86_400 * 1_000_000;

/// Polls a future once: `MemoryStore` decides synchronously, so its futures are ready at once.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a MemoryStore future was not ready at once"),
    }
}

fn store_at(now: u64) -> (ManualClock, Limiter<MemoryStore>) {
    let clock = ManualClock::new(now);
    (clock.clone(), Limiter::new(MemoryStore::with_clock(clock)))
}

fn denial(reason: DenyReason, retry_micros: Option<u64>) -> Decision {
    Decision::Deny(Denial {
        reason,
        retry_after: retry_micros.map(Duration::from_micros),
    })
}

/// Keeps one model state per (rule, key) and answers batches as the design says a store
/// must: all or nothing, Deny beats Delay beats Allow, the longest retry-after (`None`:
/// never) decides; an admitted batch applies each item (a cost of 0 consumes nothing) at
/// the instant the request passes on its key. A leaky bucket counts it on arrival and holds
/// it until the batch's release (the latest of its queues'): a queue that would let it go
/// earlier reads the time until then as queued water. Every other rule on the key that
/// releases it last counts it then; the rules on keys the batch releases earlier are
/// pending: evaluated at the batch's release and not applied (the reservation that holds
/// the request counts them then). Penalties are not modelled: the properties use rules
/// without them.
#[derive(Default)]
struct Reference {
    states: HashMap<(usize, usize), State>,
}

/// When an item's rule counts the request (see [`Reference`]).
struct Timing {
    /// The instant it counts the request at.
    at: u64,
    /// Counted at the batch's release, not now.
    pending: bool,
    /// For a queue that would let the request go before the batch's release: that release.
    held_until: Option<u64>,
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

    /// For each item, when its rule counts the request.
    fn timing(&self, rules: &[Rule], items: &[Item], now: u64) -> Vec<Timing> {
        let queue =
            |&(r, _, c): &Item| matches!(rules[r].algorithm(), Algorithm::LeakyBucket(_)) && c > 0;
        // When each rule lets the request go: a leaky bucket once the water before it drained.
        let lets_go = |item: &Item| match queue(item) {
            true => rules[item.0]
                .algorithm()
                .expires_at(&self.state(item.0, item.1))
                .max(now),
            false => now,
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
        items
            .iter()
            .map(|item| {
                let pending = !queue(item) && release(item.1) < last && item.2 > 0;
                let at = match (pending, queue(item)) {
                    (true, _) => last,
                    (false, true) => now,
                    (false, false) => release(item.1),
                };
                let held_until = (queue(item) && lets_go(item) < last).then_some(last);
                Timing {
                    at,
                    pending,
                    held_until,
                }
            })
            .collect()
    }

    /// The state item `(r, k)` is decided on: its own, or for a queue held until `until`,
    /// a queue of water that drains exactly then (the water before it has drained by then).
    fn decided_on(
        &self,
        rule: &Rule,
        (r, k): (usize, usize),
        at: u64,
        held_until: Option<u64>,
    ) -> State {
        match (rule.algorithm(), held_until) {
            (Algorithm::LeakyBucket(m), Some(until)) => {
                let level = (until - at) * m.pace.amount();
                State(super::Inner::LeakyBucket(super::leaky_bucket::LevelState {
                    level,
                    last: at,
                }))
            }
            _ => self.state(r, k),
        }
    }

    /// The outcome of rule `r` for key `k` whose model said `eval` at `at` (the batch being
    /// decided at `now`, admitted or not).
    #[allow(clippy::too_many_arguments)]
    fn outcome(
        &self,
        rule: &Rule,
        (r, k): (usize, usize),
        eval: &Eval,
        at: u64,
        now: u64,
        admitted: bool,
    ) -> RuleOutcome {
        let algorithm = rule.algorithm();
        let info = |e: &Eval| RateLimitInfo {
            limit: algorithm.quota().0,
            remaining: e.remaining,
            reset: Duration::from_micros(e.reset_micros),
        };
        if admitted {
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
            return RuleOutcome {
                decision,
                info: info(&from_now),
            };
        }
        let decision = match eval.verdict {
            Verdict::Admit { .. } => Decision::Allow,
            Verdict::Reject { retry_micros: None } => denial(DenyReason::CostExceedsCapacity, None),
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
    }

    fn check(&mut self, rules: &[Rule], items: &[Item], now: u64) -> Outcome {
        let timing = self.timing(rules, items, now);
        let states: Vec<State> = items
            .iter()
            .zip(&timing)
            .map(|(&(r, k, _), t)| self.decided_on(&rules[r], (r, k), t.at, t.held_until))
            .collect();
        let evals: Vec<Eval> = items
            .iter()
            .zip(&timing)
            .zip(&states)
            .map(|((&(r, _, c), t), state)| rules[r].algorithm().evaluate(state, t.at, c))
            .collect();
        let admitted = evals.iter().all(Eval::is_admitted);
        let outcomes: Vec<RuleOutcome> = items
            .iter()
            .zip(&evals)
            .zip(&timing)
            .map(|((&(r, k, _), eval), t)| {
                self.outcome(&rules[r], (r, k), eval, t.at, now, admitted)
            })
            .collect();
        if admitted {
            for ((&(r, k, c), t), state) in items.iter().zip(&timing).zip(states) {
                if c > 0 && !t.pending {
                    let stored = self.states.entry((r, k)).or_default();
                    *stored = state;
                    rules[r].algorithm().apply(stored, t.at, c);
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

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
                prop_assert_eq!(limiter.store().stats().keys, reference.live(&rules, now), "step {}", step);
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
            _ => Rule::gcra("r", quota, rate),
        }
        .checked();
        // Only buckets that take about 2^52 µs or more to fill are refused.
        let Ok(rule) = built else {
            let fill = u128::from(quota) * u128::from(period) / u128::from(amount);
            prop_assert!(fill + u128::from(quota) > 1 << 52, "{spec:?} refused: {built:?}");
            return Ok(());
        };
        let enforced = match rule.algorithm() {
            Algorithm::TokenBucket(m) => m.pace,
            Algorithm::LeakyBucket(m) => m.pace,
            Algorithm::Gcra(m) => m.pace,
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
        let step = model.step;
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// An overdraft never lets more through: after `overdraw`, a request the state refused
    /// is refused too, now or later, and no more units remain, for every algorithm, whether
    /// the units fit or go into debt.
    #[test]
    fn an_overdraft_never_admits_more(
        kind in 0u8..7,
        quota in 1u64..6,
        period in 1u64..3_000,
        steps in proptest::collection::vec((0u64..2_000, 0u64..8), 0..30),
        extra in 0u64..60,
        probes in proptest::collection::vec((0u64..8_000, 1u64..7), 1..20),
    ) {
        let algorithm = crate::rule::sample(kind, quota, period).algorithm().clone();
        let mut state = State::default();
        let mut now = BASE;
        for (advance, cost) in steps {
            now += advance;
            if algorithm.evaluate(&state, now, cost).is_admitted() && cost > 0 {
                algorithm.apply(&mut state, now, cost);
            }
        }
        let mut after = state.clone();
        algorithm.overdraw(&mut after, now, extra);
        for (later, cost) in probes {
            let at = now + later;
            let before = algorithm.evaluate(&state, at, cost);
            let overdrawn = algorithm.evaluate(&after, at, cost);
            prop_assert!(
                before.is_admitted() || !overdrawn.is_admitted(),
                "{:?} admits {} at +{} after an overdraft of {}, refused before",
                algorithm, cost, later, extra
            );
            let left = |s: &State| algorithm.evaluate(s, at, 0).remaining;
            prop_assert!(left(&after) <= left(&state));
        }
    }

    /// A debt is owed whole and its retry is exact: after an overdraft of any size, one unit
    /// is taken at every instant that admits it (each refusal's retry admitting and the µs
    /// before it refusing); nothing is admitted until the debt is paid, and then the units
    /// with the debt add up to no more than the quota per period (one period's burst and a
    /// boundary's more besides), for every algorithm.
    #[test]
    fn a_debt_is_paid_at_the_rate_with_exact_retries(
        kind in 0u8..7,
        quota in 1u64..6,
        period in 1u64..3_000,
        first in 0u64..8,
        extra in 0u64..60,
        periods in 1u64..24,
    ) {
        let algorithm = crate::rule::sample(kind, quota, period).algorithm().clone();
        // The units each `period` restores: a window's limit, or the sample's rate.
        let per_period = if kind % 7 < 3 { quota } else { quota.div_ceil(2) };
        let mut state = State::default();
        if first <= quota {
            algorithm.apply(&mut state, BASE, first);
        }
        algorithm.overdraw(&mut state, BASE, extra);
        let end = BASE + periods * period;
        let (mut now, mut admitted) = (BASE, 0);
        while now <= end {
            let eval = algorithm.evaluate(&state, now, 1);
            match eval.verdict {
                Verdict::Admit { .. } => {
                    algorithm.apply(&mut state, now, 1);
                    admitted += 1;
                }
                Verdict::Reject { retry_micros } => {
                    let retry = retry_micros.expect("a unit always fits in time");
                    prop_assert!(retry > 0, "{:?} refuses with no wait at {}", algorithm, now);
                    let early = algorithm.evaluate(&state, now + retry - 1, 1);
                    prop_assert!(!early.is_admitted(), "{:?} admits before its retry", algorithm);
                    let then = algorithm.evaluate(&state, now + retry, 1);
                    prop_assert!(then.is_admitted(), "{:?}: its retry refuses", algorithm);
                    now += retry;
                }
            }
        }
        // Nothing is admitted before the debt is paid, and then at the rate.
        let taken = admitted + extra + if first <= quota { first } else { 0 };
        prop_assert!(
            admitted == 0 || taken <= 2 * quota + periods * per_period,
            "{:?}: {} units (a debt of {}) in {} periods",
            algorithm,
            taken,
            extra,
            periods
        );
    }
}
