//! Decision costs: each algorithm alone (`Limiter::check_now` on one key), one `MemoryStore` decision (one hot key and
//! 100k distinct keys), the store under two threads, and baselines measured in the same run
//! (a bare `AtomicU64::fetch_add`, a `parking_lot::Mutex<HashMap>` increment, and the peer:
//! governor's keyed GCRA, `DefaultKeyedRateLimiter::check_key` on its dashmap state) so
//! results read as ratios that hold across machines better than absolute numbers do.
//!
//! `cargo bench -p tollgate-bench --bench algorithms` takes about two minutes; results and their
//! reading are in BENCHMARKS.md. Contended benchmarks report wall time per decision across both
//! threads (half the per-thread latency when the two threads run truly in parallel).

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;
use tollgate::{store::MemoryStore, Check, Clock, Limiter, ManualClock, Rate, Rule, SystemClock};

/// Distinct keys cycled through by the "many keys" benchmarks.
const KEYS: usize = 100_000;
/// Threads of the contended benchmarks (the machine the figures come from has two cores).
const THREADS: usize = 2;

/// Polls a future that is ready at once, as every `MemoryStore` future is.
fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
    }
}

/// One decision through the public path; every benchmarked store decision must admit.
fn admit(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) {
    let outcome = ready(limiter.check_one(rule, black_box(key)));
    assert!(
        outcome.is_ok_and(|o| o.is_admitted()),
        "the store rule admits"
    );
}

/// The same decision without a future (`Limiter::check_now`), as governor's `check_key`
/// is called.
fn admit_now(limiter: &Limiter<MemoryStore>, rule: &Rule, key: &[u8]) {
    let outcome = limiter.check_now(&[Check::new(rule, black_box(key))]);
    assert!(
        outcome.is_ok_and(|o| o.is_admitted()),
        "the store rule admits"
    );
}

/// governor's keyed limiter with the store rule's quota (2^30 at 1 per second), so every
/// decision admits, as the store's do.
fn governor() -> DefaultKeyedRateLimiter<Box<[u8]>> {
    let burst = std::num::NonZeroU32::new(1 << 30).expect("non-zero");
    let per_second = std::num::NonZeroU32::new(1).expect("non-zero");
    RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst))
}

/// One governor decision; every benchmarked one must admit. (`check_key` takes `&K`, and
/// `K` is the boxed slice the map owns.)
#[allow(clippy::borrowed_box)]
fn governor_admit(limiter: &DefaultKeyedRateLimiter<Box<[u8]>>, key: &Box<[u8]>) {
    assert!(limiter.check_key(black_box(key)).is_ok(), "governor admits");
}

fn keys() -> Vec<Box<[u8]>> {
    (0..KEYS)
        .map(|i| format!("client-{i:06}").into_bytes().into_boxed_slice())
        .collect()
}

/// A rule every benchmarked decision admits, so each one takes the writing path: a token
/// bucket of 2^30 tokens refilled at 1 per second. Its entries stay live (not full again)
/// for the whole run, so the store finds them rather than recreating them.
fn store_rule() -> Rule {
    Rule::token_bucket("api", 1 << 30, Rate::per_second(1))
}

/// The GCRA twin of [`store_rule`] (governor's algorithm), equally roomy.
fn gcra_rule() -> Rule {
    Rule::gcra("api", 1 << 30, Rate::per_second(1))
}

/// Runs `work(thread, iters)` on `THREADS` threads started together; returns the wall time
/// from the first thread's start to the last one's end divided by `THREADS`, so criterion
/// (which divides by `iters`) reports wall time per decision over all threads. Measuring the
/// span rather than each thread's own time keeps threads that did not overlap (one core
/// busy elsewhere) from looking like a speed-up.
fn contended(iters: u64, work: impl Fn(usize, u64) + Sync) -> Duration {
    let barrier = Barrier::new(THREADS);
    let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(t, iters);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let first = spans.iter().map(|s| s.0).min();
    let last = spans.iter().map(|s| s.1).max();
    match (first, last) {
        (Some(first), Some(last)) => (last - first) / THREADS as u32,
        _ => Duration::ZERO,
    }
}

