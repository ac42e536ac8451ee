//! A fixed workload for instruction-count profiles (`valgrind --tool=callgrind`), whose counts
//! stay steady on a noisy machine where timings do not: `ROUNDS` admitted single-rule
//! decisions on one hot key, then the same on 100k keys, through `Limiter::check_one` on a
//! `MemoryStore`; with `governor`, the same on governor's keyed limiter (its
//! `check_key` on a dashmap, the same quota). Not a timing benchmark: run it under callgrind
//! (see BENCHMARKS.md).
//!
//! `cargo bench -p tollgate-bench --bench profile --no-run`, then `valgrind --tool=callgrind
//! target/release/deps/profile-* [hot|many] [governor|gcra] [now|check] [rounds]` (`gcra`: the same on
//! a GCRA rule, 1 per minute with a burst of 2^22; `now`: through `Limiter::check_now`, without
//! a future; `check`: through `Limiter::check` on a batch of one); the difference between two runs of different `rounds` divided by the difference in
//! rounds is the cost of one decision, without the set-up.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use tollgate::{store::MemoryStore, Check, Limiter, Outcome, Rate, Rule, StoreError};

/// Decisions of each kind, unless the command line gives another number.
const ROUNDS: usize = 200_000;
const KEYS: usize = 100_000;

fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args
        .iter()
        .find(|a| *a == "hot" || *a == "many")
        .cloned()
        .unwrap_or_default();
    let rounds = args.iter().find_map(|a| a.parse().ok()).unwrap_or(ROUNDS);
    if args.iter().any(|a| a == "governor") {
        return governor(&which, rounds);
    }
    // One unit per minute, not per second: under callgrind a pass over 100k keys can take
    // longer than a second, and entries whose state is back to empty would be swept and made
    // again. The burst outlasts 1,100,000 decisions on one key.
    let rule = if args.iter().any(|a| a == "gcra") {
        Rule::gcra("api", 1 << 22, Rate::per_minute(1))
    } else {
        Rule::token_bucket("api", 1 << 22, Rate::per_minute(1))
    };
    let limiter = Limiter::new(MemoryStore::new());
    let admitted = if args.iter().any(|a| a == "now") {
        run(&which, rounds, |key| {
            limiter.check_now(&[Check::new(&rule, black_box(key))])
        })
    } else if args.iter().any(|a| a == "check") {
        run(&which, rounds, |key| {
            ready(limiter.check(&[Check::new(&rule, black_box(key))]))
        })
    } else {
        run(&which, rounds, |key| {
            ready(limiter.check_one(&rule, black_box(key)))
        })
    };
    println!("{admitted} admitted");
}

/// `rounds` decisions on the hot key and/or on 100k keys (after creating them); returns how
/// many admitted. Generic, so each way of deciding is compiled on its own.
fn run(which: &str, rounds: usize, decide: impl Fn(&[u8]) -> Result<Outcome, StoreError>) -> usize {
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("client-{i:06}").into_bytes())
        .collect();
    let mut admitted = 0usize;
    if which != "many" {
        for _ in 0..rounds {
            let outcome = decide(b"hot-key");
            admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
        }
    }
    if which != "hot" {
        for key in &keys {
            let _ = decide(key);
        }
        for i in 0..rounds {
            let outcome = decide(&keys[i % KEYS]);
            admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
        }
    }
    admitted
}

/// The same workload on governor's keyed GCRA with the same quota (2^22 at 1 per minute).
fn governor(which: &str, rounds: usize) {
    use governor::{Quota, RateLimiter};
    use std::num::NonZeroU32;

    let quota =
        Quota::per_minute(NonZeroU32::MIN).allow_burst(NonZeroU32::new(1 << 22).expect("non-zero"));
    let limiter = RateLimiter::keyed(quota);
    let keys: Vec<Box<[u8]>> = (0..KEYS)
        .map(|i| format!("client-{i:06}").into_bytes().into_boxed_slice())
        .collect();
    let hot: Box<[u8]> = Box::from(&b"hot-key"[..]);
    let mut admitted = 0usize;
    if which != "many" {
        for _ in 0..rounds {
            admitted += usize::from(limiter.check_key(black_box(&hot)).is_ok());
        }
    }
    if which != "hot" {
        for key in &keys {
            let _ = limiter.check_key(key);
        }
        for i in 0..rounds {
            admitted += usize::from(limiter.check_key(black_box(&keys[i % KEYS])).is_ok());
        }
    }
    println!("{admitted} admitted");
}
