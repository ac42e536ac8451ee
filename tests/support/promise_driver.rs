//! Runs a schedule of `promise_schedule` on a store, feeding every admission, refusal and
//! give-back to the reference of `promises`, and probing the store where a promise is
//! about one answer: a `Retry-After` (a retry then passes, a µs earlier does not), a
//! refund before the admission's instant (it reopens nothing then), a penalty's lock.

use std::future::Future;
use std::time::Duration;

use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use tokio::runtime::Runtime;

use tollgate::store::{MemoryStore, Store};
use tollgate::{Check, Decision, DenyReason, Limiter, ManualClock, Outcome, Reservation, Rule};

use super::promise_schedule::{cases, schedule, specs, Fate, Op, Schedule};
use super::promises::{Algo, LaneId, Reference, Slot};
use super::switch::Switch;

/// What a schedule runs on: limiters sharing one state (instances of a service), the
/// clock they all read, and the features the target has.
pub struct Target<S: Store + Clone> {
    pub limiters: Vec<Limiter<S>>,
    pub clock: ManualClock,
    /// Probe `Retry-After` and refunds with peeks (not where a lease decides in process).
    pub probes: bool,
    /// The in-process store to flood past its bound.
    pub bound: Option<MemoryStore>,
    /// The primary of a `Fallback`, to switch off.
    pub switch: Option<Switch>,
    /// Units a lease may add to a burst, by rule name (`Leased`'s documented bound).
    pub slack: Vec<(&'static str, u64)>,
}

/// A batch as the schedule names it.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub specs: Vec<usize>,
    /// One key per rule: a second rule may count on the other key (another slot).
    pub keys: Vec<Vec<u8>>,
    pub cost: u64,
    pub side: u8,
}

/// A reservation the schedule holds.
pub(crate) struct Held<S: Store + Clone> {
    pub(crate) reservation: Reservation<S>,
    pub(crate) asked: Asked,
    pub(crate) slots: Vec<Option<Slot>>,
    /// Decided at, passes at; the lanes' last give-back when it was decided.
    pub(crate) made: u64,
    pub(crate) at: u64,
    pub(crate) removals: Vec<u64>,
    pub(crate) confirmed: bool,
}

/// A checked batch whose outcome may be refunded.
pub(crate) struct Kept {
    pub(crate) asked: Asked,
    pub(crate) outcome: Outcome,
    pub(crate) slots: Vec<Option<Slot>>,
}

/// A deferred refusal, not counted yet: the refused rules and their lanes' last give-back.
pub(crate) struct Deferred {
    pub(crate) asked: Asked,
    pub(crate) made: u64,
    pub(crate) removals: Vec<u64>,
}

/// One schedule's run.
pub struct Run<'t, S: Store + Clone> {
    pub(crate) target: &'t Target<S>,
    pub reference: Reference,
    pub(crate) rules: Vec<Rule>,
    pub(crate) now: u64,
    pub(crate) held: Vec<Held<S>>,
    pub(crate) kept: Vec<Kept>,
    pub(crate) deferred: Vec<Deferred>,
    pub(crate) down: bool,
    pub(crate) flooded: u32,
    /// The schedule's configurations: its verbs name them by place.
    pub(crate) focus: [usize; 3],
    /// Per lane, the instances that were refused on it, and those that another instance
    /// admitted on it since (what their deny cache cannot see).
    pub(crate) refused_via: std::collections::HashSet<(LaneId, usize)>,
    pub(crate) unseen: std::collections::HashSet<(LaneId, usize)>,
    /// Whether the verb admitted over another configuration's state, which drops the
    /// other instances' cached denials of the lane.
    pub(crate) took_over: bool,
}

/// The in-process store's bound in the flooded target.
pub const MAX_KEYS: usize = 1024;

impl<'t, S: Store + Clone> Run<'t, S> {
    pub fn new(target: &'t Target<S>, start: u64) -> Self {
        let specs = specs();
        let rules = specs.iter().map(|s| s.rule()).collect();
        let mut reference = Reference::new(specs);
        for &(name, units) in &target.slack {
            reference.allow_slack(name, units);
        }
        target.clock.set_micros(start);
        Self {
            target,
            reference,
            rules,
            now: start,
            held: Vec::new(),
            kept: Vec::new(),
            deferred: Vec::new(),
            down: false,
            flooded: 0,
            focus: [0; 3],
            refused_via: Default::default(),
            unseen: Default::default(),
            took_over: false,
        }
    }

    /// Runs `ops`, then gives back what is still held and checks every promise.
    pub async fn run(mut self, schedule: &Schedule) -> Result<(), String> {
        self.focus = schedule.focus;
        for (n, op) in schedule.ops.iter().enumerate() {
            self.step(op)
                .await
                .map_err(|e| format!("verb {n} ({op:?}): {e}"))?;
        }
        while let Some(held) = self.held.pop() {
            self.fate(held, Fate::Drop).await?;
        }
        self.reference.verify()
    }

    pub(crate) fn lane(&self, asked: &Asked, j: usize) -> LaneId {
        (
            asked.side,
            self.reference.specs[asked.specs[j]].name,
            asked.keys[j].clone(),
        )
    }

    pub(crate) fn checks<'a>(&'a self, asked: &'a Asked, defer: bool) -> Vec<Check<'a>> {
        asked
            .specs
            .iter()
            .zip(&asked.keys)
            .map(|(&s, key)| {
                let mut check = Check::new(&self.rules[s], key).with_cost(asked.cost);
                if defer {
                    check.refusal = tollgate::Refusal::Deferred;
                }
                check
            })
            .collect()
    }

