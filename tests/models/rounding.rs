//! Durations with a fraction of a microsecond round towards admitting less: a period, a
//! window or a lock is never shorter than configured.

use std::time::Duration;

use tollgate::{store::MemoryStore, Check, Limiter, ManualClock, Rate, Rule};

/// How many of `steps` requests one microsecond apart `rule` admits.
fn admitted_one_per_micro(rule: &Rule, steps: u64) -> u64 {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    let batch = [Check::new(rule, b"k")];
    let mut admitted = 0;
    for _ in 0..steps {
        clock.advance(Duration::from_micros(1));
        admitted += u64::from(limiter.check_now(&batch).unwrap().is_admitted());
    }
    admitted
}

/// One unit per 1.5 µs admits at most 2,001 units in 3 ms (one per period, plus the
/// burst), for every algorithm that runs at a rate.
#[test]
fn a_rate_with_a_fraction_of_a_microsecond_is_never_faster() {
    let rate = Rate::new(1, Duration::from_nanos(1_500));
    for rule in [
        Rule::gcra("gcra", 1, rate),
        Rule::token_bucket("bucket", 1, rate),
        Rule::token_bucket_stepped("stepped", 1, rate),
        Rule::leaky_bucket("leaky", 1, rate),
    ] {
        let admitted = admitted_one_per_micro(&rule, 3_000);
        assert!(admitted <= 2_001, "{}: {admitted} admitted", rule.name());
    }
}

/// A window of 1.5 µs admits no more than its limit per 1.5 µs.
#[test]
fn a_window_with_a_fraction_of_a_microsecond_is_never_shorter() {
    let window = Duration::from_nanos(1_500);
    for rule in [
        Rule::fixed_window("fixed", 1, window),
        Rule::sliding_log("log", 1, window),
        Rule::sliding_window("counter", 1, window),
    ] {
        let admitted = admitted_one_per_micro(&rule, 3_000);
        // A fixed window may admit its limit on both sides of a boundary.
        assert!(admitted <= 2_001, "{}: {admitted} admitted", rule.name());
    }
}
