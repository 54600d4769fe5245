//! Snapshots in the JetStream Object Store: a replica publishes its snapshot, tagged with
//! the stream position it covers, and a new replica starts from the newest one instead of
//! replaying the whole stream.
//!
//! Objects are named `snap-<position, 20 digits>-<replica>`, so that name order is
//! position order. A snapshot holds every record the replica had applied up to that
//! position, and possibly some after it (applied while it was written) and its own
//! appends not yet published: replaying the stream from the position delivers those
//! again, and the shared ids make that harmless.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream::{self, object_store};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::SyncError;
use crate::store::DiskDirectory;
use crate::store::TokenizerId;
use crate::store::live::{Store, own_ids};
use crate::store::manifest::{current_snapshot, next_snapshot_path, publish};
use crate::store::snapshot::Snapshot;
use crate::store::wal::segments;

/// The bucket of a cluster's snapshots.
pub(super) fn bucket_name(cluster: &str) -> String {
    format!("{cluster}-snapshots")
}

/// The object name of a snapshot covering the stream up to `position`.
pub(super) fn object_name(position: u64, replica: &str) -> String {
    format!("snap-{position:020}-{replica}")
}

/// The stream position in an object name.
fn position_of(name: &str) -> Option<u64> {
    name.strip_prefix("snap-")?.get(..20)?.parse().ok()
}

/// The bucket, created if it is missing.
pub(super) async fn bucket(
    js: &jetstream::Context,
    cluster: &str,
) -> Result<object_store::ObjectStore, SyncError> {
    let name = bucket_name(cluster);
    match js.get_object_store(&name).await {
        Ok(b) => Ok(b),
        Err(_) => js
            .create_object_store(object_store::Config {
                bucket: name,
                description: Some("suffixd snapshots".into()),
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(SyncError::nats("creating the snapshot bucket")),
    }
}

/// Upload `file` as the snapshot covering `position`, then prune the bucket: objects
/// named after a position the stream never reached (`last_sequence`) are not snapshots
/// of this stream and go; of those at or before `position`, the newest `keep` stay.
/// Objects between `position` and the stream's end are left alone: another replica may
/// be ahead. So a badly named object can never push a real snapshot out.
pub(super) async fn upload(
    bucket: &object_store::ObjectStore,
    name: &str,
    file: std::fs::File,
    position: u64,
    last_sequence: u64,
    keep: usize,
) -> Result<u64, SyncError> {
    let mut file = tokio::fs::File::from_std(file);
    let info = bucket
        .put(name, &mut file)
        .await
        .map_err(SyncError::nats("uploading the snapshot"))?;
    let mut names = list(bucket).await?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    let mut kept = 0;
    for old in &names {
        let at = position_of(old).expect("listed names parse");
        let prune = if at > last_sequence {
            true
        } else if at <= position {
            kept += 1;
            kept > keep.max(1)
        } else {
            false
        };
        if prune && let Err(e) = bucket.delete(old).await {
            tracing::warn!("replication: cannot prune snapshot {old}: {e}");
        }
    }
    Ok(info.size as u64)
}

/// The stream's last sequence, which no snapshot's position can pass; None when the
/// stream cannot be read.
pub(super) async fn last_sequence(js: &jetstream::Context, cluster: &str) -> Option<u64> {
    let mut stream = js.get_stream(cluster).await.ok()?;
    Some(stream.info().await.ok()?.state.last_sequence)
}

/// The names of the snapshots in the bucket.
async fn list(bucket: &object_store::ObjectStore) -> Result<Vec<String>, SyncError> {
    let mut names = Vec::new();
    let during = "listing the published snapshots";
    let mut objects = bucket.list().await.map_err(SyncError::nats(during))?;
    while let Some(info) = objects.next().await {
        let info = info.map_err(SyncError::nats(during))?;
        if position_of(&info.name).is_some() {
            names.push(info.name);
        }
    }
    Ok(names)
}

/// A published snapshot fetched to start from (an empty store) or to catch up from (a
/// store that missed records).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Bootstrap {
    /// The object fetched.
    pub object: String,
    /// The stream position the snapshot covers: the stream is replayed after it.
    pub position: u64,
    /// Where it was written.
    pub path: PathBuf,
    /// Newer objects refused (damaged, another tokenizer), with the reason.
    pub refused: Vec<(String, String)>,
}

/// Whether `dir` holds nothing yet: no snapshot and no log.
pub(super) fn is_empty_store(dir: &Path) -> bool {
    matches!(current_snapshot(&DiskDirectory, dir), Ok(None))
        && segments(&DiskDirectory, dir).map_or(true, |s| s.is_empty())
}

/// Download the newest snapshot whose checksum, token ids, header counts and tokenizer
/// hold into `dir`, and make it current. Older ones are tried when a newer one is
/// refused; None when the bucket holds none. The tree invariants are left to the
/// store's check off the request path (`Store::verify_base`, which `serve` runs at
/// start), as for a local snapshot: they cost seconds per 100 MB, and the checksum
/// already shows the file arrived as its replica verified it before publishing.
pub(super) async fn download_newest(
    js: &jetstream::Context,
    cluster: &str,
    dir: &Path,
    tokenizer: TokenizerId,
) -> Result<Option<Bootstrap>, SyncError> {
    let path = next_snapshot_path(&DiskDirectory, dir)?;
    let Some(fetched) = fetch_newest(js, cluster, &path, tokenizer, 0).await? else {
        return Ok(None);
    };
    publish(&DiskDirectory, dir, &path)?;
    Ok(Some(fetched))
}

/// Download to `path` the newest published snapshot that covers at least stream
/// position `min_position` and passes the checks a received snapshot gets
/// ([`Snapshot::verify_received`]); a refused one is deleted and the next older one
/// tried. None when no such snapshot is published.
pub(super) async fn fetch_newest(
    js: &jetstream::Context,
    cluster: &str,
    path: &Path,
    tokenizer: TokenizerId,
    min_position: u64,
) -> Result<Option<Bootstrap>, SyncError> {
    let Ok(bucket) = js.get_object_store(bucket_name(cluster)).await else {
        return Ok(None);
    };
    let mut names = list(&bucket).await?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    let last = last_sequence(js, cluster).await;
    let mut refused = Vec::new();
    for name in names {
        let position = position_of(&name).expect("listed names parse");
        if position < min_position {
            break;
        }
        if let Some(last) = last.filter(|&last| position > last) {
            let why = format!("its position {position} is past the stream's last record {last}");
            tracing::error!("replication: published snapshot {name} refused: {why}");
            refused.push((name, why));
            continue;
        }
        let checked = fetch(&bucket, &name, path).await.and_then(|()| {
            let snap = Snapshot::open(path, Some(tokenizer))?;
            Ok(snap.verify_received()?)
        });
        match checked {
            Ok(()) => {
                return Ok(Some(Bootstrap {
                    object: name,
                    position,
                    path: path.into(),
                    refused,
                }));
            }
            Err(why) => {
                tracing::error!("replication: published snapshot {name} refused: {why}");
                let _ = std::fs::remove_file(path);
                refused.push((name, why.to_string()));
            }
        }
    }
    Ok(None)
}

/// What a catch-up from a published snapshot changed in the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Merged {
    /// Sequences of the snapshot the store did not hold, added under their ids.
    pub added: usize,
    /// Sequences the store held that the snapshot's replica had evicted.
    pub evicted: usize,
}

