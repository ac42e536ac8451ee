//! Every algorithm's promise under every verb, in process: random schedules of checks,
//! reservations (waited for, confirmed, cancelled, dropped, settled below and above),
//! refunds, overdrafts, deferred refusals counted, resets and reconfigurations, checked
//! by the reference of `support::promises` (written apart from the models it checks), on
//! a `MemoryStore` past its bound, a `Leased` one and a `Fallback` whose primary comes and
//! goes. `TOLLGATE_PROMISE_CASES` sets the schedules per configuration.

use std::time::Duration;

use tollgate::store::{Fallback, Leased, MemoryStore};
use tollgate::{Limiter, ManualClock};

use crate::support::promise_driver::{run_schedules, runtime, Target, MAX_KEYS};
use crate::support::promise_schedule::specs;
use crate::support::switch::Switch;
use crate::support::vectors::BASE_MICROS;

/// The in-process store, bounded, with floods of fresh keys between the steps.
#[test]
fn memory_store_keeps_every_promise() {
    run_schedules("memory", &runtime(true), 500, |_| async {
        let clock = ManualClock::new(BASE_MICROS);
        let store = MemoryStore::with_clock(clock.clone()).max_keys(MAX_KEYS);
        Target {
            limiters: vec![Limiter::new(store.clone())],
            clock,
            probes: true,
            bound: Some(store),
            switch: None,
            slack: Vec::new(),
        }
    });
}

/// `Leased`: the token bucket and GCRA lease a share of their quota; a burst may exceed
/// the rule's by one lease's units (`Leased`, "Never more than the store counts").
#[test]
fn leased_keeps_every_promise() {
    let specs = specs();
    let lease = |name: &str| specs.iter().find(|s| s.name == name).unwrap().rule();
    let (bucket, gcra) = (lease("tb"), lease("gc"));
    run_schedules("leased", &runtime(true), 300, |_| {
        let (bucket, gcra) = (bucket.clone(), gcra.clone());
        async move {
            let clock = ManualClock::new(BASE_MICROS);
            let store = Leased::new(MemoryStore::with_clock(clock.clone()))
                .lease(&bucket, 2, Duration::from_millis(5))
                .unwrap()
                .lease(&gcra, 2, Duration::from_millis(5))
                .unwrap();
            Target {
                limiters: vec![Limiter::new(store)],
                clock,
                probes: false,
                bound: None,
                switch: None,
                slack: vec![("tb", 2), ("gc", 2)],
            }
        }
    });
}

/// `Fallback`: while the primary is away a local store decides, on its own quota
/// (`Fallback`: "its quota from each instance during the outage plus its quota from the
/// primary afterwards"): the reference keeps the two stores' admissions apart.
#[test]
fn fallback_keeps_every_promise() {
    run_schedules("fallback", &runtime(true), 300, |_| async {
        let clock = ManualClock::new(BASE_MICROS);
        let primary = Switch::new(MemoryStore::with_clock(clock.clone()));
        let store = Fallback::with_local(primary.clone(), MemoryStore::with_clock(clock.clone()));
        Target {
            limiters: vec![Limiter::new(store)],
            clock,
            probes: true,
            bound: None,
            switch: Some(primary),
            slack: Vec::new(),
        }
    });
}
