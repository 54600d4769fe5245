//! The persistent store on real files: the checked-in version-1 fixture, damaged files
//! (each with its own clear error, never a panic), and `build` / `inspect` /
//! `simulate --snapshot` through the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use proptest::prelude::*;
use suffixd::speculate::{SpecParams, Speculator};
use suffixd::store::snapshot::HEADER_LEN;
use suffixd::store::{OpenError, Snapshot, TokenizerId};
use suffixd::tree::RequestTree;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn fixture() -> PathBuf {
    repo("tests/fixtures/v1/store/snap-000001.sfxd")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_suffixd"))
        .args(args)
        .output()
        .expect("run suffixd")
}

/// The version-1 snapshot written by the first store, read by this one (tantivy-style
/// compatibility fixture: never regenerate it, add a new one for a new version).
#[test]
fn version_1_fixture_still_reads() {
    let snap = Snapshot::open(&fixture(), None).unwrap();
    assert_eq!(snap.header().format_version, 1);
    assert_eq!(snap.header().tokens, 30);
    snap.verify().unwrap();
    let ns = snap.namespaces().unwrap();
    let names: Vec<&str> = ns.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["acme", "default"]);
    let default = &ns[1].tree;
    assert_eq!(default.count_of(&[5, 6, 7]), 2);
    assert_eq!(default.count_of(&[5, 6]), 3);
    assert_eq!(default.count_of(&[100]), 0, "namespaces are separate trees");
    assert_eq!(ns[0].tree.count_of(&[100, 200]), 1);
    // A draft from the frozen tree: after 5 6 7, `8` (once) and `12` (once) tie.
    let params = SpecParams::default();
    let ctx = [5, 6];
    let request = RequestTree::new(&ctx, params.request_depth());
    let d = Speculator::new().speculate(Some(&request), default, &ctx, &params);
    assert_eq!(d.tokens.first(), Some(&7));
}

fn damaged(name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(fixture()).unwrap();
    edit(&mut bytes);
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

#[test]
fn each_kind_of_damage_has_its_own_error() {
    let (_d, p) = damaged("empty.sfxd", |b| b.clear());
    assert!(matches!(Snapshot::open(&p, None), Err(OpenError::Empty(_))));

    let (_d, p) = damaged("foreign.sfxd", |b| b[0] = b'X');
    assert!(matches!(
        Snapshot::open(&p, None),
        Err(OpenError::ForeignFile(_))
    ));

    let (_d, p) = damaged("short.sfxd", |b| b.truncate(b.len() - 100));
    assert!(matches!(
        Snapshot::open(&p, None),
        Err(OpenError::Truncated { .. })
    ));

    let (_d, p) = damaged("tiny.sfxd", |b| b.truncate(20));
    assert!(matches!(
        Snapshot::open(&p, None),
        Err(OpenError::Truncated { .. })
    ));

    let (_d, p) = damaged("newer.sfxd", |b| {
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32fast::hash(&b[..HEADER_LEN - 4]);
        b[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    });
    assert!(matches!(
        Snapshot::open(&p, None),
        Err(OpenError::NewerVersion { found: 2, .. })
    ));

    let (_d, p) = damaged("header.sfxd", |b| b[40] ^= 1);
    let e = Snapshot::open(&p, None).err().unwrap();
    assert!(e.to_string().contains("header checksum"), "{e}");

    // A flipped byte in the data passes the cheap open and is caught by verify.
    let (_d, p) = damaged("data.sfxd", |b| {
        let at = b.len() - 200;
        b[at] ^= 0x10;
    });
    let e = match Snapshot::open(&p, None) {
        Ok(s) => s.verify().expect_err("verify catches a flipped data byte"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("corrupt"), "{e}");

    let want = TokenizerId {
        vocab_size: 49152,
        vocab_hash: 7,
    };
    assert!(matches!(
        Snapshot::open(&fixture(), Some(want)),
        Err(OpenError::TokenizerMismatch { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any damage anywhere: opening, reading every namespace, speculating and verifying
    /// return errors or garbage drafts, never a panic or an out-of-bounds read.
    #[test]
    fn damaged_bytes_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut bytes = std::fs::read(fixture()).unwrap();
        for (i, x) in flips {
            let at = i.index(bytes.len());
            bytes[at] ^= x | 1;
        }
        // Keep the header checksum right half the time, so that damage reaches the archive.
        if bytes.len() >= HEADER_LEN && bytes[0..8] == *b"SUFFIXD\0" {
            let crc = crc32fast::hash(&bytes[..HEADER_LEN - 4]);
            bytes[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        }
        suffixd::fuzzing::snapshot_bytes(&bytes);
    }
}

#[test]
fn build_inspect_and_simulate_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let warm = repo("examples/data/warm.jsonl.zst");
    let test = repo("examples/data/test.jsonl.zst");
    let out = run(&[
        "build",
        "--logs",
        warm.to_str().unwrap(),
        "--out",
        store.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["inspect", store.to_str().unwrap(), "--verify", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(info["verified"], true);
    assert_eq!(info["header"]["sequences"], 300);

    let sim = |source: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "simulate",
            "--test",
            test.to_str().unwrap(),
            "--test-limit",
            "40",
            "--json",
        ];
        args.extend_from_slice(source);
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
    };
    for extra in [&[][..], &["--online"], &["--tree"]] {
        let mut a = vec!["--warm", warm.to_str().unwrap()];
        a.extend_from_slice(extra);
        let mut b = vec!["--snapshot", store.to_str().unwrap()];
        b.extend_from_slice(extra);
        let (mem, snap) = (sim(&a), sim(&b));
        assert_eq!(mem["tokens_per_step"], snap["tokens_per_step"], "{extra:?}");
        assert_eq!(mem["cached_tokens"], snap["cached_tokens"]);
        assert!(mem["tokens_per_step"].as_f64().unwrap() > 1.0);
    }
    // FIFO eviction from the snapshot's base agrees with the in-memory build too.
    let a = sim(&[
        "--warm",
        warm.to_str().unwrap(),
        "--max-cached-requests",
        "120",
        "--online",
    ]);
    let b = sim(&[
        "--snapshot",
        store.to_str().unwrap(),
        "--max-cached-requests",
        "120",
        "--online",
    ]);
    assert_eq!(a["cached_tokens"], b["cached_tokens"]);

    let bad = run(&["inspect", repo("README.md").to_str().unwrap()]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("not a suffixd snapshot") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// Inputs on which the fuzz targets once panicked (`tests/fixtures/fuzz/<target>/`), each
/// replayed through the same reader exercise, so that a fixed crash stays fixed.
#[test]
fn inputs_that_once_crashed_the_fuzz_targets_are_read_without_panicking() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    let mut replayed = 0;
    for (target, read) in [
        ("snapshot", suffixd::fuzzing::snapshot_bytes as fn(&[u8])),
        ("wal", suffixd::fuzzing::wal_bytes),
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("crash-"))
            {
                read(&std::fs::read(&path).unwrap());
                replayed += 1;
            }
        }
    }
    assert!(
        replayed >= 2,
        "the checked-in crash inputs were found ({replayed})"
    );
}