/// Each algorithm near its limit, decided at once by a `MemoryStore` on one key: 100 per
/// second, one request every 12.5 ms (80 per second), so every decision is an admission and
/// the sliding log holds 80 live entries. (At exactly the limit the sliding window's estimate, which weighs the previous
/// window's count, denies some.)
fn each_algorithm(c: &mut Criterion) {
    let second = Duration::from_secs(1);
    let per_second = Rate::per_second(100);
    let rules = [
        ("fixed_window", Rule::fixed_window("m", 100, second)),
        ("sliding_log", Rule::sliding_log("m", 100, second)),
        ("sliding_window", Rule::sliding_window("m", 100, second)),
        ("token_bucket", Rule::token_bucket("m", 100, per_second)),
        ("leaky_bucket", Rule::leaky_bucket("m", 100, per_second)),
        ("gcra", Rule::gcra("m", 100, per_second)),
    ];
    let step = 12_500;
    let mut group = c.benchmark_group("algorithm");
    for (name, rule) in rules {
        let rule = rule.checked().expect("valid rule");
        let clock = ManualClock::new(1_700_000_000_000_000);
        let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
        let mut decide = move || {
            clock.advance(Duration::from_micros(step));
            let check = [Check::new(&rule, black_box(b"k"))];
            limiter.check_now(&check).expect("in process").is_admitted()
        };
        // Past the first second every model is in its steady state; check that it admits.
        for _ in 0..1_000 {
            assert!(decide(), "{name} should admit at its own rate");
        }
        group.bench_function(name, |b| b.iter(&mut decide));
    }
    group.finish();
}

/// One reading of each clock a `MemoryStore` can run on.
fn clocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    group.bench_function("system_clock", |b| b.iter(|| SystemClock.now_micros()));
    // `MemoryStore::new`'s clock: the time-stamp counter through quanta, as micros since an
    // anchor.
    let monotonic = quanta::Clock::new();
    let start = monotonic.raw();
    group.bench_function("monotonic_clock", |b| {
        b.iter(|| monotonic.delta_as_nanos(start, monotonic.raw()) / 1_000)
    });
    group.finish();
}

