//! Opening a store: its current snapshot, then the write-ahead log after it.

use super::*;
use crate::store::wal::SegmentScan;

impl Store {
    /// Open the store in `cfg.dir`: its current snapshot (if any), then the WAL.
    pub fn open(cfg: StoreConfig) -> Result<Self, StoreOpenError> {
        let fs = &*cfg.directory;
        fs.create_dir_all(&cfg.dir).map_err(|source| DirError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        let lock = crate::store::manifest::lock(fs, &cfg.dir)?;
        let mut state = State::new(&cfg);
        let current = current_snapshot(fs, &cfg.dir)?;
        if current.is_none() {
            Self::refuse_to_orphan_snapshots(&cfg)?;
        }
        let mut cut = None;
        if let Some(path) = current {
            let snap = Snapshot::open_in(fs, &path, Some(cfg.tokenizer))?;
            let h = snap.header();
            cut = Some((path.clone(), h.log_id, h.wal_seq));
            state = State::from_snapshot(&cfg, snap, state.next_id, |_, _| None)?;
        }
        let io = |source| DirError::Io {
            path: cfg.dir.clone(),
            source,
        };
        let segs = segments(fs, &cfg.dir).map_err(io)?;
        let mut scans = Vec::with_capacity(segs.len());
        let mut wal_damage = Vec::new();
        for (i, (_, path)) in segs.iter().enumerate() {
            let scan = read_segment(fs, path, cfg.tokenizer)?;
            let is_newest = i + 1 == segs.len();
            if is_newest && scan.torn_tail_bytes() > 0 {
                tracing::info!(
                    "write-ahead log {}: {} bytes of a write torn by a crash dropped",
                    path.display(),
                    scan.torn_tail_bytes()
                );
            }
            let damage = scan.damage(is_newest);
            if !damage.is_empty() {
                let copy = quarantine(fs, &cfg.dir, path).map_err(io)?;
                tracing::error!(
                    "write-ahead log {} is damaged: {} bad byte run(s) ({} bytes, at offsets {:?}) were skipped and the records in them are lost; the {} good records around them were recovered. A copy of the segment is in {}; the next snapshot folds the recovered records in",
                    path.display(),
                    damage.len(),
                    damage.iter().map(|d| d.len).sum::<u64>(),
                    damage.iter().map(|d| d.offset).collect::<Vec<_>>(),
                    scan.records.len(),
                    copy.display()
                );
                wal_damage.push((path.clone(), damage));
            }
            scans.push(scan);
        }
        let log = LogPosition::of(&segs, &scans);
        // Replay the log after the snapshot: from its cut when it was taken of this log,
        // every record otherwise.
        let replay = match &cut {
            Some((path, log_id, wal_seq)) => log.replay_after(path, *log_id, *wal_seq),
            None => Replay::After(0),
        };
        if let Some((path, log_id, wal_seq)) = &cut {
            Self::settle_other_snapshots(&cfg, path, (*log_id, *wal_seq), &log, replay)?;
        }
        let mut replayed = 0;
        // Set up only where it is used: it reads every record's id.
        let mut over_foreign =
            matches!(replay, Replay::Everything).then(|| ForeignReplay::new(&cfg, &state, &scans));
        for r in scans.iter().flat_map(|s| s.records.iter()) {
            let applied = match (over_foreign.as_mut(), replay) {
                (Some(foreign), _) => foreign.apply(&cfg, &mut state, &r.op)?,
                (None, Replay::After(cut)) if r.seq <= cut => None,
                (None, _) => {
                    Self::apply_to(&cfg, &mut state, &r.op)?;
                    Some(r.op.clone())
                }
            };
            if let Some(op) = applied {
                state.since_cut.push((r.seq, op));
                replayed += 1;
            }
        }
        if let (Some(foreign), Some((path, _, wal_seq))) = (&over_foreign, &cut) {
            foreign.report(path, *wal_seq, &log);
        }
        // Appending goes on in the newest segment, unless it is damaged: then in a
        // fresh one, so that the damaged file is only ever read.
        let newest = match (segs.last(), scans.last()) {
            (Some((_, path)), Some(scan)) if scan.damage(true).is_empty() => {
                Some((path.clone(), scan.intact_len()))
            }
            _ => None,
        };
        let last = match (replay, &cut) {
            // A cut of this log past its end (its newest segments were removed): carry
            // on after the cut, so no number the snapshot holds is used twice.
            (Replay::After(cut), _) => log.last.max(cut),
            _ => log.last,
        };
        let wal = Wal::open(
            cfg.directory.clone(),
            &cfg.dir,
            cfg.tokenizer,
            cfg.fsync,
            last,
            newest.as_ref().map(|(p, i)| (p.as_path(), *i)),
            log.id,
        )?;
        // Ids handed out and evicted before the last snapshot's cut are only in NEXT_ID.
        if let Some(next) = crate::store::manifest::read_next_id(fs, &cfg.dir)?
            && own_ids(cfg.id_origin).contains(&next)
        {
            state.next_id = state.next_id.max(next);
        }
        let own_start = own_ids(cfg.id_origin).start;
        let last_own_id = if state.next_id > own_start + 1 {
            state.next_id - 1
        } else {
            0
        };
        let empty = GlobalTree::new(cfg.max_depth)?;
        let store = Store {
            cfg,
            next_id: AtomicU64::new(state.next_id),
            last_own_id: AtomicU64::new(last_own_id),
            state: DoubleBuffered::new(state),
            wal,
            snapshotting: Mutex::new(()),
            counters: Mutex::new(StoreCounters {
                replayed,
                ..Default::default()
            }),
            wal_damage,
            verified: Mutex::new(None),
            touches: Default::default(),
            empty,
            _lock: lock,
        };
        Ok(store)
    }

    /// The snapshot files beside the current one `current` (which cut log `cut.0` at
    /// `cut.1`), after a crash or a restore. One that the current snapshot and the log
    /// already hold is deleted: an older snapshot of the same log (a crash before the
    /// publish that replaced it deleted it), or a newer one whose records the log still
    /// holds from the current snapshot's cut on (a crash before `CURRENT` named it).
    /// Any other (the newer snapshot an operator stepped back from by restoring an
    /// older one, a damaged one, one of another log) may hold what the store does not:
    /// it is moved to `quarantine/`, never deleted. Half-written `.tmp` files are
    /// deleted. When the current snapshot's cut is older than the log's first record,
    /// the records between are in no file the store reads: said at WARN, with the count.
    fn settle_other_snapshots(
        cfg: &StoreConfig,
        current: &Path,
        cut: (u64, u64),
        log: &LogPosition,
        replay: Replay,
    ) -> Result<(), StoreOpenError> {
        let fs = &*cfg.directory;
        let (cut_log, cut_seq) = cut;
        // Whether replaying the log over the current snapshot passes every record
        // after its cut.
        let log_whole_after_cut =
            matches!(replay, Replay::After(_)) && log.first.is_none_or(|f| f <= cut_seq + 1);
        let (mut removed, mut bytes) = (0, 0);
        let mut set_aside = Vec::new();
        for path in snapshot_files(fs, &cfg.dir)? {
            if path == current {
                continue;
            }
            let position = Snapshot::open_in(fs, &path, None)
                .ok()
                .map(|s| (s.header().log_id, s.header().wal_seq));
            let held = position.is_some_and(|(log_id, seq)| {
                let older_of_same_log = log_id != 0 && log_id == cut_log && seq <= cut_seq;
                let in_the_log =
                    log_id != 0 && log_id == log.id && log_whole_after_cut && seq <= log.last;
                older_of_same_log || in_the_log
            });
            if held {
                let len = fs
                    .entries_if_any(&cfg.dir)
                    .ok()
                    .and_then(|es| {
                        let name = path.file_name()?.to_str()?;
                        es.into_iter().find(|e| e.name == name)
                    })
                    .map_or(0, |e| e.len);
                if fs.remove(&path).is_ok() {
                    removed += 1;
                    bytes += len;
                }
            } else {
                set_aside.push(crate::store::manifest::set_aside(fs, &cfg.dir, &path)?);
            }
        }
        let (tmp_files, tmp_bytes) = crate::store::manifest::remove_stale(fs, &cfg.dir, None)?;
        if removed + tmp_files > 0 {
            tracing::info!(
                "store directory {}: removed {} file(s) ({} bytes) that a crash left and the current snapshot and the log hold",
                cfg.dir.display(),
                removed + tmp_files,
                bytes + tmp_bytes
            );
        }
        let names = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !set_aside.is_empty() {
            tracing::warn!(
                "store directory {}: {} snapshot file(s) that CURRENT does not name and that may hold sequences this store does not were moved to {} (nothing was deleted). To go back to one: stop the server, move it into the store directory and write its name into CURRENT",
                cfg.dir.display(),
                set_aside.len(),
                names(&set_aside)
            );
        }
        if let (Replay::After(after), Some(first)) = (replay, log.first)
            && first > after + 1
        {
            tracing::warn!(
                "snapshot {} cut this log at record {after}, but the log now starts at record {first}: the {} records between were folded into a later snapshot and are not in this store (an older snapshot was restored?){}",
                current.display(),
                first - after - 1,
                if set_aside.is_empty() {
                    String::new()
                } else {
                    format!("; a later snapshot is in {}", names(&set_aside))
                }
            );
        }
        Ok(())
    }

    /// Without a manifest, a store starts from its log alone. That is right for a
    /// snapshot that a crash left unpublished (the log still holds all of it), and
    /// wrong when `CURRENT` was lost: then the log no longer holds what the snapshot
    /// does, and the next snapshot would delete it. So start only when every snapshot
    /// file's sequences are all in the log; otherwise refuse, naming the file to restore.
    fn refuse_to_orphan_snapshots(cfg: &StoreConfig) -> Result<(), StoreOpenError> {
        let fs = &*cfg.directory;
        let files = snapshot_files(fs, &cfg.dir)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut logged = std::collections::HashSet::new();
        let segs = segments(fs, &cfg.dir).map_err(|source| DirError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        for (_, path) in &segs {
            for r in read_segment(fs, path, cfg.tokenizer)?.records {
                if let Change::Append { namespace, id, .. } = r.op {
                    logged.insert((namespace, id));
                }
            }
        }
        let mut newest_valid = None;
        let mut all_logged = true;
        for path in &files {
            let snap = Snapshot::open_in(fs, path, Some(cfg.tokenizer)).and_then(|s| {
                s.verify()?;
                Ok(s)
            });
            let Ok(snap) = snap else {
                all_logged = false;
                continue;
            };
            newest_valid.get_or_insert_with(|| path.clone());
            for ns in snap.namespaces()? {
                all_logged &= ns
                    .meta
                    .iter()
                    .all(|m| logged.contains(&(ns.name.clone(), m.id)));
            }
        }
        if all_logged {
            tracing::warn!(
                "store directory {}: no CURRENT manifest; its snapshot files were never published (a crash before the manifest was written) and the log holds all of their data: starting from the log",
                cfg.dir.display()
            );
            return Ok(());
        }
        let advice = match newest_valid.as_ref().and_then(|p| p.file_name()) {
            Some(name) => format!(
                "The newest snapshot that verifies is {name}: restore it with `echo {name} > {}`, then start again",
                cfg.dir.join(crate::store::manifest::MANIFEST).display(),
                name = name.to_string_lossy()
            ),
            None => "No snapshot file here verifies: restore the directory from a backup, or move it aside and rebuild it with `suffixd build`".into(),
        };
        Err(DirError::NoManifest {
            path: cfg.dir.clone(),
            advice,
        }
        .into())
    }
}

/// Where the directory's log stands, as read at open.
struct LogPosition {
    /// Its id (0: no segment, or only version 1 segments).
    id: u64,
    /// The highest sequence number it has used: its last record, or the number before
    /// its newest segment's first (a segment is named by the first number it holds).
    last: u64,
    /// Whether any segment is there at all.
    exists: bool,
    /// The first sequence number of its oldest segment, when there is one.
    first: Option<u64>,
    /// Records in it.
    records: usize,
}

impl LogPosition {
    fn of(segs: &[(u64, PathBuf)], scans: &[SegmentScan]) -> Self {
        let last_record = scans
            .iter()
            .flat_map(|s| s.records.last())
            .map(|r| r.seq)
            .max()
            .unwrap_or(0);
        let named = segs.last().map_or(0, |(first, _)| first.saturating_sub(1));
        LogPosition {
            id: scans
                .iter()
                .rev()
                .map(|s| s.log_id)
                .find(|&id| id != 0)
                .unwrap_or(0),
            last: last_record.max(named),
            exists: !segs.is_empty(),
            first: segs.first().map(|(first, _)| *first),
            records: scans.iter().map(|s| s.records.len()).sum(),
        }
    }

    /// How to replay this log over a snapshot that cut log `log_id` at `wal_seq`.
    ///
    /// A snapshot's position counts the records of the log it was taken from. Skipping
    /// this log's records up to it is right only when that log is this one: the same
    /// id, or, for files that predate log ids, a position this log has reached. A
    /// snapshot restored from another store, one built from files, or one whose position
    /// is past anything this log has written (a wrapped or forged counter) says nothing
    /// about which of this log's records it holds, so every record is replayed over it.
    fn replay_after(&self, path: &Path, log_id: u64, wal_seq: u64) -> Replay {
        let same_log = log_id != 0 && log_id == self.id;
        let legacy = log_id == 0 && self.id == 0 && self.exists && wal_seq <= self.last;
        if same_log && wal_seq > self.last {
            tracing::warn!(
                "snapshot {} holds this log's records up to {wal_seq}, but the log ends at {}: its newest segments were removed. Starting from the snapshot; nothing it holds is lost",
                path.display(),
                self.last
            );
        }
        if same_log || legacy {
            Replay::After(wal_seq)
        } else {
            Replay::Everything
        }
    }
}

/// Which of the log's records replay applies.
#[derive(Clone, Copy, Debug)]
enum Replay {
    /// Those after this sequence number (the snapshot's cut of this log).
    After(u64),
    /// All of them: the snapshot was not taken of this log.
    Everything,
}

/// Replaying every record of a log over a snapshot that was not taken of it:
/// - an append the snapshot already holds (the same tokens under the same id: it came
///   through replication, or the snapshot is an older copy of this store) is skipped;
/// - an append whose id the snapshot holds with other tokens (two stores that both
///   number their sequences from 1) is kept under a fresh id, above every id in the
///   snapshot and the log, so replaying the same files again renames it the same way;
/// - an eviction applies only to a sequence this log appended (under its new id, if it
///   was renamed): an id the log did not append may name another store's sequence.
struct ForeignReplay {
    appended: std::collections::HashMap<(String, u64), u64>,
    next_fresh: u64,
    applied: usize,
    renamed: usize,
    already_held: usize,
    evictions_skipped: usize,
}

impl ForeignReplay {
    fn new(cfg: &StoreConfig, state: &State, scans: &[SegmentScan]) -> Self {
        let logged = scans
            .iter()
            .flat_map(|s| &s.records)
            .filter_map(|r| match r.op {
                Change::Append { id, .. } if own_ids(cfg.id_origin).contains(&id) => Some(id + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        ForeignReplay {
            appended: Default::default(),
            next_fresh: state.next_id.max(logged),
            applied: 0,
            renamed: 0,
            already_held: 0,
            evictions_skipped: 0,
        }
    }

    /// Apply `op` as described above; returns the change applied, if any.
    fn apply(
        &mut self,
        cfg: &StoreConfig,
        state: &mut State,
        op: &Change,
    ) -> Result<Option<Change>, StoreOpenError> {
        let op = match op {
            Change::Append {
                namespace,
                id: logged_id,
                tokens,
                time_ms,
            } => {
                let held = state
                    .namespaces
                    .get(namespace)
                    .filter(|ns| ns.seqs.contains_key(logged_id))
                    .map(|ns| ns.tokens_of(*logged_id));
                let id = match held {
                    Some(held) if held.as_ref() == Some(tokens) => {
                        self.already_held += 1;
                        return Ok(None);
                    }
                    Some(_) => {
                        self.renamed += 1;
                        self.next_fresh += 1;
                        self.next_fresh - 1
                    }
                    None => *logged_id,
                };
                self.appended.insert((namespace.clone(), *logged_id), id);
                Change::Append {
                    namespace: namespace.clone(),
                    id,
                    time_ms: *time_ms,
                    tokens: tokens.clone(),
                }
            }
            Change::Evict(EvictScope::Id { namespace, id }) => {
                let Some(&id) = self.appended.get(&(namespace.clone(), *id)) else {
                    self.evictions_skipped += 1;
                    return Ok(None);
                };
                Change::evict(namespace.clone(), id)
            }
            // A log holds one-sequence evictions only (`Wal::write` refuses others).
            Change::Evict(EvictScope::Namespace { .. } | EvictScope::UnusedSince { .. }) => {
                return Ok(None);
            }
        };
        Store::apply_to(cfg, state, &op)?;
        self.applied += 1;
        Ok(Some(op))
    }

    fn report(&self, snapshot: &Path, wal_seq: u64, log: &LogPosition) {
        if !log.exists {
            return;
        }
        tracing::warn!(
            "snapshot {} was not taken of this directory's log (restored from another store, built from files, or its log position {wal_seq} is past this log's last record {}): every one of the log's {} records was replayed over it instead of those after its position: {} applied ({} of them under a fresh id, as the snapshot holds other tokens under theirs), {} already in the snapshot, {} evictions of sequences this log did not append left out (the budget evicts them in time). Nothing acknowledged is lost; the next snapshot records this log's position",
            snapshot.display(),
            log.last,
            log.records,
            self.applied,
            self.renamed,
            self.already_held,
            self.evictions_skipped
        );
    }
}
