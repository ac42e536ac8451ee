//! The six algorithms side by side on the same traffic, drawn into a PNG.
//!
//! Each algorithm gets the same quota, 10 requests per second, and three kinds of traffic:
//! a steady 20 per second, bursts of 25, and bursts of 30 straddling a second boundary. The
//! decisions are tollgate's own (`MemoryStore` on a `ManualClock`, so they are exact and the
//! same on every run); the chart shows, per 100 ms, the requests sent (grey) and those
//! admitted (colour, at the instant they pass: a leaky bucket's admitted requests pass
//! later, evenly spaced). Each panel says how many were admitted and the most admitted
//! within any 1 s: the fixed window's boundary burst is where that exceeds 10.
//!
//! ```sh
//! cargo run -p tollgate-bench --bin algorithms_chart             # writes docs/algorithms.png
//! cargo run -p tollgate-bench --bin algorithms_chart -- out.png  # or another file
//! ```
//!
//! The text is drawn with a font that ships inside a crate (Hack, from
//! `epaint_default_fonts`), so it renders on a machine without any fonts installed.

use std::time::Duration;

use plotters::prelude::*;
use plotters::style::FontStyle;
use tollgate::{store::MemoryStore, Check, Decision, Limiter, ManualClock, Rate, Rule};

/// An instant on a whole second, so fixed windows begin at offsets 0 s, 1 s, 2 s, ….
const START_MICROS: u64 = 1_700_000_000_000_000;
const SECOND: u64 = 1_000_000;
const MS: u64 = 1_000;
/// Simulated time per panel.
const RUN: u64 = 4 * SECOND;
/// The width of a bar.
const BUCKET: u64 = 100 * MS;

/// One kind of traffic: when requests are sent, in µs from the start.
pub struct Traffic {
    /// A short name for the panel's column.
    pub name: &'static str,
    /// The send instants, in order.
    pub sends: Vec<u64>,
}

/// The three kinds of traffic.
pub fn traffic() -> Vec<Traffic> {
    // Twice the quota, evenly: every algorithm settles at 10 per second; the bursty ones
    // first spend their stored burst.
    let steady = (0..RUN).step_by(50_000).collect();
    // 25 requests within 25 ms, three times: how much of a burst each lets through.
    let bursty = [200 * MS, 1_700 * MS, 3_200 * MS]
        .iter()
        .flat_map(|&at| (0..25).map(move |i| at + i * MS))
        .collect();
    // 15 requests in the last 90 ms of a second and 15 in the first 90 ms of the next,
    // twice: a fixed window counts them in two windows and admits 10 + 10.
    let boundary = [SECOND, 3 * SECOND]
        .iter()
        .flat_map(|&edge| (0..30).map(move |i| edge - 90 * MS + i * 6 * MS))
        .collect();
    vec![
        Traffic {
            name: "steady: 20 per second",
            sends: steady,
        },
        Traffic {
            name: "bursts of 25",
            sends: bursty,
        },
        Traffic {
            name: "30 across a window boundary",
            sends: boundary,
        },
    ]
}

/// The six algorithms, each with a quota of 10 per second, and a label for the chart.
pub fn rules() -> Vec<(Rule, &'static str)> {
    let second = Duration::from_secs(1);
    let rate = Rate::per_second(10);
    vec![
        (
            Rule::fixed_window("fixed-window", 10, second),
            "fixed window: 10 per 1 s window",
        ),
        (
            Rule::sliding_log("sliding-log", 10, second),
            "sliding log: 10 in any 1 s",
        ),
        (
            Rule::sliding_window("sliding-window", 10, second),
            "sliding window: 10 per 1 s, weighted",
        ),
        (
            Rule::token_bucket("token-bucket", 10, rate),
            "token bucket: 10, refilled 10/s",
        ),
        (
            Rule::leaky_bucket("leaky-bucket", 10, rate),
            "leaky bucket: queue of 10, 10/s out",
        ),
        (Rule::gcra("gcra", 10, rate), "GCRA: 10/s, burst 10"),
    ]
}

/// When each admitted request passes (µs from the start): at once, or after its shaping
/// delay.
pub async fn simulate(rule: &Rule, sends: &[u64]) -> Result<Vec<u64>, tollgate::StoreError> {
    let clock = ManualClock::new(START_MICROS);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
    let mut passes = Vec::new();
    for &at in sends {
        clock.set_micros(START_MICROS + at);
        let outcome = limiter.check(&[Check::new(rule, b"client")]).await?;
        match outcome.decision {
            Decision::Allow => passes.push(at),
            Decision::Delay(delay) => passes.push(at + delay.as_micros() as u64),
            Decision::Deny(_) => {}
        }
    }
    passes.sort_unstable();
    Ok(passes)
}

