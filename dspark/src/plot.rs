//! PNG plots, drawn with plotters' bitmap backend: the bench's verify cost v(k) per compute
//! path next to the k = v(k) line where speculation cannot pay, calibration's reliability
//! diagram, and plain x–y lines (the serving benchmark's throughput by concurrency). Text is
//! rendered with ab_glyph from a system TrueType font (DejaVu Sans or Liberation Sans); with
//! none installed a plot is skipped with a message, since its numbers
//! are also printed and stored. Plots are drawn into memory and encoded with the `png` crate at
//! its best compression (plotters' own encoder writes files ten times larger, which matters for
//! the diagram committed next to the default drafter), through a temporary file and a rename.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
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

/// Registers the font once; says (once per call) when there is none.
fn font_available() -> bool {
    static FONT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let found = FONT.get_or_init(register_font).is_some();
    if !found {
        eprintln!("dspark: no TrueType font found (looked for {FONTS:?}); skipping the PNG");
    }
    found
}

/// One curve: its label and v(1..=n).
pub struct Curve {
    pub label: String,
    pub values: Vec<f64>,
}

/// Writes the v(k) plot; `Ok(false)` when no font was found (nothing written).
pub fn verify_cost(path: &Path, title: &str, curves: &[Curve]) -> Result<bool> {
    if !font_available() {
        return Ok(false);
    }
    let kmax = curves.iter().map(|c| c.values.len()).max().unwrap_or(1).max(1);
    let ymax = curves.iter().flat_map(|c| c.values.iter().copied()).fold(kmax as f64, f64::max) * 1.05;
    render(path, (900, 560), |root| {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
        let mut chart = ChartBuilder::on(root)
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
        let lines = curves.iter().map(|c| {
            let points = c.values.iter().enumerate().map(|(k, v)| (k as f64 + 1.0, *v)).collect();
            (c.label.clone(), points)
        });
        draw_lines(&mut chart, lines, path)
    })?;
    Ok(true)
}

/// Draws each `(label, points)` as a coloured line with markers, then the legend.
fn draw_lines<'a, 'b: 'a>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    lines: impl Iterator<Item = (String, Vec<(f64, f64)>)>,
    path: &Path,
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    for (i, (label, points)) in lines.enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label)
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
    Ok(())
}

/// One line of an x–y plot: its label and points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Writes a plot of `series` as lines with markers (x on a log₂ axis when `log2_x`, as for
/// concurrency levels 1, 4, 16, 32); `Ok(false)` when no font was found (nothing written).
pub fn lines(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    log2_x: bool,
) -> Result<bool> {
    if !font_available() {
        return Ok(false);
    }
    let tx = |x: f64| if log2_x { x.max(1e-9).log2() } else { x };
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| tx(p.0)));
    let (xmin, xmax) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (xmin, xmax) = if xmin < xmax { (xmin, xmax) } else { (0.0, 1.0) };
    let ymax = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.1;
    render(path, (900, 560), |root| {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xmin..xmax, 0f64..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            // On a log₂ axis only the powers of two are labelled.
            .x_labels(if log2_x { (xmax - xmin).round() as usize + 1 } else { 10 })
            .x_label_formatter(&|x| match log2_x {
                true if (x - x.round()).abs() < 1e-6 => format!("{:.0}", x.exp2()),
                true => String::new(),
                false => format!("{x}"),
            })
            .draw()
            .map_err(|e| err(&e))?;
        let lines = series.iter().map(|s| (s.label.clone(), s.points.iter().map(|&(x, y)| (tx(x), y)).collect()));
        draw_lines(&mut chart, lines, path)
    })?;
    Ok(true)
}

