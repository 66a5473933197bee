//! `sloserve bench` as a standalone program, until the `sloserve` binary wires it up:
//! `cargo run -p sloserve-bench --example bench -- --url http://127.0.0.1:8000 --concurrency 4`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "bench",
    about = "Benchmark an OpenAI-compatible server (sloserve bench)"
)]
struct Cli {
    #[command(flatten)]
    args: sloserve_bench::BenchArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sloserve_bench::run_bench(Cli::parse().args).await?;
    Ok(())
}
