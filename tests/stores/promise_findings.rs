//! Schedules the promise driver (`promises.rs`) found breaking a promise, or reaching an
//! exception the docs now state, shrunk and kept as tests of their own; and the reference
//! itself, shown to flag what breaks each promise and to pass what the docs allow.

use tollgate::store::MemoryStore;
use tollgate::{Limiter, ManualClock};

use crate::support::promise_driver::{run_one, runtime, Target};
use crate::support::promise_schedule::{fast_queue_refund, Fate, Op, LF};
use crate::support::promises::{Algo, Reference, Spec};
use crate::support::vectors::BASE_MICROS;

/// `specs()` indices the schedules below name.
const FW: usize = 0;
const SL: usize = 2;
const GC: usize = 8;
const LB: usize = 6;
const LQ: usize = 7;
const FW_OTHER: usize = 9;
const SL_OTHER: usize = 10;

fn memory() -> Target<MemoryStore> {
    let clock = ManualClock::new(BASE_MICROS);
    Target {
        limiters: vec![Limiter::new(MemoryStore::with_clock(clock.clone()))],
        clock,
        probes: true,
        bound: None,
        switch: None,
        slack: Vec::new(),
    }
}

fn holds(focus: [usize; 3], ops: Vec<Op>) {
    let target = memory();
    if let Err(e) = runtime(true).block_on(run_one(&target, focus, ops)) {
        panic!("{e}");
    }
}

/// A reservation taken before `Limiter::reset` and cancelled after it gives its units
/// back into the state written since, and the key admits them again (GCRA burst 3: 5
/// pass in one µs): `Store::refund` states this exception, and the reference allows
/// exactly the units given back across the reset, no more.
#[test]
fn a_refund_across_a_reset_admits_only_its_own_units_again() {
    let ops = vec![
        Op::reserve(0, 2, 0),
        Op::Reset { spec: 0, key: 0 },
        Op::check(0, 2, 0),
        Op::Resolve {
            pick: 0,
            fate: Fate::Cancel,
        },
        Op::check(0, 3, 0),
    ];
    holds([GC, GC, GC], ops);
}

/// An overdraft taken under another configuration of the rule is carried only up to
/// the capacities (`Rule`, "Reconfiguring a rule"): a sliding log of 4 per 30 ms with 3
/// in it, overdrawn 1 under the 2-per-45-ms configuration, admits 2 more at once (5 in
/// one µs): the reference allows exactly the debt beyond the larger capacity.
#[test]
fn an_overdraft_under_another_configuration_forgives_only_the_debt() {
    let ops = vec![
        Op::check(0, 2, 0),
        Op::check(0, 1, 0),
        Op::Overdraw {
            spec: 1,
            key: 0,
            units: 1,
        },
        Op::check(0, 2, 0),
    ];
    holds([SL, SL_OTHER, SL], ops);
}

/// A reservation that waits for another configuration's units to end, cancelled before
/// its instant, reopens nothing earlier: a fixed window of 5 per 30 ms holding 3, then a
/// reservation under the 3-per-20-ms configuration that waits until those end at the
/// 30 ms boundary; cancelled, the key must still refuse until then (`Store::refund`).
/// An overdraft settled on a reservation of nothing under another configuration takes the
/// key over up to that configuration's smaller capacity: a sliding log of 4 holding 4, a
/// 2-unit configuration's reservation of 0 settled at 1, and the log of 4 admits two more
/// in the same µs (`Rule`: the units beyond the smaller capacity go with the debt), never
/// three.
#[test]
fn an_overdraft_on_a_reservation_of_nothing_forgives_only_what_the_docs_say() {
    let ops = vec![
        Op::check(0, 1, 0),
        Op::reserve(2, 0, 0),
        Op::check(0, 1, 0),
        Op::check(0, 2, 0),
        Op::Resolve {
            pick: 0,
            fate: Fate::ConfirmSettle(1),
        },
        Op::check(0, 2, 0),
    ];
    holds([SL, FW, SL_OTHER], ops);
}

#[test]
fn a_cancelled_reservation_under_another_configuration_reopens_nothing() {
    let ops = vec![
        Op::Advance(21_513),
        Op::check(0, 1, 0),
        Op::check(0, 2, 0),
        Op::reserve(1, 1, 5_030),
        Op::Resolve {
            pick: 0,
            fate: Fate::Cancel,
        },
    ];
    holds([FW_OTHER, FW, FW], ops);
}

/// A held request settled below its estimate still leaves at its held release, so its
/// queue's next request leaves one drain interval per settled unit after it: a batch of
/// two queues (the longer one holds the request in the other) settled from 2 units to 1.
#[test]
fn a_settled_hold_keeps_its_queue_spaced() {
    let both = Op::Reserve {
        specs: vec![0, 1],
        key: 0,
        cost: 2,
        wait: 0,
        via: 0,
        split: false,
    };
    let ops = vec![
        Op::check(1, 1, 0),
        both,
        Op::Resolve {
            pick: 0,
            fate: Fate::ConfirmSettle(1),
        },
        Op::check(0, 1, 0),
    ];
    holds([LB, LQ, LB], ops);
}

