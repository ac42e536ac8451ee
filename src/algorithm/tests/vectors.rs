//! The shared conformance vectors (`tests/vectors/*.json`) against the bare models: every
//! single-rule scenario, run through `evaluate` and `apply` as a store would. The stores run
//! every scenario through the public API in `tests/vectors.rs` (in process) and
//! `tests/redis/store.rs` (Lua), with the same loader and expectations, included here.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate as tg;
use crate::algorithm::{Algorithm, State, Verdict};
use crate::decision::{Decision, Denial, DenyReason};

#[path = "../../../tests/support/vectors.rs"]
#[allow(unreachable_pub)]
mod shared;

use shared::{check_step, load_all, PerRule, Scenario, Seen, BASE_MICROS};

/// Whether `scenario` can run on a bare model: one rule, no penalty, no trial, no wait, no
/// reset, one key.
fn runs_on_model(scenario: &Scenario) -> bool {
    let keys: HashSet<_> = scenario
        .steps
        .iter()
        .flat_map(|s| s.checks.iter().map(|c| &c.1))
        .collect();
    scenario.rules.len() == 1
        && scenario.rules[0].penalty.is_none()
        && !scenario.rules[0].shadow
        && scenario
            .steps
            .iter()
            .all(|s| s.max_wait_us == 0 && s.reset.is_none() && s.checks.len() <= 1)
        && keys.len() <= 1
}

/// The decision a store makes of a model's verdict.
fn decision_of(verdict: Verdict) -> Decision {
    match verdict {
        Verdict::Admit { delay_micros: 0 } => Decision::Allow,
        Verdict::Admit { delay_micros } => Decision::Delay(Duration::from_micros(delay_micros)),
        Verdict::Reject { retry_micros } => Decision::Deny(Denial {
            reason: if retry_micros.is_some() {
                DenyReason::Limited
            } else {
                DenyReason::CostExceedsCapacity
            },
            retry_after: retry_micros.map(Duration::from_micros),
        }),
    }
}

/// Runs a single-rule scenario against the model: `evaluate`, then `apply` on admission; a
/// settlement gives back (`refund`) or takes (`overdraw`) the difference, as a store does.
fn run_on_model(file: &str, scenario: &Scenario) {
    let rule = scenario.rules[0].build();
    let model: &Algorithm = rule.algorithm();
    let mut state = State::default();
    // Per admitted step: the instant, the mark and the cost of its admission.
    let mut admitted: HashMap<usize, (u64, u64, u64)> = HashMap::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let now = BASE_MICROS + step.t;
        if let Some(settle) = &step.settle {
            if let Some((at, mark, taken)) = admitted.remove(&settle.step) {
                let cost = settle.costs[0];
                if cost < taken {
                    model.refund(&mut state, now, at, taken - cost, (mark, 0));
                } else if cost > taken {
                    model.overdraw(&mut state, now, cost - taken);
                }
            }
        }
        let Some((_, _, cost)) = step.checks.first() else {
            continue;
        };
        let eval = model.evaluate(&state, now, *cost);
        let decision = decision_of(eval.verdict);
        if eval.is_admitted() {
            if *cost > 0 {
                model.apply(&mut state, now, *cost);
            }
            let mark = model.mark(&state, now);
            admitted.insert(i, (now, mark, *cost));
        }
        let info = if eval.is_admitted() {
            eval
        } else {
            model.evaluate(&state, now, 0)
        };
        if let Some(expect) = &step.expect {
            let per_rule = PerRule {
                remaining: vec![info.remaining],
                rules: vec![Seen::of(&decision).decision],
                reset_us: vec![info.reset_micros],
            };
            check_step(file, scenario, i, Seen::of(&decision), per_rule, expect);
        }
    }
}

/// Every single-rule scenario of the shared test vectors holds for the pure models.
#[test]
fn vectors_hold_for_the_pure_models() {
    let all = load_all();
    let mut ran = 0;
    for (file, scenario) in &all {
        if runs_on_model(scenario) {
            run_on_model(file, scenario);
            ran += 1;
        }
    }
    assert!(
        ran >= 40,
        "only {ran} single-rule scenarios ran on the models"
    );
}
