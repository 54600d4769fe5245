//! `suffixd build` and `suffixd inspect`: making and examining snapshots.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use crate::model::tokenizer::ModelTokenizer;
use crate::store::DiskDirectory;
use crate::store::Snapshot;
use crate::store::from_logs::{BuildOptions, build_from_logs};
use crate::store::manifest::current_snapshot;
use crate::store::wal::check_dir;

#[derive(Args, Debug)]
pub(super) struct BuildArgs {
    /// Log files (.jsonl or .jsonl.zst): token ids, text, or OpenAI chat records.
    #[arg(long, num_args = 1.., required = true)]
    logs: Vec<PathBuf>,
    /// Store directory to write the snapshot into (created if absent). A directory that
    /// already holds a store is refused: the new snapshot would replace it. Add to such a
    /// store with --append.
    #[arg(long)]
    out: PathBuf,
    /// Add the logs' responses to the store in --out through its write-ahead log, as a
    /// server records completed requests (and as `suffixd ingest` does), keeping all it
    /// holds; refused while a server has the store open.
    #[arg(long, conflicts_with = "keep_last")]
    append: bool,
    /// Depth limit of the trees.
    #[arg(long, default_value_t = 24)]
    max_depth: usize,
    /// Namespace of records that do not name one.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Keep only the newest N responses per namespace.
    #[arg(long)]
    keep_last: Option<usize>,
    /// The model's tokenizer: a tokenizer.json, a GGUF model file or a Hugging Face model
    /// directory. Needed for text
    /// logs; for token-id logs it records which tokenizer made the ids.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
}

/// Load a tokenizer from tokenizer.json, a model directory's tokenizer.json, or a GGUF
/// model's metadata.
pub(super) fn load_tokenizer(path: &Path) -> anyhow::Result<ModelTokenizer> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    crate::files::check_regular(&file, "tokenizer or model file")
        .with_context(|| format!("cannot read tokenizer {}", file.display()))?;
    if path.is_dir() {
        Ok(ModelTokenizer::from_file(&file)?)
    } else if path.extension().is_some_and(|e| e == "gguf") {
        let mut f = std::fs::File::open(path)
            .with_context(|| format!("cannot open model {}", path.display()))?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut f)
            .with_context(|| format!("{} is not a readable GGUF file", path.display()))?;
        Ok(ModelTokenizer::from_gguf(&content)?)
    } else {
        Ok(ModelTokenizer::from_file(path)?)
    }
}

pub(super) fn run_build(a: BuildArgs) -> anyhow::Result<()> {
    if a.append {
        return run_ingest(IngestArgs {
            dir: a.out,
            logs: a.logs,
            namespace: a.namespace,
            tokenizer: a.tokenizer,
            max_depth: a.max_depth,
            snapshot_every: 0,
            budget_tokens: None,
            print_acks: false,
        });
    }
    let tokenizer = a.tokenizer.as_deref().map(load_tokenizer).transpose()?;
    let opts = BuildOptions {
        max_depth: a.max_depth,
        namespace: a.namespace,
        keep_last: a.keep_last,
    };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {pos} records read ({per_sec}) {elapsed}",
        )
        .expect("valid template"),
    );
    let t = Instant::now();
    let report = build_from_logs(
        &a.logs,
        &a.out,
        &opts,
        tokenizer.as_ref().map(|t| t as _),
        |n| {
            if n % 256 == 0 {
                bar.set_position(n);
            }
        },
    )
    .context("build failed")?;
    bar.finish_and_clear();
    println!(
        "wrote {}: {} records, {} sequences, {} tokens in {} namespace(s), {:.2} s",
        report.path.display(),
        report.records,
        report.header.sequences,
        report.header.tokens,
        report.header.namespaces,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(Args, Debug)]
