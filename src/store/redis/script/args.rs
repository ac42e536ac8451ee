//! A rule's packed argument and the codes the scripts know its algorithm by: the Rust half
//! of `lua/record.lua`'s `rule_args` and of the constants in `lua/prelude.lua`.

use crate::algorithm::Algorithm;
use crate::clock::duration_to_micros;
use crate::store::check::{Check, Refusal};

/// The code the scripts know an algorithm by (`models[code]`; the names in
/// `lua/prelude.lua`). The fingerprint's encoding carries the same numbers
/// (`Algorithm::code_and_params`, which a test here holds to these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    FixedWindow = 1,
    SlidingLog = 2,
    SlidingWindow = 3,
    TokenBucket = 4,
    LeakyBucket = 5,
    Gcra = 6,
}

impl Code {
    /// The code of `algorithm`'s model.
    pub(super) fn of(algorithm: &Algorithm) -> Self {
        match algorithm {
            Algorithm::FixedWindow(_) => Code::FixedWindow,
            Algorithm::SlidingLog(_) => Code::SlidingLog,
            Algorithm::SlidingWindow(_) => Code::SlidingWindow,
            Algorithm::TokenBucket(_) => Code::TokenBucket,
            Algorithm::LeakyBucket(_) => Code::LeakyBucket,
            Algorithm::Gcra(_) => Code::Gcra,
        }
    }
}

/// One rule's packed argument (`lua/record.lua`'s `rule_args`): the fields in this order,
/// each a little-endian double, `refusal` as its number (`Refusal`: 0 enforced, 1 shadow, 2 deferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RuleArgs {
    pub(super) code: Code,
    /// Units the request consumes.
    pub(super) cost: u64,
    /// The algorithm's parameters (see each algorithm's file in `lua/`).
    pub(super) p1: u64,
    pub(super) p2: u64,
    pub(super) p3: u64,
    pub(super) p4: u64,
    /// The penalty: µs a lock lasts, denials that lock (0 = no penalty), and the µs they
    /// are counted within.
    pub(super) lock_for: u64,
    pub(super) after: u64,
    pub(super) within: u64,
    /// What its refusal does (`Check::refusal`).
    pub(super) refusal: Refusal,
    /// `Rule::fingerprint`.
    pub(super) fingerprint: u64,
    /// `Algorithm::quota`.
    pub(super) quota: u64,
    /// The index of the batch's first rule on the same client key (batch::key_release).
    pub(super) key_id: u64,
}

impl RuleArgs {
    /// The encoded length: thirteen doubles (`RULE_BYTES` in `lua/record.lua`).
    pub(super) const BYTES: usize = 13 * 8;

    /// The arguments of `check`, the batch's first rule on its key being the `key_id`th.
    pub(super) fn of(check: &Check<'_>, key_id: usize) -> Self {
        let algorithm = check.rule.algorithm();
        let [_, p1, p2, p3, p4] = algorithm.code_and_params();
        let (lock_for, after, within) = match check.rule.penalty() {
            Some(p) => (
                duration_to_micros(p.lock_duration()),
                p.denials(),
                duration_to_micros(p.window()),
            ),
            None => (0, 0, 0),
        };
        Self {
            code: Code::of(algorithm),
            cost: check.cost,
            p1,
            p2,
            p3,
            p4,
            lock_for,
            after,
            within,
            refusal: check.refusal,
            fingerprint: check.rule.fingerprint(),
            quota: algorithm.quota().0,
            key_id: key_id as u64,
        }
    }

    /// Appends the encoding the scripts unpack (the benchmarks replay what it writes).
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let fields = [
            self.code as u64,
            self.cost,
            self.p1,
            self.p2,
            self.p3,
            self.p4,
            self.lock_for,
            self.after,
            self.within,
            self.refusal as u64,
            self.fingerprint,
            self.quota,
            self.key_id,
        ];
        for value in fields {
            out.extend_from_slice(&exact_double(value).to_le_bytes());
        }
    }
}

