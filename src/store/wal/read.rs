//! Reading the write-ahead log back: a record's payload decoded, a segment's records
//! and damage found (resynchronising past bad bytes), a directory's log checked, and a
//! damaged segment kept aside. The format is in the parent module's doc.

use std::path::{Path, PathBuf};

use super::{HEADER_LEN, HEADER_LEN_V1, MAGIC, MAX_RECORD, VERSION, WalError, WalRecord};
use crate::store::Change;
use crate::store::faults::DurableFile;
use crate::store::fs::Directory;
use crate::store::snapshot::TokenizerId;

/// Decode one payload; `None` when it is malformed.
pub(super) fn decode(p: &[u8]) -> Option<WalRecord> {
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
        1 => Change::Append {
            namespace,
            id,
            time_ms,
            tokens,
        },
        2 => Change::evict(namespace, id),
        _ => return None,
    };
    Some(WalRecord { seq, op })
}

pub(super) fn segment_first_seq(name: &str) -> Option<u64> {
    name.strip_prefix("wal-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// The log segments of `dir`, oldest first.
pub fn segments(fs: &dyn Directory, dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs.entries_if_any(dir)? {
        if let Some(s) = segment_first_seq(&e.name) {
            out.push((s, dir.join(&e.name)));
        }
    }
    out.sort();
    Ok(out)
}

/// Bytes of a record's frame (length and checksum) and of its smallest payload.
const FRAME: usize = 8;
const MIN_PAYLOAD: usize = 8 + 1 + 2 + 8 + 8 + 4;

/// A run of bytes inside a segment that holds no good record, with good records after.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Damage {
    /// Where the bad bytes start.
    pub offset: u64,
    /// How many bytes were skipped.
    pub len: u64,
}

/// What reading one segment found.
#[derive(Clone, Debug, Default)]
pub struct SegmentScan {
    /// Every good record, in order.
    pub records: Vec<WalRecord>,
    /// Bad byte runs with good records after them, or a whole last record that fails its
    /// checks (damage, never a torn write).
    pub damage: Vec<Damage>,
    /// Where trailing bytes that hold no good record start, if there are any: a torn
    /// write in the newest segment, damage in an older one.
    pub tail: Option<u64>,
    /// Bytes of the segment.
    pub len: u64,
    /// The id of the log the segment belongs to (0: a version 1 segment, or one torn
    /// before its header was whole).
    pub log_id: u64,
}

impl SegmentScan {
    /// Byte length up to the end of the last good record (where a torn tail starts).
    pub fn intact_len(&self) -> u64 {
        self.tail.unwrap_or(self.len)
    }

    /// The damaged byte runs. In the newest segment a bad tail is a torn write; an
    /// older one was fsynced whole before the next began, so there it is damage too.
    pub fn damage(&self, newest: bool) -> Vec<Damage> {
        let mut damage = self.damage.clone();
        if let Some(t) = self.tail.filter(|_| !newest) {
            damage.push(Damage {
                offset: t,
                len: self.len - t,
            });
        }
        damage
    }

    /// Bytes of a torn write at the end (of the newest segment; see [`SegmentScan::damage`]).
    pub fn torn_tail_bytes(&self) -> u64 {
        self.len - self.intact_len()
    }
}

/// Read every good record of one segment, and where its bad bytes are.
pub fn read_segment(
    fs: &dyn Directory,
    path: &Path,
    expected: TokenizerId,
) -> Result<SegmentScan, WalError> {
    let io = |source| WalError::Io {
        path: path.into(),
        source,
    };
    fs.refuse_non_regular(path, "log segment").map_err(io)?;
    let bytes = fs.read(path).map_err(io)?;
    decode_segment(path, &bytes, expected)
}

/// The good record at `at` whose sequence number is above `after`, and its length.
fn record_at(bytes: &[u8], at: usize, after: u64) -> Option<(WalRecord, usize)> {
    let head = bytes.get(at..at + FRAME)?;
    let len = u32::from_le_bytes(head[0..4].try_into().expect("4"));
    if len > MAX_RECORD || (len as usize) < MIN_PAYLOAD {
        return None;
    }
    let payload = bytes.get(at + FRAME..at + FRAME + len as usize)?;
    // Cheap tests first: resynchronising after damage tries every offset.
    let seq = u64::from_le_bytes(payload[0..8].try_into().expect("8"));
    if seq <= after || !matches!(payload[8], 1 | 2) {
        return None;
    }
    if crc32fast::hash(payload) != u32::from_le_bytes(head[4..8].try_into().expect("4")) {
        return None;
    }
    let rec = decode(payload)?;
    Some((rec, FRAME + len as usize))
}

/// Whether the bytes from `at` to the end are exactly one record's frame and payload by
/// its length field: a record written whole (a write cut short by a crash leaves fewer
/// bytes than its length says).
fn whole_last_record(bytes: &[u8], at: usize) -> bool {
    let Some(head) = bytes.get(at..at + FRAME) else {
        return false;
    };
    let len = u32::from_le_bytes(head[0..4].try_into().expect("4"));
    len <= MAX_RECORD && len as usize >= MIN_PAYLOAD && bytes.len() - at - FRAME == len as usize
}

/// [`read_segment`] on bytes already in memory; `path` is only used in error messages.
pub fn decode_segment(
    path: &Path,
    bytes: &[u8],
    expected: TokenizerId,
) -> Result<SegmentScan, WalError> {
    let mut scan = SegmentScan {
        len: bytes.len() as u64,
        ..SegmentScan::default()
    };
    if bytes.len() < HEADER_LEN_V1 as usize {
        // A segment torn before its header was complete holds no records.
        scan.tail = Some(0);
        return Ok(scan);
    }
    if bytes[..8] != MAGIC {
        return Err(WalError::Foreign { path: path.into() });
    }
    let header_len = match u32::from_le_bytes(bytes[8..12].try_into().expect("4")) {
        1 => HEADER_LEN_V1,
        VERSION => HEADER_LEN,
        _ => return Err(WalError::Foreign { path: path.into() }),
    };
    if bytes.len() < header_len as usize {
        scan.tail = Some(0);
        return Ok(scan);
    }
    if header_len == HEADER_LEN {
        scan.log_id = u64::from_le_bytes(bytes[24..32].try_into().expect("8"));
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
    let mut at = header_len as usize;
    let mut last = 0;
    while at < bytes.len() {
        if let Some((rec, len)) = record_at(bytes, at, last) {
            last = rec.seq;
            scan.records.push(rec);
            at += len;
            continue;
        }
        // A bad record: damage if a good one follows, or if it is a whole record to
        // the end of the file; a torn tail if it is cut short.
        match (at + 1..bytes.len()).find(|&p| record_at(bytes, p, last).is_some()) {
            Some(next) => {
                scan.damage.push(Damage {
                    offset: at as u64,
                    len: (next - at) as u64,
                });
                at = next;
            }
            None if whole_last_record(bytes, at) => {
                scan.damage.push(Damage {
                    offset: at as u64,
                    len: (bytes.len() - at) as u64,
                });
                break;
            }
            None => {
                scan.tail = Some(at as u64);
                break;
            }
        }
    }
    Ok(scan)
}

/// What [`check_dir`] found in a store directory's log.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WalCheck {
    /// Segments read.
    pub segments: usize,
    /// Good records in them.
    pub records: u64,
    /// Damaged segments, with their bad byte runs; a bad tail of an older segment is
    /// listed here too.
    pub damaged: Vec<(PathBuf, Vec<Damage>)>,
    /// Bytes of a torn write at the end of the newest segment (the next writer drops them).
    pub torn_tail_bytes: u64,
}

impl WalCheck {
    /// Whether no segment is damaged (a torn tail is not damage).
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty()
    }
}

