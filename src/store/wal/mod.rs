//! The write-ahead log: every completed request (and every eviction) is written here
//! before it changes the in-memory delta, so that an acknowledged append survives kill -9.
//!
//! File `wal-<first seq>.log` in the store directory:
//! - header (32 bytes): magic `SFXDWAL\0`, format version u32 (2), vocabulary size
//!   u32, vocabulary hash u64, log id u64. Version 1 segments (24 bytes, no log id) are
//!   still read. The log id is drawn at random when a log starts and every segment of it
//!   carries it; a snapshot records the id of the log it cut, so that replay can tell
//!   this log's snapshot from one restored from another store (whose position counts
//!   another log's records);
//! - records: `len u32 | crc32 u32 | payload[len]`, little-endian. The payload is
//!   `seq u64 | kind u8 | namespace (u16 length + UTF-8) | id u64 | time_ms u64 |
//!   n u32 | n × token u32` (n = 0 for evictions).
//!
//! A torn write at the tail of the newest segment (a record cut short, with no good one
//! after it) is what a crash mid-append leaves: the file grows only as a write's bytes
//! land, so a process killed mid-write leaves a short record. Replay stops there and
//! the next writer truncates it. A bad record whose whole length is there is damage, not
//! a torn write, wherever it is (the last record too: its bytes were written and, once
//! acknowledged, fsynced), as is a bad record *followed by good ones*: replay reports it
//! at ERROR, skips it, recovers every good record around it, and keeps a copy of the
//! segment in `damaged/`. It never truncates damage away.
//!
//! A write that fails (a full disk) is taken back out of the file before the error
//! returns, and a failed fsync takes out everything written since the last good one
//! (the kernel may have dropped those pages): so a record that is acknowledged never
//! follows a hole. Records carry increasing sequence numbers; a snapshot stores the
//! last one it folded in, and replay skips those, so replaying twice never doubles a
//! count.
//!
//! Group commit: writers append under one lock, then ask for durability up to their own
//! record; one fsync covers every record written before it, so concurrent writers share
//! fsyncs instead of queueing one each.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::faults::{self, FaultPoint};
use super::fs::{Directory, LogFile};
use super::snapshot::TokenizerId;
use super::{Change, EvictScope};

mod read;

pub use read::{
    Damage, SegmentScan, WalCheck, check_dir, decode_segment, quarantine, read_segment, segments,
};

const MAGIC: [u8; 8] = *b"SFXDWAL\0";
const VERSION: u32 = 2;
/// Header bytes of a version 2 segment (the one written).
const HEADER_LEN: u64 = 32;
/// Header bytes of a version 1 segment (no log id).
const HEADER_LEN_V1: u64 = 24;
/// Largest record accepted on replay: anything bigger is damage, not data.
const MAX_RECORD: u32 = 64 << 20;

/// When the log is fsynced.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// Before an append is acknowledged (group commit): nothing acknowledged is lost.
    Always,
    /// Never from suffixd (the OS decides): fastest, loses the last seconds on power
    /// loss, though not on a process crash.
    Never,
}

/// A record with its sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRecord {
    /// Position in the log, increasing across segments.
    pub seq: u64,
    /// What it does: an append or a one-sequence eviction.
    pub op: Change,
}

/// Errors from the log.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// An eviction of a namespace or by age was given to the log, which records the
    /// sequences an eviction removed, one by one (a bug in the caller, not the disk).
    #[error("the log records one sequence per eviction, not {0:?}: evict through the store")]
    Unresolved(Change),
    /// The file could not be read or written.
    #[error("write-ahead log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a log of this format.
    #[error("{path} is not a suffixd write-ahead log (or is from a newer version); move it aside")]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// An earlier fsync failed, and the record was taken out of the log unacknowledged.
    #[error(
        "write-ahead log {path}: record {seq} was not made durable (an fsync failed; see the earlier error) and was discarded"
    )]
    Discarded {
        /// The segment.
        path: PathBuf,
        /// The record.
        seq: u64,
    },
    /// Sequence numbers ran out (a log reaches this only from a forged snapshot or log).
    #[error(
        "write-ahead log {path}: its sequence numbers are exhausted; start a new store directory and ingest the data"
    )]
    Exhausted {
        /// The segment.
        path: PathBuf,
    },
    /// The log was written for another tokenizer.
    #[error(
        "write-ahead log {path} was written for {found}, but the model's tokenizer is {expected}; move the store directory aside or use the matching model"
    )]
    TokenizerMismatch {
        /// The file.
        path: PathBuf,
        /// Its tokenizer.
        found: TokenizerId,
        /// The model's.
        expected: TokenizerId,
    },
}

