//! A fixed workload for instruction-count profiles (`valgrind --tool=callgrind`), whose counts
//! stay steady on a noisy machine where timings do not: `ROUNDS` admitted single-rule
//! decisions on one hot key, then the same on 100k keys, through `Limiter::check_one` on a
//! `MemoryStore`. Not a timing benchmark: run it under callgrind (see BENCHMARKS.md).
//!
//! `cargo bench --bench profile --no-run`, then
//! `valgrind --tool=callgrind target/release/deps/profile-* [hot|many]`.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use tollgate::{Limiter, MemoryStore, Rate, Rule};

const ROUNDS: usize = 200_000;
const KEYS: usize = 100_000;

fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
    }
}

fn main() {
    let which = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let rule = Rule::token_bucket("api", 1 << 30, Rate::per_second(1));
    let limiter = Limiter::new(MemoryStore::new());
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("client-{i:06}").into_bytes())
        .collect();
    let mut admitted = 0usize;
    if which != "many" {
        for _ in 0..ROUNDS {
            let outcome = ready(limiter.check_one(&rule, black_box(b"hot-key")));
            admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
        }
    }
    if which != "hot" {
        for key in &keys {
            let _ = ready(limiter.check_one(&rule, key));
        }
        for i in 0..ROUNDS {
            let outcome = ready(limiter.check_one(&rule, black_box(&keys[i % KEYS])));
            admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
        }
    }
    println!("{admitted} admitted");
}
