//! The rule's promise, written apart from tollgate's models: what one token bucket, full at
//! a start, could have admitted, and the worst burst a checker sees over any window. Both
//! read only the instants requests passed at and their costs.

/// A request that passed: the instant (µs) and its cost.
pub type Pass = (u64, u64);

/// A token bucket of `burst` units refilled at `amount` units per `period` µs: the promise
/// of a GCRA of that burst and rate, and of a smooth token bucket of that capacity.
#[derive(Debug, Clone, Copy)]
pub struct Promise {
    pub burst: u64,
    pub amount: u64,
    pub period: u64,
}

impl Promise {
    /// The first pass (its index in `passes`, sorted by instant, none before `start`) one
    /// bucket full at `start` could not have admitted, with the tokens it held then.
    ///
    /// Tokens are scaled by `period`, so a µs refills `amount` of them exactly, and the
    /// bucket holds at most `burst × period`; a pass takes `cost × period` and the level
    /// never goes below zero.
    pub fn first_excess(&self, start: u64, passes: &[Pass]) -> Option<(usize, f64)> {
        let full = u128::from(self.burst) * u128::from(self.period);
        let (mut level, mut last) = (full, start);
        for (i, &(at, cost)) in passes.iter().enumerate() {
            assert!(at >= last, "passes out of order at {i}: {at} < {last}");
            let refill = u128::from(at - last) * u128::from(self.amount);
            level = (level + refill).min(full);
            last = at;
            let need = u128::from(cost) * u128::from(self.period);
            if level < need {
                return Some((i, level as f64 / self.period as f64));
            }
            level -= need;
        }
        None
    }

    /// The worst burst a checker sees, scaled by `period`: the most of
    /// `N(s, e) × period − amount × (e − s)` over windows `[s, e]` (`N` the units that passed
    /// within, both ends included), 0 for no pass. Within the promise iff at most
    /// `burst × period`.
    ///
    /// A window worth looking at starts and ends at passes: with `C(j)` the units passed up
    /// to pass `j`, the window from pass `i` to pass `j` is
    /// `(C(j) × period − amount × t(j)) − (C(i−1) × period − amount × t(i))`, so the best
    /// `i` for each `j` is the least of the second term so far (passes at one instant are
    /// one group: a window takes all of them or none).
    pub fn worst_burst_scaled(&self, passes: &[Pass]) -> i128 {
        let (amount, period) = (i128::from(self.amount), i128::from(self.period));
        let (mut before, mut least, mut worst) = (0i128, i128::MAX, 0i128);
        let mut i = 0;
        while i < passes.len() {
            let at = i128::from(passes[i].0);
            least = least.min(before * period - amount * at);
            while i < passes.len() && i128::from(passes[i].0) == at {
                before += i128::from(passes[i].1);
                i += 1;
            }
            worst = worst.max(before * period - amount * at - least);
        }
        worst
    }

    /// The worst burst in units (see [`worst_burst_scaled`](Self::worst_burst_scaled)).
    pub fn worst_burst(&self, passes: &[Pass]) -> f64 {
        self.worst_burst_scaled(passes) as f64 / self.period as f64
    }

    /// Both readings of the promise for `passes` (sorted) since a bucket full at `start`:
    /// `Err` says where they are exceeded. They agree, or the reference itself is wrong.
    pub fn check(&self, start: u64, passes: &[Pass]) -> Result<(), String> {
        let excess = self.first_excess(start, passes);
        let worst = self.worst_burst_scaled(passes);
        let within = worst <= i128::from(self.burst) * i128::from(self.period);
        assert_eq!(
            excess.is_none(),
            within,
            "the reference disagrees with itself on {self:?}: {excess:?}, worst {worst}"
        );
        match excess {
            None => Ok(()),
            Some((i, level)) => Err(format!(
                "{self:?}: pass {i} {:?} finds {level:.3} units in the bucket; the worst burst \
                 seen is {:.3} units (burst {}); passes around it: {:?}",
                passes[i],
                self.worst_burst(passes),
                self.burst,
                &passes[i.saturating_sub(8)..(i + 3).min(passes.len())],
            )),
        }
    }
}

/// A small seeded generator (SplitMix64): the schedules repeat from their seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `range` (inclusive).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// `true` once in `n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.next_u64().is_multiple_of(n)
    }
}

/// Three units at once, then one a period later: within a burst of 3 at 1 per 1,000 µs.
#[test]
fn a_burst_then_the_rate_conforms() {
    let promise = Promise {
        burst: 3,
        amount: 1,
        period: 1_000,
    };
    let passes = [(0, 1), (0, 1), (0, 1), (1_000, 1), (2_000, 1)];
    assert_eq!(promise.check(0, &passes), Ok(()));
    assert_eq!(promise.worst_burst(&passes), 3.0);
}

/// One unit a µs too early is one unit over: the bucket holds 0.999 of it, and the window
/// from the first pass to it sees 4 units less 0.999 of refill.
#[test]
fn one_unit_a_microsecond_early_exceeds() {
    let promise = Promise {
        burst: 3,
        amount: 1,
        period: 1_000,
    };
    let passes = [(0, 2), (0, 1), (999, 1)];
    assert_eq!(promise.first_excess(0, &passes), Some((2, 0.999)));
    assert_eq!(promise.worst_burst(&passes), 3.001);
    assert!(promise.check(0, &passes).is_err());
    // A pass dearer than the burst never fits.
    assert!(promise.check(0, &[(0, 4)]).is_err());
}

/// A rate with a fraction of a µs per unit (3 units every 5 µs) and a bucket that caps its
/// refill: a long idle gap refills to the burst, never past it.
#[test]
fn fractions_and_the_cap_are_exact() {
    let promise = Promise {
        burst: 6,
        amount: 3,
        period: 5,
    };
    // Emptied at 0, then 3 units every 5 µs: exactly the rate.
    let at_rate: Vec<Pass> = [(0, 6)]
        .into_iter()
        .chain((1..=20).map(|k| (5 * k, 3)))
        .collect();
    assert_eq!(promise.check(0, &at_rate), Ok(()));
    // One unit more at 7 µs: 4.2 units refilled, 5 taken since 0.
    assert!(promise.check(0, &[(0, 6), (7, 4), (7, 1)]).is_err());
    // After a gap of a year the bucket holds 6, not more.
    let year = 365 * 24 * 3_600 * 1_000_000;
    assert_eq!(promise.check(0, &[(0, 6), (year, 6)]), Ok(()));
    assert!(promise.check(0, &[(0, 6), (year, 7)]).is_err());
}

/// The walk and the worst window agree on random schedules near the limit (each reading
/// checks the other: `check` asserts that they agree).
#[test]
fn the_walk_and_the_worst_window_agree() {
    let mut rng = Rng::new(47);
    let (mut within, mut over) = (0, 0);
    for _ in 0..2_000 {
        let promise = Promise {
            burst: rng.between(1, 12),
            amount: rng.between(1, 5),
            period: rng.between(1, 40),
        };
        let mut at = 0;
        let passes: Vec<Pass> = (0..rng.between(1, 30))
            .map(|_| {
                at += if rng.one_in(3) { 0 } else { rng.between(0, 30) };
                (at, rng.between(1, 3))
            })
            .collect();
        match promise.check(0, &passes) {
            Ok(()) => within += 1,
            Err(_) => over += 1,
        }
    }
    // Both answers come up often enough for the agreement to mean something.
    assert!(within > 200 && over > 200, "{within} within, {over} over");
}
