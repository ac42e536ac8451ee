//! A reference of what each algorithm promises, written apart from `src/algorithm` (it
//! shares no code with the models it checks): from the instants and units of the
//! admissions that still stand (after refunds, cancels and settlements), it brute-forces
//! what the rule's documentation guarantees. Every check here is one the documented
//! behaviour must pass; where the docs allow more (a fixed window's boundary burst, a
//! lease's early units, a reconfiguration's two refills and forgiven debt, a refund across
//! a reset, a `Fallback`'s local quota), the check allows exactly that much.
//!
//! What it checks, per lane (a rule name and key, in one store): `promise_checks` (the
//! algorithms' bounds and a penalty's lock), and, by probing the store, `promise_verbs`
//! (`Retry-After` exact, a refund before its instant reopening nothing).
//!
//! The random driver of every verb that feeds it is `promise_driver`; the suites are
//! `tests/stores/promises.rs` (MemoryStore, `Leased`, `Fallback`) and
//! `tests/redis/promises.rs` (Redis standalone with the deny cache, and a Cluster). They
//! run a few hundred schedules per configuration (the CI run); the long run, 10,000 per
//! configuration (`TOLLGATE_PROMISE_SEED`, a byte, picks other schedules):
//!
//! ```text
//! TOLLGATE_PROMISE_CASES=10000 cargo test -p tollgate --all-features --release \
//!     --test stores --test redis promises
//! ```

use std::collections::HashMap;
use std::time::Duration;

use tollgate::{Penalty, Rate, Rule};

use crate::support::promise_checks::Counted;

/// An algorithm's parameters as the reference reads them (µs, units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Fixed {
        limit: u64,
        window: u64,
        first_hit: bool,
    },
    Log {
        limit: u64,
        window: u64,
    },
    Counter {
        limit: u64,
        window: u64,
    },
    Bucket {
        capacity: u64,
        amount: u64,
        period: u64,
        stepped: bool,
    },
    Leaky {
        capacity: u64,
        amount: u64,
        period: u64,
    },
    Gcra {
        burst: u64,
        amount: u64,
        period: u64,
    },
}

/// A penalty: `after` counted refusals within `within` µs lock the key for `lock_for` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock {
    pub lock_for: u64,
    pub after: u64,
    pub within: u64,
}

/// One configuration of a rule name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub name: &'static str,
    pub algo: Algo,
    pub lock: Option<Lock>,
}

impl Spec {
    /// The rule this configuration stands for.
    pub fn rule(&self) -> Rule {
        let us = Duration::from_micros;
        let rule = match self.algo {
            Algo::Fixed {
                limit,
                window,
                first_hit: false,
            } => Rule::fixed_window(self.name, limit, us(window)),
            Algo::Fixed {
                limit,
                window,
                first_hit: true,
            } => Rule::fixed_window_from_first_hit(self.name, limit, us(window)),
            Algo::Log { limit, window } => Rule::sliding_log(self.name, limit, us(window)),
            Algo::Counter { limit, window } => Rule::sliding_window(self.name, limit, us(window)),
            Algo::Bucket {
                capacity,
                amount,
                period,
                stepped,
            } => {
                let rate = Rate::new(amount, us(period));
                if stepped {
                    Rule::token_bucket_stepped(self.name, capacity, rate)
                } else {
                    Rule::token_bucket(self.name, capacity, rate)
                }
            }
            Algo::Leaky {
                capacity,
                amount,
                period,
            } => Rule::leaky_bucket(self.name, capacity, Rate::new(amount, us(period))),
            Algo::Gcra {
                burst,
                amount,
                period,
            } => Rule::gcra(self.name, burst, Rate::new(amount, us(period))),
        };
        match self.lock {
            Some(l) => rule.with_penalty(
                Penalty::lock_for(us(l.lock_for))
                    .after(l.after)
                    .within(us(l.within)),
            ),
            None => rule,
        }
    }

    /// The most units admitted at once: a window's limit, a bucket's capacity or burst.
    pub fn capacity(&self) -> u64 {
        match self.algo {
            Algo::Fixed { limit, .. } | Algo::Log { limit, .. } | Algo::Counter { limit, .. } => {
                limit
            }
            Algo::Bucket { capacity, .. } | Algo::Leaky { capacity, .. } => capacity,
            Algo::Gcra { burst, .. } => burst,
        }
    }

    /// The most units this configuration alone admits within `t` µs (`t` ≥ 1: the
    /// instants `a .. a + t`): what the rule's docs promise, as the reconfiguration bound
    /// (`Rule`, "Reconfiguring a rule") adds it up.
    pub fn admits_within(&self, t: u64) -> u128 {
        let t = u128::from(t.max(1));
        match self.algo {
            // Windows are disjoint, each holds at most `limit` (a sliding window counter's
            // current count never passes its limit either): `t` instants meet at most
            // ⌈(t − 1) / window⌉ + 1 of them.
            Algo::Fixed { limit, window, .. } | Algo::Counter { limit, window } => {
                u128::from(limit) * ((t - 1).div_ceil(u128::from(window)) + 1)
            }
            Algo::Log { limit, window } => u128::from(limit) * t.div_ceil(u128::from(window)),
            Algo::Bucket {
                capacity,
                amount,
                period,
                stepped: true,
            } => u128::from(capacity) + u128::from(amount) * (t - 1).div_ceil(u128::from(period)),
            Algo::Bucket {
                capacity: c,
                amount,
                period,
                stepped: false,
            }
            | Algo::Gcra {
                burst: c,
                amount,
                period,
            }
            | Algo::Leaky {
                capacity: c,
                amount,
                period,
            } => u128::from(c) + (t - 1) * u128::from(amount) / u128::from(period),
        }
    }
}

