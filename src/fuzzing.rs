//! What the fuzz targets (`fuzz/`) and the damaged-bytes property test run on arbitrary
//! bytes: every reader of a file the store opens, then everything a reader may do with
//! what it accepted. None of it may panic or read out of bounds; errors are fine.
//!
//! Behind the `fuzzing` feature: a harness is not part of the library's API, and it
//! drives the store and speculation together, which the store itself never does. The
//! package's tests turn the feature on (a dev-dependency on itself), as does `fuzz/`.

use std::path::Path;

use crate::speculate::{SpecParams, Speculator};
use crate::store::TokenizerId;
use crate::store::snapshot::Snapshot;
use crate::store::wal::decode_segment;
use crate::tree::RequestTree;

/// Open `bytes` as a snapshot; if that succeeds, draft from every namespace, check each
/// tree's integrity and verify the whole file.
pub fn snapshot_bytes(bytes: &[u8]) {
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(bytes);
    let Ok(snap) = Snapshot::from_bytes(Path::new("fuzz.sfxd"), aligned, None) else {
        return;
    };
    if let Ok(namespaces) = snap.namespaces() {
        let params = SpecParams {
            tree: true,
            ..SpecParams::default()
        };
        for ns in &namespaces {
            for ctx in [&[5u32, 6][..], &[100, 200, 300], &[7], &[u32::MAX, 0]] {
                let request = RequestTree::new(ctx, params.request_depth());
                let _ = Speculator::new().speculate(Some(&request), &ns.tree, ctx, &params);
            }
            for id in ns.meta.iter().map(|m| m.id).take(8) {
                let _ = ns.tree.sequence(id);
            }
            let _ = ns.tree.check_integrity();
        }
    }
    let _ = snap.verify();
}

/// Read `bytes` as a WAL segment, with the tokenizer identity its header claims (so that
/// the records are reached) and with another.
pub fn wal_bytes(bytes: &[u8]) {
    let claimed = match (bytes.get(12..16), bytes.get(16..24)) {
        (Some(size), Some(hash)) => TokenizerId {
            vocab_size: u32::from_le_bytes(size.try_into().expect("4 bytes")),
            vocab_hash: u64::from_le_bytes(hash.try_into().expect("8 bytes")),
        },
        _ => TokenizerId::UNKNOWN,
    };
    for tokenizer in [claimed, TokenizerId::UNKNOWN] {
        if let Ok(scan) = decode_segment(Path::new("fuzz.log"), bytes, tokenizer) {
            assert!(
                scan.intact_len() as usize <= bytes.len(),
                "the intact prefix lies inside the bytes"
            );
            let mut end = 0;
            for d in &scan.damage {
                assert!(
                    d.offset >= end && d.len > 0,
                    "damage runs are ordered and disjoint"
                );
                end = d.offset + d.len;
                assert!(end as usize <= bytes.len(), "damage lies inside the bytes");
            }
            assert!(
                scan.records.windows(2).all(|w| w[0].seq < w[1].seq),
                "recovered records keep increasing sequence numbers"
            );
        }
    }
}
