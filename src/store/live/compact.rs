//! Snapshots of the live store (also compaction: evicted data is not written) and their
//! verification.

use super::*;

impl Store {
    /// Write everything live (base + delta − evicted) as a new snapshot and swap it in:
    /// this is also compaction, since evicted data is not written. Speculation and
    /// appends go on while it runs; only the final swap takes the write lock.
    pub fn snapshot(&self) -> Result<SnapshotInfo, SnapshotError> {
        // One at a time: a second request waits for the first, then writes what is live
        // by then.
        let _one = self.snapshotting.lock().expect("snapshot lock");
        let t = std::time::Instant::now();
        self.verify_base()?;
        // 1. Cut: a new log segment, and a copy of every live sequence. Appends wait for
        //    the copy; speculation does not.
        let (cut, copy) = {
            let mut writer = self.writer();
            let cut = self.wal.rotate()?;
            writer.apply(|st| st.since_cut.clear());
            let st = writer.get();
            // Per namespace: its name, depth, and its sequences in insertion order.
            let mut copy: Vec<(String, usize, Vec<SeqCopy>)> = Vec::new();
            for (name, ns) in &st.namespaces {
                let mut seqs: Vec<SeqCopy> = ns
                    .seqs
                    .iter()
                    .filter_map(|(&id, info)| {
                        Some((
                            SeqMeta {
                                id,
                                inserted_ms: info.inserted_ms,
                                last_use_ms: info.last_use_ms,
                            },
                            ns.tokens_of(id)?,
                        ))
                    })
                    .collect();
                seqs.sort_by_key(|(m, _)| (m.inserted_ms, m.id));
                copy.push((name.clone(), ns.trees.max_depth(), seqs));
            }
            (cut, copy)
        };
        // 2. Build and write, with no lock held.
        let mut trees = Vec::new();
        for (name, depth, seqs) in &copy {
            let tree = GlobalTree::build(*depth, seqs.iter().map(|(m, toks)| (m.id, toks)))?;
            trees.push((
                name.clone(),
                tree,
                seqs.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
            ));
        }
        drop(copy);
        let inputs = NamespaceInput::borrowing(&trees);
        let fs = &*self.cfg.directory;
        let path = next_snapshot_path(fs, &self.cfg.dir)?;
        let header = write_snapshot(
            fs,
            &path,
            self.cfg.tokenizer,
            (self.wal.log_id(), cut - 1),
            &inputs,
        )?;
        drop(inputs);
        drop(trees);
        // Publishing deletes the old snapshot: only a file that reads back whole may
        // replace it.
        let snap = Snapshot::open_in(fs, &path, Some(self.cfg.tokenizer))?;
        snap.verify()?;
        *self.verified.lock().expect("verified") = Some((path.clone(), Ok(())));
        publish(fs, &self.cfg.dir, &path)?;
        // 3. Swap, carrying over what happened since the cut.
        {
            let mut writer = self.writer();
            let st = writer.get();
            let carried = st.since_cut.clone();
            // Keep the freshest last-use time (touches after the cut).
            let mut fresh = State::from_snapshot(&self.cfg, snap, st.next_id, |name, id| {
                st.namespaces
                    .get(name)?
                    .seqs
                    .get(&id)
                    .map(|i| i.last_use_ms)
            })?;
            drop(st);
            for (seq, op) in carried {
                Self::apply_to(&self.cfg, &mut fresh, &op)?;
                fresh.since_cut.push((seq, op));
            }
            writer.apply(|st| *st = fresh.clone());
        }
        // Before the log that holds the ids since the last snapshot goes.
        let next_id = self.next_id.load(Ordering::Relaxed);
        crate::store::manifest::write_next_id(fs, &self.cfg.dir, next_id)?;
        self.wal.drop_before(cut)?;
        self.counters.lock().expect("counters").snapshots += 1;
        Ok(SnapshotInfo {
            path,
            tokens: header.tokens,
            sequences: header.sequences,
            seconds: t.elapsed().as_secs_f64(),
        })
    }

    /// Verify the live snapshot (checksum, token ids, tree invariants) unless this file
    /// was verified before. Serving reads it unverified (opening stays cheap); this
    /// runs in the background at start and before every snapshot, which must not be
    /// built from a damaged base.
    pub fn verify_base(&self) -> Result<(), SnapshotError> {
        let Some(snap) = self.read().snapshot.clone() else {
            return Ok(());
        };
        let mut verified = self.verified.lock().expect("verified");
        let outcome = match verified.as_ref() {
            Some((path, outcome)) if path == snap.path() => outcome.clone(),
            _ => {
                let outcome = snap.verify().map_err(|e| e.to_string());
                *verified = Some((snap.path().to_path_buf(), outcome.clone()));
                outcome
            }
        };
        outcome.map_err(|what| {
            SnapshotError::DamagedBase(Box::new(OpenError::Corrupt {
                path: snap.path().to_path_buf(),
                what,
            }))
        })
    }

    /// Check the live snapshot completely (checksum, token ids and tree invariants) and
    /// every log segment.
    pub fn verify(&self) -> Result<Verification, WalError> {
        let snap = self.read().snapshot.clone();
        let snapshot_error = snap
            .as_ref()
            .and_then(|s| s.verify().err().map(|e| e.to_string()));
        let wal = check_dir(&*self.cfg.directory, &self.cfg.dir, self.cfg.tokenizer)?;
        Ok(Verification {
            ok: snapshot_error.is_none() && wal.is_clean(),
            snapshot: snap.map(|s| s.path().to_path_buf()),
            snapshot_error,
            wal,
        })
    }
}