/// A record's bytes; `None` for an eviction of more than one sequence, which is logged
/// as the sequences it removed.
fn encode(seq: u64, op: &Change) -> Option<Vec<u8>> {
    let mut p = Vec::new();
    p.extend_from_slice(&seq.to_le_bytes());
    let (kind, ns, id, time, tokens): (u8, &str, u64, u64, &[u32]) = match op {
        Change::Append {
            namespace,
            id,
            time_ms,
            tokens,
        } => (1, namespace, *id, *time_ms, tokens),
        Change::Evict(EvictScope::Id { namespace, id }) => (2, namespace, *id, 0, &[]),
        Change::Evict(EvictScope::Namespace { .. } | EvictScope::UnusedSince { .. }) => {
            return None;
        }
    };
    p.push(kind);
    p.extend_from_slice(&(ns.len() as u16).to_le_bytes());
    p.extend_from_slice(ns.as_bytes());
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&time.to_le_bytes());
    p.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        p.extend_from_slice(&t.to_le_bytes());
    }
    let mut out = Vec::with_capacity(8 + p.len());
    out.extend_from_slice(&(p.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    out.extend_from_slice(&p);
    Some(out)
}

/// Segment file name for a log starting at `first_seq`.
fn segment_name(first_seq: u64) -> String {
    format!("wal-{first_seq:016}.log")
}

struct Writer {
    file: Box<dyn LogFile>,
    path: PathBuf,
    /// Highest sequence number written.
    written: u64,
    /// Bytes of whole records in the file (where the next record goes).
    bytes: u64,
    /// Bytes known durable (the last good fsync covered them).
    synced_bytes: u64,
    /// Records up to this one were discarded after a failed fsync.
    discarded_through: u64,
    /// A failed write or fsync left bytes past `bytes` that are not yet taken out.
    needs_repair: bool,
    /// The log's id, written into every new segment.
    log_id: u64,
}

impl Writer {
    fn io(&self, source: std::io::Error) -> WalError {
        WalError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Cut the file back to its whole records, after a failed write or fsync, so the
    /// next record never follows a partial one.
    fn repair(&mut self) -> Result<(), WalError> {
        if !self.needs_repair {
            return Ok(());
        }
        let cut = faults::check(FaultPoint::WalTruncate)
            .and_then(|_| self.file.set_len(self.bytes))
            .and_then(|_| self.file.seek_to(self.bytes));
        cut.map_err(|e| self.io(e))?;
        self.needs_repair = false;
        Ok(())
    }

    /// After a failed write or fsync: cut the file back to `bytes` now, or, if that
    /// fails too, before the next write.
    fn take_back(&mut self) {
        self.needs_repair = true;
        if let Err(e) = self.repair() {
            tracing::error!("{e}: will retry before the next write");
        }
    }

    /// After a failed fsync: the kernel may have dropped any page written since the last
    /// good one, so take every record since then out and refuse to acknowledge them.
    fn discard_unsynced(&mut self) {
        self.bytes = self.synced_bytes;
        self.discarded_through = self.written;
        self.take_back();
    }
}

/// An open log, appending to its newest segment.
pub struct Wal {
    fs: Arc<dyn Directory>,
    dir: PathBuf,
    tokenizer: TokenizerId,
    policy: FsyncPolicy,
    writer: Mutex<Writer>,
    /// Highest sequence number known durable. Lock order: this, then `writer`.
    synced: Mutex<u64>,
}

impl Wal {
    /// Open the log of `dir` for appending after `last_seq`: to the newest segment,
    /// truncating its torn tail (`intact_len` from [`SegmentScan::intact_len`]), or to a
    /// new segment when `newest` is `None`. New segments carry `log_id`, the id of the
    /// log found in the directory ([`SegmentScan::log_id`]); 0 starts a new log with a
    /// random id.
    pub fn open(
        fs: Arc<dyn Directory>,
        dir: &Path,
        tokenizer: TokenizerId,
        policy: FsyncPolicy,
        last_seq: u64,
        newest: Option<(&Path, u64)>,
        log_id: u64,
    ) -> Result<Self, WalError> {
        let log_id = match log_id {
            0 => new_log_id(),
            id => id,
        };
        let writer = match newest {
            Some((path, intact)) if intact >= HEADER_LEN_V1 => {
                let io = |source| WalError::Io {
                    path: path.into(),
                    source,
                };
                let mut file = fs.open_write(path).map_err(io)?;
                file.set_len(intact).map_err(io)?;
                file.seek_to(intact).map_err(io)?;
                file.sync_all().map_err(io)?;
                Writer {
                    file,
                    path: path.into(),
                    written: last_seq,
                    bytes: intact,
                    synced_bytes: intact,
                    discarded_through: 0,
                    needs_repair: false,
                    log_id,
                }
            }
            _ => {
                let first = next_seq(dir, last_seq)?;
                new_segment(&*fs, dir, tokenizer, first, last_seq, log_id)?
            }
        };
        Ok(Wal {
            fs,
            dir: dir.into(),
            tokenizer,
            policy,
            writer: Mutex::new(writer),
            synced: Mutex::new(last_seq),
        })
    }

    /// Append `op` and, with [`FsyncPolicy::Always`], return only once it is durable.
    /// Returns its sequence number.
    pub fn append(&self, op: &Change) -> Result<u64, WalError> {
        let seq = self.write(op)?;
        self.sync(seq)?;
        Ok(seq)
    }

    /// Write `op` to the log (not yet durable); returns its sequence number. Follow
    /// with [`Wal::sync`] before acknowledging it. A write that fails leaves no trace.
    /// An eviction of more than one sequence is refused: the store logs the sequences
    /// it removed.
    pub fn write(&self, op: &Change) -> Result<u64, WalError> {
        self.write_group(std::slice::from_ref(op))
    }

    /// Append `ops` as consecutive records in one write: all of them or none (a failed
    /// write is cut back out). Returns the last one's sequence number, the one to
    /// [`Wal::sync`]; with no `ops`, the last record written.
    pub fn write_group(&self, ops: &[Change]) -> Result<u64, WalError> {
        let mut w = self.writer.lock().expect("wal writer lock");
        w.repair()?;
        let mut seq = w.written;
        let mut bytes = Vec::new();
        for op in ops {
            seq = next_seq(&w.path, seq)?;
            bytes.extend(encode(seq, op).ok_or_else(|| WalError::Unresolved(op.clone()))?);
        }
        if bytes.is_empty() {
            return Ok(seq);
        }
        if let Err(source) = faults::write_all(FaultPoint::WalWrite, &mut w.file, &bytes) {
            w.take_back();
            return Err(w.io(source));
        }
        w.written = seq;
        w.bytes += bytes.len() as u64;
        Ok(seq)
    }

    /// With [`FsyncPolicy::Always`], return once record `seq` is durable; one fsync
    /// covers every record written before it (group commit).
    pub fn sync(&self, seq: u64) -> Result<(), WalError> {
        if self.policy == FsyncPolicy::Always {
            self.sync_up_to(seq)?;
        }
        Ok(())
    }

    fn sync_up_to(&self, seq: u64) -> Result<(), WalError> {
        let mut synced = self.synced.lock().expect("wal sync lock");
        if *synced >= seq {
            // Another writer's fsync covered this record.
            return Ok(());
        }
        // Holding `synced` keeps rotation out until this fsync is settled, so the
        // segment is still the writer's afterwards.
        let (file, upto, bytes, path) = {
            let w = self.writer.lock().expect("wal writer lock");
            if seq <= w.discarded_through {
                return Err(WalError::Discarded {
                    path: w.path.clone(),
                    seq,
                });
            }
            let f = w.file.try_clone().map_err(|e| w.io(e))?;
            (f, w.written, w.bytes, w.path.clone())
        };
        let result = faults::check(FaultPoint::WalFsync).and_then(|_| file.sync_data());
        let mut w = self.writer.lock().expect("wal writer lock");
        match result {
            Ok(()) => {
                *synced = upto;
                w.synced_bytes = w.synced_bytes.max(bytes);
                Ok(())
            }
            Err(source) => {
                w.discard_unsynced();
                Err(WalError::Io { path, source })
            }
        }
    }

    /// Start a new segment; returns the first sequence number it will hold. Records
    /// before it can be dropped once a snapshot holds them ([`Wal::drop_before`]).
    pub fn rotate(&self) -> Result<u64, WalError> {
        let mut synced = self.synced.lock().expect("wal sync lock");
        let mut w = self.writer.lock().expect("wal writer lock");
        w.repair()?;
        let sealed = faults::check(FaultPoint::WalRotateFsync).and_then(|_| w.file.sync_all());
        if let Err(source) = sealed {
            w.discard_unsynced();
            return Err(w.io(source));
        }
        *synced = w.written;
        let next = next_seq(&w.path, w.written)?;
        let log_id = w.log_id;
        *w = new_segment(
            &*self.fs,
            &self.dir,
            self.tokenizer,
            next,
            w.written,
            log_id,
        )?;
        Ok(next)
    }

    /// Delete the segments that hold only records before `first_kept`.
    pub fn drop_before(&self, first_kept: u64) -> Result<(), WalError> {
        let io = |source| WalError::Io {
            path: self.dir.clone(),
            source,
        };
        let segs = segments(&*self.fs, &self.dir).map_err(io)?;
        for (i, (first, path)) in segs.iter().enumerate() {
            let next_first = segs.get(i + 1).map(|s| s.0);
            if *first < first_kept && next_first.is_some_and(|n| n <= first_kept) {
                faults::check(FaultPoint::WalRemove)
                    .and_then(|_| self.fs.remove(path))
                    .map_err(io)?;
            }
        }
        Ok(())
    }

    /// The highest sequence number written.
    pub fn last_seq(&self) -> u64 {
        self.writer.lock().expect("wal writer lock").written
    }

    /// Bytes in the current segment.
    pub fn current_bytes(&self) -> u64 {
        self.writer.lock().expect("wal writer lock").bytes
    }

    /// The log's id: what a snapshot of it records ([`super::snapshot::Header::log_id`]).
    pub fn log_id(&self) -> u64 {
        self.writer.lock().expect("wal writer lock").log_id
    }
}

/// A fresh log id: random, never 0 (which means "unknown").
fn new_log_id() -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return id;
        }
    }
}

