//! The write-ahead log: every completed request (and every eviction) is written here
//! before it changes the in-memory delta, so that an acknowledged append survives kill -9.
//!
//! File `wal-<first seq>.log` in the store directory:
//! - header (24 bytes): magic `SFXDWAL\0`, format version u32, vocabulary size u32,
//!   vocabulary hash u64;
//! - records: `len u32 | crc32 u32 | payload[len]`, little-endian. The payload is
//!   `seq u64 | kind u8 | namespace (u16 length + UTF-8) | id u64 | time_ms u64 |
//!   n u32 | n × token u32` (n = 0 for evictions).
//!
//! A torn write at the tail (short record, bad checksum) ends the log: replay stops
//! there and the next writer truncates it. Records carry increasing sequence numbers;
//! a snapshot stores the last one it folded in, and replay skips those, so replaying
//! twice never doubles a count.
//!
//! Group commit: writers append under one lock, then ask for durability up to their own
//! record; one fsync covers every record written before it, so concurrent writers share
//! fsyncs instead of queueing one each.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::snapshot::TokenizerId;

const MAGIC: [u8; 8] = *b"SFXDWAL\0";
const VERSION: u32 = 1;
const HEADER_LEN: u64 = 24;
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

/// What a record does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalOp {
    /// A completed request's response.
    Append {
        /// Namespace.
        namespace: String,
        /// Sequence id.
        id: u64,
        /// When, ms since the epoch.
        time_ms: u64,
        /// The response tokens.
        tokens: Vec<u32>,
    },
    /// An explicit or budget eviction.
    Evict {
        /// Namespace.
        namespace: String,
        /// Sequence id.
        id: u64,
    },
}

/// A record with its sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRecord {
    /// Position in the log, increasing across segments.
    pub seq: u64,
    /// What it does.
    pub op: WalOp,
}

/// Errors from the log.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
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

fn encode(rec: &WalRecord) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&rec.seq.to_le_bytes());
    let (kind, ns, id, time, tokens): (u8, &str, u64, u64, &[u32]) = match &rec.op {
        WalOp::Append {
            namespace,
            id,
            time_ms,
            tokens,
        } => (1, namespace, *id, *time_ms, tokens),
        WalOp::Evict { namespace, id } => (2, namespace, *id, 0, &[]),
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
    out
}

/// Decode one payload; `None` when it is malformed.
fn decode(p: &[u8]) -> Option<WalRecord> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = p.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let seq = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let kind = take(1)?[0];
    let ns_len = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
    let namespace = String::from_utf8(take(ns_len)?.to_vec()).ok()?;
    let id = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let time_ms = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    let raw = take(n.checked_mul(4)?)?;
    let tokens = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    if at != p.len() {
        return None;
    }
    let op = match kind {
        1 => WalOp::Append {
            namespace,
            id,
            time_ms,
            tokens,
        },
        2 => WalOp::Evict { namespace, id },
        _ => return None,
    };
    Some(WalRecord { seq, op })
}

/// Segment file name for a log starting at `first_seq`.
fn segment_name(first_seq: u64) -> String {
    format!("wal-{first_seq:016}.log")
}

