//! The keys a rule denied lately, each with the end of its lock if a denial said it was
//! locked: what lets the page list the locked keys, and find a key by one of its parts (a
//! user name in `address␟user`), which the store cannot do (it is asked by whole key).
//!
//! Only denials are remembered: an admitted request pays no lock for this. The memory is
//! bounded: when a new key finds the map full, an eighth of it is forgotten at once (so the
//! pass that chooses is paid once per that many new keys), keys not locked first, the
//! longest undenied among them first. Locked keys are kept past that bound, up to
//! [`LOCKED_ROOM`] times it, so that a flood of locked throw-away names does not push a
//! real user's lock out; beyond, the soonest unlocked are forgotten, and counted, so that
//! the page can say its list of locks is not complete.

use std::collections::HashMap;
use std::time::Duration;

/// How many keys each rule remembers by default.
pub(crate) const DEFAULT_SEEN_KEYS: usize = 1024;

/// How many times the bound locked keys may fill.
const LOCKED_ROOM: usize = 16;

/// The separator of a tuple key's parts.
const SEPARATOR: u8 = 0x1F;

/// What is remembered of a denied key, in milliseconds on the recorder's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    last_denied: u64,
    locked_until: Option<u64>,
}

impl Seen {
    /// The order in which keys are forgotten, lowest first.
    fn keep_rank(&self, now: u64) -> (bool, u64) {
        match self.locked_until {
            Some(until) if until > now => (true, until),
            _ => (false, self.last_denied),
        }
    }
}

/// A rule's denied keys: at most `capacity` of them not locked, and locked ones up to
/// [`LOCKED_ROOM`] times that.
#[derive(Debug)]
pub(crate) struct SeenKeys {
    capacity: usize,
    keys: HashMap<Box<[u8]>, Seen>,
    /// How many keys the map holds before it looks for room again: a pass that finds only
    /// locked keys is not repeated for every new key.
    look_at: usize,
    /// Keys forgotten while still locked, and the latest end of their locks.
    locks_forgotten: u64,
    forgotten_until: u64,
}