/// Where an admission's units are kept: which store (0, or a `Fallback`'s local store 1),
/// the rule's name and the key.
pub type LaneId = (u8, &'static str, Vec<u8>);

/// One admission (or debt) as the reference keeps it.
#[derive(Debug, Clone)]
pub struct Item {
    /// Order of the verbs that made it: what was decided before what.
    pub seq: u64,
    /// When it was decided (µs).
    pub arrival: u64,
    /// When it passes: its admission instant plus its delay (µs).
    pub at: u64,
    pub units: u64,
    /// Index of its configuration among the reference's specs.
    pub spec: usize,
    /// Units owed above an admission (a settlement above its estimate, an overdraft).
    pub debt: bool,
    pub standing: bool,
}

/// The admissions and refusals of one rule name and key.
#[derive(Debug, Default)]
pub struct Lane {
    pub items: Vec<Item>,
    /// Refusals counted towards a penalty (`certain` when the docs say they count).
    refusals: Vec<Counted>,
    /// The verbs (by seq) that cleared the lane: `Limiter::reset`.
    resets: Vec<u64>,
    /// The last verb that gave units back or cleared the lane.
    pub last_removal: u64,
    /// Units the docs let this lane's bursts exceed its rule's by (a lease's `units`).
    pub slack: u64,
    /// Units of admissions taken before a reset and given back after it, which the docs
    /// let the key admit again after the reset (`Store::refund`: "as if they had been
    /// taken before it").
    pub forgiven: u64,
}

impl Lane {
    /// A configuration writing over another's state counts the units it finds only up
    /// to its own capacity (`Rule`, "Reconfiguring a rule"): what it leaves out is given
    /// back, as far as a refund's promise reads the lane.
    fn converted(&mut self, spec: usize, seq: u64) {
        if self.items.iter().any(|i| i.standing && i.spec != spec) {
            self.last_removal = seq;
        }
    }
}

/// Whether a key must be locked now, must not be, or may be either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Locked,
    Free,
    Either,
}

/// The reference: every lane, and the specs their items name.
#[derive(Debug)]
pub struct Reference {
    pub specs: Vec<Spec>,
    pub lanes: HashMap<LaneId, Lane>,
    seq: u64,
    /// Units a lease may add to a burst, by rule name.
    slack: HashMap<&'static str, u64>,
}

/// An admission's place in the reference: its lane and index there.
pub type Slot = (LaneId, usize);

impl Reference {
    pub fn new(specs: Vec<Spec>) -> Self {
        Self {
            specs,
            lanes: HashMap::new(),
            seq: 0,
            slack: HashMap::new(),
        }
    }

    /// Lets bursts of `name` exceed its rule's by `units`: a lease's documented bound.
    pub fn allow_slack(&mut self, name: &'static str, units: u64) {
        self.slack.insert(name, units);
    }

    /// Whether an admission of `spec` on lane `id` writes over another configuration's
    /// state (it takes it over, which the other instances' deny caches hear of on a
    /// channel).
    pub fn takes_over(&self, id: &LaneId, spec: usize) -> bool {
        self.lanes
            .get(id)
            .is_some_and(|lane| lane.items.iter().any(|i| i.standing && i.spec != spec))
    }

