//! The `sloserve` command: `generate`, `serve`, `batch`, `route`, `bench`, `tune` and `inspect`.

mod generate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use sloserve_model::DEFAULT_MODEL_PATH as DEFAULT_MODEL;

#[derive(Parser)]
#[command(
    name = "sloserve",
    version,
    about = "An LLM serving engine built around TTFT and tokens-per-second SLOs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (or one chat message), streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (SSE streaming, SLO classes, metrics).
    Serve(sloserve_server::ServeArgs),
    /// Batch jobs: run a batch file offline, or submit and follow one on any server with OpenAI's Batch API.
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Route OpenAI-compatible requests to fleets of replicas by SLO class (prefix affinity, health, failover).
    Route(sloserve_router::RouteArgs),
    /// Drive an OpenAI-compatible server with streaming load; report TTFT/TPOT/ITL and goodput.
    Bench(sloserve_bench::BenchArgs),
    /// Measure the engine at a sequence of batch sizes under a bench workload; recommend interactive and batch configs.
    Tune(sloserve_tune::TuneArgs),
    /// Print a GGUF model's architecture, sizes, quantization mix and tokenizer, or export its tokenizer.
    Inspect {
        /// GGUF model file.
        #[arg(long, default_value = DEFAULT_MODEL)]
        model: PathBuf,
        /// The GGUF model file, given without --model.
        #[arg(value_name = "MODEL.gguf", conflicts_with = "model")]
        model_file: Option<PathBuf>,
        /// Also show the weight types `--quantize TYPE` would give (q8_0, q4_0, q4_1, f16).
        #[arg(long)]
        quantize: Option<sloserve_model::WeightType>,
        /// Write the model's tokenizer as a Hugging Face tokenizer folder (tokenizer.json,
        /// tokenizer_config.json, special_tokens_map.json) into DIR, for benchmark clients
        /// that take `--tokenizer DIR` (aiperf, guidellm, genai-perf, vllm bench serve).
        #[arg(long, value_name = "DIR")]
        export_tokenizer: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum BatchCommand {
    /// Run a batch file through the model in-process (no server), resuming a partial output.
    Run(Box<sloserve_server::batch::BatchRunArgs>),
    #[command(flatten)]
    Client(sloserve_batch::cli::ClientCommand),
}

fn run_batch(cmd: BatchCommand) -> anyhow::Result<()> {
    match cmd {
        BatchCommand::Run(args) => sloserve_server::batch::run_offline(*args),
        BatchCommand::Client(c) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(sloserve_batch::cli::run(c)),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(e) = sloserve_model::kernels::cpu::IsaCap::from_env() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Serve(args) => sloserve_server::run(args),
        Command::Batch(cmd) => run_batch(cmd),
        Command::Route(args) => sloserve_router::run(args),
        Command::Bench(args) => sloserve_bench::run_bench_blocking(args).map(|_| ()),
        Command::Tune(args) => sloserve_tune::run_tune_blocking(args).map(|_| ()),
        Command::Inspect {
            model,
            model_file,
            quantize,
            export_tokenizer,
        } => sloserve_model::GgufFile::open(model_file.unwrap_or(model))
            .and_then(|mut f| match export_tokenizer {
                Some(dir) => sloserve_model::inspect::export_tokenizer(&f, &dir),
                None => {
                    f.set_quantize(quantize);
                    sloserve_model::inspect::inspect(&f)
                }
            })
            .map(|s| print!("{s}"))
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
