//! Prometheus text exposition (format 0.0.4): metric families declared once as
//! data ([`Family`]: name, type, help, label names; [`families!`] declares a
//! table of them) and the one [`Writer`] that the server, the Batch API and the
//! router render `/metrics` with. Label values are escaped; a sample's label
//! values are checked against its family's label names.

use std::fmt::{Display, Write};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: everything `/metrics` says about it but the values.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// Label names, in the order a sample gives their values.
    pub labels: &'static [&'static str],
}

/// Declares metric families as `pub static` items plus `pub static ALL: &[&Family]`
/// (every one, in declaration order):
///
/// ```
/// sloserve_api::families! { ALL;
///     /// Requests running.
///     RUNNING = Gauge "x:running" ["model_name"] "Requests running.";
/// }
/// assert_eq!(ALL[0].name, "x:running");
/// ```
#[macro_export]
macro_rules! families {
    ($all:ident; $( $(#[$m:meta])* $id:ident = $kind:ident $name:literal [$($l:literal),*] $help:literal; )*) => {
        $(
            $(#[$m])*
            pub static $id: $crate::prom::Family = $crate::prom::Family {
                name: $name,
                kind: $crate::prom::Kind::$kind,
                help: $help,
                labels: &[$($l),*],
            };
        )*
        /// Every family of this table, in declaration order.
        pub static $all: &[&$crate::prom::Family] = &[$(&$id),*];
    };
}

/// Writes the exposition text.
#[derive(Debug, Default)]
pub struct Writer {
    out: String,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            out: String::with_capacity(n),
        }
    }

    /// The family's `# HELP` and `# TYPE` lines.
    pub fn head(&mut self, f: &Family) {
        let _ = writeln!(self.out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(self.out, "# TYPE {} {}", f.name, f.kind.as_str());
    }

    /// One sample of a counter or gauge; `values` in the order of `f.labels`.
    pub fn sample(&mut self, f: &Family, values: &[&dyn Display], v: f64) {
        debug_assert!(f.kind != Kind::Histogram, "{}", f.name);
        self.series(f.name, "", f, values, None);
        let _ = writeln!(self.out, " {v}");
    }

    /// The head and one sample: a family of one series.
    pub fn single(&mut self, f: &Family, values: &[&dyn Display], v: f64) {
        self.head(f);
        self.sample(f, values, v);
    }

    /// One histogram series: `counts[i]` observations fell in bucket `bounds[i]`
    /// (not cumulative; written cumulative, then `+Inf`, sum and count).
    pub fn histogram(
        &mut self,
        f: &Family,
        values: &[&dyn Display],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
        count: u64,
    ) {
        debug_assert_eq!(f.kind, Kind::Histogram, "{}", f.name);
        debug_assert_eq!(bounds.len(), counts.len(), "{}", f.name);
        let mut cum = 0;
        for (b, n) in bounds.iter().zip(counts) {
            cum += n;
            self.series(f.name, "_bucket", f, values, Some(&b.to_string()));
            let _ = writeln!(self.out, " {cum}");
        }
        self.series(f.name, "_bucket", f, values, Some("+Inf"));
        let _ = writeln!(self.out, " {count}");
        self.series(f.name, "_sum", f, values, None);
        let _ = writeln!(self.out, " {sum}");
        self.series(f.name, "_count", f, values, None);
        let _ = writeln!(self.out, " {count}");
    }

    /// `name{suffix}{labels}` without the value.
    fn series(
        &mut self,
        name: &str,
        suffix: &str,
        f: &Family,
        values: &[&dyn Display],
        le: Option<&str>,
    ) {
        debug_assert_eq!(values.len(), f.labels.len(), "{}", f.name);
        let _ = write!(self.out, "{name}{suffix}");
        if values.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        let labels = f.labels.iter().zip(values.iter().map(|v| v.to_string()));
        let le = le.map(|b| ("le", b.to_string()));
        for (k, v) in labels.map(|(k, v)| (*k, v)).chain(le) {
            if !first {
                self.out.push(',');
            }
            first = false;
            let _ = write!(self.out, "{k}=\"");
            escape_into(&mut self.out, &v);
            self.out.push('"');
        }
        self.out.push('}');
    }

    /// Text written by hand (kept for what no family describes, e.g. comments).
    pub fn raw(&mut self, text: &str) {
        self.out.push_str(text);
    }

    pub fn into_string(self) -> String {
        self.out
    }
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::families! { ALL;
        REQS = Counter "t:requests_total" ["model_name", "slo_class"] "Requests.";
        UP = Gauge "t:up" [] "Up.";
        LAT = Histogram "t:latency_seconds" ["model_name"] "Latency.";
    }

    #[test]
    fn families_samples_and_histograms_in_the_text_format() {
        assert_eq!(ALL.len(), 3);
        let mut w = Writer::default();
        w.head(&REQS);
        w.sample(&REQS, &[&"m\"1\\\n", &"batch"], 3.0);
        w.single(&UP, &[], 1.0);
        w.head(&LAT);
        w.histogram(&LAT, &[&"m"], &[0.1, 1.0], &[2, 3], 2.5, 6);
        let text = w.into_string();
        assert_eq!(
            text,
            "# HELP t:requests_total Requests.\n\
             # TYPE t:requests_total counter\n\
             t:requests_total{model_name=\"m\\\"1\\\\\\n\",slo_class=\"batch\"} 3\n\
             # HELP t:up Up.\n\
             # TYPE t:up gauge\n\
             t:up 1\n\
             # HELP t:latency_seconds Latency.\n\
             # TYPE t:latency_seconds histogram\n\
             t:latency_seconds_bucket{model_name=\"m\",le=\"0.1\"} 2\n\
             t:latency_seconds_bucket{model_name=\"m\",le=\"1\"} 5\n\
             t:latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 6\n\
             t:latency_seconds_sum{model_name=\"m\"} 2.5\n\
             t:latency_seconds_count{model_name=\"m\"} 6\n"
        );
    }
}