pub(super) struct InspectArgs {
    /// A store directory (its current snapshot) or a snapshot file.
    path: PathBuf,
    /// Read and check the whole snapshot: checksum and every tree invariant.
    #[arg(long)]
    verify: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The snapshot file a path means: a file itself, or a directory's current snapshot.
pub(super) fn resolve_snapshot(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_dir() {
        match current_snapshot(&DiskDirectory, path)? {
            Some(p) => Ok(p),
            // Never advice that writes: a store without a manifest may still hold data
            // (its log, or snapshot files whose manifest was lost).
            None => bail!(
                "{} holds no snapshot (no CURRENT manifest). A store that has not snapshotted \
                 keeps everything in its write-ahead log, which `suffixd serve --snapshot-dir` \
                 replays; if snapshot files are there, inspect each one (`suffixd inspect \
                 {}/snap-NNNNNN.sfxd --verify`) and write the name of the newest good one \
                 into {}/CURRENT",
                path.display(),
                path.display(),
                path.display()
            ),
        }
    } else {
        Ok(path.to_path_buf())
    }
}

pub(super) fn run_inspect(a: InspectArgs) -> anyhow::Result<()> {
    let file = resolve_snapshot(&a.path)?;
    let t = Instant::now();
    let snap = Snapshot::open(&file, None)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let namespaces = snap.namespaces()?;
    let verified = if a.verify {
        let t = Instant::now();
        snap.verify()?;
        Some(t.elapsed().as_secs_f64())
    } else {
        None
    };
    // A store directory's log is part of what it holds.
    let wal = if a.verify && a.path.is_dir() {
        let check = check_dir(&DiskDirectory, &a.path, snap.header().tokenizer)?;
        if !check.is_clean() {
            bail!(
                "write-ahead log of {} is damaged: {:?}. Starting the store recovers every good record, and keeps a copy of each damaged segment in damaged/",
                a.path.display(),
                check.damaged
            );
        }
        Some(check)
    } else {
        None
    };
    let per_ns: Vec<serde_json::Value> = namespaces
        .iter()
        .map(|ns| {
            serde_json::json!({
                "name": ns.name,
                "sequences": ns.tree.len(),
                "tokens": ns.tree.cached_tokens(),
                "nodes": ns.tree.node_count(),
            })
        })
        .collect();
    let h = snap.header();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "path": file,
                "header": h,
                "file_bytes": snap.file_len(),
                "bytes_per_token": snap.file_len() as f64 / h.tokens.max(1) as f64,
                "namespaces": per_ns,
                "open_ms": open_ms,
                "verified": verified.is_some(),
                "verify_s": verified,
                "wal": wal,
            })
        );
        return Ok(());
    }
    println!("snapshot {}", file.display());
    println!(
        "  format v{}, {}, max_depth {}, created {} ms since epoch, wal seq {}",
        h.format_version, h.tokenizer, h.max_depth, h.created_unix_ms, h.wal_seq
    );
    println!(
        "  {} sequences, {} tokens, {} bytes on disk ({:.1} B/token), opened in {:.3} ms",
        h.sequences,
        h.tokens,
        snap.file_len(),
        snap.file_len() as f64 / h.tokens.max(1) as f64,
        open_ms
    );
    for ns in &namespaces {
        println!(
            "  namespace {:?}: {} sequences, {} tokens, {} nodes",
            ns.name,
            ns.tree.len(),
            ns.tree.cached_tokens(),
            ns.tree.node_count()
        );
    }
    if let Some(s) = verified {
        println!("  verified: checksum, token ids and tree invariants hold ({s:.2} s)");
    }
    if let Some(w) = wal {
        println!(
            "  write-ahead log: {} segments, {} records, no damage{}",
            w.segments,
            w.records,
            if w.torn_tail_bytes > 0 {
                format!(" ({} bytes of a torn write at the end)", w.torn_tail_bytes)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

#[derive(Args, Debug)]
pub(super) struct IngestArgs {
    /// Store directory (created if absent).
    #[arg(long)]
    dir: PathBuf,
    /// Logs whose responses to append, as completed requests would be.
    #[arg(long, num_args = 1.., required = true)]
    logs: Vec<PathBuf>,
    /// Namespace of records that do not name one.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The model's tokenizer (tokenizer.json or GGUF); needed for text logs.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Depth limit of new trees.
    #[arg(long, default_value_t = 24)]
    max_depth: usize,
    /// Snapshot (and compact) after every N appends; 0 never.
    #[arg(long, default_value_t = 0)]
    snapshot_every: u64,
    /// Evict least recently used responses beyond this many cached tokens.
    #[arg(long)]
    budget_tokens: Option<u64>,
    /// Print `ack <id> <tokens>` to stdout after each append is durable.
    #[arg(long)]
    print_acks: bool,
}

/// Append logged responses to a live store through its WAL: a warm start for a store
/// that already has data, and the writer of the crash tests.
pub(super) fn run_ingest(a: IngestArgs) -> anyhow::Result<()> {
    use crate::corpus::logs::{Response, read_log};
    use crate::store::from_logs::TextEncoder;
    use crate::store::live::{Store, StoreConfig};
    use std::io::Write;
    if !crate::store::is_namespace(&a.namespace) {
        bail!(
            "--namespace {:?} cannot be addressed by any request: a namespace is 1 to {} printable ASCII characters without spaces",
            a.namespace,
            crate::store::MAX_NAMESPACE_BYTES
        );
    }
    let tokenizer = a.tokenizer.as_deref().map(load_tokenizer).transpose()?;
    // A replica's store: append under its tag, so its publisher sends what is ingested
    // to the cluster when it next serves (other ids are never published).
    let replica = crate::replicate::ReplicaIdentity::load(&a.dir)?;
    if let Some(r) = &replica {
        eprintln!(
            "{} belongs to replica {} (tag {}): its cluster receives these appends when it next serves",
            a.dir.display(),
            r.name,
            r.tag
        );
    }
    let store = Store::open(StoreConfig {
        max_depth: a.max_depth,
        budget_tokens: a.budget_tokens,
        id_origin: replica.map_or(0, |r| r.tag),
        ..StoreConfig::new(
            a.dir.clone(),
            tokenizer
                .as_ref()
                .map_or(crate::store::TokenizerId::UNKNOWN, |t| t.identity()),
        )
    })?;
    let mut out = std::io::stdout().lock();
    let mut n = 0u64;
    for path in &a.logs {
        for rec in read_log(path)? {
            let rec = rec?;
            let ns = rec.namespace.clone().unwrap_or_else(|| a.namespace.clone());
            if !crate::store::is_namespace(&ns) {
                bail!(
                    "{}: namespace {ns:?} cannot be addressed by any request: a namespace is 1 to {} printable ASCII characters without spaces; rename it",
                    path.display(),
                    crate::store::MAX_NAMESPACE_BYTES
                );
            }
            for r in rec.responses() {
                let ids = match r {
                    Response::Tokens(t) => t.to_vec(),
                    Response::Text(t) => tokenizer
                        .as_ref()
                        .context("text logs need --tokenizer")?
                        .encode_text(t)?,
                };
                let id = store.append(&ns, &ids)?;
                n += 1;
                if a.print_acks {
                    writeln!(out, "ack {id} {}", ids.len())?;
                    out.flush()?;
                }
                if a.snapshot_every > 0 && n.is_multiple_of(a.snapshot_every) {
                    store.snapshot()?;
                }
            }
        }
    }
    eprintln!("appended {n} responses to {}", a.dir.display());
    Ok(())
}
