//! The random schedules that drive `promises`: the rules they use (each name with a
//! second configuration where a rolling deploy could bring one), and every verb a user of
//! a store has, as proptest strategies that shrink to a few steps.

use proptest::prelude::*;

use super::promises::{Algo, Lock, Spec};

/// The configurations the schedules use; names repeat where a rule is reconfigured.
/// Durations are a few tens of ms: a reservation on Redis is confirmed in real time.
pub fn specs() -> Vec<Spec> {
    let lock = |lock_for, after, within| {
        Some(Lock {
            lock_for,
            after,
            within,
        })
    };
    let spec = |name, algo, lock| Spec { name, algo, lock };
    let fixed = |limit, window, first_hit| Algo::Fixed {
        limit,
        window,
        first_hit,
    };
    let bucket = |capacity, amount, period, stepped| Algo::Bucket {
        capacity,
        amount,
        period,
        stepped,
    };
    let leaky = |capacity, amount, period| Algo::Leaky {
        capacity,
        amount,
        period,
    };
    let gcra = |burst, amount, period| Algo::Gcra {
        burst,
        amount,
        period,
    };
    vec![
        spec("fw", fixed(3, 20_000, false), None),
        spec("ff", fixed(2, 25_000, true), lock(40_000, 2, 30_000)),
        spec(
            "sl",
            Algo::Log {
                limit: 4,
                window: 30_000,
            },
            None,
        ),
        spec(
            "sw",
            Algo::Counter {
                limit: 5,
                window: 24_000,
            },
            None,
        ),
        spec("tb", bucket(5, 3, 20_000, false), None),
        spec("ts", bucket(4, 2, 18_000, true), lock(30_000, 1, 30_000)),
        spec("lb", leaky(4, 3, 20_000), None),
        spec("lq", leaky(3, 2, 15_000), None),
        spec("gc", gcra(3, 3, 20_000), None),
        // Second configurations: a rolling deploy's other version.
        spec("fw", fixed(5, 30_000, false), None),
        spec(
            "sl",
            Algo::Log {
                limit: 2,
                window: 45_000,
            },
            None,
        ),
        spec(
            "sw",
            Algo::Counter {
                limit: 3,
                window: 18_000,
            },
            None,
        ),
        spec("tb", bucket(3, 1, 10_000, false), None),
        spec("gc", gcra(5, 2, 20_000), None),
        // A queue draining 10 units a µs (10 MB/s of bytes): an admission can add less
        // than a µs of water.
        spec("lf", leaky(100, 10_000, 1_000), None),
    ]
}

/// The place in [`specs`] of the queue draining 10 units a µs.
pub const LF: usize = 14;

/// On the rule at place 0 (a queue of 100 draining 10 units a µs), at one instant: X (50),
/// A (21, reserved), B (5) behind A, A cancelled, C (40): A's water stays, so C is denied.
pub fn fast_queue_refund() -> Vec<Op> {
    let cancel = Op::Resolve {
        pick: 0,
        fate: Fate::Cancel,
    };
    let (check, reserve) = (|cost| Op::check(0, cost, 0), Op::reserve(0, 21, 1_000));
    vec![check(50), reserve, check(5), cancel, check(40)]
}

/// What becomes of a held reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Waits until due, then passes.
    Confirm,
    /// `Reservation::wait`, then `confirm`.
    WaitConfirm,
    /// Given back before it passes.
    Cancel,
    /// Dropped before it passes: its units go back.
    Drop,
    /// Passes, then is cancelled (a request that turns out not to count).
    ConfirmCancel,
    /// Passes, then settles at this cost (below or above the estimate).
    ConfirmSettle(u64),
    /// Settles at this cost without a confirmation.
    Settle(u64),
}

/// One verb of a schedule.
#[derive(Debug, Clone)]
pub enum Op {
    /// The clock moves on (µs).
    Advance(u64),
    /// `Store::check` (or `Limiter::check` when `limiter`) of rules (by their place in the
    /// schedule's focus) on key `key`,
    /// waiting up to `wait` µs; a denial deferred (`Refusal::Deferred`) when `defer`.
    /// `split`: the second rule counts on the other key (on a Cluster, another slot).
    Check {
        specs: Vec<usize>,
        key: u8,
        cost: u64,
        wait: u64,
        defer: bool,
        limiter: bool,
        via: u8,
        split: bool,
    },
    /// `Limiter::reserve`, kept until a `Resolve`.
    Reserve {
        specs: Vec<usize>,
        key: u8,
        cost: u64,
        wait: u64,
        via: u8,
        split: bool,
    },
    /// The fate of a held reservation (picked modulo their number).
    Resolve { pick: usize, fate: Fate },
    /// `Store::refund` of a checked batch's outcome (picked modulo their number).
    Refund { pick: usize },
    /// `Store::overdraw` of `units` on a rule and key.
    Overdraw { spec: usize, key: u8, units: u64 },
    /// `Store::count_denials` of a deferred refusal (picked modulo their number).
    Count { pick: usize },
    /// `Limiter::reset` of a rule and key.
    Reset { spec: usize, key: u8 },
    /// Fresh keys flood the in-process store past its bound.
    Flood,
    /// The primary of a `Fallback` goes away (`true`) or comes back.
    Outage(bool),
}

