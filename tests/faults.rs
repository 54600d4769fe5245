//! Fault injection: a write, an fsync, a rename or a removal fails, as on a full disk,
//! at each step of append, snapshot and compaction, once or for a stretch of time.
//! Afterwards the store must keep working, and a reopen (what a kill -9 would leave:
//! the store has no shutdown work) must hold every acknowledged append exactly once,
//! no acknowledged eviction, a log without damage and a snapshot that verifies.
//!
//! The failures come from the store's fault points (`src/store/faults.rs`), which the
//! test build compiles in. They stand in for a full or failing disk, which a test cannot
//! make happen on demand; `tests/hostile.rs` fills a real file-size limit on a real
//! server process instead.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use suffixd::store::EvictScope;
use suffixd::store::TokenizerId;
use suffixd::store::faults::{DurableFile, FaultPoint, ReplaceStep};
use suffixd::store::live::{Store, StoreConfig};
use suffixd::store::wal::check_dir;
use suffixd::tree::{Expand, GlobalIndex};

/// The fault points the workload below reaches: every point but those reached only
/// outside it, each of which names the test that covers it. A new point must be placed
/// here, since the match has no catch-all.
fn workload_points() -> Vec<FaultPoint> {
    FaultPoint::all()
        .into_iter()
        .filter(|&point| match point {
            FaultPoint::WalWrite
            | FaultPoint::WalFsync
            | FaultPoint::WalRotateFsync
            | FaultPoint::WalNewSegment
            | FaultPoint::WalRemove
            | FaultPoint::Replace(DurableFile::Snapshot | DurableFile::Manifest, _)
            | FaultPoint::Replace(DurableFile::NextId, _) => true,
            // Reached only after a failed write: a_write_whose_cleanup_also_fails...
            FaultPoint::WalTruncate => false,
            // Only a damaged log is quarantined (tests/damage.rs damages real files);
            // replication's state files belong to tests/replicate.rs.
            FaultPoint::Replace(DurableFile::Quarantine | DurableFile::ReplicationState, _) => {
                false
            }
            // The eviction outbox is replication's: replicate::outbox's unit tests.
            FaultPoint::OutboxWrite | FaultPoint::OutboxFsync => false,
        })
        .collect()
}

fn cfg(dir: &Path) -> StoreConfig {
    StoreConfig {
        max_depth: 8,
        ..StoreConfig::new(dir, TokenizerId::UNKNOWN)
    }
}

/// What the store acknowledged.
#[derive(Default)]
struct Acked {
    appends: HashMap<(String, u64), Vec<u32>>,
    evictions: HashSet<(String, u64)>,
    /// Evictions that failed: like any write that reports an error, they may or may
    /// not have happened.
    maybe_evicted: HashSet<(String, u64)>,
    failures: usize,
}

/// Appends (each response starts with a token of its own, so counts show doubles),
/// evictions of earlier appends, and a snapshot (a compaction, once something was
/// evicted) every tenth step.
fn workload(store: &Store, steps: std::ops::Range<u32>, acked: &mut Acked) {
    for step in steps {
        let ns = if step % 2 == 0 { "a" } else { "b" };
        let failed = match step % 10 {
            7 => {
                let victim = acked
                    .appends
                    .keys()
                    .filter(|k| !acked.evictions.contains(*k) && !acked.maybe_evicted.contains(*k))
                    .min()
                    .cloned();
                match victim {
                    Some(key) => match store.evict(&EvictScope::id(key.0.clone(), key.1)) {
                        Ok(gone) => {
                            if gone == 1 {
                                acked.evictions.insert(key);
                            }
                            false
                        }
                        Err(_) => {
                            acked.maybe_evicted.insert(key);
                            true
                        }
                    },
                    None => false,
                }
            }
            9 => store.snapshot().is_err(),
            _ => {
                let tokens = vec![1000 + step, 7, 8, 9, step % 5];
                store
                    .append(ns, &tokens)
                    .map(|id| {
                        acked.appends.insert((ns.to_string(), id), tokens);
                    })
                    .is_err()
            }
        };
        if failed {
            acked.failures += 1;
        }
        // No step, failed or not, leaves a bad record that a later one could follow.
        let log = check_dir(
            &suffixd::store::DiskDirectory,
            store.dir(),
            TokenizerId::UNKNOWN,
        )
        .unwrap();
        assert!(log.is_clean(), "step {step}: {log:?}");
    }
}

fn check(dir: &Path, acked: &Acked, what: &str) {
    let store = Store::open(cfg(dir)).unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    for ((ns, id), tokens) in &acked.appends {
        let held = store.with_namespace(ns, |n| n?.tokens_of(*id));
        if acked.evictions.contains(&(ns.clone(), *id)) {
            assert_eq!(
                held, None,
                "{what}: acknowledged eviction of {ns}/{id} undone"
            );
            continue;
        }
        if acked.maybe_evicted.contains(&(ns.clone(), *id)) {
            continue;
        }
        assert_eq!(
            held.as_ref(),
            Some(tokens),
            "{what}: acknowledged append {ns}/{id} lost"
        );
        let count = store.with_namespace(ns, |n| {
            let view = n.expect("held").view();
            view.walk(&tokens[..1]).map_or(0, |c| view.count(&c))
        });
        assert_eq!(count, 1, "{what}: {ns}/{id} counted {count} times");
    }
    let v = store.verify().unwrap();
    assert!(v.ok, "{what}: {v:?}");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "{what}: {name} left behind");
    }
}