/// Bring a store that missed stream records (the stream's retention dropped them before
/// it read them) to what `snap`, published at a position past the gap, holds:
/// - what the snapshot holds and the store lacks is added under its id;
/// - what the store holds from other replicas and the snapshot lacks is evicted: the
///   store read it from the stream before the gap, so the snapshot's replica had it too
///   and evicted it since, by an operator's eviction in the gap or its own budget;
/// - the store's own sequences are evicted only when the snapshot lacks them although it
///   holds a later own one: own appends are published in id order, so those were on
///   the stream before the snapshot's position. Later ones may not be published yet.
///
/// Every change is an ordinary logged append or eviction, so a crash half way through is
/// repaired by the next catch-up, which finds the same gap.
pub(super) fn merge(store: &Store, snap: &Snapshot, own_tag: u16) -> Result<Merged, SyncError> {
    let own = own_ids(own_tag);
    let frozen = snap.namespaces()?;
    let newest_own = frozen
        .iter()
        .flat_map(|ns| ns.meta.iter().map(|m| m.id))
        .filter(|id| own.contains(id))
        .max();
    let mut merged = Merged::default();
    let mut held = HashSet::new();
    for ns in &frozen {
        for m in &ns.meta {
            held.insert((ns.name.as_str(), m.id));
            let Some(tokens) = ns.tree.sequence(m.id) else {
                continue;
            };
            if store.append_replicated(&ns.name, m.id, m.inserted_ms, tokens)? {
                merged.added += 1;
            }
        }
    }
    let evicted_there = |namespace: &str, id: u64| {
        !held.contains(&(namespace, id))
            && (!own.contains(&id) || newest_own.is_some_and(|newest| id < newest))
    };
    let victims: Vec<(String, u64)> = {
        let st = store.read();
        st.namespaces
            .iter()
            .flat_map(|(name, ns)| {
                ns.ids()
                    .filter(|&id| evicted_there(name, id))
                    .map(|id| (name.clone(), id))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    merged.evicted += store.evict_sequences(&victims)?;
    Ok(merged)
}

async fn fetch(
    bucket: &object_store::ObjectStore,
    name: &str,
    path: &Path,
) -> Result<(), SyncError> {
    let during = "downloading a published snapshot";
    let mut object = bucket.get(name).await.map_err(SyncError::nats(during))?;
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(SyncError::io(path))?;
    let waited = Duration::from_secs(600);
    // The copy's error is the download's or the file's: both are reported as NATS's.
    tokio::time::timeout(waited, tokio::io::copy(&mut object, &mut file))
        .await
        .map_err(|_| SyncError::TimedOut {
            during,
            after: waited,
        })?
        .map_err(SyncError::nats(during))?;
    file.flush().await.map_err(SyncError::io(path))?;
    file.sync_all().await.map_err(SyncError::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_sort_by_position() {
        let (a, b) = (object_name(9, "zz"), object_name(10, "aa"));
        assert!(a < b);
        assert_eq!(position_of(&b), Some(10));
        assert_eq!(position_of("snap-12"), None);
        assert_eq!(position_of("other"), None);
    }
}
