//! The rules the Redis benches decide and the per-rule arguments tollgate sends for them,
//! shared by `benches/redis.rs` and `benches/redis_profile.rs`.

use std::time::Duration;

use tollgate::{Rate, Rule};

/// The first `n` of: a GCRA rule, a fixed window and a token bucket, each roomy enough
/// (2^30 a second or a minute) that every request is admitted.
pub fn rules(n: usize) -> Vec<Rule> {
    let big = 1 << 30;
    let all = vec![
        Rule::gcra("api", big, Rate::per_second(big)),
        Rule::fixed_window("minute", big, Duration::from_secs(60)),
        Rule::token_bucket("burst", big, Rate::per_second(big)),
    ];
    all.into_iter().take(n).collect()
}

/// The algorithm codes of `rules` (`FIXED_WINDOW`, `TOKEN_BUCKET`, `GCRA` in
/// lua/prelude.lua).
const FIXED_WINDOW: u64 = 1;
const TOKEN_BUCKET: u64 = 4;
const GCRA: u64 = 6;

/// A rule's packed argument, field for field as `RuleArgs` in src/store/redis/script.rs
/// (which a bench cannot reach: it is private to the crate) and lua/record.lua's
/// `rule_args` read it: fourteen little-endian doubles, in this order.
struct RuleArgs {
    code: u64,
    cost: u64,
    p1: u64,
    p2: u64,
    p3: u64,
    p4: u64,
    lock_for: u64,
    after: u64,
    within: u64,
    shadow: bool,
    fingerprint: u64,
    quota: u64,
    key_id: u64,
    defers_denials: bool,
}

impl RuleArgs {
    fn encode(&self) -> Vec<u8> {
        [
            self.code,
            self.cost,
            self.p1,
            self.p2,
            self.p3,
            self.p4,
            self.lock_for,
            self.after,
            self.within,
            u64::from(self.shadow),
            self.fingerprint,
            self.quota,
            self.key_id,
            u64::from(self.defers_denials),
        ]
        .iter()
        .flat_map(|&v| (v as f64).to_le_bytes())
        .collect()
    }
}

/// The per-rule arguments tollgate sends for `rules`, written out by hand: cost 1, no
/// penalty, enforced, each rule on its own key id 0. 2^30 per second is 2^24 per 15,625 µs
/// in lowest terms.
pub fn raw_args(rules: &[Rule]) -> Vec<Vec<u8>> {
    let big = 1u64 << 30;
    let amount = 1u64 << 24;
    rules
        .iter()
        .map(|r| {
            let (code, [p1, p2, p3, p4]) = match r.name() {
                "api" => (GCRA, [big, 15625, amount, 0]),
                "minute" => (FIXED_WINDOW, [big, 60_000_000, 0, 0]),
                _ => (TOKEN_BUCKET, [big, amount, 15625, 0]),
            };
            RuleArgs {
                code,
                cost: 1,
                p1,
                p2,
                p3,
                p4,
                lock_for: 0,
                after: 0,
                within: 0,
                shadow: false,
                fingerprint: r.fingerprint(),
                quota: big,
                key_id: 0,
                defers_denials: false,
            }
            .encode()
        })
        .collect()
}
