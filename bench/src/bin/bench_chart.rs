//! Draws a benchmark CSV (`series,concurrency,value` rows, as the benches write to
//! `target/bench-*.csv`) as a PNG line chart, one line per series.
//!
//! ```sh
//! cargo run -p tollgate-bench --bin bench_chart -- \
//!     target/bench-redis.csv docs/redis.png "title" "decisions/s"
//! ```

use std::path::Path;
use std::process::ExitCode;

use tollgate_bench::chart;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(output)) = (args.first(), args.get(1)) else {
        eprintln!("usage: bench_chart <in.csv> <out.png> [title] [y label] [x label]");
        return ExitCode::FAILURE;
    };
    let title = args.get(2).map_or("tollgate benchmark", String::as_str);
    let y_label = args.get(3).map_or("decisions/s", String::as_str);
    let x_label = args.get(4).map_or("concurrency", String::as_str);
    let text = match std::fs::read_to_string(input) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("cannot read {input}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rows = chart::parse_csv(&text);
    if rows.is_empty() {
        eprintln!("{input}: no `series,concurrency,value` rows");
        return ExitCode::FAILURE;
    }
    match chart::draw(&rows, Path::new(output), title, x_label, y_label) {
        Ok(()) => {
            println!("wrote {output} ({} points)", rows.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot draw {output}: {e}");
            ExitCode::FAILURE
        }
    }
}