/// The most instants of `passes` (sorted) within any interval of `window` µs.
pub fn most_within(passes: &[u64], window: u64) -> usize {
    let mut first = 0;
    let mut most = 0;
    for (last, &at) in passes.iter().enumerate() {
        while at - passes[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// How many of `instants` fall in each bar.
fn per_bucket(instants: &[u64]) -> Vec<u32> {
    let mut counts = vec![0; (RUN / BUCKET) as usize];
    for &at in instants {
        if let Some(count) = counts.get_mut((at / BUCKET) as usize) {
            *count += 1;
        }
    }
    counts
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];
const SENT: RGBColor = RGBColor(215, 215, 215);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        tollgate_bench::repo_root()
            .join("docs/algorithms.png")
            .display()
            .to_string()
    });
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| "the embedded font does not load")?;

    let traffic = traffic();
    let rules = rules();
    let root = BitMapBackend::new(&path, (1500, 1300)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Six algorithms, one quota (10 per second), the same traffic: \
         requests sent (grey) and admitted (colour) per 100 ms",
        ("sans-serif", 20),
    )?;
    let columns = root.split_evenly((1, traffic.len()));
    for (column, traffic) in columns.iter().zip(&traffic) {
        let column = column.titled(traffic.name, ("sans-serif", 18))?;
        let sent = per_bucket(&traffic.sends);
        let top = sent.iter().copied().max().unwrap_or(1);
        for ((row, (rule, label)), colour) in column
            .split_evenly((rules.len(), 1))
            .iter()
            .zip(&rules)
            .zip(COLOURS)
        {
            let passes = simulate(rule, &traffic.sends).await?;
            let admitted = per_bucket(&passes);
            let row = row.titled(label, ("sans-serif", 14))?;
            let caption = format!(
                "admitted {} of {}, most in any 1 s: {}",
                passes.len(),
                traffic.sends.len(),
                most_within(&passes, SECOND)
            );
            let mut chart = ChartBuilder::on(&row)
                .margin_left(6)
                .margin_right(12)
                .caption(caption, ("sans-serif", 12))
                .x_label_area_size(18)
                .y_label_area_size(28)
                .build_cartesian_2d(0u64..RUN, 0u32..top + 1)?;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .y_labels(3)
                .x_labels(5)
                .x_label_formatter(&|us| format!("{} s", us / SECOND))
                .label_style(("sans-serif", 11))
                .draw()?;
            let bars = |counts: Vec<u32>, style: ShapeStyle| {
                counts
                    .into_iter()
                    .enumerate()
                    .filter(|&(_, n)| n > 0)
                    .map(move |(i, n)| {
                        let x = i as u64 * BUCKET;
                        Rectangle::new([(x + 5 * MS, 0), (x + BUCKET - 5 * MS, n)], style)
                    })
            };
            chart.draw_series(bars(sent.clone(), SENT.filled()))?;
            chart.draw_series(bars(admitted, colour.filled()))?;
        }
    }
    root.present()?;
    println!("wrote {path}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn passes(rule_name: &str, traffic_name: &str) -> Vec<u64> {
        let traffic = traffic();
        let traffic = traffic.iter().find(|t| t.name.starts_with(traffic_name));
        let rules = rules();
        let rule = rules.iter().find(|(r, _)| r.name() == rule_name);
        let (Some(traffic), Some((rule, _))) = (traffic, rule) else {
            panic!("no {rule_name} or {traffic_name}");
        };
        simulate(rule, &traffic.sends).await.unwrap()
    }

    #[tokio::test]
    async fn the_fixed_window_admits_twice_its_limit_across_a_boundary_and_the_sliding_log_never_does(
    ) {
        assert_eq!(
            most_within(&passes("fixed-window", "30 across").await, SECOND),
            20
        );
        for traffic in ["steady", "bursts", "30 across"] {
            let log = passes("sliding-log", traffic).await;
            assert_eq!(most_within(&log, SECOND), 10, "{traffic}");
        }
    }

    #[tokio::test]
    async fn the_leaky_bucket_spaces_what_it_admits_and_the_token_bucket_lets_a_burst_through() {
        let leaky = passes("leaky-bucket", "bursts").await;
        assert!(
            leaky.windows(2).all(|w| w[1] - w[0] >= 100 * MS),
            "{leaky:?}"
        );
        let token = passes("token-bucket", "bursts").await;
        assert_eq!(most_within(&token, 25 * MS), 10, "{token:?}");
    }

    /// What the README says of the sliding window counter: its estimate assumes the
    /// previous window was evenly spread, so a burst at a window's end followed by steady
    /// traffic passes more than the limit within one window's length.
    #[tokio::test]
    async fn the_sliding_window_estimate_can_pass_more_than_the_limit_in_some_interval() {
        let rules = rules();
        let Some((rule, _)) = rules.iter().find(|(r, _)| r.name() == "sliding-window") else {
            panic!("no sliding window");
        };
        let burst = (0..10).map(|i| 950 * MS + i * 4 * MS);
        let steady = (SECOND..2 * SECOND).step_by(10_000);
        let sends: Vec<u64> = burst.chain(steady).collect();
        let passes = simulate(rule, &sends).await.unwrap();
        // 19 within one second, for a limit of 10 (a fixed window's worst is 20).
        assert_eq!(most_within(&passes, SECOND), 19, "{passes:?}");
    }

    #[test]
    fn most_within_counts_the_busiest_interval() {
        assert_eq!(most_within(&[], SECOND), 0);
        assert_eq!(most_within(&[0, 10, 999_999, 1_000_000], SECOND), 3);
    }
}
