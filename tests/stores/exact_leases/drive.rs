//! Three `Leased` instances over one store on tokio's paused clock, the store's clock
//! following it, played through a seeded schedule; every admitted request is recorded at
//! the instant it passed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::store::{Health, Leased, Store};
use tollgate::{Check, Clock, Limiter, Outcome, Rate, Rule, RuleOutcome, StoreError, StoredKey};

use super::reference::{Pass, Promise, Rng};

/// The instant the stores' clocks start at.
pub const T0: u64 = crate::support::EPOCH;

/// The store's clock: tokio's (paused) time since `origin`, from `T0`, so that the store's
/// instants and the instants requests pass at are one time line.
#[derive(Debug, Clone)]
pub struct TokioClock(pub Instant);

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        T0 + self.0.elapsed().as_micros() as u64
    }
}

/// One instance's way to the store, which its death cuts: every call fails from then on, so
/// the end of its lease never reaches the store. Counts the leases taken through it.
#[derive(Clone)]
pub struct Cut<S> {
    inner: S,
    dead: Arc<AtomicBool>,
    pub leases: Arc<AtomicU64>,
}

impl<S: Store> Cut<S> {
    fn up(&self) -> Result<(), StoreError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the instance is dead".into()));
        }
        Ok(())
    }
}

impl<S: Store> Store for Cut<S> {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        self.up()?;
        self.inner.check(batch, wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.up()?;
        self.leases.fetch_add(1, Ordering::SeqCst);
        self.inner.lease(check, term, ending).await
    }
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        if let Err(e) = self.up() {
            return Some(Err(e));
        }
        self.inner.try_check_now(batch, wait)
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.up()?;
        self.inner.peek(check).await
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.up()?;
        self.inner.refund(batch, outcome).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.up()?;
        self.inner.overdraw(batch).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.up()?;
        self.inner.count_denials(batch, ago).await
    }
    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        self.up()?;
        self.inner.reset(rule, key).await
    }
    fn health(&self) -> Health {
        Health::Healthy
    }
}

/// The two algorithms that lease, both promising a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Gcra,
    Bucket,
}

/// One configuration of the leased rule: its algorithm, burst and rate (`amount` per
/// `period` µs), and the instances' lease of `units` for `term` µs.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub algo: Algo,
    pub burst: u64,
    pub amount: u64,
    pub period: u64,
    pub units: u64,
    pub term: u64,
}

impl Config {
    /// A random configuration: a lease of up to a third of the burst, whose term is long
    /// enough for the bucket to refill within it or not, depending on the rate.
    pub fn random(rng: &mut Rng) -> Self {
        let algo = if rng.one_in(2) {
            Algo::Gcra
        } else {
            Algo::Bucket
        };
        let burst = rng.between(4, 30);
        let term = [20_000, 50_000, 100_000][rng.between(0, 2) as usize] + rng.between(0, 999);
        let fill = rng.between(term / 4, 2 * term);
        let amount = rng.between(1, 3);
        Self {
            algo,
            burst,
            amount,
            period: (fill * amount / burst).max(1),
            units: rng.between(1, (burst / 3).max(2)),
            term,
        }
    }

    /// The same rule name with another burst or rate, whose burst still holds every unit
    /// three instances may have parked under this one.
    pub fn reloaded(&self, rng: &mut Rng) -> Self {
        let burst = rng
            .between(3 * self.units, 2 * self.burst)
            .max(3 * self.units);
        let amount = rng.between(1, 3);
        let fill = rng.between(self.term / 4, 2 * self.term);
        Self {
            burst,
            amount,
            period: (fill * amount / burst).max(1),
            ..*self
        }
    }

    pub fn rule(&self) -> Rule {
        let rate = Rate::new(self.amount, Duration::from_micros(self.period));
        match self.algo {
            Algo::Gcra => Rule::gcra("global", self.burst, rate),
            Algo::Bucket => Rule::token_bucket("global", self.burst, rate),
        }
    }

    pub fn promise(&self) -> Promise {
        Promise {
            burst: self.burst,
            amount: self.amount,
            period: self.period,
        }
    }

