//! The verbs of `promise_driver`'s run: each asks the store, tells the reference what the
//! store admitted, refused or gave back, and probes the store where a promise is about
//! one answer.

use tollgate::store::Store;
use tollgate::{Check, DenyReason, Outcome, Rule};

use super::promise_driver::{
    delay_of, denial_of, is_queue, us, Asked, Deferred, Held, Kept, Run, MAX_KEYS,
};
use super::promise_schedule::Fate;
use super::promises::{Expect, Slot};

impl<S: Store + Clone> Run<'_, S> {
    pub(crate) async fn check(
        &mut self,
        asked: Asked,
        wait: u64,
        defer: bool,
        via_limiter: bool,
        via: u8,
    ) -> Result<(), String> {
        let seq = self.reference.tick();
        let outcome = {
            let checks = self.checks(&asked, defer);
            let limiter = self.limiter(via);
            if via_limiter {
                limiter.check(&checks).await
            } else {
                limiter.store().check(&checks, us(wait)).await
            }
        }
        .map_err(|e| format!("store error: {e}"))?;
        self.expect_locks(&asked, &outcome, seq)?;
        if outcome.is_admitted() {
            let slots = self.admitted(&asked, &outcome, wait, via);
            self.kept.push(Kept {
                asked,
                outcome,
                slots,
            });
            Ok(())
        } else {
            self.refused(asked, &outcome, defer, via).await
        }
    }

    pub(crate) async fn reserve(&mut self, asked: Asked, wait: u64, via: u8) -> Result<(), String> {
        let seq = self.reference.tick();
        let reservation = {
            let checks = self.checks(&asked, false);
            self.limiter(via).reserve(&checks, us(wait)).await
        }
        .map_err(|e| format!("store error: {e}"))?;
        let outcome = reservation.outcome().clone();
        self.expect_locks(&asked, &outcome, seq)?;
        if !outcome.is_admitted() {
            return self.refused(asked, &outcome, false, via).await;
        }
        let slots = self.admitted(&asked, &outcome, wait, via);
        let removals = (0..asked.specs.len())
            .map(|j| self.reference.last_removal(&self.lane(&asked, j)))
            .collect();
        let at = self.now + delay_of(&outcome);
        self.held.push(Held {
            reservation,
            asked,
            slots,
            made: self.now,
            at,
            removals,
            confirmed: false,
        });
        Ok(())
    }

    /// Tells the reference what an admitted batch took: every rule of the batch counts
    /// the request when it passes. A request that may wait arrives (joins a queue) when it
    /// fits, at most `wait` after it was decided: the reference takes the latest instant,
    /// where the queue ahead of it is lowest.
    fn admitted(
        &mut self,
        asked: &Asked,
        outcome: &Outcome,
        wait: u64,
        via: u8,
    ) -> Vec<Option<Slot>> {
        let at = self.now + delay_of(outcome);
        let arrival = at.min(self.now + wait);
        let instance = self.instance(via);
        for j in 0..asked.specs.len() {
            let lane = self.lane(asked, j);
            for other in (0..self.target.limiters.len()).filter(|&k| k != instance) {
                if self.refused_via.contains(&(lane.clone(), other)) {
                    self.unseen.insert((lane.clone(), other));
                }
            }
        }
        (0..asked.specs.len())
            .map(|j| {
                let took = outcome
                    .rules
                    .get(j)
                    .is_some_and(|r| r.decision.is_admitted());
                (took && asked.cost > 0).then(|| {
                    let lane = self.lane(asked, j);
                    self.took_over |= self.reference.takes_over(&lane, asked.specs[j]);
                    self.reference
                        .admit(lane, asked.specs[j], arrival, at, asked.cost)
                })
            })
            .collect()
    }

    /// Tells the reference the refusals that count, keeps the deferred ones, and probes a
    /// lone rule's `Retry-After`.
    async fn refused(
        &mut self,
        asked: Asked,
        outcome: &Outcome,
        defer: bool,
        via: u8,
    ) -> Result<(), String> {
        let mut deferred = Vec::new();
        for (j, rule) in outcome.rules.iter().enumerate() {
            let lane = self.lane(&asked, j);
            self.refused_via.insert((lane.clone(), self.instance(via)));
            match denial_of(&rule.decision) {
                Some((DenyReason::Limited, _)) if defer => deferred.push(j),
                Some((DenyReason::Limited, _)) => {
                    self.reference.refuse(&lane, self.now, self.now, true)
                }
                Some((DenyReason::CostExceedsCapacity, _)) => {
                    self.reference.refuse(&lane, self.now, self.now, false)
                }
                _ => {}
            }
        }
        if !deferred.is_empty() {
            let refused = Asked {
                specs: deferred.iter().map(|&j| asked.specs[j]).collect(),
                keys: deferred.iter().map(|&j| asked.keys[j].clone()).collect(),
                ..asked.clone()
            };
            let removals = (0..refused.specs.len())
                .map(|j| self.reference.last_removal(&self.lane(&refused, j)))
                .collect();
            self.deferred.push(Deferred {
                asked: refused,
                made: self.now,
                removals,
            });
        }
        match denial_of(&outcome.decision) {
            Some((reason, Some(retry)))
                if self.target.probes && asked.specs.len() == 1 && retry > 0 =>
            {
                self.probe_retry(&asked, via, reason, retry).await
            }
            _ => Ok(()),
        }
    }

    /// A penalty's rule says `Locked` exactly while the refusals counted lock the key, or
    /// when this refusal locks it (then it counts, as it does when the reading is open).
    fn expect_locks(&mut self, asked: &Asked, outcome: &Outcome, seq: u64) -> Result<(), String> {
        for (j, rule) in outcome.rules.iter().enumerate() {
            let Some(lock) = self.reference.specs[asked.specs[j]].lock else {
                continue;
            };
            let lane = self.lane(asked, j);
            let expect = self
                .reference
                .expect_lock(&lane, lock, seq, self.now, false);
            // A request costing more than the rule ever admits is refused as such, locked
            // or not: no wait helps it (`Store::check`: "Locked keys and requests costing
            // more than a rule's capacity are denied without waiting").
            if matches!(
                denial_of(&rule.decision),
                Some((DenyReason::CostExceedsCapacity, _))
            ) {
                continue;
            }
            let locked = matches!(denial_of(&rule.decision), Some((DenyReason::Locked, _)));
            let own = || self.reference.expect_lock(&lane, lock, seq, self.now, true);
            match (expect, locked) {
                (Expect::Locked, false) => {
                    return Err(format!(
                        "rule {j} not locked at {} after the refusals counted: {rule:?}",
                        self.now
                    ))
                }
                (Expect::Free, true) => match own() {
                    Expect::Free => {
                        return Err(format!(
                            "rule {j} locked at {} by fewer refusals than its penalty's",
                            self.now
                        ))
                    }
                    Expect::Locked => self.reference.refuse(&lane, self.now, self.now, true),
                    Expect::Either => self.reference.refuse(&lane, self.now, self.now, false),
                },
                (Expect::Either, true) => self.reference.refuse(&lane, self.now, self.now, false),
                _ => {}
            }
        }
        Ok(())
    }

    /// A retry at the `Retry-After` instant passes (a lock's: is no longer locked), one
    /// µs earlier it does not (`Denial::retry_after`).
    async fn probe_retry(
        &self,
        asked: &Asked,
        via: u8,
        reason: DenyReason,
        retry: u64,
    ) -> Result<(), String> {
        let check = Check::new(&self.rules[asked.specs[0]], &asked.keys[0]).with_cost(asked.cost);
        let store = self.limiter(via).store();
        self.target.clock.set_micros(self.now + retry - 1);
        let before = store.peek(check).await;
        self.target.clock.set_micros(self.now + retry);
        let after = store.peek(check).await;
        self.target.clock.set_micros(self.now);
        let (before, after) = (
            before.map_err(|e| e.to_string())?,
            after.map_err(|e| e.to_string())?,
        );
        let still = matches!(denial_of(&after.decision), Some((DenyReason::Locked, _)));
        // A denial cached by this instance cannot see what another instance admitted on
        // the key since: that moves the real retry later, and Retry-After ignores other
        // clients (`RedisStore::with_deny_cache`). It is never earlier than the truth.
        let unseen = self
            .unseen
            .contains(&(self.lane(asked, 0), self.instance(via)));
        let passes = match reason {
            DenyReason::Locked => !still,
            _ => unseen || after.decision.is_admitted(),
        };
        if before.decision.is_admitted() && self.stale_in_cache(check, via).await {
            return Ok(());
        }
        if before.decision.is_admitted() || !passes {
            return Err(format!(
                "denied ({reason:?}) with Retry-After {retry} µs at {}: a µs earlier {:?}, then {:?}",
                self.now, before.decision, after.decision
            ));
        }
        Ok(())
    }

    /// Whether this instance's answer to `check` was a cached denial an invalidation on its
    /// way drops shortly: another instance's give-back is heard asynchronously, and until
    /// then the cache denies (`RedisStore::with_deny_cache`: a late message only leaves an
    /// instance denying until it arrives, never admitting more). A store without a cache
    /// answers every check at once or none, so it is never stale.
    async fn stale_in_cache(&self, check: Check<'_>, via: u8) -> bool {
        let store = self.limiter(via).store();
        let zero = std::time::Duration::ZERO;
        if store.try_check_now(&[check], zero).is_none() {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        store.try_check_now(&[check], zero).is_none()
    }

    pub(crate) async fn fate(&mut self, mut held: Held<S>, fate: Fate) -> Result<(), String> {
        let confirm = matches!(
            fate,
            Fate::Confirm | Fate::WaitConfirm | Fate::ConfirmCancel | Fate::ConfirmSettle(_)
        );
        if confirm && !held.confirmed {
            if fate == Fate::WaitConfirm {
                tokio::time::sleep_until(held.reservation.due()).await;
            }
            let outcome = held
                .reservation
                .confirm()
                .await
                .map_err(|e| e.to_string())?;
            if !outcome.is_admitted() {
                return Err(format!("a reservation refused at its release: {outcome:?}"));
            }
            held.confirmed = true;
        }
        // Whether a refund now is one before the admission's instant, on a key that gave
        // nothing else back since: then it must reopen nothing before that instant.
        let reopens = self.target.probes
            && held.asked.specs.len() == 1
            && !is_queue(self.reference.specs[held.asked.specs[0]].algo)
            && held.at > self.now
            && self.reference.last_removal(&self.lane(&held.asked, 0)) == held.removals[0];
        let Held {
            reservation,
            asked,
            slots,
            at,
            confirmed,
            ..
        } = match fate {
            Fate::Confirm | Fate::WaitConfirm => {
                self.held.push(held);
                return Ok(());
            }
            Fate::Settle(cost) | Fate::ConfirmSettle(cost) => return self.settle(held, cost).await,
            Fate::Cancel | Fate::ConfirmCancel | Fate::Drop => held,
        };
        if fate == Fate::Drop {
            drop(reservation);
            if confirmed {
                return Ok(());
            }
            // A store that does not answer at once gives back on a task: let it run.
            tokio::time::sleep(us(2_000)).await;
        } else {
            reservation.cancel().await.map_err(|e| e.to_string())?;
        }
        self.give_back(&slots, asked.cost);
        if reopens {
            self.probe_reopen(&asked, at).await?;
        }
        Ok(())
    }

    /// `Reservation::settle` at `cost` for every rule: below the estimate the rest goes
    /// back, above it the rest is owed from now.
    async fn settle(&mut self, held: Held<S>, cost: u64) -> Result<(), String> {
        let Held {
            reservation,
            asked,
            slots,
            ..
        } = held;
        let costs = vec![cost; asked.specs.len()];
        // A rule that admitted owes what the settlement takes above its estimate, a cost of
        // 0 included (it took nothing, and no slot records it).
        let took: Vec<bool> = (0..asked.specs.len())
            .map(|j| {
                let rule = reservation.outcome().rules.get(j);
                rule.is_some_and(|r| !matches!(r.decision, tollgate::Decision::Deny(_)))
            })
            .collect();
        reservation
            .settle(&costs)
            .await
            .map_err(|e| e.to_string())?;
        if cost < asked.cost {
            self.give_back(&slots, asked.cost - cost);
        }
        for (j, &took) in took.iter().enumerate() {
            if took && cost > asked.cost {
                let lane = self.lane(&asked, j);
                self.reference
                    .owe(lane, asked.specs[j], self.now, cost - asked.cost);
            }
        }
        Ok(())
    }

    fn give_back(&mut self, slots: &[Option<Slot>], units: u64) {
        for slot in slots.iter().flatten() {
            self.reference.give_back(slot, units);
        }
    }

    /// After a refund before the admission's instant, the same request is still refused
    /// now (`Store::refund`: a refund does not reopen a key earlier than the admission's
    /// instant). The reservation waited for the earliest instant its request fits, and
    /// the key gave nothing else back since, so without it the key is as full now.
    async fn probe_reopen(&self, asked: &Asked, at: u64) -> Result<(), String> {
        let check = Check::new(&self.rules[asked.specs[0]], &asked.keys[0]).with_cost(asked.cost);
        let peeked = self
            .limiter(0)
            .store()
            .peek(check)
            .await
            .map_err(|e| e.to_string())?;
        if peeked.decision.is_admitted() {
            return Err(format!(
                "a refund at {} of an admission passing at {at} reopened the key: {:?}",
                self.now, peeked.decision
            ));
        }
        Ok(())
    }
}

