//! Writing report files: pretty JSON, and each chart as PNG + SVG with the markdown that shows it (used by `bench` and `tune`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use super::plots::Chart;

/// Write `value` as pretty-printed JSON to `path`.
pub fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    serde_json::to_writer_pretty(f, value).with_context(|| format!("writing {}", path.display()))
}

/// Charts written by [`write_charts`].
#[derive(Clone, Debug, Default)]
pub struct WrittenCharts {
    /// Every file, PNG then SVG per chart.
    pub files: Vec<PathBuf>,
    /// The stems, in order (see [`chart_md`]).
    pub stems: Vec<String>,
}

/// Write each chart as `STEM.png` and `STEM.svg` into `dir` (which must exist).
pub fn write_charts(
    dir: &Path,
    charts: impl IntoIterator<Item = (String, Chart)>,
) -> anyhow::Result<WrittenCharts> {
    let mut out = WrittenCharts::default();
    for (stem, chart) in charts {
        let png = dir.join(format!("{stem}.png"));
        let bytes = chart
            .to_png()
            .with_context(|| format!("rendering {stem}.png"))?;
        std::fs::write(&png, bytes).with_context(|| format!("writing {}", png.display()))?;
        let svg = dir.join(format!("{stem}.svg"));
        let text = chart
            .to_svg()
            .with_context(|| format!("rendering {stem}.svg"))?;
        std::fs::write(&svg, text).with_context(|| format!("writing {}", svg.display()))?;
        out.files.extend([png, svg]);
        out.stems.push(stem);
    }
    Ok(out)
}

/// The markdown that shows chart `stem` written next to the report: its PNG, linking its SVG.
pub fn chart_md(stem: &str) -> String {
    format!("![{stem}]({stem}.png) ([svg]({stem}.svg))")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::plots::{RefLine, Series};

    #[test]
    fn writes_png_svg_and_json() {
        let dir = std::env::temp_dir().join(format!("sloserve-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = Chart::Lines {
            title: "t".into(),
            x_desc: "x".into(),
            y_desc: "y".into(),
            x_labels: vec!["1".into(), "2".into()],
            series: vec![Series {
                name: "s".into(),
                ys: vec![Some(1.0), Some(2.0)],
            }],
            refs: vec![RefLine {
                name: "slo".into(),
                value: 1.5,
            }],
        };
        let w = write_charts(&dir, [("a_chart".to_string(), chart)]).unwrap();
        assert_eq!(w.stems, vec!["a_chart"]);
        assert_eq!(
            w.files,
            vec![dir.join("a_chart.png"), dir.join("a_chart.svg")]
        );
        let png = std::fs::read(dir.join("a_chart.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(dir.join("a_chart.svg")).unwrap();
        assert!(svg.contains("<svg"));
        assert_eq!(
            chart_md("a_chart"),
            "![a_chart](a_chart.png) ([svg](a_chart.svg))"
        );
        let json = dir.join("v.json");
        write_json(&json, &vec![1, 2]).unwrap();
        assert_eq!(
            serde_json::from_str::<Vec<u32>>(&std::fs::read_to_string(&json).unwrap()).unwrap(),
            vec![1, 2]
        );
        assert!(write_json(&dir.join("no/such/dir.json"), &1).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
