//! The random schedules: busy stretches at one to three times the rule's rate, idle gaps
//! that refill the bucket, and episodes where one instance takes a lease, idles while the
//! bucket refills, and spends the lease right before its term ends while the others drain
//! the bucket; a reset, a reload or a death may fall inside an episode, while its lease is
//! live. `play` runs one on a fleet and says which promise each stretch of passes keeps.

use tollgate::store::Store;

use super::drive::{leased, Config, Fleet};
use super::reference::{Promise, Rng};

/// What happens at an instant (µs after the origin).
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Request {
        instance: usize,
        cost: u64,
    },
    /// Instance `by` resets the key (the first live one if it is dead).
    Reset {
        by: usize,
    },
    /// The rule is reloaded (see `reload`).
    Reload,
    Death {
        instance: usize,
    },
}

/// What may happen besides requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras {
    pub reset: bool,
    pub reload: bool,
    pub death: bool,
}

/// A schedule: the rule's configuration, the one a reload brings, and the events.
#[derive(Debug)]
pub struct Plan {
    pub seed: u64,
    pub config: Config,
    pub reloaded: Config,
    pub events: Vec<(u64, Event)>,
}

/// Where a promise starts: the first pass it covers (an index of the fleet's passes), the
/// instant its bucket is full, and the promise.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub first: usize,
    pub start: u64,
    pub promise: Promise,
}

/// An instance's lease taken at `at`, spent right before its term ends.
#[derive(Debug, Clone, Copy)]
struct Episode {
    instance: usize,
    at: u64,
}

impl Plan {
    /// The schedule of `seed` over about `terms` lease terms.
    pub fn new(seed: u64, terms: u64, extras: Extras) -> Self {
        let mut rng = Rng::new(seed);
        let config = Config::random(&mut rng);
        let reloaded = config.reloaded(&mut rng);
        let mut plan = Self {
            seed,
            config,
            reloaded,
            events: Vec::new(),
        };
        let (mut t, mut episodes) = (0, Vec::new());
        while t < terms * config.term || episodes.is_empty() {
            t = match rng.between(0, 5) {
                0..=2 => plan.busy(&mut rng, t),
                3 | 4 => {
                    let (end, episode) = plan.episode(&mut rng, t);
                    episodes.push(episode);
                    end
                }
                _ => t + rng.between(plan.fill(), 3 * plan.fill()),
            };
        }
        let pick = |rng: &mut Rng| episodes[rng.between(0, episodes.len() as u64 - 1) as usize];
        let live = |rng: &mut Rng, e: Episode| e.at + rng.between(1, config.term - 1);
        if extras.reset {
            let (e, by) = (pick(&mut rng), rng.between(0, 2) as usize);
            plan.events.push((live(&mut rng, e), Event::Reset { by }));
        }
        if extras.reload {
            let e = pick(&mut rng);
            plan.events.push((live(&mut rng, e), Event::Reload));
        }
        if extras.death {
            let e = pick(&mut rng);
            let instance = e.instance;
            plan.events.push((e.at + 1, Event::Death { instance }));
        }
        // Stable: events at one instant keep the order they were made in.
        plan.events.sort_by_key(|&(at, _)| at);
        plan
    }

    /// µs the bucket takes to refill from empty.
    fn fill(&self) -> u64 {
        self.config.burst * self.config.period / self.config.amount
    }

    fn request(&mut self, rng: &mut Rng, at: u64, instance: usize) {
        let cost = if rng.one_in(3) { rng.between(2, 3) } else { 1 };
        self.events.push((at, Event::Request { instance, cost }));
    }

    /// Requests from all three at random instants from `t`, at one to three times the
    /// rule's rate; the instant it ends.
    fn busy(&mut self, rng: &mut Rng, t: u64) -> u64 {
        let end = t + rng.between(self.config.term / 2, 3 * self.config.term);
        let load = rng.between(1, 3);
        // A request costs 4/3 units on average: each instance asks a third of `load` times
        // the rate.
        let gap = (4 * self.config.period / (load * self.config.amount)).max(1);
        for instance in 0..3 {
            let mut at = t + rng.between(0, 2 * gap);
            while at < end {
                self.request(rng, at, instance);
                at += rng.between(0, 2 * gap);
            }
        }
        end
    }

