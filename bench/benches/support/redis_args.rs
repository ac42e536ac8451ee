//! The rules the Redis benches decide and the per-rule arguments tollgate sends for them,
//! shared by `benches/redis.rs` and `benches/redis_profile.rs`.

use std::time::Duration;

use tollgate::{Rate, Rule};

/// The first `n` of: a GCRA rule, a fixed window and a token bucket, each roomy enough
/// (2^30 a second or a minute) that every request is admitted.
pub fn rules(n: usize) -> Vec<Rule> {
    let big = 1 << 30;
    let all = vec![
        Rule::gcra("api", Rate::per_second(big), big),
        Rule::fixed_window("minute", big, Duration::from_secs(60)),
        Rule::token_bucket("burst", big, Rate::per_second(big)),
    ];
    all.into_iter().take(n).collect()
}

/// The per-rule arguments tollgate sends for `rules` (see lua/batch.lua: thirteen
/// little-endian doubles), written out by hand. 2^30 per second is 2^24 per 15,625 µs in
/// lowest terms.
pub fn raw_args(rules: &[Rule]) -> Vec<Vec<u8>> {
    let big = (1u64 << 30) as f64;
    let amount = (1u64 << 24) as f64;
    rules
        .iter()
        .map(|r| {
            let [code, p1, p2, p3, p4] = match r.name() {
                "api" => [6.0, big, 15625.0, amount, 0.0],
                "minute" => [1.0, big, 60e6, 0.0, 0.0],
                _ => [4.0, big, amount, 15625.0, 0.0],
            };
            let fingerprint = r.fingerprint() as f64;
            let fields: [f64; 13] = [
                code,
                1.0,
                p1,
                p2,
                p3,
                p4,
                0.0,
                0.0,
                0.0,
                0.0,
                fingerprint,
                big,
                0.0,
            ];
            fields.iter().flat_map(|f| f.to_le_bytes()).collect()
        })
        .collect()
}
