//! [`Breaker`]: a circuit breaker around a store.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::duration_to_micros;
use crate::decision::{Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::store::check::{Check, Health, Store};
use crate::stored::StoredKey;
use crate::Rule;

/// How long an open [`Breaker`] waits by default before a probe ([`Breaker::open_for`]).
pub(crate) const DEFAULT_OPEN_FOR: Duration = Duration::from_millis(500);

// The breaker's state: calls go to the store; the store failed repeatedly and calls fail at
// once with `CircuitOpen`; one probe is on its way and calls fail at once as when open.
const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// A store behind a circuit breaker.
///
/// After [`failures`](Self::failures) consecutive failures (errors or timeouts, not
/// malformed batches) the breaker **opens**: calls fail at once with
/// [`StoreError::CircuitOpen`]. After [`open_for`](Self::open_for), the next call (or
/// [`health`](Store::health) look) starts one **probe**, the store's [`probe`](Store::probe)
/// on its own task, while calls still fail at once; success closes the breaker, failure
/// reopens it. Without a store probe (or a tokio runtime) that call is the probe. While open
/// or probing, its [`health`](Store::health) is [`Failing`](Health::Failing). Transitions
/// are `tracing` events (target `tollgate::breaker`: `warn` on opening, `info` otherwise).
/// The breaker never retries: the layer's [`FailurePolicy`](crate::layer::FailurePolicy) or
/// a [`Fallback`](super::Fallback) handles failures; the `Fallback`'s example builds one.
/// Configure it before cloning it: clones share the breaker.
#[derive(Clone)]
pub struct Breaker<S> {
    store: S,
    shared: Arc<Circuit>,
}

struct Circuit {
    failures: u32,
    open_for_micros: u64,
    state: AtomicU8,
    consecutive: AtomicU32,
    /// µs after `epoch` the breaker last opened.
    opened_at: AtomicU64,
    probing: AtomicBool,
    epoch: Instant,
}

impl<S> Breaker<S> {
    /// `store` behind a breaker that opens after 3 consecutive failures and probes after 500 ms.
    pub fn new(store: S) -> Self {
        Self {
            store,
            shared: Arc::new(Circuit::closed(
                3,
                duration_to_micros(DEFAULT_OPEN_FOR),
                Instant::now(),
            )),
        }
    }

    /// Opens after `n` consecutive failures (at least 1; default 3).
    pub fn failures(mut self, n: u32) -> Self {
        self.configure(|s| s.failures = n.max(1));
        self
    }

    /// Stays open this long before a probe, and again after a failed one (default 500 ms).
    pub fn open_for(mut self, duration: Duration) -> Self {
        self.configure(|s| s.open_for_micros = duration_to_micros(duration));
        self
    }

    /// A closed circuit of its own, configured by `f` (clones made before keep theirs).
    fn configure(&mut self, f: impl FnOnce(&mut Circuit)) {
        let old = &self.shared;
        let mut fresh = Circuit::closed(old.failures, old.open_for_micros, old.epoch);
        f(&mut fresh);
        self.shared = Arc::new(fresh);
    }

    /// `CLOSED`, `OPEN` or `HALF_OPEN`: what [`health`](Store::health) reports.
    fn state(&self) -> u8 {
        self.shared.state.load(Ordering::Acquire)
    }
}

/// Whether a call may go to the store, and as what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Call,
    Probe,
}

impl Circuit {
    fn closed(failures: u32, open_for_micros: u64, epoch: Instant) -> Self {
        Self {
            failures,
            open_for_micros,
            state: AtomicU8::new(CLOSED),
            consecutive: AtomicU32::new(0),
            opened_at: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            epoch,
        }
    }

    fn now(&self) -> u64 {
        duration_to_micros(self.epoch.elapsed())
    }

    /// Open for `open_for` already, with no probe on its way: loads only.
    fn due(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
            && !self.probing.load(Ordering::Acquire)
            && self.now()
                >= self
                    .opened_at
                    .load(Ordering::Acquire)
                    .saturating_add(self.open_for_micros)
    }