    /// An idle stretch long enough for every lease to end, then an episode; the instant it
    /// ends, and the episode.
    fn episode(&mut self, rng: &mut Rng, t: u64) -> (u64, Episode) {
        let term = self.config.term;
        // A lease ends at its term; a timer may see it a tick later.
        let at = t + term + 1_000 + rng.between(0, term);
        let instance = rng.between(0, 2) as usize;
        self.events.push((at, Event::Request { instance, cost: 1 }));
        // What its lease has left, sometimes a request more (which takes the next lease).
        let late = at + term - rng.between(1, (term / 10).min(2_000));
        for _ in 1..self.config.units + rng.between(0, 1) {
            self.events
                .push((late, Event::Request { instance, cost: 1 }));
        }
        for other in (0..3).filter(|&o| o != instance) {
            for _ in 0..self.config.burst + rng.between(0, 3) {
                let at = late + rng.between(0, 3);
                self.events.push((
                    at,
                    Event::Request {
                        instance: other,
                        cost: 1,
                    },
                ));
            }
        }
        (at + term + rng.between(0, 100), Episode { instance, at })
    }
}

/// Plays `plan` on `fleet` for `key`; the segments of the fleet's passes, each with the
/// promise it keeps: the rule's from the origin, a bucket full at a reset, and the new
/// rule's from its first admission (the store adopts the old state when it first writes
/// the key under the new rule).
pub async fn play<S: Store + Clone>(fleet: &mut Fleet<S>, plan: &Plan, key: &[u8]) -> Vec<Segment> {
    let mut promise = plan.config.promise();
    let mut segments = vec![Segment {
        first: 0,
        start: 0,
        promise,
    }];
    let mut reloading = false;
    for &(at, event) in &plan.events {
        fleet.advance_to(at).await;
        let live = fleet.instances.iter().position(|i| !i.dead);
        match event {
            Event::Request { instance, cost } if !fleet.instances[instance].dead => {
                let admitted = fleet.request(instance, key, cost).await;
                if reloading && admitted && fleet.instances[instance].old.is_none() {
                    reloading = false;
                    let (first, start) = (fleet.passes.len() - 1, fleet.now());
                    promise = plan.reloaded.promise();
                    segments.push(Segment {
                        first,
                        start,
                        promise,
                    });
                }
            }
            Event::Request { .. } => {}
            Event::Reset { by } => {
                let by = if fleet.instances[by].dead {
                    live
                } else {
                    Some(by)
                };
                let instance = &fleet.instances[by.expect("an instance lives")];
                let rule = instance.rule.clone();
                instance.limiter.reset(&rule, key).await.expect("reset");
                let (first, start) = (fleet.passes.len(), fleet.now());
                segments.push(Segment {
                    first,
                    start,
                    promise,
                });
                reloading = false;
            }
            Event::Reload => {
                reload(fleet, &plan.reloaded, live.expect("an instance lives"));
                reloading = true;
            }
            Event::Death { instance } => fleet.kill(instance),
        }
    }
    segments
}

/// The rule reloaded under its name: instance `first` takes the new rule at once; the
/// others keep answering from their old lease while it has the units, then take it too.
fn reload<S: Store + Clone>(fleet: &mut Fleet<S>, config: &Config, first: usize) {
    for (i, instance) in fleet.instances.iter_mut().enumerate() {
        if instance.dead {
            continue;
        }
        let old = instance.limiter.store().clone();
        let old_rule = std::mem::replace(&mut instance.rule, config.rule());
        instance.limiter = leased(&instance.line, config);
        // A reload keeps the lease's units (`Config::reloaded`).
        instance.old = (i != first).then_some((old, old_rule, config.units));
    }
}

/// Each segment's passes against its promise.
pub fn verify<S: Store + Clone>(
    fleet: &Fleet<S>,
    plan: &Plan,
    segments: &[Segment],
) -> Result<(), String> {
    for (k, segment) in segments.iter().enumerate() {
        let end = segments.get(k + 1).map_or(fleet.passes.len(), |s| s.first);
        let passes = &fleet.passes[segment.first..end];
        segment.promise.check(segment.start, passes).map_err(|e| {
            format!(
                "seed {}: {:?}, reloaded {:?}: segment {k} from {} µs: {e}",
                plan.seed, plan.config, plan.reloaded, segment.start
            )
        })?;
    }
    Ok(())
}
