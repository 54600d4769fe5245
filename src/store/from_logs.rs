//! `suffixd build`: a snapshot from request logs, for warm starts.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use crate::corpus::CorpusError;
use crate::corpus::logs::{Response, read_log};
use crate::tree::{GlobalTree, TreeError};

use super::fs::{Directory, DiskDirectory};
use super::manifest::{DirError, holds_store, lock, next_snapshot_path, publish};
use super::snapshot::{Header, NamespaceInput, SeqMeta, TokenizerId, WriteError, write_snapshot};

pub use crate::vocab::TextEncoder;

/// How to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Depth limit of the trees.
    pub max_depth: usize,
    /// Namespace of records that do not name one.
    pub namespace: String,
    /// Keep only the newest N responses of each namespace (as the cache's budget would).
    pub keep_last: Option<usize>,
}

/// Errors from building a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A log could not be read.
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    /// A tree refused a sequence.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The snapshot could not be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The output directory could not be updated.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// A text record needs a tokenizer.
    #[error(
        "{path}: holds text responses; give the model (--model) or a tokenizer (--tokenizer) to tokenize them"
    )]
    NeedTokenizer {
        /// The log.
        path: PathBuf,
    },
    /// Tokenization failed.
    #[error("{path}: cannot tokenize a response: {source}")]
    Tokenize {
        /// The log.
        path: PathBuf,
        /// What the tokenizer said.
        source: crate::vocab::EncodeError,
    },
    /// The output directory already holds a store, which a build would replace.
    #[error(
        "{path} already holds a store (a snapshot, a manifest or a write-ahead log): a build writes a new store and would replace what it holds. To add these logs to it through its log, as a server would, run `suffixd build --append` (or `suffixd ingest --dir {path}`); to start afresh, build into a new directory"
    )]
    StoreExists {
        /// The directory.
        path: PathBuf,
    },
    /// A namespace no request could address.
    #[error(
        "{whence}: namespace {name:?} cannot be addressed by any request: a namespace is 1 to {max} printable ASCII characters without spaces; rename it",
        max = crate::store::MAX_NAMESPACE_BYTES
    )]
    BadNamespace {
        /// Where it was named: a log, or `--namespace`.
        whence: String,
        /// The name.
        name: String,
    },
    /// Token-id logs and text logs were mixed: their ids would not agree.
    #[error(
        "{path}: mixes token-id and text records; the ids of token-id logs come from an unknown tokenizer"
    )]
    Mixed {
        /// The log.
        path: PathBuf,
    },
}

/// What a build produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BuildReport {
    /// The snapshot file written.
    pub path: PathBuf,
    /// Its header.
    pub header: Header,
    /// Log records read.
    pub records: u64,
    /// Responses cached per namespace.
    pub namespaces: BTreeMap<String, usize>,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Read `logs`, build one tree per namespace and write them as the snapshot of a new
/// store in `out_dir`. `out_dir` must not hold a store already ([`BuildError::StoreExists`]:
/// the new snapshot would replace it), and its `LOCK` is held throughout, as every writer
/// holds it, so no server can start on the directory meanwhile. `progress` is called after
/// each record with the count so far.
pub fn build_from_logs(
    logs: &[PathBuf],
    out_dir: &Path,
    opts: &BuildOptions,
    encoder: Option<&dyn TextEncoder>,
    mut progress: impl FnMut(u64),
) -> Result<BuildReport, BuildError> {
    let fs = &DiskDirectory;
    fs.create_dir_all(out_dir).map_err(|source| DirError::Io {
        path: out_dir.into(),
        source,
    })?;
    if !crate::store::is_namespace(&opts.namespace) {
        return Err(BuildError::BadNamespace {
            whence: "--namespace".into(),
            name: opts.namespace.clone(),
        });
    }
    let _lock = lock(fs, out_dir)?;
    if holds_store(fs, out_dir)? {
        return Err(BuildError::StoreExists {
            path: out_dir.into(),
        });
    }
    let mut kept: BTreeMap<String, VecDeque<Vec<u32>>> = BTreeMap::new();
    let mut records = 0u64;
    let (mut saw_ids, mut saw_text) = (false, false);
    for path in logs {
        for rec in read_log(path)? {
            let rec = rec?;
            let ns = rec
                .namespace
                .clone()
                .unwrap_or_else(|| opts.namespace.clone());
            if !crate::store::is_namespace(&ns) {
                return Err(BuildError::BadNamespace {
                    whence: path.display().to_string(),
                    name: ns,
                });
            }
            let queue = kept.entry(ns).or_default();
            for r in rec.responses() {
                let ids = match r {
                    Response::Tokens(ids) => {
                        saw_ids = true;
                        ids.to_vec()
                    }
                    Response::Text(text) => {
                        saw_text = true;
                        let enc = encoder
                            .ok_or_else(|| BuildError::NeedTokenizer { path: path.clone() })?;
                        enc.encode(text).map_err(|source| BuildError::Tokenize {
                            path: path.clone(),
                            source,
                        })?
                    }
                };
                if saw_ids && saw_text {
                    return Err(BuildError::Mixed { path: path.clone() });
                }
                if opts.keep_last == Some(queue.len()) {
                    queue.pop_front();
                }
                if opts.keep_last != Some(0) {
                    queue.push_back(ids);
                }
            }
            records += 1;
            progress(records);
        }
    }
    // With a tokenizer, token-id logs are taken to come from it (they are checked
    // against nothing else); without one their tokenizer is unknown.
    let tokenizer = encoder.map_or(TokenizerId::UNKNOWN, |e| e.identity());
    let now = unix_ms();
    let mut next_id = 1u64;
    let mut trees = Vec::new();
    for (name, responses) in kept {
        let first_id = next_id;
        next_id += responses.len() as u64;
        let ids = first_id..next_id;
        let tree = GlobalTree::build(opts.max_depth, ids.clone().zip(responses))?;
        let meta: Vec<SeqMeta> = ids
            .map(|id| SeqMeta {
                id,
                inserted_ms: now,
                last_use_ms: now,
            })
            .collect();
        trees.push((name, tree, meta));
    }
    let inputs = NamespaceInput::borrowing(&trees);
    let path = next_snapshot_path(fs, out_dir)?;
    let header = write_snapshot(fs, &path, tokenizer, (0, 0), &inputs)?;
    publish(fs, out_dir, &path)?;
    Ok(BuildReport {
        path,
        header,
        records,
        namespaces: trees.iter().map(|(n, t, _)| (n.clone(), t.len())).collect(),
    })
}
