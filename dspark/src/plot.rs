//! The bench's PNG: verify cost v(k) for each compute path (stepwise and batched), next to the
//! k = v(k) line where speculation cannot pay, drawn with plotters' bitmap backend. Text is
//! rendered with ab_glyph from a system TrueType font (DejaVu Sans or Liberation Sans); with
//! none installed the plot is skipped with a message, since the numbers are also in bench.json.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn register_font() -> Option<PathBuf> {
    let path = FONTS.iter().map(PathBuf::from).find(|p| p.is_file())?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(&path).ok()?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).ok()?;
    Some(path)
}

/// One curve: its label and v(1..=n).
pub struct Curve {
    pub label: String,
    pub values: Vec<f64>,
}

/// Writes the v(k) plot; `Ok(false)` when no font was found (nothing written).
pub fn verify_cost(path: &Path, title: &str, curves: &[Curve]) -> Result<bool> {
    if register_font().is_none() {
        eprintln!("bench: no TrueType font found (looked for {FONTS:?}); skipping the PNG");
        return Ok(false);
    }
    let kmax = curves.iter().map(|c| c.values.len()).max().unwrap_or(1).max(1);
    let ymax = curves.iter().flat_map(|c| c.values.iter().copied()).fold(kmax as f64, f64::max) * 1.05;
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(1f64..kmax as f64, 0f64..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("k (tokens scored in one forward)")
        .y_desc("v(k) = cost / one decode step")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new((1..=kmax).map(|k| (k as f64, k as f64)), BLACK.mix(0.4)))
        .map_err(|e| err(&e))?
        .label("v(k) = k: no gain from batching")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    for (i, c) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = c.values.iter().enumerate().map(|(k, v)| (k as f64 + 1.0, *v)).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(c.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(true)
}
