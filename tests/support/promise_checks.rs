//! The brute-force checks of `promises`: each takes a lane's standing admissions, sorted
//! by the instant they pass, and says where the rule's promise breaks. Integers only: a
//! rate is `amount` units per `period` µs, compared by cross-multiplying.

use super::promises::{Expect, Item, Lock};

/// Names an admission in a message.
fn show(i: &Item) -> String {
    format!(
        "{}u at {} (decided at {}, verb {})",
        i.units, i.at, i.arrival, i.seq
    )
}

/// An epoch-aligned fixed window: at most `limit` units in each `[k·window, (k+1)·window)`.
pub fn epoch_windows(items: &[&Item], limit: u64, window: u64) -> Result<(), String> {
    let mut sums = std::collections::BTreeMap::<u64, u64>::new();
    for i in items {
        *sums.entry(i.at / window).or_default() += i.units;
    }
    match sums.into_iter().find(|&(_, sum)| sum > limit) {
        Some((k, sum)) => Err(format!(
            "{sum} units pass in the window [{}, {}) of limit {limit}: {:?}",
            k * window,
            (k + 1) * window,
            items
                .iter()
                .filter(|i| i.at / window == k)
                .map(|i| show(i))
                .collect::<Vec<_>>()
        )),
        None => Ok(()),
    }
}

/// No half-open interval `[t, t + window)` holds more than `most` units (a sliding log:
/// `limit`; a first-hit fixed window, whose windows are disjoint and `window` long
/// wherever they start: `2 × limit`, its documented boundary burst).
pub fn any_interval(items: &[&Item], most: u64, window: u64) -> Result<(), String> {
    for (k, first) in items.iter().enumerate() {
        let inside: Vec<&&Item> = items[k..]
            .iter()
            .take_while(|i| i.at < first.at.saturating_add(window))
            .collect();
        let sum: u64 = inside.iter().map(|i| i.units).sum();
        if sum > most {
            return Err(format!(
                "{sum} units pass within [{}, {}), at most {most} may: {:?}",
                first.at,
                first.at + window,
                inside.iter().map(|i| show(i)).collect::<Vec<_>>()
            ));
        }
    }
    Ok(())
}

/// A sliding window counter: every admission `m` kept `⌈previous × (window − elapsed) /
/// window⌉ + current ≤ limit` when it was decided, where `current` holds the units of its
/// epoch window decided up to it (itself included), `previous` those of the window before
/// decided before it, and `elapsed` is its instant's distance into its window. Units given
/// back only lighten both sides, so the standing admissions must still keep it.
pub fn counter(items: &[&Item], limit: u64, window: u64) -> Result<(), String> {
    for m in items {
        let k = m.at / window;
        let decided_by = |i: &&&Item| i.seq <= m.seq;
        let current: u64 = items
            .iter()
            .filter(|i| i.at / window == k)
            .filter(decided_by)
            .map(|i| i.units)
            .sum();
        let previous: u64 = items
            .iter()
            .filter(|i| k > 0 && i.at / window == k - 1)
            .filter(decided_by)
            .map(|i| i.units)
            .sum();
        let remaining = u128::from(window - m.at % window);
        let weight = (u128::from(previous) * remaining).div_ceil(u128::from(window));
        if weight + u128::from(current) > u128::from(limit) {
            return Err(format!(
                "{} passed with ⌈{previous} × {remaining}/{window}⌉ + {current} > {limit}",
                show(m)
            ));
        }
    }
    Ok(())
}