fn single_thread(c: &mut Criterion) {
    let rule = store_rule();
    let keys = keys();
    let mut group = c.benchmark_group("single_thread");

    let counter = AtomicU64::new(0);
    group.bench_function("baseline_atomic_fetch_add", |b| {
        b.iter(|| counter.fetch_add(1, Ordering::AcqRel))
    });

    let map: Mutex<HashMap<Box<[u8]>, u64>> =
        Mutex::new(keys.iter().map(|k| (k.clone(), 0)).collect());
    group.bench_function("baseline_mutex_hashmap_one_key", |b| {
        b.iter(|| {
            let mut map = map.lock();
            let n = map.get_mut(black_box(&*keys[0])).expect("prefilled");
            *n += 1;
            *n
        })
    });

    let hot: Box<[u8]> = Box::from(&b"hot-key"[..]);
    let peer = governor();
    group.bench_function("governor_one_key", |b| {
        b.iter(|| governor_admit(&peer, &hot))
    });

    let limiter = Limiter::new(MemoryStore::new());
    group.bench_function("memory_store_one_key", |b| {
        b.iter(|| admit(&limiter, &rule, &hot))
    });

    group.bench_function("memory_store_one_key_now", |b| {
        b.iter(|| admit_now(&limiter, &rule, &hot))
    });

    let gcra = gcra_rule();
    let limiter = Limiter::new(MemoryStore::new());
    group.bench_function("memory_store_gcra_one_key", |b| {
        b.iter(|| admit(&limiter, &gcra, &hot))
    });
    group.bench_function("memory_store_gcra_one_key_now", |b| {
        b.iter(|| admit_now(&limiter, &gcra, &hot))
    });

    let peer = governor();
    for key in &keys {
        governor_admit(&peer, key);
    }
    let mut i = 0;
    group.bench_function("governor_100k_keys", |b| {
        b.iter(|| {
            i = if i + 1 == KEYS { 0 } else { i + 1 };
            governor_admit(&peer, &keys[i]);
        })
    });

    let limiter = Limiter::new(MemoryStore::new());
    for key in &keys {
        admit(&limiter, &rule, key);
    }
    let mut i = 0;
    group.bench_function("memory_store_100k_keys", |b| {
        b.iter(|| {
            i = if i + 1 == KEYS { 0 } else { i + 1 };
            admit(&limiter, &rule, &keys[i]);
        })
    });

    let limiter = Limiter::new(MemoryStore::new());
    for key in &keys {
        admit(&limiter, &gcra, key);
    }
    let mut i = 0;
    group.bench_function("memory_store_gcra_100k_keys", |b| {
        b.iter(|| {
            i = if i + 1 == KEYS { 0 } else { i + 1 };
            admit(&limiter, &gcra, &keys[i]);
        })
    });
    group.bench_function("memory_store_gcra_100k_keys_now", |b| {
        b.iter(|| {
            i = if i + 1 == KEYS { 0 } else { i + 1 };
            admit_now(&limiter, &gcra, &keys[i]);
        })
    });
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let rule = store_rule();
    let keys = keys();
    let mut group = c.benchmark_group("two_threads");

    let counter = AtomicU64::new(0);
    group.bench_function("baseline_atomic_fetch_add", |b| {
        b.iter_custom(|iters| {
            contended(iters, |_, n| {
                for _ in 0..n {
                    black_box(counter.fetch_add(1, Ordering::AcqRel));
                }
            })
        })
    });

    let map: Mutex<HashMap<Box<[u8]>, u64>> =
        Mutex::new(keys.iter().map(|k| (k.clone(), 0)).collect());
    group.bench_function("baseline_mutex_hashmap_one_key", |b| {
        b.iter_custom(|iters| {
            contended(iters, |_, n| {
                for _ in 0..n {
                    let mut map = map.lock();
                    *map.get_mut(black_box(&*keys[0])).expect("prefilled") += 1;
                }
            })
        })
    });

    let hot: Box<[u8]> = Box::from(&b"hot-key"[..]);
    let peer = governor();
    group.bench_function("governor_one_key", |b| {
        b.iter_custom(|iters| {
            contended(iters, |_, n| {
                for _ in 0..n {
                    governor_admit(&peer, &hot);
                }
            })
        })
    });

    let limiter = Limiter::new(MemoryStore::new());
    group.bench_function("memory_store_one_key", |b| {
        b.iter_custom(|iters| {
            contended(iters, |_, n| {
                for _ in 0..n {
                    admit(&limiter, &rule, &hot);
                }
            })
        })
    });

    let peer = governor();
    for key in &keys {
        governor_admit(&peer, key);
    }
    let per_thread = KEYS / THREADS;
    group.bench_function("governor_distinct_keys", |b| {
        b.iter_custom(|iters| {
            contended(iters, |t, n| {
                let mine = &keys[t * per_thread..(t + 1) * per_thread];
                for key in mine.iter().cycle().take(n as usize) {
                    governor_admit(&peer, key);
                }
            })
        })
    });

    let limiter = Limiter::new(MemoryStore::new());
    for key in &keys {
        admit(&limiter, &rule, key);
    }
    // Each thread cycles through its own half of the keys.
    group.bench_function("memory_store_distinct_keys", |b| {
        b.iter_custom(|iters| {
            contended(iters, |t, n| {
                let mine = &keys[t * per_thread..(t + 1) * per_thread];
                for key in mine.iter().cycle().take(n as usize) {
                    admit(&limiter, &rule, key);
                }
            })
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = each_algorithm, clocks, single_thread, two_threads
}
criterion_main!(benches);
