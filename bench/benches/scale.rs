//! `MemoryStore` at scale: bytes per key and decisions per second with 10^3, 10^6 and 10^7
//! live keys (one rule, a token bucket whose entries stay live for the whole run).
//!
//! `cargo bench -p tollgate-bench --bench scale` (about a minute and some 2 GiB at 10^7
//! keys; `-- 1000 1000000` picks the sizes). Bytes are counted by a global allocator (live
//! bytes requested from it, so the allocator's own overhead per block is not in them; the
//! process's resident set is printed beside them for that). Results and their reading are in
//! BENCHMARKS.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tollgate::{Limiter, MemoryStore, Rate, Rule};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Decisions timed on warm keys at each size (spread over all of them).
const DECISIONS: u64 = 5_000_000;

fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("MemoryStore futures are ready on first poll"),
    }
}

/// The `i`-th key, `client-` and 8 digits (15 bytes), written into `buf`.
fn key(buf: &mut [u8; 15], mut i: u64) -> &[u8] {
    buf[..7].copy_from_slice(b"client-");
    for d in buf[7..].iter_mut().rev() {
        *d = b'0' + (i % 10) as u8;
        i /= 10;
    }
    &buf[..]
}

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    kib / 1024.0
}

/// CPU time this thread has used, in ns (from `/proc/thread-self/stat`, in clock ticks of
/// 10 ms): on a machine shared with other jobs, wall time says more about them than about
/// the store.
fn thread_cpu_ns() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // The fields after the command (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the command.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks * 1e7
}

fn main() {
    let sizes: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 1_000_000, 10_000_000]
    } else {
        sizes
    };
    // A token bucket of 2^20 refilled at 1 per hour: an entry stays live (not full again)
    // for an hour after its admission, so none expires during the run.
    let rule = Rule::token_bucket("api", 1 << 20, Rate::per_hour(1));
    println!(
        "| keys | bytes per key (allocated) | blocks per key | RSS (MiB) | insert ns/key (CPU) | decision ns (wall) | decision ns (CPU) | decisions/s (CPU) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut buf = [0u8; 15];
    for n in sizes {
        let (bytes_before, blocks_before) = (
            LIVE_BYTES.load(Ordering::Relaxed),
            BLOCKS.load(Ordering::Relaxed),
        );
        let limiter = Limiter::new(MemoryStore::new());
        let cpu = thread_cpu_ns();
        for i in 0..n {
            let outcome = ready(limiter.check_one(&rule, key(&mut buf, i)));
            assert!(outcome.is_ok_and(|o| o.is_admitted()), "the rule admits");
        }
        let insert = thread_cpu_ns() - cpu;
        assert_eq!(limiter.store().len() as u64, n, "every key is live");
        let bytes = LIVE_BYTES.load(Ordering::Relaxed) - bytes_before;
        let blocks = BLOCKS.load(Ordering::Relaxed) - blocks_before;
        let rss = resident_mib();

        // Warm decisions spread over every key: a stride coprime with n visits them all
        // in an order the caches cannot follow.
        let stride = (n / 2 + 1..).find(|s| gcd(*s, n) == 1).unwrap_or(1);
        let mut i = 0;
        let (start, cpu) = (Instant::now(), thread_cpu_ns());
        for _ in 0..DECISIONS {
            i = (i + stride) % n;
            let outcome = ready(limiter.check_one(&rule, black_box(key(&mut buf, i))));
            assert!(outcome.is_ok_and(|o| o.is_admitted()), "the rule admits");
        }
        let cpu = (thread_cpu_ns() - cpu) / DECISIONS as f64;
        let wall = start.elapsed().as_nanos() as f64 / DECISIONS as f64;
        println!(
            "| {n} | {:.1} | {:.2} | {rss:.0} | {:.0} | {wall:.0} | {cpu:.0} | {:.2} M |",
            bytes as f64 / n as f64,
            blocks as f64 / n as f64,
            insert / n as f64,
            1e3 / cpu,
        );
        drop(limiter);
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
