//! The rules the Redis benches decide and the argument tollgate sends for them, shared by
//! `benches/redis.rs` and `benches/redis_profile.rs`.

use std::time::Duration;

use futures_util::StreamExt;
use tollgate::{store::RedisStore, Check, Limiter, Rate, Rule};

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

/// The key [`sent_argument`] decides on, to find its call among the others.
const MARKER: &str = "bench-sent-argument";

/// The argument a `RedisStore` sends for one batch of `rules` on one key (the batch's
/// shape and each rule's packed arguments, as `lua/call.lua` reads them), read from
/// `MONITOR` while the store decides such a batch on the server at `url`. The raw paths
/// replay it with keys of their own: they measure the crate's own encoding, written in one
/// place (`src/store/redis/script/args.rs`), not a copy of it.
pub async fn sent_argument(url: &str, rules: &[Rule]) -> Vec<u8> {
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut calls = client
        .get_async_monitor()
        .await
        .expect("MONITOR")
        .into_on_message::<String>();
    let limiter = Limiter::new(RedisStore::connect(url).await.expect("connect"));
    let batch: Vec<Check<'_>> = rules
        .iter()
        .map(|r| Check::new(r, MARKER.as_bytes()))
        .collect();
    limiter.check(&batch).await.expect("decided");
    while let Some(line) = calls.next().await {
        let words = monitored_words(&line);
        let call = words.first().map(|w| w.to_ascii_lowercase());
        let ours = words.iter().any(|w| contains(w, MARKER));
        if ours && matches!(call.as_deref(), Some(b"fcall" | b"evalsha")) {
            if let Some(argument) = words.last() {
                return argument.clone();
            }
        }
    }
    panic!("MONITOR ended before the batch's call was seen");
}

fn contains(word: &[u8], marker: &str) -> bool {
    word.windows(marker.len()).any(|w| w == marker.as_bytes())
}

/// The quoted words of a `MONITOR` line (`<time> [<db> <client>] "cmd" "arg" …`), unescaped
/// as Redis escapes them (`\\`, `\"`, `\n`, `\r`, `\t`, `\a`, `\b`, `\xHH`).
fn monitored_words(line: &str) -> Vec<Vec<u8>> {
    let mut words = Vec::new();
    let mut bytes = line.bytes();
    while let Some(b) = bytes.next() {
        if b != b'"' {
            continue;
        }
        let mut word = Vec::new();
        while let Some(b) = bytes.next() {
            match b {
                b'"' => break,
                b'\\' => match bytes.next() {
                    Some(b'n') => word.push(b'\n'),
                    Some(b'r') => word.push(b'\r'),
                    Some(b't') => word.push(b'\t'),
                    Some(b'a') => word.push(0x07),
                    Some(b'b') => word.push(0x08),
                    Some(b'x') => {
                        let hex = [bytes.next(), bytes.next()];
                        let hex: Vec<u8> = hex.into_iter().flatten().collect();
                        let text = std::str::from_utf8(&hex).expect("hex digits");
                        word.push(u8::from_str_radix(text, 16).expect("an escaped byte"));
                    }
                    Some(other) => word.push(other),
                    None => break,
                },
                other => word.push(other),
            }
        }
        words.push(word);
    }
    words
}
