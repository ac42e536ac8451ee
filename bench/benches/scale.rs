//! `MemoryStore` at scale: bytes per key and decisions per second with 10^3, 10^6 and 10^7
//! live keys (one rule, a token bucket whose entries stay live for the whole run).
//!
//! `cargo bench -p tollgate-bench --bench scale` (about a minute and some 2 GiB at 10^7
//! keys; `-- 1000 1000000` picks the sizes). Bytes are counted by a global allocator (live
//! bytes requested from it, so the allocator's own overhead per block is not in them; the
//! process's resident set is printed beside them for that). `-- ipv6` keys the entries by
//! distinct IPv6 /64 networks written as `key::peer_ip()` writes them
//! (`2001:db8:xxxx:xxxx::/64`), under a rule named `per-ip`, and `-- ipv6 long-name` under
//! one named `per-ip-per-hour` (name and key then no longer fit inline). Results and their
//! reading are in BENCHMARKS.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tollgate::{store::MemoryStore, Limiter, Rate, Rule};

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

/// The `i`-th key, written into `buf`: `client-` and 8 digits (15 bytes), or an IPv6 /64
/// network as the peer-IP key writes it, the `i`-th of a scattered sequence.
fn key(buf: &mut Vec<u8>, ipv6: bool, mut i: u64) -> &[u8] {
    buf.clear();
    if ipv6 {
        use std::io::Write;
        // An odd multiplier visits every 32-bit value once, scattered over the /32.
        let low = (i as u32).wrapping_mul(0x9E37_79B9);
        let net = std::net::Ipv6Addr::from((0x2001_0db8u128 << 96) | (u128::from(low) << 64));
        let _ = write!(buf, "{net}/64");
        return buf;
    }
    buf.extend_from_slice(b"client-00000000");
    for d in buf[7..].iter_mut().rev() {
        *d = b'0' + (i % 10) as u8;
        i /= 10;
    }
    buf
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let ipv6 = args.iter().any(|a| a == "ipv6");
    let name = match (ipv6, args.iter().any(|a| a == "long-name")) {
        (false, _) => "api",
        (true, false) => "per-ip",
        (true, true) => "per-ip-per-hour",
    };
    let sizes = if sizes.is_empty() {
        vec![1_000, 1_000_000, 10_000_000]
    } else {
        sizes
    };
    // A token bucket of 2^20 refilled at 1 per hour: an entry stays live (not full again)
    // for an hour after its admission, so none expires during the run.
    let rule = Rule::token_bucket(name, 1 << 20, Rate::per_hour(1));
    println!(
        "rule `{name}`, keys like `{}`",
        String::from_utf8_lossy(key(&mut Vec::new(), ipv6, 7))
    );
    println!(
        "| keys | bytes per key (allocated) | blocks per key | RSS (MiB) | insert ns/key (CPU) | decision ns (wall) | decision ns (CPU) | decisions/s (CPU) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut buf = Vec::with_capacity(64);
    for n in sizes {
        let (bytes_before, blocks_before) = (
            LIVE_BYTES.load(Ordering::Relaxed),
            BLOCKS.load(Ordering::Relaxed),
        );
        // Bounded far above `n`: every key gets an entry of its own.
        let limiter = Limiter::new(MemoryStore::new().max_keys(2 * n as usize));
        let cpu = thread_cpu_ns();
        for i in 0..n {
            let outcome = ready(limiter.check_one(&rule, key(&mut buf, ipv6, i)));
            assert!(outcome.is_ok_and(|o| o.is_admitted()), "the rule admits");
        }
        let insert = thread_cpu_ns() - cpu;
        assert_eq!(limiter.store().stats().keys as u64, n, "every key is live");
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
            let outcome = ready(limiter.check_one(&rule, black_box(key(&mut buf, ipv6, i))));
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
