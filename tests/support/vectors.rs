//! The shared conformance vectors: loading `tests/vectors/*.json` and running a scenario
//! against any [`Store`] whose clock the runner controls. The crate's own unit tests include
//! this file too (`src/algorithm/vectors.rs`), to run the scenarios against the bare
//! algorithm models, which are not public: so it names the crate `tg`, which its parent
//! module declares (`tollgate` here, `crate` there).
//!
//! Format (one file per topic, each `{"scenarios": [...]}`):
//!
//! ```json
//! {
//!   "name": "fixed window: boundary burst",
//!   "rules": [{"name": "r", "algorithm": "fixed_window", "limit": 3, "window_us": 1000000,
//!              "anchor": "epoch", "penalty": {"lock_for_us": 5, "after": 2, "within_us": 9}}],
//!   "steps": [
//!     {"t": 0, "checks": [["r", "k", 1]], "expect": {"decision": "allow", "remaining": [2]}},
//!     {"t": 10, "checks": [["r", "k", 1]],
//!      "expect": {"decision": "deny", "reason": "limited", "retry_us": 990}},
//!     {"t": 20, "reset": ["r", "k"]}
//!   ]
//! }
//! ```
//!
//! `t` is microseconds after [`BASE_MICROS`] (a realistic instant that every window used in
//! the vectors divides, so epoch-aligned windows start at `t = 0`). Algorithms and their
//! parameters: `fixed_window {limit, window_us, anchor: "epoch"|"first_hit"}`,
//! `sliding_log {limit, window_us}`, `sliding_window {limit, window_us}`,
//! `token_bucket {capacity, amount, period_us, refill: "smooth"|"stepped"}`,
//! `leaky_bucket {capacity, amount, period_us}`, `gcra {amount, period_us, burst}`.
//! `expect.decision` is `allow`, `delay` (with `delay_us`) or `deny` (with `reason`:
//! `limited`|`locked`|`cost_exceeds_capacity`, and `retry_us`, absent for
//! `cost_exceeds_capacity`). `expect.remaining`, when present, lists each rule's remaining
//! units after the step, in batch order; `expect.reset_us` likewise each rule's reset (µs
//! from the step's instant until its state is back to empty). A step with `max_wait_us` runs
//! in wait mode: a batch admissible within that many µs reserves its slot and gets `delay`
//! (stores only). A rule with `"shadow": true` is checked as a trial item
//! (`Refusal::Shadow`) in every step; `expect.rules`, when present, lists each rule's own
//! decision (`allow`, `delay`, `deny`) in batch order. A step with `settle`
//! (`{"step": 2, "costs": [7]}`) settles the batch that step `step` reserved at one cost per
//! check ([`Reservation::settle`](super::tg::Reservation::settle): what each rule took
//! beyond its cost is given back, what it took short of it is taken), before its own checks
//! if it has any. Unknown fields are errors, so a misspelt expectation cannot pass unchecked
//! (rule objects excepted: serde cannot check fields beside a flatten).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::tg::store::Store;
use super::tg::{
    Check, Decision, DenyReason, Limiter, ManualClock, Outcome, Penalty, Rate, Reservation, Rule,
};
use serde::Deserialize;