    /// The next verb's order.
    pub fn tick(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn lane(&mut self, id: &LaneId) -> &mut Lane {
        let slack = self.slack.get(id.1).copied().unwrap_or(0);
        let lane = self.lanes.entry(id.clone()).or_default();
        lane.slack = slack;
        lane
    }

    /// Records units of `spec` decided at `arrival` that pass at `at`.
    pub fn admit(&mut self, id: LaneId, spec: usize, arrival: u64, at: u64, units: u64) -> Slot {
        let seq = self.tick();
        let lane = self.lane(&id);
        lane.converted(spec, seq);
        lane.items.push(Item {
            seq,
            arrival,
            at,
            units,
            spec,
            debt: false,
            standing: true,
        });
        let index = lane.items.len() - 1;
        (id, index)
    }

    /// Records units owed at `at` beyond what an admission took.
    pub fn owe(&mut self, id: LaneId, spec: usize, at: u64, units: u64) {
        let seq = self.tick();
        let lane = self.lane(&id);
        lane.converted(spec, seq);
        lane.items.push(Item {
            seq,
            arrival: at,
            at,
            units,
            spec,
            debt: true,
            standing: true,
        });
    }

    /// Gives back `units` of an admission (all of them: it no longer stands).
    pub fn give_back(&mut self, slot: &Slot, units: u64) {
        let seq = self.tick();
        let lane = self.lane(&slot.0);
        lane.last_removal = seq;
        let last_reset = lane.resets.last().copied().unwrap_or(0);
        if let Some(item) = lane.items.get_mut(slot.1) {
            if item.seq < last_reset {
                lane.forgiven += units.min(item.units);
            }
            item.units = item.units.saturating_sub(units);
            item.standing &= item.units > 0;
        }
    }

    /// `Limiter::reset`: the lane's state and lock are forgotten.
    pub fn reset(&mut self, id: &LaneId) {
        let seq = self.tick();
        let lane = self.lane(id);
        lane.last_removal = seq;
        lane.resets.push(seq);
        for item in &mut lane.items {
            item.standing = false;
        }
    }

    /// A refusal made at `made`, counted towards the penalty at `counted`.
    pub fn refuse(&mut self, id: &LaneId, made: u64, counted: u64, certain: bool) {
        let seq = self.tick();
        let lane = self.lane(id);
        lane.refusals.push(Counted {
            seq,
            made,
            counted,
            certain,
        });
    }

    /// The last verb that gave back units of lane `id` (0: none).
    pub fn last_removal(&self, id: &LaneId) -> u64 {
        self.lanes.get(id).map_or(0, |l| l.last_removal)
    }

    /// Checks every lane against its rule's promise.
    pub fn verify(&self) -> Result<(), String> {
        for (id, lane) in &self.lanes {
            verify_lane(&self.specs, lane).map_err(|e| format!("{id:?}: {e}"))?;
        }
        Ok(())
    }

    /// Whether lane `id`, under `lock`, must be locked at `now` for the verb `seq`; with
    /// `own`, whether the verb's own refusal locks it.
    pub fn expect_lock(&self, id: &LaneId, lock: Lock, seq: u64, now: u64, own: bool) -> Expect {
        let this = own.then_some(Counted {
            seq,
            made: now,
            counted: now,
            certain: true,
        });
        let (refusals, resets) = self
            .lanes
            .get(id)
            .map_or((&[][..], &[][..]), |l| (&l.refusals[..], &l.resets[..]));
        crate::support::promise_checks::expect_lock(refusals, resets, lock, (seq, now), this)
    }
}

/// The lane's standing admissions, one configuration's or all of them.
fn standing(lane: &Lane) -> Vec<&Item> {
    let mut items: Vec<&Item> = lane
        .items
        .iter()
        .filter(|i| i.standing && !i.debt && i.units > 0)
        .collect();
    items.sort_by_key(|i| (i.at, i.seq));
    items
}

/// The lane against its rule's promise: each algorithm's own when one configuration wrote
/// it, the documented bound of a reconfiguration when two did. Beyond it, the units the
/// docs let the lane exceed it by: a lease's, those given back across a reset, and on a
/// reconfigured lane with a debt, the debts and the units beyond the smaller capacity
/// (`Rule`, "Reconfiguring a rule": a debt takes the state over only up to the writer's
/// and the reader's capacity, and the rest is forgiven).
fn verify_lane(specs: &[Spec], lane: &Lane) -> Result<(), String> {
    use crate::support::promise_checks as c;
    let items = standing(lane);
    let mut configs: Vec<usize> = lane.items.iter().map(|i| i.spec).collect();
    configs.sort_unstable();
    configs.dedup();
    let debts: u64 = lane
        .items
        .iter()
        .filter(|i| i.debt && i.standing)
        .map(|i| i.units)
        .sum();
    let forgiven_by_debt = match configs[..] {
        [a, b] if debts > 0 => {
            let (x, y) = (specs[a].capacity(), specs[b].capacity());
            debts + x.max(y) - x.min(y)
        }
        _ => 0,
    };
    let extra = lane.slack + lane.forgiven + forgiven_by_debt;
    match configs[..] {
        [] => Ok(()),
        [one] => match specs[one].algo {
            Algo::Fixed {
                limit,
                window,
                first_hit: false,
            } => c::epoch_windows(&items, limit + extra, window),
            Algo::Fixed {
                limit,
                window,
                first_hit: true,
            } => c::any_interval(&items, 2 * limit + extra, window),
            Algo::Log { limit, window } => c::any_interval(&items, limit + extra, window),
            Algo::Counter { limit, window } => c::counter(&items, limit + extra, window),
            Algo::Leaky {
                capacity,
                amount,
                period,
            } => {
                c::queue(&items, capacity + extra, amount, period)?;
                c::releases(&items, amount, period, extra)
            }
            Algo::Bucket { .. } | Algo::Gcra { .. } => {
                c::bucket(&items, |t| specs[one].admits_within(t) + u128::from(extra))
            }
        },
        [a, b] => c::bucket(&items, |t| {
            let least = specs[a].capacity().min(specs[b].capacity());
            specs[a].admits_within(t) + specs[b].admits_within(t) - u128::from(least)
                + u128::from(extra)
        }),
        _ => Err(format!("more than two configurations: {configs:?}")),
    }
}
