//! Opening a store: its current snapshot, then the write-ahead log after it.

use super::*;

impl Store {
    /// Open the store in `cfg.dir`: its current snapshot (if any), then the WAL.
    pub fn open(cfg: StoreConfig) -> Result<Self, StoreOpenError> {
        std::fs::create_dir_all(&cfg.dir).map_err(|source| DirError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        let lock = crate::store::dir::lock(&cfg.dir)?;
        let mut state = State::new(&cfg);
        let mut wal_seq = 0;
        let current = current_snapshot(&cfg.dir)?;
        if current.is_none() {
            Self::refuse_to_orphan_snapshots(&cfg)?;
        }
        if let Some(path) = current {
            let snap = Snapshot::open(&path, Some(cfg.tokenizer))?;
            wal_seq = snap.header().wal_seq;
            state = State::from_snapshot(&cfg, snap, state.next_id, |_, _| None)?;
        }
        // Replay the log after the snapshot.
        let io = |source| DirError::Io {
            path: cfg.dir.clone(),
            source,
        };
        let segs = segments(&cfg.dir).map_err(io)?;
        let mut last = wal_seq;
        let mut newest = None;
        let mut replayed = 0;
        let mut wal_damage = Vec::new();
        for (i, (_, path)) in segs.iter().enumerate() {
            let scan = read_segment(path, cfg.tokenizer)?;
            let is_newest = i + 1 == segs.len();
            if is_newest && scan.torn_tail_bytes() > 0 {
                tracing::info!(
                    "write-ahead log {}: {} bytes of a write torn by a crash dropped",
                    path.display(),
                    scan.torn_tail_bytes()
                );
            }
            let damage = scan.damage(is_newest);
            let damaged = !damage.is_empty();
            if damaged {
                let copy = quarantine(&cfg.dir, path).map_err(io)?;
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
            for r in scan.records.iter().cloned() {
                last = last.max(r.seq);
                if r.seq <= wal_seq {
                    continue;
                }
                Self::apply(&cfg, &mut state, &r.op)?;
                state.since_cut.push((r.seq, r.op));
                replayed += 1;
            }
            // Appending goes on in the newest segment, unless it is damaged: then in a
            // fresh one, so that the damaged file is only ever read.
            newest = (!damaged).then(|| (path.clone(), scan.intact_len()));
        }
        let wal = Wal::open(
            &cfg.dir,
            cfg.tokenizer,
            cfg.fsync,
            last,
            newest.as_ref().map(|(p, i)| (p.as_path(), *i)),
        )?;
        // Ids handed out and evicted before the last snapshot's cut are only in NEXT_ID.
        if let Some(next) = crate::store::dir::read_next_id(&cfg.dir)
            && own_ids(cfg.id_origin).contains(&next)
        {
            state.next_id = state.next_id.max(next);
        }
        let store = Store {
            cfg,
            next_id: AtomicU64::new(state.next_id),
            state: DoubleBuffered::new(state),
            wal,
            snapshotting: Mutex::new(()),
            counters: Mutex::new(StoreCounters {
                replayed,
                ..Default::default()
            }),
            wal_damage,
            verified: Mutex::new(None),
            _lock: lock,
        };
        Ok(store)
    }

    /// Without a manifest, a store starts from its log alone. That is right for a
    /// snapshot that a crash left unpublished (the log still holds all of it), and
    /// wrong when `CURRENT` was lost: then the log no longer holds what the snapshot
    /// does, and the next snapshot would delete it. So start only when every snapshot
    /// file's sequences are all in the log; otherwise refuse, naming the file to restore.
    fn refuse_to_orphan_snapshots(cfg: &StoreConfig) -> Result<(), StoreOpenError> {
        let files = snapshot_files(&cfg.dir)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut logged = std::collections::HashSet::new();
        let segs = segments(&cfg.dir).map_err(|source| DirError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        for (_, path) in &segs {
            for r in read_segment(path, cfg.tokenizer)?.records {
                if let WalOp::Append { namespace, id, .. } = r.op {
                    logged.insert((namespace, id));
                }
            }
        }
        let mut newest_valid = None;
        let mut all_logged = true;
        for path in &files {
            let snap = Snapshot::open(path, Some(cfg.tokenizer)).and_then(|s| {
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
                cfg.dir.join(crate::store::dir::MANIFEST).display(),
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
