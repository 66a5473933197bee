//! Plots as PNG and SVG: percentile/throughput lines against the swept variable (with SLO lines) and TTFT histograms.
//!
//! Drawn with plotters. Text is laid out and rasterised with ab_glyph from
//! DejaVu Sans embedded in the binary (the `dejavu` crate), so PNGs never
//! depend on system fonts; the PNG is encoded with the `png` crate from
//! plotters' RGB buffer. SVGs name the `sans-serif` family for the viewer.

use std::sync::Once;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// Pixel size of every plot.
pub const SIZE: (u32, u32) = (900, 560);

static FONTS: Once = Once::new();

fn register_fonts() {
    FONTS.call_once(|| {
        // Registration only fails on an invalid font file, which the embedded one is not.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e:?}")
}

/// One line: a y value per x position (`None` = no data there).
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub ys: Vec<Option<f64>>,
}

/// A horizontal reference line (an SLO target).
#[derive(Clone, Debug)]
pub struct RefLine {
    pub name: String,
    pub value: f64,
}

/// A chart to draw.
#[derive(Clone, Debug)]
pub enum Chart {
    /// Lines over categorical x positions (the swept values, evenly spaced).
    Lines {
        title: String,
        x_desc: String,
        y_desc: String,
        x_labels: Vec<String>,
        series: Vec<Series>,
        refs: Vec<RefLine>,
    },
    /// A histogram of `values`, with vertical reference lines.
    Histogram {
        title: String,
        x_desc: String,
        values: Vec<f64>,
        refs: Vec<RefLine>,
    },
}

const SERIES_COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const REF_COLORS: [RGBColor; 3] = [
    RGBColor(214, 39, 40),
    RGBColor(188, 50, 150),
    RGBColor(110, 110, 110),
];

/// A reference line with its index (which picks its colour).
type IndexedRef<'a> = (usize, &'a RefLine);

/// Reference lines within `limit` (drawn) and beyond it (legend only, marked off scale).
fn split_refs(refs: &[RefLine], limit: Option<f64>) -> (Vec<IndexedRef<'_>>, Vec<IndexedRef<'_>>) {
    refs.iter()
        .enumerate()
        .partition(|(_, r)| limit.is_none_or(|l| r.value <= l))
}

