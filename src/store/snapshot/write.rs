//! Writing a snapshot file: the trees' own tables streamed through rkyv into the file,
//! header first (its archive length measured by a first, counting pass), then the
//! archive, then the footer with the archive's checksum. The format is the parent
//! module's (`docs/snapshot-format.md`).

use std::io::Write;
use std::path::Path;

use rkyv::rancor;

use super::{
    FOOTER_LEN, FOOTER_MAGIC, FORMAT_VERSION, Header, NamespaceImage, NamespaceInput,
    SnapshotImage, TokenizerId, WriteError, encode_header, words,
};
use crate::store::faults::DurableFile;
use crate::store::fs::Directory;

/// Write `namespaces` as a snapshot file at `path`: into a temporary file beside it,
/// fsynced, then renamed over `path`, then the directory fsynced. A crash leaves either
/// the old file or the new one, never a torn one.
pub fn write_snapshot(
    fs: &dyn Directory,
    path: &Path,
    tokenizer: TokenizerId,
    log_position: (u64, u64),
    namespaces: &[NamespaceInput<'_>],
) -> Result<Header, WriteError> {
    fs.replace(path, DurableFile::Snapshot, |f| {
        let out = std::io::BufWriter::with_capacity(1 << 20, f);
        write_snapshot_to(out, tokenizer, log_position, namespaces)
    })
    .map_err(|source| WriteError::Io {
        path: path.into(),
        source,
    })
}

/// Stream a snapshot of `namespaces` into `out`: header, archive, footer, in order. The
/// archive is serialized straight from the trees' own tables, so the only memory it
/// takes beyond them is `out`'s buffer (building the archive in memory first held two
/// more copies of every table at the peak). `out` only needs `Write`: the header holds
/// the archive's length, which a first pass measures by serializing into a counter.
pub fn write_snapshot_to<W: Write>(
    mut out: W,
    tokenizer: TokenizerId,
    (log_id, wal_seq): (u64, u64),
    namespaces: &[NamespaceInput<'_>],
) -> std::io::Result<Header> {
    let parts: Vec<_> = namespaces.iter().map(|ns| ns.tree.parts()).collect();
    let image = SnapshotImage {
        namespaces: namespaces
            .iter()
            .zip(&parts)
            .map(|(ns, t)| NamespaceImage {
                name: ns.name,
                max_depth: t.max_depth as u32,
                live_tokens: ns.tree.cached_tokens(),
                nodes: words(&t.nodes),
                lens: t.lens,
                pool: t.pool,
                wide: words(&t.child_index),
                seqs: words(t.seqs),
                meta: ns.meta,
            })
            .collect(),
    };
    let archive_len = serialize_into(&image, &mut Tally::counting(std::io::sink()))?.0;
    let max_depth = namespaces
        .first()
        .map_or(crate::tree::DEFAULT_MAX_DEPTH, |n| n.tree.max_depth());
    let header = Header {
        format_version: FORMAT_VERSION,
        tokenizer,
        max_depth: max_depth as u32,
        namespaces: namespaces.len() as u32,
        tokens: namespaces.iter().map(|n| n.tree.cached_tokens()).sum(),
        sequences: namespaces.iter().map(|n| n.tree.len() as u64).sum(),
        created_unix_ms: unix_ms(),
        wal_seq,
        log_id,
        archive_len,
        wide_lists_sorted: true,
    };
    out.write_all(&encode_header(&header))?;
    let (written, crc) = serialize_into(&image, &mut Tally::checksumming(&mut out))?;
    if written != archive_len {
        return Err(std::io::Error::other(format!(
            "the snapshot archive was {written} bytes, but measured {archive_len} before"
        )));
    }
    let mut footer = [0u8; FOOTER_LEN];
    footer[0..4].copy_from_slice(&crc.to_le_bytes());
    footer[8..16].copy_from_slice(&archive_len.to_le_bytes());
    footer[24..32].copy_from_slice(&FOOTER_MAGIC);
    out.write_all(&footer)?;
    out.flush()?;
    Ok(header)
}

/// Serialize `image` into `tally`; its byte count and checksum.
fn serialize_into<W: Write>(
    image: &SnapshotImage<'_>,
    tally: &mut Tally<W>,
) -> std::io::Result<(u64, u32)> {
    let writer = rkyv::ser::writer::IoWriter::new(&mut *tally);
    match rkyv::api::high::to_bytes_in::<_, rancor::Error>(image, writer) {
        Ok(_) => Ok((tally.len, tally.crc.clone().map_or(0, |c| c.finalize()))),
        // rkyv wraps the writer's error in its own; give back the original (a full
        // disk stays ENOSPC).
        Err(e) => Err(tally.error.take().unwrap_or_else(|| {
            std::io::Error::other(format!("cannot serialize the snapshot: {e}"))
        })),
    }
}

/// A writer that counts what passes through it and, when asked, checksums it; it keeps
/// the first error of the writer beneath, which rkyv would otherwise turn into a string.
struct Tally<W> {
    inner: W,
    len: u64,
    crc: Option<crc32fast::Hasher>,
    error: Option<std::io::Error>,
}

impl<W> Tally<W> {
    fn counting(inner: W) -> Self {
        Tally {
            inner,
            len: 0,
            crc: None,
            error: None,
        }
    }

    fn checksumming(inner: W) -> Self {
        Tally {
            crc: Some(crc32fast::Hasher::new()),
            ..Tally::counting(inner)
        }
    }
}

impl<W: Write> Write for Tally<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self.inner.write(bytes) {
            Ok(n) => {
                self.len += n as u64;
                if let Some(crc) = &mut self.crc {
                    crc.update(&bytes[..n]);
                }
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let kind = e.kind();
                self.error.get_or_insert(e);
                Err(kind.into())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::snapshot::{BuiltNamespace, HEADER_LEN, SeqMeta, Snapshot};
    use crate::tree::GlobalTree;

    /// The archive as the writer built it before it streamed: owned copies of every
    /// table, serialized in memory. The streamed archive must be these bytes exactly, or
    /// files written before and after would differ.
    #[derive(rkyv::Archive, rkyv::Serialize)]
    struct OwnedNamespace {
        name: String,
        max_depth: u32,
        live_tokens: u64,
        nodes: Vec<u32>,
        lens: Vec<u8>,
        pool: Vec<u32>,
        wide: Vec<u32>,
        seqs: Vec<u64>,
        meta: Vec<SeqMeta>,
    }

    #[derive(rkyv::Archive, rkyv::Serialize)]
    struct OwnedImage {
        namespaces: Vec<OwnedNamespace>,
    }

    fn owned_archive(namespaces: &[NamespaceInput<'_>]) -> Vec<u8> {
        let image = OwnedImage {
            namespaces: namespaces
                .iter()
                .map(|ns| {
                    let t = ns.tree.parts();
                    OwnedNamespace {
                        name: ns.name.to_string(),
                        max_depth: t.max_depth as u32,
                        live_tokens: ns.tree.cached_tokens(),
                        nodes: t
                            .nodes
                            .iter()
                            .flat_map(|n| [n.start, n.count, n.first_child, n.next_sibling])
                            .collect(),
                        lens: t.lens.to_vec(),
                        pool: t.pool.to_vec(),
                        wide: t
                            .child_index
                            .iter()
                            .flat_map(|w| [w.node, w.token, w.child])
                            .collect(),
                        seqs: t
                            .seqs
                            .iter()
                            .flat_map(|e| {
                                [
                                    e.id,
                                    e.offset as u64 | (e.len as u64) << 32,
                                    e.live as u64 | (e.reserved as u64) << 32,
                                ]
                            })
                            .collect(),
                        meta: ns.meta.to_vec(),
                    }
                })
                .collect(),
        };
        rkyv::to_bytes::<rancor::Error>(&image).unwrap().to_vec()
    }

    /// Trees with wide (indexed) nodes: token 0 before most tokens, from a vocabulary
    /// of 60; one edited after its build, so its wide lists are unsorted until written.
    fn trees() -> Vec<BuiltNamespace> {
        let mut state = 7u64;
        let mut next = move |below: u32| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % below as u64) as u32
        };
        let mut out = Vec::new();
        for (n, name) in ["default", "a namespace name longer than inline"]
            .into_iter()
            .enumerate()
        {
            let seqs: Vec<Vec<u32>> = (0..40 + 30 * n)
                .map(|_| (0..next(50) + 1).flat_map(|_| [0, 1 + next(59)]).collect())
                .collect();
            let mut tree = GlobalTree::build(12, (1..).zip(seqs)).unwrap();
            if n == 1 {
                tree.remove(3);
                tree.insert(1000, &[0, 5, 0, 5, 0, 6]).unwrap();
                tree.compact();
            }
            let meta = tree
                .ids()
                .map(|id| SeqMeta {
                    id,
                    inserted_ms: id * 3,
                    last_use_ms: id * 5,
                })
                .collect();
            assert!(
                !tree.parts().child_index.is_empty(),
                "no wide node in {name}"
            );
            out.push((name.to_string(), tree, meta));
        }
        out
    }

    #[test]
    fn the_streamed_archive_is_the_in_memory_one_byte_for_byte() {
        let built = trees();
        let inputs = NamespaceInput::borrowing(&built);
        let mut file = Vec::new();
        let header = write_snapshot_to(&mut file, TokenizerId::UNKNOWN, (4, 9), &inputs).unwrap();
        let archive = &file[HEADER_LEN..file.len() - FOOTER_LEN];
        assert_eq!(archive, owned_archive(&inputs).as_slice());
        assert_eq!(header.archive_len, archive.len() as u64);
        assert_eq!((header.log_id, header.wal_seq), (4, 9));

        let mut aligned = rkyv::util::AlignedVec::<16>::new();
        aligned.extend_from_slice(&file);
        let snap = Snapshot::from_bytes(Path::new("mem.sfxd"), aligned, None).unwrap();
        snap.verify().unwrap();
        let read = snap.namespaces().unwrap();
        assert_eq!(read.len(), built.len());
        for (ns, (name, tree, meta)) in read.iter().zip(&built) {
            assert_eq!(&ns.name, name);
            assert_eq!(&ns.meta, meta);
            for id in tree.ids() {
                assert_eq!(ns.tree.sequence(id), tree.sequence(id));
            }
        }
    }

    /// A writer that takes `left` bytes, then fails as a full disk does.
    struct FullDisk {
        left: usize,
    }

    impl Write for FullDisk {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.left == 0 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            let n = self.left.min(bytes.len());
            self.left -= n;
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_write_keeps_its_own_error() {
        let built = trees();
        let inputs = NamespaceInput::borrowing(&built);
        // In the header, in the archive (where rkyv carries the error), in the footer.
        let mut whole = Vec::new();
        write_snapshot_to(&mut whole, TokenizerId::UNKNOWN, (0, 0), &inputs).unwrap();
        for left in [0, 50, HEADER_LEN + 1000, whole.len() - 3] {
            let e = write_snapshot_to(FullDisk { left }, TokenizerId::UNKNOWN, (0, 0), &inputs)
                .unwrap_err();
            assert_eq!(e.raw_os_error(), Some(28), "cut after {left} bytes: {e}");
        }
    }
}
