//! Rule configurations for the property suites: every rule constructor with small numbers,
//! so that limits are hit often and rates rarely divide evenly.

#![allow(dead_code)]

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Rate, Rule};

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
            Kind::Gcra => Rule::gcra(name, rate, self.quota),
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