    /// A batch of `specs` on `key`; with `split`, the second rule on the other key,
    /// unless a leaky bucket is in the batch (its queue would leave the other key's rule
    /// to count at the release, which the reference does not follow).
    pub(crate) fn asked(&self, places: &[usize], key: u8, cost: u64, split: bool) -> Asked {
        let side = u8::from(self.down);
        // One configuration per name in a batch, as a layer's rules are.
        let mut specs: Vec<usize> = places.iter().map(|&p| self.focus[p % 3]).collect();
        if specs.len() == 2
            && self.reference.specs[specs[0]].name == self.reference.specs[specs[1]].name
        {
            specs.pop();
        }
        let queues = specs
            .iter()
            .any(|&s| is_queue(self.reference.specs[s].algo));
        let keys = (0..specs.len())
            .map(|j| {
                let other = split && !queues && j == 1;
                vec![b'k', if other { key ^ 1 } else { key }]
            })
            .collect();
        Asked {
            specs,
            keys,
            cost,
            side,
        }
    }

    pub(crate) fn limiter(&self, via: u8) -> &Limiter<S> {
        &self.target.limiters[self.instance(via)]
    }

    /// Which of the limiters `via` names.
    pub(crate) fn instance(&self, via: u8) -> usize {
        usize::from(via) % self.target.limiters.len()
    }

    async fn step(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Advance(us) => {
                self.now += us;
                self.target.clock.set_micros(self.now);
            }
            Op::Check {
                specs,
                key,
                cost,
                wait,
                defer,
                limiter,
                via,
                split,
            } => {
                let asked = self.asked(specs, *key, *cost, *split);
                self.check(asked, *wait, *defer, *limiter && *wait == 0, *via)
                    .await?;
            }
            Op::Reserve {
                specs,
                key,
                cost,
                wait,
                via,
                split,
            } => {
                let asked = self.asked(specs, *key, *cost, *split);
                self.reserve(asked, *wait, *via).await?;
            }
            Op::Resolve { pick, fate } if !self.held.is_empty() => {
                let held = self.held.remove(pick % self.held.len());
                self.fate(held, *fate).await?;
            }
            Op::Refund { pick } if !self.kept.is_empty() => {
                let kept = self.kept.remove(pick % self.kept.len());
                self.refund(kept).await?;
            }
            Op::Overdraw { spec, key, units } => self.overdraw(*spec, *key, *units).await?,
            Op::Count { pick } if !self.deferred.is_empty() => {
                let deferred = self.deferred.remove(pick % self.deferred.len());
                self.count(deferred).await?;
            }
            Op::Reset { spec, key } => self.reset(*spec, *key).await?,
            Op::Flood => self.flood().await,
            Op::Outage(down) => self.outage(*down),
            _ => {}
        }
        // What drops cached denials on the other instances travels on a channel: the
        // next verb comes after it arrived, as a client's next request does.
        let drops = matches!(
            op,
            Op::Resolve { .. } | Op::Refund { .. } | Op::Overdraw { .. } | Op::Reset { .. }
        ) || std::mem::take(&mut self.took_over);
        if drops && self.target.limiters.len() > 1 {
            tokio::time::sleep(us(5_000)).await;
        }
        Ok(())
    }
}

/// Runs `cases` schedules, each on a target `make` builds afresh, seeded so that a failure
/// prints the same shrunk schedule on every run.
pub fn run_schedules<S, F, Fut>(name: &str, rt: &Runtime, default_cases: u32, make: F)
where
    S: Store + Clone,
    F: Fn(u32) -> Fut,
    Fut: Future<Output = Target<S>>,
{
    let config = Config {
        cases: cases(default_cases),
        failure_persistence: None,
        ..Config::default()
    };
    // Another seed explores other schedules (`TOLLGATE_PROMISE_SEED`, a byte).
    let seed = [std::env::var("TOLLGATE_PROMISE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(43u8); 32];
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let case = std::cell::Cell::new(0u32);
    let result = runner.run(&schedule(60), |schedule| {
        case.set(case.get() + 1);
        rt.block_on(async {
            let target = make(case.get()).await;
            Run::new(&target, super::vectors::BASE_MICROS + 123_457)
                .run(&schedule)
                .await
        })
        .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

/// Runs one schedule, written out (a failure found and shrunk, kept as a test).
pub async fn run_one<S: Store + Clone>(
    target: &Target<S>,
    focus: [usize; 3],
    ops: Vec<Op>,
) -> Result<(), String> {
    Run::new(target, super::vectors::BASE_MICROS + 123_457)
        .run(&Schedule { focus, ops })
        .await
}

/// A runtime for `run_schedules`: `paused` for a store in process (reservations wait
/// for nothing), real time for Redis (a paused clock would time its calls out).
pub fn runtime(paused: bool) -> Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(paused);
    builder.build().unwrap()
}

/// The delay of an admitted outcome.
pub(crate) fn delay_of(outcome: &Outcome) -> u64 {
    match outcome.decision {
        Decision::Delay(d) => u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
        _ => 0,
    }
}

/// The reason and retry of a rule's denial.
pub(crate) fn denial_of(decision: &Decision) -> Option<(DenyReason, Option<u64>)> {
    decision.denial().map(|d| {
        let retry = d
            .retry_after
            .map(|r| u64::try_from(r.as_micros()).unwrap_or(u64::MAX));
        (d.reason, retry)
    })
}

/// Whether a spec is a leaky bucket (its delay is a queue, not a wait for room).
pub(crate) fn is_queue(algo: Algo) -> bool {
    matches!(algo, Algo::Leaky { .. })
}

/// `d` µs.
pub(crate) fn us(d: u64) -> Duration {
    Duration::from_micros(d)
}
