//! tollgate's in-process decisions against governor's, interleaved in one process, as ratios:
//! the quick in-process part of `scripts/guard.sh`, and the source of the "In process" table
//! of BENCHMARKS.md.
//!
//! `cargo bench -p tollgate-bench --bench inproc` (about 20 s once built). Every case admits
//! and writes: a GCRA of 1 per second with a burst of 2^30 on both sides (governor's
//! `DefaultKeyedRateLimiter::check_key`, keys `Box<[u8]>`). tollgate's cases are
//! `Limiter::check` on a batch of one and `Limiter::check_one`, awaited inside one async
//! block (polled with a no-op waker, as a runtime would poll the task), and
//! `Limiter::check_now` (synchronous, as `check_key` is called). "hot" is one key, "100k" cycles
//! through 100,000 keys made beforehand, in another order than they were made in (each
//! batch of decisions goes on where the last one stopped), "2 threads" runs both threads
//! from a barrier (on the 100k keys, half the keys apart) and reports the wall time over all
//! decisions. Each round times every case for `INPROC_MS` milliseconds (default 150), in a
//! rotating order; the printed ratio is the median over `INPROC_ROUNDS` rounds (default 7) of
//! the case's ns over governor's in the same round. `INPROC_SCENES` (say `2 threads, hot`) runs only the scenes whose name starts with it, to
//! profile one (`perf record`).

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{store::MemoryStore, Check, Limiter, Rate, Rule};

const KEYS: usize = 100_000;

/// A row group: its name, the keys it cycles through, and whether two threads decide.
type Scene<'a> = (&'a str, &'a [Box<[u8]>], bool);

/// Polls a future that is ready at once, as every `MemoryStore` future is.
fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
    }
}

/// Who decides, and how.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Path {
    Governor,
    /// `Limiter::check` on a batch of one, awaited.
    Check,
    /// `Limiter::check_one`, awaited.
    CheckOne,
    /// `Limiter::check_now` on a batch of one.
    CheckNow,
}

const PATHS: [Path; 4] = [Path::Governor, Path::Check, Path::CheckOne, Path::CheckNow];

struct Deciders {
    governor: DefaultKeyedRateLimiter<Box<[u8]>>,
    limiter: Limiter<MemoryStore>,
    rule: Rule,
}

impl Deciders {
    fn new(keys: &[Box<[u8]>]) -> Self {
        let burst = NonZeroU32::new(1 << 30).expect("non-zero");
        let deciders = Self {
            governor: RateLimiter::keyed(Quota::per_second(NonZeroU32::MIN).allow_burst(burst)),
            limiter: Limiter::new(MemoryStore::new()),
            rule: Rule::gcra("api", 1 << 30, Rate::per_second(1)),
        };
        for key in keys {
            deciders.run(Path::Governor, std::slice::from_ref(key), 0, 1);
            deciders.run(Path::CheckNow, std::slice::from_ref(key), 0, 1);
        }
        deciders
    }

    /// `n` decisions on `keys` in turn from `keys[from]`; every one must admit. Returns
    /// where the next batch goes on.
    fn run(&self, path: Path, keys: &[Box<[u8]>], from: usize, n: usize) -> usize {
        let (limiter, rule) = (&self.limiter, &self.rule);
        let mut admitted = 0;
        let (tail, head) = keys.split_at(from);
        let keys = head.iter().chain(tail).cycle().take(n);
        match path {
            Path::Governor => {
                for key in keys {
                    admitted += usize::from(self.governor.check_key(black_box(key)).is_ok());
                }
            }
            Path::CheckNow => {
                for key in keys {
                    let outcome = limiter.check_now(&[Check::new(rule, black_box(key))]);
                    admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
                }
            }
            Path::Check => ready(async {
                for key in keys {
                    let outcome = limiter.check(&[Check::new(rule, black_box(key))]).await;
                    admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
                }
            }),
            Path::CheckOne => ready(async {
                for key in keys {
                    let outcome = limiter.check_one(rule, black_box(&**key)).await;
                    admitted += usize::from(outcome.is_ok_and(|o| o.is_admitted()));
                }
            }),
        }
        assert_eq!(admitted, n, "{path:?} admits every decision");
        (from + n) % (head.len() + tail.len())
    }

