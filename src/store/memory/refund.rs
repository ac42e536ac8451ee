//! [`Store::refund`](crate::store::Store::refund) and
//! [`Store::overdraw`](crate::store::Store::overdraw) for the in-process store.

use crate::decision::{Admission, Outcome, RuleOutcomes, Taken};
use crate::error::StoreError;
use crate::store::batch;
use crate::store::check::Check;
use crate::store::parked;

use super::bound::NoRoom;
use super::MemoryStore;

impl MemoryStore {
    /// [`Store::refund`](crate::store::Store::refund): each item under its shard's lock.
    pub(super) fn refund_admission(
        &self,
        batch: &[Check<'_>],
        admission: &Admission,
    ) -> Result<(), StoreError> {
        batch::validate(batch)?;
        let shared = &*self.shared;
        for (i, check) in batch.iter().enumerate() {
            let taken = admission.taken(i);
            // A trial rule may have taken nothing; a pending rule was never counted; units
            // another store took are not ours.
            let nothing = check.cost == 0 && !taken.lease;
            if nothing || check.in_shadow() || taken.pending || taken.store != shared.id {
                continue;
            }
            let (mut shard, hash, now) = shared.lock(check);
            if let (Some(entry), _) = shard.probe(hash, check) {
                batch::refund(check, entry, now, &taken);
            }
        }
        Ok(())
    }

    /// [`Store::overdraw`](crate::store::Store::overdraw) ([`batch::overdraw`]) in each
    /// key's entry, made (room included) if absent.
    pub(super) fn overdraw_each(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        batch::validate(batch)?;
        let shared = &*self.shared;
        shared.make_room(batch).map_err(NoRoom::error)?;
        for check in batch.iter().filter(|c| c.cost > 0) {
            let (mut shard, hash, now) = shared.lock(check);
            shard.update(hash, check, now, |entry| batch::overdraw(check, entry, now));
        }
        Ok(())
    }

    /// [`Store::lease`](crate::store::Store::lease): a batch of one decided, and parked if
    /// admitted, under one lock.
    pub(super) fn lease_one(&self, check: &Check<'_>, term: u64) -> Result<Outcome, StoreError> {
        batch::validate_lease(check)?;
        let batch = std::slice::from_ref(check);
        let shared = &*self.shared;
        if let Err(no_room) = shared.make_room(batch) {
            return Ok(no_room.outcome(batch));
        }
        let (mut shard, hash, now) = shared.lock(check);
        let item = batch::evaluate_alone(check, shard.get(hash, check), now);
        let admitted = batch::admits(std::slice::from_ref(&item));
        let id = parked::next_id();
        // A lease has no penalty: a denial writes nothing.
        let rule = if admitted {
            shard.update(hash, check, now, |entry| {
                let rule = batch::commit(check, entry, now, &item, true);
                entry.park(check.rule, id, check.cost, now.saturating_add(term));
                rule
            })
        } else {
            batch::report(check, shard.get(hash, check), now, &item, false)
        };
        drop(shard);
        let mut outcome = batch::combine([rule].into_iter().collect::<RuleOutcomes>(), |_| false);
        if admitted {
            let taken = Taken {
                lease: true,
                ..Taken::at(shared.id, now, id)
            };
            outcome.admission = Some(Admission::new([taken]));
        }
        Ok(outcome)
    }
}
