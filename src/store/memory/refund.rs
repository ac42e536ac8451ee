//! [`Store::refund`](crate::store::Store::refund) and
//! [`Store::overdraw`](crate::store::Store::overdraw) for the in-process store.

use crate::decision::Admission;
use crate::error::StoreError;
use crate::store::batch;
use crate::store::check::Check;

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
            if check.cost == 0 || check.in_shadow() || taken.pending || taken.store != shared.id {
                continue;
            }
            let (mut shard, hash, now) = shared.lock(check);
            if let Some(entry) = shard.get_mut(hash, check) {
                if batch::refund(check, entry, now, &taken) {
                    entry.written_by(check.rule);
                }
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
}
