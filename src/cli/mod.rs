//! The `suffixd` command line: argument parsing and output, the last stage of the data
//! flow. Library errors become `anyhow` errors here, and only here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use crate::corpus::read_examples;
use crate::simulate::{SimulateConfig, simulate};
use crate::speculate::{SpecMode, SpecParams};
use crate::tree::GlobalTree;

mod bench;
mod cost_cache;
mod generate;
mod serve;
mod store;

/// suffixd: a persistent SuffixDecoding speculation store and the LLM server that uses it.
#[derive(Parser, Debug)]
#[command(name = "suffixd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure speculation with a simulated verifier that replays recorded responses.
    Simulate(SimulateArgs),
    /// Average next-token entropy of a tree built from responses: low means large gains.
    Entropy(EntropyArgs),
    /// Build a snapshot from request logs (token ids, text or chat records).
    Build(store::BuildArgs),
    /// Print a snapshot's header and sizes; with --verify, check all of it.
    Inspect(store::InspectArgs),
    /// Append logged responses to a live store through its write-ahead log.
    Ingest(store::IngestArgs),
    /// Generate one answer with the model, speculating (or not, with --no-spec).
    Generate(generate::GenerateArgs),
    /// Replay a workload through plain and speculative decoding and compare speed.
    #[command(name = "e2e-bench")]
    E2eBench(bench::BenchArgs),
    /// Serve the OpenAI-compatible API, the admin API and /metrics.
    Serve(Box<serve::ServeArgs>),
}

/// Speculation flags shared by every command that speculates.
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Draft single paths (the default).
    #[arg(long, conflicts_with = "tree")]
    linear: bool,
    /// Draft trees.
    #[arg(long)]
    tree: bool,
    /// Depth limit of the suffix trees.
    #[arg(long, default_value_t = 24)]
    max_depth: usize,
    /// Most tokens in one draft.
    #[arg(long, default_value_t = 24)]
    max_spec: usize,
    /// α: draft tokens allowed per matched context token.
    #[arg(long, default_value_t = 1.0)]
    spec_factor: f32,
    /// Draft tokens allowed on top of α × match length.
    #[arg(long, default_value_t = 0.0)]
    spec_offset: f32,
    /// Stop a branch once its estimated probability falls below this.
    #[arg(long, default_value_t = 0.1)]
    min_prob: f32,
    /// `paper`: the paper's algorithm as the reference runs it; `extended`: also use
    /// context beyond the depth limit.
    #[arg(long, value_enum, default_value_t = SpecMode::Extended)]
    mode: SpecMode,
}

impl SpecArgs {
    fn params(&self) -> anyhow::Result<SpecParams> {
        if !(0.0..=1.0).contains(&self.min_prob) {
            bail!("--min-prob must be between 0 and 1, got {}", self.min_prob);
        }
        if self.max_depth == 0 || self.max_depth > crate::tree::MAX_SUPPORTED_DEPTH {
            bail!(
                "--max-depth must be between 1 and {}",
                crate::tree::MAX_SUPPORTED_DEPTH
            );
        }
        Ok(SpecParams {
            max_depth: self.max_depth,
            max_spec: self.max_spec,
            spec_factor: self.spec_factor,
            spec_offset: self.spec_offset,
            min_prob: self.min_prob,
            tree: self.tree,
            mode: self.mode,
        })
    }
}