/// 20,000 days after the epoch: a multiple of every day, hour, minute and second.
pub const BASE_MICROS: u64 = 20_000 * 86_400 * 1_000_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub scenarios: Vec<Scenario>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub rules: Vec<RuleSpec>,
    pub steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum AlgorithmSpec {
    FixedWindow {
        limit: u64,
        window_us: u64,
        #[serde(default)]
        anchor: Anchor,
    },
    SlidingLog {
        limit: u64,
        window_us: u64,
    },
    SlidingWindow {
        limit: u64,
        window_us: u64,
    },
    TokenBucket {
        capacity: u64,
        amount: u64,
        period_us: u64,
        #[serde(default)]
        refill: RefillSpec,
    },
    LeakyBucket {
        capacity: u64,
        amount: u64,
        period_us: u64,
    },
    Gcra {
        amount: u64,
        period_us: u64,
        burst: u64,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Anchor {
    #[default]
    Epoch,
    FirstHit,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefillSpec {
    #[default]
    Smooth,
    Stepped,
}

#[derive(Debug, Deserialize)]
pub struct RuleSpec {
    pub name: String,
    /// The rule's name in the store, when it differs from `name`: two specs stored under one
    /// name are one rule reconfigured (tests/vectors/reconfiguration.json).
    #[serde(default)]
    pub stored_as: Option<String>,
    #[serde(flatten)]
    pub algorithm: AlgorithmSpec,
    pub penalty: Option<PenaltySpec>,
    #[serde(default)]
    pub shadow: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PenaltySpec {
    pub lock_for_us: u64,
    #[serde(default = "one")]
    pub after: u64,
    pub within_us: Option<u64>,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub t: u64,
    #[serde(default)]
    pub checks: Vec<(String, String, u64)>,
    pub reset: Option<(String, String)>,
    /// Wait mode: the batch may reserve a slot up to this far ahead (0 = a plain check).
    #[serde(default)]
    pub max_wait_us: u64,
    /// Settles the batch an earlier step reserved.
    pub settle: Option<Settle>,
    pub expect: Option<Expect>,
}

/// What a step settles: the batch step `step` reserved, at `costs` (one per check).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settle {
    pub step: usize,
    pub costs: Vec<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub decision: String,
    pub reason: Option<String>,
    pub retry_us: Option<u64>,
    pub delay_us: Option<u64>,
    pub remaining: Option<Vec<u64>>,
    pub rules: Option<Vec<String>>,
    pub reset_us: Option<Vec<u64>>,
}

impl RuleSpec {
    pub fn build(&self) -> Rule {
        let us = Duration::from_micros;
        let name = self.stored_as.as_deref().unwrap_or(&self.name);
        let rule = match self.algorithm {
            AlgorithmSpec::FixedWindow {
                limit,
                window_us,
                anchor: Anchor::Epoch,
            } => Rule::fixed_window(name, limit, us(window_us)),
            AlgorithmSpec::FixedWindow {
                limit,
                window_us,
                anchor: Anchor::FirstHit,
            } => Rule::fixed_window_from_first_hit(name, limit, us(window_us)),
            AlgorithmSpec::SlidingLog { limit, window_us } => {
                Rule::sliding_log(name, limit, us(window_us))
            }
            AlgorithmSpec::SlidingWindow { limit, window_us } => {
                Rule::sliding_window(name, limit, us(window_us))
            }
            AlgorithmSpec::TokenBucket {
                capacity,
                amount,
                period_us,
                refill: RefillSpec::Smooth,
            } => Rule::token_bucket(name, capacity, Rate::new(amount, us(period_us))),
            AlgorithmSpec::TokenBucket {
                capacity,
                amount,
                period_us,
                refill: RefillSpec::Stepped,
            } => Rule::token_bucket_stepped(name, capacity, Rate::new(amount, us(period_us))),
            AlgorithmSpec::LeakyBucket {
                capacity,
                amount,
                period_us,
            } => Rule::leaky_bucket(name, capacity, Rate::new(amount, us(period_us))),
            AlgorithmSpec::Gcra {
                amount,
                period_us,
                burst,
            } => Rule::gcra(name, burst, Rate::new(amount, us(period_us))),
        };
        let rule = rule
            .checked()
            .unwrap_or_else(|e| panic!("rule {name} of the vectors is invalid: {e}"));
        match &self.penalty {
            Some(p) => {
                let mut penalty = Penalty::lock_for(us(p.lock_for_us)).after(p.after);
                if let Some(within) = p.within_us {
                    penalty = penalty.within(us(within));
                }
                rule.with_penalty(penalty)
            }
            None => rule,
        }
    }
}

/// Every scenario of every file in `tests/vectors/`, with the file it came from.
pub fn load_all() -> Vec<(String, Scenario)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut all = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("vector file is readable");
        let file: File =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        all.extend(file.scenarios.into_iter().map(|s| (stem.clone(), s)));
    }
    all
}

/// The decision of a step in the vectors' vocabulary, for comparison.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    pub decision: String,
    pub reason: Option<String>,
    pub retry_us: Option<u64>,
    pub delay_us: Option<u64>,
}

impl Seen {
    pub fn of(decision: &Decision) -> Self {
        match decision {
            Decision::Allow => Seen {
                decision: "allow".into(),
                reason: None,
                retry_us: None,
                delay_us: None,
            },
            Decision::Delay(d) => Seen {
                decision: "delay".into(),
                reason: None,
                retry_us: None,
                delay_us: Some(d.as_micros() as u64),
            },
            Decision::Deny(d) => Seen {
                decision: "deny".into(),
                reason: Some(
                    match d.reason {
                        DenyReason::Limited => "limited",
                        DenyReason::Locked => "locked",
                        DenyReason::CostExceedsCapacity => "cost_exceeds_capacity",
                    }
                    .into(),
                ),
                retry_us: d.retry_after.map(|r| r.as_micros() as u64),
                delay_us: None,
            },
        }
    }