impl Op {
    /// A plain `Store::check` of `cost` on the rule at `place`, key 0, waiting up to `wait` µs.
    pub fn check(place: usize, cost: u64, wait: u64) -> Op {
        Op::Check {
            specs: vec![place],
            key: 0,
            cost,
            wait,
            defer: false,
            limiter: false,
            via: 0,
            split: false,
        }
    }

    /// A `Limiter::reserve` of `cost` on the rule at `place`, key 0, up to `wait` µs ahead.
    pub fn reserve(place: usize, cost: u64, wait: u64) -> Op {
        Op::Reserve {
            specs: vec![place],
            key: 0,
            cost,
            wait,
            via: 0,
            split: false,
        }
    }

    /// The same check or reservation through the schedule's limiter `n`.
    pub fn via(mut self, n: u8) -> Op {
        if let Op::Check { via, .. } | Op::Reserve { via, .. } = &mut self {
            *via = n;
        }
        self
    }
}

/// One to two of the schedule's three rules (by their place in its focus).
fn batch() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        3 => (0usize..3).prop_map(|s| vec![s]),
        1 => (0usize..3, 0usize..3).prop_map(|(a, b)| vec![a, b]),
    ]
}

fn advance() -> impl Strategy<Value = Op> {
    prop_oneof![3 => Just(0u64), 3 => 1u64..2_000, 2 => 0u64..15_000, 1 => 0u64..60_000]
        .prop_map(Op::Advance)
}

fn wait() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 1 => 1u64..12_000]
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![6 => 1u64..3, 1 => Just(0u64), 1 => 3u64..5]
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        Just(Fate::Confirm),
        Just(Fate::WaitConfirm),
        Just(Fate::Cancel),
        Just(Fate::Drop),
        Just(Fate::ConfirmCancel),
        (0u64..6).prop_map(Fate::ConfirmSettle),
        (0u64..6).prop_map(Fate::Settle),
    ]
}

/// One verb on the schedule's rules (by their place in its focus). A target without a
/// bound to flood or a primary to lose skips those verbs.
pub fn op() -> impl Strategy<Value = Op> {
    let check = (
        batch(),
        key(),
        cost(),
        wait(),
        proptest::bool::weighted(0.2),
        any::<bool>(),
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(
            |(specs, key, cost, wait, defer, limiter, via, split)| Op::Check {
                specs,
                key,
                cost,
                wait,
                defer,
                limiter,
                via,
                split,
            },
        );
    let reserve = (batch(), key(), cost(), wait(), any::<u8>(), any::<bool>()).prop_map(
        |(specs, key, cost, wait, via, split)| Op::Reserve {
            specs,
            key,
            cost,
            wait,
            via,
            split,
        },
    );
    let spec = 0usize..3;
    prop_oneof![
        8 => advance(),
        10 => check,
        5 => reserve,
        5 => (any::<usize>(), fate()).prop_map(|(pick, fate)| Op::Resolve { pick, fate }),
        1 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        1 => (spec.clone(), key(), 1u64..6)
            .prop_map(|(spec, key, units)| Op::Overdraw { spec, key, units }),
        1 => any::<usize>().prop_map(|pick| Op::Count { pick }),
        1 => (spec, key()).prop_map(|(spec, key)| Op::Reset { spec, key }),
        1 => Just(Op::Flood),
        1 => any::<bool>().prop_map(Op::Outage),
    ]
}

/// Mostly the first key: a key sees enough traffic to reach its limits.
fn key() -> impl Strategy<Value = u8> {
    prop_oneof![3 => Just(0u8), 1 => Just(1u8)]
}

/// A schedule: up to `len` verbs on three configurations (a busy key reaches its limits,
/// its queue and its lock). Its verbs name them by their place in `focus`, so that the
/// verbs shrink apart from the configurations.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub focus: [usize; 3],
    pub ops: Vec<Op>,
}

pub fn schedule(len: usize) -> impl Strategy<Value = Schedule> {
    let n = specs().len();
    (
        proptest::array::uniform3(0..n),
        proptest::collection::vec(op(), 1..len),
    )
        .prop_map(|(focus, ops)| Schedule { focus, ops })
}

/// Schedules per configuration: `TOLLGATE_PROMISE_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("TOLLGATE_PROMISE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