fn segment_first_seq(name: &str) -> Option<u64> {
    name.strip_prefix("wal-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// The log segments of `dir`, oldest first.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            for e in rd {
                let e = e?;
                if let Some(s) = e.file_name().to_str().and_then(segment_first_seq) {
                    out.push((s, e.path()));
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    out.sort();
    Ok(out)
}

/// Read every intact record of one segment. Returns them and the byte length of the
/// intact prefix (where a torn tail starts).
pub fn read_segment(path: &Path, expected: TokenizerId) -> Result<(Vec<WalRecord>, u64), WalError> {
    let io = |source| WalError::Io {
        path: path.into(),
        source,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .map_err(io)?
        .read_to_end(&mut bytes)
        .map_err(io)?;
    decode_segment(path, &bytes, expected)
}

/// [`read_segment`] on bytes already in memory; `path` is only used in error messages.
pub fn decode_segment(
    path: &Path,
    bytes: &[u8],
    expected: TokenizerId,
) -> Result<(Vec<WalRecord>, u64), WalError> {
    if bytes.len() < HEADER_LEN as usize {
        // A segment torn before its header was complete holds no records.
        return Ok((Vec::new(), 0));
    }
    if bytes[..8] != MAGIC || u32::from_le_bytes(bytes[8..12].try_into().expect("4")) != VERSION {
        return Err(WalError::Foreign { path: path.into() });
    }
    let found = TokenizerId {
        vocab_size: u32::from_le_bytes(bytes[12..16].try_into().expect("4")),
        vocab_hash: u64::from_le_bytes(bytes[16..24].try_into().expect("8")),
    };
    if found != expected {
        return Err(WalError::TokenizerMismatch {
            path: path.into(),
            found,
            expected,
        });
    }
    let mut at = HEADER_LEN as usize;
    let mut out = Vec::new();
    while let Some(head) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4"));
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4"));
        if len > MAX_RECORD {
            break;
        }
        let Some(payload) = bytes.get(at + 8..at + 8 + len as usize) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Some(rec) = decode(payload) else { break };
        out.push(rec);
        at += 8 + len as usize;
    }
    Ok((out, at as u64))
}

struct Writer {
    file: File,
    path: PathBuf,
    /// Highest sequence number written.
    written: u64,
    bytes: u64,
}

/// An open log, appending to its newest segment.
pub struct Wal {
    dir: PathBuf,
    tokenizer: TokenizerId,
    policy: FsyncPolicy,
    writer: Mutex<Writer>,
    /// Highest sequence number known durable.
    synced: Mutex<u64>,
}

impl Wal {
    /// Open the log of `dir` for appending after `last_seq`, truncating a torn tail of
    /// the newest segment (`intact_len` from [`read_segment`]), or starting a segment.
    pub fn open(
        dir: &Path,
        tokenizer: TokenizerId,
        policy: FsyncPolicy,
        last_seq: u64,
        newest: Option<(&Path, u64)>,
    ) -> Result<Self, WalError> {
        let writer = match newest {
            Some((path, intact)) if intact >= HEADER_LEN => {
                let io = |source| WalError::Io {
                    path: path.into(),
                    source,
                };
                let mut file = OpenOptions::new().write(true).open(path).map_err(io)?;
                file.set_len(intact).map_err(io)?;
                file.seek(SeekFrom::End(0)).map_err(io)?;
                file.sync_all().map_err(io)?;
                Writer {
                    file,
                    path: path.into(),
                    written: last_seq,
                    bytes: intact,
                }
            }
            _ => new_segment(dir, tokenizer, last_seq + 1, last_seq)?,
        };
        Ok(Wal {
            dir: dir.into(),
            tokenizer,
            policy,
            writer: Mutex::new(writer),
            synced: Mutex::new(last_seq),
        })
    }

    /// Append `op` and, with [`FsyncPolicy::Always`], return only once it is durable.
    /// Returns its sequence number.
    pub fn append(&self, op: WalOp) -> Result<u64, WalError> {
        let seq = self.write(op)?;
        self.sync(seq)?;
        Ok(seq)
    }

    /// Write `op` to the log (not yet durable); returns its sequence number. Follow
    /// with [`Wal::sync`] before acknowledging it.
    pub fn write(&self, op: WalOp) -> Result<u64, WalError> {
        let mut w = self.writer.lock().expect("wal writer lock");
        let seq = w.written + 1;
        let bytes = encode(&WalRecord { seq, op });
        let path = w.path.clone();
        w.file
            .write_all(&bytes)
            .map_err(|source| WalError::Io { path, source })?;
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
        let (file, upto, path) = {
            let w = self.writer.lock().expect("wal writer lock");
            let f = w.file.try_clone().map_err(|source| WalError::Io {
                path: w.path.clone(),
                source,
            })?;
            (f, w.written, w.path.clone())
        };
        file.sync_data()
            .map_err(|source| WalError::Io { path, source })?;
        *synced = upto;
        Ok(())
    }

    /// Start a new segment; returns the first sequence number it will hold. Records
    /// before it can be dropped once a snapshot holds them ([`Wal::drop_before`]).
    pub fn rotate(&self) -> Result<u64, WalError> {
        let mut w = self.writer.lock().expect("wal writer lock");
        let path = w.path.clone();
        w.file
            .sync_all()
            .map_err(|source| WalError::Io { path, source })?;
        let next = w.written + 1;
        *w = new_segment(&self.dir, self.tokenizer, next, w.written)?;
        Ok(next)
    }

    /// Delete the segments that hold only records before `first_kept`.
    pub fn drop_before(&self, first_kept: u64) -> Result<(), WalError> {
        let io = |source| WalError::Io {
            path: self.dir.clone(),
            source,
        };
        let segs = segments(&self.dir).map_err(io)?;
        for (i, (first, path)) in segs.iter().enumerate() {
            let next_first = segs.get(i + 1).map(|s| s.0);
            if *first < first_kept && next_first.is_some_and(|n| n <= first_kept) {
                std::fs::remove_file(path).map_err(io)?;
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
}

fn new_segment(
    dir: &Path,
    tokenizer: TokenizerId,
    first_seq: u64,
    written: u64,
) -> Result<Writer, WalError> {
    let path = dir.join(segment_name(first_seq));
    let io = |source| WalError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    let mut h = Vec::with_capacity(HEADER_LEN as usize);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&tokenizer.vocab_size.to_le_bytes());
    h.extend_from_slice(&tokenizer.vocab_hash.to_le_bytes());
    file.write_all(&h).map_err(io)?;
    file.sync_all().map_err(io)?;
    super::snapshot::sync_dir(dir).map_err(io)?;
    Ok(Writer {
        file,
        path,
        written,
        bytes: HEADER_LEN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let tok = TokenizerId::UNKNOWN;
        let wal = Wal::open(dir.path(), tok, FsyncPolicy::Always, 0, None).unwrap();
        let a = WalOp::Append {
            namespace: "acme".into(),
            id: 7,
            time_ms: 5,
            tokens: vec![1, 2, u32::MAX],
        };
        let e = WalOp::Evict {
            namespace: "acme".into(),
            id: 7,
        };
        assert_eq!(wal.append(a.clone()).unwrap(), 1);
        assert_eq!(wal.append(e.clone()).unwrap(), 2);
        let (_, path) = segments(dir.path()).unwrap().pop().unwrap();
        let (recs, intact) = read_segment(&path, tok).unwrap();
        assert_eq!(
            recs.iter().map(|r| r.op.clone()).collect::<Vec<_>>(),
            vec![a, e]
        );
        // Tear the last record: only the first survives, and reopening truncates.
        let len = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        let (recs, intact2) = read_segment(&path, tok).unwrap();
        assert_eq!(recs.len(), 1);
        assert!(intact2 < intact);
        let wal = Wal::open(
            dir.path(),
            tok,
            FsyncPolicy::Always,
            1,
            Some((&path, intact2)),
        )
        .unwrap();
        assert_eq!(
            wal.append(WalOp::Evict {
                namespace: "x".into(),
                id: 1
            })
            .unwrap(),
            2
        );
        assert_eq!(read_segment(&path, tok).unwrap().0.len(), 2);
        // Another tokenizer's log is refused.
        let other = TokenizerId {
            vocab_size: 3,
            vocab_hash: 9,
        };
        assert!(matches!(
            read_segment(&path, other),
            Err(WalError::TokenizerMismatch { .. })
        ));
    }
}