    pub fn term(&self) -> Duration {
        Duration::from_micros(self.term)
    }
}

/// An instance: its way to the store, its limiter, and what it decides with.
pub struct Instance<S: Store + Clone> {
    pub line: Cut<S>,
    pub limiter: Limiter<Leased<Cut<S>>>,
    pub rule: Rule,
    /// After a reload, the `Leased` of the old rule and its lease's units, asked only for
    /// what its leases answer at once, until one cannot.
    pub old: Option<(Leased<Cut<S>>, Rule, u64)>,
    pub dead: bool,
}

/// Three instances over one store, and the passes seen.
pub struct Fleet<S: Store + Clone> {
    pub origin: Instant,
    pub instances: Vec<Instance<S>>,
    pub passes: Vec<Pass>,
}

/// A `Leased` limiter of `config` over `line`.
pub fn leased<S: Store + Clone>(line: &Cut<S>, config: &Config) -> Limiter<Leased<Cut<S>>> {
    let leased = Leased::new(line.clone()).lease(&config.rule(), config.units, config.term());
    Limiter::new(leased.expect("the rule leases"))
}

impl<S: Store + Clone> Fleet<S> {
    /// `n` instances leasing `config`'s rule from `store`, whose clock reads `origin`.
    pub fn new(store: &S, origin: Instant, config: &Config, n: usize) -> Self {
        let instances = (0..n)
            .map(|_| {
                let line = Cut {
                    inner: store.clone(),
                    dead: Arc::default(),
                    leases: Arc::default(),
                };
                Instance {
                    limiter: leased(&line, config),
                    line,
                    rule: config.rule(),
                    old: None,
                    dead: false,
                }
            })
            .collect();
        Self {
            origin,
            instances,
            passes: Vec::new(),
        }
    }

    /// Tokio's time since the origin, in µs.
    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// Moves tokio's clock to `at` µs after the origin (timers due meanwhile fire).
    pub async fn advance_to(&self, at: u64) {
        let target = self.origin + Duration::from_micros(at);
        let now = Instant::now();
        if target > now {
            tokio::time::advance(target - now).await;
        }
    }

    /// Instance `i` asks for `cost` units of `key`; an admission passes now.
    pub async fn request(&mut self, i: usize, key: &[u8], cost: u64) -> bool {
        let admitted = match self.answer_from_old_lease(i, key, cost) {
            Some(admitted) => admitted,
            None => {
                let instance = &self.instances[i];
                let outcome = if cost == 1 {
                    instance.limiter.check_one(&instance.rule, key).await
                } else {
                    let batch = [Check::new(&instance.rule, key).with_cost(cost)];
                    instance.limiter.check(&batch).await
                };
                outcome
                    .expect("a live instance reaches the store")
                    .is_admitted()
            }
        };
        if admitted {
            self.passes.push((self.now(), cost));
        }
        admitted
    }

    /// What the old rule's lease answers at once after a reload; `None` (and the old
    /// `Leased` put aside) when it cannot: the instance has moved to the new rule.
    fn answer_from_old_lease(&mut self, i: usize, key: &[u8], cost: u64) -> Option<bool> {
        let (old, rule, units) = self.instances[i].old.as_ref()?;
        let batch = [Check::new(rule, key).with_cost(cost)];
        // A cost above the lease would go to the store, which the old rule no longer asks.
        let answer = (cost <= *units)
            .then(|| old.try_check_now(&batch, Duration::ZERO))
            .flatten();
        match answer {
            Some(outcome) => Some(outcome.expect("a lease answers").is_admitted()),
            None => {
                self.instances[i].old = None;
                None
            }
        }
    }

    /// Instance `i` dies: its requests stop, and its store calls fail from now on.
    pub fn kill(&mut self, i: usize) {
        self.instances[i].dead = true;
        self.instances[i].line.dead.store(true, Ordering::SeqCst);
    }

    /// The leases the instances took.
    pub fn leases(&self) -> Vec<u64> {
        let count = |i: &Instance<S>| i.line.leases.load(Ordering::SeqCst);
        self.instances.iter().map(count).collect()
    }
}