/// `value` as a double, exact: configuration validation keeps every parameter below 2^50.
/// Larger values (a cost, lock or window beyond 2^52 µs, about 142 years) are capped at
/// 2^52, which every comparison in the scripts treats the same as the value itself (a cost
/// that large exceeds every capacity).
pub(super) fn exact_double(value: u64) -> f64 {
    const CAP: u64 = 1 << 52;
    value.min(CAP) as f64
}

#[cfg(test)]
mod tests {
    use super::super::{Op, REPLY_ADMITTED, REPLY_AGAIN, REPLY_WIDTH};
    use super::{Code, Refusal, RuleArgs};
    use crate::{Rate, Rule};

    /// The value of `local <name>, … = <value>, …` in `source`, by name.
    fn lua_constant(source: &str, name: &str) -> Option<u64> {
        source.lines().find_map(|line| {
            let (names, values) = line.strip_prefix("local ")?.split_once(" = ")?;
            let at = names.split(", ").position(|n| n == name)?;
            values.split(", ").nth(at)?.trim().parse().ok()
        })
    }

    /// The algorithm, mode and reply codes and the rule record size agree with the Lua scripts'
    /// constants.
    #[test]
    fn the_codes_are_the_scripts_and_the_fingerprints() {
        let prelude = include_str!("../../../../lua/prelude.lua");
        let window = std::time::Duration::from_secs(1);
        let rate = Rate::per_second(10);
        for (rule, name) in [
            (Rule::fixed_window("a", 10, window), "FIXED_WINDOW"),
            (Rule::sliding_log("a", 10, window), "SLIDING_LOG"),
            (Rule::sliding_window("a", 10, window), "SLIDING_WINDOW"),
            (Rule::token_bucket("a", 10, rate), "TOKEN_BUCKET"),
            (Rule::leaky_bucket("a", 10, rate), "LEAKY_BUCKET"),
            (Rule::gcra("a", 10, rate), "GCRA"),
        ] {
            let code = Code::of(rule.algorithm()) as u64;
            assert_eq!(code, rule.algorithm().code_and_params()[0], "{name}");
            assert_eq!(lua_constant(prelude, name), Some(code), "{name}");
        }
        for (mode, name) in [
            (Op::Decide, "MODE_DECIDE"),
            (Op::Peek, "MODE_PEEK"),
            (Op::Deny, "MODE_DENY"),
            (Op::Refund, "MODE_REFUND"),
            (Op::RefundHeld, "MODE_REFUND_HELD"),
            (Op::Overdraw, "MODE_OVERDRAW"),
            (Op::Try, "MODE_TRY"),
        ] {
            assert_eq!(lua_constant(prelude, name), Some(mode as u64), "{name}");
        }
        for (opening, name) in [
            (REPLY_ADMITTED, "REPLY_ADMITTED"),
            (REPLY_AGAIN, "REPLY_AGAIN"),
            (REPLY_WIDTH, "REPLY_WIDTH"),
        ] {
            assert_eq!(lua_constant(prelude, name), Some(opening as u64), "{name}");
        }
        let record = include_str!("../../../../lua/record.lua");
        assert_eq!(
            lua_constant(record, "RULE_BYTES"),
            Some(RuleArgs::BYTES as u64)
        );
    }

    /// Rule arguments encode as thirteen little-endian doubles in the order the script
    /// reads them.
    #[test]
    fn rule_args_are_thirteen_doubles_in_order() {
        let args = RuleArgs {
            code: Code::Gcra,
            cost: 2,
            p1: 3,
            p2: 4,
            p3: 5,
            p4: 6,
            lock_for: 7,
            after: 8,
            within: 9,
            refusal: Refusal::Deferred,
            fingerprint: 11,
            quota: 12,
            key_id: 13,
        };
        let mut out = Vec::new();
        args.encode(&mut out);
        let values: Vec<f64> = out
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("eight bytes")))
            .collect();
        let expected: Vec<f64> = [6, 2, 3, 4, 5, 6, 7, 8, 9, 2, 11, 12, 13]
            .into_iter()
            .map(f64::from)
            .collect();
        assert_eq!(values, expected);
        assert_eq!(out.len(), RuleArgs::BYTES);
    }
}