/// The verbs that give back, take, count or clear without a decision.
impl<S: Store + Clone> Run<'_, S> {
    pub(crate) async fn refund(&mut self, kept: Kept) -> Result<(), String> {
        {
            let checks = self.checks(&kept.asked, false);
            self.limiter(0).store().refund(&checks, &kept.outcome).await
        }
        .map_err(|e| e.to_string())?;
        self.give_back(&kept.slots, kept.asked.cost);
        Ok(())
    }

    pub(crate) async fn overdraw(
        &mut self,
        spec: usize,
        key: u8,
        units: u64,
    ) -> Result<(), String> {
        let asked = self.asked(&[spec], key, units, false);
        let spec = asked.specs[0];
        {
            let checks = self.checks(&asked, false);
            self.limiter(0).store().overdraw(&checks).await
        }
        .map_err(|e| e.to_string())?;
        let lane = self.lane(&asked, 0);
        self.reference.owe(lane, spec, self.now, units);
        Ok(())
    }

    /// Counts a deferred refusal: it counts for sure when its key gave nothing back since
    /// and is not locked now (the docs say nothing of a refusal counted during a lock).
    pub(crate) async fn count(&mut self, deferred: Deferred) -> Result<(), String> {
        {
            // As the layer counts them: the checks without `Refusal::Deferred` (a check still
            // marked deferred is not counted here either).
            let checks = self.checks(&deferred.asked, false);
            let ago = us(self.now - deferred.made);
            self.limiter(0).store().count_denials(&checks, ago).await
        }
        .map_err(|e| e.to_string())?;
        let seq = self.reference.tick();
        for (j, &spec) in deferred.asked.specs.iter().enumerate() {
            let lane = self.lane(&deferred.asked, j);
            let free = self.reference.specs[spec].lock.is_none_or(|lock| {
                self.reference
                    .expect_lock(&lane, lock, seq, self.now, false)
                    == Expect::Free
            });
            let certain = free && self.reference.last_removal(&lane) == deferred.removals[j];
            self.reference
                .refuse(&lane, deferred.made, self.now, certain);
        }
        Ok(())
    }

    /// `Limiter::reset`: the reference forgets the key on both sides of a `Fallback` (on
    /// its local side only while the primary is away).
    pub(crate) async fn reset(&mut self, spec: usize, key: u8) -> Result<(), String> {
        let spec = self.focus[spec % 3];
        let rule: Rule = self.rules[spec].clone();
        let key = [b'k', key];
        let sides: &[u8] = match self.limiter(0).reset(&rule, &key).await {
            Ok(()) => &[0, 1],
            // A `Fallback` resets its local store, then reports that the primary is away.
            Err(_) if self.down => &[1],
            Err(e) => return Err(e.to_string()),
        };
        let name = self.reference.specs[spec].name;
        self.refused_via
            .retain(|(lane, _)| lane.1 != name || lane.2 != key);
        self.unseen
            .retain(|(lane, _)| lane.1 != name || lane.2 != key);
        for &side in sides {
            self.reference
                .reset(&(side, self.reference.specs[spec].name, key.to_vec()));
        }
        Ok(())
    }

    /// Fresh keys, each back to empty a µs later, fill the in-process store to its bound.
    pub(crate) async fn flood(&mut self) {
        let Some(memory) = self.target.bound.clone() else {
            return;
        };
        let rule = Rule::fixed_window("flood", 1, us(1));
        for _ in 0..MAX_KEYS / 2 {
            self.flooded += 1;
            let key = self.flooded.to_le_bytes();
            let _ = memory.check(&[Check::new(&rule, &key)], us(0)).await;
        }
        self.now += 1;
        self.target.clock.set_micros(self.now);
    }

    /// The `Fallback`'s primary goes away or comes back, between requests: nothing held.
    pub(crate) fn outage(&mut self, down: bool) {
        let Some(switch) = &self.target.switch else {
            return;
        };
        if !self.held.is_empty() {
            return;
        }
        switch.set_down(down);
        self.down = down;
        self.kept.clear();
        self.deferred.clear();
    }
}
