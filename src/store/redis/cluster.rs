//! A Redis Cluster batch whose keys span slots, decided part by part (one part per slot):
//! the guarantee it keeps is in [`RedisStore`]'s docs.
//!
//! The phases of [`decide_across_slots`](RedisStore::decide_across_slots): split the batch
//! by slot; the part whose leaky bucket holds the request longest goes first; decide each
//! part in turn (committed, or tried and left [`Deferred`]), refunding the committed ones
//! when a later one denies; realign the parts that counted the request too early; settle
//! the rules pending to a queue's release; commit the deferred parts; combine the outcomes.
//!
//! Once a part denies, the batch is judged as one node judges it (`denial`). Beyond what
//! [`RedisStore`]'s docs say, a refunded part reports its quota after the refund: a sliding
//! log's refunded entry stays, without units, until it expires, so its reset reads that
//! entry's window end.

use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::clock::duration_to_micros;
use crate::decision::{Admission, Decision, Outcome, RuleOutcome, Taken};
use crate::error::StoreError;
use crate::store::batch::is_queue;
use crate::store::check::Check;

use super::script::{self, Call, Op, Reply};
use super::RedisStore;

mod denial;

use denial::set_outcomes;

/// How often a cross-slot batch decides its early parts again before it denies.
const MAX_REALIGN_ROUNDS: u32 = 2;

/// What a cross-slot batch has taken and decided so far: what a refund or the outcome is
/// made from.
#[derive(Default)]
struct Ledger {
    /// The parts admitted so far.
    admitted: Vec<Part>,
    /// Per rule of the batch: its outcome so far.
    outcomes: Vec<Option<RuleOutcome>>,
    /// Per rule of the batch: what it took (for `Admission`).
    taken: SmallVec<[Taken; 4]>,
    /// The batch's reservation: µs after now that the request arrives at; no later part may
    /// count it earlier.
    delay: u64,
    /// Whether a part denied.
    denied: bool,
    /// µs after now that the batch's queues release the request at, as the parts found
    /// them: a denied batch's other rules are judged there, as on one node.
    release: u64,
    /// The members left to a queue's release, and the release they were checked at.
    pending: Vec<(Vec<usize>, u64)>,
    /// See [`release_on_arrival`](RedisStore::release_on_arrival), once found.
    on_arrival: Option<u64>,
}

/// One slot's part of a cross-slot batch, admitted.
#[derive(Debug, Clone)]
struct Part {
    /// The batch indices of its checks.
    members: SmallVec<[usize; 4]>,
    /// The members that consumed: all but a shadow item that denied.
    consumed: SmallVec<[usize; 4]>,
    /// Per consumed member: the instant (its node's clock) its rule counted the request at.
    taken: SmallVec<[Taken; 4]>,
    /// µs after its node's now that it reserved the request at.
    delay: u64,
    /// µs after its node's now that its leaky buckets release the request at (0: none).
    shaped: u64,
    /// Whether one of its members joins a leaky bucket's queue.
    queues: bool,
    /// Tried, nothing written yet (see [`Deferred`]).
    deferred: Option<Deferred>,
}

/// A part that would count the request later than now (a reservation, a queue's release):
/// tried (`Op::Try`), and committed with these arguments once every slot has admitted,
/// since a refund cannot date a state back to before such a count.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    least: u64,
    held: u64,
}

