//! Progress of a tune on stderr: an indicatif bar over the points on a
//! terminal (its message follows the running point's requests), or a line
//! per point event and every few seconds otherwise.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sloserve_server::AppState;

/// How often the non-terminal status line is printed while a point runs.
const LINE_EVERY: Duration = Duration::from_secs(10);

pub struct TuneProgress {
    bar: Option<ProgressBar>,
    lines: bool,
    total: usize,
    started: Instant,
    bound: Duration,
}

impl TuneProgress {
    /// Progress over `total` planned points with a time bound of `bound`.
    pub fn start(total: usize, bound: Duration, quiet: bool) -> Self {
        let mut p = TuneProgress {
            bar: None,
            lines: false,
            total,
            started: Instant::now(),
            bound,
        };
        if quiet {
            return p;
        }
        if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} points  {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix(format!("tune (bound {})", fmt_duration(bound)));
            bar.enable_steady_tick(Duration::from_millis(250));
            p.bar = Some(bar);
        } else {
            p.lines = true;
        }
        p
    }

    fn elapsed(&self) -> String {
        format!(
            "{}/{}",
            fmt_duration(self.started.elapsed()),
            fmt_duration(self.bound)
        )
    }

    /// Print a line above the bar (or plainly).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None if self.lines => eprintln!("{line}"),
            None => {}
        }
    }

    /// A point starts.
    pub fn point_started(&self, index: usize, label: &str) {
        if let Some(b) = &self.bar {
            b.set_message(format!("{label}: loading the model"));
        } else if self.lines {
            eprintln!(
                "[tune {}/{} {}] {label}: starting",
                index + 1,
                self.total,
                self.elapsed()
            );
        }
    }

    /// A point finished, with a one-line result.
    pub fn point_done(&self, index: usize, result: &str) {
        match &self.bar {
            Some(b) => {
                b.println(format!("[{}/{}] {result}", index + 1, self.total));
                b.inc(1);
            }
            None if self.lines => eprintln!(
                "[tune {}/{} {}] {result}",
                index + 1,
                self.total,
                self.elapsed()
            ),
            None => {}
        }
    }

    /// Planned points that will not run (early stop, time bound).
    pub fn skipped(&self, n: usize, why: &str) {
        if n == 0 {
            return;
        }
        match &self.bar {
            Some(b) => {
                b.set_length(b.length().unwrap_or(0).saturating_sub(n as u64));
                b.println(format!("{n} point(s) not measured: {why}"));
            }
            None if self.lines => eprintln!("[tune] {n} point(s) not measured: {why}"),
            None => {}
        }
    }

    /// Follow a running point's requests (finished in the engine, warmup
    /// included) until the returned task is aborted.
    pub fn watch(
        &self,
        state: Arc<AppState>,
        label: String,
        expected: usize,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let bar = self.bar.clone();
        if bar.is_none() && !self.lines {
            return None;
        }
        let started = Instant::now();
        Some(tokio::spawn(async move {
            let every = if bar.is_some() {
                Duration::from_millis(250)
            } else {
                LINE_EVERY
            };
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let c = state.engine.stats().counters;
                let done = c.requests_finished_stop
                    + c.requests_finished_length
                    + c.requests_cancelled
                    + c.requests_failed;
                let msg = format!(
                    "{label}: {done}/{expected} requests (warmup included), {:.0}s",
                    started.elapsed().as_secs_f64()
                );
                match &bar {
                    Some(b) => b.set_message(msg),
                    None => eprintln!("[tune] {msg}"),
                }
            }
        }))
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// `1m05s`, `42s`, `1h02m`.
pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}