#[derive(Args, Debug)]
struct SimulateArgs {
    /// Token-stream file (.jsonl or .jsonl.zst) whose responses warm the global tree.
    #[arg(long, required_unless_present = "snapshot")]
    warm: Option<PathBuf>,
    /// Use only the first N warm examples.
    #[arg(long)]
    warm_limit: Option<usize>,
    /// Token-stream file of test examples.
    #[arg(long)]
    test: PathBuf,
    /// Use only the first M test examples.
    #[arg(long)]
    test_limit: Option<usize>,
    #[command(flatten)]
    spec: SpecArgs,
    /// Responses kept in the global tree (FIFO); 0 disables it.
    #[arg(long, default_value_t = 10000)]
    max_cached_requests: usize,
    /// Keep finished test responses in the global tree.
    #[arg(long)]
    online: bool,
    /// Do not index prompts in the per-request tree.
    #[arg(long)]
    no_prompt_tree: bool,
    /// Open the global tree from this snapshot (a store directory or a snapshot file)
    /// instead of building it from --warm.
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Also time every speculation replayed a second time with warm caches, as the
    /// reference's --native-timing does (adds spec_replay_us_per_call).
    #[arg(long)]
    replay_timing: bool,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct EntropyArgs {
    /// Token-stream file whose responses build the tree.
    #[arg(long)]
    logs: PathBuf,
    /// Use only the first N responses (the paper uses about 100).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Depth limit of the tree.
    #[arg(long, default_value_t = 24)]
    max_depth: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn run_simulate(a: SimulateArgs) -> anyhow::Result<()> {
    let snapshot = a
        .snapshot
        .as_deref()
        .map(store::resolve_snapshot)
        .transpose()?;
    let cfg = SimulateConfig {
        snapshot,
        warm: a.warm,
        warm_limit: a.warm_limit,
        test: a.test,
        test_limit: a.test_limit,
        params: a.spec.params()?,
        max_cached_requests: a.max_cached_requests,
        online: a.online,
        prompt_tree: !a.no_prompt_tree,
        replay_timing: a.replay_timing,
    };
    let r = simulate(&cfg, |line| eprintln!("{line}")).context("simulation failed")?;
    println!(
        "tokens/step {:.4}  acceptance {:.4}  mean draft {:.2}  steps {}",
        r.tokens_per_step, r.acceptance_rate, r.mean_draft_size, r.steps
    );
    println!(
        "speculate {:.3} us/call (p50 {:.1}, p99 {:.1}, max {:.1})  update {:.3} us/token (step {:.3}, append {:.3}; evict {:.3})  warm-up {:.3} s  cached {} tokens  {:.1} B/token resident ({:.1} heap)",
        r.spec_us_per_call,
        r.spec_us_p50,
        r.spec_us_p99,
        r.spec_us_max,
        r.update_us_per_token,
        r.step_update_us_per_token,
        r.append_us_per_token,
        r.evict_us_per_token,
        r.warmup_s,
        r.cached_tokens,
        r.store_bytes_per_token,
        r.store_heap_bytes_per_token
    );
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

fn run_entropy(a: EntropyArgs) -> anyhow::Result<()> {
    let responses = read_examples(&a.logs, Some(a.limit))?
        .map(|ex| ex.map(|ex| ex.response))
        .collect::<Result<Vec<_>, _>>()?;
    let tree = GlobalTree::build(
        a.max_depth,
        responses.iter().enumerate().map(|(i, r)| (i as u64, r)),
    )?;
    let h = tree.next_token_entropy();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"entropy_bits": h, "responses": tree.len(), "tokens": tree.cached_tokens()})
        );
    } else {
        println!(
            "average next-token entropy: {h:.4} bits over {} responses ({} tokens)",
            tree.len(),
            tree.cached_tokens()
        );
    }
    Ok(())
}

/// Parse the command line and run it; errors are printed with their causes.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    });
    let result = match cli.command {
        Command::Simulate(a) => run_simulate(a),
        Command::Entropy(a) => run_entropy(a),
        Command::Build(a) => store::run_build(a),
        Command::Inspect(a) => store::run_inspect(a),
        Command::Ingest(a) => store::run_ingest(a),
        Command::Generate(a) => generate::run_generate(a),
        Command::Serve(a) => serve::run_serve(*a),
        Command::E2eBench(a) => bench::run_bench(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, at the level `RUST_LOG` names, else `default`: `info` for `serve`,
/// whose log an operator reads, and `warn` for the other commands, whose output is their
/// result but whose warnings still matter (device kernels that fell back to candle's, a
/// damaged log recovered around, a tuning variable out of range). Before, only `serve`
/// set up logging, and every other command dropped its warnings.
fn init_logging(default: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        // When stderr goes to a full disk, tracing would report the failed write with
        // `eprintln!`, which panics, and take the model thread with it. A lost log line
        // must not cost a request.
        .log_internal_errors(false)
        .try_init();
}

/// An error and its causes on one line, `outer: cause: ...`, each cause printed once: many
/// of the project's errors already name their cause in their own message (`cannot write
/// X: No space left on device`), and repeating it after them says nothing new.
fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write {path}: {source}")]
    struct Named {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "No space left on device");
        let named = anyhow::Error::new(Named {
            path: "snap-000002.sfxd".into(),
            source: io,
        })
        .context("snapshot failed");
        assert_eq!(
            error_chain(&named),
            "snapshot failed: cannot write snap-000002.sfxd: No space left on device"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
