//! The Lua twin of the models and of `batch.rs`: the script's source, its arguments and
//! its reply.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, Value};
use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::decision::{Admission, StoreId, Taken};
use crate::decision::{Decision, DenyReason, RuleOutcome};
use crate::error::StoreError;
use crate::store::batch;
use crate::store::Check;

mod args;

/// `(name, text)` of each `lua/<name>.lua`.
macro_rules! lua_files {
    ($($name:ident),*) => {
        [$((stringify!($name), include_str!(concat!("../../../lua/", stringify!($name), ".lua")))),*]
    };
}

use self::args::{exact_double, RULE_BYTES};

/// The script's files by name, in the order they run as one chunk.
const FILES: [(&str, &str); 13] = lua_files!(
    prelude,
    fixed_window,
    sliding_log,
    sliding_window,
    token_bucket,
    leaky_bucket,
    gcra,
    penalty,
    record,
    parked,
    batch,
    fast,
    call
);

/// The code as the store sends it: a script (`EVALSHA`) when `library` is `None`, else a
/// function library of that name (`FUNCTION LOAD`); `text` gives each file's text from its
/// name (`"prelude"`, …) and the text built in (see `RedisStore::lua_source`).
pub(super) fn source(library: Option<&str>, text: impl Fn(&str, &'static str) -> String) -> String {
    let body: String = FILES
        .iter()
        .map(|&(name, built)| text(name, built))
        .collect();
    let Some(name) = library else {
        return body + "return decide_call(KEYS, ARGV)\n";
    };
    // Redis 7.0 runs a library's top level without Lua's standard library (no `math`,
    // `string`, `struct`), so the code is built on the function's first call and kept.
    format!(
        "#!lua name={name}\n\
         local function build()\n{body}return decide_call\nend\n\
         local decide_call = nil\n\
         redis.register_function('{name}', function(keys, args)\n\
         \x20 if not decide_call then\n    decide_call = build()\n  end\n\
         \x20 return decide_call(keys, args)\nend)\n"
    )
}

/// The code as a script (`EVALSHA`): everything is defined anew on every call.
static SOURCE: LazyLock<String> = LazyLock::new(|| source(None, |_, text| text.to_owned()));

/// Hashed once; `EVALSHA` runs it, and `SCRIPT LOAD` loads it on `NOSCRIPT`.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&SOURCE));

/// The name of the code as a Redis function library (`FUNCTION LOAD`, `FCALL`, Redis 7 and
/// later), and of its one function: the helpers and models are defined once, when the
/// library loads, so a call pays only for its decisions. Named after the script's hash, so
/// instances running different versions of tollgate never call each other's code.
static LIBRARY: LazyLock<String> =
    LazyLock::new(|| format!("tollgate_{}", &SCRIPT.get_hash()[..16]));

/// What the script does with a batch (its mode; `MODE_*` in `lua/prelude.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Op {
    /// Decide and commit.
    #[default]
    Decide = 0,
    /// Decide, write nothing.
    Peek = 1,
    /// Admit nothing; count the penalty denials of the rules that refuse, judged as of
    /// max_wait µs ago: a batch another Cluster slot denied (0 µs ago), or refusals left
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
    /// Decide one check as `Decide` does without a wait, and park its units if admitted
    /// (`Store::lease`): max_wait carries the term, the floors the lease's id.
    Lease = 7,
    /// End the leases whose ids are the marks in the floors, giving back each rule's cost
    /// (a lease's `Store::refund`).
    End = 8,
    /// Forget each rule's state and lock, keeping its live leases (`Store::reset`).
    Reset = 9,
}

/// What a batch's reply opens with (`REPLY_*` in `lua/prelude.lua`): [`REPLY_ADMITTED`] or
/// 0, plus [`REPLY_AGAIN`] when the reply leaves out its instants (those of the batch just
/// before it in the call), plus [`REPLY_WIDTH`] times the values it sends per rule (the
/// first of its [`FIELDS`]; the rest are 0).
pub(super) const REPLY_ADMITTED: i64 = 1;
pub(super) const REPLY_AGAIN: i64 = 2;
pub(super) const REPLY_WIDTH: i64 = 4;