/// Writes horizontal bar charts, one panel per group (side by side, each with its own scale):
/// `bars` are (group, label, value), drawn in order with the label and value beside each bar.
/// `Ok(false)` when no font was found (nothing written).
pub fn bars(path: &Path, title: &str, bars: &[(String, String, f64)]) -> Result<bool> {
    if !font_available() {
        return Ok(false);
    }
    let mut groups: Vec<(&str, Vec<(&str, f64)>)> = Vec::new();
    for (group, label, value) in bars {
        match groups.iter_mut().find(|(g, _)| g == group) {
            Some((_, items)) => items.push((label, *value)),
            None => groups.push((group, vec![(label, *value)])),
        }
    }
    let rows = groups.iter().map(|(_, items)| items.len()).max().unwrap_or(1);
    let width = 520 * groups.len().max(1) as u32;
    render(path, (width, 90 + 34 * rows as u32), |root| {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
        let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
        for ((group, items), area) in groups.iter().zip(root.split_evenly((1, groups.len().max(1)))) {
            // Room right of the longest bar for its label.
            let xmax = items.iter().map(|i| i.1).fold(1e-9, f64::max) * 1.9;
            let mut chart = ChartBuilder::on(&area)
                .caption(*group, ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(30)
                .build_cartesian_2d(0f64..xmax, 0f64..rows as f64)
                .map_err(|e| err(&e))?;
            chart.configure_mesh().disable_y_mesh().disable_y_axis().draw().map_err(|e| err(&e))?;
            for (i, (label, value)) in items.iter().enumerate() {
                // Top to bottom in the given order.
                let y = (rows - 1 - i) as f64;
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series([Rectangle::new([(0.0, y + 0.15), (*value, y + 0.85)], color.filled())])
                    .map_err(|e| err(&e))?;
                let text = format!("{label}: {value:.0}");
                chart
                    .draw_series([Text::new(text, (*value + xmax * 0.01, y + 0.7), ("sans-serif", 14))])
                    .map_err(|e| err(&e))?;
            }
        }
        Ok(())
    })?;
    Ok(true)
}

/// One panel of a reliability diagram: per block position, the (mean predicted survival,
/// observed frequency) of each non-empty bin.
pub struct ReliabilityPanel {
    pub title: String,
    pub positions: Vec<Vec<(f64, f64)>>,
}

/// Writes a reliability diagram: panels side by side in rows of `columns`, each with the
/// diagonal (perfect calibration) and one line per block position. `Ok(false)` without a font.
pub fn reliability(path: &Path, title: &str, panels: &[ReliabilityPanel], columns: usize) -> Result<bool> {
    if !font_available() {
        return Ok(false);
    }
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns).max(1);
    render(path, (380 * columns as u32, 360 * rows as u32 + 40), |root| {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
        let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
        for (panel, area) in panels.iter().zip(root.split_evenly((rows, columns))) {
            let mut chart = ChartBuilder::on(&area)
                .caption(&panel.title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(44)
                .build_cartesian_2d(0f64..1f64, 0f64..1f64)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("predicted survival")
                .y_desc("observed: all accepted")
                .draw()
                .map_err(|e| err(&e))?;
            chart.draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], BLACK.mix(0.4))).map_err(|e| err(&e))?;
            for (k, points) in panel.positions.iter().enumerate() {
                let color = Palette99::pick(k).to_rgba();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(format!("position {}", k + 1))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 12))
                .draw()
                .map_err(|e| err(&e))?;
        }
        Ok(())
    })?;
    Ok(true)
}

/// Draws on a white canvas of width × height pixels in memory, then writes it as a PNG at
/// `path`.
fn render(
    path: &Path,
    (width, height): (u32, u32),
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<()>,
) -> Result<()> {
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    // The drawing area borrows the pixels until it is dropped.
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
        root.fill(&WHITE).map_err(|e| err(&e))?;
        draw(&root)?;
        root.present().map_err(|e| err(&e))?;
    }
    write_png(path, &pixels, width, height)
}

/// Encodes RGB pixels as a PNG at the best compression, replacing `path` atomically
/// (`mlx_core::files::write_atomic_with`), so a reader never sees half a plot.
fn write_png(path: &Path, rgb: &[u8], width: u32, height: u32) -> Result<()> {
    let encode = |tmp: &Path| -> std::io::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(tmp)?);
        let mut encoder = png::Encoder::new(&mut file, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::Best);
        encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
        let mut writer = encoder.write_header().map_err(std::io::Error::other)?;
        writer.write_image_data(rgb).map_err(std::io::Error::other)?;
        writer.finish().map_err(std::io::Error::other)?;
        // A failed flush (a full disk) must not rename a truncated plot into place.
        std::io::Write::flush(&mut file)
    };
    mlx_core::files::write_atomic_with(path, ".png", encode).map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reliability_diagram_is_written_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("dspark-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("reliability.png");
        let panel = |title: &str| ReliabilityPanel {
            title: title.into(),
            positions: vec![vec![(0.2, 0.1), (0.6, 0.5)], vec![(0.1, 0.2), (0.5, 0.7)]],
        };
        let written = reliability(&path, "test", &[panel("a"), panel("b"), panel("c")], 2).unwrap();
        if written {
            let bytes = std::fs::read(&path).unwrap();
            let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
            let info = decoder.read_info().unwrap().info().clone();
            assert_eq!((info.width, info.height), (760, 2 * 360 + 40), "two columns, two rows and a title");
        } else {
            assert!(!path.exists(), "no font: nothing written");
        }
        assert!(!path.with_extension("png.tmp").exists(), "the temporary file is renamed away");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn line_plots_are_written_on_log2_and_linear_axes() {
        let dir = std::env::temp_dir().join(format!("dspark-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let series = [
            Series { label: "a".into(), points: vec![(1.0, 10.0), (4.0, 30.0), (32.0, 20.0)] },
            Series { label: "b".into(), points: vec![(1.0, 5.0)] },
        ];
        for (name, log2_x) in [("log.png", true), ("linear.png", false)] {
            let path = dir.join(name);
            if lines(&path, "t", ("x", "y"), &series, log2_x).unwrap() {
                let info = png::Decoder::new(std::io::Cursor::new(std::fs::read(&path).unwrap()))
                    .read_info()
                    .unwrap()
                    .info()
                    .clone();
                assert_eq!((info.width, info.height), (900, 560));
            } else {
                assert!(!path.exists(), "no font: nothing written");
            }
        }
        let cost = verify_cost(&dir.join("cost.png"), "v", &[Curve { label: "c".into(), values: vec![1.0, 1.5] }]);
        assert!(cost.unwrap() == dir.join("cost.png").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
