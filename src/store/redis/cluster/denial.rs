//! What a denied cross-slot batch does: refund the parts it committed, and judge the rest
//! as one node judges a denied batch, counting their penalty denials.

use smallvec::SmallVec;

use crate::decision::{DenyReason, Outcome, RuleOutcome};
use crate::error::StoreError;
use crate::store::batch::{self, is_queue};
use crate::store::check::Check;

use super::super::script::{self, Op, Reply};
use super::super::RedisStore;
use super::{queue_release, Deferred, Ledger, Part};

impl RedisStore {
    /// `result`, after refunding the admitted parts when it is an error.
    pub(super) async fn or_refund<T>(
        &self,
        batch: &[Check<'_>],
        ledger: &mut Ledger,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if result.is_err() {
            self.refund(batch, &ledger.admitted, &mut ledger.outcomes)
                .await?;
        }
        result
    }

    /// Marks the batch denied, refunds the committed parts and judges the rest as one node
    /// judges a denied batch (`Op::Deny`: on arrival, its queues holding the request until
    /// the batch's release), counting the penalty denials of the rules that reject.
    pub(super) async fn deny(
        &self,
        batch: &[Check<'_>],
        ledger: &mut Ledger,
    ) -> Result<(), StoreError> {
        ledger.denied = true;
        self.refund(batch, &ledger.admitted, &mut ledger.outcomes)
            .await?;
        ledger.release = self.release_on_arrival(batch, ledger).await?;
        let tried = std::mem::take(&mut ledger.admitted)
            .into_iter()
            .filter(|p| p.deferred.is_some())
            .map(|p| p.members.into_vec());
        let pending = std::mem::take(&mut ledger.pending)
            .into_iter()
            .map(|(m, _)| m);
        for members in tried.chain(pending).collect::<Vec<_>>() {
            let judged = self
                .run_part(batch, &members, 0, Op::Deny, 0, ledger.release)
                .await?;
            set_outcomes(&mut ledger.outcomes, &members, judged.rules);
        }
        Ok(())
    }

    /// µs after now that the batch's queues release a request arriving now: where one node
    /// judges a denied batch. One peek per slot with a queue.
    pub(super) async fn release_on_arrival(
        &self,
        batch: &[Check<'_>],
        ledger: &Ledger,
    ) -> Result<u64, StoreError> {
        if let Some(release) = ledger.on_arrival {
            return Ok(release);
        }
        let mut release = 0;
        for members in self.slot_groups(batch) {
            let queues: SmallVec<[usize; 4]> = members
                .into_iter()
                .filter(|&i| is_queue(&batch[i]))
                .collect();
            if !queues.is_empty() {
                let reply = self.run_part(batch, &queues, 0, Op::Peek, 0, 0).await?;
                release = release.max(queue_release(batch, &queues, &reply));
            }
        }
        Ok(release)
    }

    /// [`deny`](Self::deny), after `members` denied: judged too if only tried (`deferred`,
    /// the reply `tried`), which counts their penalties as a committing call would have.
    pub(super) async fn deny_with(
        &self,
        batch: &[Check<'_>],
        ledger: &mut Ledger,
        members: &[usize],
        (tried, deferred): (&Reply, Option<Deferred>),
    ) -> Result<(), StoreError> {
        self.deny(batch, ledger).await?;
        // A try judged where one node would, with no penalty to count, needs no second call.
        let judged_alike = deferred.is_some_and(|d| {
            d.least == 0
                && d.held.max(queue_release(batch, members, tried)) == ledger.release
                && members.iter().all(|&i| batch[i].rule.penalty().is_none())
        });
        if deferred.is_some() && !judged_alike {
            let judged = self
                .run_part(batch, members, 0, Op::Deny, 0, ledger.release)
                .await?;
            set_outcomes(&mut ledger.outcomes, members, judged.rules);
        }
        Ok(())
    }

    /// The outcome of a batch whose parts kept moving each other's release (traffic
    /// between the calls): every part refunded, the batch denied, retry once the longest
    /// release seen.
    pub(super) async fn unsettled(
        &self,
        batch: &[Check<'_>],
        ledger: &mut Ledger,
    ) -> Result<Option<Outcome>, StoreError> {
        self.refund(batch, &ledger.admitted, &mut ledger.outcomes)
            .await?;
        let outcomes = std::mem::take(&mut ledger.outcomes);
        Ok(Some(Outcome {
            decision: batch::deny(DenyReason::Limited, Some(ledger.delay)),
            rules: outcomes.into_iter().flatten().collect(),
            admission: None,
        }))
    }

    /// Takes back the admissions of `admitted` slots (their rules then report `Allow`).
    pub(super) async fn refund(
        &self,
        batch: &[Check<'_>],
        admitted: &[Part],
        outcomes: &mut [Option<RuleOutcome>],
    ) -> Result<(), StoreError> {
        for part in admitted.iter().filter(|p| p.deferred.is_none()) {
            let checks: SmallVec<[&Check<'_>; 4]> =
                part.consumed.iter().map(|&i| &batch[i]).collect();
            let packed = script::packed_taken(part.taken.iter().copied());
            let reply = self
                .run(self.call(0, Op::Refund), &checks, Some(&packed))
                .await?;
            set_outcomes(outcomes, &part.consumed, reply.rules);
        }
        Ok(())
    }
}

/// Sets the outcomes of `members` to `rules`, in order.
pub(super) fn set_outcomes(
    outcomes: &mut [Option<RuleOutcome>],
    members: &[usize],
    rules: Vec<RuleOutcome>,
) {
    for (&i, outcome) in members.iter().zip(rules) {
        outcomes[i] = Some(outcome);
    }
}