    /// ns per decision over `budget`, in batches of `chunk` decisions.
    fn time(&self, path: Path, keys: &[Box<[u8]>], budget: Duration) -> f64 {
        let chunk = 10_000;
        let (start, mut n, mut from) = (Instant::now(), 0, 0);
        while start.elapsed() < budget {
            from = self.run(path, keys, from, chunk);
            n += chunk;
        }
        start.elapsed().as_nanos() as f64 / n as f64
    }

    /// Wall ns per decision with two threads deciding on `keys` from a barrier, the second
    /// starting half the keys on.
    fn time_two_threads(&self, path: Path, keys: &[Box<[u8]>], budget: Duration) -> f64 {
        let barrier = Barrier::new(2);
        let n = thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|t| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        let (start, mut n) = (Instant::now(), 0);
                        let mut from = t * keys.len() / 2;
                        while start.elapsed() < budget {
                            from = self.run(path, keys, from, 10_000);
                            n += 10_000;
                        }
                        (n, start.elapsed())
                    })
                })
                .collect();
            let done: Vec<(usize, Duration)> = workers
                .into_iter()
                .map(|w| w.join().expect("bench thread"))
                .collect();
            let total: usize = done.iter().map(|d| d.0).sum();
            let wall = done.iter().map(|d| d.1).max().unwrap_or_default();
            wall.as_nanos() as f64 / total as f64
        });
        n
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let budget = Duration::from_millis(env_or("INPROC_MS", 150));
    let rounds: usize = env_or("INPROC_ROUNDS", 7);
    let keys: Vec<Box<[u8]>> = (0..KEYS)
        .map(|i| format!("client-{i:06}").into_bytes().into_boxed_slice())
        .collect();
    let hot: Vec<Box<[u8]>> = vec![Box::from(&b"hot-key"[..])];
    let deciders = Deciders::new(&keys);
    // Keys come back in another order than they were first seen in (a stride through
    // them), as a server's clients do. Governor's map holds a copy of each key, allocated
    // in the order they were first seen: `INPROC_SHUFFLE=0` visits them in that order, where
    // its key reads stream through memory as no server's would.
    let keys: Vec<Box<[u8]>> = if env_or("INPROC_SHUFFLE", 1) == 1 {
        (0..KEYS).map(|i| keys[i * 7919 % KEYS].clone()).collect()
    } else {
        keys
    };
    let scenes: [Scene<'_>; 4] = [
        ("hot", &hot, false),
        ("100k", &keys, false),
        ("2 threads, hot", &hot, true),
        ("2 threads, 100k", &keys, true),
    ];
    let (limiter, rule) = (&deciders.limiter, &deciders.rule);
    let batch = [Check::new(rule, b"k")];
    println!(
        "sizes: outcome {} bytes, `check` future {}, `check_one` future {}",
        std::mem::size_of::<tollgate::Outcome>(),
        std::mem::size_of_val(&limiter.check(&batch)),
        std::mem::size_of_val(&limiter.check_one(rule, b"k")),
    );
    println!("| keys | path | ns (median) | vs governor (median of rounds) |");
    println!("|---|---|---:|---:|");
    let only: String = env_or("INPROC_SCENES", String::new());
    for (scene, keys, threads) in scenes.into_iter().filter(|s| s.0.starts_with(&*only)) {
        let paths: &[Path] = if threads {
            &[Path::Governor, Path::CheckNow, Path::Check]
        } else {
            &PATHS
        };
        let mut ns = vec![Vec::new(); paths.len()];
        let mut ratios = vec![Vec::new(); paths.len()];
        for round in 0..rounds {
            let mut this = vec![0.0; paths.len()];
            for k in 0..paths.len() {
                let i = (k + round) % paths.len();
                this[i] = if threads {
                    deciders.time_two_threads(paths[i], keys, budget)
                } else {
                    deciders.time(paths[i], keys, budget)
                };
            }
            for i in 0..paths.len() {
                ns[i].push(this[i]);
                ratios[i].push(this[i] / this[0]);
            }
        }
        for (i, path) in paths.iter().enumerate() {
            let name = match path {
                Path::Governor => "governor `check_key`",
                Path::Check => "`check` (awaited)",
                Path::CheckOne => "`check_one` (awaited)",
                Path::CheckNow => "`check_now`",
            };
            println!(
                "| {scene} | {name} | {:.1} | {:.2}× |",
                median(ns[i].clone()),
                median(ratios[i].clone())
            );
        }
    }
}
