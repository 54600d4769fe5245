//! A damaged store directory on real files: each damage either recovers every
//! acknowledged append that survives it or refuses to start with a message that says
//! what to do, and none is made permanent (by truncation, deletion or a snapshot).

use std::path::Path;
use std::process::Command;

use suffixd::store::live::{SnapshotError, Store, StoreConfig};
use suffixd::store::snapshot::{NamespaceInput, SeqMeta, write_snapshot};
use suffixd::store::wal::segments;
use suffixd::store::{Snapshot, TokenizerId};
use suffixd::tree::GlobalTree;

const TOKENIZER: TokenizerId = TokenizerId {
    vocab_size: 1000,
    vocab_hash: 0x5eed,
};

fn cfg(dir: &Path) -> StoreConfig {
    StoreConfig {
        max_depth: 8,
        ..StoreConfig::new(dir, TOKENIZER)
    }
}

fn response(i: u32) -> Vec<u32> {
    vec![i % 1000, 1, 2, 3, (i * 7) % 1000]
}

fn held(store: &Store) -> usize {
    store
        .namespace_names()
        .iter()
        .map(|name| store.with_namespace(name, |n| n.map_or(0, |n| n.sequences())))
        .sum()
}

/// A store in `dir` with 5 responses in its snapshot and `logged` more in its log only;
/// returns the newest log segment.
fn store_with_log(dir: &Path, logged: u32) -> std::path::PathBuf {
    let s = Store::open(cfg(dir)).unwrap();
    for i in 0..5 {
        s.append("default", &response(i)).unwrap();
    }
    s.snapshot().unwrap();
    for i in 5..5 + logged {
        s.append("default", &response(i)).unwrap();
    }
    drop(s);
    segments(&suffixd::store::DiskDirectory, dir)
        .unwrap()
        .pop()
        .unwrap()
        .1
}

#[test]
fn a_flipped_byte_in_the_log_loses_its_record_only_and_is_reported_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    // One byte inside the third record after the snapshot.
    let segment = store_with_log(dir.path(), 10);
    let mut bytes = std::fs::read(&segment).unwrap();
    let record = (bytes.len() - 24) / 10;
    bytes[24 + 2 * record + 30] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();

    // `inspect --verify` sees it.
    let out = Command::new(env!("CARGO_BIN_EXE_suffixd"))
        .args(["inspect", "--verify"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged"), "{err}");

    // Opening recovers the 9 good records around it and keeps a copy of the segment.
    let s = Store::open(cfg(dir.path())).unwrap();
    assert_eq!(held(&s), 14);
    assert_eq!(s.counters().replayed, 9);
    let stats = s.stats();
    assert_eq!(stats.wal_damaged_at_open.len(), 1);
    let copy = dir
        .path()
        .join("damaged")
        .join(segment.file_name().unwrap());
    assert_eq!(std::fs::read(&copy).unwrap(), bytes, "the evidence is kept");
    assert!(!s.verify().unwrap().ok);
    // Appends after it are not lost behind the damage, and the segment itself is
    // never appended to or cut.
    s.append("default", &response(99)).unwrap();
    assert_eq!(std::fs::read(&segment).unwrap(), bytes);
    drop(s);
    let s = Store::open(cfg(dir.path())).unwrap();
    assert_eq!(held(&s), 15);
    // A snapshot folds the recovered records in; the damaged segment goes, its copy stays.
    s.snapshot().unwrap();
    drop(s);
    let s = Store::open(cfg(dir.path())).unwrap();
    assert_eq!(held(&s), 15);
    assert!(s.verify().unwrap().ok);
    assert!(copy.exists());
}

/// The last record is no exception: written whole and acknowledged, a bad byte in it is
/// damage (ERROR, a copy in damaged/, reported by verify), not a write torn by a crash,
/// which leaves a record shorter than its length says.
#[test]
fn a_flipped_byte_in_the_last_record_is_damage_and_a_cut_one_is_a_torn_write() {
    let dir = tempfile::tempdir().unwrap();
    let segment = store_with_log(dir.path(), 3);
    let clean = std::fs::read(&segment).unwrap();
    let inspect = || {
        Command::new(env!("CARGO_BIN_EXE_suffixd"))
            .args(["inspect", "--verify"])
            .arg(dir.path())
            .output()
            .unwrap()
    };

    // Cut short by 3 bytes: a torn write. Verify passes; opening drops the 3rd record.
    std::fs::write(&segment, &clean[..clean.len() - 3]).unwrap();
    let out = inspect();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("torn write"));

    // Whole, with one byte flipped: damage.
    let mut bytes = clean.clone();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();
    let out = inspect();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged"), "{err}");
    let s = Store::open(cfg(dir.path())).unwrap();
    assert_eq!(
        held(&s),
        7,
        "the two good records after the snapshot are recovered"
    );
    assert_eq!(s.stats().wal_damaged_at_open.len(), 1);
    assert!(!s.verify().unwrap().ok);
    let copy = dir
        .path()
        .join("damaged")
        .join(segment.file_name().unwrap());
    assert_eq!(std::fs::read(&copy).unwrap(), bytes, "the evidence is kept");
    // Later appends go to a fresh segment; the damaged one is never cut.
    s.append("default", &response(99)).unwrap();
    assert_eq!(std::fs::read(&segment).unwrap(), bytes);
    drop(s);
    assert_eq!(held(&Store::open(cfg(dir.path())).unwrap()), 8);
}