/// The sequence number after `last`: an error rather than a wrap to 0, which would put
/// every later record behind the snapshot's cut.
fn next_seq(path: &Path, last: u64) -> Result<u64, WalError> {
    last.checked_add(1)
        .ok_or_else(|| WalError::Exhausted { path: path.into() })
}

fn new_segment(
    fs: &dyn Directory,
    dir: &Path,
    tokenizer: TokenizerId,
    first_seq: u64,
    written: u64,
    log_id: u64,
) -> Result<Writer, WalError> {
    let path = dir.join(segment_name(first_seq));
    let io = |source| WalError::Io {
        path: path.clone(),
        source,
    };
    fs.create_dir_all(dir).map_err(io)?;
    let mut file = fs.create(&path).map_err(io)?;
    let mut h = Vec::with_capacity(HEADER_LEN as usize);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&tokenizer.vocab_size.to_le_bytes());
    h.extend_from_slice(&tokenizer.vocab_hash.to_le_bytes());
    h.extend_from_slice(&log_id.to_le_bytes());
    let created = faults::write_all(FaultPoint::WalNewSegment, &mut file, &h)
        .and_then(|_| file.sync_all())
        .and_then(|_| fs.sync_dir(dir));
    if let Err(source) = created {
        // A half-made segment holds no record; leaving it would put it ahead of the
        // segment still in use.
        let _ = fs.remove(&path);
        return Err(WalError::Io { path, source });
    }
    Ok(Writer {
        file,
        path,
        written,
        bytes: HEADER_LEN,
        synced_bytes: HEADER_LEN,
        discarded_through: 0,
        needs_repair: false,
        log_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fs::DiskDirectory;
    use std::fs::OpenOptions;

    fn disk() -> Arc<dyn Directory> {
        Arc::new(DiskDirectory)
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let tok = TokenizerId::UNKNOWN;
        let wal = Wal::open(disk(), dir.path(), tok, FsyncPolicy::Always, 0, None, 0).unwrap();
        let a = Change::Append {
            namespace: "acme".into(),
            id: 7,
            time_ms: 5,
            tokens: vec![1, 2, u32::MAX],
        };
        let e = Change::evict("acme", 7);
        assert_eq!(wal.append(&a).unwrap(), 1);
        assert_eq!(wal.append(&e).unwrap(), 2);
        // Wider evictions are logged as the sequences they removed.
        let wide = Change::Evict(EvictScope::Namespace {
            namespace: "acme".into(),
        });
        assert!(matches!(wal.append(&wide), Err(WalError::Unresolved(_))));
        let (_, path) = segments(&DiskDirectory, dir.path()).unwrap().pop().unwrap();
        let scan = read_segment(&DiskDirectory, &path, tok).unwrap();
        let (recs, intact) = (&scan.records, scan.intact_len());
        assert_eq!(
            recs.iter().map(|r| r.op.clone()).collect::<Vec<_>>(),
            vec![a, e]
        );
        // Tear the last record: only the first survives, and reopening truncates.
        let len = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        let scan = read_segment(&DiskDirectory, &path, tok).unwrap();
        let (recs, intact2) = (&scan.records, scan.intact_len());
        assert_eq!(recs.len(), 1);
        assert!(scan.damage.is_empty(), "a torn tail is not damage");
        assert!(intact2 < intact);
        let wal = Wal::open(
            disk(),
            dir.path(),
            tok,
            FsyncPolicy::Always,
            1,
            Some((&path, intact2)),
            0,
        )
        .unwrap();
        assert_eq!(wal.append(&Change::evict("x", 1)).unwrap(), 2);
        assert_eq!(
            read_segment(&DiskDirectory, &path, tok)
                .unwrap()
                .records
                .len(),
            2
        );
        // Another tokenizer's log is refused.
        let other = TokenizerId {
            vocab_size: 3,
            vocab_hash: 9,
        };
        assert!(matches!(
            read_segment(&DiskDirectory, &path, other),
            Err(WalError::TokenizerMismatch { .. })
        ));
    }

    #[test]
    fn every_segment_of_a_log_carries_its_id_and_version_1_segments_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let tok = TokenizerId::UNKNOWN;
        let wal = Wal::open(disk(), dir.path(), tok, FsyncPolicy::Always, 0, None, 0).unwrap();
        let id = wal.log_id();
        assert_ne!(id, 0);
        wal.append(&append("n", 1)).unwrap();
        wal.rotate().unwrap();
        wal.append(&append("n", 2)).unwrap();
        assert_eq!(wal.log_id(), id);
        for (_, path) in segments(&DiskDirectory, dir.path()).unwrap() {
            assert_eq!(read_segment(&DiskDirectory, &path, tok).unwrap().log_id, id);
        }
        // A version 1 segment: the same records behind the 24-byte header.
        let (_, path) = segments(&DiskDirectory, dir.path()).unwrap().pop().unwrap();
        let v2 = std::fs::read(&path).unwrap();
        let mut v1 = v2[..24].to_vec();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&v2[32..]);
        let scan = decode_segment(&path, &v1, tok).unwrap();
        assert_eq!(scan.log_id, 0);
        assert_eq!(
            scan.records,
            read_segment(&DiskDirectory, &path, tok).unwrap().records
        );
        assert!(scan.damage.is_empty() && scan.tail.is_none());
        // The counter never wraps.
        let opened = Wal::open(
            disk(),
            dir.path(),
            tok,
            FsyncPolicy::Always,
            u64::MAX,
            None,
            id,
        );
        assert!(matches!(opened, Err(WalError::Exhausted { .. })));
    }

    fn append(ns: &str, id: u64) -> Change {
        Change::Append {
            namespace: ns.into(),
            id,
            time_ms: 1,
            tokens: vec![id as u32; 5],
        }
    }

    #[test]
    fn a_bad_record_between_good_ones_is_damage_and_the_good_ones_are_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let tok = TokenizerId::UNKNOWN;
        let wal = Wal::open(disk(), dir.path(), tok, FsyncPolicy::Always, 0, None, 0).unwrap();
        for id in 1..=5 {
            wal.append(&append("n", id)).unwrap();
        }
        let (_, path) = segments(&DiskDirectory, dir.path()).unwrap().pop().unwrap();
        let clean = std::fs::read(&path).unwrap();
        let record = (clean.len() - HEADER_LEN as usize) / 5;
        // Flip one byte inside the second record's payload.
        let mut bytes = clean.clone();
        bytes[HEADER_LEN as usize + record + 20] ^= 0x40;
        let scan = decode_segment(&path, &bytes, tok).unwrap();
        let ids: Vec<u64> = scan.records.iter().map(|r| r.seq).collect();
        assert_eq!(ids, vec![1, 3, 4, 5]);
        assert_eq!(
            scan.damage,
            vec![Damage {
                offset: HEADER_LEN + record as u64,
                len: record as u64
            }]
        );
        assert_eq!(scan.tail, None);
        // A flipped length field is found the same way.
        let mut bytes = clean.clone();
        bytes[HEADER_LEN as usize + 2 * record + 1] ^= 0x01;
        let scan = decode_segment(&path, &bytes, tok).unwrap();
        assert_eq!(scan.records.len(), 4);
        assert_eq!(scan.damage.len(), 1);
        // The same bytes in the last record are damage too: it is there whole.
        let mut bytes = clean.clone();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x40;
        let scan = decode_segment(&path, &bytes, tok).unwrap();
        assert_eq!(scan.records.len(), 4);
        assert_eq!(
            scan.damage,
            [Damage {
                offset: HEADER_LEN + 4 * record as u64,
                len: record as u64
            }]
        );
        assert_eq!(scan.tail, None);
        // The last record cut short is a torn write, not damage.
        let cut = &clean[..clean.len() - 3];
        let scan = decode_segment(&path, cut, tok).unwrap();
        assert_eq!(scan.records.len(), 4);
        assert!(scan.damage.is_empty());
        assert_eq!(scan.tail, Some(HEADER_LEN + 4 * record as u64));
    }

    #[test]
    fn check_dir_reports_damage_and_a_bad_tail_of_a_sealed_segment() {
        let dir = tempfile::tempdir().unwrap();
        let tok = TokenizerId::UNKNOWN;
        let wal = Wal::open(disk(), dir.path(), tok, FsyncPolicy::Always, 0, None, 0).unwrap();
        wal.append(&append("n", 1)).unwrap();
        wal.append(&append("n", 2)).unwrap();
        wal.rotate().unwrap();
        wal.append(&append("n", 3)).unwrap();
        assert!(
            check_dir(&DiskDirectory, dir.path(), tok)
                .unwrap()
                .is_clean()
        );
        let segs = segments(&DiskDirectory, dir.path()).unwrap();
        // Cut the sealed segment short: its lost tail is damage, since it was fsynced whole.
        let sealed = &segs[0].1;
        let len = std::fs::metadata(sealed).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(sealed)
            .unwrap()
            .set_len(len - 2)
            .unwrap();
        let check = check_dir(&DiskDirectory, dir.path(), tok).unwrap();
        assert_eq!(check.segments, 2);
        assert_eq!(check.records, 2);
        assert_eq!(check.damaged.len(), 1);
        assert_eq!(&check.damaged[0].0, sealed);
        let copy = quarantine(&DiskDirectory, dir.path(), sealed).unwrap();
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            std::fs::read(sealed).unwrap()
        );
    }
}