/// The values a rule's reply holds (`lua/record.lua`'s `said`): remaining, reset µs, refund
/// mark, value (delay or retry µs), outcome, µs after the reservation it counted the request
/// at (-1 pending), its queue's hold, and 1 when it adopted another configuration's state.
const FIELDS: usize = 8;

/// Whether the rule keeps a second key (the sliding log's sorted set).
pub(super) fn has_log(algorithm: &Algorithm) -> bool {
    matches!(algorithm, Algorithm::SlidingLog(_))
}

/// The arguments common to every call.
#[derive(Debug, Clone, Copy, Default)]
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

/// The floors of an `Op::Refund`, `Op::RefundHeld` or `Op::End` call (`lua/call.lua`): per
/// check, its instant, mark and hold as doubles.
pub(super) fn packed_taken(taken: impl Iterator<Item = Taken>) -> Vec<u8> {
    let mut packed = Vec::new();
    for t in taken {
        packed.extend_from_slice(&exact_double(t.at).to_le_bytes());
        packed.extend_from_slice(&exact_double(t.mark).to_le_bytes());
        packed.extend_from_slice(&exact_double(t.hold).to_le_bytes());
    }
    packed
}

/// Appends a shape's header line (`lua/call.lua`): the key and rule counts, max_wait, the
/// mode, the TTL slack and whether the instant and floors follow. Written with `itoa`:
/// `write!` costs more than the rest of the batch.
fn push_header(shape: &mut Vec<u8>, call: &Call, nkeys: usize, nrules: usize, extra: bool) {
    let mut digits = itoa::Buffer::new();
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
        shape.extend_from_slice(digits.format(value).as_bytes());
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
    /// What replaces the floors: `packed_taken`, or a lease's id.
    taken: Option<Vec<u8>>,
    /// Whether the instant and floors follow the shape: only when they are not "" (the
    /// server's `TIME`) and 0.
    extra: bool,
    /// The batch's shape (`lua/call.lua`): its header line, then per rule its
    /// arguments (`args::encode`). Built here, once, and kept on the heap, so the batch stays
    /// small while it moves through the queue into its call.
    shape: Vec<u8>,
}

impl Encoded {
    /// Encodes `checks` (keys built by `key_of`), `taken` in place of the floors.
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
        let mut shape = Vec::with_capacity(64 + RULE_BYTES * checks.len());
        let extra = call.now.is_some() || taken.is_some() || call.min_delay != 0 || call.held != 0;
        push_header(&mut shape, &call, nkeys, checks.len(), extra);
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
            args::encode(check, key_id, &mut shape);
        }
        Self {
            keys,
            rules: checks.len(),
            call,
            taken: taken.map(<[u8]>::to_vec),
            extra,
            shape,
        }
    }

    /// How many rules the batch holds.
    pub(super) fn rules(&self) -> usize {
        self.rules
    }

    /// Bytes this batch adds to a command, about.
    fn size(&self) -> usize {
        self.keys.iter().map(|k| k.len() + 16).sum::<usize>() + self.shape.len() + 64
    }

    /// Pushes the batch's arguments; its shape as "" when it is `before`'s, the batch's
    /// just before it in the call (`lua/call.lua`).
    fn push_args(&self, cmd: &mut Cmd, before: Option<&Self>) {
        let call = &self.call;
        if before.is_some_and(|b| b.shape == self.shape) {
            cmd.arg("");
        } else {
            cmd.arg(&self.shape[..]);
        }
        if self.extra {
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
        Invocation::Function => cmd.arg("FCALL").arg(LIBRARY.as_str()),
        Invocation::Script => cmd.arg("EVALSHA").arg(SCRIPT.get_hash()),
    };
    cmd.arg(batches.iter().map(|b| b.keys.len()).sum::<usize>());
    for batch in batches {
        for key in &batch.keys {
            cmd.arg(&key[..]);
        }
    }
    let mut before = None;
    for &batch in batches {
        batch.push_args(&mut cmd, before);
        before = Some(batch);
    }
    cmd
}