#[test]
fn a_lost_manifest_is_refused_with_the_snapshot_to_restore_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(cfg(dir.path())).unwrap();
        for i in 0..40 {
            s.append("default", &response(i)).unwrap();
        }
        s.snapshot().unwrap();
        for i in 40..45 {
            s.append("default", &response(i)).unwrap();
        }
    }
    let current = dir.path().join("CURRENT");
    let name = std::fs::read_to_string(&current).unwrap();
    std::fs::remove_file(&current).unwrap();
    let err = match Store::open(cfg(dir.path())) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a store that lost CURRENT started from its log alone"),
    };
    assert!(err.contains(name.trim()) && err.contains("echo"), "{err}");
    assert!(dir.path().join(name.trim()).exists());
    // Following the advice restores everything.
    std::fs::write(&current, &name).unwrap();
    let s = Store::open(cfg(dir.path())).unwrap();
    assert_eq!(held(&s), 45);

    // A manifest naming garbage is refused the same way.
    drop(s);
    std::fs::write(&current, "../etc/passwd\n").unwrap();
    let err = Store::open(cfg(dir.path())).err().unwrap().to_string();
    assert!(err.contains("CURRENT"), "{err}");
}

#[test]
fn token_ids_outside_the_vocabulary_fail_verification_and_no_snapshot_copies_them() {
    let dir = tempfile::tempdir().unwrap();
    // A snapshot whose token pool holds an id far past the vocabulary, as a flipped
    // byte would leave it (its checksum is right: only the id check can see it).
    let bad = [5u32, 6, 4_294_965_332, 7];
    let tree = GlobalTree::build(8, [(1u64, &bad[..]), (2, &[5, 6, 8][..])]).unwrap();
    let meta = [1, 2]
        .map(|id| SeqMeta {
            id,
            inserted_ms: 1,
            last_use_ms: 1,
        })
        .to_vec();
    let path = dir.path().join("snap-000001.sfxd");
    write_snapshot(
        &suffixd::store::DiskDirectory,
        &path,
        TOKENIZER,
        (0, 0),
        &[NamespaceInput {
            name: "default",
            tree: &tree,
            meta: &meta,
        }],
    )
    .unwrap();
    suffixd::store::manifest::publish(&suffixd::store::DiskDirectory, dir.path(), &path).unwrap();
    let err = Snapshot::open(&path, None).unwrap().verify().unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");

    // Opening stays cheap and works; verification and snapshots refuse.
    let s = Store::open(cfg(dir.path())).unwrap();
    s.append("default", &response(3)).unwrap();
    assert!(matches!(
        s.verify_base(),
        Err(SnapshotError::DamagedBase(_))
    ));
    let err = s.snapshot().unwrap_err().to_string();
    assert!(err.contains("not writing a snapshot"), "{err}");
    let v = s.verify().unwrap();
    assert!(!v.ok && v.snapshot_error.unwrap().contains("outside the vocabulary"));
    // The damaged base is still the current one: nothing was deleted or replaced.
    drop(s);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("CURRENT"))
            .unwrap()
            .trim(),
        "snap-000001.sfxd"
    );
    assert_eq!(
        suffixd::store::manifest::snapshot_files(&suffixd::store::DiskDirectory, dir.path())
            .unwrap()
            .len(),
        1
    );
}
