//! Rule configurations for the property suites: every rule constructor with small numbers,
//! so that limits are hit often and rates rarely divide evenly. Shared with the crate's unit
//! tests (`src/algorithm/proptests.rs`), hence the crate named `tg` (see `vectors.rs`).

#![allow(dead_code)]

use std::time::Duration;

use super::tg::{Check, Rate, Rule};
use proptest::prelude::*;

/// Every rule constructor: the six algorithms, with both fixed-window anchors and both
/// token-bucket refills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    FixedWindow,
    FixedWindowFromFirstHit,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    TokenBucketStepped,
    LeakyBucket,
    Gcra,
}

pub const KINDS: [Kind; 8] = [
    Kind::FixedWindow,
    Kind::FixedWindowFromFirstHit,
    Kind::SlidingLog,
    Kind::SlidingWindow,
    Kind::TokenBucket,
    Kind::TokenBucketStepped,
    Kind::LeakyBucket,
    Kind::Gcra,
];

/// A rule's configuration: `quota` is the limit, capacity or burst; `amount` per `period` µs
/// is the refill, drain or GCRA rate (windows are `period` long). Small numbers, so that
/// limits are hit often and rates rarely divide evenly.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub kind: Kind,
    pub quota: u64,
    pub amount: u64,
    pub period: u64,
}

impl Spec {
    pub fn rule(&self, name: &str) -> Rule {
        let period = Duration::from_micros(self.period);
        let rate = Rate::new(self.amount, period);
        match self.kind {
            Kind::FixedWindow => Rule::fixed_window(name, self.quota, period),
            Kind::FixedWindowFromFirstHit => {
                Rule::fixed_window_from_first_hit(name, self.quota, period)
            }
            Kind::SlidingLog => Rule::sliding_log(name, self.quota, period),
            Kind::SlidingWindow => Rule::sliding_window(name, self.quota, period),
            Kind::TokenBucket => Rule::token_bucket(name, self.quota, rate),
            Kind::TokenBucketStepped => Rule::token_bucket_stepped(name, self.quota, rate),
            Kind::LeakyBucket => Rule::leaky_bucket(name, self.quota, rate),
            Kind::Gcra => Rule::gcra(name, self.quota, rate),
        }
        .checked()
        .expect("generated configurations are valid")
    }
}

pub fn params() -> impl Strategy<Value = (u64, u64, u64)> {
    (1..=6u64, 1..=4u64, 1..=2_000u64)
}

pub fn spec() -> impl Strategy<Value = Spec> {
    (prop::sample::select(KINDS.to_vec()), params()).prop_map(|(kind, (quota, amount, period))| {
        Spec {
            kind,
            quota,
            amount,
            period,
        }
    })
}

/// A configuration of `kind`.
pub fn spec_of(kind: Kind) -> impl Strategy<Value = Spec> {
    params().prop_map(move |(quota, amount, period)| Spec {
        kind,
        quota,
        amount,
        period,
    })
}

// Schedules: when requests come, what they cost, which rules and keys they check.

/// The keys of the multi-key properties (an [`Item`]'s key index).
pub const KEYS: [&[u8]; 2] = [b"alice", b"bob"];

/// Microseconds to move the clock before a step: often not at all or a little (to hit the
/// limits), sometimes a window or two, now and then long enough for every state to expire.
pub fn advance() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        4 => 1..=100u64,
        2 => 1..=3_000u64,
        1 => 3_000..=20_000u64,
    ]
}

/// Units a request costs: mostly 1, sometimes 0 or a few, now and then more than any
/// generated capacity (6).
pub fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => Just(1u64),
        3 => 0..=4u64,
        1 => 0..=8u64,
    ]
}

/// A batch as (rule index, key index, cost); indices are reduced modulo the pool sizes and
/// repeated (rule, key) pairs dropped by [`dedup`].
pub type Item = (usize, usize, u64);

pub fn batch() -> impl Strategy<Value = Vec<Item>> {
    prop::collection::vec((0..4usize, 0..KEYS.len(), cost()), 1..=4)
}

/// The batch over a pool of `rules` rules, with each (rule, key) at most once (the store
/// refuses repeats; that is tested in `tests/memory_store.rs`).
pub fn dedup(items: &[Item], rules: usize) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::new();
    for &(r, k, c) in items {
        let r = r % rules;
        if !out.iter().any(|&(r2, k2, _)| (r2, k2) == (r, k)) {
            out.push((r, k, c));
        }
    }
    out
}

pub fn checks<'a>(rules: &'a [Rule], items: &[Item]) -> Vec<Check<'a>> {
    items
        .iter()
        .map(|&(r, k, c)| Check::new(&rules[r], KEYS[k]).with_cost(c))
        .collect()
}