/// Read every segment of `dir` and report its damage: for `inspect --verify` and the
/// admin API.
pub fn check_dir(
    fs: &dyn Directory,
    dir: &Path,
    expected: TokenizerId,
) -> Result<WalCheck, WalError> {
    let segs = segments(fs, dir).map_err(|source| WalError::Io {
        path: dir.into(),
        source,
    })?;
    let mut check = WalCheck::default();
    for (i, (_, path)) in segs.iter().enumerate() {
        let scan = read_segment(fs, path, expected)?;
        let newest = i + 1 == segs.len();
        check.segments += 1;
        check.records += scan.records.len() as u64;
        if newest {
            check.torn_tail_bytes = scan.torn_tail_bytes();
        }
        let damage = scan.damage(newest);
        if !damage.is_empty() {
            check.damaged.push((path.clone(), damage));
        }
    }
    Ok(check)
}

/// Copy a damaged segment into `dir/damaged/` (once), so that the operator keeps the
/// evidence after replay has recovered around it and a snapshot has dropped it.
pub fn quarantine(fs: &dyn Directory, dir: &Path, segment: &Path) -> std::io::Result<PathBuf> {
    let into = dir.join("damaged");
    fs.create_dir_all(&into)?;
    let copy = into.join(segment.file_name().unwrap_or_default());
    if fs.kind(&copy)?.is_none() {
        // A damaged segment is only ever read (appending goes on in a fresh one), so it
        // can be mapped: copied without a second copy on the heap.
        let bytes = fs.map(segment)?;
        fs.replace(&copy, DurableFile::Quarantine, |f| {
            f.write_all(bytes.as_ref())
        })?;
    }
    Ok(copy)
}
