//! Live progress on stderr: an indicatif bar on a terminal, a status line every few seconds otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::load::OnDone;
use crate::record::RequestRecord;

/// How often the non-terminal status line is printed.
pub const LINE_EVERY: Duration = Duration::from_secs(5);

/// Progress of one load point.
pub struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    done: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl Progress {
    /// Start reporting a run labelled `label` of `total` requests (None: bounded by time).
    /// `quiet` shows nothing.
    pub fn start(label: &str, total: Option<usize>, quiet: bool) -> Progress {
        let done = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let mut p = Progress {
            bar: None,
            ticker: None,
            done: done.clone(),
            failed: failed.clone(),
        };
        if quiet {
            return p;
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(
                total.map(|n| n as u64),
                ProgressDrawTarget::stderr(),
            );
            let tmpl = if total.is_some() {
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}"
            } else {
                "{prefix} [{elapsed_precise}] {spinner} {pos} done {msg}"
            };
            bar.set_style(
                ProgressStyle::with_template(tmpl).unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix(label.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            p.bar = Some(bar);
        } else {
            let label = label.to_string();
            let start = Instant::now();
            p.ticker = Some(tokio::spawn(async move {
                let mut tick = tokio::time::interval(LINE_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let of = total.map(|n| format!("/{n}")).unwrap_or_default();
                    eprintln!(
                        "[{label}] {}{of} requests done ({} failed), {:.0}s",
                        done.load(Ordering::Relaxed),
                        failed.load(Ordering::Relaxed),
                        start.elapsed().as_secs_f64()
                    );
                }
            }));
        }
        p
    }

    /// A callback for [`crate::load::drive`] that counts finished requests.
    pub fn on_done(&self) -> OnDone {
        let (done, failed, bar) = (self.done.clone(), self.failed.clone(), self.bar.clone());
        Arc::new(move |r: &RequestRecord| {
            done.fetch_add(1, Ordering::Relaxed);
            if !r.ok() {
                let f = failed.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(b) = &bar {
                    b.set_message(format!("{f} failed"));
                }
            }
            if let Some(b) = &bar {
                b.inc(1);
            }
        })
    }

    /// Stop showing progress.
    pub fn finish(self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if let Some(t) = &self.ticker {
            t.abort();
        }
    }
}
