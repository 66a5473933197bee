//! `sloserve batch submit|status|list|cancel|results`: the Batch API from the
//! command line, against any server that implements OpenAI's Batch API.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use crate::client::BatchClient;

#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// API key (sent as `Authorization: Bearer`).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Upload a JSONL batch file and create a batch; with --wait, follow it and download the results.
    Submit {
        /// The batch input file (one `{custom_id, method, url, body}` per line).
        file: PathBuf,
        #[command(flatten)]
        conn: Conn,
        /// The batch's endpoint (default: the first line's `url`).
        #[arg(long)]
        endpoint: Option<String>,
        /// Metadata `KEY=VALUE` (repeatable).
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// Wait for the batch to end, showing progress, then download output and errors.
        #[arg(long)]
        wait: bool,
        /// Where --wait writes the output (default `<batch id>_output.jsonl`).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Where --wait writes the errors (default `<batch id>_errors.jsonl`).
        #[arg(long)]
        errors: Option<PathBuf>,
    },
    /// Print a batch object.
    Status {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List batches, newest first.
    List {
        #[command(flatten)]
        conn: Conn,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long)]
        after: Option<String>,
    },
    /// Cancel a batch (running lines finish; the rest are not run).
    Cancel {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Download a batch's output (and errors).
    Results {
        id: String,
        #[command(flatten)]
        conn: Conn,
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long)]
        errors: Option<PathBuf>,
    },
}

fn client(c: &Conn) -> BatchClient {
    BatchClient::new(&c.url, c.api_key.clone())
}

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn first_url(file: &Path) -> anyhow::Result<String> {
    // Only the first line's url is read; the server checks every line's size.
    let mut lines = crate::reader::read_lines(file, 64 << 20)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let (n, text) = lines
        .next()
        .transpose()?
        .with_context(|| format!("{}: no requests", file.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: line {n} is not JSON", file.display()))?;
    v["url"]
        .as_str()
        .map(String::from)
        .with_context(|| format!("{}: line {n} has no url", file.display()))
}

fn metadata(kv: &[String]) -> anyhow::Result<Option<Value>> {
    if kv.is_empty() {
        return Ok(None);
    }
    let mut m = serde_json::Map::new();
    for s in kv {
        let (k, v) = s
            .split_once('=')
            .with_context(|| format!("--metadata {s:?}: expected KEY=VALUE"))?;
        m.insert(k.into(), Value::String(v.into()));
    }
    Ok(Some(Value::Object(m)))
}

/// Downloads the output and error files of an ended batch.
async fn results(
    c: &BatchClient,
    b: &Value,
    output: Option<PathBuf>,
    errors: Option<PathBuf>,
) -> anyhow::Result<()> {
    let id = b["id"].as_str().unwrap_or("batch");
    for (key, dest, name) in [
        ("output_file_id", output, "output"),
        ("error_file_id", errors, "errors"),
    ] {
        if let Some(f) = b[key].as_str() {
            let dest = dest.unwrap_or_else(|| PathBuf::from(format!("{id}_{name}.jsonl")));
            let n = c.download(f, &dest).await?;
            eprintln!("{name}: {} ({n} bytes)", dest.display());
        }
    }
    Ok(())
}

/// Polls until the batch ends, with a progress bar from `request_counts`.
async fn wait(c: &BatchClient, id: &str) -> anyhow::Result<Value> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    loop {
        let b = c.get(id).await?;
        let rc = &b["request_counts"];
        let done = rc["completed"].as_u64().unwrap_or(0) + rc["failed"].as_u64().unwrap_or(0);
        bar.set_length(rc["total"].as_u64().unwrap_or(0));
        bar.set_position(done);
        let status = b["status"].as_str().unwrap_or("?").to_string();
        let speed = b["sloserve"]["tokens_per_second"]
            .as_f64()
            .map_or(String::new(), |t| format!(", {t:.1} tok/s"));
        bar.set_message(format!(
            "{status}, {} failed{speed}",
            rc["failed"].as_u64().unwrap_or(0)
        ));
        if matches!(
            status.as_str(),
            "completed" | "failed" | "expired" | "cancelled"
        ) {
            bar.finish();
            return Ok(b);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub async fn run(cmd: ClientCommand) -> anyhow::Result<()> {
    match cmd {
        ClientCommand::Submit {
            file,
            conn,
            endpoint,
            metadata: md,
            wait: w,
            output,
            errors,
        } => {
            let c = client(&conn);
            let endpoint = match endpoint {
                Some(e) => e,
                None => first_url(&file)?,
            };
            let f = c.upload(&file).await?;
            let fid = f["id"].as_str().context("the upload's answer has no id")?;
            let b = c.create(fid, &endpoint, metadata(&md)?).await?;
            let id = b["id"]
                .as_str()
                .context("the batch's answer has no id")?
                .to_string();
            eprintln!("batch {id} created from {} (file {fid})", file.display());
            if !w {
                print(&b);
                return Ok(());
            }
            let b = wait(&c, &id).await?;
            print(&b);
            results(&c, &b, output, errors).await?;
            if b["status"] == "failed" {
                bail!("batch {id} failed validation");
            }
            Ok(())
        }
        ClientCommand::Status { id, conn } => {
            print(&client(&conn).get(&id).await?);
            Ok(())
        }
        ClientCommand::List { conn, limit, after } => {
            print(&client(&conn).list(after.as_deref(), limit).await?);
            Ok(())
        }
        ClientCommand::Cancel { id, conn } => {
            print(&client(&conn).cancel(&id).await?);
            Ok(())
        }
        ClientCommand::Results {
            id,
            conn,
            output,
            errors,
        } => {
            let c = client(&conn);
            let b = c.get(&id).await?;
            if b["output_file_id"].is_null() && b["error_file_id"].is_null() {
                bail!("batch {id} has no results yet (status {})", b["status"]);
            }
            results(&c, &b, output, errors).await
        }
    }
}
