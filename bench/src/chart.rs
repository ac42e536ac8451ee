//! Line charts of benchmark figures, as PNG: one line per series, a y value against a
//! concurrency, each concurrency measured one step along the x axis (1, 4, 16, 64 evenly
//! spaced, as on a log scale). The rows come from a CSV of `series,concurrency,value`
//! (a header line is skipped), the format the benches write to `target/bench-*.csv`.
//!
//! Used by `benches/http.rs` and the `bench_chart` binary. Text is drawn with a font that
//! ships inside a crate (`epaint_default_fonts`), so a machine without system fonts renders
//! the same chart.

use std::error::Error;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// One point of a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The line this point belongs to.
    pub series: String,
    /// The x value: concurrent connections or callers.
    pub concurrency: u32,
    /// The y value: what was measured at that concurrency.
    pub value: f64,
}

/// The rows of a `series,concurrency,value` CSV. Lines whose last two fields are not
/// numbers (a header) and blank lines are skipped; a series name may not contain a comma.
pub fn parse_csv(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.rsplitn(3, ',');
            let value = fields.next()?.trim().parse().ok()?;
            let concurrency = fields.next()?.trim().parse().ok()?;
            let series = fields.next()?.trim().to_owned();
            Some(Row {
                series,
                concurrency,
                value,
            })
        })
        .collect()
}

/// The CSV text of `rows`, with a header naming the value column `value_name`.
pub fn to_csv(rows: &[Row], value_name: &str) -> String {
    let mut out = format!("series,concurrency,{value_name}\n");
    for row in rows {
        out.push_str(&format!(
            "{},{},{:.0}\n",
            row.series, row.concurrency, row.value
        ));
    }
    out
}

/// Draws `rows` as one line per series (in order of first appearance) to a PNG at `out`.
pub fn draw(
    rows: &[Row],
    out: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
) -> Result<(), Box<dyn Error>> {
    register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::UBUNTU_LIGHT,
    )
    .map_err(|_| "the embedded font does not load")?;
    let mut series: Vec<&str> = Vec::new();
    for row in rows {
        if !series.contains(&row.series.as_str()) {
            series.push(&row.series);
        }
    }
    let mut levels: Vec<u32> = rows.iter().map(|r| r.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    let step = |c: u32| levels.iter().position(|&l| l == c).unwrap_or(0) as u32;
    let last = (levels.len() as u32).saturating_sub(1).max(1);
    let y_max = rows.iter().map(|r| r.value).fold(0.0, f64::max) * 1.1;
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };

    let root = BitMapBackend::new(out, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(0u32..last, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_labels(levels.len().max(2))
        .x_label_formatter(&|i| {
            levels
                .get(*i as usize)
                .map_or(String::new(), u32::to_string)
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (i, name) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut points: Vec<(u32, f64)> = rows
            .iter()
            .filter(|r| r.series == *name)
            .map(|r| (step(r.concurrency), r.value))
            .collect();
        points.sort_by_key(|p| p.0);
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