fn run(point: FaultPoint, actions: &str) {
    let what = format!("{}={actions}", point.name());
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    {
        let store = Store::open(cfg(dir.path())).unwrap();
        workload(&store, 0..10, &mut acked);
        fail::cfg(point.name(), actions).unwrap();
        workload(&store, 10..30, &mut acked);
        fail::remove(point.name());
        // The disk is back: the same store works again, without a restart.
        let before = acked.failures;
        workload(&store, 30..50, &mut acked);
        assert_eq!(acked.failures, before, "{what}: the store did not recover");
    }
    assert!(
        acked.failures > 0,
        "{what}: the fault point was never reached"
    );
    check(dir.path(), &acked, &what);
}

#[test]
fn every_fault_point_once_and_for_a_stretch_loses_nothing_acknowledged() {
    let _scenario = fail::FailScenario::setup();
    for point in workload_points() {
        // A write fails before its first byte, and within its bytes.
        let tasks: &[&str] = if point.writes() {
            &["return(0)", "return(13)"]
        } else {
            &["return"]
        };
        for task in tasks {
            // The first time, a later time, and every time (a disk that stays full).
            for actions in [
                format!("1*{task}"),
                format!("1*off->1*{task}"),
                task.to_string(),
            ] {
                run(point, &actions);
            }
        }
    }
}

#[test]
fn a_write_whose_cleanup_also_fails_is_cleaned_up_before_the_next_one() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    {
        let store = Store::open(cfg(dir.path())).unwrap();
        workload(&store, 0..5, &mut acked);
        fail::cfg(FaultPoint::WalWrite.name(), "1*return(17)").unwrap();
        fail::cfg(FaultPoint::WalTruncate.name(), "1*return").unwrap();
        assert!(store.append("a", &[1, 2, 3]).is_err());
        fail::remove(FaultPoint::WalWrite.name());
        fail::remove(FaultPoint::WalTruncate.name());
        workload(&store, 5..20, &mut acked);
    }
    assert_eq!(acked.failures, 0);
    check(dir.path(), &acked, "wal-write with a failed truncate");
}

#[test]
fn a_first_snapshot_left_unpublished_is_ignored_and_the_log_replayed() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    {
        let store = Store::open(cfg(dir.path())).unwrap();
        workload(&store, 0..9, &mut acked);
        // The snapshot file is complete, but CURRENT is never written (as if killed).
        let manifest_write = FaultPoint::Replace(DurableFile::Manifest, ReplaceStep::Write);
        fail::cfg(manifest_write.name(), "return(0)").unwrap();
        assert!(store.snapshot().is_err());
        fail::remove(manifest_write.name());
    }
    assert!(dir.path().join("snap-000001.sfxd").exists() && !dir.path().join("CURRENT").exists());
    check(dir.path(), &acked, "unpublished first snapshot");
}

/// The model thread marks the sequences behind an accepted draft as used
/// (`Store::touch`) while a snapshot holds the store's writer across its log rotation's
/// fsync. The mark must not wait for that disk, and eviction must still see it.
#[test]
fn last_use_marks_do_not_wait_for_a_snapshot_held_up_in_fsync() {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    // Room for two 4-token sequences: a third evicts the least recently used.
    let store = Arc::new(
        Store::open(StoreConfig {
            budget_tokens: Some(8),
            ..cfg(dir.path())
        })
        .unwrap(),
    );
    let old = store.append("ns", &[1, 2, 3, 4]).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let newer = store.append("ns", &[5, 6, 7, 8]).unwrap();
    std::thread::sleep(Duration::from_millis(5));

    // Hold the snapshot inside the rotation's fsync until released.
    let (reached_tx, reached) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let (reached_tx, release_rx) = (Mutex::new(reached_tx), Mutex::new(release_rx));
    fail::cfg_callback(FaultPoint::WalRotateFsync.name(), move || {
        let _ = reached_tx.lock().unwrap().send(());
        let _ = release_rx
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(60));
    })
    .unwrap();
    let snapshot = {
        let store = store.clone();
        std::thread::spawn(move || store.snapshot().map(|_| ()))
    };
    reached
        .recv_timeout(Duration::from_secs(30))
        .expect("the snapshot reached its fsync");

    // The reader's mark, on its own thread: it must return while the fsync is held.
    let (done_tx, done) = mpsc::channel();
    {
        let store = store.clone();
        std::thread::spawn(move || {
            store.touch("ns", &[old]);
            let _ = done_tx.send(());
        });
    }
    let returned = done.recv_timeout(Duration::from_secs(10)).is_ok();
    assert!(!snapshot.is_finished(), "the snapshot was still held");
    release.send(()).unwrap();
    fail::remove(FaultPoint::WalRotateFsync.name());
    snapshot.join().unwrap().unwrap();
    assert!(returned, "a last-use mark waited for the snapshot's fsync");

    // The mark counts: the third append evicts the newer sequence, not the touched one.
    store.append("ns", &[9, 10, 11, 12]).unwrap();
    assert_eq!(
        store.evict(&EvictScope::id("ns", newer)).unwrap(),
        0,
        "the untouched sequence went first"
    );
    assert_eq!(
        store.evict(&EvictScope::id("ns", old)).unwrap(),
        1,
        "the touched sequence stayed"
    );
}