impl SeenKeys {
    /// Remembers at most `capacity` keys (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            keys: HashMap::new(),
            look_at: capacity,
            locks_forgotten: 0,
            forgotten_until: 0,
        }
    }

    /// Remembers a denial of `key` (stored form) at `now`; `locked_for` is the wait a lock's
    /// denial named, `None` for a denial that was not a lock's.
    pub(crate) fn denied(&mut self, key: &[u8], now: u64, locked_for: Option<Duration>) {
        let locked_until = locked_for.map(|wait| now.saturating_add(millis(wait)));
        if let Some(seen) = self.keys.get_mut(key) {
            *seen = Seen {
                last_denied: now,
                locked_until,
            };
            return;
        }
        if self.keys.len() >= self.look_at {
            self.make_room(now);
        }
        let seen = Seen {
            last_denied: now,
            locked_until,
        };
        self.keys.insert(key.into(), seen);
    }

    /// Forgets an eighth of the bound's keys, those worth least (see the module's docs):
    /// keys not locked, and locked ones only when they fill their room.
    fn make_room(&mut self, now: u64) {
        let excess = (self.capacity / 8).max(1);
        let mut ranks: Vec<(bool, u64)> = self.keys.values().map(|s| s.keep_rank(now)).collect();
        let unlocked = ranks.iter().filter(|(locked, _)| !locked).count();
        let full_of_locks = self.keys.len() >= self.capacity.saturating_mul(LOCKED_ROOM);
        let forget = match unlocked {
            0 if full_of_locks => excess,
            0 => 0,
            _ => excess.min(unlocked),
        };
        if forget > 0 {
            let threshold = *ranks.select_nth_unstable(forget - 1).1;
            if self.forgotten_until <= now {
                self.locks_forgotten = 0;
            }
            let mut forgotten = 0;
            self.keys.retain(|_, seen| {
                let rank = seen.keep_rank(now);
                let keep = forgotten >= forget || rank > threshold;
                forgotten += usize::from(!keep);
                if !keep && rank.0 {
                    self.locks_forgotten += 1;
                    self.forgotten_until = self.forgotten_until.max(rank.1);
                }
                keep
            });
        }
        self.look_at = self.capacity.max(self.keys.len() + excess);
    }

    /// How many keys were forgotten while still locked, as long as one of those locks may
    /// still run at `now`: the list of locks is not complete until then.
    pub(crate) fn locks_forgotten(&self, now: u64) -> u64 {
        if now < self.forgotten_until {
            self.locks_forgotten
        } else {
            0
        }
    }

    /// Forgets `key`: it was unblocked.
    pub(crate) fn forget(&mut self, key: &[u8]) {
        self.keys.remove(key);
    }

    /// Notes that `key` is not locked (the store says so: unblocked from elsewhere).
    pub(crate) fn unlocked(&mut self, key: &[u8]) {
        if let Some(seen) = self.keys.get_mut(key) {
            seen.locked_until = None;
        }
    }

    /// The keys locked at `now` as far as their denials said, each with the end of its
    /// lock, the soonest first.
    pub(crate) fn locked(&self, now: u64) -> Vec<(Box<[u8]>, u64)> {
        let mut locked: Vec<(Box<[u8]>, u64)> = self
            .keys
            .iter()
            .filter_map(|(key, seen)| {
                let until = seen.locked_until.filter(|&until| until > now)?;
                Some((key.clone(), until))
            })
            .collect();
        locked.sort_unstable_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        locked
    }

    /// The keys that are `typed` or have it as one of their parts, in byte order.
    pub(crate) fn matching(&self, typed: &[u8]) -> Vec<Box<[u8]>> {
        if typed.is_empty() {
            return Vec::new();
        }
        let mut found: Vec<Box<[u8]>> = self
            .keys
            .keys()
            .filter(|key| ***key == *typed || key.split(|&b| b == SEPARATOR).any(|p| p == typed))
            .cloned()
            .collect();
        found.sort_unstable();
        found
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tuple key is found by any of its parts or as a whole, not by a piece of a part.
    #[test]
    fn a_key_is_found_by_a_part() {
        let mut seen = SeenKeys::new(8);
        seen.denied(b"203.0.113.7\x1falice", 0, None);
        seen.denied(b"198.51.100.9\x1falice", 0, None);
        seen.denied(b"alicia", 0, None);
        let found = seen.matching(b"alice");
        assert_eq!(
            found,
            [&b"198.51.100.9\x1falice"[..], &b"203.0.113.7\x1falice"[..]].map(Box::from)
        );
        assert_eq!(seen.matching(b"203.0.113.7").len(), 1);
        assert_eq!(seen.matching(b"203.0.113.7\x1falice").len(), 1);
        assert!(seen.matching(b"ali").is_empty());
        assert!(seen.matching(b"").is_empty());
    }

    /// A lock is listed until it ends or the store says it is lifted; a later denial that
    /// is no lock's lifts it too.
    #[test]
    fn locks_are_listed_until_they_end() {
        let mut seen = SeenKeys::new(8);
        seen.denied(b"a", 0, Some(Duration::from_secs(10)));
        seen.denied(b"b", 0, Some(Duration::from_secs(5)));
        seen.denied(b"c", 0, None);
        let keys = |l: Vec<(Box<[u8]>, u64)>| l.into_iter().map(|(k, u)| (k.to_vec(), u));
        let listed: Vec<_> = keys(seen.locked(1_000)).collect();
        assert_eq!(listed, [(b"b".to_vec(), 5_000), (b"a".to_vec(), 10_000)]);
        assert_eq!(seen.locked(5_000).len(), 1);
        seen.unlocked(b"a");
        assert!(seen.locked(1_000).iter().all(|(k, _)| &**k != b"a"));
        seen.denied(b"b", 2_000, None);
        assert!(seen.locked(2_000).is_empty());
    }

    /// A flood of locked throw-away names does not push out a lock seen before it; past
    /// the room for locks, the soonest unlocked go, and are counted.
    #[test]
    fn a_flood_of_locks_keeps_earlier_locks() {
        let mut seen = SeenKeys::new(8);
        let minute = Some(Duration::from_secs(60));
        seen.denied(b"alice", 0, Some(Duration::from_secs(600)));
        for i in 0..100u64 {
            seen.denied(format!("throw-away-{i}").as_bytes(), 1, minute);
        }
        assert_eq!(seen.matching(b"alice").len(), 1);
        assert_eq!(seen.locks_forgotten(3), 0);
        for i in 0..1_000u64 {
            seen.denied(format!("more-{i}").as_bytes(), 2, minute);
            assert!(seen.keys.len() <= 8 * LOCKED_ROOM + 1);
        }
        assert!(seen.locks_forgotten(3) > 0);
        assert_eq!(
            seen.locks_forgotten(62_000),
            0,
            "every forgotten lock ended"
        );
        assert_eq!(
            seen.matching(b"alice").len(),
            1,
            "the latest lock to end stays"
        );
    }

    /// Past the bound, keys not locked go first, the longest undenied first; locks stay.
    #[test]
    fn the_bound_keeps_locks() {
        let mut seen = SeenKeys::new(8);
        for i in 0..4u64 {
            seen.denied(&[b'L', i as u8], i, Some(Duration::from_secs(60)));
        }
        for i in 0..100u64 {
            seen.denied(&[b'k', i as u8], 10 + i, None);
            assert!(seen.keys.len() <= 8);
        }
        assert_eq!(seen.locked(200).len(), 4);
        assert_eq!(seen.matching(&[b'k', 99]).len(), 1);
        assert!(seen.matching(&[b'k', 0]).is_empty());
    }
}