    fn expected(e: &Expect) -> Self {
        Seen {
            decision: e.decision.clone(),
            reason: e.reason.clone(),
            retry_us: e.retry_us,
            delay_us: e.delay_us,
        }
    }
}

/// What each rule of a step reported, in batch order.
pub struct PerRule {
    pub remaining: Vec<u64>,
    pub rules: Vec<String>,
    pub reset_us: Vec<u64>,
}

/// Asserts that step `i` of `scenario` saw what it expects.
pub fn check_step(
    file: &str,
    scenario: &Scenario,
    i: usize,
    seen: Seen,
    PerRule {
        remaining,
        rules,
        reset_us,
    }: PerRule,
    expect: &Expect,
) {
    let ctx = format!("{file}.json / {:?} / step {i}", scenario.name);
    assert_eq!(seen, Seen::expected(expect), "{ctx}: decision");
    if let Some(want) = &expect.remaining {
        assert_eq!(&remaining, want, "{ctx}: remaining units per rule");
    }
    if let Some(want) = &expect.rules {
        assert_eq!(&rules, want, "{ctx}: each rule's own decision");
    }
    if let Some(want) = &expect.reset_us {
        assert_eq!(&reset_us, want, "{ctx}: reset (µs) per rule");
    }
}

/// Runs `scenario` against a fresh store built by `make_store` on a clock the runner moves.
/// A step that a later step settles is reserved (`Limiter::reserve`), and its reservation
/// kept until then; every other step is a plain `Store::check`.
pub async fn run_on_store<S: Store + Clone>(
    file: &str,
    scenario: &Scenario,
    make_store: impl FnOnce(ManualClock) -> S,
) {
    let clock = ManualClock::new(BASE_MICROS);
    let store = make_store(clock.clone());
    let limiter = Limiter::new(store.clone());
    let settled: Vec<usize> = scenario
        .steps
        .iter()
        .filter_map(|s| s.settle.as_ref().map(|s| s.step))
        .collect();
    let mut reserved: HashMap<usize, Reservation<S>> = HashMap::new();
    let rules: HashMap<&str, (Rule, bool)> = scenario
        .rules
        .iter()
        .map(|r| (r.name.as_str(), (r.build(), r.shadow)))
        .collect();
    for (i, step) in scenario.steps.iter().enumerate() {
        clock.set_micros(BASE_MICROS + step.t);
        if let Some((rule, key)) = &step.reset {
            store
                .reset(
                    &rules[rule.as_str()].0,
                    &super::tg::StoredKey::of(key.as_bytes()),
                )
                .await
                .expect("reset");
        }
        if let Some(settle) = &step.settle {
            let reservation = reserved.remove(&settle.step).unwrap_or_else(|| {
                panic!(
                    "{file}.json / {:?} / step {i}: no reservation of step {} to settle",
                    scenario.name, settle.step
                )
            });
            reservation.settle(&settle.costs).await.expect("settle");
        }
        if step.checks.is_empty() {
            assert!(
                step.expect.is_none(),
                "{file}.json / {:?} / step {i}: an expectation needs checks",
                scenario.name
            );
            continue;
        }
        let batch: Vec<Check<'_>> = step
            .checks
            .iter()
            .map(|(rule, key, cost)| {
                let (rule, shadow) = rules
                    .get(rule.as_str())
                    .unwrap_or_else(|| panic!("{:?}: unknown rule {rule}", scenario.name));
                let mut check = Check::new(rule, key.as_bytes()).with_cost(*cost);
                if *shadow {
                    check.refusal = super::tg::Refusal::Shadow;
                }
                check
            })
            .collect();
        let wait = Duration::from_micros(step.max_wait_us);
        let outcome: Outcome = if settled.contains(&i) {
            let reservation = limiter.reserve(&batch, wait).await.expect("store decides");
            let outcome = reservation.outcome().clone();
            reserved.insert(i, reservation);
            outcome
        } else {
            store.check(&batch, wait).await.expect("store decides")
        };
        if let Some(expect) = &step.expect {
            let remaining = outcome.rules.iter().map(|r| r.info.remaining).collect();
            let each = outcome
                .rules
                .iter()
                .map(|r| Seen::of(&r.decision).decision)
                .collect();
            let reset_us = outcome
                .rules
                .iter()
                .map(|r| r.info.reset.as_micros() as u64)
                .collect();
            check_step(
                file,
                scenario,
                i,
                Seen::of(&outcome.decision),
                PerRule {
                    remaining,
                    rules: each,
                    reset_us,
                },
                expect,
            );
        }
    }
}