    fn pass(&self) -> Option<Pass> {
        match self.state.load(Ordering::Acquire) {
            CLOSED => Some(Pass::Call),
            OPEN => {
                let opened_at = self.opened_at.load(Ordering::Acquire);
                if self.now() < opened_at.saturating_add(self.open_for_micros) {
                    return None;
                }
                // One probe at a time: whoever flips the flag probes, the rest fail fast.
                if self
                    .probing
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return None;
                }
                if self
                    .state
                    .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // The state changed under us (another probe closed it): go by the new one.
                    self.probing.store(false, Ordering::Release);
                    return (self.state.load(Ordering::Acquire) == CLOSED).then_some(Pass::Call);
                }
                tracing::info!(target: "tollgate::breaker", "circuit half-open: probing the store");
                Some(Pass::Probe)
            }
            _ => None,
        }
    }

    fn succeeded(&self, pass: Pass) {
        match pass {
            // A load first: every healthy call passes here, and a write would make the
            // cores contend for the line.
            Pass::Call => {
                if self.consecutive.load(Ordering::Acquire) != 0 {
                    self.consecutive.store(0, Ordering::Release);
                }
            }
            Pass::Probe => {
                self.consecutive.store(0, Ordering::Release);
                self.state.store(CLOSED, Ordering::Release);
                self.probing.store(false, Ordering::Release);
                tracing::info!(target: "tollgate::breaker", "circuit closed: the store answers again");
            }
        }
    }

    fn failed(&self, pass: Pass, error: &StoreError) {
        match pass {
            Pass::Call => {
                let n = self
                    .consecutive
                    .fetch_add(1, Ordering::AcqRel)
                    .saturating_add(1);
                if n >= self.failures
                    && self
                        .state
                        .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    self.opened_at.store(self.now(), Ordering::Release);
                    tracing::warn!(
                        target: "tollgate::breaker",
                        %error,
                        failures = n,
                        open_for_ms = self.open_for_micros / 1000,
                        "circuit open: calls skip the store"
                    );
                }
            }
            Pass::Probe => {
                self.opened_at.store(self.now(), Ordering::Release);
                self.state.store(OPEN, Ordering::Release);
                self.probing.store(false, Ordering::Release);
                tracing::warn!(
                    target: "tollgate::breaker",
                    %error,
                    open_for_ms = self.open_for_micros / 1000,
                    "circuit open again: the probe failed"
                );
            }
        }
    }

    /// Counts what a call (or probe) it let through answered.
    fn record<T>(&self, pass: Pass, result: &Result<T, StoreError>) {
        match result {
            Ok(_) => self.succeeded(pass),
            Err(e) if e.is_failure() => self.failed(pass, e),
            // A malformed batch says nothing about the store: a probe is only freed.
            Err(_) if pass == Pass::Probe => self.abandoned(),
            Err(_) => {}
        }
    }

    /// A probe whose caller went away: open, with the next call free to probe at once.
    fn abandoned(&self) {
        self.opened_at.store(0, Ordering::Release);
        self.state.store(OPEN, Ordering::Release);
        self.probing.store(false, Ordering::Release);
        tracing::info!(target: "tollgate::breaker", "circuit open: the probe was dropped");
    }
}

/// A call (or probe task) the breaker let through: counts its result, or frees the probe if
/// dropped first. `C` is `&Circuit` for a call, `Arc<Circuit>` for a probe on its own task.
struct PassGuard<C: Deref<Target = Circuit>> {
    shared: C,
    pass: Option<Pass>,
}

impl<C: Deref<Target = Circuit>> PassGuard<C> {
    fn record<T>(mut self, result: &Result<T, StoreError>) {
        if let Some(pass) = self.pass.take() {
            self.shared.record(pass, result);
        }
    }
}

impl<C: Deref<Target = Circuit>> Drop for PassGuard<C> {
    fn drop(&mut self) {
        if self.pass == Some(Pass::Probe) {
            self.shared.abandoned();
        }
    }
}

impl<S: Store> Breaker<S> {
    /// Runs `call` if the breaker lets it through (an in-process store decides as `call`
    /// makes its future).
    async fn guarded<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let Some(pass) = self.shared.pass() else {
            return Err(StoreError::CircuitOpen);
        };
        // The store's own probe runs on a task; without one, this call is the probe.
        if pass == Pass::Probe && self.spawn_probe(|| true) {
            return Err(StoreError::CircuitOpen);
        }
        let guard = PassGuard {
            shared: &*self.shared,
            pass: Some(pass),
        };
        let result = call().await;
        guard.record(&result);
        result
    }

    /// Starts a due probe without a call, so a polled [`health`](Store::health) closes the
    /// breaker with no request.
    fn probe_if_due(&self) {
        if self.shared.due() {
            // Lost the race (another probe, or closed meanwhile): the unsent probe is dropped.
            self.spawn_probe(|| self.shared.pass() == Some(Pass::Probe));
        }
    }

    /// Runs the store's [`probe`](Store::probe) on a task if it has one, we are in a tokio
    /// runtime, and `ours` (asked last) says this probe is due; `false` without a probe.
    fn spawn_probe(&self, ours: impl FnOnce() -> bool) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let Some(probe) = self.store.probe() else {
            return false;
        };
        if ours() {
            let guard = PassGuard {
                shared: Arc::clone(&self.shared),
                pass: Some(Pass::Probe),
            };
            runtime.spawn(async move {
                let result = probe.await;
                guard.record(&result);
            });
        }
        true
    }
}

impl<S: fmt::Debug> fmt::Debug for Breaker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = ["closed", "open", "half-open"][usize::from(self.state())];
        let open_for = Duration::from_micros(self.shared.open_for_micros);
        f.debug_struct("Breaker")
            .field("store", &self.store)
            .field("state", &state)
            .field("failures", &self.shared.failures)
            .field("open_for", &open_for)
            .finish()
    }
}

impl<S: Store> Store for Breaker<S> {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        self.guarded(|| self.store.check(batch, max_wait)).await
    }

    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.guarded(|| self.store.lease(check, term, ending)).await
    }

    /// Asks the store at once while closed; otherwise [`check`](Store::check) answers.
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        if self.state() != CLOSED {
            return None;
        }
        let result = self.store.try_check_now(batch, max_wait)?;
        self.shared.record(Pass::Call, &result);
        Some(result)
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.guarded(|| self.store.peek(check)).await
    }

    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.guarded(|| self.store.refund(batch, outcome)).await
    }

    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.guarded(|| self.store.overdraw(batch)).await
    }

    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.guarded(|| self.store.count_denials(batch, ago)).await
    }

    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        self.guarded(|| self.store.reset(rule, key)).await
    }

    /// The store's own probe: a breaker around a breaker probes the store they guard.
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.store.probe()
    }

    fn health(&self) -> Health {
        match self.state() {
            CLOSED => self.store.health(),
            OPEN => {
                self.probe_if_due();
                Health::Failing
            }
            _ => Health::Failing,
        }
    }

    /// The store's: the breaker opens only on the failures the store has.
    fn outage_health(&self) -> Health {
        self.store.outage_health()
    }
}

#[cfg(test)]
pub(crate) mod tests;