/// A token bucket or GCRA: over every interval `[a, b]` between two admissions, the units
/// admitted are at most `most(b − a + 1)` (burst + rate × length, as `Spec::admits_within`
/// gives it).
pub fn bucket(items: &[&Item], most: impl Fn(u64) -> u128) -> Result<(), String> {
    for (k, first) in items.iter().enumerate() {
        let mut sum = 0u128;
        for last in &items[k..] {
            sum += u128::from(last.units);
            let bound = most(last.at - first.at + 1);
            if sum > bound {
                return Err(format!(
                    "{sum} units pass within [{}, {}], at most {bound} may: {:?}",
                    first.at,
                    last.at,
                    items[k..]
                        .iter()
                        .take_while(|i| i.at <= last.at)
                        .map(|i| show(i))
                        .collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(())
}

/// The water one admission still has queued at `t`, in units × `period` (it drains at
/// `amount` per µs once the request has left at `at`). The release is a whole µs rounded
/// up from the exact drain, which may have begun up to a µs before it: the least water.
fn water(i: &Item, t: u64, amount: u64, period: u64) -> u128 {
    let full = u128::from(i.units) * u128::from(period);
    let drained = u128::from((t + 1).saturating_sub(i.at)) * u128::from(amount);
    full.saturating_sub(drained)
}

/// A leaky bucket's queue never holds more than `capacity` units: at each admission's
/// arrival, the water of the admissions decided up to it (itself included) fits.
pub fn queue(items: &[&Item], capacity: u64, amount: u64, period: u64) -> Result<(), String> {
    for j in items {
        let level: u128 = items
            .iter()
            .filter(|i| i.seq <= j.seq)
            .map(|i| water(i, j.arrival, amount, period))
            .sum();
        if level > u128::from(capacity) * u128::from(period) {
            return Err(format!(
                "the queue holds {level}/{period} units > {capacity} when {} arrives",
                show(j)
            ));
        }
    }
    Ok(())
}

/// A leaky bucket's releases: no two requests leave closer than the units of the first
/// take to drain (one drain interval per unit, to the µs), whichever was decided first; brute force
/// over every run of releases `s ..= j`: the units of those before `j` need `units ×
/// period / amount` µs between the first and `j` (less `extra` units the docs forgive).
pub fn releases(items: &[&Item], amount: u64, period: u64, extra: u64) -> Result<(), String> {
    for (k, s) in items.iter().enumerate() {
        let mut ahead = 0u128;
        for (n, j) in items[k + 1..].iter().enumerate() {
            ahead += u128::from(items[k + n].units);
            let ahead = ahead.saturating_sub(u128::from(extra));
            // Releases fall on whole µs, rounded up from the exact drain: a gap may be
            // short of the exact one by less than a µs, never by one.
            let gap = u128::from(j.at - s.at + 1) * u128::from(amount);
            if gap <= ahead * u128::from(period) {
                return Err(format!(
                    "{} leaves {} µs after {}, with {ahead} units between (one per {period}/{amount} µs): {:?}",
                    show(j),
                    j.at - s.at,
                    show(s),
                    items[k..=k + n + 1].iter().map(|i| show(i)).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(())
}

/// A refusal as the penalty counts it.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    pub seq: u64,
    pub made: u64,
    pub counted: u64,
    pub certain: bool,
}

/// Whether `refusals` (before the verb `seq`, after the last reset before it) lock the key
/// at `now`: "denials are counted in a window that opens at the first denial and lasts
/// `within`" (`Penalty`), and `after` of them lock it for `lock_for`. A deferred refusal
/// counts at the instant it was made or at the one it was counted (the docs leave it
/// open), and an uncertain one may or may not count: the key must be locked when every
/// reading locks it, and free when none does.
/// With `this`, the verb's own refusal counts too (the refusal that locks a key is
/// answered `Locked`).
pub fn expect_lock(
    refusals: &[Counted],
    resets: &[u64],
    lock: Lock,
    (seq, now): (u64, u64),
    this: Option<Counted>,
) -> Expect {
    let since = resets
        .iter()
        .copied()
        .filter(|&r| r < seq)
        .max()
        .unwrap_or(0);
    let relevant: Vec<Counted> = refusals
        .iter()
        .copied()
        .filter(|r| r.seq > since && r.seq < seq)
        .chain(this)
        .collect();
    let uncertain: Vec<usize> = (0..relevant.len())
        .filter(|&k| !relevant[k].certain)
        .collect();
    if uncertain.len() > 6 {
        return Expect::Either;
    }
    let (mut locked, mut free) = (false, false);
    for at_made in [false, true] {
        for mask in 0u32..(1 << uncertain.len()) {
            let counted = relevant.iter().enumerate().filter(|(k, r)| {
                r.certain
                    || uncertain
                        .iter()
                        .position(|u| u == k)
                        .is_some_and(|p| mask & (1 << p) != 0)
            });
            let (mut start, mut count, mut until) = (0u64, 0u64, 0u64);
            for (_, r) in counted {
                let t = if at_made { r.made } else { r.counted };
                if count == 0 || start.saturating_add(lock.within) <= t {
                    (start, count) = (t, 0);
                }
                count += 1;
                if count >= lock.after {
                    (until, count) = (t.saturating_add(lock.lock_for), 0);
                }
            }
            if until > now || this.is_some() && until == now.saturating_add(lock.lock_for) {
                locked = true;
            } else {
                free = true;
            }
        }
    }
    match (locked, free) {
        (true, false) => Expect::Locked,
        (false, true) => Expect::Free,
        _ => Expect::Either,
    }
}
