//! The Lua twin of the models and of `batch.rs`: the script's source, its arguments and
//! its reply.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, Value};
use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::decision::{Admission, StoreId, Taken};
use crate::decision::{Decision, Denial, DenyReason, RateLimitInfo, RuleOutcome};
use crate::error::StoreError;
use crate::store::batch;
use crate::store::Check;

mod args;

use self::args::{exact_double, Code, RuleArgs};

/// Expands to the script's files, in the order `lua/prelude.lua` describes, followed by
/// the given tails: the helpers, the six models, penalties, the rules' arguments and stored
/// records, the batch driver, the streamlined batch and the call driver (`lua/call.lua`,
/// which decides several batches in one call).
macro_rules! source {
    ($($tail:expr),*) => {
        concat!(
            include_str!("../../../lua/prelude.lua"),
            include_str!("../../../lua/fixed_window.lua"),
            include_str!("../../../lua/sliding_log.lua"),
            include_str!("../../../lua/sliding_window.lua"),
            include_str!("../../../lua/token_bucket.lua"),
            include_str!("../../../lua/leaky_bucket.lua"),
            include_str!("../../../lua/gcra.lua"),
            include_str!("../../../lua/penalty.lua"),
            include_str!("../../../lua/record.lua"),
            include_str!("../../../lua/batch.lua"),
            include_str!("../../../lua/fast.lua"),
            include_str!("../../../lua/call.lua"),
            $($tail),*
        )
    };
}

/// The code without an entry point: the library's body.
const BODY: &str = source!();

/// The code as a script (`EVALSHA`): everything is defined anew on every call.
pub(super) const SOURCE: &str = source!("return decide_call(KEYS, ARGV)\n");

/// Hashed once; `EVALSHA` runs it, and `SCRIPT LOAD` loads it on `NOSCRIPT`.
pub(super) static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The code as a Redis function library (`FUNCTION LOAD`, `FCALL`, Redis 7 and later): the
/// helpers and models are defined once, when the library loads, so a call pays only for its
/// decisions. The library and its one function are named after the script's hash, so
/// instances running different versions of tollgate never call each other's code.
pub(super) struct Library {
    /// The library's name, which is also its function's.
    pub(super) name: String,
    /// `#!lua name=…`, the body, and the registration.
    pub(super) source: String,
}

/// Built once.
pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let name = format!("tollgate_{}", &SCRIPT.get_hash()[..16]);
    // Redis 7.0 runs a library's top level without Lua's standard library (no `math`,
    // `string`, `struct`), so the code is built on the function's first call and kept.
    let source = format!(
        "#!lua name={name}\n\
         local function build()\n{BODY}return decide_call\nend\n\
         local decide_call = nil\n\
         redis.register_function('{name}', function(keys, args)\n\
         \x20 if not decide_call then\n    decide_call = build()\n  end\n\
         \x20 return decide_call(keys, args)\nend)\n"
    );
    Library { name, source }
});

/// What the script does with a batch (`ARGV[3]`; `MODE_*` in `lua/prelude.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Decide and commit.
    Decide = 0,
    /// Decide, write nothing.
    Peek = 1,
    /// Admit nothing; count the penalty denials of the rules that refuse, judged as of
    /// `ARGV[2]` µs ago: a batch another Cluster slot denied (0 µs ago), or refusals left
    /// to `Store::count_denials`.
    Deny = 2,
    /// Take back the admissions a `Decide` call recorded at an instant.
    Refund = 3,
    /// Give back a held request's admissions, each rule at its own instant and only where
    /// its mark says that is exact (`Store::refund`).
    RefundHeld = 4,
    /// Take each rule's cost now without a check: a request served at a cost settled above
    /// what it took (`batch::overdraw`).
    Overdraw = 5,
    /// Decide as `Decide` does (a wait-mode reservation included), write nothing: a Cluster
    /// part that would count the request at a later instant, committed once every slot has
    /// admitted.
    Try = 6,
}