impl Chart {
    /// The chart as an SVG document.
    pub fn to_svg(&self) -> anyhow::Result<String> {
        register_fonts();
        let mut s = String::new();
        {
            let root = SVGBackend::with_string(&mut s, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(err)?;
        }
        Ok(s)
    }

    /// The chart as PNG bytes.
    pub fn to_png(&self) -> anyhow::Result<Vec<u8>> {
        register_fonts();
        let (w, h) = SIZE;
        let mut rgb = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(err)?;
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.write_header()?.write_image_data(&rgb)?;
        Ok(out)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        root.fill(&WHITE).map_err(err)?;
        match self {
            Chart::Lines {
                title,
                x_desc,
                y_desc,
                x_labels,
                series,
                refs,
            } => draw_lines(root, title, x_desc, y_desc, x_labels, series, refs),
            Chart::Histogram {
                title,
                x_desc,
                values,
                refs,
            } => draw_histogram(root, title, x_desc, values, refs),
        }
    }
}

fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x_labels: &[String],
    series: &[Series],
    refs: &[RefLine],
) -> anyhow::Result<()> {
    let n = x_labels.len().max(1) as i32;
    let data_max = series
        .iter()
        .flat_map(|s| s.ys.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    // SLO lines far above the data would flatten it: draw those within 8x the data only.
    let (shown, off) = split_refs(refs, (data_max > 0.0).then_some(data_max * 8.0));
    let y_top = shown.iter().map(|(_, r)| r.value).fold(data_max, f64::max);
    let y_top = if y_top > 0.0 { y_top * 1.2 } else { 1.0 };
    // Categorical x: one segment per swept value, evenly spaced (so `inf` has a place too).
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(75)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0f64..y_top)
        .map_err(err)?;
    let label_at = |x: &SegmentValue<i32>| match x {
        SegmentValue::CenterOf(i) => x_labels.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&label_at)
        .x_labels(n as usize + 1)
        .disable_x_mesh()
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = SERIES_COLORS[i % SERIES_COLORS.len()];
        let pts: Vec<(SegmentValue<i32>, f64)> =
            s.ys.iter()
                .enumerate()
                .filter_map(|(x, y)| {
                    y.filter(|v| v.is_finite())
                        .map(|y| (SegmentValue::CenterOf(x as i32), y))
                })
                .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new(p.clone(), 4, color.filled())),
            )
            .map_err(err)?;
    }
    for (i, r) in shown {
        let color = REF_COLORS[i % REF_COLORS.len()];
        chart
            .draw_series(DashedLineSeries::new(
                vec![
                    (SegmentValue::Exact(0), r.value),
                    (SegmentValue::Last, r.value),
                ],
                10,
                6,
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(r.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    for (i, r) in off {
        let color = REF_COLORS[i % REF_COLORS.len()];
        chart
            .draw_series(Vec::<PathElement<(SegmentValue<i32>, f64)>>::new())
            .map_err(err)?
            .label(format!("{} (above the plot)", r.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Equal-width bins over the data's range: (lower edges, width, counts).
pub fn histogram_bins(values: &[f64]) -> (f64, f64, Vec<usize>) {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return (0.0, 1.0, vec![0]);
    }
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let nbins = ((finite.len() as f64).sqrt().ceil() as usize).clamp(5, 40);
    let width = if hi > lo {
        (hi - lo) / nbins as f64
    } else {
        (lo.abs() * 0.1).max(1.0)
    };
    let mut counts = vec![0usize; nbins];
    for v in finite {
        let b = (((v - lo) / width) as usize).min(nbins - 1);
        counts[b] += 1;
    }
    (lo, width, counts)
}

fn draw_histogram<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    values: &[f64],
    refs: &[RefLine],
) -> anyhow::Result<()> {
    let (lo, width, counts) = histogram_bins(values);
    let data_hi = lo + width * counts.len() as f64;
    // SLO lines far right of the data would squash the bars: draw those within 2x the data only.
    let (shown, off) = split_refs(refs, Some(data_hi.max(0.0) * 2.0));
    let mut x_lo = lo;
    let mut x_hi = data_hi;
    for (_, r) in &shown {
        x_lo = x_lo.min(r.value);
        x_hi = x_hi.max(r.value);
    }
    let pad = (x_hi - x_lo) * 0.05;
    let (x_lo, x_hi) = (
        (x_lo - pad).max(if lo >= 0.0 { 0.0 } else { f64::MIN }),
        x_hi + pad,
    );
    let y_top = (*counts.iter().max().unwrap_or(&1) as f64 * 1.2).max(1.0);
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(65)
        .build_cartesian_2d(x_lo..x_hi, 0f64..y_top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("requests")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    let bar = SERIES_COLORS[0];
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            let x0 = lo + width * i as f64;
            Rectangle::new([(x0, 0.0), (x0 + width, c as f64)], bar.mix(0.75).filled())
        }))
        .map_err(err)?
        .label(format!("TTFT ({} requests)", values.len()))
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], bar.filled()));
    for (i, r) in shown {
        let color = REF_COLORS[i % REF_COLORS.len()];
        chart
            .draw_series(DashedLineSeries::new(
                vec![(r.value, 0.0), (r.value, y_top)],
                10,
                6,
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(r.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    for (i, r) in off {
        let color = REF_COLORS[i % REF_COLORS.len()];
        chart
            .draw_series(Vec::<PathElement<(f64, f64)>>::new())
            .map_err(err)?
            .label(format!("{} (right of the plot)", r.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}
