//! The seeds' SMS case on the in-process store: per phone number at most 1 message per
//! minute, 5 per hour and 10 per day, decided as one batch so a refused message uses up
//! nothing. Time is simulated with a `ManualClock`, so a simulated day runs in an instant.
//!
//! The rules are sliding logs, as the README's table of algorithms recommends for SMS: "1 per
//! minute" means no two messages within any 60 seconds. A fixed window would let two through
//! 11 seconds apart when a minute turns between them.
//!
//! Run: `cargo run --example sms`

use std::time::Duration;

use tollgate::{store::MemoryStore, Check, Clock, Decision, Limiter, ManualClock, Rule};

/// Per phone number: 1 a minute, 5 an hour, 10 a day, each over any such span of time.
fn rules() -> [Rule; 3] {
    [
        Rule::sliding_log("sms-minute", 1, Duration::from_secs(60)),
        Rule::sliding_log("sms-hour", 5, Duration::from_secs(3600)),
        Rule::sliding_log("sms-day", 10, Duration::from_secs(86_400)),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG` picks what is printed (default: info, so store failures and the layer's
    // warnings show); without a subscriber they would go nowhere.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
                .from_env_lossy(),
        )
        .init();
    let start = 1_700_000_000_000_000; // µs since the epoch
    let clock = ManualClock::new(start);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    let rules = rules();
    let phone = b"+86 138 0000 0000";

    // Someone asks for a code every 20 seconds for a while.
    for attempt in 1..=30 {
        let batch: Vec<Check<'_>> = rules.iter().map(|r| Check::new(r, phone)).collect();
        let outcome = limiter.check(&batch).await?;
        let at = Duration::from_micros(clock.now_micros() - start);
        let left: Vec<String> = rules
            .iter()
            .zip(&outcome.rules)
            .map(|(rule, r)| format!("{}={}", rule.name(), r.info.remaining))
            .collect();
        match outcome.decision {
            Decision::Allow | Decision::Delay(_) => {
                println!(
                    "t={:>5}s attempt {attempt:>2}: sent      [{}]",
                    at.as_secs(),
                    left.join(" ")
                );
            }
            Decision::Deny(denial) => {
                let rule = outcome.deciding_rule().map_or("?", |i| rules[i].name());
                let retry = denial.retry_after.map_or("never".to_string(), |d| {
                    format!("{}s", d.as_secs_f64().ceil())
                });
                println!(
                    "t={:>5}s attempt {attempt:>2}: denied by {rule}, retry after {retry} [{}]",
                    at.as_secs(),
                    left.join(" ")
                );
            }
        }
        clock.advance(Duration::from_secs(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two messages 11 seconds apart, with a minute turning between them: the second is
    /// refused until the first is a minute old.
    #[tokio::test]
    async fn one_a_minute_holds_across_the_turn_of_a_minute() {
        let minute = 60_000_000;
        let turn = 1_700_000_000_000_000 / minute * minute + minute;
        let clock = ManualClock::new(turn - 5_000_000);
        let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
        let rules = rules();
        let phone = b"+86 138 0000 0000";
        let batch: Vec<Check<'_>> = rules.iter().map(|r| Check::new(r, phone)).collect();
        assert!(limiter.check(&batch).await.unwrap().is_admitted());
        clock.advance(Duration::from_secs(11));
        let second = limiter.check(&batch).await.unwrap();
        let denial = second
            .decision
            .denial()
            .expect("a second message 11 s later");
        assert_eq!(denial.retry_after, Some(Duration::from_secs(49)));
    }
}