/// What a batch's reply opens with (`REPLY_*` in `lua/prelude.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opening {
    Denied = 0,
    Admitted = 1,
    /// The short reply of an admission (`lua/fast.lua`).
    Short = 2,
    /// Admitted, and a rule wrote over the state another configuration of its name left:
    /// that configuration's retry moved, so every deny cache must hear of it.
    Adopted = 3,
    /// In a call's reply only: a [`Short`](Opening::Short) admission at the instant of the
    /// one just before it, with no rule delayed, sent without them; [`split_reply`] gives
    /// them back.
    ShortAgain = 4,
}

/// Whether the rule keeps a second key (the sliding log's sorted set).
pub(super) fn has_log(algorithm: &Algorithm) -> bool {
    Code::of(algorithm) == Code::SlidingLog
}

/// The arguments common to every call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    /// The instant to decide at, or `None` for the server's `TIME`.
    pub(super) now: Option<u64>,
    pub(super) max_wait: u64,
    pub(super) mode: Op,
    /// Milliseconds added to every TTL.
    pub(super) slack_ms: u64,
    /// Modes other than the refunds: µs the request is reserved ahead at least (another
    /// Cluster slot of its batch reserved it then), so no rule counts it earlier.
    pub(super) min_delay: u64,
    /// Modes other than the refunds: µs after now at which another Cluster slot's leaky
    /// bucket releases the request (0: none), so the queues here hold it until then and
    /// the rules on keys released earlier are pending.
    pub(super) held: u64,
}

/// `ARGV[5]` of an `Op::Refund` or `Op::RefundHeld` call: per check, its instant, mark and
/// hold as doubles.
pub(super) fn packed_taken(taken: impl Iterator<Item = Taken>) -> Vec<u8> {
    let mut packed = Vec::new();
    for t in taken {
        packed.extend_from_slice(&exact_double(t.at).to_le_bytes());
        packed.extend_from_slice(&exact_double(t.mark).to_le_bytes());
        packed.extend_from_slice(&exact_double(t.hold).to_le_bytes());
    }
    packed
}

/// Whether a batch's instant and `ARGV[5]` follow its shape: only when they are not ""
/// (the server's `TIME`) and 0.
fn extra_follows(call: &Call, taken: bool) -> bool {
    call.now.is_some() || taken || call.min_delay != 0 || call.held != 0
}

/// Appends `value` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends a shape's header line (`lua/call.lua`): the key and rule counts, max_wait, the
/// mode, the TTL slack and whether the instant and `ARGV[5]` follow. Written by hand:
/// `write!` costs more than the rest of the batch.
fn push_header(shape: &mut Vec<u8>, call: &Call, nkeys: usize, nrules: usize, taken: bool) {
    let extra = extra_follows(call, taken);
    for (i, value) in [
        nkeys as u64,
        nrules as u64,
        call.max_wait,
        call.mode as u64,
        call.slack_ms,
        u64::from(extra),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            shape.push(b' ');
        }
        push_decimal(shape, value);
    }
    shape.push(b'\n');
}

/// One batch's keys and arguments, encoded for a call (see `lua/call.lua`): built by the
/// requesting task, so a coalesced call only copies them into its command.
#[derive(Debug, Clone)]
pub(super) struct Encoded {
    keys: SmallVec<[Vec<u8>; 4]>,
    /// How many rules (checks) the batch holds: the length of its reply follows from it.
    rules: usize,
    call: Call,
    /// `ARGV[5]` of an `Op::Refund` or `Op::RefundHeld` call (see `packed_taken`).
    taken: Option<Vec<u8>>,
    /// The batch's shape (`lua/call.lua`): its header line, then per rule its
    /// [`RuleArgs`]. Built here, once, and kept on the heap, so the batch stays
    /// small while it moves through the queue into its call.
    shape: Vec<u8>,
}

