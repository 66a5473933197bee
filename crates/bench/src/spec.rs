//! `WorkloadSpec`: the flags that describe a workload (load shape, dataset, lengths, SLO classes, seed), shared by `sloserve bench` and `sloserve tune`.

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::dataset::{DatasetSpec, LenDist};
use crate::workload::ClassMix;

/// What is sent and how it arrives, as opposed to where it goes (the server)
/// and what is written (the output). Both commands `#[command(flatten)]` it.
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// Closed loop: keep N requests in flight (`tune`, with neither this nor
    /// `--request-rate`: as many as each point's `max_num_seqs`).
    #[arg(long, conflicts_with = "request_rate")]
    pub concurrency: Option<usize>,
    /// Open loop: send R requests/s (`inf` = all at once), Poisson arrivals
    /// unless `--burstiness` says otherwise. Default when neither this nor
    /// `--concurrency` is given: `inf` for `bench`; `tune` runs each point
    /// closed-loop at its `max_num_seqs`.
    #[arg(long)]
    #[serde(default, with = "crate::sweep::opt_rate_serde")]
    pub request_rate: Option<f64>,
    /// Gamma shape of open-loop inter-arrival times: 1 = Poisson, <1 burstier, >1 more regular.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Cap on in-flight requests in open-loop mode.
    #[arg(long)]
    pub max_concurrency: Option<usize>,

    /// Dataset: `synthetic`, `sharegpt:FILE`, `prefix`, or `jsonl:FILE`
    /// (one `{"prompt"|"messages", "output_len"?, "slo_class"?}` per line).
    #[arg(long, default_value = "synthetic")]
    pub dataset: DatasetSpec,
    /// Prompt length in tokens (words ≈ tokens) for synthetic; the unique
    /// question's length for `prefix`.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Draw prompt lengths instead: `uniform:LO-HI` or `normal:MEAN,STD`.
    #[arg(long)]
    pub input_len_dist: Option<LenDist>,
    /// Output tokens (`max_tokens`); default 128, or the dataset's own lengths.
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Draw output lengths instead: `uniform:LO-HI` or `normal:MEAN,STD`.
    #[arg(long)]
    pub output_len_dist: Option<LenDist>,
    /// `prefix` dataset: tokens in the shared system prompt.
    #[arg(long, default_value_t = 256)]
    pub prefix_len: usize,
    /// `prefix` dataset: number of distinct shared prefixes.
    #[arg(long, default_value_t = 1)]
    pub num_prefixes: usize,
    /// Send `ignore_eos` so outputs have exactly `max_tokens` tokens
    /// (default: true for synthetic and prefix, false otherwise).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub ignore_eos: Option<bool>,
    /// SLO-class mix, e.g. `interactive=0.7,batch=0.3` (or one class name):
    /// sent as `slo_class` in the body and the `X-SLO-Class` header.
    #[arg(long)]
    pub slo_class: Option<ClassMix>,
    /// Seed for prompts, lengths, classes and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl WorkloadSpec {
    /// `ignore_eos` as sent: the flag, else true for synthetic/prefix.
    pub fn ignore_eos(&self) -> bool {
        self.ignore_eos.unwrap_or(matches!(
            self.dataset,
            DatasetSpec::Synthetic | DatasetSpec::Prefix
        ))
    }

    /// Check the load-shape values that clap cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.concurrency != Some(0),
            "--concurrency must be at least 1"
        );
        anyhow::ensure!(
            self.burstiness > 0.0 && self.burstiness.is_finite(),
            "--burstiness must be positive"
        );
        if let Some(r) = self.request_rate {
            anyhow::ensure!(r > 0.0, "--request-rate must be positive (or inf)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        w: WorkloadSpec,
    }

    fn parse(flags: &[&str]) -> Result<WorkloadSpec, clap::Error> {
        Cli::try_parse_from(std::iter::once("w").chain(flags.iter().copied())).map(|c| c.w)
    }

    #[test]
    fn defaults_and_checks() {
        let w = parse(&[]).unwrap();
        assert_eq!(w.dataset, DatasetSpec::Synthetic);
        assert_eq!((w.input_len, w.prefix_len, w.num_prefixes), (128, 256, 1));
        assert_eq!((w.burstiness, w.seed), (1.0, 0));
        assert!(w.ignore_eos() && w.validate().is_ok());
        let j = parse(&["--dataset", "jsonl:x.jsonl", "--ignore-eos"]).unwrap();
        assert!(j.ignore_eos());
        assert!(!parse(&["--dataset", "jsonl:x.jsonl"]).unwrap().ignore_eos());
        assert!(parse(&["--concurrency", "2", "--request-rate", "3"]).is_err());
        for bad in [
            &["--concurrency", "0"][..],
            &["--burstiness", "0"],
            &["--request-rate", "0"],
        ] {
            assert!(parse(bad).unwrap().validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn infinite_rate_round_trips_through_json() {
        let w = parse(&["--request-rate", "inf"]).unwrap();
        let json = serde_json::to_string(&w).unwrap();
        assert!(json.contains(r#""request_rate":"inf""#), "{json}");
        let back: WorkloadSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.request_rate, Some(f64::INFINITY));
    }
}