/// The command that loads the code for `route` (`FUNCTION LOAD REPLACE`, `SCRIPT LOAD`).
pub(super) fn load_command(route: Invocation) -> Cmd {
    match route {
        Invocation::Function => {
            let mut cmd = redis::cmd("FUNCTION");
            let library = source(Some(&LIBRARY), |_, text| text.to_owned());
            cmd.arg("LOAD").arg("REPLACE").arg(library);
            cmd
        }
        Invocation::Script => {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(SOURCE.as_str());
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
/// The reply is one flat array (`lua/call.lua`): per batch, either its reply
/// ([`batch_reply`]) or -1 and the batch's error message. One array for the call keeps Redis
/// from building, and the client from parsing, a nested array per batch. Each batch's
/// integers are given back whole, for [`parse`]: admitted (1) or not (0), now, the wait,
/// then per rule all its [`FIELDS`].
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
    // The instants of the batch just before, which the next may leave out.
    let mut before = None;
    for rules in rules {
        let opening = match values.next() {
            Some(Value::Int(-1)) => {
                let message = match values.next() {
                    Some(Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                    Some(Value::SimpleString(text)) => text,
                    Some(other) => format!("{other:?}"),
                    None => return Err(bad()),
                };
                replies.push(Err(StoreError::Unavailable(message)));
                before = None;
                continue;
            }
            Some(Value::Int(opening)) if opening >= 0 => opening,
            _ => return Err(bad()),
        };
        let batch = batch_reply(&mut values, opening, rules, &mut before).ok_or_else(bad)?;
        replies.push(Ok(batch));
    }
    if values.next().is_some() {
        return Err(bad());
    }
    Ok(replies)
}

/// The reply of a batch of `rules` rules that opens with `opening` (see [`REPLY_ADMITTED`]),
/// then now and the reservation's wait unless the opening says they are the batch's before
/// (`before`, which then holds its own), then per rule its first values; read from `values`
/// and given back whole.
fn batch_reply(
    values: &mut impl Iterator<Item = Value>,
    opening: i64,
    rules: usize,
    before: &mut Option<(i64, i64)>,
) -> Option<Vec<i64>> {
    let mut next = || match values.next() {
        Some(Value::Int(i)) => Some(i),
        _ => None,
    };
    let width = usize::try_from(opening / REPLY_WIDTH)
        .ok()
        .filter(|&w| w <= FIELDS)?;
    let (now, wait) = match opening & REPLY_AGAIN {
        0 => (next()?, next()?),
        _ => (*before)?,
    };
    *before = Some((now, wait));
    let mut batch = Vec::with_capacity(rules.checked_mul(FIELDS)?.checked_add(3)?);
    batch.extend([opening & REPLY_ADMITTED, now, wait]);
    for _ in 0..rules {
        for _ in 0..width {
            batch.push(next()?);
        }
        batch.resize(batch.len() + FIELDS - width, 0);
    }
    Some(batch)
}

/// The script's reply to a `Decide`, `Peek` or `Deny` call.
#[derive(Debug, Clone)]
pub(super) struct Reply {
    pub(super) admitted: bool,
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
    /// One per check: whether its rule wrote over the state another configuration of its
    /// name left; that configuration's retry moved, so every deny cache must hear of it.
    pub(super) adopted: SmallVec<[bool; 4]>,
}

impl Reply {
    /// What a later `Store::refund` of this call's admissions needs, if it admitted.
    pub(super) fn admission(&self) -> Option<Admission> {
        self.admitted.then(|| Admission::new(self.taken.clone()))
    }
}

/// Parses the script's reply for `checks`, as [`split_reply`] gives it back.
pub(super) fn parse(values: &[i64], checks: &[&Check<'_>]) -> Result<Reply, StoreError> {
    let bad = || {
        StoreError::Protocol(format!(
            "script reply of {} integers for {} rules",
            values.len(),
            checks.len()
        ))
    };
    let [admitted, now, wait, ref fields @ ..] = *values else {
        return Err(bad());
    };
    if fields.len() != FIELDS * checks.len() {
        return Err(bad());
    }
    let admitted = admitted == REPLY_ADMITTED;
    let now = u64::try_from(now).map_err(|_| bad())?;
    let reserved = u64::try_from(wait)
        .ok()
        .and_then(|wait| now.checked_add(wait))
        .ok_or_else(bad)?;
    let n = checks.len();
    let mut reply = Reply {
        admitted,
        reserved,
        now,
        rules: Vec::with_capacity(n),
        taken: SmallVec::with_capacity(n),
        adopted: SmallVec::with_capacity(n),
    };
    for (check, v) in checks.iter().zip(fields.chunks_exact(FIELDS)) {
        let (rule, taken) = rule_reply(check, v, admitted, reserved).ok_or_else(bad)?;
        reply.rules.push(rule);
        reply.taken.push(taken);
        reply.adopted.push(v[FIELDS - 1] != 0);
    }
    Ok(reply)
}

/// A rule's values in the reply of a batch (admitted or not, the request reserved at
/// `reserved`): what it says, and what it took.
fn rule_reply(
    check: &Check<'_>,
    v: &[i64],
    admitted: bool,
    reserved: u64,
) -> Option<(RuleOutcome, Taken)> {
    let &[remaining, reset, mark, value, outcome, at, hold, _] = v else {
        return None;
    };
    let uint = |v: i64| u64::try_from(v).ok();
    let value = uint(value)?;
    let decision = match outcome {
        0 if value == 0 => Decision::Allow,
        0 => Decision::Delay(Duration::from_micros(value)),
        1 => batch::deny(DenyReason::Limited, Some(value)),
        2 => batch::deny(DenyReason::Locked, Some(value)),
        3 => batch::deny(DenyReason::CostExceedsCapacity, None),
        _ => return None,
    };
    let said = batch::rule_says(check.rule, decision, uint(remaining)?, uint(reset)?);
    // A rule counts the request only where it passes in an admitted batch; -1: pending,
    // counted only when the request is released.
    let taken = match at {
        _ if !admitted || outcome != 0 => Taken::default(),
        -1 => Taken::pending(),
        at => Taken {
            hold: uint(hold)?,
            ..Taken::at(
                StoreId::default(),
                reserved.checked_add(uint(at)?)?,
                uint(mark)?,
            )
        },
    };
    Some((said, taken))
}

/// Combines per-rule outcomes of `batch` the one way the crate does (see `batch::combine`).
pub(super) fn combine(rules: Vec<RuleOutcome>, batch: &[Check<'_>]) -> crate::decision::Outcome {
    batch::combine(rules, |i| batch.get(i).is_some_and(|c| c.in_shadow()))
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use crate::error::StoreError;

    /// A script reply is split into one result per batch by its rule count, a batch's error
    /// kept to that batch, each batch given back whole.
    #[test]
    fn a_call_reply_is_split_by_batch() {
        let ints = |v: &[i64]| v.iter().map(|&i| Value::Int(i)).collect::<Vec<_>>();
        // An admission of one rule in three values, a failed batch, a denial of two rules in
        // five, then at the same instants the admission of a batch without rules and one of
        // two rules in two values, and one at other instants in all eight.
        let mut flat = ints(&[13, 100, 0, 9, 10, 5]);
        flat.push(Value::Int(-1));
        flat.push(Value::BulkString(b"ERR oom".to_vec()));
        flat.extend(ints(&[20, 100, 0, 2, 5, 0, 3, 1, 7, 8, 0, 0, 0]));
        flat.extend(ints(&[3, 11, 8, 11, 7, 12]));
        flat.extend(ints(&[33, 200, 5, 1, 2, 3, 4, 0, 6, 7, 1]));
        let replies = super::split_reply(Value::Array(flat), [1, 1, 2, 0, 2, 1].into_iter())
            .expect("well formed");
        assert_eq!(replies.len(), 6);
        assert_eq!(replies[0], Ok(vec![1, 100, 0, 9, 10, 5, 0, 0, 0, 0, 0]));
        assert!(matches!(&replies[1], Err(StoreError::Unavailable(m)) if m == "ERR oom"));
        let denied = [0, 100, 0, 2, 5, 0, 3, 1, 0, 0, 0, 7, 8, 0, 0, 0, 0, 0, 0];
        assert_eq!(replies[2], Ok(denied.to_vec()));
        assert_eq!(replies[3], Ok(vec![1, 100, 0]));
        let again = [1, 100, 0, 8, 11, 0, 0, 0, 0, 0, 0, 7, 12, 0, 0, 0, 0, 0, 0];
        assert_eq!(replies[4], Ok(again.to_vec()));
        assert_eq!(replies[5], Ok(vec![1, 200, 5, 1, 2, 3, 4, 0, 6, 7, 1]));
    }

    /// A script reply whose length does not match the batches' rules is a protocol error.
    #[test]
    fn a_call_reply_of_another_length_is_refused() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|&i| Value::Int(i)).collect());
        let failed = |tail: &[i64]| {
            let mut v = vec![Value::Int(-1), Value::BulkString(b"ERR oom".to_vec())];
            v.extend(tail.iter().map(|&i| Value::Int(i)));
            Value::Array(v)
        };
        for (reply, rules) in [
            // Too short, too long, a count of batches that differs.
            (ints(&[13, 100, 0, 9, 10]), vec![1]),
            (ints(&[13, 100, 0, 9, 10, 0, 0]), vec![1]),
            (ints(&[13, 100, 0, 9, 10, 0]), vec![1, 1]),
            (ints(&[-1]), vec![1]),
            (Value::Int(2), vec![0]),
            // More values per rule than a rule has, an opening below -1.
            (ints(&[37, 100, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), vec![1]),
            (ints(&[-2, 100, 0]), vec![0]),
            // Instants left out with no batch before, or only a failed one.
            (ints(&[15, 9, 10, 0]), vec![1]),
            (failed(&[15, 9, 10, 0]), vec![1, 1]),
            (ints(&[13, 100, 0, 9, 10, 0, 15, 9, 10]), vec![1, 1]),
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

    /// A call sends a shape whole unless it is the batch's just before it, then as "".
    #[test]
    fn a_shape_repeated_by_the_next_batch_is_sent_empty() {
        let rate = crate::Rate::per_second(10);
        let (a, b) = (
            crate::Rule::gcra("a", 10, rate),
            crate::Rule::gcra("b", 20, rate),
        );
        let encode = |rule| {
            let check = crate::Check::new(rule, b"k");
            super::Encoded::new(
                super::Call::default(),
                &[&check],
                |_, _| b"k".to_vec(),
                None,
            )
        };
        let (x, y, z) = (encode(&a), encode(&a), encode(&b));
        let cmd = super::command(super::Invocation::Function, &[&x, &y, &z, &x]);
        // FCALL, the library, the key count and four keys; then a shape per batch.
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .skip(7)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("not a plain argument"),
            })
            .collect();
        assert_eq!(
            args,
            [
                x.shape.clone(),
                Vec::new(),
                z.shape.clone(),
                x.shape.clone()
            ]
        );
    }

    /// A shape's header is written as the plain decimals Lua reads, up to `u64::MAX`.
    #[test]
    fn headers_are_written_as_lua_reads_them() {
        let call = super::Call {
            now: None,
            max_wait: u64::MAX,
            mode: super::Op::Try,
            slack_ms: 10,
            min_delay: 0,
            held: 0,
        };
        let mut out = Vec::new();
        super::push_header(&mut out, &call, 0, 1_234_567_890, false);
        assert_eq!(
            out,
            format!("0 1234567890 {} 6 10 0\n", u64::MAX).into_bytes()
        );
    }
}
