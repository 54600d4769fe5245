//! Crash recovery: a writer process appends through the WAL (and snapshots every few
//! appends) and is killed with SIGKILL at a random moment; the store reopened afterwards
//! must hold every acknowledged append, each once, with consistent counts.
//!
//! `SUFFIXD_CRASH_KILLS` sets the number of kills (default 5; `tools/crash-test.sh` runs
//! 100).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use suffixd::corpus::read_examples;
use suffixd::store::TokenizerId;
use suffixd::store::live::{Store, StoreConfig};
use suffixd::tree::{Expand, GlobalIndex};

fn responses() -> Vec<Vec<u32>> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/warm.jsonl.zst");
    read_examples(&p, None)
        .unwrap()
        .map(|e| e.unwrap().response)
        .collect()
}

#[test]
fn kill_9_loses_no_acknowledged_append_and_doubles_nothing() {
    let kills: usize = std::env::var("SUFFIXD_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let all = responses();
    let warm = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/warm.jsonl.zst");
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 0x9e3779b97f4a7c15u64;
    // Every acknowledged (or recovered) id and the response it must hold.
    let mut acked_total: std::collections::HashMap<u64, Vec<u32>> =
        std::collections::HashMap::new();
    let mut recovered = 0;
    for round in 0..kills {
        // Each round appends the whole log again (new ids), so the store keeps growing
        // and kills land in appends, snapshots and compactions alike.
        let mut child = Command::new(env!("CARGO_BIN_EXE_suffixd"))
            .args(["ingest", "--print-acks", "--snapshot-every", "25", "--dir"])
            .arg(dir.path())
            .arg("--logs")
            .arg(&warm)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = Duration::from_millis(20 + seed % 400);
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.split_whitespace().skip(1);
                let id: u64 = parts.next().unwrap().parse().unwrap();
                let len: usize = parts.next().unwrap().parse().unwrap();
                acks.push((id, len));
            }
            acks
        });
        let t = Instant::now();
        while t.elapsed() < wait && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let acks = reader.join().unwrap();
        // Each round ingests the log from its start: its k-th append is response k.
        for (k, (id, len)) in acks.iter().enumerate() {
            assert_eq!(all[k].len(), *len);
            acked_total.insert(*id, all[k].clone());
        }
        let in_flight = all.get(acks.len()).cloned();

        // Reopen, as a restarted server would.
        let store = Store::open(StoreConfig::new(dir.path(), TokenizerId::UNKNOWN))
            .unwrap_or_else(|e| panic!("round {round}: store does not reopen: {e}"));
        store.with_namespace("default", |ns| {
            let ids: std::collections::HashSet<u64> =
                ns.map(|n| n.ids().collect()).unwrap_or_default();
            for (id, want) in &acked_total {
                assert!(
                    ids.contains(id),
                    "round {round}: acknowledged append {id} lost"
                );
                let toks = ns.unwrap().tokens_of(*id).unwrap();
                assert_eq!(&toks, want, "round {round}: sequence {id} content");
            }
            // At most the one append in flight at the kill is present without an ack.
            assert!(
                ids.len() <= acked_total.len() + 1,
                "round {round}: {} cached, {} acked",
                ids.len(),
                acked_total.len()
            );
            if let Some(n) = ns {
                let view = n.view();
                let root = view.root();
                let total: u64 = ids
                    .iter()
                    .map(|id| n.tokens_of(*id).unwrap().len() as u64)
                    .sum();
                assert_eq!(
                    view.count(&root) as u64,
                    total,
                    "round {round}: counts doubled or lost"
                );
            }
            // The append in flight at the kill may have been logged before its ack: then it
            // must be that response, and it stays from now on.
            if let Some(n) = ns {
                for id in n.ids() {
                    acked_total.entry(id).or_insert_with(|| {
                        let toks = n.tokens_of(id).unwrap();
                        assert_eq!(
                            Some(&toks),
                            in_flight.as_ref(),
                            "round {round}: unexpected sequence {id}"
                        );
                        toks
                    });
                }
            }
        });
        recovered += 1;
    }
    eprintln!(
        "{recovered} of {kills} kills recovered, {} acknowledged appends all present",
        acked_total.len()
    );
}