impl RedisStore {
    /// A Cluster batch spanning slots, in the phases of the module docs.
    pub(super) async fn decide_across_slots(
        &self,
        batch: &[Check<'_>],
        groups: &[SmallVec<[usize; 4]>],
        max_wait: u64,
    ) -> Result<Outcome, StoreError> {
        let mut ledger = Ledger::new(batch.len());
        let leader = self.lead(batch, groups, max_wait, &mut ledger).await?;
        let mut order: SmallVec<[usize; 4]> = (0..groups.len()).collect();
        order.sort_by_key(|&g| Some(g) != leader);
        for g in order {
            let leads = Some(g) == leader;
            self.decide_slot(batch, &groups[g], leads, max_wait, &mut ledger)
                .await?;
        }
        if let Some(unsettled) = self.realign(batch, max_wait, &mut ledger).await? {
            return Ok(unsettled);
        }
        if let Some(unsettled) = self.settle_pending(batch, max_wait, &mut ledger).await? {
            return Ok(unsettled);
        }
        if let Some(unsettled) = self.commit_deferred(batch, max_wait, &mut ledger).await? {
            return Ok(unsettled);
        }
        ledger.into_outcome(batch)
    }

    /// The part whose leaky bucket holds the request longest (`None`: no part has one),
    /// which goes first. With queues in several slots, each is peeked first, and how long
    /// the longest holds the request is the ledger's `on_arrival`.
    async fn lead(
        &self,
        batch: &[Check<'_>],
        groups: &[SmallVec<[usize; 4]>],
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<Option<usize>, StoreError> {
        let shaping: SmallVec<[usize; 4]> = (0..groups.len())
            .filter(|&g| groups[g].iter().any(|&i| is_queue(&batch[i])))
            .collect();
        if shaping.len() <= 1 {
            ledger.on_arrival = shaping.is_empty().then_some(0);
            return Ok(shaping.first().copied());
        }
        let (mut leader, mut longest) = (shaping[0], 0);
        for &g in &shaping {
            let members = &groups[g];
            let reply = self
                .run_part(batch, members, max_wait, Op::Peek, 0, 0)
                .await?;
            let release = queue_release(batch, members, &reply);
            if release > longest {
                (leader, longest) = (g, release);
            }
        }
        ledger.on_arrival = Some(longest);
        Ok(Some(leader))
    }

    /// Decides one slot's `members` in their turn: the rules pending to the leader's release
    /// are checked there, the others decided now.
    async fn decide_slot(
        &self,
        batch: &[Check<'_>],
        members: &[usize],
        leads: bool,
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<(), StoreError> {
        let shaped = ledger.shaped();
        // Rules that pass the request before the leader's queue does are pending
        // (`batch::evaluate`); trial rules, rules that take nothing and queues count it on
        // arrival.
        let held = match (ledger.denied, leads) {
            (true, _) => ledger.release,
            (false, false) if shaped > ledger.delay => shaped,
            _ => 0,
        };
        let (later, now): (Vec<usize>, Vec<usize>) = if held > 0 && !ledger.denied {
            members
                .iter()
                .partition(|&&i| !batch[i].in_shadow() && batch[i].cost > 0 && !is_queue(&batch[i]))
        } else {
            (Vec::new(), members.to_vec())
        };
        // What to decide and commit here, each no earlier than its least delay.
        let mut parts: SmallVec<[(Vec<usize>, u64); 2]> = SmallVec::new();
        if !now.is_empty() {
            parts.push((now, ledger.delay));
        }
        if !later.is_empty() {
            if let Some(reserve) = self
                .check_at_release(batch, later, shaped, max_wait, ledger)
                .await?
            {
                parts.push(reserve);
            }
        }
        for (members, least) in &parts {
            self.commit_part(batch, members, *least, held, max_wait, ledger)
                .await?;
        }
        Ok(())
    }

    /// Checks the pending rules (`later`) at the release (`shaped`): they stay pending if
    /// they admit there; if not, a wait-mode batch reserves from there (the part to commit
    /// is returned) and any other batch is denied.
    async fn check_at_release(
        &self,
        batch: &[Check<'_>],
        later: Vec<usize>,
        shaped: u64,
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<Option<(Vec<usize>, u64)>, StoreError> {
        let reply = self
            .run_part(batch, &later, max_wait, Op::Peek, shaped, 0)
            .await;
        let reply = self.or_refund(batch, ledger, reply).await?;
        if reply.admitted {
            for &i in &later {
                ledger.taken[i] = Taken::pending();
            }
            set_outcomes(&mut ledger.outcomes, &later, reply.rules);
            ledger.pending.push((later, shaped));
            Ok(None)
        } else if max_wait > 0 {
            Ok(Some((later, shaped)))
        } else {
            // Peeked only: judged on arrival, which counts their penalty denials.
            let peeked = Deferred {
                least: shaped,
                held: 0,
            };
            self.deny_with(batch, ledger, &later, (&reply, Some(peeked)))
                .await?;
            Ok(None)
        }
    }

    /// Decides and commits `members`, no earlier than `least` nor the batch's reservation,
    /// their queues holding the request `held` µs at least.
    async fn commit_part(
        &self,
        batch: &[Check<'_>],
        members: &[usize],
        least: u64,
        held: u64,
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<(), StoreError> {
        let denied = ledger.denied;
        let reply = if denied {
            // Judged as one node judges a denied batch: on arrival, held until its release.
            self.run_part(batch, members, 0, Op::Deny, 0, held)
                .await
                .map(|reply| (reply, None))
        } else {
            let least = ledger.delay.max(least);
            self.decide_part(batch, members, max_wait, least, held)
                .await
        };
        let (reply, deferred) = self.or_refund(batch, ledger, reply).await?;
        if ledger.admitted.is_empty() && !denied && least == 0 && reply.reserved == reply.now {
            // The first part, with the only queues if any: decided on arrival.
            ledger
                .on_arrival
                .get_or_insert(queue_release(batch, members, &reply));
        }
        if reply.admitted {
            let part = ledger.admit(members, &reply, batch, deferred);
            ledger.admitted.push(part);
        } else if !denied {
            ledger.release = ledger.release.max(queue_release(batch, members, &reply));
            set_outcomes(&mut ledger.outcomes, members, reply.rules.clone());
            return self
                .deny_with(batch, ledger, members, (&reply, deferred))
                .await;
        }
        for (&i, outcome) in members.iter().zip(reply.rules) {
            if ledger.outcomes[i].is_none() {
                ledger.outcomes[i] = Some(outcome);
            }
        }
        Ok(())
    }

    /// Decides again the admitted parts that counted the request too early; `Some`
    /// outcome: no agreement, denied and refunded.
    async fn realign(
        &self,
        batch: &[Check<'_>],
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<Option<Outcome>, StoreError> {
        // A part admitted before a later one reserved further ahead counted the request too
        // early, and a queue that released it before another part's would let its next
        // request leave too soon: take it back and decide it again at the batch's delay.
        // Without other traffic it admits there; traffic in between can move it again, so
        // the rounds are bounded.
        let mut rounds = 0;
        while !ledger.denied && ledger.admitted.iter().any(|p| ledger.is_stale(p)) {
            if rounds == MAX_REALIGN_ROUNDS {
                // Still no agreement: deny rather than let a part count the request early.
                return self.unsettled(batch, ledger).await;
            }
            rounds += 1;
            let mut p = 0;
            while p < ledger.admitted.len() {
                if !ledger.is_stale(&ledger.admitted[p]) {
                    p += 1;
                    continue;
                }
                let (least, held) = (ledger.delay, ledger.held());
                let early = ledger.admitted.remove(p);
                let redecided = async {
                    let early = std::slice::from_ref(&early);
                    self.refund(batch, early, &mut ledger.outcomes).await?;
                    self.decide_part(batch, &early[0].members, max_wait, least, held)
                        .await
                }
                .await;
                let (reply, deferred) = self.or_refund(batch, ledger, redecided).await?;
                set_outcomes(&mut ledger.outcomes, &early.members, reply.rules.clone());
                if !reply.admitted {
                    self.deny_with(batch, ledger, &early.members, (&reply, deferred))
                        .await?;
                    break;
                }
                let part = ledger.admit(&early.members, &reply, batch, deferred);
                ledger.admitted.insert(p, part);
                p += 1;
            }
        }
        Ok(None)
    }

    /// Settles the pending rules after realigning moved the release or the reservation:
    /// still pending where the queue holds the request past its reservation (checked again
    /// there), else counted at the reservation. `Some` outcome: denied and refunded.
    async fn settle_pending(
        &self,
        batch: &[Check<'_>],
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<Option<Outcome>, StoreError> {
        let mut rounds = 0;
        while !ledger.denied {
            let shaped = ledger.shaped();
            let delay = ledger.delay;
            let (stale, fresh): (Vec<_>, Vec<_>) = std::mem::take(&mut ledger.pending)
                .into_iter()
                .partition(|(_, at)| !(shaped > delay && *at == shaped));
            ledger.pending = fresh;
            if stale.is_empty() {
                break;
            }
            if rounds == MAX_REALIGN_ROUNDS {
                return self.unsettled(batch, ledger).await;
            }
            rounds += 1;
            for (members, _) in stale {
                let peek = shaped > ledger.delay;
                let reply = if peek {
                    self.run_part(batch, &members, max_wait, Op::Peek, shaped, 0)
                        .await
                        .map(|reply| (reply, None))
                } else {
                    self.decide_part(batch, &members, max_wait, ledger.delay, 0)
                        .await
                };
                let (reply, deferred) = self.or_refund(batch, ledger, reply).await?;
                set_outcomes(&mut ledger.outcomes, &members, reply.rules.clone());
                if !reply.admitted {
                    self.deny_with(batch, ledger, &members, (&reply, deferred))
                        .await?;
                    break;
                }
                if peek {
                    ledger.pending.push((members, shaped));
                } else {
                    let part = ledger.admit(&members, &reply, batch, deferred);
                    ledger.admitted.push(part);
                }
            }
            if let Some(unsettled) = self.realign(batch, max_wait, ledger).await? {
                return Ok(Some(unsettled));
            }
        }
        Ok(None)
    }

    /// Decides `members` at least `least` µs ahead, held `held` µs: committed where every
    /// rule counts it now, else tried and left [`Deferred`] (`Some`: nothing written).
    async fn decide_part(
        &self,
        batch: &[Check<'_>],
        members: &[usize],
        max_wait: u64,
        least: u64,
        held: u64,
    ) -> Result<(Reply, Option<Deferred>), StoreError> {
        // A wait may reserve, a queue counts its key's rules at its release.
        let later =
            least > 0 || held > 0 || max_wait > 0 || members.iter().any(|&i| is_queue(&batch[i]));
        let op = if later { Op::Try } else { Op::Decide };
        let reply = self
            .run_part(batch, members, max_wait, op, least, held)
            .await?;
        Ok((reply, later.then_some(Deferred { least, held })))
    }

    /// Commits the deferred parts; `Some` outcome: one denied, the batch denied and refunded.
    async fn commit_deferred(
        &self,
        batch: &[Check<'_>],
        max_wait: u64,
        ledger: &mut Ledger,
    ) -> Result<Option<Outcome>, StoreError> {
        for p in 0..ledger.admitted.len() {
            let Some(Deferred { least, held }) = ledger.admitted[p].deferred else {
                continue;
            };
            let members = ledger.admitted[p].members.clone();
            let reply = self
                .run_part(batch, &members, max_wait, Op::Decide, least, held)
                .await;
            let reply = self.or_refund(batch, ledger, reply).await?;
            if !reply.admitted {
                ledger.admitted[p].deferred = None;
                ledger.admitted[p].consumed.clear();
                return self.unsettled(batch, ledger).await;
            }
            ledger.admitted[p] = ledger.admit(&members, &reply, batch, None);
            set_outcomes(&mut ledger.outcomes, &members, reply.rules);
        }
        Ok(None)
    }

    /// One script call for the `members` of `batch` (one slot).
    async fn run_part(
        &self,
        batch: &[Check<'_>],
        members: &[usize],
        max_wait: u64,
        mode: Op,
        min_delay: u64,
        held: u64,
    ) -> Result<Reply, StoreError> {
        let checks: SmallVec<[&Check<'_>; 4]> = members.iter().map(|&i| &batch[i]).collect();
        let call = Call {
            min_delay,
            held,
            ..self.call(max_wait, mode)
        };
        self.run(call, &checks, None).await
    }
}

impl Ledger {
    /// Nothing decided yet for a batch of `len` rules.
    fn new(len: usize) -> Self {
        Self {
            outcomes: vec![None; len],
            taken: smallvec::smallvec![Taken::default(); len],
            ..Self::default()
        }
    }

    /// µs after now that the admitted parts' leaky buckets release the request at.
    fn shaped(&self) -> u64 {
        self.admitted.iter().map(|p| p.shaped).max().unwrap_or(0)
    }

    /// Whether `part` counted the request too early and must be decided again.
    fn is_stale(&self, part: &Part) -> bool {
        part.delay < self.delay || (part.queues && part.shaped < self.held())
    }

    /// µs after now until which the admitted parts' queues hold the request (0: none).
    fn held(&self) -> u64 {
        Some(self.shaped()).filter(|&s| s > self.delay).unwrap_or(0)
    }

    /// Records what an admitted part took (tried only when `deferred`) and moves the
    /// batch's reservation to it if later.
    fn admit(
        &mut self,
        members: &[usize],
        reply: &Reply,
        batch: &[Check<'_>],
        deferred: Option<Deferred>,
    ) -> Part {
        for (&i, &t) in members.iter().zip(&reply.taken) {
            self.taken[i] = t;
        }
        let part = Part::new(members, reply, batch, deferred);
        self.delay = self.delay.max(part.delay);
        self.release = self.release.max(part.shaped);
        part
    }

    /// The batch's outcome: the parts' outcomes combined, with what it took when admitted.
    fn into_outcome(self, batch: &[Check<'_>]) -> Result<Outcome, StoreError> {
        let rules = self
            .outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| StoreError::Protocol("a rule got no decision".into())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut outcome = script::combine(rules, batch);
        if !self.denied {
            outcome.admission = Some(Admission::new(self.taken));
        }
        Ok(outcome)
    }
}

impl Part {
    fn new(
        members: &[usize],
        reply: &Reply,
        batch: &[Check<'_>],
        deferred: Option<Deferred>,
    ) -> Self {
        let (consumed, taken) = members
            .iter()
            .zip(&reply.rules)
            .zip(&reply.taken)
            .filter(|((&i, o), t)| {
                !t.pending && (!batch[i].in_shadow() || o.decision.is_admitted())
            })
            .map(|((&i, _), &t)| (i, t))
            .unzip();
        let shaped = members
            .iter()
            .zip(&reply.rules)
            .filter(|&(&i, _)| {
                let c = &batch[i];
                !c.in_shadow() && matches!(c.rule.algorithm(), Algorithm::LeakyBucket(_))
            })
            .filter_map(|(_, o)| match o.decision {
                Decision::Delay(d) => Some(duration_to_micros(d)),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Self {
            members: members.into(),
            consumed,
            taken,
            delay: reply.reserved.saturating_sub(reply.now),
            shaped,
            queues: members.iter().any(|&i| is_queue(&batch[i])),
            deferred,
        }
    }
}

/// How long the queues among `members` hold the request, as a peek found them.
fn queue_release(batch: &[Check<'_>], members: &[usize], reply: &Reply) -> u64 {
    let mut release = 0;
    // A queue holds the request while it is not empty, whether or not the request fits
    // (one that does not denies the batch anyway).
    for (_, outcome) in members
        .iter()
        .zip(&reply.rules)
        .filter(|(&i, _)| is_queue(&batch[i]))
    {
        let holds = match outcome.decision {
            Decision::Delay(d) => d,
            // A denied reply reports each queue as it stands: it holds the request until
            // its water has drained.
            _ if !reply.admitted => outcome.info.reset,
            _ => Duration::ZERO,
        };
        release = release.max(duration_to_micros(holds));
    }
    release
}
