//! A rule's packed argument: the Rust half of `lua/record.lua`'s `rule_args`.

use crate::clock::duration_to_micros;
use crate::store::check::Check;

/// The encoded length of a rule's arguments: thirteen doubles (`RULE_BYTES` in
/// `lua/record.lua`).
pub(super) const RULE_BYTES: usize = 13 * 8;

/// Appends the arguments of `check`, the batch's first rule on its key being the `key_id`th
/// (batch::key_release), as the scripts unpack them (the benchmarks replay what it writes):
/// thirteen little-endian doubles, in this order.
pub(super) fn encode(check: &Check<'_>, key_id: usize, out: &mut Vec<u8>) {
    let algorithm = check.rule.algorithm();
    // The code the scripts know the model by (`models[code]`, named in `lua/prelude.lua`)
    // and its parameters (see each algorithm's file in `lua/`).
    let [code, p1, p2, p3, p4] = algorithm.code_and_params();
    // µs a lock lasts, denials that lock (0 = no penalty), and the µs they are counted within.
    let (lock_for, after, within) = match check.rule.penalty() {
        Some(p) => (
            duration_to_micros(p.lock_duration()),
            p.denials(),
            duration_to_micros(p.window()),
        ),
        None => (0, 0, 0),
    };
    let fields = [
        code,
        check.cost,
        p1,
        p2,
        p3,
        p4,
        lock_for,
        after,
        within,
        check.refusal as u64,
        check.rule.fingerprint(),
        algorithm.quota().0,
        key_id as u64,
    ];
    for value in fields {
        out.extend_from_slice(&exact_double(value).to_le_bytes());
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
    use std::time::Duration;

    use super::super::{Op, REPLY_ADMITTED, REPLY_AGAIN, REPLY_WIDTH};
    use super::RULE_BYTES;
    use crate::store::check::{Check, Refusal};
    use crate::{Penalty, Rate, Rule};

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
            let code = rule.algorithm().code_and_params()[0];
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
            (Op::Lease, "MODE_LEASE"),
            (Op::End, "MODE_END"),
            (Op::Reset, "MODE_RESET"),
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
        assert_eq!(lua_constant(record, "RULE_BYTES"), Some(RULE_BYTES as u64));
        assert_eq!(
            lua_constant(record, "REFUSALS_KEPT_US"),
            Some(crate::penalty::REFUSALS_KEPT_MICROS)
        );
    }

    /// Rule arguments encode as thirteen little-endian doubles in the order the script
    /// reads them.
    #[test]
    fn rule_args_are_thirteen_doubles_in_order() {
        let rule = Rule::gcra("a", 12, Rate::per_second(5)).with_penalty(
            Penalty::lock_for(Duration::from_micros(7))
                .after(8)
                .within(Duration::from_micros(9)),
        );
        let check = Check {
            cost: 2,
            refusal: Refusal::Deferred,
            ..Check::new(&rule, b"k")
        };
        let mut out = Vec::new();
        super::encode(&check, 13, &mut out);
        let values: Vec<f64> = out
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("eight bytes")))
            .collect();
        let [code, p1, p2, p3, p4] = rule.algorithm().code_and_params();
        let expected: Vec<f64> = [code, 2, p1, p2, p3, p4, 7, 8, 9, 2]
            .into_iter()
            .chain([rule.fingerprint(), 12, 13])
            .map(|v| v as f64)
            .collect();
        assert_eq!(values, expected);
        assert_eq!(out.len(), RULE_BYTES);
    }
}
