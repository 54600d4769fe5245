//! The operator commands that write to a store directory (`build`, `build --append`,
//! `ingest`), run as real processes against a stopped store and against a live server:
//! none of them may replace or lose what the store holds.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{assert_clean_failure as assert_refused, run};
use suffixd::store::live::{Store, StoreConfig};

/// A token-id log of `n` responses, the k-th starting at `first + 10 k`.
fn log(dir: &Path, name: &str, first: u32, n: u32) -> PathBuf {
    let path = dir.join(name);
    let lines: Vec<String> = (0..n)
        .map(|k| {
            let start = first + 10 * k;
            let response: Vec<u32> = (start..start + 12).collect();
            serde_json::json!({"prompt": [1, 2, 3], "response": response}).to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Every file of a store directory but its LOCK, with its bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().unwrap() != "LOCK")
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

/// Sequences the store in `dir` holds, opened as a server would open it.
fn sequences(dir: &Path) -> usize {
    held(dir).len()
}

#[test]
fn build_onto_a_stopped_store_is_refused_and_append_keeps_what_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let first = log(tmp.path(), "first.jsonl", 100, 6);
    let second = log(tmp.path(), "second.jsonl", 5000, 4);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // A store with a snapshot (after 4 appends) and 2 records in its log; and one that
    // has only a log.
    let store = tmp.path().join("store");
    let wal_only = tmp.path().join("wal-only");
    for (dir, every) in [(&store, "4"), (&wal_only, "0")] {
        ingest(dir, &first, every);
        assert_eq!(sequences(dir), 6);
    }
    assert!(store.join("CURRENT").exists() && !wal_only.join("CURRENT").exists());
    for dir in [&store, &wal_only] {
        let before = contents(dir);
        let out = run(&["build", "--logs", &s(&second), "--out", &s(dir)]);
        assert_refused(&out, "already holds a store");
        assert_refused(&out, "--append");
        assert_eq!(
            contents(dir),
            before,
            "{}: not a byte changed",
            dir.display()
        );
        assert_eq!(sequences(dir), 6);
    }
    // `inspect` on a store with no snapshot advises nothing that writes.
    let out = run(&["inspect", &s(&wal_only), "--verify"]);
    assert_refused(&out, "write-ahead log");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("build --out"));
    // --append adds through the log and keeps everything.
    for dir in [&store, &wal_only] {
        let out = run(&["build", "--logs", &s(&second), "--out", &s(dir), "--append"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(sequences(dir), 10, "{}", dir.display());
    }
    // A new directory is built as before.
    let fresh = tmp.path().join("fresh");
    let out = run(&["build", "--logs", &s(&second), "--out", &s(&fresh)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sequences(&fresh), 4);
}

#[test]
fn no_command_writes_to_the_store_of_a_live_server() {
    if !common::model_present() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = log(tmp.path(), "logs.jsonl", 100, 3);
    let dir = tmp.path().join("store");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // Made with the model's tokenizer, so that the server takes the store.
    let model = common::model_path();
    let out = run(&[
        "ingest",
        "--dir",
        &s(&dir),
        "--logs",
        &s(&logs),
        "--snapshot-every",
        "2",
        "--tokenizer",
        &s(&model),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = common::Server::start(&dir);
    let before = contents(&dir);
    let (logs, dir_arg) = (s(&logs), s(&dir));
    for args in [
        ["build", "--logs", &logs, "--out", &dir_arg, ""],
        ["build", "--logs", &logs, "--out", &dir_arg, "--append"],
        ["ingest", "--dir", &dir_arg, "--logs", &logs, ""],
    ] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        assert_refused(&run(&args), "in use");
    }
    assert_eq!(
        contents(&dir),
        before,
        "the live store's files are untouched"
    );
    let (status, _) = common::answer(ureq::get(&format!("{}/metrics", server.base)).call());
    assert_eq!(status, 200, "the server still answers");
    server.stop();
    let out = run(&["inspect", &dir_arg, "--verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A FIFO where a snapshot, a manifest or a log segment should be is refused at once,
/// never waited on (opening a FIFO for reading blocks until a writer comes).
#[test]
fn fifos_in_a_store_are_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let fifo = |p: &Path| {
        let made = Command::new("mkfifo").arg(p).status().unwrap();
        assert!(made.success());
    };
    let t = std::time::Instant::now();
    let snap = tmp.path().join("snap-000001.sfxd");
    fifo(&snap);
    assert_refused(&run(&["inspect", &s(&snap)]), "not a regular file");
    let dir = tmp.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    fifo(&dir.join("CURRENT"));
    assert_refused(&run(&["inspect", &s(&dir)]), "not a regular file");
    let logs = log(tmp.path(), "logs.jsonl", 100, 2);
    let wal_dir = tmp.path().join("wal");
    std::fs::create_dir(&wal_dir).unwrap();
    fifo(&wal_dir.join("wal-0000000000000001.log"));
    let out = run(&[
        "build",
        "--append",
        "--logs",
        &s(&logs),
        "--out",
        &s(&wal_dir),
    ]);
    assert_refused(&out, "not a regular file");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "nothing waited"
    );
}

/// `suffixd args`, stopped after `limit` if it is still running then: its stderr, and
/// whether it exited (with what status) in time.
fn run_within(args: &[&str], limit: std::time::Duration) -> (Option<bool>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_suffixd"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if t.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (exited, stderr)
}

/// Every path an operator names is a regular file or a clear error at once: a FIFO
/// (whose open waits for a writer) as the config, a model, a draft model, warm logs,
/// build's logs, or a store's `NEXT_ID` or `LOCK`; `/dev/zero` (a device that reads
/// without end) as a model or logs; and a log whose one line never ends.
#[test]
fn every_path_an_operator_names_must_be_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let fifo = tmp.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let f = s(&fifo);
    let store = s(&tmp.path().join("store"));
    let model = s(&common::model_path());
    let serve = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["serve", "--addr", "127.0.0.1:0", "--snapshot-dir", &store];
        args.extend_from_slice(extra);
        args.iter().map(|a| a.to_string()).collect()
    };
    let mut cases: Vec<(Vec<String>, &str)> = vec![
        (serve(&["--config", &f]), "a FIFO, not a regular file"),
        (serve(&["--model", &f]), "a FIFO, not a regular file"),
        (
            serve(&["--model", "/dev/zero"]),
            "a device, not a regular file",
        ),
    ];
    if common::model_present() {
        cases.push((serve(&["--model", &model, "--draft-model", &f]), "a FIFO"));
        cases.push((serve(&["--model", &model, "--warm-logs", &f]), "a FIFO"));
    }
    let build = |logs: &str, out: &str| -> Vec<String> {
        ["build", "--logs", logs, "--out", out]
            .iter()
            .map(|a| a.to_string())
            .collect()
    };
    let fresh = |name: &str| s(&tmp.path().join(name));
    cases.push((build(&f, &fresh("out1")), "a FIFO"));
    cases.push((build("/dev/zero", &fresh("out2")), "a device"));
    // A store whose NEXT_ID, or LOCK, is a FIFO.
    let logs = log(tmp.path(), "logs.jsonl", 100, 2);
    for name in ["NEXT_ID", "LOCK"] {
        let dir = tmp.path().join(format!("store-{name}"));
        std::fs::create_dir(&dir).unwrap();
        assert!(
            Command::new("mkfifo")
                .arg(dir.join(name))
                .status()
                .unwrap()
                .success()
        );
        let mut args = build(&s(&logs), &s(&dir));
        args.push("--append".into());
        cases.push((args, "a FIFO"));
    }
    // One line that never ends (here: one byte past the longest line read).
    let endless = tmp.path().join("endless.jsonl");
    let file = std::fs::File::create(&endless).unwrap();
    file.set_len(suffixd::corpus::MAX_LINE_BYTES as u64 + 1)
        .unwrap();
    cases.push((
        build(&s(&endless), &fresh("out3")),
        "endless.jsonl:1: a line longer than",
    ));
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (exited, stderr) = run_within(&args, std::time::Duration::from_secs(60));
        assert_eq!(
            exited,
            Some(false),
            "{args:?} did not fail in time: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
}

/// `build`, `build --append` and `ingest` write only namespaces a request can address
/// (what `x-suffixd-namespace` and `user` accept), from a log's records or from
/// `--namespace`; anything else is refused, naming it.
#[test]
fn writers_refuse_namespaces_no_request_can_address() {
    let tmp = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    for (i, bad) in ["", "has space", "né", &"x".repeat(129)]
        .into_iter()
        .enumerate()
    {
        let logs = tmp.path().join("bad.jsonl");
        let line = serde_json::json!({"namespace": bad, "prompt": [1], "response": [2, 3, 4]});
        std::fs::write(&logs, format!("{line}\n")).unwrap();
        let out_dir = tmp.path().join(format!("out{i}"));
        let built = run(&["build", "--logs", &s(&logs), "--out", &s(&out_dir)]);
        assert_refused(&built, "cannot be addressed by any request");
        assert!(!out_dir.join("CURRENT").exists());
        let ingested = run(&["ingest", "--dir", &s(&out_dir), "--logs", &s(&logs)]);
        assert_refused(&ingested, "cannot be addressed by any request");
        let good = log(tmp.path(), "good.jsonl", 100, 1);
        let named = run(&[
            "build",
            "--logs",
            &s(&good),
            "--out",
            &s(&out_dir),
            "--namespace",
            bad,
        ]);
        assert_refused(&named, "cannot be addressed by any request");
        let store = Store::open(StoreConfig::new(
            &out_dir,
            suffixd::store::TokenizerId::UNKNOWN,
        ))
        .unwrap();
        assert!(
            store.namespace_names().is_empty(),
            "nothing written for {bad:?}"
        );
    }
}

/// A prefix-cache budget past memory is capped, with a warning that says so.
#[test]
fn a_prefix_cache_budget_past_memory_is_capped() {
    if !common::model_present() {
        return;
    }
    let out = run(&[
        "generate",
        "--prompt",
        "Hi",
        "--max-tokens",
        "2",
        "--prefix-cache-bytes",
        "18446744073709551615",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("is more than half the usable memory"),
        "{stderr}"
    );
}

/// A model whose weights hold a NaN or infinite scale is refused at load, naming the
/// tensor, instead of answering garbage.
#[test]
fn a_model_with_a_nan_scale_is_refused_naming_the_tensor() {
    if !common::model_present() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("nan.gguf");
    std::fs::copy(common::model_path(), &bad).unwrap();
    let (offset, dtype) = {
        let mut file = std::fs::File::open(&bad).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
        let info = &content.tensor_infos["blk.3.ffn_down.weight"];
        (content.tensor_data_offset + info.offset, info.ggml_dtype)
    };
    // The default model is Q4_1 here: each block starts with its f16 scale. The
    // 10th block's scale becomes NaN.
    assert_eq!(dtype, candle_core::quantized::GgmlDType::Q4_1);
    let at = offset + 10 * 20;
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[at as usize..at as usize + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    std::fs::write(&bad, bytes).unwrap();
    let out = run(&[
        "generate",
        "--model",
        bad.to_str().unwrap(),
        "--prompt",
        "Hi",
    ]);
    assert_refused(
        &out,
        "tensor blk.3.ffn_down.weight (Q4_1) has a NaN or infinite scale at block 10",
    );
}

/// The sequences of the store in `dir`, as `(id, tokens)`, opened as a server would.
///
/// The directory's `flock` belongs to an open file description, and a sibling test that
/// spawns a process at the moment a store is open forks a copy of that descriptor, which
/// lives until the child's `exec`. So a store dropped a moment ago can still read as
/// locked for a few milliseconds: wait for that, within a bound, and fail on anything else.
fn held(dir: &Path) -> BTreeMap<u64, Vec<u32>> {
    let config = || StoreConfig::new(dir, suffixd::store::TokenizerId::UNKNOWN);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let store = loop {
        match Store::open(config()) {
            Err(suffixd::store::live::StoreOpenError::Dir(
                suffixd::store::manifest::DirError::Locked { .. },
            )) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other.unwrap(),
        }
    };
    store.with_namespace("default", |ns| {
        let ns = ns.expect("the default namespace");
        ns.ids().map(|id| (id, ns.tokens_of(id).unwrap())).collect()
    })
}

/// `suffixd ingest`; its stderr.
fn ingest(dir: &Path, logs: &Path, snapshot_every: &str) -> String {
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let out = run(&[
        "ingest",
        "--dir",
        &s(dir),
        "--logs",
        &s(logs),
        "--snapshot-every",
        snapshot_every,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// The documented restore (copy a snapshot and its CURRENT into a store directory) of a
/// snapshot from another store, whose log position counts that store's log: the local
/// log's records, which it does not hold, are all kept; the ones whose ids the other
/// store also used keep their tokens under fresh ids.
#[test]
fn restoring_another_stores_snapshot_keeps_every_record_of_this_stores_log() {
    let tmp = tempfile::tempdir().unwrap();
    let local = tmp.path().join("local");
    let other = tmp.path().join("other");
    // The local store: 3 acknowledged appends, only in its log (ids 1, 2, 3).
    ingest(&local, &log(tmp.path(), "local.jsonl", 100, 3), "0");
    // The other store: 6 appends and a snapshot of them (ids 1..6, log position 6).
    ingest(&other, &log(tmp.path(), "other.jsonl", 5000, 6), "6");
    let before: Vec<Vec<u32>> = held(&local).into_values().collect();
    let theirs: Vec<Vec<u32>> = held(&other).into_values().collect();
    assert_eq!((before.len(), theirs.len()), (3, 6));
    let current = std::fs::read_to_string(other.join("CURRENT")).unwrap();
    std::fs::copy(other.join(current.trim()), local.join(current.trim())).unwrap();
    std::fs::copy(other.join("CURRENT"), local.join("CURRENT")).unwrap();
    for start in 0..2 {
        let after = held(&local);
        let mut tokens: Vec<Vec<u32>> = after.values().cloned().collect();
        tokens.sort();
        let mut expected = [before.clone(), theirs.clone()].concat();
        expected.sort();
        assert_eq!(tokens, expected, "start {start}: both stores' sequences");
    }
    // Appends after the restore, a snapshot, and a restart keep all of it. The command
    // says how it took the foreign snapshot: the store's warnings reach the stderr of
    // every command, not only serve's.
    let stderr = ingest(&local, &log(tmp.path(), "more.jsonl", 9000, 2), "2");
    assert!(
        stderr.contains("WARN") && stderr.contains("was not taken of this directory's log"),
        "{stderr}"
    );
    assert_eq!(held(&local).len(), 11);
}

/// A snapshot whose log position is past anything the log has written (here the
/// counter's last value, as a forged or damaged file could hold) does not hide the
/// appends made after it: the log's numbering never wraps to 0 behind it.
#[test]
fn a_snapshot_position_past_the_log_hides_no_later_append() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    ingest(&dir, &log(tmp.path(), "first.jsonl", 100, 3), "3");
    let current = std::fs::read_to_string(dir.join("CURRENT")).unwrap();
    let snap = dir.join(current.trim());
    let mut bytes = std::fs::read(&snap).unwrap();
    use suffixd::store::snapshot::HEADER_LEN;
    bytes[56..64].copy_from_slice(&u64::MAX.to_le_bytes());
    bytes[80..88].copy_from_slice(&0u64.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..HEADER_LEN - 4]);
    bytes[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&snap, bytes).unwrap();
    // Five acknowledged appends after it, then a stop without a snapshot.
    ingest(&dir, &log(tmp.path(), "later.jsonl", 7000, 5), "0");
    assert_eq!(held(&dir).len(), 8);
    assert_eq!(held(&dir).len(), 8, "and again after a second start");
}

/// A crash mid-snapshot leaves a full-size snapshot no manifest names, or a temporary
/// file; the next start removes them and keeps what the store holds.
#[test]
fn files_a_crash_left_behind_are_removed_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    ingest(&dir, &log(tmp.path(), "first.jsonl", 100, 4), "4");
    let current = std::fs::read_to_string(dir.join("CURRENT")).unwrap();
    let current = current.trim();
    let bytes = std::fs::read(dir.join(current)).unwrap();
    // An unpublished later snapshot, and a half-written one.
    std::fs::write(dir.join("snap-999999.sfxd"), &bytes).unwrap();
    std::fs::write(dir.join("snap-999998.tmp"), &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(held(&dir).len(), 4);
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap-"))
        .collect();
    left.sort();
    assert_eq!(left, [current.to_string()]);
}