/// A queue draining 10 units a µs, where a request adds less than a µs of water: a
/// reservation cancelled after a request queued behind it keeps its water (B's release
/// stands), so the next request that would overfill the queue is denied, not admitted to
/// leave ahead of B. The queue's end rounded to the µs did not move when B joined, and the
/// refund took A's water from the middle of the queue.
#[test]
fn a_refund_behind_a_sub_microsecond_request_keeps_the_queue() {
    holds([LF; 3], fast_queue_refund());
}

/// Admissions as (instant, units).
type Admissions = Vec<(u64, u64)>;

/// The reference flags each broken promise and passes its documented edge.
#[test]
fn the_reference_flags_what_breaks_a_promise() {
    let spec = |name, algo| Spec {
        name,
        algo,
        lock: None,
    };
    let cases: Vec<(Algo, Admissions, bool)> = vec![
        // Epoch windows of 3 per 10: 3 at 9 and 3 at 10 pass (the boundary burst), 4 in one do not.
        (
            Algo::Fixed {
                limit: 3,
                window: 10,
                first_hit: false,
            },
            vec![(9, 3), (10, 3)],
            true,
        ),
        (
            Algo::Fixed {
                limit: 3,
                window: 10,
                first_hit: false,
            },
            vec![(10, 3), (19, 1)],
            false,
        ),
        // First-hit windows of 2 per 10: at most 4 in any 10.
        (
            Algo::Fixed {
                limit: 2,
                window: 10,
                first_hit: true,
            },
            vec![(0, 2), (9, 2)],
            true,
        ),
        (
            Algo::Fixed {
                limit: 2,
                window: 10,
                first_hit: true,
            },
            vec![(0, 2), (9, 2), (9, 1)],
            false,
        ),
        // A sliding log of 2 per 10: [t, t + 10) half-open.
        (
            Algo::Log {
                limit: 2,
                window: 10,
            },
            vec![(0, 2), (10, 2)],
            true,
        ),
        (
            Algo::Log {
                limit: 2,
                window: 10,
            },
            vec![(0, 2), (9, 1)],
            false,
        ),
        // A token bucket of 2, 1 per 10 µs: 3 within 10 µs, not 4.
        (
            Algo::Bucket {
                capacity: 2,
                amount: 1,
                period: 10,
                stepped: false,
            },
            vec![(0, 2), (10, 1)],
            true,
        ),
        (
            Algo::Bucket {
                capacity: 2,
                amount: 1,
                period: 10,
                stepped: false,
            },
            vec![(0, 2), (9, 1)],
            false,
        ),
        // A queue draining 1 per 10 µs: releases 10 µs apart per unit.
        (
            Algo::Leaky {
                capacity: 4,
                amount: 1,
                period: 10,
            },
            vec![(0, 2), (20, 1)],
            true,
        ),
        (
            Algo::Leaky {
                capacity: 4,
                amount: 1,
                period: 10,
            },
            vec![(0, 2), (18, 1)],
            false,
        ),
        // A sliding window counter of 4 per 10: 4 at 9, then ⌈4 × 5/10⌉ + 2 at 15 fits.
        (
            Algo::Counter {
                limit: 4,
                window: 10,
            },
            vec![(9, 4), (15, 2)],
            true,
        ),
        (
            Algo::Counter {
                limit: 4,
                window: 10,
            },
            vec![(9, 4), (15, 3)],
            false,
        ),
    ];
    for (algo, admissions, holds) in cases {
        let mut reference = Reference::new(vec![spec("r", algo)]);
        for (at, units) in &admissions {
            reference.admit((0, "r", b"k".to_vec()), 0, *at, *at, *units);
        }
        let verdict = reference.verify();
        assert_eq!(
            verdict.is_ok(),
            holds,
            "{algo:?} {admissions:?}: {verdict:?}"
        );
    }
}

/// Units given back across a reset are allowed again, and no more.
#[test]
fn the_reference_forgives_only_what_a_reset_refund_gave_back() {
    let window = Algo::Fixed {
        limit: 3,
        window: 10,
        first_hit: false,
    };
    for (after, holds) in [(5, true), (6, false)] {
        let mut reference = Reference::new(vec![Spec {
            name: "r",
            algo: window,
            lock: None,
        }]);
        let lane = (0, "r", b"k".to_vec());
        let before = reference.admit(lane.clone(), 0, 0, 0, 2);
        reference.reset(&lane);
        reference.admit(lane.clone(), 0, 1, 1, after);
        reference.give_back(&before, 2);
        assert_eq!(reference.verify().is_ok(), holds, "{after} after the reset");
    }
}