impl Encoded {
    /// Encodes `checks` (keys built by `key_of`). `taken` replaces `ARGV[5]` for a
    /// `Op::Refund` or `Op::RefundHeld` call.
    pub(super) fn new(
        call: Call,
        checks: &[&Check<'_>],
        mut key_of: impl FnMut(&Check<'_>, bool) -> Vec<u8>,
        taken: Option<&[u8]>,
    ) -> Self {
        let nkeys = checks.len()
            + checks
                .iter()
                .filter(|c| has_log(c.rule.algorithm()))
                .count();
        // The shape: one argument, the same bytes for every batch of the same rules and
        // configuration, which the script parses once and then looks up.
        let mut shape = Vec::with_capacity(64 + RuleArgs::BYTES * checks.len());
        push_header(&mut shape, &call, nkeys, checks.len(), taken.is_some());
        let mut keys = SmallVec::new();
        for (i, check) in checks.iter().enumerate() {
            // The rules on one client key share its leaky bucket's release (batch::key_release).
            let key_id = checks[..i]
                .iter()
                .position(|c| c.key() == check.key())
                .unwrap_or(i);
            keys.push(key_of(check, false));
            if has_log(check.rule.algorithm()) {
                keys.push(key_of(check, true));
            }
            RuleArgs::of(check, key_id).encode(&mut shape);
        }
        Self {
            keys,
            rules: checks.len(),
            call,
            taken: taken.map(<[u8]>::to_vec),
            shape,
        }
    }

    /// How many rules the batch holds.
    pub(super) fn rules(&self) -> usize {
        self.rules
    }

    /// Whether the instant and `ARGV[5]` follow the shape (the header's last digit).
    fn extra(&self) -> bool {
        extra_follows(&self.call, self.taken.is_some())
    }

    /// Bytes this batch adds to a command, about.
    fn size(&self) -> usize {
        self.keys.iter().map(|k| k.len() + 16).sum::<usize>() + self.shape.len() + 64
    }

    fn push_args(&self, cmd: &mut Cmd) {
        let call = &self.call;
        cmd.arg(&self.shape[..]);
        if self.extra() {
            match call.now {
                Some(now) => cmd.arg(now),
                None => cmd.arg(""),
            };
            match &self.taken {
                Some(packed) => cmd.arg(&packed[..]),
                None if call.held != 0 => cmd.arg(format!("{} {}", call.min_delay, call.held)),
                None => cmd.arg(call.min_delay),
            };
        }
    }
}

/// How a call reaches the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Invocation {
    /// `FCALL` of the function library ([`LIBRARY`]).
    Function,
    /// `EVALSHA` of the script ([`SCRIPT`]).
    Script,
}

/// The command that decides `batches` in one call, in order.
pub(super) fn command(route: Invocation, batches: &[&Encoded]) -> Cmd {
    // Sized up front: a coalesced call's command would otherwise be reallocated as it grows.
    let args = 3 + batches.iter().map(|b| b.keys.len() + 3).sum::<usize>();
    let bytes = 64 + batches.iter().map(|b| b.size()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(args, bytes);
    match route {
        Invocation::Function => cmd.arg("FCALL").arg(&LIBRARY.name),
        Invocation::Script => cmd.arg("EVALSHA").arg(SCRIPT.get_hash()),
    };
    cmd.arg(batches.iter().map(|b| b.keys.len()).sum::<usize>());
    for batch in batches {
        for key in &batch.keys {
            cmd.arg(&key[..]);
        }
    }
    for batch in batches {
        batch.push_args(&mut cmd);
    }
    cmd
}

/// The command that loads the code for `route` (`FUNCTION LOAD REPLACE`, `SCRIPT LOAD`).
pub(super) fn load_command(route: Invocation) -> Cmd {
    match route {
        Invocation::Function => {
            let mut cmd = redis::cmd("FUNCTION");
            cmd.arg("LOAD").arg("REPLACE").arg(&LIBRARY.source);
            cmd
        }
        Invocation::Script => {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(SOURCE);
            cmd
        }
    }
}

/// Whether `e` says the code for `route` is not loaded (a restart, a failover, `SCRIPT
/// FLUSH`, `FUNCTION FLUSH`): the call did not run, and may be sent again once loaded.
pub(super) fn is_not_loaded(route: Invocation, e: &redis::RedisError) -> bool {
    match route {
        Invocation::Function => e.to_string().contains("Function not found"),
        Invocation::Script => e.code() == Some("NOSCRIPT"),
    }
}

/// Splits the reply to a call into each batch's integers, or the error that batch alone
/// met; `rules` holds each batch's rule count, in order.
///
/// The reply is one flat array (`lua/call.lua`): per batch, either its integers — 2, now
/// and four per rule for an admission in short (`lua/fast.lua`); 4 and three per rule for
/// one at the instant of the short admission just before it, with no delay, which is given
/// back here in the first form; else 3 and seven per rule — or -1 and the batch's error
/// message. One array for the call keeps Redis from building, and the client from parsing,
/// a nested array per batch.
pub(super) fn split_reply(
    value: Value,
    rules: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Vec<i64>, StoreError>>, StoreError> {
    let n = rules.len();
    let bad = || StoreError::Protocol(format!("a call of {n} batches answered otherwise"));
    let Value::Array(values) = value else {
        return Err(bad());
    };
    let mut values = values.into_iter();
    let mut replies = Vec::with_capacity(n);
    // The instant of the batch just before, when it was admitted in short.
    let mut short_now = None;
    for rules in rules {
        let first = match values.next() {
            Some(Value::Int(first)) => first,
            _ => return Err(bad()),
        };
        if first == Opening::ShortAgain as i64 {
            let now = short_now.ok_or_else(bad)?;
            replies.push(Ok(short_again(&mut values, rules, now).ok_or_else(bad)?));
            continue;
        }
        short_now = None;
        let len = match first {
            -1 => {
                let message = match values.next() {
                    Some(Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                    Some(Value::SimpleString(text)) => text,
                    Some(other) => format!("{other:?}"),
                    None => return Err(bad()),
                };
                replies.push(Err(StoreError::Unavailable(message)));
                continue;
            }
            2 => rules.checked_mul(4).and_then(|r| r.checked_add(2)),
            _ => rules.checked_mul(7).and_then(|r| r.checked_add(3)),
        }
        .ok_or_else(bad)?;
        let mut batch = Vec::with_capacity(len);
        batch.push(first);
        for _ in 1..len {
            match values.next() {
                Some(Value::Int(i)) => batch.push(i),
                _ => return Err(bad()),
            }
        }
        if first == Opening::Short as i64 {
            short_now = batch.get(1).copied();
        }
        replies.push(Ok(batch));
    }
    if values.next().is_some() {
        return Err(bad());
    }
    Ok(replies)
}

/// An [`Opening::ShortAgain`] reply of `rules` rules at `now` (its remaining, reset and mark
/// per rule, read from `values`), in the [`Opening::Short`] form: 2, now, then per rule no
/// delay and those three.
fn short_again(
    values: &mut impl Iterator<Item = Value>,
    rules: usize,
    now: i64,
) -> Option<Vec<i64>> {
    let mut batch = Vec::with_capacity(rules.checked_mul(4)?.checked_add(2)?);
    batch.extend([Opening::Short as i64, now]);
    let mut next = || match values.next() {
        Some(Value::Int(i)) => Some(i),
        _ => None,
    };
    for _ in 0..rules {
        let (remaining, reset, mark) = (next()?, next()?, next()?);
        batch.extend([0, remaining, reset, mark]);
    }
    Some(batch)
}

/// The script's reply to a `Decide`, `Peek` or `Deny` call.
#[derive(Debug, Clone)]
pub(super) struct Reply {
    pub(super) admitted: bool,
    /// A rule adopted another configuration's state ([`Opening::Adopted`]).
    pub(super) adopted: bool,
    /// The instant the request arrives at: `now`, or later after a wait-mode reservation
    /// (or another Cluster slot's). A leaky bucket's queue does not move it: only the rules
    /// on the bucket's key count the request at its release (see `taken`).
    pub(super) reserved: u64,
    /// The instant the script decided at.
    pub(super) now: u64,
    /// One per check, in order.
    pub(super) rules: Vec<RuleOutcome>,
    /// One per check: the instant its rule counted the request at, the refund mark of its
    /// admission (see `Store::refund`) and its queue's hold, all 0 if none.
    pub(super) taken: SmallVec<[Taken; 4]>,
}

impl Reply {
    /// What a later `Store::refund` of this call's admissions needs, if it admitted.
    pub(super) fn admission(&self) -> Option<Admission> {
        self.admitted.then(|| Admission::new(self.taken.clone()))
    }
}

/// Parses the script's reply for `checks`.
pub(super) fn parse(values: &[i64], checks: &[&Check<'_>]) -> Result<Reply, StoreError> {
    let bad = || {
        StoreError::Protocol(format!(
            "script reply of {} integers for {} rules",
            values.len(),
            checks.len()
        ))
    };
    let uint = |v: i64| u64::try_from(v).map_err(|_| bad());
    let opening = values.first().copied();
    if opening == Some(Opening::Short as i64) {
        return parse_admitted(values, checks).ok_or_else(bad);
    }
    if values.len() != 3 + 7 * checks.len() {
        return Err(bad());
    }
    let (admitted, adopted) = match opening {
        Some(v) if v == Opening::Denied as i64 => (false, false),
        Some(v) if v == Opening::Admitted as i64 => (true, false),
        Some(v) if v == Opening::Adopted as i64 => (true, true),
        _ => return Err(bad()),
    };
    let reserved = uint(values[1])?;
    let now = uint(values[2])?;
    let rules = checks
        .iter()
        .zip(values[3..].chunks_exact(7))
        .map(|(check, v)| {
            let value = uint(v[1])?;
            let us = Duration::from_micros;
            let decision = match v[0] {
                0 => Decision::Allow,
                1 => Decision::Delay(us(value)),
                2 => deny(DenyReason::Limited, Some(us(value))),
                3 => deny(DenyReason::Locked, Some(us(value))),
                4 => deny(DenyReason::CostExceedsCapacity, None),
                _ => return Err(bad()),
            };
            Ok(RuleOutcome {
                decision,
                info: RateLimitInfo {
                    limit: check.rule.algorithm().quota().0,
                    remaining: uint(v[2])?,
                    reset: us(uint(v[3])?),
                },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let taken = values[3..]
        .chunks_exact(7)
        .map(|v| {
            // -1: a pending rule, counted only when the request is released.
            Ok(match v[5] {
                -1 => Taken::pending(),
                at => Taken {
                    hold: uint(v[6])?,
                    ..Taken::at(StoreId::default(), uint(at)?, uint(v[4])?)
                },
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Reply {
        admitted,
        adopted,
        reserved,
        now,
        rules,
        taken,
    })
}

/// The short reply of an admission (lua/fast.lua): 2, now, then per check its delay,
/// remaining, reset and mark; every rule counted the request at now, which is also when it
/// arrives.
fn parse_admitted(values: &[i64], checks: &[&Check<'_>]) -> Option<Reply> {
    if values.len() != 2 + 4 * checks.len() {
        return None;
    }
    let uint = |v: i64| u64::try_from(v).ok();
    let now = uint(values[1])?;
    let mut rules = Vec::with_capacity(checks.len());
    let mut taken = SmallVec::with_capacity(checks.len());
    for (check, v) in checks.iter().zip(values[2..].chunks_exact(4)) {
        let delay = Duration::from_micros(uint(v[0])?);
        rules.push(RuleOutcome {
            decision: if delay.is_zero() {
                Decision::Allow
            } else {
                Decision::Delay(delay)
            },
            info: RateLimitInfo {
                limit: check.rule.algorithm().quota().0,
                remaining: uint(v[1])?,
                reset: Duration::from_micros(uint(v[2])?),
            },
        });
        taken.push(Taken::at(StoreId::default(), now, uint(v[3])?));
    }
    Some(Reply {
        admitted: true,
        adopted: false,
        reserved: now,
        now,
        rules,
        taken,
    })
}

fn deny(reason: DenyReason, retry_after: Option<Duration>) -> Decision {
    Decision::Deny(Denial {
        reason,
        retry_after,
    })
}

/// Combines per-rule outcomes of `batch` the one way the crate does (see `batch::combine`).
pub(super) fn combine(rules: Vec<RuleOutcome>, batch: &[Check<'_>]) -> crate::decision::Outcome {
    batch::combine(rules, |i| batch.get(i).is_some_and(|c| c.shadow))
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use crate::error::StoreError;

    /// A script reply is split into one result per batch by its rule count, a batch's error
    /// kept to that batch.
    #[test]
    fn a_call_reply_is_split_by_batch() {
        let ints = |v: &[i64]| v.iter().map(|&i| Value::Int(i)).collect::<Vec<_>>();
        // An admission in short of one rule, a failed batch, a long reply of two rules and
        // the empty admission of a batch without rules.
        let mut flat = ints(&[2, 100, 0, 9, 10, 0]);
        flat.push(Value::Int(-1));
        flat.push(Value::BulkString(b"ERR oom".to_vec()));
        flat.extend(ints(&[
            0, 100, 100, 2, 5, 3, 4, 0, 0, 0, 0, 0, 7, 8, 0, 0, 0,
        ]));
        flat.extend(ints(&[2, 100]));
        // Admissions in short at the instant of the one before, of two rules and of one.
        flat.extend(ints(&[4, 8, 11, 0, 7, 12, 3, 4, 6, 5, 4]));
        let replies = super::split_reply(Value::Array(flat), [1, 1, 2, 0, 2, 1].into_iter())
            .expect("well formed");
        assert_eq!(replies.len(), 6);
        assert_eq!(replies[0], Ok(vec![2, 100, 0, 9, 10, 0]));
        assert!(matches!(&replies[1], Err(StoreError::Unavailable(m)) if m == "ERR oom"));
        assert_eq!(
            replies[2],
            Ok(vec![0, 100, 100, 2, 5, 3, 4, 0, 0, 0, 0, 0, 7, 8, 0, 0, 0])
        );
        assert_eq!(replies[3], Ok(vec![2, 100]));
        assert_eq!(replies[4], Ok(vec![2, 100, 0, 8, 11, 0, 0, 7, 12, 3]));
        assert_eq!(replies[5], Ok(vec![2, 100, 0, 6, 5, 4]));
    }

    /// A script reply whose length does not match the batches' rules is a protocol error.
    #[test]
    fn a_call_reply_of_another_length_is_refused() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|&i| Value::Int(i)).collect());
        for (reply, rules) in [
            // Too short, too long, a count of batches that differs.
            (ints(&[2, 100, 0, 9, 10]), vec![1]),
            (ints(&[2, 100, 0, 9, 10, 0, 0]), vec![1]),
            (ints(&[2, 100, 0, 9, 10, 0]), vec![1, 1]),
            (ints(&[-1]), vec![1]),
            (Value::Int(2), vec![0]),
            // An admission in short "again" with none before it, or too short.
            (ints(&[4, 9, 10, 0]), vec![1]),
            (
                ints(&[0, 100, 100, 2, 5, 3, 4, 0, 0, 0, 4, 9, 10, 0]),
                vec![1, 1],
            ),
            (
                Value::Array(vec![
                    Value::Int(-1),
                    Value::BulkString(b"ERR oom".to_vec()),
                    Value::Int(4),
                    Value::Int(9),
                    Value::Int(10),
                    Value::Int(0),
                ]),
                vec![1, 1],
            ),
            (ints(&[2, 100, 0, 9, 10, 0, 4, 9, 10]), vec![1, 1]),
        ] {
            assert!(
                matches!(
                    super::split_reply(reply, rules.into_iter()),
                    Err(StoreError::Protocol(_))
                ),
                "accepted"
            );
        }
    }

    /// Decimals are written as the plain digits Lua reads, up to `u64::MAX`.
    #[test]
    fn decimals_are_written_as_lua_reads_them() {
        let mut out = Vec::new();
        for value in [0, 7, 10, 1_234_567_890, u64::MAX] {
            out.clear();
            super::push_decimal(&mut out, value);
            assert_eq!(out, value.to_string().into_bytes());
        }
    }
}
